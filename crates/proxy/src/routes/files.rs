//! Session file promotion: `POST /v1/sessions/{id}/files {"path"}` and
//! `GET /v1/files/{id}/content`, both behind the operator credential.

use super::authorize_operator;
use crate::ProxyError;
use crate::files::{FileError, PromotedFile};
use crate::state::ProxyState;
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

/// The request body of a promotion.
#[derive(Debug, serde::Deserialize)]
pub(crate) struct PromoteRequest {
    path: String,
}

impl From<FileError> for ProxyError {
    fn from(error: FileError) -> Self {
        match error {
            FileError::Storage(source) => Self::Internal(source.to_string()),
            other => Self::BadRequest(other.to_string()),
        }
    }
}

/// `POST /v1/sessions/{id}/files`.
pub(crate) async fn promote(
    State(state): State<ProxyState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Json<PromotedFile>), ProxyError> {
    authorize_operator(&state, &headers)?;
    let request: PromoteRequest = serde_json::from_slice(&body).map_err(|_| {
        ProxyError::BadRequest("body must be a JSON object {\"path\": string}".to_owned())
    })?;
    let files = state.inner.files.as_ref().ok_or_else(|| {
        ProxyError::BadRequest("this backend cannot read session file bytes".to_owned())
    })?;
    let file = files.promote(&session_id, &request.path).await?;
    Ok((StatusCode::CREATED, Json(file)))
}

/// `GET /v1/files/{id}/content`.
pub(crate) async fn content(
    State(state): State<ProxyState>,
    Path(file_id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ProxyError> {
    authorize_operator(&state, &headers)?;
    let files = state.inner.files.as_ref().ok_or(ProxyError::NotFound)?;
    let bytes = files.content(&file_id).await?.ok_or(ProxyError::NotFound)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}
