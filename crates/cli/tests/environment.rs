//! `omabox run --environment FILE`: the file is an Environment or its `config`, a JSON
//! object in the public Environment API's shapes; anything else is refused before the run
//! claims its work item's fence. The local backend (test mode) is enough: the file is read
//! before any backend is involved.

// Shared with the other CLI tests; this one needs only part of it.
#[allow(dead_code)]
mod common;

use common::describe;
use serde_json::Value;
use std::process::Output;

/// `omabox run --json --backend local --session SESSION --environment <text> -- true`.
fn run(dirs: &common::TestDirs, session: &str, environment: &str) -> Output {
    let file = dirs.data.path().join(format!("{session}-env.json"));
    std::fs::write(&file, environment).unwrap();
    dirs.command(&["run", "--json", "--backend", "local", "--session", session])
        .arg("--environment")
        .arg(&file)
        .args(["--", "true"])
        .env("OMABOX_TEST_MODE", "1")
        .output()
        .expect("omabox runs")
}

#[test]
fn an_environment_that_is_not_a_json_object_is_refused_before_a_fence_is_claimed() {
    let dirs = common::TestDirs::new("environment");
    for (text, says) in [
        (
            "[]",
            "must be a JSON object (an Environment or its `config`), not an array",
        ),
        ("null", "not null"),
        ("42", "not a number"),
        (r#""cloud""#, "not a string"),
        (
            r#"{"config":[]}"#,
            "`config` must be a JSON object, not an array",
        ),
        (
            r#"{"config":null}"#,
            "`config` must be a JSON object, not null",
        ),
        (
            r#"{"config":7}"#,
            "`config` must be a JSON object, not a number",
        ),
    ] {
        let output = run(&dirs, "bad", text);
        assert_eq!(
            output.status.code(),
            Some(1),
            "{text}: {}",
            describe(&output)
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--environment") && stderr.contains(says),
            "{text}: {stderr}"
        );
        // No report: the run never reached its transaction.
        assert!(output.stdout.is_empty(), "{text}: {}", describe(&output));
    }
    // Nothing was claimed: the session's first run that goes ahead claims generation 1.
    let output = run(&dirs, "bad", r#"{"type":"cloud"}"#);
    assert!(output.status.success(), "{}", describe(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["generation"], 1, "{report}");
    assert_eq!(report["result"]["type"], "completed", "{report}");
}

/// The public API's exact JSON: an Environment object as a retrieve returns it, and a
/// `config` as create params spell it (`"type": "packages"`, `null` for every list).
#[test]
fn the_public_apis_environment_json_is_accepted() {
    let dirs = common::TestDirs::new("environment");
    let retrieved = r#"{"id":"env_011CZkZ9X2dpNyB7HsEFoRfW","type":"environment","name":"empty","description":null,
        "config":{"type":"cloud","packages":{"type":"packages","apt":[],"cargo":[],"gem":[],"go":[],"npm":[],"pip":[]}},
        "metadata":{},"archived_at":null,"created_at":"2026-04-01T00:00:00Z","updated_at":"2026-04-01T00:00:00Z"}"#;
    let params = r#"{"type":"cloud","networking":null,
        "packages":{"type":"packages","apt":null,"cargo":null,"gem":null,"go":null,"npm":null,"pip":null}}"#;
    for (session, text) in [("retrieved", retrieved), ("params", params)] {
        let output = run(&dirs, session, text);
        assert!(output.status.success(), "{session}: {}", describe(&output));
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        assert_eq!(report["result"]["type"], "completed", "{report}");
    }
}
