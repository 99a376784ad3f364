//! The `omabox` executable's entry point (x86-64 musl static PIE): one system call, then
//! the C library's own `_start`.
//!
//! A static PIE relocates itself before any code runs: musl's start code writes the load
//! address into ~38,000 pointers spread over ~190 pages of `.data.rel.ro`, `.got` and
//! `.data`, and each first write to a page traps into the kernel to copy it from the
//! page cache (a copy-on-write fault). `omabox_start` asks the kernel for all of those
//! private copies at once first (`madvise(MADV_POPULATE_WRITE)`, Linux 5.14): the same
//! copies, made in one system call instead of ~190 traps. Any error (an older kernel's
//! EINVAL) is ignored: the pages then fault in one by one, as without this.
//!
//! It must run before the relocations, so it uses no relocated data: the addresses are
//! RIP-relative, resolved by the linker; no stack is used and `%rsp` (argc, argv, envp,
//! auxv) is left as the kernel set it. `build.rs` makes it the entry point.
//!
//! Must never: touch memory, call anything but `_start`, or run on another target (the
//! linker is told to use it only for x86-64 musl builds).

#[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "musl"))]
std::arch::global_asm!(
    ".globl omabox_start",
    ".type omabox_start,@function",
    "omabox_start:",
    // From the page holding the first relocated section (`.init_array`, after `.tdata`)...
    "lea __init_array_start(%rip), %rdi",
    "and $-4096, %rdi",
    // ...to the end of `.data` (the last relocated section).
    "lea _edata(%rip), %rsi",
    "sub %rdi, %rsi",
    "mov $23, %edx", // MADV_POPULATE_WRITE
    "mov $28, %eax", // SYS_madvise
    "syscall",
    // The ABI's %rdx at entry: no function for atexit (what the kernel passed).
    "xor %edx, %edx",
    "jmp _start",
    ".size omabox_start, .-omabox_start",
    options(att_syntax)
);
