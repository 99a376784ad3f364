//! E2B's in-sandbox API (envd) on serve's listener: `process.Process/*` and
//! `filesystem.Filesystem/*` over the Connect protocol (`connect.rs`), and `GET`/`POST
//! /files` and `GET /health` as plain HTTP, with the shapes of E2B's `spec/envd`. The SDKs
//! reach it with `E2B_SANDBOX_URL` set to serve's URL: each request names its sandbox in
//! `E2b-Sandbox-Id` and carries that sandbox's `X-Access-Token`; the user is
//! `Authorization: Basic base64("NAME:")` (none: the sandbox's default user).
//!
//! A request for no running sandbox answers 502 `… was not found` and one without the
//! sandbox's token 401, as plain JSON (`{"code", "message"}`), which is what the SDKs map
//! to "sandbox not running" and an authentication error.
//!
//! Must never: accept another sandbox's token, echo a token, buffer an upload or a
//! download whole, or let a process's output stall the server (streams are bounded).

use super::connect::{
    Code, ConnectError, StreamItem, deadline, stream_error, stream_request, stream_response,
    unary_request, unary_response,
};
use crate::e2b::{SandboxServiceError, rfc3339};
use crate::envd::{
    EntryInfo, EnvdError, FileType, FsEvent, FsEventKind, FsEvents, MAX_UPLOAD_BYTES,
    ProcessConfig, ProcessEvent, ProcessEvents, ProcessListing, ProcessSelector, PtySize,
    SandboxEnvd, StartProcess,
};
use crate::routes::header_str;
use crate::state::ProxyState;
use axum::body::{Body, Bytes};
use axum::extract::{Multipart, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::{StreamExt as _, TryStreamExt as _};
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often an idle process stream carries a keepalive (so proxies keep it open).
const KEEPALIVE: Duration = Duration::from_secs(30);
/// Largest terminal side accepted.
const MAX_PTY_SIDE: u32 = 1000;

/// A refusal before the call reaches the sandbox: plain JSON with an HTTP status.
struct Gate {
    status: StatusCode,
    message: String,
}

impl IntoResponse for Gate {
    fn into_response(self) -> Response {
        let body = json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, axum::Json(body)).into_response()
    }
}

/// The sandbox the request names, when it carries that sandbox's token.
fn sandbox_of(state: &ProxyState, headers: &HeaderMap) -> Result<Arc<dyn SandboxEnvd>, Gate> {
    let gate = |status, message: &str| Gate {
        status,
        message: message.to_owned(),
    };
    let service = state.inner.sandboxes.clone().ok_or_else(|| {
        gate(
            StatusCode::SERVICE_UNAVAILABLE,
            "this server has no sandbox service",
        )
    })?;
    let one = |name: &str| {
        let mut values = headers.get_all(name).iter();
        match (values.next(), values.next()) {
            (Some(value), None) => value.to_str().ok(),
            _ => None,
        }
    };
    let id = one("e2b-sandbox-id").ok_or_else(|| {
        gate(
            StatusCode::BAD_REQUEST,
            "missing E2b-Sandbox-Id header (the sandbox this call is for)",
        )
    })?;
    let token = one("x-access-token").unwrap_or_default();
    service.envd(id, token).map_err(|error| match error {
        SandboxServiceError::NotFound(_) => Gate {
            status: StatusCode::BAD_GATEWAY,
            message: format!("The sandbox {:?} was not found", shorten(id)),
        },
        SandboxServiceError::Unauthorized(message) => Gate {
            status: StatusCode::UNAUTHORIZED,
            message,
        },
        other => Gate {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: other.to_string(),
        },
    })
}

/// The user `Authorization: Basic` names (`None`: the default user).
fn user_of(headers: &HeaderMap) -> Result<Option<String>, (Code, String)> {
    let Some(value) = header_str(headers, "authorization") else {
        return Ok(None);
    };
    let bad = || {
        (
            Code::InvalidArgument,
            "the Authorization header must be `Basic base64(USER:)`".to_owned(),
        )
    };
    let encoded = value
        .strip_prefix("Basic ")
        .or_else(|| value.strip_prefix("basic "))
        .ok_or_else(bad)?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| bad())?;
    let text = String::from_utf8(decoded).map_err(|_| bad())?;
    let name = text.split(':').next().unwrap_or_default();
    if name.is_empty() {
        return Ok(None);
    }
    if name.len() > 64 || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err((
            Code::InvalidArgument,
            format!("{:?} is not a user name", shorten(name)),
        ));
    }
    Ok(Some(name.to_owned()))
}

