//! Pause points for concurrency tests: `OMABOX_PAUSE_POINT=<name>` with
//! `OMABOX_PAUSE_FILE=<path>` (honoured only together with `OMABOX_TEST_MODE=1`) makes the
//! process, when it reaches the point of that name, create `<path>.paused` and wait until
//! `<path>` exists (at most two minutes), so a test can run another command exactly there —
//! a collection while a check holds what it read, say. The kill twin is
//! `omabox_sandbox::fault`.
//!
//! It must never do anything else: no output; without the variables a point is one
//! environment lookup.

use std::time::{Duration, Instant};

/// The variable naming the point to pause at.
pub const PAUSE_POINT_ENV: &str = "OMABOX_PAUSE_POINT";
/// The variable naming the go file (`<file>.paused` says the point was reached).
pub const PAUSE_FILE_ENV: &str = "OMABOX_PAUSE_FILE";

/// Pauses here if `name` is the configured pause point (module doc). Blocking.
pub fn pause(name: &str) {
    let Some(wanted) = std::env::var_os(PAUSE_POINT_ENV) else {
        return;
    };
    if wanted != name || std::env::var_os(omabox_sandbox::TEST_MODE_ENV).is_none_or(|v| v != "1") {
        return;
    }
    let Some(go) = std::env::var_os(PAUSE_FILE_ENV).map(std::path::PathBuf::from) else {
        return;
    };
    let mut paused = go.clone().into_os_string();
    paused.push(".paused");
    let _ = std::fs::write(&paused, b"");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !go.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// [`pause`] from async code: the wait runs on the blocking pool; without the variable it is
/// one environment lookup and no task.
pub async fn pause_async(name: &'static str) {
    if std::env::var_os(PAUSE_POINT_ENV).is_none() {
        return;
    }
    let _ = tokio::task::spawn_blocking(move || pause(name)).await;
}
