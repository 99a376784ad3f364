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
/// is not (see the module doc for what happens then).
pub fn require_capability(missing: Option<String>) -> bool {
    let log = std::env::var_os(SKIP_LOG_ENV).filter(|path| !path.is_empty());
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    match decide(&test, missing, in_ci()) {
        Decision::Run => true,
        Decision::Fail(message) => panic!("{message}"),
        Decision::Skip(line) => {
            eprintln!("{line}");
            if let Some(path) = log {
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
    }
}

/// What the gate does for `test`.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Run,
    /// The `SKIP:` line to print.
    Skip(String),
    /// The panic message.
    Fail(String),
}

fn decide(test: &str, missing: Option<String>, ci: bool) -> Decision {
    match missing {
        None => Decision::Run,
        Some(reason) if ci => Decision::Fail(format!(
            "CI=true and a required capability is missing for {test}: {reason}"
        )),
        Some(reason) => Decision::Skip(format!("SKIP: {test}: {reason}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_present_capability_runs_the_test() {
        assert!(require_capability(None));
        assert_eq!(decide("t", None, true), Decision::Run);
    }

    #[test]
    fn a_missing_capability_skips_with_its_reason_locally() {
        assert_eq!(
            decide("suite::case", Some("no widget".into()), false),
            Decision::Skip("SKIP: suite::case: no widget".into())
        );
    }

    #[test]
    fn a_missing_capability_fails_under_ci() {
        let Decision::Fail(message) = decide("suite::case", Some("no widget".into()), true) else {
            panic!("CI=true never skips");
        };
        assert!(message.contains("suite::case") && message.contains("no widget"));
    }
}
