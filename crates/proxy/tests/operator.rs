//! The operator routes are authenticated by default and safe against a browser (issue 10
//! item 2): the key is always required, a foreign Host or Origin is refused on every route,
//! no CORS header is ever sent, JSON routes need `application/json`, the content route
//! serves only promoted files by their promoted id (streamed, with the stored media type),
//! and the operator key never reaches a log line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use omabox_contract::SecretString;
use omabox_proxy::files::{FileContent, FileError, PromotedFile, SessionFilesPort};
use omabox_proxy::promoted::PromotedStore;
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig, router};
use sha2::{Digest as _, Sha256};
use std::sync::Arc;
use tower::ServiceExt as _;

const KEY: &str = "operator-KEY-777";
const REPORT: &[u8] = b"# report\nhello\n";

/// Promotion over a real promoted store; the "publication" has one file.
struct StoreFiles(PromotedStore);

#[async_trait::async_trait]
impl SessionFilesPort for StoreFiles {
    async fn promote(&self, session_id: &str, path: &str) -> Result<PromotedFile, FileError> {
        if (session_id, path) != ("sess-a", "/mnt/session/outputs/report.md") {
            return Err(FileError::NotFound(path.to_owned()));
        }
        let hash: [u8; 32] = Sha256::digest(REPORT).into();
        let record = self
            .0
            .promote(REPORT, &hash, "text/markdown", session_id, path)
            .unwrap();
        Ok(PromotedFile::from(&record))
    }
    async fn content(&self, file_id: &str) -> Result<Option<FileContent>, FileError> {
        Ok(self
            .0
            .open_file(file_id)
            .unwrap()
            .map(|(record, bytes)| FileContent {
                file: PromotedFile::from(&record),
                bytes,
            }))
    }
}

struct Fixture {
    state: ProxyState,
    _dir: tempfile::TempDir,
}

async fn fixture(public_url: Option<&str>) -> Fixture {
    let upstream = start_upstream().await;
    let mut config: ServeConfig = standard_config(&upstream);
    config.public_url = public_url.map(str::to_owned);
    let dir = tempfile::tempdir().unwrap();
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens: Arc::new(MemoryTokens::default()),
        vault: Arc::new(MemoryVault::default()),
        files: Some(Arc::new(StoreFiles(
            PromotedStore::open(dir.path()).unwrap(),
        ))),
        env: Default::default(),
        operator_key: SecretString::new(KEY),
        sandboxes: None,
        runs: None,
    })
    .unwrap();
    Fixture { state, _dir: dir }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: Vec<u8>,
}

async fn send(state: &ProxyState, request: Request<Body>) -> Reply {
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap()
        .to_vec();
    Reply {
        status,
        headers,
        body,
    }
}

fn promote(host: &str, auth: Option<&str>, content_type: Option<&str>) -> Request<Body> {
    let mut builder = Request::post("/v1/sessions/sess-a/files").header("host", host);
    if let Some(auth) = auth {
        builder = builder.header("authorization", auth);
    }
    if let Some(content_type) = content_type {
        builder = builder.header("content-type", content_type);
    }
    builder
        .body(Body::from(r#"{"path":"/mnt/session/outputs/report.md"}"#))
        .unwrap()
}

fn content(id: &str) -> Request<Body> {
    Request::get(format!("/v1/files/{id}/content"))
        .header("host", "localhost:8787")
        .header("x-api-key", KEY)
        .body(Body::empty())
        .unwrap()
}

const JSON: Option<&str> = Some("application/json");
const BEARER: Option<&str> = Some("Bearer operator-KEY-777");

#[tokio::test]
async fn the_key_is_always_required_and_json_is_enforced() {
    let logs = capture_logs();
    let fixture = fixture(None).await;
    let state = &fixture.state;
    let host = "127.0.0.1:8787";
    assert_eq!(send(state, promote(host, None, JSON)).await.status, 401);
    assert_eq!(
        send(state, promote(host, Some("Bearer wrong"), JSON))
            .await
            .status,
        403
    );
    for content_type in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let reply = send(state, promote(host, BEARER, content_type)).await;
        assert_eq!(
            reply.status,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "{content_type:?}"
        );
    }
    let reply = send(
        state,
        promote(host, BEARER, Some("application/json; charset=utf-8")),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED);
    let created: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(created["size"], REPORT.len());
    assert_eq!(created["mediaType"], "text/markdown");
    let id = created["id"].as_str().unwrap();
    assert!(id.starts_with("file_") && id.len() == 37, "{id}");
    let unauthenticated = Request::get(format!("/v1/files/{id}/content"))
        .header("host", host)
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(state, unauthenticated).await.status, 401);
    assert_logs_clean(&logs);
    assert!(!logs.text().contains(KEY));
}

