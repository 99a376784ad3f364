//! The one fork-unsafe moment: cloning a child into new namespaces from a possibly
//! multi-threaded host, and `execve`-ing the setup stage straight away.
//!
//! The clone is `posix_spawn`-style: `CLONE_VM | CLONE_VFORK` on a stack of its own. The
//! child shares the host's memory (no page tables copied, nothing to tear down at its
//! exec: a fork of a large host costs far more than the exec after it), and the calling
//! thread sleeps until the child has exec'd or died, so nothing the child reads changes
//! under it. Other host threads keep running, so between `clone` and `execve` the child
//! does only raw, async-signal-safe syscalls on data prepared before the clone:
//! `sigaction`, `sigprocmask`, `setsid`, `dup2`, `close_range`, `fcntl`, `execve`, `write`,
//! `_exit`. No allocation, no panic paths, no locks, and no writes to memory but its own
//! stack (errno lands in the calling thread's TLS, which sleeps until the exec).
//! Everything else (network namespace, mounts, cgroup namespace, hardening) happens after
//! the exec, in the single-threaded setup stage.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use crate::config::INIT_BINARY;

/// Stack of the cloned child until its exec: it only calls a few libc syscall wrappers.
const CHILD_STACK_BYTES: usize = 64 * 1024;

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

/// `clone(flags | CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD)` on a private stack,
/// then `execve` in the child. Returns once the child has exec'd (or failed to).
pub(crate) fn clone_exec(spec: &ExecSpec, ns_flags: libc::c_int) -> io::Result<Spawned> {
    // Null-terminated pointer arrays, built before the clone so the child allocates
    // nothing. They borrow `spec`, which outlives the child's use of them (this thread
    // sleeps until the child execs or exits).
    let mut argv: Vec<*const libc::c_char> = spec.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let mut envp: Vec<*const libc::c_char> = spec.envp.iter().map(|e| e.as_ptr()).collect();
    envp.push(std::ptr::null());
    let stack = ChildStack::new()?;

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
    let args = ChildArgs {
        spec,
        argv: &argv,
        envp: &envp,
        empty_mask: empty,
    };

    let mut pidfd: libc::c_int = -1;
    let flags = ns_flags | libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: glibc's clone runs `child_entry(&args)` on `stack` (its top, 16-byte
    // aligned) in a child that shares our memory; CLONE_VFORK suspends this thread until
    // the child execs or exits, so `args`, the arrays it points to and the stack stay
    // valid and unchanged for as long as the child uses them. `&mut pidfd` is the
    // parent_tid argument, where the kernel stores the pidfd for CLONE_PIDFD.
    let ret = unsafe {
        libc::clone(
            child_entry,
            stack.top(),
            flags,
            &args as *const ChildArgs<'_> as *mut libc::c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    let clone_err = io::Error::last_os_error();
    // SAFETY: restores this thread's previous mask from a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    drop(stack);
    if ret < 0 {
        return Err(clone_err);
    }
    // SAFETY: the kernel stored a fresh pidfd that only we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Spawned { pid: ret, pidfd })
}

/// What the child reads, all prepared before the clone.
struct ChildArgs<'a> {
    spec: &'a ExecSpec,
    argv: &'a [*const libc::c_char],
    envp: &'a [*const libc::c_char],
    empty_mask: libc::sigset_t,
}

/// An anonymous mapping for a `CLONE_VM` child's stack, unmapped on drop (the owner
/// keeps it until the child has exec'd or is dead).
pub(crate) struct ChildStack {
    base: *mut libc::c_void,
}

impl ChildStack {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                CHILD_STACK_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self { base })
    }

    /// The highest address (stacks grow down); page-aligned, hence 16-byte aligned.
    pub(crate) fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of the mapping, which is what clone expects.
        unsafe { self.base.cast::<u8>().add(CHILD_STACK_BYTES).cast() }
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, which nothing uses any more.
        unsafe { libc::munmap(self.base, CHILD_STACK_BYTES) };
    }
}

