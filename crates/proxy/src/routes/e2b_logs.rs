//! E2B's sandbox logs (`spec/openapi.yml` of e2b-dev/E2B): `GET /sandboxes/{id}/logs`
//! (`start`, `limit`: `{"logs": [SandboxLog], "logEntries": [SandboxLogEntry]}`) and
//! `GET /v2/sandboxes/{id}/logs` (`cursor`, `limit`, `direction`, `level`, `search`:
//! `{"logs": [SandboxLogEntry]}`), over [`SandboxService::logs`]. The log is what serve saw
//! happen to the sandbox (created, processes started and ended, paused, resumed, killed,
//! timed out), not the sandbox's own output. Same key check and error shape as `e2b.rs`.
//! A template build's log (`GET /templates/{id}/builds/{build}/logs`, in
//! `e2b_templates.rs`) is selected by the same query.
//!
//! Must never: answer more than [`MAX_LIMIT`] entries at once; echo more than a short
//! piece of a bad query value.

use super::e2b::{Answer, E2bError, authorize, not_found_short, sandbox_id, shorten};
use crate::e2b::{LogLevel, SandboxLogEntry, rfc3339};
use crate::state::ProxyState;
use crate::templates::BuildLogEntry;
use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Uri};
use axum::response::IntoResponse;
use serde_json::{Value, json};
use std::time::{Duration, SystemTime};

/// Entries answered when `limit` is not given (E2B's default).
const DEFAULT_LIMIT: usize = 1000;
/// The largest `limit`.
pub const MAX_LIMIT: usize = 10_000;
/// Bytes of a `search` text.
const MAX_SEARCH: usize = 256;

/// Which of E2B's log routes a query is for: each knows its own parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogRoute {
    /// `GET /sandboxes/{id}/logs`: `start`, `limit`.
    SandboxV1,
    /// `GET /v2/sandboxes/{id}/logs`: `cursor`, `limit`, `direction`, `level`, `search`.
    SandboxV2,
    /// `GET /templates/{id}/builds/{build}/logs`: `cursor`, `limit` (at most
    /// [`MAX_BUILD_LIMIT`], 100 by default), `direction`, `level`, `source`.
    Build,
}

/// The largest `limit` of a build's log (E2B's).
pub(crate) const MAX_BUILD_LIMIT: usize = 100;

/// What a log query selects on: a sandbox's entries and a build's.
pub(crate) trait LogLine {
    fn timestamp(&self) -> SystemTime;
    fn level(&self) -> LogLevel;
    fn message(&self) -> &str;
}

/// Both entry types have the three fields by these names.
macro_rules! log_line {
    ($($entry:ty),+) => {$(
        impl LogLine for $entry {
            fn timestamp(&self) -> SystemTime {
                self.timestamp
            }
            fn level(&self) -> LogLevel {
                self.level
            }
            fn message(&self) -> &str {
                &self.message
            }
        }
    )+};
}
log_line!(SandboxLogEntry, BuildLogEntry);

/// Which entries a query selects, in which order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LogQuery {
    /// v1 `start` / v2 `cursor`, ms since the epoch.
    cursor: Option<u64>,
    limit: usize,
    /// Newest first, from `cursor` (or now) back.
    backward: bool,
    /// The least level shown.
    level: LogLevel,
    /// Text every message shown contains.
    search: Option<String>,
}

