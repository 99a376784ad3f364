//! The router: every route, and the layers around them (sensitive headers, tracing,
//! metrics). Handlers translate HTTP to domain calls and back; nothing else knows HTTP.

pub(crate) mod connect;
pub(crate) mod e2b;
pub(crate) mod e2b_lifecycle;
pub(crate) mod e2b_logs;
pub(crate) mod e2b_snapshots;
pub(crate) mod e2b_templates;
pub(crate) mod envd;
pub(crate) mod envd_fs;
pub(crate) mod files;
pub(crate) mod inference;
pub(crate) mod mcp;
pub(crate) mod ops;
pub(crate) mod runs;

use crate::ProxyError;
use crate::inference::TokenExtraction;
use crate::inference::extract_hosted_inference_proxy_token;
use crate::state::ProxyState;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::HeaderMap;
use axum::http::header::HeaderName;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse as _, Response};
use axum::routing::{any, get, patch, post, put};
use omabox_contract::SessionTokenClaims;
use std::time::Instant;
use tower_http::sensitive_headers::SetSensitiveHeadersLayer;
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};
use tracing::Level;

/// Headers whose values no trace ever shows.
pub const SENSITIVE_HEADERS: [&str; 7] = [
    "authorization",
    "x-access-token",
    "x-api-key",
    "x-goog-api-key",
    "proxy-authorization",
    "api-key",
    "x-omabox-upload-token",
];

/// The whole HTTP API.
pub fn router(state: ProxyState) -> Router {
    // One list: a header added to it is hidden from every trace and forwarded nowhere.
    let sensitive: Vec<HeaderName> = SENSITIVE_HEADERS
        .iter()
        .map(|name| HeaderName::from_static(name))
        .collect();
    Router::new()
        .route("/healthz", get(ops::healthz))
        .route("/metrics", get(ops::metrics))
        .route("/openapi.json", get(ops::openapi))
        .route(
            "/v1/oma/inference-proxy/{session_id}",
            any(inference::proxy_root),
        )
        .route(
            "/v1/oma/inference-proxy/{session_id}/{*rest}",
            any(inference::proxy),
        )
        .route(
            "/v1/oma/mcp-proxy/{session_id}/{server}",
            any(mcp::proxy_root),
        )
        .route(
            "/v1/oma/mcp-proxy/{session_id}/{server}/{*rest}",
            any(mcp::proxy),
        )
        .route("/v1/sessions/{session_id}/files", post(files::promote))
        .route("/v1/files/{file_id}/content", get(files::content))
        .route(
            "/v1/sessions/{session_id}/runs",
            post(runs::submit).get(runs::list),
        )
        .route("/v1/runs/{run_id}", get(runs::status))
        .route("/v1/runs/{run_id}/cancel", post(runs::cancel))
        .route("/v1/runs/{run_id}/events", get(runs::events))
        .route("/sandboxes", get(e2b::list_v1).post(e2b::create))
        .route("/v2/sandboxes", get(e2b::list_v2).post(e2b::create))
        .route("/process.Process/{method}", post(envd::process))
        .route("/filesystem.Filesystem/{method}", post(envd_fs::filesystem))
        .route("/health", get(envd_fs::health))
        .route(
            "/files",
            get(envd_fs::download)
                .post(envd_fs::upload)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/sandboxes/{sandbox_id}", get(e2b::get).delete(e2b::kill))
        .route("/sandboxes/{sandbox_id}/timeout", post(e2b::set_timeout))
        .route("/sandboxes/{sandbox_id}/refreshes", post(e2b::refresh))
        .route("/sandboxes/{sandbox_id}/connect", post(e2b::connect))
        .route("/v2/sandboxes/{sandbox_id}/connect", post(e2b::connect))
        .route("/sandboxes/metrics", get(e2b_lifecycle::metrics_of_many))
        .route(
            "/sandboxes/{sandbox_id}/metrics",
            get(e2b_lifecycle::metrics),
        )
        .route(
            "/sandboxes/{sandbox_id}/network",
            put(e2b_lifecycle::update_network),
        )
        .route("/sandboxes/{sandbox_id}/pause", post(e2b_lifecycle::pause))
        .route(
            "/sandboxes/{sandbox_id}/snapshots",
            post(e2b_snapshots::create),
        )
        .route("/sandboxes/{sandbox_id}/fork", post(e2b_snapshots::fork))
        .route("/snapshots", get(e2b_snapshots::list))
        .route("/templates", get(e2b_templates::list))
        .route("/v2/templates", get(e2b_templates::list))
        .route(
            "/templates/{template_id}",
            get(e2b_templates::get)
                .delete(e2b_templates::delete)
                .patch(e2b_templates::update_v1),
        )
        .route(
            "/v2/templates/{template_id}",
            patch(e2b_templates::update_v2),
        )
        .route(
            "/templates/tags",
            post(e2b_templates::assign_tags).delete(e2b_templates::remove_tags),
        )
        .route("/templates/{template_id}/tags", get(e2b_templates::tags))
        .route("/v3/templates", post(e2b_templates::request_build))
        .route("/templates/aliases/{alias}", get(e2b_templates::alias))
        .route(
            "/templates/{template_id}/files/{hash}",
            get(e2b_templates::file_slot)
                .put(e2b_templates::upload)
                .layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/v2/templates/{template_id}/builds/{build_id}",
            post(e2b_templates::start_build),
        )
        .route(
            "/templates/{template_id}/builds/{build_id}/status",
            get(e2b_templates::build_status),
        )
        .route(
            "/templates/{template_id}/builds/{build_id}/logs",
            get(e2b_templates::build_logs),
        )
        .route("/sandboxes/{sandbox_id}/logs", get(e2b_logs::logs_v1))
        .route("/v2/sandboxes/{sandbox_id}/logs", get(e2b_logs::logs_v2))
        .route(
            "/sandboxes/{sandbox_id}/resume",
            post(e2b_lifecycle::resume),
        )
        .route_layer(middleware::from_fn_with_state(
            state.clone(),
            record_metrics,
        ))
        .layer(DefaultBodyLimit::max(
            state.inner.config.limits.max_body_bytes,
        ))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(
                    DefaultMakeSpan::new()
                        .level(Level::DEBUG)
                        .include_headers(true),
                )
                .on_response(DefaultOnResponse::new().level(Level::DEBUG)),
        )
        .layer(middleware::from_fn_with_state(state.clone(), check_host))
        .layer(SetSensitiveHeadersLayer::new(sensitive))
        .with_state(state)
}

