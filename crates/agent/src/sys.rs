//! Thin, safe wrappers over the few raw syscalls the agent needs.
//!
//! `waitpid` is called raw (not through a crate that refuses unknown signal numbers)
//! because a reaped status must never be lost: once the kernel hands it over, it is gone.

use std::io;
use std::os::fd::RawFd;

use crate::message::ProcessExit;

/// Decoded wait status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawExit {
    /// Exit code on normal exit.
    pub code: Option<i32>,
    /// Signal number on death by signal.
    pub signal: Option<i32>,
    /// Core dumped.
    pub core_dumped: bool,
}

impl RawExit {
    /// Wire form.
    pub fn to_exit(self) -> ProcessExit {
        ProcessExit {
            code: self.code,
            signal: self.signal.map(signal_name),
            core_dumped: self.core_dumped,
            timed_out: false,
            output_truncated: false,
        }
    }
}

/// `waitpid(pid, WNOHANG)`; `pid == -1` means any child. `Ok(None)`: nothing to reap.
pub fn waitpid_nohang(pid: i32) -> io::Result<Option<(i32, RawExit)>> {
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: `status` is a valid, writable c_int; waitpid has no other memory effects.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == 0 {
            return Ok(None);
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        let exit = if libc::WIFEXITED(status) {
            RawExit {
                code: Some(libc::WEXITSTATUS(status)),
                signal: None,
                core_dumped: false,
            }
        } else if libc::WIFSIGNALED(status) {
            RawExit {
                code: None,
                signal: Some(libc::WTERMSIG(status)),
                core_dumped: libc::WCOREDUMP(status),
            }
        } else {
            // Stopped/continued are not reported without WUNTRACED/WCONTINUED.
            continue;
        };
        return Ok(Some((r, exit)));
    }
}

/// Sends `sig` to process group `pgid`, and when its leader leads a session (a process in a
/// terminal), to the session's other groups too: an interactive shell puts each job in a
/// group of its own, and killing the terminal's process must not leave them running. ESRCH
/// (group gone) is `Ok(false)`.
pub fn kill_group(pgid: i32, sig: i32) -> io::Result<bool> {
    if pgid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal group <= 1",
        ));
    }
    // Read before the signal, while the leader still exists to be asked.
    let leads_session = sig != 0 && session_of(pgid) == Some(pgid);
    let signalled = signal_group(pgid, sig);
    if leads_session {
        for group in session_groups(pgid) {
            let _ = signal_group(group, sig);
        }
    }
    signalled
}

/// The session of process `pid`, `None` when it is gone.
fn session_of(pid: i32) -> Option<i32> {
    // SAFETY: getsid(2) takes a plain integer and has no memory effects.
    let sid = unsafe { libc::getsid(pid) };
    (sid > 0).then_some(sid)
}

/// The process groups, other than `sid`'s own, of the processes in session `sid` (read
/// from /proc; a session id is never reused while a process is in it, so these are its).
fn session_groups(sid: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut groups: Vec<i32> = entries
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        })
        .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
        .filter_map(|stat| group_and_session(&stat))
        .filter(|&(group, session)| session == sid && group != sid && group > 1)
        .map(|(group, _)| group)
        .collect();
    groups.sort_unstable();
    groups.dedup();
    groups
}

/// The process group and session of a `/proc/PID/stat` line (fields 5 and 6, counted after
/// the command name, which may hold spaces and parentheses).
fn group_and_session(stat: &str) -> Option<(i32, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_ascii_whitespace().skip(2);
    let group = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some((group, session))
}

/// kill(2) of group `pgid` (> 1); ESRCH is `Ok(false)`.
fn signal_group(pgid: i32, sig: i32) -> io::Result<bool> {
    if pgid <= 1 {
        return Ok(false);
    }
    // SAFETY: kill(2) takes plain integers and has no memory effects; a negative pid
    // addresses exactly one process group (pgid > 1 checked above, so this can never
    // become kill(-1) = every process).
    let r = unsafe { libc::kill(-pgid, sig) };
    if r == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::ESRCH) {
        Ok(false)
    } else {
        Err(e)
    }
}

/// Whether a process group still has members.
pub fn group_alive(pgid: i32) -> bool {
    match kill_group(pgid, 0) {
        Ok(alive) => alive,
        // EPERM means it exists but we may not signal it.
        Err(e) => e.raw_os_error() == Some(libc::EPERM),
    }
}

/// As PID 1 of a pid namespace only: SIGKILL every other process in the namespace.
pub fn kill_all_in_namespace() {
    if getpid() == 1 {
        // SAFETY: kill(2) with plain integers. Guarded by getpid() == 1: only the init of
        // a pid namespace may do this, where -1 means "every process in my namespace".
        unsafe {
            libc::kill(-1, libc::SIGKILL);
        }
    }
}

/// Our pid.
pub fn getpid() -> u32 {
    std::process::id()
}

/// Makes us the reaper of orphaned descendants (for when we are not PID 1).
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Makes this process non-dumpable: its `/proc/<pid>/fd`, memory and environ are closed to
/// every process without `CAP_SYS_PTRACE`, the sandbox's root included. The agent's
/// connection to the host is one of its fds (its stdout under `--stdio`): a process that
/// could open it could write frames in the agent's name.
pub fn set_non_dumpable() -> io::Result<()> {
    // SAFETY: prctl(PR_SET_DUMPABLE, 0) takes integer arguments only.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0 as libc::c_ulong, 0, 0, 0) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Sets FD_CLOEXEC so an inherited descriptor does not leak into the processes we start
/// (a child holding the connection would keep it open after the agent died).
pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on an integer fd with integer arguments; an invalid fd yields EBADF.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    let r = unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

// The one signal table (see its module doc): shared with the contract crate by source, since
// the agent depends on nothing of ours.
// Not every helper of the table is used on this side (the shell exit code is the host's).
#[path = "../../contract/src/signals.rs"]
#[allow(dead_code)]
mod signal_table;

/// `SIGKILL` for 9; `SIGRTMIN+n` / `SIG<n>` for the rest.
pub fn signal_name(sig: i32) -> String {
    if let Some(name) = signal_table::signal_name(sig) {
        return name.to_owned();
    }
    let rtmin = libc::SIGRTMIN();
    if sig >= rtmin && sig <= libc::SIGRTMAX() {
        return format!("SIGRTMIN+{}", sig - rtmin);
    }
    format!("SIG{sig}")
}

/// Parses `SIGTERM`, `TERM` or a number.
pub fn signal_number(name: &str) -> Option<i32> {
    let upper = name.trim().to_ascii_uppercase();
    if let Ok(n) = upper.parse::<i32>() {
        return (1..=libc::SIGRTMAX()).contains(&n).then_some(n);
    }
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    signal_table::signal_number(&full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_its_group_and_session() {
        let stat = "4242 (a (weird) name) S 1 4242 4240 34816 4242 4194560 97 0";
        assert_eq!(group_and_session(stat), Some((4242, 4240)));
        assert_eq!(group_and_session("garbage"), None);
    }

    #[test]
    fn signal_names() {
        assert_eq!(signal_name(9), "SIGKILL");
        assert_eq!(signal_number("SIGKILL"), Some(9));
        assert_eq!(signal_number("term"), Some(15));
        assert_eq!(signal_number("15"), Some(15));
        assert_eq!(signal_number("SIGNOPE"), None);
        assert!(signal_name(libc::SIGRTMIN() + 1).starts_with("SIGRTMIN+"));
    }
}
