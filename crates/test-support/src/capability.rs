//! The one capability gate of omabox's tests.
//!
//! A test that needs something this machine may lack (root, cgroups, the sandbox's init
//! binary, Python SDKs from PyPI) asks [`require_capability`] first:
//!
//! - capability present → `true`, the test runs;
//! - missing, `CI=true` → panic with the reason: in CI a missing capability is a failure,
//!   never a silent skip;
//! - missing elsewhere → a `SKIP: <test>: <reason>` line on stderr, and the same line
//!   appended to the file `$OMABOX_SKIP_LOG` names (`scripts/test` sets it and prints the
//!   list after the run, because the test runner hides a passing test's stderr), then
//!   `false`: the test returns without asserting anything.
//!
//! What this must never do: skip under `CI=true`, or skip without saying why.

use std::io::Write as _;

/// The environment variable naming the file skips are appended to.
pub const SKIP_LOG_ENV: &str = "OMABOX_SKIP_LOG";

/// `true` when `CI=true`.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|value| value == "true")
}

/// Gates a test on a capability: `missing` is `None` when it is present, else the reason it
/// is not (see the crate doc for what happens then).
pub fn require_capability(missing: Option<String>) -> bool {
    let Some(reason) = missing else {
        return true;
    };
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    if in_ci() {
        panic!("CI=true and a required capability is missing for {test}: {reason}");
    }
    let line = format!("SKIP: {test}: {reason}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os(SKIP_LOG_ENV).filter(|path| !path.is_empty()) {
        // Best effort: a skip log that cannot be written must not fail the test.
        if let Ok(mut file) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(file, "{line}");
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    // These tests change no environment (the CI variable belongs to the process that runs
    // them); they run the branch the current environment selects.
    #[test]
    fn a_present_capability_runs_the_test() {
        assert!(require_capability(None));
    }

    #[test]
    fn a_missing_capability_skips_locally_and_fails_in_ci() {
        let outcome = std::panic::catch_unwind(|| require_capability(Some("no widget".into())));
        match outcome {
            Ok(ran) => {
                assert!(!in_ci());
                assert!(!ran, "a missing capability skips");
            }
            Err(panic) => {
                assert!(in_ci(), "only CI=true turns a skip into a failure");
                let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
                assert!(message.contains("no widget"), "{message}");
            }
        }
    }
}