/// The Host rule ([`crate::host_rule`]) before any route: a missing or foreign `Host`, or a
/// foreign `Origin`, is refused. No CORS header is ever sent, so a browser page of another
/// origin can neither read a response nor send a JSON request.
async fn check_host(State(state): State<ProxyState>, request: Request, next: Next) -> Response {
    let rule = &state.inner.host_rule;
    let headers = request.headers();
    // Exactly one Host header; an absolute-form target's authority must pass as well.
    let mut hosts = headers.get_all(axum::http::header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().ok(),
        _ => None,
    };
    let host_ok = host.is_some_and(|host| rule.allows_host(host))
        && request
            .uri()
            .authority()
            .is_none_or(|authority| rule.allows_host(authority.as_str()));
    let origin_ok = headers.get("origin").is_none_or(|origin| {
        origin
            .to_str()
            .is_ok_and(|origin| rule.allows_origin(origin))
    });
    if host_ok && origin_ok {
        next.run(request).await
    } else {
        ProxyError::HostNotAllowed.into_response()
    }
}

/// Reads a buffered (JSON) body of at most `limit` bytes. Called only after the request is
/// authorized, so an anonymous client never makes the server buffer anything; a declared
/// length over the cap is refused before a byte is read.
pub(crate) async fn read_capped(
    headers: &HeaderMap,
    body: axum::body::Body,
    limit: usize,
) -> Result<axum::body::Bytes, ProxyError> {
    let declared = header_str(headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ProxyError::BodyTooLarge);
    }
    axum::body::to_bytes(body, limit)
        .await
        .map_err(|_| ProxyError::BodyTooLarge)
}

/// The JSON rule of the operator's JSON routes: the body is declared `application/json`.
pub(crate) fn require_json(headers: &HeaderMap) -> Result<(), ProxyError> {
    let is_json = header_str(headers, "content-type").is_some_and(|value| {
        value
            .split(';')
            .next()
            .is_some_and(|media| media.trim().eq_ignore_ascii_case("application/json"))
    });
    if is_json {
        Ok(())
    } else {
        Err(ProxyError::NotJson)
    }
}

async fn record_metrics(State(state): State<ProxyState>, request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |path| path.as_str().to_owned());
    let method = request.method().as_str().to_owned();
    let start = Instant::now();
    state.inner.metrics.started();
    let response = next.run(request).await;
    state.inner.metrics.finished(
        &route,
        &method,
        response.status().as_u16(),
        start.elapsed().as_secs_f64(),
    );
    response
}

pub(crate) fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|value| value.to_str().ok())
}

/// The session token rules of reference §5.3/§5.5: missing → 401 `Unauthorized`, mismatch →
/// 401 `Conflicting credentials`, unknown/revoked/expired or another session's → 403.
pub(crate) async fn authorize_session(
    state: &ProxyState,
    headers: &HeaderMap,
    session_id: &str,
) -> Result<SessionTokenClaims, ProxyError> {
    let token = match extract_hosted_inference_proxy_token(
        header_str(headers, "authorization"),
        header_str(headers, "x-api-key"),
    ) {
        TokenExtraction::Missing => return Err(ProxyError::MissingCredentials),
        TokenExtraction::Mismatch => return Err(ProxyError::ConflictingCredentials),
        TokenExtraction::Ok { token, .. } => token,
    };
    let claims = state
        .inner
        .tokens
        .verify(&token)
        .await?
        .ok_or(ProxyError::Forbidden)?;
    if claims.scope.session_id != session_id {
        return Err(ProxyError::Forbidden);
    }
    Ok(claims)
}

/// The operator rule: a bearer (or `x-api-key`) equal to the operator key (always required).
pub(crate) fn authorize_operator(
    state: &ProxyState,
    headers: &HeaderMap,
) -> Result<(), ProxyError> {
    let presented = match extract_hosted_inference_proxy_token(
        header_str(headers, "authorization"),
        header_str(headers, "x-api-key"),
    ) {
        TokenExtraction::Mismatch => return Err(ProxyError::ConflictingCredentials),
        TokenExtraction::Missing => None,
        TokenExtraction::Ok { token, .. } => Some(token),
    };
    if state.operator_allows(presented.as_deref()) {
        Ok(())
    } else if presented.is_none() {
        Err(ProxyError::MissingCredentials)
    } else {
        Err(ProxyError::Forbidden)
    }
}
