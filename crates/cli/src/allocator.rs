//! The `omabox` process's allocator: hardened either way, chosen once per process.
//!
//! - A one-shot `omabox sandbox run` (argv `omabox sandbox run …`, the fast path of
//!   `main`) allocates with musl's own allocator (mallocng: out-of-band metadata, checked
//!   frees; the C library's default). That process lives for one command, allocates little,
//!   and its start is what a user times: musl's allocator costs it nothing at start, where
//!   mimalloc in secure mode added ~255 page faults and ~0.5 ms to every run
//!   (`scripts/ab-sandbox-run`, 300 rounds: 4.20 vs 4.80 ms).
//! - Every other command (`run`, `serve`, …: long-lived, parsing what sandboxes, agents and
//!   registries send) allocates with mimalloc in secure mode (guard pages between its pages,
//!   encoded free lists, randomized allocation order, double-free detection). musl's
//!   allocator takes one lock per call: the inference proxy's benchmark served 15,000
//!   proxied requests/s with it, 26,000 with secure mimalloc (28,500 without its hardening),
//!   at 209 / 194 / 161 µs added latency (p50).
//!
//! The choice is made at the process's first allocation, before `main` runs any code of
//! ours, from `/proc/self/cmdline` read into a stack buffer (no allocation), and never
//! changes: every block is freed by the allocator that made it. A process whose command line
//! cannot be read takes mimalloc. A forked child (the one-shot sandbox's PID 1) inherits its
//! parent's choice with its memory.
//!
//! This is the `omabox` binary's only: `omabox-sandbox-init` (the linux sandbox's PID 1, its
//! own binary with no `#[global_allocator]`) keeps musl's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

/// The allocator `omabox` uses (see the module doc).
#[derive(Debug)]
pub struct HostAllocator;

const UNDECIDED: u8 = 0;
const MUSL: u8 = 1;
const MIMALLOC: u8 = 2;

static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);
static MIMALLOC_SECURE: mimalloc::MiMalloc = mimalloc::MiMalloc;

impl HostAllocator {
    /// The allocator this process uses, deciding it on the first call.
    fn choice() -> u8 {
        match CHOICE.load(Ordering::Acquire) {
            UNDECIDED => {
                let wanted = if is_one_shot(&command_line()) {
                    MUSL
                } else {
                    MIMALLOC
                };
                // A concurrent first allocation may have decided already: take its choice.
                match CHOICE.compare_exchange(
                    UNDECIDED,
                    wanted,
                    Ordering::AcqRel,
                    Ordering::Acquire,
                ) {
                    Ok(_) => wanted,
                    Err(decided) => decided,
                }
            }
            decided => decided,
        }
    }
}

/// The first bytes of this process's `/proc/self/cmdline` (NUL-separated arguments), read
/// without allocating; empty if it cannot be read.
fn command_line() -> CommandLine {
    use rustix::fs::{Mode, OFlags, open};
    let mut line = CommandLine {
        bytes: [0; 256],
        len: 0,
    };
    let Ok(fd) = open(
        "/proc/self/cmdline",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return line;
    };
    // The three arguments that matter are short: one read of the first 256 bytes holds them.
    if let Ok(n) = rustix::io::read(&fd, &mut line.bytes) {
        line.len = n;
    }
    line
}

struct CommandLine {
    bytes: [u8; 256],
    len: usize,
}

/// Whether the arguments are those of `main`'s one-shot fast path: `<argv0> sandbox run …`.
fn is_one_shot(line: &CommandLine) -> bool {
    let mut args = line.bytes[..line.len].split(|b| *b == 0).skip(1);
    args.next() == Some(b"sandbox") && args.next() == Some(b"run")
}

// SAFETY: every method hands the call to one allocator, the same one for the whole life of
// the process (`choice` is decided once and never changes), so every block is freed,
// resized and zeroed by the allocator that made it; both allocators uphold `GlobalAlloc`'s
// contract themselves. `choice` itself never allocates.
unsafe impl GlobalAlloc for HostAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match Self::choice() {
            // SAFETY: the caller's guarantees on `layout` are passed on unchanged.
            MUSL => unsafe { System.alloc(layout) },
            // SAFETY: as above.
            _ => unsafe { MIMALLOC_SECURE.alloc(layout) },
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match Self::choice() {
            // SAFETY: the caller's guarantees on `layout` are passed on unchanged.
            MUSL => unsafe { System.alloc_zeroed(layout) },
            // SAFETY: as above.
            _ => unsafe { MIMALLOC_SECURE.alloc_zeroed(layout) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        match Self::choice() {
            // SAFETY: `ptr` was allocated by this allocator (the only one this process
            // uses) with `layout`, as the caller guarantees.
            MUSL => unsafe { System.dealloc(ptr, layout) },
            // SAFETY: as above.
            _ => unsafe { MIMALLOC_SECURE.dealloc(ptr, layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        match Self::choice() {
            // SAFETY: `ptr` came from this same allocator with `layout`; the caller
            // guarantees `new_size`.
            MUSL => unsafe { System.realloc(ptr, layout, new_size) },
            // SAFETY: as above.
            _ => unsafe { MIMALLOC_SECURE.realloc(ptr, layout, new_size) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(args: &[&str]) -> CommandLine {
        let mut line = CommandLine {
            bytes: [0; 256],
            len: 0,
        };
        for arg in args {
            line.bytes[line.len..line.len + arg.len()].copy_from_slice(arg.as_bytes());
            line.len += arg.len() + 1;
        }
        line
    }

    #[test]
    fn only_the_one_shot_fast_path_takes_musls_allocator() {
        assert!(is_one_shot(&line(&[
            "omabox", "sandbox", "run", "--", "true"
        ])));
        assert!(is_one_shot(&line(&["/x/omabox", "sandbox", "run"])));
        for other in [
            &["omabox", "run"][..],
            &["omabox", "serve"],
            &["omabox", "sandbox"],
            &["omabox", "--data-dir", "x", "sandbox", "run"],
            &["omabox", "sandboxx", "run"],
            &["omabox", "sandbox", "running"],
            &[],
        ] {
            assert!(!is_one_shot(&line(other)), "{other:?}");
        }
    }

    #[test]
    fn this_process_decided_once_and_reads_its_own_command_line() {
        // The test binary is not `omabox sandbox run`: mimalloc, decided for good.
        std::hint::black_box(Box::new(1u64));
        assert_eq!(CHOICE.load(Ordering::Acquire), MIMALLOC);
        assert!(command_line().len > 0);
    }
}
