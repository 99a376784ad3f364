//! `omabox-gvisor-init --subreaper RUNSC ARGS…`: on the host, the parent of a foreground
//! `runsc run` or `runsc restore` (`Runsc::spawn`), and a child subreaper for what runsc
//! starts.
//!
//! A foreground `runsc restore` ends as soon as its container is checkpointed, before its
//! gofer and sandbox processes have exited; those are re-parented to the nearest subreaper,
//! else to PID 1. A PID 1 that reaps late (this project's machines: about every two
//! seconds) leaves them zombies, and `runsc delete` waits for each to disappear, so a pause
//! took two seconds instead of a tenth. Here they are re-parented to this process, which
//! reaps every child until none is left and then exits with runsc's status (a signal `n`
//! as `128 + n`, as a shell says it).
//!
//! It also ends them with its parent (the omabox process that owns the sandbox): when that
//! dies (a kill -9, a crash), every process below this one is killed, so no runsc goes on
//! restoring or tearing down a sandbox behind the `omabox reap` that comes next (one did,
//! and made the sandbox's cgroups after reap had removed them). The parent is watched
//! through a pidfd (process exit, not thread exit as `PR_SET_PDEATHSIG` would be), beside a
//! signalfd for `SIGCHLD`.
//!
//! Never: read or write fd 0/1 (they are the container's stdio, runsc's alone).

use std::ffi::OsString;
use std::process::ExitCode;

use omabox_agent::sys;

pub(crate) fn run(args: Vec<OsString>) -> ExitCode {
    let Some((program, args)) = args.split_first() else {
        eprintln!("omabox-gvisor-init --subreaper: no program to run");
        return ExitCode::from(2);
    };
    if let Err(e) = sys::set_child_subreaper() {
        eprintln!("omabox-gvisor-init --subreaper: cannot become a child subreaper: {e}");
        return ExitCode::from(1);
    }
    let child = match std::process::Command::new(program).args(args).spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!("omabox-gvisor-init --subreaper: cannot run {program:?}: {e}");
            return ExitCode::from(127);
        }
    };
    // Our copies of the container's stdio: runsc has its own.
    if let Ok(null) = std::fs::File::open("/dev/null") {
        use std::os::fd::AsRawFd;
        // SAFETY: dup2 onto fds 0 and 1 of this single-threaded process; `null` stays open
        // for both calls.
        unsafe {
            libc::dup2(null.as_raw_fd(), 0);
            libc::dup2(null.as_raw_fd(), 1);
        }
    }
    let runsc = i32::try_from(child.id()).unwrap_or(i32::MAX);
    let code = match Watch::new() {
        Ok(watch) => watch.reap(runsc),
        Err(e) => {
            // Reaping still works without the watch; only the end with the parent is lost.
            eprintln!("omabox-gvisor-init --subreaper: cannot watch the parent: {e}");
            reap_blocking(runsc)
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// runsc's exit code from a wait status (a signal `n` as `128 + n`).
fn exit_code(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        128 + libc::WTERMSIG(status)
    }
}

/// Reaps every child until none is left; runsc's exit code.
fn reap_blocking(runsc: i32) -> i32 {
    let mut code = 1;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int through a valid pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // ECHILD: runsc and everything it left are reaped.
                _ => return code,
            }
        }
        if pid == runsc {
            code = exit_code(status);
        }
    }
}

/// The parent's pidfd and a signalfd of `SIGCHLD` (blocked for this process).
struct Watch {
    parent: std::os::fd::OwnedFd,
    children: std::os::fd::OwnedFd,
}

impl Watch {
    fn new() -> std::io::Result<Self> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: getppid has no preconditions.
        let ppid = unsafe { libc::getppid() };
        // SAFETY: pidfd_open with plain integers; a valid fd is owned below.
        let parent = unsafe { libc::syscall(libc::SYS_pidfd_open, ppid, 0) };
        if parent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the fd was just opened and is owned by nothing else.
        let parent = unsafe { std::os::fd::OwnedFd::from_raw_fd(parent as i32) };
        // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset, which fills it;
        // sigprocmask and signalfd read it.
        let children = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGCHLD);
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::signalfd(-1, &set, libc::SFD_CLOEXEC)
        };
        if children < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        let children = unsafe { std::os::fd::OwnedFd::from_raw_fd(children) };
        Ok(Self { parent, children })
    }

    /// Reaps children as they end, until none is left; kills them all once the parent is
    /// gone (also when it died before the watch began: it was then re-parented away).
    fn reap(self, runsc: i32) -> i32 {
        use std::os::fd::AsRawFd as _;
        let mut code = 1;
        let mut orphaned = false;
        loop {
            // Whatever ended (also before the signalfd existed).
            loop {
                let mut status = 0;
                // SAFETY: waitpid writes one int through a valid pointer.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid == runsc {
                    code = exit_code(status);
                } else if pid == 0 {
                    break;
                } else if pid < 0 {
                    if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                        continue;
                    }
                    // ECHILD: runsc and everything it left are reaped.
                    return code;
                }
            }
            if orphaned {
                kill_children();
                std::thread::sleep(std::time::Duration::from_millis(5));
                continue;
            }
            let mut fds = [
                libc::pollfd {
                    fd: self.parent.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.children.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: poll reads and writes the two pollfds of a valid array.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if ready < 0 {
                continue;
            }
            if fds[0].revents != 0 {
                orphaned = true;
            }
            if fds[1].revents != 0 {
                // Drain the pending SIGCHLDs; the waitpid loop above reaps.
                let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>() * 8];
                // SAFETY: read into a buffer of the length given.
                let _ = unsafe {
                    libc::read(
                        self.children.as_raw_fd(),
                        info.as_mut_ptr().cast(),
                        info.len(),
                    )
                };
            }
        }
    }
}

/// SIGKILL to every process whose parent is this one (what runsc left is re-parented here
/// as its own parents die, and killed on a later round).
fn kill_children() {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces and parentheses, so the fields
        // are counted from the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|ppid| ppid.parse::<i32>().ok());
        if ppid == Some(me) {
            // SAFETY: kill(2) with plain integers.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
