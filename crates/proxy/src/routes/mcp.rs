//! `/v1/oma/mcp-proxy/{sessionId}/{server}/{*rest}` (all methods): the session token is
//! checked like the inference proxy's; the request is streamed to the server's URL with the
//! vault credential added here, never seen by the sandbox.

use super::authorize_session;
use crate::ProxyError;
use crate::forward::{forward, header_map};
use crate::inference::{is_forwarded_request_header, is_forwarded_response_header};
use crate::mcp::{mcp_credential_header, mcp_upstream_url};
use crate::routes::SENSITIVE_HEADERS;
use crate::state::ProxyState;
use crate::sub_path::{SubPath, raw_tail};
use axum::extract::{Path, Request, State};
use axum::response::Response;

/// The route without a sub-path (the server URL itself: streamable HTTP's one endpoint).
pub(crate) async fn proxy_root(
    State(state): State<ProxyState>,
    Path((session_id, server)): Path<(String, String)>,
    request: Request,
) -> Result<Response, ProxyError> {
    handle(state, session_id, server, request).await
}

/// The route.
pub(crate) async fn proxy(
    State(state): State<ProxyState>,
    Path((session_id, server, _rest)): Path<(String, String, String)>,
    request: Request,
) -> Result<Response, ProxyError> {
    // The sub-path is decoded from the raw URI (once), not from axum's decoded parameter.
    handle(state, session_id, server, request).await
}

/// `/v1/oma/mcp-proxy/{session}/{server}`: the route's fixed segments before the sub-path.
const ROUTE_SEGMENTS: usize = 5;

async fn handle(
    state: ProxyState,
    session_id: String,
    server_name: String,
    request: Request,
) -> Result<Response, ProxyError> {
    let (parts, body) = request.into_parts();
    authorize_session(&state, &parts.headers, &session_id).await?;
    let rest = SubPath::parse(raw_tail(parts.uri.path(), ROUTE_SEGMENTS))?;
    let server = state
        .inner
        .config
        .mcp_servers
        .iter()
        .find(|server| server.name == server_name)
        .ok_or(ProxyError::NotFound)?;
    let url =
        mcp_upstream_url(&server.url, &rest, parts.uri.query()).ok_or(ProxyError::Forbidden)?;
    let mut planned: Vec<(String, Vec<u8>)> = parts
        .headers
        .iter()
        .filter(|(name, _)| is_forwarded_request_header(name.as_str()))
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect();
    let mut sensitive: Vec<&str> = SENSITIVE_HEADERS.to_vec();
    let credential_name;
    if let Some(secret_name) = &server.vault_secret {
        let secret = state.inner.vault.get(secret_name).await?.ok_or_else(|| {
            ProxyError::Internal(format!(
                "the vault has no secret {secret_name:?} for MCP server {:?}",
                server.name
            ))
        })?;
        let (name, value) = mcp_credential_header(server.header.as_deref(), secret.expose());
        planned.retain(|(existing, _)| *existing != name);
        planned.push((name.clone(), value.into_bytes()));
        credential_name = name;
        sensitive.push(&credential_name);
    }
    tracing::debug!(session = %session_id, server = %server.name, method = %parts.method, "forwarding MCP request");
    forward(
        &state,
        parts.method,
        url,
        header_map(planned, &sensitive),
        body,
        is_forwarded_response_header,
    )
    .await
}
