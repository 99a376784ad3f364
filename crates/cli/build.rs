//! Link settings of the `omabox` binary. The project's `.cargo/config.toml` links it as a
//! static PIE (`crt-static`, `relocation-model=pie`: no dynamic loader at all); this keeps a
//! build without that config (another target, a `cargo install` from elsewhere) as close to
//! it as a dynamic link gets.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    static_unwinder();
    populating_entry();
}

/// x86-64 musl (the project's static PIE): the executable starts at `omabox_start`
/// (`src/entry.rs`), which has the kernel copy the pages the self-relocation writes in one
/// call before jumping to the C library's `_start`.
fn populating_entry() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ENV") == "musl"
        && var("CARGO_CFG_TARGET_ARCH") == "x86_64"
    {
        println!("cargo:rustc-link-arg-bin=omabox=-Wl,-e,omabox_start");
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
