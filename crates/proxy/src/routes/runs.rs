//! Runs over HTTP, behind the operator key: `POST /v1/sessions/{id}/runs` queues a run,
//! `GET /v1/sessions/{id}/runs` lists the session's runs newest first (`?limit=N` up to
//! 100, default 20; `?cursor=` the previous page's `next_cursor`), `GET /v1/runs/{id}` says
//! where one is, `POST /v1/runs/{id}/cancel` cancels it (200: a queued run is `cancelled`;
//! 202: a running one is being cancelled by its host; 409: it had ended), `GET
//! /v1/runs/{id}/events` streams its stored timeline as server-sent events — every stored
//! event (after `Last-Event-ID`), then the new ones as they are stored, until the run ended
//! and its last event was sent. A run's view never has its spec (its credentials' names);
//! its error was redacted by the host that ran it.

use super::{authorize_operator, header_str, read_capped, require_json};
use crate::ProxyError;
use crate::runs::{RunServiceError, RunSpec};
use crate::state::ProxyState;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures::Stream;
use omabox_contract::{CancelOutcome, MAX_RUN_PAGE, RunRecord};
use std::convert::Infallible;
use std::time::Duration;

/// How often a followed run's new events are looked for.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);
/// Events read from the queue at once.
const EVENT_PAGE: usize = 100;
/// Runs of a list page when the request names no `limit`.
const DEFAULT_RUN_PAGE: usize = 20;

impl From<RunServiceError> for ProxyError {
    fn from(error: RunServiceError) -> Self {
        match error {
            RunServiceError::BadRequest(text) => Self::BadRequest(text),
            RunServiceError::Internal(text) => Self::Internal(text),
        }
    }
}

fn service(state: &ProxyState) -> Result<&dyn crate::runs::RunService, ProxyError> {
    state
        .inner
        .runs
        .as_deref()
        .ok_or_else(|| ProxyError::BadRequest("this server runs no work items".to_owned()))
}

/// `POST /v1/sessions/{id}/runs`.
pub(crate) async fn submit(
    State(state): State<ProxyState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<(StatusCode, Json<serde_json::Value>), ProxyError> {
    authorize_operator(&state, &headers)?;
    let runs = service(&state)?;
    require_json(&headers)?;
    let body = read_capped(&headers, body, state.inner.config.limits.max_body_bytes).await?;
    let spec = RunSpec::parse(&body).map_err(|error| ProxyError::BadRequest(error.0))?;
    let run_id = runs.submit(&session_id, spec).await?;
    Ok((
        StatusCode::CREATED,
        Json(serde_json::json!({ "run_id": run_id })),
    ))
}

/// A run as its JSON answer.
fn view(record: &RunRecord) -> serde_json::Value {
    serde_json::json!({
        "run_id": record.run_id,
        "session_id": record.session_id,
        "status": record.status.as_str(),
        "revision": record.revision,
        "error": record.error,
        "attempts": record.attempts,
    })
}

/// `GET /v1/runs/{id}`.
pub(crate) async fn status(
    State(state): State<ProxyState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, ProxyError> {
    authorize_operator(&state, &headers)?;
    let record = service(&state)?
        .status(&run_id)
        .await?
        .ok_or(ProxyError::NotFound)?;
    Ok(Json(view(&record)))
}

/// `GET /v1/sessions/{id}/runs[?limit=N][&cursor=C]`.
pub(crate) async fn list(
    State(state): State<ProxyState>,
    Path(session_id): Path<String>,
    headers: HeaderMap,
    uri: Uri,
) -> Result<Json<serde_json::Value>, ProxyError> {
    authorize_operator(&state, &headers)?;
    let runs = service(&state)?;
    let (mut limit, mut before) = (DEFAULT_RUN_PAGE, None);
    for pair in uri.query().unwrap_or_default().split('&') {
        match pair.split_once('=') {
            Some(("limit", value)) => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|limit| (1..=MAX_RUN_PAGE).contains(limit))
                    .ok_or_else(|| {
                        ProxyError::BadRequest(format!(
                            "`limit` must be a number from 1 to {MAX_RUN_PAGE}"
                        ))
                    })?;
            }
            Some(("cursor", value)) => {
                before = Some(value.parse::<u64>().map_err(|_| {
                    ProxyError::BadRequest(
                        "`cursor` must be a `next_cursor` of an earlier page".to_owned(),
                    )
                })?);
            }
            _ => {}
        }
    }
    let page = runs.list(&session_id, before, limit).await?;
    Ok(Json(serde_json::json!({
        "runs": page.runs.iter().map(view).collect::<Vec<_>>(),
        "next_cursor": page.next.map(|next| next.to_string()),
    })))
}

