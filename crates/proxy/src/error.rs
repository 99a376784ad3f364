//! The proxy's error type and the one function that maps it to an HTTP status.
//!
//! Display texts are the JSON `error` strings clients see; where the reference fixes a text
//! (`Unauthorized`, `Conflicting credentials`, `forbidden`, `inference_protocol_unsupported`)
//! it is used exactly. No variant carries a token, a key or a secret value.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProxyError {
    /// No session token (or operator key) was presented.
    #[error("Unauthorized")]
    MissingCredentials,
    /// `authorization` and `x-api-key` carry different tokens.
    #[error("Conflicting credentials")]
    ConflictingCredentials,
    /// The token is unknown, revoked, expired or bound to another session; or no upstream
    /// URL can be built.
    #[error("forbidden")]
    Forbidden,
    /// The requested wire protocol has no endpoint on the session's model card.
    #[error("inference_protocol_unsupported")]
    ProtocolUnsupported,
    /// A request the route cannot serve (the text says why).
    #[error("{0}")]
    BadRequest(String),
    /// No such resource.
    #[error("not_found")]
    NotFound,
    /// The resource is not in a state the request applies to (a finished run's cancel; the
    /// text says which state).
    #[error("{0}")]
    Conflict(String),
    /// The `Host` (or `Origin`) is neither the public origin nor a loopback name.
    #[error("host_not_allowed")]
    HostNotAllowed,
    /// A JSON route got a body that is not declared `application/json`.
    #[error("content-type must be application/json")]
    NotJson,
    /// The request body is larger than the configured cap.
    #[error("request body too large")]
    BodyTooLarge,
    /// The upstream could not be reached or failed mid-request.
    #[error("upstream_unavailable")]
    Upstream(#[source] reqwest::Error),
    /// A port (token store, vault, blob store) failed; details go to the log only.
    #[error("internal_error")]
    Internal(String),
    /// The server was given an empty operator key (an empty header would match it).
    #[error("the operator key is empty: set OMABOX_API_KEY or operator_api_key to a key")]
    EmptyOperatorKey,
}

/// The status of an error: the only place domain errors become HTTP statuses.
pub fn status_of(error: &ProxyError) -> StatusCode {
    match error {
        ProxyError::MissingCredentials | ProxyError::ConflictingCredentials => {
            StatusCode::UNAUTHORIZED
        }
        ProxyError::Forbidden => StatusCode::FORBIDDEN,
        ProxyError::ProtocolUnsupported => StatusCode::CONFLICT,
        ProxyError::BadRequest(_) => StatusCode::BAD_REQUEST,
        ProxyError::NotFound => StatusCode::NOT_FOUND,
        ProxyError::Conflict(_) => StatusCode::CONFLICT,
        ProxyError::HostNotAllowed => StatusCode::MISDIRECTED_REQUEST,
        ProxyError::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ProxyError::BodyTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ProxyError::Upstream(_) => StatusCode::BAD_GATEWAY,
        ProxyError::Internal(_) | ProxyError::EmptyOperatorKey => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<crate::sub_path::PathRefused> for ProxyError {
    fn from(error: crate::sub_path::PathRefused) -> Self {
        Self::BadRequest(error.to_string())
    }
}

impl From<omabox_contract::PortError> for ProxyError {
    fn from(error: omabox_contract::PortError) -> Self {
        Self::Internal(error.to_string())
    }
}

impl IntoResponse for ProxyError {
    fn into_response(self) -> Response {
        let status = status_of(&self);
        match &self {
            Self::Internal(detail) => tracing::error!(%detail, "request failed"),
            Self::Upstream(error) => tracing::warn!(%error, "upstream failed"),
            _ => {}
        }
        (
            status,
            Json(serde_json::json!({ "error": self.to_string() })),
        )
            .into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reference_statuses() {
        assert_eq!(status_of(&ProxyError::MissingCredentials), 401);
        assert_eq!(status_of(&ProxyError::ConflictingCredentials), 401);
        assert_eq!(status_of(&ProxyError::Forbidden), 403);
        assert_eq!(status_of(&ProxyError::ProtocolUnsupported), 409);
        assert_eq!(
            ProxyError::ProtocolUnsupported.to_string(),
            "inference_protocol_unsupported"
        );
    }
}
