//! Link settings of the `omabox` binary. The project's `.cargo/config.toml` links it
//! statically (`crt-static`, `relocation-model=static`: no dynamic loader at all); these
//! settings keep a build without that config (another target, a `cargo install` from
//! elsewhere) as close to it as a dynamic link gets.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    static_unwinder();
    no_pie();
}

/// Links `omabox` as a position-dependent executable (`-no-pie`). As a PIE, every start
/// had the dynamic loader apply ~44,000 relative relocations (vtables, panic locations,
/// static tables), writing — and so copying — ~180 pages of `.data.rel.ro`: ~3.2 million
/// cycles of the loader's ~3.6 million, and ~180 of 350 page faults; those pages are then
/// copied again by the fork that becomes a sandbox's PID 1. Non-PIE, the loader applies
/// none: `omabox --version` 1.68 → 1.36 ms and a whole `omabox sandbox run` ~0.6 ms
/// faster on the development VM. The cost is address randomization of the executable's
/// own image (shared libraries, heap, stack and mmaps stay randomized), as for Go's
/// default executables: omabox is memory-safe Rust, and its parsers of what a sandbox
/// sends over the network are fuzzed (`scripts/fuzz`). SECURITY.md says so. Linux
/// targets; objects stay position-independent, only the final link changes.
fn no_pie() {
    if std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default() == "linux" {
        println!("cargo:rustc-link-arg-bins=-no-pie");
    }
}

/// Links GCC's unwinder statically (`libgcc_eh.a`, as `-static-libgcc` does for C++)
/// instead of Rust's default `libgcc_s.so.1`, so the dynamic loader maps one shared
/// library fewer at every start and `libgcc_s`'s constructor (CPU feature detection
/// with `cpuid`, which traps in a VM) never runs: ~0.2 ms of every `omabox` process,
/// `omabox sandbox run` included. Whole-archive: the unwinder's symbols must be defined
/// before the standard library's `-lgcc_s` is seen, which `--as-needed` then drops.
/// Panics unwind and backtraces resolve as before. glibc targets only (gcc's runtime
/// ships `libgcc_eh.a` next to `libgcc_s`); with `crt-static` the standard library
/// links it itself.
fn static_unwinder() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let crt_static = var("CARGO_CFG_TARGET_FEATURE")
        .split(',')
        .any(|f| f == "crt-static");
    if var("CARGO_CFG_TARGET_OS") == "linux" && var("CARGO_CFG_TARGET_ENV") == "gnu" && !crt_static
    {
        println!("cargo:rustc-link-lib=static:+whole-archive=gcc_eh");
    }
}
