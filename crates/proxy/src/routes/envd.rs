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
    Code, ConnectError, StreamItem, deadline, require_stream_media, stream_error, stream_request,
    stream_response, unary_request, unary_response,
};
use crate::e2b::SandboxServiceError;
use crate::envd::{
    EnvdError, ProcessConfig, ProcessEvent, ProcessEvents, ProcessListing, ProcessSelector,
    PtySize, SandboxEnvd, StartProcess,
};
use crate::routes::header_str;
use crate::state::ProxyState;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often an idle process stream carries a keepalive (so proxies keep it open).
const KEEPALIVE: Duration = Duration::from_secs(30);
/// Largest terminal side accepted.
const MAX_PTY_SIDE: u32 = 1000;

/// A refusal before the call reaches the sandbox: plain JSON with an HTTP status.
pub(super) struct Gate {
    pub(super) status: StatusCode,
    pub(super) message: String,
}

impl IntoResponse for Gate {
    /// With `Connection: close`: a refusal is sent before the request's body is read, so
    /// the server ends the connection after it; a client told so does not send its next
    /// request on a connection being closed under it (the SDK's `connect` after a refused
    /// `commands.run` failed with "connection closed before message completed").
    fn into_response(self) -> Response {
        let body = json!({ "code": self.status.as_u16(), "message": self.message });
        (
            self.status,
            [(axum::http::header::CONNECTION, "close")],
            axum::Json(body),
        )
            .into_response()
    }
}

/// The sandbox the request names, when it carries that sandbox's token.
pub(super) fn sandbox_of(
    state: &ProxyState,
    headers: &HeaderMap,
) -> Result<Arc<dyn SandboxEnvd>, Gate> {
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
pub(super) fn user_of(headers: &HeaderMap) -> Result<Option<String>, (Code, String)> {
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

pub(super) fn shorten(text: &str) -> String {
    text.chars().take(64).collect()
}

pub(super) fn connect_error(error: EnvdError) -> ConnectError {
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
pub(super) enum U32 {
    Number(u32),
    Text(String),
}

impl U32 {
    pub(super) fn get(&self) -> Result<u32, ConnectError> {
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

/// Proto3 JSON bytes: standard or URL-safe base64, padded or not.
pub(super) fn bytes_field(text: &str) -> Result<Bytes, ConnectError> {
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

/// How a live stream (a process's events, a watch's) becomes Connect messages.
pub(super) struct LiveShape<T> {
    /// A message sent before any event (a watch's start).
    pub(super) first: Option<Value>,
    /// The keepalive message sent while idle.
    pub(super) keepalive: fn() -> Value,
    /// An event's message (or the error it ends with), and whether it is the last.
    pub(super) message: fn(T) -> (StreamItem, bool),
    /// The error when the events stop without a last one (the sandbox went away).
    pub(super) gone: &'static str,
    /// The error when the call's deadline passes.
    pub(super) late: &'static str,
}

/// `events` as a Connect stream: keepalives while idle, the call's deadline honoured.
pub(super) fn live_stream<T: Send + 'static>(
    events: mpsc::Receiver<T>,
    deadline: Option<Duration>,
    shape: LiveShape<T>,
) -> Response {
    struct Running<T> {
        events: mpsc::Receiver<T>,
        until: Option<tokio::time::Instant>,
        first: Option<Value>,
        ended: bool,
        shape: LiveShape<T>,
    }
    let running = Running {
        events,
        until: deadline.map(|d| tokio::time::Instant::now() + d),
        first: shape.first.clone(),
        ended: false,
        shape,
    };
    let messages = futures::stream::unfold(running, |mut run| async move {
        if run.ended {
            return None;
        }
        if let Some(first) = run.first.take() {
            return Some((Ok(first), run));
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
                    let (item, last) = (run.shape.message)(event);
                    run.ended = last;
                    item
                }
                None => {
                    run.ended = true;
                    Err(ConnectError::new(Code::Unavailable, run.shape.gone))
                }
            },
            () = tokio::time::sleep(KEEPALIVE) => Ok((run.shape.keepalive)()),
            () = expiry => {
                run.ended = true;
                Err(ConnectError::new(Code::DeadlineExceeded, run.shape.late))
            }
        };
        Some((item, run))
    });
    stream_response(messages)
}

/// A process's events as Connect stream messages; an `unavailable` end when the sandbox
/// went away mid-stream.
fn process_stream(events: ProcessEvents, deadline: Option<Duration>) -> Response {
    let shape = LiveShape {
        first: None,
        keepalive: || json!({ "event": { "keepalive": {} } }),
        message: |event: ProcessEvent| {
            let last = matches!(event, ProcessEvent::End(_));
            (Ok(event_json(&event)), last)
        },
        gone: "the sandbox ended before the stream completed",
        late: "the call's deadline passed (the process keeps running)",
    };
    live_stream(events, deadline, shape)
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
    require_stream_media(headers)?;
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

pub(super) fn unimplemented(service: &str, method: &str) -> ConnectError {
    ConnectError::new(
        Code::Unimplemented,
        format!("{service}/{} is not served by omabox", shorten(method)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

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