#[tokio::test]
async fn content_serves_only_promoted_files_streamed_with_their_media_type() {
    let fixture = fixture(None).await;
    let state = &fixture.state;
    let reply = send(state, promote("localhost", BEARER, JSON)).await;
    let created: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();

    let reply = send(state, content(&id)).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, REPORT);
    assert_eq!(reply.headers["content-type"], "text/markdown");
    assert_eq!(
        reply.headers["content-length"],
        REPORT.len().to_string().as_str()
    );
    assert_eq!(reply.headers["x-content-type-options"], "nosniff");
    assert_eq!(reply.headers["content-disposition"], "attachment");

    // The blob's hash (what the old route accepted) and anything else unpromoted: 404.
    let by_hash = format!("file_{}", hex::encode(Sha256::digest(REPORT)));
    for id in [
        by_hash.as_str(),
        "file_abc",
        "..",
        "file_0123456789abcdef0123456789abcdef",
    ] {
        assert_eq!(send(state, content(id)).await.status, 404, "{id}");
    }
}

#[tokio::test]
async fn a_foreign_host_or_origin_is_refused_on_every_route_and_no_cors_is_sent() {
    let fixture = fixture(Some("http://10.0.2.2:8787")).await;
    let state = &fixture.state;
    let routes = [
        ("GET", "/healthz"),
        ("GET", "/metrics"),
        ("POST", "/v1/sessions/sess-a/files"),
        (
            "GET",
            "/v1/files/file_0123456789abcdef0123456789abcdef/content",
        ),
        (
            "POST",
            "/v1/oma/inference-proxy/sess-a/anthropic/v1/messages",
        ),
        ("POST", "/v1/oma/mcp-proxy/sess-a/tools"),
        ("GET", "/no/such/route"),
    ];
    let bad: [&[(&str, &str)]; 6] = [
        &[("host", "evil.test")],
        &[("host", "evil.test:8787")],
        &[("host", "10.0.2.2:9999")],
        &[],
        &[("host", "127.0.0.1:8787"), ("origin", "http://evil.test")],
        // Two Host headers: ambiguous, whichever one a later hop reads.
        &[("host", "127.0.0.1:8787"), ("host", "evil.test")],
    ];
    for (method, uri) in routes {
        for headers in bad {
            let mut builder = Request::builder()
                .method(method)
                .uri(uri)
                .header("authorization", "Bearer operator-KEY-777")
                .header("content-type", "application/json");
            for (name, value) in headers {
                builder = builder.header(*name, *value);
            }
            let reply = send(state, builder.body(Body::from("{}")).unwrap()).await;
            assert_eq!(
                reply.status,
                StatusCode::MISDIRECTED_REQUEST,
                "{method} {uri} {headers:?}"
            );
            assert_eq!(reply.body, br#"{"error":"host_not_allowed"}"#);
        }
    }
    // An absolute-form target names its own authority (RFC 9112 §3.2.2): it must pass the
    // rule too, whatever the Host header says.
    for (method, uri) in routes {
        let absolute = format!("http://evil.test{uri}");
        let request = Request::builder()
            .method(method)
            .uri(absolute.as_str())
            .header("host", "127.0.0.1:8787")
            .header("authorization", "Bearer operator-KEY-777")
            .header("content-type", "application/json")
            .body(Body::from("{}"))
            .unwrap();
        let reply = send(state, request).await;
        assert_eq!(reply.status, StatusCode::MISDIRECTED_REQUEST, "{absolute}");
    }
    for host in ["10.0.2.2:8787", "localhost:1234", "127.0.0.1", "[::1]:8787"] {
        let request = Request::get("/healthz")
            .header("host", host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(state, request).await.status, 200, "{host}");
    }

    // A CORS preflight and a cross-origin-looking request from an allowed origin get no
    // Access-Control-* header.
    let preflight = Request::options("/v1/sessions/sess-a/files")
        .header("host", "127.0.0.1:8787")
        .header("origin", "http://localhost:8787")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .body(Body::empty())
        .unwrap();
    let reply = send(state, preflight).await;
    assert!(reply.status.is_client_error(), "{}", reply.status);
    let reply = send(state, promote("localhost", BEARER, JSON)).await;
    assert_eq!(reply.status, 201);
    assert!(
        !reply
            .headers
            .keys()
            .any(|name| name.as_str().starts_with("access-control-")),
        "{:?}",
        reply.headers
    );
}
