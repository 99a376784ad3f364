//! The routes over `tower::ServiceExt::oneshot` and over a real loopback socket: every status
//! code of reference §5.5, header planning as the upstream sees it, redirects passed through,
//! the MCP proxy, and no secret in the TRACE logs. (File promotion: `operator.rs`.)

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use omabox_proxy::{ProxyState, router};
use tower::ServiceExt as _;

async fn oneshot(state: &ProxyState, mut request: Request<Body>) -> (StatusCode, String) {
    request
        .headers_mut()
        .entry("host")
        .or_insert(axum::http::HeaderValue::from_static("127.0.0.1"));
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

fn post(uri: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::post(uri).header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Body::from("{}")).unwrap()
}

const MESSAGES: &str = "/v1/oma/inference-proxy/sess-a/anthropic/v1/messages";

#[tokio::test]
async fn oneshot_reference_status_codes() {
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, tokens) = standard_state(&upstream).await;
    let cases: Vec<(Request<Body>, StatusCode, &str)> = vec![
        (
            post(MESSAGES, &[]),
            StatusCode::UNAUTHORIZED,
            r#"{"error":"Unauthorized"}"#,
        ),
        (
            post(MESSAGES, &[("authorization", "Bearer   ")]),
            StatusCode::UNAUTHORIZED,
            r#"{"error":"Unauthorized"}"#,
        ),
        (
            post(
                MESSAGES,
                &[
                    ("authorization", "Bearer tok-a-SESSION-111"),
                    ("x-api-key", "tok-b-SESSION-222"),
                ],
            ),
            StatusCode::UNAUTHORIZED,
            r#"{"error":"Conflicting credentials"}"#,
        ),
        (
            post(MESSAGES, &[("x-api-key", "no-such-token")]),
            StatusCode::FORBIDDEN,
            r#"{"error":"forbidden"}"#,
        ),
        (
            post(MESSAGES, &[("authorization", "Bearer tok-b-SESSION-222")]),
            StatusCode::FORBIDDEN,
            r#"{"error":"forbidden"}"#,
        ),
        (
            post(
                "/v1/oma/inference-proxy/sess-none/anthropic/v1/messages",
                &[("x-api-key", "tok-none-SESSION-444")],
            ),
            StatusCode::FORBIDDEN,
            r#"{"error":"forbidden"}"#,
        ),
        (
            post(
                "/v1/oma/inference-proxy/sess-a/anthropic/v1/../../admin",
                &[("x-api-key", "tok-a-SESSION-111")],
            ),
            StatusCode::BAD_REQUEST,
            r#"{"error":"invalid proxy path: a segment is empty, '.' or '..', is not UTF-8, or contains '/', '\\', '?', '#', a control character or a percent-escape after decoding"}"#,
        ),
        (
            post(
                "/v1/oma/inference-proxy/sess-a",
                &[("x-api-key", "tok-a-SESSION-111")],
            ),
            StatusCode::FORBIDDEN,
            r#"{"error":"forbidden"}"#,
        ),
        (
            post(
                "/v1/oma/inference-proxy/sess-a/gemini/v1beta/models/m:generateContent",
                &[("x-api-key", "tok-a-SESSION-111")],
            ),
            StatusCode::CONFLICT,
            r#"{"error":"inference_protocol_unsupported"}"#,
        ),
        (
            post(
                "/v1/oma/inference-proxy/sess-a/openai/v1/chat/completions",
                &[("x-api-key", "tok-a-SESSION-111")],
            ),
            StatusCode::CONFLICT,
            r#"{"error":"inference_protocol_unsupported"}"#,
        ),
    ];
    for (request, status, body) in cases {
        let uri = request.uri().clone();
        let (got_status, got_body) = oneshot(&state, request).await;
        assert_eq!((got_status, got_body.as_str()), (status, body), "{uri}");
    }
    // Revoked: the same token that worked is refused.
    tokens.remove("tok-a-SESSION-111");
    let (status, _) = oneshot(
        &state,
        post(MESSAGES, &[("x-api-key", "tok-a-SESSION-111")]),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert!(
        upstream.requests().is_empty(),
        "no refused request may reach the upstream"
    );
    assert_logs_clean(&logs);
}

