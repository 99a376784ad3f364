//! The run routes as handlers (`tower::ServiceExt::oneshot`, no socket), over a fake
//! [`RunService`]: `POST /v1/runs/{id}/cancel` maps each cancel outcome to its status (200,
//! 202, 409 naming the status, 404) behind the operator key, and `GET
//! /v1/sessions/{id}/runs` validates `limit` and `cursor`, passes them through, and shows a
//! run as `GET /v1/runs/{id}` does (never its spec). The behaviour behind the port is the
//! store's (`crates/store/tests/ports.rs`) and serve's (`crates/cli/tests/serve_runs.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::*;
use omabox_contract::{CancelOutcome, RunEvent, RunPage, RunRecord, RunStatus, SecretString};
use omabox_proxy::runs::{RunService, RunServiceError, RunSpec};
use omabox_proxy::{ProxyDeps, ProxyState, router};
use std::sync::{Arc, Mutex};
use tower::ServiceExt as _;

const KEY: &str = "operator-KEY-runs";

/// Answers cancels by run id and records every list call.
#[derive(Default)]
struct FakeRuns {
    lists: Mutex<Vec<(String, Option<u64>, usize)>>,
}

fn record(run_id: &str, status: RunStatus) -> RunRecord {
    RunRecord {
        run_id: run_id.into(),
        session_id: "s1".into(),
        status,
        revision: None,
        error: None,
        attempts: 1,
    }
}

#[async_trait::async_trait]
impl RunService for FakeRuns {
    async fn submit(&self, _: &str, _: RunSpec) -> Result<String, RunServiceError> {
        Ok("run_new".into())
    }
    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, RunServiceError> {
        Ok(Some(record(run_id, RunStatus::Queued)))
    }
    async fn events(&self, _: &str, _: u64, _: usize) -> Result<Vec<RunEvent>, RunServiceError> {
        Ok(Vec::new())
    }
    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, RunServiceError> {
        Ok(match run_id {
            "run_queued" => CancelOutcome::Cancelled,
            "run_running" => CancelOutcome::Requested,
            "run_done" => CancelOutcome::AlreadyEnded(RunStatus::Completed),
            _ => CancelOutcome::NotFound,
        })
    }
    async fn list(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, RunServiceError> {
        self.lists
            .lock()
            .unwrap()
            .push((session_id.to_owned(), before, limit));
        Ok(RunPage {
            runs: vec![
                record("run_b", RunStatus::Running),
                record("run_a", RunStatus::Cancelled),
            ],
            next: Some(7),
        })
    }
}

async fn state(runs: Arc<FakeRuns>) -> ProxyState {
    let upstream = start_upstream().await;
    ProxyState::new(ProxyDeps {
        config: standard_config(&upstream),
        tokens: Arc::new(MemoryTokens::default()),
        vault: Arc::new(MemoryVault::default()),
        files: None,
        env: Default::default(),
        operator_key: SecretString::new(KEY),
        sandboxes: None,
        runs: Some(runs),
    })
    .unwrap()
}

async fn send(state: &ProxyState, method: &str, uri: &str, key: bool) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("host", "localhost:8787");
    if key {
        request = request.header("authorization", format!("Bearer {KEY}"));
    }
    let response = router(state.clone())
        .oneshot(request.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn cancel_answers_each_outcome_with_its_status() {
    let state = state(Arc::new(FakeRuns::default())).await;
    for (run_id, status, body) in [
        ("run_queued", StatusCode::OK, r#""status":"cancelled""#),
        (
            "run_running",
            StatusCode::ACCEPTED,
            r#""status":"cancelling""#,
        ),
        (
            "run_done",
            StatusCode::CONFLICT,
            "the run already ended: completed",
        ),
        ("run_unknown", StatusCode::NOT_FOUND, "not_found"),
    ] {
        let (got, text) = send(&state, "POST", &format!("/v1/runs/{run_id}/cancel"), true).await;
        assert_eq!(got, status, "{run_id}: {text}");
        assert!(text.contains(body), "{run_id}: {text}");
    }
    let (got, _) = send(&state, "POST", "/v1/runs/run_queued/cancel", false).await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_sessions_runs_are_listed_with_a_checked_limit_and_cursor() {
    let runs = Arc::new(FakeRuns::default());
    let state = state(Arc::clone(&runs)).await;
    let (got, text) = send(&state, "GET", "/v1/sessions/s1/runs", true).await;
    assert_eq!(got, StatusCode::OK, "{text}");
    let page: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(page["next_cursor"], "7", "{page}");
    assert_eq!(page["runs"][0]["run_id"], "run_b", "{page}");
    assert_eq!(page["runs"][1]["status"], "cancelled", "{page}");
    assert!(page["runs"][0].get("spec").is_none(), "{page}");
    let (got, _) = send(&state, "GET", "/v1/sessions/s1/runs?limit=5&cursor=7", true).await;
    assert_eq!(got, StatusCode::OK);
    assert_eq!(
        *runs.lists.lock().unwrap(),
        [("s1".to_owned(), None, 20), ("s1".to_owned(), Some(7), 5)]
    );
    for query in ["limit=0", "limit=101", "limit=x", "cursor=abc", "cursor=-1"] {
        let (got, text) = send(
            &state,
            "GET",
            &format!("/v1/sessions/s1/runs?{query}"),
            true,
        )
        .await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{query}: {text}");
    }
    let (got, _) = send(&state, "GET", "/v1/sessions/s1/runs", false).await;
    assert_eq!(got, StatusCode::UNAUTHORIZED);
    assert_eq!(
        runs.lists.lock().unwrap().len(),
        2,
        "a refused request reached the port"
    );
}