extern "C" fn child_entry(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `ChildArgs` that `clone_exec` passed to clone, alive and
    // unchanged while its thread sleeps (CLONE_VFORK); we are that clone's child.
    unsafe {
        let args = &*(arg as *const ChildArgs<'_>);
        child_after_clone(args.spec, args.argv, args.envp, &args.empty_mask)
    }
}

/// The child's side: only raw syscalls, then exec or `_exit(127)`.
///
/// # Safety
/// Must be called only in the child of `clone_exec`'s clone, with pointer arrays that
/// are null-terminated and point into live memory.
unsafe fn child_after_clone(
    spec: &ExecSpec,
    argv: &[*const libc::c_char],
    envp: &[*const libc::c_char],
    empty_mask: &libc::sigset_t,
) -> ! {
    // SAFETY: (the whole block) each call is a raw syscall on integers or on pointers into
    // memory prepared before the clone; none allocates, takes a lock or writes shared
    // memory (only this stack, and errno).
    unsafe {
        // Every handler back to default (exec would reset caught ones anyway, but a
        // pending signal must not run a host handler here), then unblock everything.
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=64 {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        libc::sigprocmask(libc::SIG_SETMASK, empty_mask, std::ptr::null_mut());
        // A session of its own: out of the host's session and process group, with no
        // controlling terminal, so `/dev/tty` inside opens nothing (ENXIO) and no
        // sandbox process can take the host terminal's foreground or read what is
        // typed there. Cannot fail in a fresh child (it leads no process group); if it
        // ever does, the start fails rather than run in the host's session.
        if libc::setsid() < 0 {
            exec_failed(spec.error_fd);
        }
        // stdio next, so nothing of the host's terminal reaches the sandbox (a host tty
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
        for &fd in &spec.keep {
            libc::fcntl(fd, libc::F_SETFD, 0);
        }
        libc::execve(spec.program.as_ptr(), argv.as_ptr(), envp.as_ptr());
        exec_failed(spec.error_fd)
    }
}

/// Tells the parent the errno of the failed step, then dies without running atexit
/// handlers.
///
/// # Safety
/// Only in the cloned child (raw `write` and `_exit`, no allocation).
unsafe fn exec_failed(error_fd: RawFd) -> ! {
    // SAFETY: errno is this thread's; `msg` lives on the child's stack.
    unsafe {
        let errno = *libc::__errno_location();
        let mut msg = [0u8; 5];
        msg[0] = b'X';
        msg[1..].copy_from_slice(&errno.to_ne_bytes());
        libc::write(error_fd, msg.as_ptr().cast(), msg.len());
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

/// The `omabox-sandbox-init` binary to exec: `explicit` (the `OMABOX_LINUX_INIT` setting),
/// else next to this executable, one directory up, or in a directory of `search` (the
/// caller's `PATH`). `Err`: the paths tried (for
/// [`StartError::InitBinaryMissing`](crate::StartError::InitBinaryMissing)).
pub(crate) fn locate_init(explicit: Option<&Path>, search: &[PathBuf]) -> Result<PathBuf, String> {
    let mut tried = Vec::new();
    let mut candidates = Vec::new();
    if let Some(p) = explicit {
        candidates.push(p.to_path_buf());
    } else {
        if let Ok(exe) = std::env::current_exe()
            && let Some(dir) = exe.parent()
        {
            candidates.push(dir.join(INIT_BINARY));
            if let Some(up) = dir.parent() {
                candidates.push(up.join(INIT_BINARY));
            }
        }
        candidates.extend(search.iter().map(|d| d.join(INIT_BINARY)));
    }
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
        tried.push(c.display().to_string());
    }
    Err(tried.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_init_binary_names_the_setting() {
        let tried =
            locate_init(Some(Path::new("/nonexistent/omabox-sandbox-init")), &[]).unwrap_err();
        let text = crate::StartError::InitBinaryMissing(tried).to_string();
        assert!(text.contains("OMABOX_LINUX_INIT"), "{text}");
        assert!(text.contains("/nonexistent/omabox-sandbox-init"), "{text}");
    }
}