impl LogQuery {
    /// Parses `query`, the parameters `route` has (others are ignored, as E2B does).
    pub(crate) fn parse(query: &str, route: LogRoute) -> Result<Self, E2bError> {
        let (default_limit, max_limit) = match route {
            LogRoute::Build => (MAX_BUILD_LIMIT, MAX_BUILD_LIMIT),
            LogRoute::SandboxV1 | LogRoute::SandboxV2 => (DEFAULT_LIMIT, MAX_LIMIT),
        };
        let v2 = route != LogRoute::SandboxV1;
        let mut parsed = Self {
            cursor: None,
            limit: default_limit,
            backward: false,
            level: LogLevel::Debug,
            search: None,
        };
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match (key.as_ref(), v2) {
                ("start", false) | ("cursor", true) => {
                    parsed.cursor = Some(number_param(&key, &value)?)
                }
                ("limit", _) => {
                    let limit = number_param("limit", &value)?;
                    parsed.limit = usize::try_from(limit).unwrap_or(usize::MAX);
                    if parsed.limit > max_limit {
                        return Err(E2bError::bad_request(format!(
                            "limit must be at most {max_limit}"
                        )));
                    }
                }
                ("direction", true) => {
                    parsed.backward = match value.as_ref() {
                        "forward" => false,
                        "backward" => true,
                        other => {
                            return Err(E2bError::bad_request(format!(
                                "direction must be forward or backward, not {:?}",
                                shorten(other)
                            )));
                        }
                    };
                }
                ("level", true) => parsed.level = level_param(&value)?,
                // A build's log is kept whole while serve runs: both sources are that log.
                ("source", true)
                    if route == LogRoute::Build
                        && !matches!(value.as_ref(), "persistent" | "temporary") =>
                {
                    return Err(E2bError::bad_request(format!(
                        "source must be persistent or temporary, not {:?}",
                        shorten(&value)
                    )));
                }
                ("search", true) if route == LogRoute::SandboxV2 => {
                    if value.len() > MAX_SEARCH {
                        return Err(E2bError::bad_request(format!(
                            "search must be at most {MAX_SEARCH} bytes"
                        )));
                    }
                    parsed.search = Some(value.into_owned()).filter(|s| !s.is_empty());
                }
                _ => {}
            }
        }
        Ok(parsed)
    }

    /// The entries selected, in the order answered: forward = oldest first from `cursor`
    /// on; backward = newest first from `cursor` (or the newest) back.
    pub(crate) fn select<E: LogLine>(&self, entries: Vec<E>) -> Vec<E> {
        let cursor = self
            .cursor
            .map(|ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        let wanted = |entry: &E| {
            entry.level() >= self.level
                && self
                    .search
                    .as_ref()
                    .is_none_or(|text| entry.message().contains(text.as_str()))
                && cursor.is_none_or(|at| {
                    if self.backward {
                        entry.timestamp() <= at
                    } else {
                        entry.timestamp() >= at
                    }
                })
        };
        let kept = entries.into_iter().filter(|e| wanted(e));
        if self.backward {
            let mut newest: Vec<E> = kept.collect();
            newest.reverse();
            newest.truncate(self.limit);
            newest
        } else {
            kept.take(self.limit).collect()
        }
    }
}

/// A query's number (`key` names it in the 400).
pub(crate) fn number_param(key: &str, value: &str) -> Result<u64, E2bError> {
    value.parse::<u64>().map_err(|_| {
        E2bError::bad_request(format!(
            "{key} must be a non-negative integer, not {:?}",
            shorten(value)
        ))
    })
}

/// A query's `level`: the least level shown.
pub(crate) fn level_param(value: &str) -> Result<LogLevel, E2bError> {
    match value {
        "debug" => Ok(LogLevel::Debug),
        "info" => Ok(LogLevel::Info),
        "warn" => Ok(LogLevel::Warn),
        "error" => Ok(LogLevel::Error),
        other => Err(E2bError::bad_request(format!(
            "level must be debug, info, warn or error, not {:?}",
            shorten(other)
        ))),
    }
}

/// `SandboxLogEntry`.
fn entry_body(entry: &SandboxLogEntry) -> Value {
    json!({
        "timestamp": rfc3339(entry.timestamp),
        "level": entry.level.as_str(),
        "message": entry.message,
        "fields": entry.fields,
    })
}

fn logs_of(
    state: &ProxyState,
    headers: &HeaderMap,
    id: Result<Path<String>, PathRejection>,
    uri: &Uri,
    route: LogRoute,
) -> Result<Vec<SandboxLogEntry>, E2bError> {
    let service = authorize(state, headers)?;
    let id = sandbox_id(id)?;
    let query = LogQuery::parse(uri.query().unwrap_or_default(), route)?;
    let entries = service.logs(&id).map_err(|e| not_found_short(e, &id))?;
    Ok(query.select(entries))
}

