//! `omabox-gvisor-init` reaches epoll through `src/bin/omabox-gvisor-init/stale_epoll.rs`:
//! the linker sends its (and its dependencies') calls of `epoll_ctl` and `epoll_wait` to the
//! `__wrap_` functions there, which call the C library's as `__real_` (GNU ld's `--wrap`).
fn main() {
    println!("cargo:rustc-link-arg-bin=omabox-gvisor-init=-Wl,--wrap=epoll_ctl,--wrap=epoll_wait");
    println!("cargo:rerun-if-changed=build.rs");
}
