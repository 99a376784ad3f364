//! E2B's snapshots (`spec/openapi.yml` of e2b-dev/E2B): `POST /sandboxes/{id}/snapshots`
//! takes one, `GET /snapshots` lists them, `DELETE /templates/{id}` removes one
//! (`e2b_templates.rs`: a snapshot is a template to E2B, `Sandbox.create(snapshot_id)`
//! starts from it), and
//! `POST /sandboxes/{id}/fork` starts sandboxes from a running one's memory where the service
//! keeps memory (`omabox serve --backend gvisor`) and is refused elsewhere with the way that
//! works. Same key check, body cap and error shape as `e2b.rs`.
//!
//! Under `serve --backend gvisor` a snapshot keeps the sandbox's processes and memory
//! unless the request says `"memory": false`. Elsewhere only the filesystem is kept (E2B's
//! `mode="filesystem"`, `"memory": false`), and a request that leaves `memory` out gets that
//! too: the SDK leaves the choice to the server when its caller names no mode.
//!
//! Must never: accept a memory snapshot from a service that cannot take one (a 400 that
//! says what to ask for instead); take a
//! name it would have to quote, escape or turn into a path (letters, digits, `.`, `_`, `-`).

use super::e2b::{
    Answer, E2bError, authorize, not_found_short, sandbox_body, sandbox_call, seconds, shorten,
};
#[cfg(test)]
use crate::e2b::SNAPSHOT_TAG;
use crate::e2b::SnapshotInfo;
use crate::state::ProxyState;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

/// Bytes of a snapshot name at most.
const MAX_NAME_BYTES: usize = 128;
/// Page size of `GET /snapshots` when `limit` is not given, and its largest value.
const PAGE_LIMIT: usize = 100;
/// Forks one request may ask for (E2B's bound).
const MAX_FORKS: i64 = 20;

/// `SandboxForkRequest` as sent.
#[derive(Debug, Deserialize)]
struct ForkBody {
    timeout: Option<i64>,
    count: Option<i64>,
}

/// `SandboxSnapshotRequest` as sent.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SnapshotBody {
    name: Option<String>,
    memory: Option<bool>,
}

/// `SnapshotInfo` as answered.
fn snapshot_body(info: &SnapshotInfo) -> Value {
    json!({ "snapshotID": info.snapshot_id, "names": info.names })
}

/// `POST /sandboxes/{id}/snapshots` `{"name"?, "memory"?}` → 201 `SnapshotInfo`: the
/// running sandbox's files kept under a new snapshot (the sandbox goes on running); where
/// the service keeps memory (gvisor) its processes and memory too, unless `"memory": false`.
pub(crate) async fn create(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<SnapshotBody>(&state, &headers, id, body).await?;
    let (name, memory) = body.map_or((None, None), |b| (b.name, b.memory));
    let keep_memory = service.pauses_memory() && memory != Some(false);
    if memory == Some(true) && !keep_memory {
        return Err(E2bError::bad_request(
            "memory snapshots are not offered by this server: ask for a filesystem snapshot (\"memory\": false, the SDK's mode=\"filesystem\"); sandboxes created from it start fresh with its files",
        ));
    }
    let name = name.map(checked_name).transpose()?;
    let info = service
        .create_snapshot(&id, name, keep_memory)
        .await
        .map_err(|e| not_found_short(e, &id))?;
    Ok((StatusCode::CREATED, Json(snapshot_body(&info))).into_response())
}

/// A snapshot name as given, when it is one this server takes (a tag, `NAME:TAG`, is
/// refused: each name keeps one snapshot).
fn checked_name(name: String) -> Result<String, E2bError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if name.is_empty()
        || name.len() > MAX_NAME_BYTES
        || !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.chars().all(allowed)
    {
        return Err(E2bError::bad_request(format!(
            "name {:?}: a snapshot name is 1 to {MAX_NAME_BYTES} letters, digits, '.', '_' or '-', starting with a letter or digit (no tag)",
            shorten(&name)
        )));
    }
    Ok(name)
}

/// What `GET /snapshots` selects.
#[derive(Debug, Default)]
struct SnapshotQuery {
    sandbox_id: Option<String>,
    name: Option<String>,
    limit: usize,
    next_token: Option<String>,
}

impl SnapshotQuery {
    fn parse(query: &str) -> Result<Self, E2bError> {
        let mut parsed = Self {
            limit: PAGE_LIMIT,
            ..Self::default()
        };
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "sandboxID" => parsed.sandbox_id = Some(value.into_owned()),
                "name" => parsed.name = Some(value.into_owned()),
                "nextToken" => parsed.next_token = Some(value.into_owned()),
                "limit" => {
                    parsed.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|limit| (1..=PAGE_LIMIT).contains(limit))
                        .ok_or_else(|| {
                            E2bError::bad_request(format!(
                                "limit must be a whole number from 1 to {PAGE_LIMIT}"
                            ))
                        })?;
                }
                _ => {}
            }
        }
        Ok(parsed)
    }

    fn selects(&self, info: &SnapshotInfo) -> bool {
        let by_sandbox = self
            .sandbox_id
            .as_ref()
            .is_none_or(|id| *id == info.sandbox_id);
        let by_name = self.name.as_ref().is_none_or(|name| info.is_named(name));
        by_sandbox && by_name
    }
}