#[tokio::test]
async fn ops_routes() {
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let (status, body) = oneshot(
        &state,
        Request::get("/healthz").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, r#"{"status":"ok"}"#)
    );
    let (status, body) = oneshot(
        &state,
        Request::get("/metrics").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains(
            "omabox_http_requests_total{route=\"/healthz\",method=\"GET\",status=\"200\"} 1"
        ),
        "{body}"
    );
    let (status, body) = oneshot(
        &state,
        Request::get("/openapi.json").body(Body::empty()).unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for path in [
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/v1/oma/inference-proxy/{sessionId}/{rest}",
        "/v1/oma/mcp-proxy/{sessionId}/{server}/{rest}",
        "/v1/sessions/{sessionId}/files",
        "/v1/files/{fileId}/content",
        "/v1/sessions/{sessionId}/runs",
        "/v1/runs/{runId}",
        "/v1/runs/{runId}/events",
        "/v1/runs/{runId}/cancel",
        "/sandboxes",
        "/v2/sandboxes",
        "/sandboxes/{sandboxID}",
        "/sandboxes/{sandboxID}/timeout",
        "/sandboxes/{sandboxID}/refreshes",
    ] {
        assert!(doc["paths"].get(path).is_some(), "openapi lacks {path}");
    }
}

#[tokio::test]
async fn socket_forwarding_plans_headers_and_passes_redirects() {
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let proxy = start_proxy(state).await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();

    // Statuses over the socket too.
    let url = format!("http://{proxy}{MESSAGES}");
    let response = client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client
        .post(&url)
        .header("authorization", "Bearer tok-a-SESSION-111")
        .header("x-api-key", "tok-b-SESSION-222")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"error":"Conflicting credentials"}"#
    );
    let response = client
        .post(&url)
        .header("x-api-key", "tok-b-SESSION-222")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);

    // A redirect comes back as-is.
    let response = client
        .get(format!(
            "http://{proxy}/v1/oma/inference-proxy/sess-a/anthropic/redirect?x=1"
        ))
        .header("authorization", "Bearer tok-a-SESSION-111")
        .header("proxy-authorization", "Basic c2VjcmV0")
        .header("api-key", "tok-a-SESSION-111")
        .header("x-goog-api-key", "tok-a-SESSION-111")
        .header("anthropic-version", "2023-06-01")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 302);
    assert_eq!(
        response.headers()["location"],
        "http://127.0.0.1:9/elsewhere"
    );
    let seen = upstream.requests();
    assert_eq!(seen.len(), 1, "the redirect was followed or retried");
    let request = &seen[0];
    assert_eq!(request.path_and_query, "/redirect?x=1");
    assert_eq!(request.headers["x-api-key"], ANTHROPIC_UPSTREAM_KEY);
    assert_eq!(request.headers["x-custom"], "yes");
    assert_eq!(request.headers["anthropic-version"], "2023-06-01");
    for absent in [
        "authorization",
        "proxy-authorization",
        "api-key",
        "x-goog-api-key",
    ] {
        assert!(
            request.headers.get(absent).is_none(),
            "{absent} was forwarded"
        );
    }
    for (_, value) in &request.headers {
        assert!(
            !value.as_bytes().windows(7).any(|w| w == b"SESSION"),
            "a session token reached the upstream"
        );
    }

    // A request body is streamed through; the openai card uses Bearer.
    let response = client
        .post(format!(
            "http://{proxy}/v1/oma/inference-proxy/sess-oai/openai/v1/echo"
        ))
        .header("x-api-key", "tok-oai-SESSION-333")
        .body("ping")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.text().await.unwrap(), "ping");
    let request = upstream.requests().pop().unwrap();
    assert_eq!(request.path_and_query, "/v1/echo");
    assert_eq!(
        request.headers["authorization"],
        format!("Bearer {OPENAI_UPSTREAM_KEY}")
    );
    assert!(request.headers.get("x-api-key").is_none());
    let text = logs.text();
    assert!(
        text.contains("forwarding inference request"),
        "TRACE logs were not captured"
    );
    assert!(
        text.contains("\"authorization\": Sensitive"),
        "headers were not logged redacted"
    );
    assert_logs_clean(&logs);
}

#[tokio::test]
async fn mcp_proxy_adds_the_vault_credential() {
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let proxy = start_proxy(state).await;
    let client = reqwest::Client::new();
    let url = format!("http://{proxy}/v1/oma/mcp-proxy/sess-a/tools");

    let response = client.post(&url).body("{}").send().await.unwrap();
    assert_eq!(response.status(), 401);
    let response = client
        .post(&url)
        .header("authorization", "Bearer tok-b-SESSION-222")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    let response = client
        .post(format!("http://{proxy}/v1/oma/mcp-proxy/sess-a/nope"))
        .header("authorization", "Bearer tok-a-SESSION-111")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 404);

    let response = client
        .post(&url)
        .header("authorization", "Bearer tok-a-SESSION-111")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["mcp-session-id"], "m1");
    assert!(response.text().await.unwrap().starts_with("event: message"));
    let request = upstream.requests().pop().unwrap();
    assert_eq!(request.path_and_query, "/mcp");
    assert_eq!(
        request.headers["authorization"],
        format!("Bearer {MCP_VAULT_SECRET}")
    );
    assert_eq!(
        request.body,
        br#"{"jsonrpc":"2.0","id":1,"method":"initialize"}"#
    );

    let rewritten = omabox_proxy::mcp::rewrite_mcp_servers(
        &common::standard_config(&upstream).mcp_servers,
        &format!("http://{proxy}"),
        "sess-a",
    )
    .unwrap();
    assert_eq!(rewritten[0].url, url);
    assert!(
        !serde_json::to_string(&rewritten)
            .unwrap()
            .contains("mcp-secret")
    );
    assert_logs_clean(&logs);
}