fn shorten(text: &str) -> String {
    text.chars().take(64).collect()
}

fn connect_error(error: EnvdError) -> ConnectError {
    let code = match &error {
        EnvdError::NotFound(_) => Code::NotFound,
        EnvdError::InvalidArgument(_) => Code::InvalidArgument,
        EnvdError::AlreadyExists(_) => Code::AlreadyExists,
        EnvdError::PermissionDenied(_) => Code::PermissionDenied,
        EnvdError::NoSpace(_) | EnvdError::ResourceExhausted(_) => Code::ResourceExhausted,
        EnvdError::Unimplemented(_) => Code::Unimplemented,
        EnvdError::Unavailable(_) => Code::Unavailable,
        _ => Code::Internal,
    };
    ConnectError::new(code, error.to_string())
}

// ---- messages (proto3 JSON: lowerCamelCase names, numbers also as strings, bytes base64)

/// A uint32 as proto3 JSON may carry it.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum U32 {
    Number(u32),
    Text(String),
}

impl U32 {
    fn get(&self) -> Result<u32, ConnectError> {
        match self {
            Self::Number(n) => Ok(*n),
            Self::Text(text) => text.parse().map_err(|_| {
                ConnectError::new(
                    Code::InvalidArgument,
                    format!("{:?} is not a uint32", shorten(text)),
                )
            }),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ProcessConfigMsg {
    cmd: String,
    args: Vec<String>,
    envs: BTreeMap<String, String>,
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SizeMsg {
    cols: Option<U32>,
    rows: Option<U32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PtyMsg {
    size: Option<SizeMsg>,
}

impl PtyMsg {
    fn size(&self) -> Result<PtySize, ConnectError> {
        let side = |value: &Option<U32>, name: &str| -> Result<u16, ConnectError> {
            let n = value.as_ref().map(U32::get).transpose()?.unwrap_or(0);
            if n == 0 || n > MAX_PTY_SIDE {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("pty {name} must be 1..={MAX_PTY_SIDE}, not {n}"),
                ));
            }
            Ok(u16::try_from(n).unwrap_or(u16::MAX))
        };
        let size = self
            .size
            .as_ref()
            .ok_or_else(|| ConnectError::new(Code::InvalidArgument, "pty.size is required"))?;
        Ok(PtySize {
            cols: side(&size.cols, "cols")?,
            rows: side(&size.rows, "rows")?,
        })
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StartMsg {
    process: Option<ProcessConfigMsg>,
    pty: Option<PtyMsg>,
    tag: Option<String>,
    stdin: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SelectorMsg {
    pid: Option<U32>,
    tag: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SelectMsg {
    process: Option<SelectorMsg>,
}

fn selector(process: Option<&SelectorMsg>) -> Result<ProcessSelector, ConnectError> {
    match process {
        Some(SelectorMsg { pid: Some(pid), .. }) => Ok(ProcessSelector::Pid(pid.get()?)),
        Some(SelectorMsg { tag: Some(tag), .. }) => Ok(ProcessSelector::Tag(tag.clone())),
        _ => Err(ConnectError::new(
            Code::InvalidArgument,
            "process must select a pid or a tag",
        )),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct InputMsg {
    stdin: Option<String>,
    pty: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputMsg {
    process: Option<SelectorMsg>,
    input: Option<InputMsg>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SignalMsg {
    process: Option<SelectorMsg>,
    signal: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct UpdateMsg {
    process: Option<SelectorMsg>,
    pty: Option<PtyMsg>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct PathMsg {
    path: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct MoveMsg {
    source: String,
    destination: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatchMsg {
    path: String,
    recursive: bool,
    include_entry: bool,
    allow_network_mounts: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct WatcherMsg {
    #[serde(alias = "watcher_id")]
    watcher_id: String,
}

fn fs_event_json(event: &FsEvent) -> Value {
    let kind = match event.kind {
        FsEventKind::Create => "EVENT_TYPE_CREATE",
        FsEventKind::Write => "EVENT_TYPE_WRITE",
        FsEventKind::Remove => "EVENT_TYPE_REMOVE",
        FsEventKind::Rename => "EVENT_TYPE_RENAME",
        FsEventKind::Chmod => "EVENT_TYPE_CHMOD",
    };
    json!({ "name": event.name, "type": kind })
}

/// A watch's events as Connect stream messages: a start, then one per change, keepalives
/// while idle, the call's deadline honoured.
fn watch_stream(events: FsEvents, deadline: Option<Duration>) -> Response {
    struct Watching {
        events: FsEvents,
        until: Option<tokio::time::Instant>,
        started: bool,
        ended: bool,
    }
    let watching = Watching {
        events,
        until: deadline.map(|d| tokio::time::Instant::now() + d),
        started: false,
        ended: false,
    };
    let messages = futures::stream::unfold(watching, |mut run| async move {
        if run.ended {
            return None;
        }
        if !run.started {
            run.started = true;
            return Some((Ok(json!({ "start": {} })), run));
        }
        let expiry = async {
            match run.until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let item: StreamItem = tokio::select! {
            event = run.events.recv() => match event {
                Some(Ok(event)) => Ok(json!({ "filesystem": fs_event_json(&event) })),
                Some(Err(error)) => {
                    run.ended = true;
                    Err(connect_error(error))
                }
                None => {
                    run.ended = true;
                    Err(ConnectError::new(Code::Unavailable, "the watch ended"))
                }
            },
            () = tokio::time::sleep(KEEPALIVE) => Ok(json!({ "keepalive": {} })),
            () = expiry => {
                run.ended = true;
                Err(ConnectError::new(Code::DeadlineExceeded, "the call's deadline passed"))
            }
        };
        Some((item, run))
    });
    stream_response(messages)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListDirMsg {
    path: String,
    depth: Option<U32>,
}

/// Proto3 JSON bytes: standard or URL-safe base64, padded or not.
fn bytes_field(text: &str) -> Result<Bytes, ConnectError> {
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    let config =
        GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent);
    GeneralPurpose::new(&base64::alphabet::STANDARD, config)
        .decode(text)
        .or_else(|_| GeneralPurpose::new(&base64::alphabet::URL_SAFE, config).decode(text))
        .map(Bytes::from)
        .map_err(|_| ConnectError::new(Code::InvalidArgument, "input is not valid base64"))
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn event_json(event: &ProcessEvent) -> Value {
    let inner = match event {
        ProcessEvent::Start { pid } => json!({ "start": { "pid": pid } }),
        ProcessEvent::Stdout(bytes) => json!({ "data": { "stdout": b64(bytes) } }),
        ProcessEvent::Stderr(bytes) => json!({ "data": { "stderr": b64(bytes) } }),
        ProcessEvent::Pty(bytes) => json!({ "data": { "pty": b64(bytes) } }),
        ProcessEvent::End(end) => {
            let mut body = json!({
                "exitCode": end.exit_code,
                "exited": end.exited,
                "status": end.status,
            });
            if let Some(error) = &end.error {
                body["error"] = json!(error);
            }
            json!({ "end": body })
        }
    };
    json!({ "event": inner })
}

/// A process's events as Connect stream messages: keepalives while idle, the call's
/// deadline honoured, and an `unavailable` end when the sandbox went away mid-stream.
fn process_stream(events: ProcessEvents, deadline: Option<Duration>) -> Response {
    struct Running {
        events: ProcessEvents,
        until: Option<tokio::time::Instant>,
        ended: bool,
    }
    let running = Running {
        events,
        until: deadline.map(|d| tokio::time::Instant::now() + d),
        ended: false,
    };
    let messages = futures::stream::unfold(running, |mut run| async move {
        if run.ended {
            return None;
        }
        let expiry = async {
            match run.until {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let item: StreamItem = tokio::select! {
            event = run.events.recv() => match event {
                Some(event) => {
                    run.ended = matches!(event, ProcessEvent::End(_));
                    Ok(event_json(&event))
                }
                None => {
                    run.ended = true;
                    Err(ConnectError::new(
                        Code::Unavailable,
                        "the sandbox ended before the stream completed",
                    ))
                }
            },
            () = tokio::time::sleep(KEEPALIVE) => Ok(json!({ "event": { "keepalive": {} } })),
            () = expiry => {
                run.ended = true;
                Err(ConnectError::new(Code::DeadlineExceeded, "the call's deadline passed (the process keeps running)"))
            }
        };
        Some((item, run))
    });
    stream_response(messages)
}

fn config_json(config: &ProcessConfig) -> Value {
    let mut body = json!({ "cmd": config.cmd, "args": config.args, "envs": config.envs });
    if let Some(cwd) = &config.cwd {
        body["cwd"] = json!(cwd);
    }
    body
}

fn listing_json(process: &ProcessListing) -> Value {
    let mut body = json!({ "config": config_json(&process.config), "pid": process.pid });
    if let Some(tag) = &process.tag {
        body["tag"] = json!(tag);
    }
    body
}

/// Go's `os.FileMode` of an entry (type bits over the permissions), which E2B reports.
fn go_mode(entry: &EntryInfo) -> u32 {
    let kind = match entry.kind {
        FileType::Directory => 1 << 31,
        FileType::Symlink => 1 << 27,
        _ => 0,
    };
    kind | (entry.mode & 0o777)
}

/// `drwxr-xr-x`-style permissions, as Go prints a file mode.
fn permissions(entry: &EntryInfo) -> String {
    let mut text = String::from(match entry.kind {
        FileType::Directory => 'd',
        FileType::Symlink => 'L',
        _ => '-',
    });
    for shift in [6, 3, 0] {
        let bits = entry.mode >> shift;
        text.push(if bits & 4 != 0 { 'r' } else { '-' });
        text.push(if bits & 2 != 0 { 'w' } else { '-' });
        text.push(if bits & 1 != 0 { 'x' } else { '-' });
    }
    text
}

fn entry_json(entry: &EntryInfo) -> Value {
    let kind = match entry.kind {
        FileType::File => "FILE_TYPE_FILE",
        FileType::Directory => "FILE_TYPE_DIRECTORY",
        FileType::Symlink => "FILE_TYPE_SYMLINK",
        FileType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mut body = json!({
        "name": entry.name,
        "type": kind,
        "path": entry.path,
        "size": entry.size.to_string(),
        "mode": go_mode(entry),
        "permissions": permissions(entry),
        "owner": entry.owner,
        "group": entry.group,
        "modifiedTime": rfc3339(entry.modified),
    });
    if let Some(target) = &entry.symlink_target {
        body["symlinkTarget"] = json!(target);
    }
    body
}

// ---- process.Process

/// `POST /process.Process/{method}`.
pub(crate) async fn process(
    State(state): State<ProxyState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = matches!(method.as_str(), "Start" | "Connect" | "StreamInput");
    let sandbox = match sandbox_of(&state, &headers) {
        Ok(sandbox) => sandbox,
        Err(gate) => return gate.into_response(),
    };
    let limit = state.inner.config.limits.max_body_bytes;
    let answer = async {
        match method.as_str() {
            "Start" => {
                let user = user_of(&headers).map_err(|(code, m)| ConnectError::new(code, m))?;
                let request: StartMsg = stream_request(&headers, body, limit).await?;
                let process = request.process.unwrap_or_default();
                if process.cmd.is_empty() {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "process.cmd is required",
                    ));
                }
                let pty = request.pty.as_ref().map(PtyMsg::size).transpose()?;
                let start = StartProcess {
                    config: ProcessConfig {
                        cmd: process.cmd,
                        args: process.args,
                        envs: process.envs,
                        cwd: process.cwd.filter(|cwd| !cwd.is_empty()),
                    },
                    pty,
                    tag: request.tag,
                    stdin: request.stdin.unwrap_or(true),
                    user,
                };
                let events = sandbox.start(start).await.map_err(connect_error)?;
                Ok(process_stream(events, deadline(&headers)))
            }
            "Connect" => {
                let request: SelectMsg = stream_request(&headers, body, limit).await?;
                let events = sandbox
                    .connect(selector(request.process.as_ref())?)
                    .await
                    .map_err(connect_error)?;
                Ok(process_stream(events, deadline(&headers)))
            }
            "List" => {
                let _: SelectMsg = unary_request(&headers, body, limit).await?;
                let processes: Vec<Value> = sandbox.list().iter().map(listing_json).collect();
                Ok(unary_response(&json!({ "processes": processes })))
            }
            "SendInput" => {
                let request: SendInputMsg = unary_request(&headers, body, limit).await?;
                let process = selector(request.process.as_ref())?;
                let (data, pty) = match request.input.unwrap_or_default() {
                    InputMsg {
                        pty: Some(data), ..
                    } => (bytes_field(&data)?, true),
                    InputMsg {
                        stdin: Some(data), ..
                    } => (bytes_field(&data)?, false),
                    _ => (Bytes::new(), false),
                };
                sandbox
                    .send_input(process, data, pty)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({})))
            }
            "SendSignal" => {
                let request: SignalMsg = unary_request(&headers, body, limit).await?;
                let process = selector(request.process.as_ref())?;
                let kill = match &request.signal {
                    Some(Value::String(name)) if name == "SIGNAL_SIGKILL" => true,
                    Some(Value::String(name)) if name == "SIGNAL_SIGTERM" => false,
                    Some(Value::Number(n)) if n.as_u64() == Some(9) => true,
                    Some(Value::Number(n)) if n.as_u64() == Some(15) => false,
                    _ => {
                        return Err(ConnectError::new(
                            Code::InvalidArgument,
                            "signal must be SIGNAL_SIGTERM or SIGNAL_SIGKILL",
                        ));
                    }
                };
                sandbox.send_signal(process, kill).map_err(connect_error)?;
                Ok(unary_response(&json!({})))
            }
            "CloseStdin" => {
                let request: SelectMsg = unary_request(&headers, body, limit).await?;
                sandbox
                    .close_stdin(selector(request.process.as_ref())?)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({})))
            }
            "StreamInput" => {
                stream_input(sandbox.as_ref(), &headers, body, limit).await?;
                Ok(stream_response(futures::stream::once(async {
                    Ok(json!({}))
                })))
            }
            "Update" => {
                let request: UpdateMsg = unary_request(&headers, body, limit).await?;
                let process = selector(request.process.as_ref())?;
                if let Some(pty) = &request.pty {
                    sandbox
                        .resize(process, pty.size()?)
                        .map_err(connect_error)?;
                }
                Ok(unary_response(&json!({})))
            }
            other => Err(unimplemented("process.Process", other)),
        }
    };
    match answer.await {
        Ok(response) => response,
        Err(error) if streaming => stream_error(error),
        Err(error) => error.into_response(),
    }
}

/// Watch options the announced envd version does not offer (the SDKs refuse them first).
fn refuse_watch_options(request: &WatchMsg) -> Result<(), ConnectError> {
    if request.include_entry || request.allow_network_mounts {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "includeEntry and allowNetworkMounts are not served",
        ));
    }
    Ok(())
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct StreamInputMsg {
    start: Option<SelectMsg>,
    data: Option<SendInputData>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SendInputData {
    input: Option<InputMsg>,
}

/// `StreamInput` (client streaming): a start naming the process, then input messages
/// written in order as they arrive, each envelope read within `limit`.
async fn stream_input(
    sandbox: &dyn SandboxEnvd,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<(), ConnectError> {
    if let Some(kind) = header_str(headers, "content-type")
        && !kind.trim().starts_with("application/connect+json")
    {
        return Err(ConnectError::new(
            Code::InvalidArgument,
            "content-type must be application/connect+json",
        ));
    }
    let mut chunks = body.into_data_stream();
    let mut pending: Vec<u8> = Vec::new();
    let mut process: Option<ProcessSelector> = None;
    loop {
        // One whole envelope from what arrived so far, else more bytes.
        if pending.len() >= 5 {
            let length =
                u32::from_be_bytes([pending[1], pending[2], pending[3], pending[4]]) as usize;
            if length > limit {
                return Err(ConnectError::new(
                    Code::ResourceExhausted,
                    format!("an input message over {limit} bytes"),
                ));
            }
            if pending.len() >= 5 + length {
                let flags = pending[0];
                let message: Vec<u8> = pending.drain(..5 + length).skip(5).collect();
                if flags & 0x02 != 0 {
                    continue;
                }
                if flags != 0 {
                    return Err(ConnectError::new(
                        Code::InvalidArgument,
                        "compressed messages are not accepted",
                    ));
                }
                let message: StreamInputMsg = serde_json::from_slice(&message).map_err(|e| {
                    ConnectError::new(
                        Code::InvalidArgument,
                        format!("the input message is not valid: {e}"),
                    )
                })?;
                if let Some(start) = message.start {
                    process = Some(selector(start.process.as_ref())?);
                } else if let Some(data) = message.data {
                    let target = process.clone().ok_or_else(|| {
                        ConnectError::new(Code::InvalidArgument, "input before the start message")
                    })?;
                    let (bytes, pty) = match data.input.unwrap_or_default() {
                        InputMsg {
                            pty: Some(data), ..
                        } => (bytes_field(&data)?, true),
                        InputMsg {
                            stdin: Some(data), ..
                        } => (bytes_field(&data)?, false),
                        _ => continue,
                    };
                    sandbox
                        .send_input(target, bytes, pty)
                        .await
                        .map_err(connect_error)?;
                }
                continue;
            }
        }
        match chunks.next().await {
            Some(Ok(bytes)) => pending.extend_from_slice(&bytes),
            Some(Err(e)) => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    format!("the request body failed: {e}"),
                ));
            }
            None if pending.is_empty() => return Ok(()),
            None => {
                return Err(ConnectError::new(
                    Code::InvalidArgument,
                    "the request ended inside a message",
                ));
            }
        }
    }
}

fn unimplemented(service: &str, method: &str) -> ConnectError {
    ConnectError::new(
        Code::Unimplemented,
        format!("{service}/{} is not served by omabox", shorten(method)),
    )
}

// ---- filesystem.Filesystem

/// `POST /filesystem.Filesystem/{method}`.
pub(crate) async fn filesystem(
    State(state): State<ProxyState>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let streaming = method == "WatchDir";
    let sandbox = match sandbox_of(&state, &headers) {
        Ok(sandbox) => sandbox,
        Err(gate) => return gate.into_response(),
    };
    let limit = state.inner.config.limits.max_body_bytes;
    let answer = async {
        let user = user_of(&headers).map_err(|(code, m)| ConnectError::new(code, m))?;
        let user = user.as_deref();
        match method.as_str() {
            "Stat" => {
                let request: PathMsg = unary_request(&headers, body, limit).await?;
                let entry = sandbox
                    .stat(&request.path, user)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({ "entry": entry_json(&entry) })))
            }
            "MakeDir" => {
                let request: PathMsg = unary_request(&headers, body, limit).await?;
                match sandbox
                    .make_dir(&request.path, user)
                    .await
                    .map_err(connect_error)?
                {
                    Some(entry) => Ok(unary_response(&json!({ "entry": entry_json(&entry) }))),
                    None => Err(ConnectError::new(
                        Code::AlreadyExists,
                        format!("directory {:?} already exists", shorten(&request.path)),
                    )),
                }
            }
            "Move" => {
                let request: MoveMsg = unary_request(&headers, body, limit).await?;
                let entry = sandbox
                    .rename(&request.source, &request.destination, user)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({ "entry": entry_json(&entry) })))
            }
            "ListDir" => {
                let request: ListDirMsg = unary_request(&headers, body, limit).await?;
                let depth = request
                    .depth
                    .as_ref()
                    .map(U32::get)
                    .transpose()?
                    .unwrap_or(1);
                let entries = sandbox
                    .list_dir(&request.path, depth.max(1), user)
                    .await
                    .map_err(connect_error)?;
                let entries: Vec<Value> = entries.iter().map(entry_json).collect();
                Ok(unary_response(&json!({ "entries": entries })))
            }
            "Remove" => {
                let request: PathMsg = unary_request(&headers, body, limit).await?;
                sandbox
                    .remove(&request.path, user)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({})))
            }
            "WatchDir" => {
                let request: WatchMsg = stream_request(&headers, body, limit).await?;
                refuse_watch_options(&request)?;
                let events = sandbox
                    .watch_dir(&request.path, request.recursive, user)
                    .await
                    .map_err(connect_error)?;
                Ok(watch_stream(events, deadline(&headers)))
            }
            "CreateWatcher" => {
                let request: WatchMsg = unary_request(&headers, body, limit).await?;
                refuse_watch_options(&request)?;
                let id = sandbox
                    .create_watcher(&request.path, request.recursive, user)
                    .await
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({ "watcherId": id })))
            }
            "GetWatcherEvents" => {
                let request: WatcherMsg = unary_request(&headers, body, limit).await?;
                let events = sandbox
                    .watcher_events(&request.watcher_id)
                    .map_err(connect_error)?;
                let events: Vec<Value> = events.iter().map(fs_event_json).collect();
                Ok(unary_response(&json!({ "events": events })))
            }
            "RemoveWatcher" => {
                let request: WatcherMsg = unary_request(&headers, body, limit).await?;
                sandbox
                    .remove_watcher(&request.watcher_id)
                    .map_err(connect_error)?;
                Ok(unary_response(&json!({})))
            }
            other => Err(unimplemented("filesystem.Filesystem", other)),
        }
    };
    match answer.await {
        Ok(response) => response,
        Err(error) if streaming => stream_error(error),
        Err(error) => error.into_response(),
    }
}

// ---- /files and /health

/// `GET /health`: envd answers 204 while it runs.
pub(crate) async fn health() -> StatusCode {
    StatusCode::NO_CONTENT
}

/// A `/files` failure: its status and `{"code", "message"}`.
fn file_error(error: EnvdError) -> Gate {
    let status = match &error {
        EnvdError::NotFound(_) => StatusCode::NOT_FOUND,
        EnvdError::InvalidArgument(_) | EnvdError::AlreadyExists(_) => StatusCode::BAD_REQUEST,
        EnvdError::PermissionDenied(_) => StatusCode::FORBIDDEN,
        EnvdError::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
        EnvdError::ResourceExhausted(_) => StatusCode::PAYLOAD_TOO_LARGE,
        EnvdError::Unavailable(_) => StatusCode::BAD_GATEWAY,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    Gate {
        status,
        message: error.to_string(),
    }
}

/// `path` and `username` of a `/files` query.
fn file_query(query: Option<&str>) -> (Option<String>, Option<String>) {
    let (mut path, mut user) = (None, None);
    for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match key.as_ref() {
            "path" if path.is_none() => path = Some(value.into_owned()),
            "username" if user.is_none() => user = Some(value.into_owned()),
            _ => {}
        }
    }
    (
        path.filter(|p| !p.is_empty()),
        user.filter(|u| !u.is_empty()),
    )
}

/// `GET /files?path=…`: the file's bytes, streamed.
pub(crate) async fn download(
    State(state): State<ProxyState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let sandbox = sandbox_of(&state, &headers)?;
        let (path, user) = file_query(query.as_deref());
        let user = match user {
            Some(user) => Some(user),
            None => user_of(&headers).map_err(|(_, message)| Gate {
                status: StatusCode::BAD_REQUEST,
                message,
            })?,
        };
        let path = path.ok_or_else(|| Gate {
            status: StatusCode::BAD_REQUEST,
            message: "the path query parameter is required".into(),
        })?;
        let file = sandbox
            .read_file(&path, user.as_deref())
            .await
            .map_err(file_error)?;
        let body = Body::from_stream(file.content.map_err(std::io::Error::other));
        Ok::<_, Gate>(
            (
                StatusCode::OK,
                [(
                    CONTENT_TYPE,
                    HeaderValue::from_static("application/octet-stream"),
                )],
                body,
            )
                .into_response(),
        )
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// A byte stream that fails (and says so in `over`) past [`MAX_UPLOAD_BYTES`].
fn capped<S>(
    stream: S,
    over: Arc<AtomicBool>,
) -> impl futures::Stream<Item = std::io::Result<Bytes>>
where
    S: futures::Stream<Item = std::io::Result<Bytes>>,
{
    let seen = AtomicU64::new(0);
    stream.map(move |chunk| {
        let chunk = chunk?;
        let total = seen.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
        if total > MAX_UPLOAD_BYTES {
            over.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("upload too large"));
        }
        Ok(chunk)
    })
}

fn too_large() -> Gate {
    Gate {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        message: format!("a file upload may carry at most {MAX_UPLOAD_BYTES} bytes"),
    }
}

/// `POST /files`: a multipart upload (each part's file name its path, or `path` for a
/// single part) or the raw bytes of `path`; answers the written files.
pub(crate) async fn upload(
    State(state): State<ProxyState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Response {
    let result = async {
        let sandbox = sandbox_of(&state, &headers)?;
        let bad = |message: &str| Gate {
            status: StatusCode::BAD_REQUEST,
            message: message.to_owned(),
        };
        if header_str(&headers, "content-encoding")
            .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"))
        {
            return Err(bad(
                "encoded (gzip) uploads are not supported: send the bytes as they are",
            ));
        }
        let (path, user) = file_query(query.as_deref());
        let user = match user {
            Some(user) => Some(user),
            None => user_of(&headers).map_err(|(_, message)| bad(&message))?,
        };
        let media = header_str(&headers, "content-type")
            .and_then(|kind| kind.split(';').next())
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        let mut written = Vec::new();
        if media == "multipart/form-data" {
            use axum::extract::FromRequest as _;
            let mut parts = Multipart::from_request(request, &state)
                .await
                .map_err(|e| bad(&format!("not a multipart body: {e}")))?;
            loop {
                let field = match parts.next_field().await {
                    Ok(Some(field)) => field,
                    Ok(None) => break,
                    Err(e) => return Err(bad(&format!("bad multipart body: {e}"))),
                };
                let target = match (&path, field.file_name()) {
                    (Some(path), _) if written.is_empty() => path.clone(),
                    (Some(_), _) => return Err(bad("with a path parameter, upload one file")),
                    (None, Some(name)) if !name.is_empty() => name.to_owned(),
                    (None, _) => {
                        return Err(bad(
                            "each part needs a file name (its path) or the path parameter",
                        ));
                    }
                };
                let over = Arc::new(AtomicBool::new(false));
                let bytes = capped(field.map_err(std::io::Error::other), Arc::clone(&over));
                let mut reader = tokio_util::io::StreamReader::new(Box::pin(bytes));
                let entry = sandbox
                    .write_file(&target, user.as_deref(), &mut reader)
                    .await;
                if over.load(Ordering::Relaxed) {
                    return Err(too_large());
                }
                written.push(entry.map_err(file_error)?);
            }
        } else {
            let path = path.ok_or_else(|| bad("the path query parameter is required"))?;
            let over = Arc::new(AtomicBool::new(false));
            let stream = request
                .into_body()
                .into_data_stream()
                .map_err(std::io::Error::other);
            let bytes = capped(stream, Arc::clone(&over));
            let mut reader = tokio_util::io::StreamReader::new(Box::pin(bytes));
            let entry = sandbox
                .write_file(&path, user.as_deref(), &mut reader)
                .await;
            if over.load(Ordering::Relaxed) {
                return Err(too_large());
            }
            written.push(entry.map_err(file_error)?);
        }
        let listed: Vec<Value> = written
            .iter()
            .map(|entry| json!({ "name": entry.name, "type": "file", "path": entry.path }))
            .collect();
        Ok((StatusCode::OK, axum::Json(Value::Array(listed))).into_response())
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    fn entry(kind: FileType, mode: u32) -> EntryInfo {
        EntryInfo {
            name: "x".into(),
            kind,
            path: "/x".into(),
            size: 3,
            mode,
            owner: "user".into(),
            group: "user".into(),
            modified: SystemTime::UNIX_EPOCH,
            symlink_target: None,
        }
    }

    #[test]
    fn entries_show_go_modes_and_permissions() {
        let dir = entry(FileType::Directory, 0o755);
        assert_eq!(permissions(&dir), "drwxr-xr-x");
        assert_eq!(go_mode(&dir), (1 << 31) | 0o755);
        let file = entry(FileType::File, 0o4644);
        assert_eq!(permissions(&file), "-rw-r--r--");
        let json = entry_json(&file);
        assert_eq!(json["type"], "FILE_TYPE_FILE");
        assert_eq!(json["size"], "3");
        assert_eq!(json["modifiedTime"], "1970-01-01T00:00:00.000Z");
        assert_eq!(permissions(&entry(FileType::Symlink, 0o777)), "Lrwxrwxrwx");
    }

    #[test]
    fn users_come_from_basic_authorization() {
        let mut headers = HeaderMap::new();
        assert_eq!(user_of(&headers).unwrap(), None);
        headers.insert("authorization", HeaderValue::from_static("Basic cm9vdDo=")); // root:
        assert_eq!(user_of(&headers).unwrap().as_deref(), Some("root"));
        headers.insert("authorization", HeaderValue::from_static("Bearer x"));
        assert!(user_of(&headers).is_err());
        headers.insert("authorization", HeaderValue::from_static("Basic !!!"));
        assert!(user_of(&headers).is_err());
    }

    #[test]
    fn proto_json_bytes_and_numbers_are_read_leniently() {
        assert_eq!(bytes_field("aGk=").unwrap(), Bytes::from_static(b"hi"));
        assert_eq!(bytes_field("aGk").unwrap(), Bytes::from_static(b"hi"));
        assert_eq!(bytes_field("_w").unwrap(), Bytes::from_static(&[0xff]));
        assert!(bytes_field("*").is_err());
        let msg: SelectMsg = serde_json::from_str(r#"{"process":{"pid":"42"}}"#).unwrap();
        assert_eq!(
            selector(msg.process.as_ref()).unwrap(),
            ProcessSelector::Pid(42)
        );
        let msg: SelectMsg = serde_json::from_str(r#"{"process":{"tag":"t"}}"#).unwrap();
        assert_eq!(
            selector(msg.process.as_ref()).unwrap(),
            ProcessSelector::Tag("t".into())
        );
        let msg: SelectMsg = serde_json::from_str(r#"{}"#).unwrap();
        assert!(selector(msg.process.as_ref()).is_err());
    }

    #[test]
    fn process_events_have_the_proto_json_shape() {
        assert_eq!(
            event_json(&ProcessEvent::Start { pid: 7 }),
            json!({ "event": { "start": { "pid": 7 } } })
        );
        assert_eq!(
            event_json(&ProcessEvent::Stdout(Bytes::from_static(b"hi"))),
            json!({ "event": { "data": { "stdout": "aGk=" } } })
        );
        let end = crate::envd::ProcessEnd {
            exit_code: 1,
            exited: true,
            status: "exit status 1".into(),
            error: None,
        };
        assert_eq!(
            event_json(&ProcessEvent::End(end)),
            json!({ "event": { "end": { "exitCode": 1, "exited": true, "status": "exit status 1" } } })
        );
    }
}
