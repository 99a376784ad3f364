//! `/healthz`, `/metrics` (Prometheus text) and `/openapi.json`.

use crate::state::ProxyState;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;

/// The OpenAPI 3.1 document, hand-written; a test checks it lists every route.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

pub(crate) async fn healthz() -> impl IntoResponse {
    axum::Json(serde_json::json!({ "status": "ok" }))
}

pub(crate) async fn metrics(State(state): State<ProxyState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.inner.metrics.render(),
    )
}

pub(crate) async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}
