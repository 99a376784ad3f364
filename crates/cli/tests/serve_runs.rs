//! Runs over HTTP on `omabox serve` (issue 30), one host on the data directory's SQLite
//! store, linux backend: a run is queued with `POST /v1/sessions/{id}/runs`, claimed by the
//! server's worker, run like `omabox run`, polled with `GET /v1/runs/{id}` until it ends,
//! its revision published and its timeline streamed (`GET /v1/runs/{id}/events`); bad input
//! is refused with the proxy's errors, and a run's credential shows in no answer, event or
//! log line; runs are cancelled (`POST /v1/runs/{id}/cancel`) and a session's runs listed
//! (`GET /v1/sessions/{id}/runs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::Serve;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const KEY: &str = "runs-test-operator-key";

/// One HTTP/1.0 request → (status, body). `key` `None` sends no credential.
pub fn request(
    addr: &str,
    key: Option<&str>,
    method: &str,
    path: &str,
    body: &str,
) -> (u16, String) {
    common::serve::http_request(addr, addr, key, method, path, body)
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {body}"))
}

/// Queues `body` in `session`; the run id.
fn submit(addr: &str, session: &str, body: &str) -> String {
    let (status, answer) = request(
        addr,
        Some(KEY),
        "POST",
        &format!("/v1/sessions/{session}/runs"),
        body,
    );
    assert_eq!(status, 201, "{answer}");
    json(&answer)["run_id"].as_str().unwrap().to_owned()
}

