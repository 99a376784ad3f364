//! Runs over HTTP on three `omabox serve` hosts sharing one PostgreSQL store and one blob
//! dir (issue 30): dozens of runs over many sessions, one host killed with SIGKILL
//! mid-way; every run ends, each is published exactly once (the publication history has
//! each run id once and no gap), each session's workspace has every run's line exactly once
//! and in order, `omabox fsck` finds every revision intact, and `omabox reap` on the killed
//! host leaves nothing. The PostgreSQL server is started by the test
//! (`omabox_test_support::postgres`; the capability gate skips locally, fails under CI).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::{Serve, subdirs};
use omabox_contract::RunQueuePort as _;
use omabox_store::PostgresStore;
use omabox_test_support::postgres::TestPostgres;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const KEY: &str = "three-hosts-operator-key";
const SESSIONS: usize = 12;
const RUNS_PER_SESSION: usize = 3;

fn request(addr: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    common::serve::http_request(addr, addr, Some(KEY), method, path, body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"))
}

fn status(addr: &str, run_id: &str) -> serde_json::Value {
    let (code, body) = request(addr, "GET", &format!("/v1/runs/{run_id}"), "");
    assert_eq!(code, 200, "{body}");
    json(&body)
}

fn ended(run: &serde_json::Value) -> bool {
    matches!(run["status"].as_str(), Some("completed" | "failed"))
}

#[test]
fn three_hosts_one_killed_every_run_ends_and_publishes_exactly_once() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    if !common::linux_available() {
        return;
    }
    let url = server.create_database("three_hosts").unwrap();
    let shared = tempfile::tempdir().unwrap();
    let blob_dir = shared.path().join("blobs");
    let blob_flag = blob_dir.to_str().unwrap().to_owned();
    let hosts: Vec<common::TestDirs> = (0..3)
        .map(|_| common::TestDirs::new("serve-runs-pg"))
        .collect();
    let command = |dirs: &common::TestDirs, args: &[&str]| {
        let mut all = vec!["--blob-dir", blob_flag.as_str()];
        all.extend_from_slice(args);
        let mut command = dirs.command(&all);
        command
            .env("OMABOX_DATABASE_URL", &url)
            .env("OMABOX_API_KEY", KEY)
            // Claims and fences of the killed host expire within 2 s.
            .env("OMABOX_LEASE_TTL_MS", "2000")
            .env_remove("OMABOX_LOG");
        command
    };
    let mut serves: Vec<Option<Serve>> = hosts
        .iter()
        .map(|dirs| {
            Some(Serve::start(command(
                dirs,
                &["serve", "--listen", "127.0.0.1:0", "--max-runs", "2"],
            )))
        })
        .collect();
    let addrs: Vec<String> = serves
        .iter()
        .map(|serve| serve.as_ref().unwrap().addr.clone())
        .collect();

    // Dozens of runs over many sessions, submitted round-robin to the three hosts.
    let mut runs: Vec<(String, String, String)> = Vec::new();
    for round in 0..RUNS_PER_SESSION {
        for session in 0..SESSIONS {
            let session_id = format!("pg-session-{session:02}");
            let tag = format!("tag-{session:02}-{round}");
            let body =
                format!(r#"{{"command": ["sh", "-c", "echo {tag} >> runs.log; sleep 0.3"]}}"#);
            let addr = &addrs[runs.len() % addrs.len()];
            let (code, answer) = request(
                addr,
                "POST",
                &format!("/v1/sessions/{session_id}/runs"),
                &body,
            );
            assert_eq!(code, 201, "{answer}");
            let run_id = json(&answer)["run_id"].as_str().unwrap().to_owned();
            runs.push((run_id, session_id, tag));
        }
    }

    // Host 0 dies with runs in progress, once about a quarter of the runs ended.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = runs
            .iter()
            .filter(|(run_id, _, _)| ended(&status(&addrs[1], run_id)))
            .count();
        if done >= runs.len() / 4 {
            break;
        }
        assert!(Instant::now() < deadline, "runs do not progress");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut killed = serves[0].take().unwrap();
    killed.child().kill().unwrap();
    killed.child().wait().unwrap();
    drop(killed);

    // Every run ends, completed, on the surviving hosts.
    let mut last: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    for (run_id, _, _) in &runs {
        let run = loop {
            let run = status(&addrs[2], run_id);
            if ended(&run) {
                break run;
            }
            assert!(Instant::now() < deadline, "run {run_id} never ended: {run}");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(run["status"], "completed", "{run}");
        last.insert(run_id.clone(), run);
    }
    assert!(
        last.values().any(|run| run["attempts"].as_u64() > Some(1)),
        "no run was claimed again after the kill: {last:#?}"
    );

    // Each run published exactly once: per session, revisions 1..=N, each by one run, every
    // run of the session once, in the order submitted.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(PostgresStore::connect(&url)).unwrap();
    for session in 0..SESSIONS {
        let session_id = format!("pg-session-{session:02}");
        let history = runtime.block_on(store.published_runs(&session_id)).unwrap();
        let expected: Vec<(u64, Option<String>)> = runs
            .iter()
            .filter(|(_, s, _)| *s == session_id)
            .enumerate()
            .map(|(index, (run_id, _, _))| (index as u64 + 1, Some(run_id.clone())))
            .collect();
        assert_eq!(history, expected, "{session_id}");
        for (revision, run_id) in &history {
            let run_id = run_id.as_ref().unwrap();
            assert_eq!(
                last[run_id]["revision"].as_u64(),
                Some(*revision),
                "{run_id}"
            );
        }
        // The workspace has every run's line once, in order.
        let export = tempfile::tempdir().unwrap();
        let output = command(
            &hosts[1],
            &["workspace", "export", "--session", &session_id],
        )
        .arg(export.path().join("ws"))
        .output()
        .unwrap();
        assert!(output.status.success(), "{}", common::describe(&output));
        let lines = std::fs::read_to_string(export.path().join("ws/runs.log")).unwrap();
        let tags: Vec<&str> = runs
            .iter()
            .filter(|(_, s, _)| *s == session_id)
            .map(|(_, _, tag)| tag.as_str())
            .collect();
        assert_eq!(lines.lines().collect::<Vec<_>>(), tags, "{session_id}");
    }

    // fsck: every revision intact.
    let fsck = command(&hosts[1], &["fsck", "--json"]).output().unwrap();
    assert!(fsck.status.success(), "{}", common::describe(&fsck));
    let report: serde_json::Value = serde_json::from_slice(&fsck.stdout).unwrap();
    assert_eq!(report["damagedRevisions"], 0, "{report}");
    assert_eq!(
        report["revisions"].as_array().unwrap().len(),
        SESSIONS * RUNS_PER_SESSION,
        "{report}"
    );

    // reap on the killed host (PostgreSQL, its own runtime dir) leaves nothing.
    let mut reap = hosts[0].command(&["reap", "--json"]);
    reap.env("OMABOX_DATABASE_URL", &url);
    let output = reap.output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let mut again = hosts[0].command(&["reap", "--json"]);
    again.env("OMABOX_DATABASE_URL", &url);
    let output = again.output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["abandoned"]["inspected"], 0, "{report}");
    assert_eq!(report["queued"], serde_json::json!([]), "{report}");
    assert!(
        subdirs(hosts[0].runtime_dir.path()).is_empty(),
        "{:?}",
        subdirs(hosts[0].runtime_dir.path())
    );

    for serve in serves.iter_mut().filter_map(Option::take) {
        serve.stop();
    }
}