/// `GET /snapshots?sandboxID&name&limit&nextToken` → 200 `[SnapshotInfo]`, newest first,
/// paged (`X-Next-Token`: the last id of the page).
pub(crate) async fn list(State(state): State<ProxyState>, headers: HeaderMap, uri: Uri) -> Answer {
    let service = authorize(&state, &headers)?;
    let query = SnapshotQuery::parse(uri.query().unwrap_or_default())?;
    let selected: Vec<SnapshotInfo> = service
        .snapshots()
        .into_iter()
        .filter(|info| query.selects(info))
        .collect();
    let start = match &query.next_token {
        Some(token) => selected
            .iter()
            .position(|info| info.snapshot_id == *token)
            .map_or(selected.len(), |at| at + 1),
        None => 0,
    };
    let page: Vec<&SnapshotInfo> = selected.iter().skip(start).take(query.limit).collect();
    let mut response = Json(
        page.iter()
            .map(|info| snapshot_body(info))
            .collect::<Vec<_>>(),
    )
    .into_response();
    if start + page.len() < selected.len()
        && let Some(last) = page.last()
        && let Ok(value) = HeaderValue::from_str(&last.snapshot_id)
    {
        response.headers_mut().insert("x-next-token", value);
    }
    Ok(response)
}

/// `POST /sandboxes/{id}/fork` `{"timeout"?, "count"?}` → 201 `[SandboxForkResult]`: one
/// entry per fork, `{"sandbox": Sandbox}` or `{"error": Error}`; `count` 1–20 (default 1),
/// `timeout` the forks' (default 15 s). Where the service cannot capture memory: 400, the
/// answer saying how to start sandboxes from its files instead.
pub(crate) async fn fork(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<ForkBody>(&state, &headers, id, body).await?;
    if service.get(&id).is_none() {
        return Err(not_found_short(
            crate::e2b::SandboxServiceError::NotFound(id.clone()),
            &id,
        ));
    }
    if service.pauses_memory() {
        let (timeout, count) = body.map_or((None, None), |b| (b.timeout, b.count));
        let count = match count.unwrap_or(1) {
            n @ 1..=MAX_FORKS => n as usize,
            n => {
                return Err(E2bError::bad_request(format!(
                    "count must be 1 to {MAX_FORKS}, not {n}"
                )));
            }
        };
        let timeout = match timeout {
            Some(secs) => seconds("timeout", secs, crate::e2b::MAX_TIMEOUT)?,
            None => crate::e2b::DEFAULT_TIMEOUT,
        };
        let forks = service
            .fork(&id, count, timeout)
            .await
            .map_err(|e| not_found_short(e, &id))?;
        let results: Vec<Value> = forks
            .into_iter()
            .map(|fork| match fork {
                Ok(created) => {
                    json!({ "sandbox": sandbox_body(&created.info, &created.access_token) })
                }
                Err(error) => json!({ "error": E2bError::from(error).body() }),
            })
            .collect();
        return Ok((StatusCode::CREATED, Json(Value::Array(results))).into_response());
    }
    Err(E2bError::bad_request(
        "fork is not offered by this server: it needs a memory snapshot; take a filesystem snapshot (create_snapshot(mode=\"filesystem\")) and create sandboxes from its snapshot_id",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn info(id: &str, name: Option<&str>) -> SnapshotInfo {
        let snapshot_id = format!("{}:{SNAPSHOT_TAG}", name.unwrap_or(id));
        SnapshotInfo {
            names: vec![snapshot_id.clone()],
            snapshot_id,
            sandbox_id: "sbx".into(),
            created_at: SystemTime::UNIX_EPOCH,
        }
    }

    #[test]
    fn a_snapshot_is_found_by_its_id_or_name_with_or_without_the_tag() {
        let named = info("raw", Some("my-snap"));
        assert!(named.is_named("my-snap"));
        assert!(named.is_named("my-snap:default"));
        assert!(!named.is_named("my-snap:v2"));
        assert!(!named.is_named("my"));
        let unnamed = info("abc123", None);
        assert!(unnamed.is_named("abc123:default"));
        assert!(unnamed.is_named("abc123"));
    }

    #[test]
    fn names_a_path_or_shell_would_read_are_refused() {
        for bad in [
            "",
            "../x",
            "a/b",
            "a:v1",
            "-x",
            "a b",
            "é",
            &"a".repeat(129),
        ] {
            assert!(checked_name(bad.to_owned()).is_err(), "{bad:?}");
        }
        for good in ["a", "my-snap", "v1.2_x", &"a".repeat(128)] {
            assert_eq!(checked_name(good.to_owned()).unwrap(), good);
        }
    }
}