/// Polls the run until it ended (or `limit` passed: a hung run fails the test, not a
/// timing); its last status.
fn wait_ended(addr: &str, run_id: &str, limit: Duration) -> serde_json::Value {
    let start = Instant::now();
    loop {
        let (status, body) = request(addr, Some(KEY), "GET", &format!("/v1/runs/{run_id}"), "");
        assert_eq!(status, 200, "{body}");
        let run = json(&body);
        if matches!(
            run["status"].as_str(),
            Some("completed" | "failed" | "cancelled")
        ) {
            return run;
        }
        assert!(start.elapsed() < limit, "run {run_id} did not end: {run}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn start(dirs: &common::TestDirs) -> Serve {
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    // The default log filter: what an operator's serve writes.
    command.env("OMABOX_API_KEY", KEY).env_remove("OMABOX_LOG");
    Serve::start(command)
}

#[test]
fn a_run_posted_over_http_is_run_published_and_streamed() {
    if !common::linux_available() {
        return;
    }
    let dirs = common::TestDirs::new("serve-runs");
    let serve = start(&dirs);
    let addr = serve.addr.clone();

    let first = submit(
        &addr,
        "web-1",
        r#"{"command": ["sh", "-c", "echo made-by-run-one > f; echo first-output"]}"#,
    );
    let run = wait_ended(&addr, &first, Duration::from_secs(300));
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 1, "{run}");
    assert_eq!(run["session_id"], "web-1", "{run}");

    // The second run of the session starts from what the first published.
    let second = submit(&addr, "web-1", r#"{"command": ["cat", "f"]}"#);
    let run = wait_ended(&addr, &second, Duration::from_secs(300));
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 2, "{run}");

    // The timeline: every stored event, then an `end` event, then the stream closes.
    let (status, stream) = request(
        &addr,
        Some(KEY),
        "GET",
        &format!("/v1/runs/{second}/events"),
        "",
    );
    assert_eq!(status, 200, "{stream}");
    assert!(stream.contains("made-by-run-one"), "{stream}");
    assert!(stream.contains(r#""step":"fence.publish""#), "{stream}");
    assert!(stream.contains(r#""revision":2"#), "{stream}");
    assert!(stream.contains("event: end"), "{stream}");
    // Replayed after an event id: the first events are not sent again.
    let mut socket = TcpStream::connect(&addr).unwrap();
    write!(
        socket,
        "GET /v1/runs/{second}/events HTTP/1.0\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\nlast-event-id: 1\r\n\r\n"
    )
    .unwrap();
    let mut replay = String::new();
    socket.read_to_string(&mut replay).unwrap();
    assert!(!replay.contains("\nid: 1\n"), "{replay}");
    assert!(replay.contains("\nid: 2\n"), "{replay}");

    serve.stop();
}

#[test]
fn bad_run_requests_get_the_proxys_errors_and_credentials_show_nowhere() {
    if !common::linux_available() {
        return;
    }
    let dirs = common::TestDirs::new("serve-runs-errors");
    let serve = start(&dirs);
    let addr = serve.addr.clone();
    let body = r#"{"command": ["true"]}"#;

    let (status, answer) = request(&addr, None, "POST", "/v1/sessions/s1/runs", body);
    assert_eq!(
        (status, answer.as_str()),
        (401, r#"{"error":"Unauthorized"}"#)
    );
    let (status, answer) = request(&addr, None, "GET", "/v1/runs/run_x", "");
    assert_eq!(status, 401, "{answer}");
    let (status, answer) = request(&addr, Some(KEY), "GET", "/v1/runs/run_unknown", "");
    assert_eq!((status, answer.as_str()), (404, r#"{"error":"not_found"}"#));
    let (status, answer) = request(&addr, Some(KEY), "GET", "/v1/runs/run_unknown/events", "");
    assert_eq!(status, 404, "{answer}");
    for (bad, field) in [
        (r#"{"command": "true"}"#, "`command`"),
        (
            r#"{"command": ["true"], "credentials": [3]}"#,
            "`credentials[0]`",
        ),
        (r#"{"command": ["true"], "backend": "vm"}"#, "`backend`"),
        (
            r#"{"command": ["true"], "environment": {"networking": 7}}"#,
            "`environment`",
        ),
        (r#"{"agent": "claude"}"#, "`prompt`"),
    ] {
        let (status, answer) = request(&addr, Some(KEY), "POST", "/v1/sessions/s1/runs", bad);
        assert_eq!(status, 400, "{bad}: {answer}");
        assert!(
            json(&answer)["error"].as_str().unwrap().contains(field),
            "{bad}: {answer}"
        );
    }
    let (status, answer) = request(&addr, Some(KEY), "POST", "/v1/sessions/bad%20id/runs", body);
    assert_eq!(status, 400, "{answer}");

    // A malformed credential is refused by position; a well-formed one whose vault secret
    // does not exist fails the run; neither the spec nor the secret's name shows anywhere.
    let secret = "team-vault-secret-q7";
    let malformed = format!(r#"{{"command": ["true"], "credentials": ["{secret}"]}}"#);
    let (status, answer) = request(&addr, Some(KEY), "POST", "/v1/sessions/s1/runs", &malformed);
    assert_eq!(status, 400, "{answer}");
    assert!(!answer.contains(secret), "{answer}");
    let run_id = submit(
        &addr,
        "s2",
        &format!(
            r#"{{"command": ["true"], "credentials": ["api.example.com={secret}:bearer"],
                "environment": {{"networking": {{"type": "limited", "allowed_hosts": ["api.example.com"]}}}}}}"#
        ),
    );
    let run = wait_ended(&addr, &run_id, Duration::from_secs(300));
    assert_eq!(run["status"], "failed", "{run}");
    let (_, status_body) = request(&addr, Some(KEY), "GET", &format!("/v1/runs/{run_id}"), "");
    let (_, events) = request(
        &addr,
        Some(KEY),
        "GET",
        &format!("/v1/runs/{run_id}/events"),
        "",
    );
    let log = serve.stop().join("\n");
    for (what, text) in [("status", &status_body), ("events", &events), ("log", &log)] {
        assert!(
            !text.contains(secret),
            "the secret's name is in the {what}: {text}"
        );
    }
}

#[test]
fn a_run_cancelled_by_a_serve_shutdown_is_run_again_by_the_next_server() {
    if !common::linux_available() {
        return;
    }
    let dirs = common::TestDirs::new("serve-runs-stop");
    let with_short_claims = |dirs: &common::TestDirs| {
        let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
        command
            .env("OMABOX_API_KEY", KEY)
            .env("OMABOX_LEASE_TTL_MS", "1000")
            .env_remove("OMABOX_LOG");
        Serve::start(command)
    };
    let first = with_short_claims(&dirs);
    let run_id = submit(
        &first.addr,
        "stopped",
        r#"{"command": ["sh", "-c", "echo attempt >> tries; sleep 30"]}"#,
    );
    let start = Instant::now();
    loop {
        let (_, body) = request(
            &first.addr,
            Some(KEY),
            "GET",
            &format!("/v1/runs/{run_id}"),
            "",
        );
        if json(&body)["status"] == "running" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // SIGTERM: serve cancels the run (its sandbox cleaned up) and exits 0, the run left
    // claimed; the next server claims it once the claim expired and runs it again.
    first.stop();
    let second = with_short_claims(&dirs);
    let (_, body) = request(
        &second.addr,
        Some(KEY),
        "GET",
        &format!("/v1/runs/{run_id}"),
        "",
    );
    assert_ne!(json(&body)["status"], "failed", "{body}");
    let start = Instant::now();
    loop {
        let (_, body) = request(
            &second.addr,
            Some(KEY),
            "GET",
            &format!("/v1/runs/{run_id}"),
            "",
        );
        let run = json(&body);
        if run["attempts"].as_u64() >= Some(2) && run["status"] == "running" {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{run}");
        std::thread::sleep(Duration::from_millis(50));
    }
    second.stop();
}

/// Polls the run until its status is `wanted` (bounded: a run that never gets there fails
/// the test, not a timing).
fn wait_status(addr: &str, run_id: &str, wanted: &str) {
    let start = Instant::now();
    loop {
        let (_, body) = request(addr, Some(KEY), "GET", &format!("/v1/runs/{run_id}"), "");
        if json(&body)["status"] == wanted {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{body}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A queued run cancelled ends `cancelled` at once and never runs; a running one is aborted
/// by its host after its next claim renewal (it would sleep a minute) and ends `cancelled`;
/// an ended one is a 409. The session goes on, and `GET /v1/sessions/{id}/runs` lists its
/// runs newest first in pages, without their specs. Local backend (test mode): no sandbox
/// is needed to show the queue's behaviour.
#[test]
fn runs_are_cancelled_and_a_sessions_runs_listed_over_http() {
    let dirs = common::TestDirs::new("serve-runs-cancel");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_LEASE_TTL_MS", "1500")
        .env_remove("OMABOX_LOG");
    let serve = Serve::start(command);
    let addr = serve.addr.clone();
    let local = |script: &str| {
        serde_json::json!({"backend": "local", "command": ["sh", "-c", script]}).to_string()
    };

    let sleeper = submit(&addr, "cancels", &local("echo sleeping; sleep 60"));
    let queued = submit(&addr, "cancels", &local("echo never > f"));
    wait_status(&addr, &sleeper, "running");

    let cancel = |run_id: &str, key: Option<&str>| {
        request(&addr, key, "POST", &format!("/v1/runs/{run_id}/cancel"), "")
    };
    let (status, body) = cancel(&queued, Some(KEY));
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)["status"], "cancelled", "{body}");
    let (status, body) = cancel(&sleeper, Some(KEY));
    assert_eq!(status, 202, "{body}");
    assert_eq!(json(&body)["status"], "cancelling", "{body}");
    let run = wait_ended(&addr, &sleeper, Duration::from_secs(300));
    assert_eq!(run["status"], "cancelled", "{run}");
    assert_eq!(run["revision"], serde_json::Value::Null, "{run}");
    let (status, body) = cancel(&sleeper, Some(KEY));
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("cancelled"), "{body}");
    assert_eq!(cancel("run_nonexistent", Some(KEY)).0, 404);
    assert_eq!(cancel(&queued, None).0, 401);

    // The session goes on from where it was: the cancelled runs published nothing.
    let next = submit(&addr, "cancels", &local("test ! -e f && echo fresh > g"));
    let run = wait_ended(&addr, &next, Duration::from_secs(300));
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 1, "{run}");

    let list = |query: &str| {
        let (status, body) = request(
            &addr,
            Some(KEY),
            "GET",
            &format!("/v1/sessions/cancels/runs{query}"),
            "",
        );
        assert_eq!(status, 200, "{body}");
        assert!(
            !body.contains("sleep 60"),
            "a run's spec in the list: {body}"
        );
        json(&body)
    };
    let first = list("?limit=2");
    let ids: Vec<&str> = first["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|run| run["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [next.as_str(), queued.as_str()], "{first}");
    assert_eq!(first["runs"][1]["status"], "cancelled", "{first}");
    let cursor = first["next_cursor"]
        .as_str()
        .expect("a next page")
        .to_owned();
    let second = list(&format!("?limit=2&cursor={cursor}"));
    assert_eq!(second["runs"][0]["run_id"], sleeper.as_str(), "{second}");
    assert_eq!(second["runs"].as_array().unwrap().len(), 1, "{second}");
    assert_eq!(second["next_cursor"], serde_json::Value::Null, "{second}");
    let (status, body) = request(
        &addr,
        Some(KEY),
        "GET",
        "/v1/sessions/cancels/runs?limit=0",
        "",
    );
    assert_eq!(status, 400, "{body}");
    serve.stop();
}
