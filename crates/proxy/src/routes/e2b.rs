//! E2B's REST control plane (`spec/openapi.yml` of e2b-dev/E2B): `POST/GET /sandboxes`,
//! `GET /v2/sandboxes`, `GET/DELETE /sandboxes/{id}`, `POST /sandboxes/{id}/timeout` and
//! `POST /sandboxes/{id}/refreshes`, over a [`SandboxService`]. Field names, statuses and the
//! error body (`{"code": <status>, "message": "..."}`) are E2B's.
//!
//! Every route first checks `X-API-Key` against the operator key (missing or wrong: 401);
//! only then is a body read, capped at the configured size (over it: 400, E2B has no 413).
//! Must never: answer anything but 401 before the key matched; put a token in an error.

use crate::ProxyError;
use crate::e2b::{
    CreatedSandbox, DEFAULT_TIMEOUT, MAX_ENV_VARS, MAX_KEY_BYTES, MAX_METADATA, MAX_REFRESH,
    MAX_TIMEOUT, MAX_VALUE_BYTES, NewSandbox, SandboxInfo, SandboxService, SandboxServiceError,
    rfc3339,
};
use crate::envd::ENVD_VERSION;
use crate::routes::{header_str, read_capped};
use crate::state::ProxyState;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use omabox_contract::SecretString;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// The deprecated `clientID` every sandbox reports.
const CLIENT_ID: &str = "omabox";
/// Page size of `GET /v2/sandboxes` when `limit` is not given, and its largest value.
const PAGE_LIMIT: usize = 100;

/// An E2B error answer: its status and `{"code", "message"}`.
#[derive(Debug)]
pub(crate) struct E2bError {
    status: StatusCode,
    message: String,
}

impl E2bError {
    pub(super) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }

    pub(super) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for E2bError {
    /// With `Connection: close`, as envd's refusals (`envd.rs`'s `Gate`): most are answered
    /// before the request's body was read (a wrong key, a bad id, a body over the cap), so
    /// the server ends the connection after them; a client told so does not send its next
    /// request on it. An error after the body was read closes a connection a client opens
    /// again, which costs little next to a lost request.
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(status = %self.status, message = %self.message, "sandbox call failed");
        }
        let body = self.body();
        (
            self.status,
            [(axum::http::header::CONNECTION, "close")],
            Json(body),
        )
            .into_response()
    }
}

impl E2bError {
    /// E2B's `Error` object, `{code, message}`, as a value (a fork's failed entry).
    pub(super) fn body(&self) -> Value {
        json!({ "code": self.status.as_u16(), "message": self.message })
    }
}

impl From<SandboxServiceError> for E2bError {
    fn from(error: SandboxServiceError) -> Self {
        let status = match &error {
            SandboxServiceError::NotFound(_) | SandboxServiceError::Missing(_) => {
                StatusCode::NOT_FOUND
            }
            SandboxServiceError::BadRequest(_) => StatusCode::BAD_REQUEST,
            SandboxServiceError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            SandboxServiceError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self::new(status, error.to_string())
    }
}

impl From<ProxyError> for E2bError {
    fn from(error: ProxyError) -> Self {
        Self::bad_request(error.to_string())
    }
}

pub(super) type Answer = Result<Response, E2bError>;

/// The service behind the routes, once `X-API-Key` is the operator key (exactly one such
/// header).
pub(super) fn authorize(
    state: &ProxyState,
    headers: &HeaderMap,
) -> Result<Arc<dyn SandboxService>, E2bError> {
    let mut keys = headers.get_all("x-api-key").iter();
    let key = match (keys.next(), keys.next()) {
        (None, _) => {
            return Err(E2bError::new(
                StatusCode::UNAUTHORIZED,
                "missing X-API-Key header (the operator key of omabox serve)",
            ));
        }
        (Some(key), None) => key.to_str().ok(),
        (Some(_), Some(_)) => None,
    };
    if !state.operator_allows(key) {
        return Err(E2bError::new(StatusCode::UNAUTHORIZED, "invalid API key"));
    }
    state.inner.sandboxes.clone().ok_or_else(|| {
        E2bError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server has no sandbox service",
        )
    })
}

