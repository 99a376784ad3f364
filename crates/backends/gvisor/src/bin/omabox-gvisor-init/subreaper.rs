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
    let mut code = 1;
    loop {
        let mut status = 0;
        // SAFETY: waitpid writes one int through a valid pointer.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                // ECHILD: runsc and everything it left are reaped.
                _ => break,
            }
        }
        if pid == runsc {
            code = if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                128 + libc::WTERMSIG(status)
            };
        }
    }
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
