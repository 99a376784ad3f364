//! Signal names and numbers, and the shell's exit code of a process: the one table every
//! crate uses (the agent reports a killed process's signal by name on the wire, backends
//! name signals as Node does, `omabox sandbox run` exits `128 + n` like a shell).
//!
//! Pure data for Linux's generic signal numbers (x86-64, arm64, riscv64; the tests check the
//! table against the platform's libc). This file depends on nothing but `core`: the agent,
//! which may depend on nothing of ours, compiles this same file into itself with
//! `#[path]` instead of depending on the contract crate. Keep it that way (no `crate::`
//! paths, no dependencies).

/// `(number, name)` of every standard (non-real-time) Linux signal.
pub const SIGNALS: &[(i32, &str)] = &[
    (1, "SIGHUP"),
    (2, "SIGINT"),
    (3, "SIGQUIT"),
    (4, "SIGILL"),
    (5, "SIGTRAP"),
    (6, "SIGABRT"),
    (7, "SIGBUS"),
    (8, "SIGFPE"),
    (9, "SIGKILL"),
    (10, "SIGUSR1"),
    (11, "SIGSEGV"),
    (12, "SIGUSR2"),
    (13, "SIGPIPE"),
    (14, "SIGALRM"),
    (15, "SIGTERM"),
    (17, "SIGCHLD"),
    (18, "SIGCONT"),
    (19, "SIGSTOP"),
    (20, "SIGTSTP"),
    (21, "SIGTTIN"),
    (22, "SIGTTOU"),
    (23, "SIGURG"),
    (24, "SIGXCPU"),
    (25, "SIGXFSZ"),
    (26, "SIGVTALRM"),
    (27, "SIGPROF"),
    (28, "SIGWINCH"),
    (29, "SIGIO"),
    (30, "SIGPWR"),
    (31, "SIGSYS"),
];

/// Exit code a shell reports for a signal it cannot name.
pub const UNKNOWN_SIGNAL_EXIT: u8 = 255;

/// `SIGKILL` for 9; `None` for a number not in [`SIGNALS`].
pub fn signal_name(number: i32) -> Option<&'static str> {
    SIGNALS
        .iter()
        .find(|(n, _)| *n == number)
        .map(|(_, name)| *name)
}

/// 9 for `SIGKILL` (exact upper-case name, with the `SIG` prefix).
pub fn signal_number(name: &str) -> Option<i32> {
    SIGNALS.iter().find(|(_, s)| *s == name).map(|(n, _)| *n)
}

/// The exit code a shell reports for a process that exited with `code` or was killed by the
/// signal named `signal`: `code & 0xff`, or `128 + n`; `None` when neither is known.
/// A signal name not in the table (a real-time signal) gives [`UNKNOWN_SIGNAL_EXIT`].
pub fn shell_exit_code(code: Option<i32>, signal: Option<&str>) -> Option<u8> {
    match (code, signal) {
        (Some(code), _) => Some((code & 0xff) as u8),
        (None, Some(name)) => Some(
            signal_number(name)
                .and_then(|n| u8::try_from(128 + n).ok())
                .unwrap_or(UNKNOWN_SIGNAL_EXIT),
        ),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_this_platforms_libc() {
        let libc = [
            (libc::SIGHUP, "SIGHUP"),
            (libc::SIGINT, "SIGINT"),
            (libc::SIGQUIT, "SIGQUIT"),
            (libc::SIGILL, "SIGILL"),
            (libc::SIGTRAP, "SIGTRAP"),
            (libc::SIGABRT, "SIGABRT"),
            (libc::SIGBUS, "SIGBUS"),
            (libc::SIGFPE, "SIGFPE"),
            (libc::SIGKILL, "SIGKILL"),
            (libc::SIGUSR1, "SIGUSR1"),
            (libc::SIGSEGV, "SIGSEGV"),
            (libc::SIGUSR2, "SIGUSR2"),
            (libc::SIGPIPE, "SIGPIPE"),
            (libc::SIGALRM, "SIGALRM"),
            (libc::SIGTERM, "SIGTERM"),
            (libc::SIGCHLD, "SIGCHLD"),
            (libc::SIGCONT, "SIGCONT"),
            (libc::SIGSTOP, "SIGSTOP"),
            (libc::SIGTSTP, "SIGTSTP"),
            (libc::SIGTTIN, "SIGTTIN"),
            (libc::SIGTTOU, "SIGTTOU"),
            (libc::SIGURG, "SIGURG"),
            (libc::SIGXCPU, "SIGXCPU"),
            (libc::SIGXFSZ, "SIGXFSZ"),
            (libc::SIGVTALRM, "SIGVTALRM"),
            (libc::SIGPROF, "SIGPROF"),
            (libc::SIGWINCH, "SIGWINCH"),
            (libc::SIGIO, "SIGIO"),
            (libc::SIGPWR, "SIGPWR"),
            (libc::SIGSYS, "SIGSYS"),
        ];
        assert_eq!(SIGNALS, &libc[..]);
    }

    #[test]
    fn exits_map_like_a_shell() {
        assert_eq!(shell_exit_code(Some(3), None), Some(3));
        assert_eq!(shell_exit_code(Some(256 + 7), None), Some(7));
        assert_eq!(shell_exit_code(None, Some("SIGKILL")), Some(137));
        assert_eq!(shell_exit_code(None, Some("SIGTERM")), Some(143));
        assert_eq!(shell_exit_code(None, Some("SIGRTMIN+3")), Some(255));
        assert_eq!(shell_exit_code(None, None), None);
        assert_eq!(signal_name(9), Some("SIGKILL"));
        assert_eq!(signal_name(16), None);
        assert_eq!(signal_number("SIGTERM"), Some(15));
        assert_eq!(signal_number("TERM"), None);
    }
}
