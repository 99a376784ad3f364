//! Runs over HTTP on `omabox serve` (issue 30), one host on the data directory's SQLite
//! store, linux backend: a run is queued with `POST /v1/sessions/{id}/runs`, claimed by the
//! server's worker, run like `omabox run`, polled with `GET /v1/runs/{id}` until it ends,
//! its revision published and its timeline streamed (`GET /v1/runs/{id}/events`); bad input
//! is refused with the proxy's errors, and a run's credential shows in no answer, event or
//! log line.

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
        if matches!(run["status"].as_str(), Some("completed" | "failed")) {
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
