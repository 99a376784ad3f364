//! Timeouts and caps of the server loop (issue 10 item 3): half-open clients are cut off by
//! the header-read timeout, a stalled body by the idle timeout, a kept-alive connection
//! lives for the keep-alive timeout (not the header-read one) unless the server is crowded,
//! the connection cap never locks out a new client for longer than those timeouts, and a
//! buffered body over the cap is refused. Each wait below is a liveness bound (a hang fails the test), not a timing
//! assertion.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use omabox_proxy::Limits;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Bound for anything that must happen "eventually".
const LIVENESS: Duration = Duration::from_secs(30);

async fn start(limits: Limits) -> SocketAddr {
    let upstream = start_upstream().await;
    let mut config = standard_config(&upstream);
    config.limits = limits.clone();
    let (state, _) = standard_state_with(config).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = omabox_proxy::router(state);
    tokio::spawn(async move {
        omabox_proxy::serve(listener, app, &limits, std::future::pending()).await
    });
    addr
}

/// Opens a connection that sends `bytes` and then nothing more.
async fn half_open(addr: SocketAddr, bytes: &str) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(bytes.as_bytes()).await.unwrap();
    stream
}

/// Waits until the server closes `stream` (EOF or reset), within the liveness bound.
async fn closed_by_server(mut stream: TcpStream) {
    let mut sink = Vec::new();
    tokio::time::timeout(LIVENESS, stream.read_to_end(&mut sink))
        .await
        .expect("the server never closed a stalled connection")
        .ok();
}

async fn healthz(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    response
}

const PARTIAL_HEAD: &str = "GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n";

#[tokio::test]
async fn half_open_requests_are_cut_off_by_the_header_read_timeout() {
    let addr = start(Limits {
        header_read_timeout_ms: 200,
        ..Limits::default()
    })
    .await;
    let stalled = half_open(addr, PARTIAL_HEAD).await;
    let silent = half_open(addr, "").await;
    closed_by_server(stalled).await;
    closed_by_server(silent).await;
}

/// Sends one keep-alive `GET /healthz` on `stream` and reads its whole response.
async fn keep_alive_healthz(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let mut buf = [0u8; 1024];
    loop {
        let text = String::from_utf8_lossy(&response).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|n| n.trim().parse::<usize>().ok())
                .expect("a sized response");
            if body.len() >= length {
                return text;
            }
        }
        let n = tokio::time::timeout(LIVENESS, stream.read(&mut buf))
            .await
            .expect("no response")
            .unwrap();
        assert!(n > 0, "the connection closed before its response: {text:?}");
        response.extend_from_slice(&buf[..n]);
    }
}

/// A connection that has had one answered request and is now kept alive.
async fn kept_alive(addr: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let response = keep_alive_healthz(&mut stream).await;
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    stream
}

#[tokio::test]
async fn a_kept_alive_connection_outlives_the_header_read_and_idle_timeouts() {
    // A client pool reuses idle connections for minutes (the E2B SDKs: 300 s); a server
    // closing one as a request is sent on it fails that request.
    let addr = start(Limits {
        header_read_timeout_ms: 100,
        idle_timeout_ms: 100,
        ..Limits::default()
    })
    .await;
    let mut stream = kept_alive(addr).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = keep_alive_healthz(&mut stream).await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
}

#[tokio::test]
async fn a_kept_alive_connection_is_closed_after_the_keepalive_timeout() {
    let addr = start(Limits {
        keepalive_timeout_ms: 200,
        ..Limits::default()
    })
    .await;
    let stream = kept_alive(addr).await;
    closed_by_server(stream).await;
}

#[tokio::test]
async fn a_next_head_is_timed_from_its_first_byte() {
    let addr = start(Limits {
        header_read_timeout_ms: 200,
        ..Limits::default()
    })
    .await;
    let mut stream = kept_alive(addr).await;
    stream.write_all(PARTIAL_HEAD.as_bytes()).await.unwrap();
    closed_by_server(stream).await;
}