/// `GET /sandboxes/{id}/logs` → 200 `SandboxLogs`: each entry twice, as a line
/// (`SandboxLog`) and as an entry (`SandboxLogEntry`).
pub(crate) async fn logs_v1(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Answer {
    let entries = logs_of(&state, &headers, id, &uri, LogRoute::SandboxV1)?;
    let lines: Vec<Value> = entries
        .iter()
        .map(|e| json!({ "timestamp": rfc3339(e.timestamp), "line": e.message }))
        .collect();
    let entries: Vec<Value> = entries.iter().map(entry_body).collect();
    Ok(Json(json!({ "logs": lines, "logEntries": entries })).into_response())
}

/// `GET /v2/sandboxes/{id}/logs` → 200 `SandboxLogsV2Response`.
pub(crate) async fn logs_v2(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    uri: Uri,
) -> Answer {
    let entries = logs_of(&state, &headers, id, &uri, LogRoute::SandboxV2)?;
    let entries: Vec<Value> = entries.iter().map(entry_body).collect();
    Ok(Json(json!({ "logs": entries })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ms: u64, level: LogLevel, message: &str) -> SandboxLogEntry {
        SandboxLogEntry {
            timestamp: SystemTime::UNIX_EPOCH + Duration::from_millis(ms),
            level,
            message: message.into(),
            fields: Default::default(),
        }
    }

    fn log() -> Vec<SandboxLogEntry> {
        vec![
            entry(1000, LogLevel::Info, "created"),
            entry(2000, LogLevel::Info, "process 7 started"),
            entry(3000, LogLevel::Warn, "process 7 exited with code 1"),
            entry(4000, LogLevel::Info, "killed"),
        ]
    }

    fn route(v2: bool) -> LogRoute {
        if v2 {
            LogRoute::SandboxV2
        } else {
            LogRoute::SandboxV1
        }
    }

    fn messages(query: &str, v2: bool) -> Vec<String> {
        LogQuery::parse(query, route(v2))
            .unwrap()
            .select(log())
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    #[test]
    fn start_cursor_limit_direction_level_and_search_select() {
        assert_eq!(messages("", false).len(), 4);
        assert_eq!(
            messages("start=2000&limit=2", false),
            ["process 7 started", "process 7 exited with code 1"]
        );
        // v1 has no cursor: ignored, as unknown parameters are.
        assert_eq!(messages("cursor=3500", false).len(), 4);
        assert_eq!(
            messages("cursor=3500&direction=backward&limit=2", true),
            ["process 7 exited with code 1", "process 7 started"]
        );
        assert_eq!(messages("direction=backward&limit=1", true), ["killed"]);
        assert_eq!(
            messages("level=warn", true),
            ["process 7 exited with code 1"]
        );
        assert_eq!(messages("search=process%207", true).len(), 2);
        assert!(messages("limit=0", true).is_empty());
    }

    #[test]
    fn bad_values_are_refused_naming_the_parameter() {
        for (query, needle) in [
            ("start=-1", "start"),
            ("limit=x", "limit"),
            ("limit=10001", "at most"),
            ("direction=up", "direction"),
            ("level=fatal", "level"),
        ] {
            let v2 = !query.starts_with("start");
            let error = LogQuery::parse(query, route(v2)).unwrap_err();
            assert!(format!("{error:?}").contains(needle), "{query}: {error:?}");
        }
        let long = format!("search={}", "a".repeat(MAX_SEARCH + 1));
        assert!(LogQuery::parse(&long, LogRoute::SandboxV2).is_err());
    }

    #[test]
    fn a_build_log_query_has_its_own_limit_and_source_and_no_search() {
        let build = |query: &str| LogQuery::parse(query, LogRoute::Build);
        assert_eq!(build("").unwrap().limit, MAX_BUILD_LIMIT);
        assert!(build("limit=101").is_err());
        assert!(build("source=persistent&source=temporary").is_ok());
        let error = build("source=disk").unwrap_err();
        assert!(format!("{error:?}").contains("source"), "{error:?}");
        // `search` is a sandbox-log parameter: ignored here, as any unknown one.
        assert_eq!(build("search=x").unwrap().search, None);
        // And a sandbox's log knows no `source`.
        assert!(LogQuery::parse("source=disk", LogRoute::SandboxV2).is_ok());
    }
}
