//! Session file promotion: `POST /v1/sessions/{id}/files {"path"}` (JSON only) and
//! `GET /v1/files/{id}/content` (streamed, with the media type stored at promotion), both
//! behind the operator key.

use super::{authorize_operator, read_capped, require_json};
use crate::ProxyError;
use crate::files::{FileError, PromotedFile};
use crate::state::ProxyState;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tokio_util::io::ReaderStream;

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
    body: Body,
) -> Result<(StatusCode, Json<PromotedFile>), ProxyError> {
    authorize_operator(&state, &headers)?;
    require_json(&headers)?;
    let body = read_capped(&headers, body, state.inner.config.limits.max_body_bytes).await?;
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
    let content = files.content(&file_id).await?.ok_or(ProxyError::NotFound)?;
    let media_type = HeaderValue::from_str(&content.file.media_type)
        .unwrap_or(HeaderValue::from_static("application/octet-stream"));
    let stream = ReaderStream::with_capacity(tokio::fs::File::from_std(content.bytes), 64 * 1024);
    let headers = [
        (header::CONTENT_TYPE, media_type),
        (header::CONTENT_LENGTH, HeaderValue::from(content.file.size)),
        // A sandbox's file must not run as a page of this origin.
        (
            header::CONTENT_DISPOSITION,
            HeaderValue::from_static("attachment"),
        ),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static("sandbox"),
        ),
    ];
    Ok((headers, Body::from_stream(stream)).into_response())
}
