//! The one fork-unsafe moment: cloning a child into new namespaces from a possibly
//! multi-threaded host, and `execve`-ing the setup stage straight away.
//!
//! Between `clone` and `execve` the child is a copy of a process whose other threads may
//! hold locks (the allocator's, stdio's, tokio's). So the child does only raw,
//! async-signal-safe syscalls on data prepared before the clone: `close_range`, `fcntl`,
//! `dup2`, `execve`, `write`, `_exit`. No allocation, no panic paths, no locks.
//! Everything else (mounts, cgroup namespace, hardening) happens after the exec, in the
//! single-threaded setup stage.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// What the parent gets back.
#[derive(Debug)]
pub(crate) struct Spawned {
    /// Host pid of the child (PID 1 of its pid namespace).
    pub(crate) pid: i32,
    /// A pidfd for it, obtained atomically with the clone (no pid-reuse race).
    pub(crate) pidfd: OwnedFd,
}

/// Everything the child needs, prepared before the clone.
#[derive(Debug)]
pub(crate) struct ExecSpec {
    pub(crate) program: CString,
    pub(crate) argv: Vec<CString>,
    pub(crate) envp: Vec<CString>,
    /// Fds that survive the exec at their current numbers.
    pub(crate) keep: Vec<RawFd>,
    /// Becomes the child's stdin/stdout/stderr (opened `O_RDWR`, e.g. `/dev/null`).
    pub(crate) stdio: RawFd,
    /// Where to write `errno` (4 bytes, native endian, prefixed by `X`) if `execve` fails.
    pub(crate) error_fd: RawFd,
}

/// `clone(flags | CLONE_PIDFD | SIGCHLD)` then `execve` in the child.
pub(crate) fn clone_exec(spec: &ExecSpec, ns_flags: libc::c_int) -> io::Result<Spawned> {
    // Null-terminated pointer arrays, built before the clone so the child allocates
    // nothing. They borrow `spec`, which outlives both processes' use of them (the
    // child's copy of memory stays valid until it execs or exits).
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = spec.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let keep: &[RawFd] = &spec.keep;

    // Signals stay blocked across the clone so no handler of the host (tokio's, say)
    // can run in the child before it has reset them; the child starts with an empty mask.
    // SAFETY: sigset_t is plain data; sigfillset/sigemptyset initialize it.
    let (mut all, mut empty, mut old): (libc::sigset_t, libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: the sets are valid, writable sigset_t values.
    unsafe {
        libc::sigfillset(&mut all);
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    let signals = SignalReset { empty };

    let mut pidfd: libc::c_int = -1;
    let flags = (ns_flags | libc::CLONE_PIDFD) as libc::c_ulong | libc::SIGCHLD as libc::c_ulong;
    // SAFETY: raw clone without CLONE_VM behaves like fork(): the child gets a copy of
    // the address space, including this stack frame and the arrays above, and resumes
    // here with a return value of 0. `&mut pidfd` is the parent_tid argument, where the
    // kernel stores the pidfd for CLONE_PIDFD (same position on x86_64 and aarch64).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            flags,
            std::ptr::null_mut::<libc::c_void>(),
            &mut pidfd as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_void>(),
            0 as libc::c_ulong,
        )
    };
    if ret == 0 {
        // SAFETY: we are the child of a fork-like clone; `child_after_clone` performs
        // only async-signal-safe raw syscalls on memory prepared before the clone, and
        // never returns.
        unsafe { child_after_clone(spec, &argv, &envp, keep, &signals) }
    }
    let clone_err = io::Error::last_os_error();
    // SAFETY: restores this thread's previous mask from a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if ret < 0 {
        return Err(clone_err);
    }
    // SAFETY: the kernel stored a fresh pidfd that only we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Spawned {
        pid: ret as i32,
        pidfd,
    })
}

/// Prepared before the clone: the empty mask the child starts with.
struct SignalReset {
    empty: libc::sigset_t,
}

/// The child's side: only raw syscalls, then exec or `_exit(127)`.
///
/// # Safety
/// Must be called only in the child of a fork-like clone, with pointer arrays that are
/// null-terminated and point into live memory.
unsafe fn child_after_clone(
    spec: &ExecSpec,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    keep: &[RawFd],
    signals: &SignalReset,
) -> ! {
    // SAFETY (whole block): each call is a raw syscall on integers or on pointers into
    // memory copied from the parent before the clone; none allocates or takes a lock.
    unsafe {
        // Every handler back to default (exec would reset caught ones anyway, but a
        // pending signal must not run a host handler here), then unblock everything.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=64 {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        libc::sigprocmask(libc::SIG_SETMASK, &signals.empty, std::ptr::null_mut());
        // stdio first, so nothing of the host's terminal reaches the sandbox (a host tty
        // would allow TIOCSTI input injection).
        libc::dup2(spec.stdio, 0);
        libc::dup2(spec.stdio, 1);
        libc::dup2(spec.stdio, 2);
        // Every inherited fd from 3 up becomes close-on-exec, even ones some library
        // opened without O_CLOEXEC; then the few we pass are re-opened for the exec.
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
        );
        for &fd in keep {
            libc::fcntl(fd, libc::F_SETFD, 0);
        }
        libc::execve(spec.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        // exec failed: tell the parent why, then die without running atexit handlers.
        let errno = *libc::__errno_location();
        let mut msg = [0u8; 5];
        msg[0] = b'X';
        msg[1..].copy_from_slice(&errno.to_ne_bytes());
        libc::write(spec.error_fd, msg.as_ptr().cast(), msg.len());
        libc::_exit(127)
    }
}

/// Opens `/dev/null` read-write, close-on-exec.
pub(crate) fn dev_null() -> io::Result<OwnedFd> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?;
    Ok(OwnedFd::from(f))
}

/// Formats an fd number for argv.
pub(crate) fn fd_arg(fd: &OwnedFd) -> CString {
    // A decimal number never holds a NUL byte.
    CString::new(fd.as_raw_fd().to_string()).unwrap_or_default()
}