/// An authorized call on one sandbox: the service, the sandbox id from the path and the
/// JSON body (`None`: empty), checked in that order (the key before anything else).
pub(crate) async fn sandbox_call<T: serde::de::DeserializeOwned>(
    state: &ProxyState,
    headers: &HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<(Arc<dyn SandboxService>, String, Option<T>), E2bError> {
    let service = authorize(state, headers)?;
    let id = sandbox_id(id)?;
    let body = json_body(state, headers, body).await?;
    Ok((service, id, body))
}

/// The JSON body of an authorized request: capped, declared JSON when declared at all,
/// and parsed (`None`: empty).
pub(super) async fn json_body<T: serde::de::DeserializeOwned>(
    state: &ProxyState,
    headers: &HeaderMap,
    body: Body,
) -> Result<Option<T>, E2bError> {
    let limit = state.inner.config.limits.max_body_bytes;
    let bytes = read_capped(headers, body, limit).await.map_err(|_| {
        E2bError::bad_request(format!("request body too large (at most {limit} bytes)"))
    })?;
    if let Some(kind) = header_str(headers, "content-type") {
        let media = kind.split(';').next().unwrap_or_default().trim();
        if !media.eq_ignore_ascii_case("application/json") {
            return Err(E2bError::bad_request(
                "content-type must be application/json",
            ));
        }
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice(&bytes).map(Some).map_err(|e| {
        E2bError::bad_request(format!(
            "request body is not valid JSON for this route: {}",
            json_error(&e)
        ))
    })
}

/// serde_json's error text with every value it quotes cut to 32 characters and the whole
/// to 200: it quotes the caller's strings whole (`invalid type: string "…"`), and a body
/// may be as large as the body cap.
fn json_error(error: &serde_json::Error) -> String {
    const QUOTED: usize = 32;
    let mut text = String::new();
    let mut quote = None;
    let (mut inside, mut escaped) = (0, false);
    for c in error.to_string().chars() {
        match quote {
            None => {
                if c == '"' || c == '`' {
                    (quote, inside, escaped) = (Some(c), 0, false);
                }
                text.push(c);
            }
            Some(q) if c == q && !escaped => {
                quote = None;
                text.push(c);
            }
            Some(_) => {
                escaped = !escaped && c == '\\';
                inside += 1;
                if inside <= QUOTED {
                    text.push(c);
                } else if inside == QUOTED + 1 {
                    text.push('…');
                }
            }
        }
    }
    shorten_to(&text, 200)
}

/// `NewSandbox` as sent.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandboxBody {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<i64>,
    auto_pause: Option<bool>,
    auto_resume: Option<Value>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<Value>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    mcp: Option<Value>,
    volume_mounts: Option<Vec<Value>>,
    iam: Option<Value>,
}

impl NewSandboxBody {
    fn validate(self) -> Result<NewSandbox, E2bError> {
        let unsupported = |field: &str| {
            Err(E2bError::bad_request(format!(
                "{field} is not supported by omabox yet"
            )))
        };
        if self.auto_pause == Some(true) {
            return unsupported("autoPause");
        }
        if self
            .auto_resume
            .as_ref()
            .is_some_and(|v| v.get("enabled") == Some(&Value::Bool(true)))
        {
            return unsupported("autoResume");
        }
        if self.network.as_ref().is_some_and(|v| !is_empty(v)) {
            return unsupported("network");
        }
        if self.mcp.as_ref().is_some_and(|v| !is_empty(v)) {
            return unsupported("mcp");
        }
        if self.iam.as_ref().is_some_and(|v| !is_empty(v)) {
            return unsupported("iam");
        }
        if self.volume_mounts.as_ref().is_some_and(|v| !v.is_empty()) {
            return unsupported("volumeMounts");
        }
        if self.template_id.is_empty() {
            return Err(E2bError::bad_request("templateID must not be empty"));
        }
        let timeout = match self.timeout {
            Some(secs) => seconds("timeout", secs, MAX_TIMEOUT)?,
            None => DEFAULT_TIMEOUT,
        };
        let metadata = self.metadata.unwrap_or_default();
        check_map("metadata", &metadata, MAX_METADATA)?;
        let env_vars = self.env_vars.unwrap_or_default();
        check_map("envVars", &env_vars, MAX_ENV_VARS)?;
        if let Some(name) = env_vars
            .keys()
            .find(|name| name.is_empty() || name.contains(['=', '\0']))
        {
            return Err(E2bError::bad_request(format!(
                "envVars: {:?} is not a variable name",
                shorten(name)
            )));
        }
        if env_vars.values().any(|value| value.contains('\0')) {
            return Err(E2bError::bad_request(
                "envVars: a value contains a NUL byte",
            ));
        }
        Ok(NewSandbox {
            template_id: self.template_id,
            timeout,
            metadata,
            env_vars,
            allow_internet_access: self.allow_internet_access,
        })
    }
}

/// `null`, `{}` or `[]`.
pub(super) fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Object(map) => map.is_empty(),
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// A whole number of seconds in `0..=max`.
pub(super) fn seconds(field: &str, secs: i64, max: Duration) -> Result<Duration, E2bError> {
    match u64::try_from(secs) {
        Ok(secs) if secs <= max.as_secs() => Ok(Duration::from_secs(secs)),
        _ => Err(E2bError::bad_request(format!(
            "{field} must be between 0 and {} seconds, got {secs}",
            max.as_secs()
        ))),
    }
}

fn check_map(field: &str, map: &BTreeMap<String, String>, max: usize) -> Result<(), E2bError> {
    if map.len() > max {
        return Err(E2bError::bad_request(format!(
            "{field} has {} entries, at most {max} are allowed",
            map.len()
        )));
    }
    if let Some((key, _)) = map
        .iter()
        .find(|(key, value)| key.len() > MAX_KEY_BYTES || value.len() > MAX_VALUE_BYTES)
    {
        return Err(E2bError::bad_request(format!(
            "{field}: the entry {:?} is too long (keys at most {MAX_KEY_BYTES} bytes, values at most {MAX_VALUE_BYTES})",
            shorten(key)
        )));
    }
    let total: usize = map.iter().map(|(key, value)| key.len() + value.len()).sum();
    if total > MAX_MAP_BYTES {
        return Err(E2bError::bad_request(format!(
            "{field} holds {total} bytes, at most {MAX_MAP_BYTES} are allowed"
        )));
    }
    Ok(())
}

/// The most one sandbox's metadata (or env vars) may hold in all: what serve keeps per
/// sandbox and returns in every listing stays small (1024 sandboxes x 64 KiB = 64 MiB).
const MAX_MAP_BYTES: usize = 64 * 1024;

/// At most 64 characters of a caller's text, for a message.
pub(super) fn shorten(text: &str) -> String {
    shorten_to(text, 64)
}

fn shorten_to(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// The `{sandbox_id}` of an authorized request's path. Taken as a `Result` so that a
/// non-UTF-8 id is answered only after the key was checked, and in E2B's shape.
pub(super) fn sandbox_id(id: Result<Path<String>, PathRejection>) -> Result<String, E2bError> {
    id.map(|Path(id)| id)
        .map_err(|_| E2bError::bad_request("the sandbox id in the path is not UTF-8 text"))
}

/// `POST /sandboxes` → 201 `Sandbox`.
pub(crate) async fn create(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let body: NewSandboxBody = json_body(&state, &headers, body)
        .await?
        .ok_or_else(|| E2bError::bad_request("a JSON body with templateID is required"))?;
    let request = body.validate()?;
    let CreatedSandbox { info, access_token } = service.create(request).await?;
    Ok((
        StatusCode::CREATED,
        Json(sandbox_body(&info, &access_token)),
    )
        .into_response())
}

/// `Sandbox`: what a create or a connect answers (the access token included).
pub(super) fn sandbox_body(info: &SandboxInfo, access_token: &SecretString) -> Value {
    json!({
        "templateID": info.template_id,
        "sandboxID": info.sandbox_id,
        "alias": info.template_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": access_token.expose(),
        "trafficAccessToken": null,
        "domain": null,
    })
}

#[derive(Debug, Deserialize)]
struct ConnectBody {
    timeout: Option<i64>,
}

/// `POST /sandboxes/{id}/connect` (and `/v2/…`) `{"timeout": secs}` → 200 `Sandbox`: a
/// running sandbox lives at least `timeout` more (never shortened), and the caller gets
/// what it needs to reach it. A paused one is resumed under the same id and token with
/// its files back, to live `timeout` (15 s when not given): 201.
pub(crate) async fn connect(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<ConnectBody>(&state, &headers, id, body).await?;
    let timeout = match body.and_then(|b| b.timeout) {
        Some(secs) => Some(seconds("timeout", secs, MAX_TIMEOUT)?),
        None => None,
    };
    if let Some(CreatedSandbox { info, access_token }) = service
        .resume(&id, timeout.unwrap_or(DEFAULT_TIMEOUT))
        .await
        .map_err(|e| not_found_short(e, &id))?
    {
        return Ok((
            StatusCode::CREATED,
            Json(sandbox_body(&info, &access_token)),
        )
            .into_response());
    }
    if let Some(timeout) = timeout {
        service
            .refresh(&id, timeout)
            .map_err(|e| not_found_short(e, &id))?;
    }
    let (info, access_token) = service
        .get(&id)
        .ok_or_else(|| not_found_short(SandboxServiceError::NotFound(id.clone()), &id))?;
    Ok((StatusCode::OK, Json(sandbox_body(&info, &access_token))).into_response())
}

/// `ListedSandbox` (and, with `detail`, the fields `SandboxDetail` adds).
pub(super) fn listed(info: &SandboxInfo) -> Value {
    json!({
        "templateID": info.template_id,
        "alias": info.template_id,
        "sandboxID": info.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": rfc3339(info.started_at),
        "endAt": rfc3339(info.end_at),
        "cpuCount": info.cpu_count,
        "memoryMB": info.memory_mb,
        "diskSizeMB": info.disk_size_mb,
        "metadata": info.metadata,
        "state": if info.paused { "paused" } else { "running" },
        "envdVersion": ENVD_VERSION,
    })
}

/// `GET /sandboxes/{id}` → 200 `SandboxDetail`.
pub(crate) async fn get(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let id = sandbox_id(id)?;
    let (info, token) = service
        .get(&id)
        .ok_or_else(|| E2bError::from(SandboxServiceError::NotFound(shorten(&id))))?;
    let mut body = listed(&info);
    if let Value::Object(map) = &mut body {
        map.insert("envdAccessToken".into(), token.expose().into());
        map.insert("domain".into(), Value::Null);
        map.insert(
            "allowInternetAccess".into(),
            info.allow_internet_access.map_or(Value::Null, Value::Bool),
        );
        map.insert(
            "lifecycle".into(),
            json!({ "autoResume": false, "onTimeout": "kill" }),
        );
    }
    Ok(Json(body).into_response())
}

/// `DELETE /sandboxes/{id}` → 204.
pub(crate) async fn kill(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let id = sandbox_id(id)?;
    service
        .kill(&id)
        .await
        .map_err(|e| not_found_short(e, &id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A not-found error naming at most 64 characters of the id.
pub(super) fn not_found_short(error: SandboxServiceError, id: &str) -> E2bError {
    match error {
        SandboxServiceError::NotFound(_) => SandboxServiceError::NotFound(shorten(id)).into(),
        other => other.into(),
    }
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: Option<i64>,
}

/// `POST /sandboxes/{id}/timeout` `{"timeout": secs}` → 204.
pub(crate) async fn set_timeout(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<TimeoutBody>(&state, &headers, id, body).await?;
    let secs = body
        .and_then(|b| b.timeout)
        .ok_or_else(|| E2bError::bad_request("timeout is required"))?;
    let timeout = seconds("timeout", secs, MAX_TIMEOUT)?;
    service
        .set_timeout(&id, timeout)
        .map_err(|e| not_found_short(e, &id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct RefreshBody {
    duration: Option<i64>,
}

/// `POST /sandboxes/{id}/refreshes` `{"duration": secs}` (optional) → 204.
pub(crate) async fn refresh(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    id: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let (service, id, body) = sandbox_call::<RefreshBody>(&state, &headers, id, body).await?;
    let duration = match body.and_then(|b| b.duration) {
        Some(secs) => seconds("duration", secs, MAX_REFRESH)?,
        None => DEFAULT_TIMEOUT,
    };
    service
        .refresh(&id, duration)
        .map_err(|e| not_found_short(e, &id))?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /sandboxes` → 200 `[ListedSandbox]` (every running one; `metadata` filters).
pub(crate) async fn list_v1(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    uri: Uri,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let mut query = ListQuery::parse(uri.query().unwrap_or_default())?;
    // v1 lists running sandboxes only.
    query.paused = false;
    let sandboxes: Vec<Value> = query.select(service.list()).iter().map(listed).collect();
    Ok(Json(sandboxes).into_response())
}

/// `GET /v2/sandboxes` → 200 `[ListedSandbox]`, paged (`limit`, `nextToken`; `X-Next-Token`
/// and `X-Total-Running` headers), filtered by `metadata`, `state` and `template`.
pub(crate) async fn list_v2(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    uri: Uri,
) -> Answer {
    let service = authorize(&state, &headers)?;
    let query = ListQuery::parse(uri.query().unwrap_or_default())?;
    let selected = query.select(service.list());
    let start = match &query.next_token {
        Some(token) => {
            let after = parse_cursor(token)?;
            selected
                .iter()
                .position(|info| query.is_after(&cursor_of(info), &after))
                .unwrap_or(selected.len())
        }
        None => 0,
    };
    let page: Vec<&SandboxInfo> = selected.iter().skip(start).take(query.limit).collect();
    let mut response =
        Json(page.iter().map(|info| listed(info)).collect::<Vec<_>>()).into_response();
    let response_headers = response.headers_mut();
    if start + page.len() < selected.len()
        && let Some(last) = page.last()
        && let Ok(value) = HeaderValue::from_str(&cursor_text(&cursor_of(last)))
    {
        response_headers.insert("x-next-token", value);
    }
    if query.running {
        let running = selected.iter().filter(|info| !info.paused).count();
        response_headers.insert("x-total-running", HeaderValue::from(running));
    }
    Ok(response)
}

/// A position in the list order: (start time in ns since the epoch, id).
type Cursor = (u128, String);

fn cursor_of(info: &SandboxInfo) -> Cursor {
    let nanos = info
        .started_at
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    (nanos, info.sandbox_id.clone())
}

fn cursor_text((nanos, id): &Cursor) -> String {
    format!("{nanos}.{id}")
}

fn parse_cursor(token: &str) -> Result<Cursor, E2bError> {
    token
        .split_once('.')
        .and_then(|(nanos, id)| Some((nanos.parse().ok()?, id.to_owned())))
        .ok_or_else(|| E2bError::bad_request("nextToken is not a token this server issued"))
}

/// The list routes' query.
#[derive(Debug)]
struct ListQuery {
    metadata: Vec<(String, String)>,
    /// Whether running sandboxes were asked for.
    running: bool,
    /// Whether paused sandboxes were asked for.
    paused: bool,
    template: Option<String>,
    ascending: bool,
    limit: usize,
    next_token: Option<String>,
}

impl ListQuery {
    fn parse(query: &str) -> Result<Self, E2bError> {
        let mut parsed = Self {
            metadata: Vec::new(),
            running: true,
            paused: true,
            template: None,
            ascending: false,
            limit: PAGE_LIMIT,
            next_token: None,
        };
        for (key, value) in url::form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "metadata" => parsed.metadata.extend(
                    url::form_urlencoded::parse(value.as_bytes())
                        .map(|(k, v)| (k.into_owned(), v.into_owned())),
                ),
                "state" => {
                    let (mut running, mut paused) = (false, false);
                    for state in value.split(',') {
                        match state {
                            "running" => running = true,
                            "paused" => paused = true,
                            other => {
                                return Err(E2bError::bad_request(format!(
                                    "state {:?} is not running or paused",
                                    shorten(other)
                                )));
                            }
                        }
                    }
                    (parsed.running, parsed.paused) = (running, paused);
                }
                "order" => {
                    parsed.ascending = match &*value {
                        "asc" => true,
                        "desc" => false,
                        _ => return Err(E2bError::bad_request("order must be asc or desc")),
                    }
                }
                "limit" => {
                    parsed.limit = value
                        .parse::<usize>()
                        .ok()
                        .filter(|n| (1..=PAGE_LIMIT).contains(n))
                        .ok_or_else(|| {
                            E2bError::bad_request(format!(
                                "limit must be between 1 and {PAGE_LIMIT}"
                            ))
                        })?;
                }
                "template" => parsed.template = Some(value.into_owned()),
                "nextToken" => parsed.next_token = Some(value.into_owned()),
                _ => {}
            }
        }
        Ok(parsed)
    }

    /// The sandboxes matching, in the asked order.
    fn select(&self, mut all: Vec<SandboxInfo>) -> Vec<SandboxInfo> {
        all.retain(|info| {
            (if info.paused {
                self.paused
            } else {
                self.running
            }) && self
                .template
                .as_ref()
                .is_none_or(|template| *template == info.template_id)
                && self
                    .metadata
                    .iter()
                    .all(|(key, value)| info.metadata.get(key) == Some(value))
        });
        all.sort_by_key(cursor_of);
        if !self.ascending {
            all.reverse();
        }
        all
    }

    /// Whether `cursor` comes after `after` in this order.
    fn is_after(&self, cursor: &Cursor, after: &Cursor) -> bool {
        if self.ascending {
            cursor > after
        } else {
            cursor < after
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &str) -> Result<NewSandbox, E2bError> {
        serde_json::from_str::<NewSandboxBody>(json)
            .unwrap()
            .validate()
    }

    #[test]
    fn new_sandbox_defaults_and_limits() {
        let ok = body(r#"{"templateID":"base","metadata":{"a":"b"},"secure":true}"#).unwrap();
        assert_eq!(ok.timeout, DEFAULT_TIMEOUT);
        assert_eq!(ok.metadata.get("a").map(String::as_str), Some("b"));
        for bad in [
            r#"{"templateID":"base","timeout":-1}"#,
            r#"{"templateID":"base","timeout":86401}"#,
            r#"{"templateID":"base","autoPause":true}"#,
            r#"{"templateID":"base","envVars":{"A=B":"c"}}"#,
            r#"{"templateID":""}"#,
        ] {
            let error = body(bad).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST, "{bad}");
        }
        assert!(body(r#"{"templateID":"base","timeout":86400}"#).is_ok());
    }

    /// Each entry within its own cap, the whole over 64 KiB: refused, for metadata and
    /// env vars alike (serve keeps them per sandbox and lists them).
    #[test]
    fn a_sandboxs_metadata_and_env_vars_are_capped_in_all() {
        let entries: Vec<String> = (0..8)
            .map(|i| format!(r#""k{i}":"{}""#, "v".repeat(10_000)))
            .collect();
        for field in ["metadata", "envVars"] {
            let json = format!(
                r#"{{"templateID":"base","{field}":{{{}}}}}"#,
                entries.join(",")
            );
            let error = body(&json).unwrap_err();
            assert_eq!(error.status, StatusCode::BAD_REQUEST);
            assert!(
                error
                    .message
                    .contains(&format!("{field} holds 80016 bytes, at most 65536")),
                "{}",
                error.message
            );
        }
        let entries: Vec<String> = (0..6)
            .map(|i| format!(r#""k{i}":"{}""#, "v".repeat(10_000)))
            .collect();
        let json = format!(
            r#"{{"templateID":"base","metadata":{{{}}}}}"#,
            entries.join(",")
        );
        assert!(body(&json).is_ok());
    }

    #[test]
    fn list_query_parses_filters_and_refuses_bad_values() {
        let query = ListQuery::parse("metadata=user%3Dabc%26app%3Dprod&limit=5&order=asc").unwrap();
        assert_eq!(
            query.metadata,
            vec![("user".into(), "abc".into()), ("app".into(), "prod".into())]
        );
        assert_eq!(query.limit, 5);
        assert!(query.ascending);
        let paused = ListQuery::parse("state=paused").unwrap();
        assert!(!paused.running && paused.paused);
        for bad in ["limit=0", "limit=101", "state=gone", "order=up"] {
            assert!(ListQuery::parse(bad).is_err(), "{bad}");
        }
    }
}
