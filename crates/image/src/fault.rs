//! Crash points for kill tests, the twin of `omabox_sandbox::fault` (this crate depends
//! on nothing of omabox's): `OMABOX_FAULT_POINT=<name>` together with
//! `OMABOX_TEST_MODE=1` makes the process `SIGKILL` itself at the point of that name, like
//! `kill -9` there (no destructor runs), so tests can prove `omabox reap` finds what it
//! leaves. Must never do anything else; without both variables a point is one lookup.

/// Kills this process with `SIGKILL` if `name` is the configured fault point.
pub(crate) fn point(name: &str) {
    let Some(wanted) = std::env::var_os("OMABOX_FAULT_POINT") else {
        return;
    };
    if wanted == name && std::env::var_os("OMABOX_TEST_MODE").is_some_and(|v| v == "1") {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}