/// `POST /v1/runs/{id}/cancel`.
pub(crate) async fn cancel(
    State(state): State<ProxyState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<serde_json::Value>), ProxyError> {
    authorize_operator(&state, &headers)?;
    let (code, status) = match service(&state)?.cancel(&run_id).await? {
        CancelOutcome::Cancelled => (StatusCode::OK, "cancelled"),
        CancelOutcome::Requested => (StatusCode::ACCEPTED, "cancelling"),
        CancelOutcome::AlreadyEnded(status) => {
            return Err(ProxyError::Conflict(format!(
                "the run already ended: {}",
                status.as_str()
            )));
        }
        CancelOutcome::NotFound => return Err(ProxyError::NotFound),
    };
    Ok((
        code,
        Json(serde_json::json!({ "run_id": run_id, "status": status })),
    ))
}

/// `GET /v1/runs/{id}/events`.
pub(crate) async fn events(
    State(state): State<ProxyState>,
    Path(run_id): Path<String>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ProxyError> {
    authorize_operator(&state, &headers)?;
    service(&state)?
        .status(&run_id)
        .await?
        .ok_or(ProxyError::NotFound)?;
    let after = header_str(&headers, "last-event-id")
        .and_then(|id| id.trim().parse::<u64>().ok())
        .unwrap_or(0);
    Ok(Sse::new(follow(state, run_id, after)).keep_alive(KeepAlive::default()))
}

/// Where a followed stream is.
struct Follow {
    state: ProxyState,
    run_id: String,
    after: u64,
    pending: std::collections::VecDeque<Event>,
    /// The run had ended when the last page was read: once it is sent, the stream ends.
    last_page: bool,
}

fn follow(
    state: ProxyState,
    run_id: String,
    after: u64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let start = Follow {
        state,
        run_id,
        after,
        pending: Default::default(),
        last_page: false,
    };
    futures::stream::unfold(start, |mut follow| async move {
        loop {
            if let Some(event) = follow.pending.pop_front() {
                return Some((Ok(event), follow));
            }
            if follow.last_page {
                return None;
            }
            let Ok(runs) = service(&follow.state) else {
                return None;
            };
            // Read the status first: events stored before it ended are all in the page.
            let ended = match runs.status(&follow.run_id).await {
                Ok(Some(record)) => record.status.is_ended().then(|| view(&record)),
                _ => return None,
            };
            let page = match runs.events(&follow.run_id, follow.after, EVENT_PAGE).await {
                Ok(page) => page,
                Err(error) => {
                    tracing::warn!(%error, "cannot read a run's events");
                    return None;
                }
            };
            let full = page.len() == EVENT_PAGE;
            for event in page {
                follow.after = event.seq;
                follow
                    .pending
                    .push_back(Event::default().id(event.seq.to_string()).data(event.text));
            }
            if let Some(end) = ended.filter(|_| !full) {
                follow
                    .pending
                    .push_back(Event::default().event("end").data(end.to_string()));
                follow.last_page = true;
            }
            if follow.pending.is_empty() {
                tokio::time::sleep(FOLLOW_EVERY).await;
            }
        }
    })
}
