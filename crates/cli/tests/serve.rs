//! `omabox serve` on a fresh data directory with no config: it starts, answers `/healthz`
//! and `/openapi.json`, refuses an inference request without a token, and stops cleanly on
//! SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};

fn get(addr: &str, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_starts_fresh_and_answers_healthz() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data.path().join("fresh"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OMABOX_API_KEY")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("omabox serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();

    let health = get(&addr, "GET", "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"status":"ok"}"#), "{health}");
    let openapi = get(&addr, "GET", "/openapi.json");
    assert!(openapi.contains("\"openapi\": \"3.1.0\""), "{openapi}");
    let refused = get(
        &addr,
        "POST",
        "/v1/oma/inference-proxy/s1/anthropic/v1/messages",
    );
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        refused.ends_with(r#"{"error":"Unauthorized"}"#),
        "{refused}"
    );

    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
}