#[tokio::test]
async fn at_the_cap_kept_alive_connections_make_room_for_new_clients() {
    let addr = start(Limits {
        max_connections: 3,
        header_read_timeout_ms: 200,
        ..Limits::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..3 {
        idle.push(kept_alive(addr).await);
    }
    let response = tokio::time::timeout(LIVENESS, healthz(addr))
        .await
        .expect("kept-alive connections locked out a new client");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
}

#[tokio::test]
async fn a_stalled_body_is_cut_off_by_the_idle_timeout() {
    let addr = start(Limits {
        idle_timeout_ms: 200,
        ..Limits::default()
    })
    .await;
    // A complete head (so the header timeout is not what fires), then 10 of 100 bytes.
    let stalled = half_open(
        addr,
        "POST /v1/sessions/s/files HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer operator-KEY-777\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"path\":\"",
    )
    .await;
    closed_by_server(stalled).await;
}

#[tokio::test]
async fn clients_beyond_the_connection_cap_are_served_once_stalled_ones_time_out() {
    let addr = start(Limits {
        max_connections: 3,
        header_read_timeout_ms: 300,
        ..Limits::default()
    })
    .await;
    let mut stalled = Vec::new();
    for _ in 0..6 {
        stalled.push(half_open(addr, PARTIAL_HEAD).await);
    }
    let response = tokio::time::timeout(LIVENESS, healthz(addr))
        .await
        .expect("a new client stayed locked out");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    for stream in stalled {
        closed_by_server(stream).await;
    }
}

#[tokio::test]
async fn a_buffered_body_over_the_cap_is_refused_but_proxy_bodies_stream() {
    let addr = start(Limits {
        max_body_bytes: 64,
        ..Limits::default()
    })
    .await;
    let client = reqwest::Client::new();
    let promote = client
        .post(format!("http://{addr}/v1/sessions/s/files"))
        .header("authorization", "Bearer operator-KEY-777")
        .header("content-type", "application/json")
        .body(format!("{{\"path\":\"/workspace/{}\"}}", "a".repeat(100)))
        .send()
        .await
        .unwrap();
    assert_eq!(promote.status(), 413, "{:?}", promote.text().await);
    // The inference proxy streams its body upstream: the cap does not apply.
    let proxied = client
        .post(format!(
            "http://{addr}/v1/oma/inference-proxy/sess-a/anthropic/v1/echo"
        ))
        .header("x-api-key", "tok-a-SESSION-111")
        .body(vec![b'x'; 4096])
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), 200);
    assert_eq!(proxied.bytes().await.unwrap().len(), 4096);
}

/// The head of a promotion that declares a body it never sends.
fn promotion_head(authorization: &str, length: u64) -> String {
    format!(
        "POST /v1/sessions/s/files HTTP/1.1\r\nhost: 127.0.0.1\r\n{authorization}content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    )
}

/// Reads the status line of the response to what was sent on `stream`.
async fn status_of(mut stream: TcpStream) -> String {
    let mut buf = vec![0u8; 256];
    let n = tokio::time::timeout(LIVENESS, stream.read(&mut buf))
        .await
        .expect("no answer while the body was still owed")
        .unwrap();
    String::from_utf8_lossy(&buf[..n])
        .lines()
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test]
async fn a_buffered_body_is_judged_before_it_is_read() {
    // Idle timeout far beyond the liveness bound: an answer must come without the body.
    let addr = start(Limits {
        max_body_bytes: 64,
        idle_timeout_ms: 600_000,
        header_read_timeout_ms: 600_000,
        ..Limits::default()
    })
    .await;
    // Anonymous: refused at once, nothing buffered.
    let anonymous = half_open(addr, &promotion_head("", 1 << 30)).await;
    assert!(status_of(anonymous).await.contains(" 401 "));
    // Authorized but declaring more than the cap: 413 before any body byte.
    let oversized = half_open(
        addr,
        &promotion_head("authorization: Bearer operator-KEY-777\r\n", 1 << 30),
    )
    .await;
    assert!(status_of(oversized).await.contains(" 413 "));
}

#[test]
fn zero_limits_are_refused() {
    let error =
        omabox_proxy::ServeConfig::from_toml("[limits]\nmax_connections = 0\n").unwrap_err();
    assert!(
        error.to_string().contains("limits.max_connections"),
        "{error}"
    );
    let config = omabox_proxy::ServeConfig::from_toml("[limits]\nidle_timeout_ms = 5\n").unwrap();
    assert_eq!(config.limits.idle_timeout_ms, 5);
    assert_eq!(config.limits.max_connections, 1024);
}

#[tokio::test]
async fn a_stalled_request_does_not_hold_a_shutdown_past_the_drain_deadline() {
    let upstream = start_upstream().await;
    let mut config = standard_config(&upstream);
    let limits = Limits {
        idle_timeout_ms: 3_600_000,
        ..Limits::default()
    };
    config.limits = limits.clone();
    let (state, _) = standard_state_with(config).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        omabox_proxy::serve(listener, omabox_proxy::router(state), &limits, shutdown).await
    });
    // An authorized request whose body never completes (10 of 100 bytes), trickled slower
    // than nothing: only the drain deadline ends it.
    let _stalled = half_open(
        addr,
        "POST /v1/sessions/s/files HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer operator-KEY-777\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"path\":\"",
    )
    .await;
    // A later connection served means the stalled one was accepted (and its head read, in
    // all likelihood: a request still unread would be closed by the drain at once).
    assert!(healthz(addr).await.contains("200"));
    stop.send(()).unwrap();
    tokio::time::timeout(omabox_proxy::server::DRAIN_TIMEOUT + LIVENESS, server)
        .await
        .expect("serve never returned: a stalled request held the shutdown")
        .unwrap()
        .unwrap();
}
