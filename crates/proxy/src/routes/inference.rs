//! `/v1/oma/inference-proxy/{sessionId}/{*rest}` (all methods), reference §5.5: the session
//! token is checked, the session's model card resolved, the request planned by
//! [`crate::inference`] and streamed upstream with the upstream credential.

use super::authorize_session;
use crate::ProxyError;
use crate::forward::{forward, header_map};
use crate::inference::{
    UpstreamTarget, is_forwarded_response_header, plan_upstream_headers, plan_upstream_target,
};
use crate::routes::SENSITIVE_HEADERS;
use crate::state::ProxyState;
use crate::sub_path::{SubPath, raw_tail};
use axum::extract::{Path, Request, State};
use axum::response::Response;

/// The route without a sub-path (it resolves like an empty sub-path: no URL, 403).
pub(crate) async fn proxy_root(
    State(state): State<ProxyState>,
    Path(session_id): Path<String>,
    request: Request,
) -> Result<Response, ProxyError> {
    handle(state, session_id, request).await
}

/// The route.
pub(crate) async fn proxy(
    State(state): State<ProxyState>,
    Path((session_id, _rest)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ProxyError> {
    // The sub-path is decoded from the raw URI (once), not from axum's decoded parameter.
    handle(state, session_id, request).await
}

/// `/v1/oma/inference-proxy/{session}`: the route's fixed segments before the sub-path.
const ROUTE_SEGMENTS: usize = 4;

async fn handle(
    state: ProxyState,
    session_id: String,
    request: Request,
) -> Result<Response, ProxyError> {
    let (parts, body) = request.into_parts();
    authorize_session(&state, &parts.headers, &session_id).await?;
    let sub_path = SubPath::parse(raw_tail(parts.uri.path(), ROUTE_SEGMENTS))?;
    let upstream = state
        .resolve_upstream(&session_id)
        .await?
        .ok_or(ProxyError::Forbidden)?;
    let url = match plan_upstream_target(&upstream, &sub_path, parts.uri.query()) {
        UpstreamTarget::Url(url) => url,
        UpstreamTarget::NoUrl => return Err(ProxyError::Forbidden),
        UpstreamTarget::ProtocolUnsupported => return Err(ProxyError::ProtocolUnsupported),
    };
    let planned = plan_upstream_headers(
        parts
            .headers
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_bytes())),
        &upstream,
    );
    tracing::debug!(session = %session_id, method = %parts.method, "forwarding inference request");
    forward(
        &state,
        parts.method,
        url,
        header_map(planned, &SENSITIVE_HEADERS),
        body,
        is_forwarded_response_header,
    )
    .await
}
