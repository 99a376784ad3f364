//! Crash points for kill tests: `OMABOX_FAULT_POINT=<name>` (honoured only together with
//! `OMABOX_TEST_MODE=1`) makes the process `SIGKILL` itself when it reaches the point of that
//! name — no destructor, no `Drop` guard, no signal handler runs, exactly like `kill -9` at
//! that step. Tests use it to prove that every crash point leaves nothing `omabox reap`
//! cannot find.
//!
//! It must never do anything else: no output, no delay; without both variables a point is
//! one environment lookup.

/// The variable naming the point to crash at.
pub const FAULT_POINT_ENV: &str = "OMABOX_FAULT_POINT";

/// Kills this process with `SIGKILL` if `name` is the configured fault point (module doc).
pub fn point(name: &str) {
    let Some(wanted) = std::env::var_os(FAULT_POINT_ENV) else {
        return;
    };
    if wanted == name && std::env::var_os(crate::TEST_MODE_ENV).is_some_and(|v| v == "1") {
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    }
}
