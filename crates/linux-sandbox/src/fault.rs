//! A crash point for kill tests (the twin of `omabox_sandbox::fault`, which this mechanism
//! may not depend on): `OMABOX_FAULT_POINT=<name>` together with `OMABOX_TEST_MODE=1` makes
//! the process `SIGKILL` itself at the point of that name, like `kill -9` at that step.
//!
//! It must never do anything else: no output, no delay; without both variables a point is
//! one environment lookup.

/// Kills this process with `SIGKILL` if `name` is the configured fault point.
pub(crate) fn point(name: &str) {
    let Some(wanted) = std::env::var_os("OMABOX_FAULT_POINT") else {
        return;
    };
    if wanted == name && std::env::var_os("OMABOX_TEST_MODE").is_some_and(|v| v == "1") {
        // SAFETY: kill(2) on our own pid has no memory-safety preconditions.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}
