//! E2B's in-sandbox filesystem on serve's listener: `filesystem.Filesystem/*` over the
//! Connect protocol (stat, list, make dir, move, remove, watches) and the plain-HTTP
//! `GET`/`POST /files` and `GET /health`, with the shapes of E2B's `spec/envd`. The gate
//! (sandbox id, access token, user) is `envd.rs`'s.
//!
//! Must never: buffer an upload or a download whole, or accept an upload past
//! [`MAX_UPLOAD_BYTES`].

use super::connect::{
    Code, ConnectError, deadline, stream_error, stream_request, unary_request, unary_response,
};
use super::envd::{
    Gate, LiveShape, U32, connect_error, live_stream, sandbox_of, shorten, unimplemented, user_of,
};
use crate::e2b::rfc3339;
use crate::envd::{
    EntryInfo, EnvdError, FileType, FsEvent, FsEventKind, FsEvents, MAX_UPLOAD_BYTES, WatchOptions,
};
use crate::routes::header_str;
use crate::state::ProxyState;
use axum::body::{Body, Bytes};
use axum::extract::{Multipart, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header::CONTENT_TYPE};
use axum::response::{IntoResponse, Response};
use futures::{StreamExt as _, TryStreamExt as _};
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

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
    let mut body = json!({ "name": event.name, "type": kind });
    if let Some(entry) = &event.entry {
        body["entry"] = entry_json(entry);
    }
    body
}

/// A watch's events as Connect stream messages: a start, then one per change.
fn watch_stream(events: FsEvents, deadline: Option<Duration>) -> Response {
    let shape = LiveShape {
        first: Some(json!({ "start": {} })),
        keepalive: || json!({ "keepalive": {} }),
        message: |event: Result<FsEvent, EnvdError>| match event {
            Ok(event) => (Ok(json!({ "filesystem": fs_event_json(&event) })), false),
            Err(error) => (Err(connect_error(error)), true),
        },
        gone: "the watch ended",
        late: "the call's deadline passed",
    };
    live_stream(events, deadline, shape)
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct ListDirMsg {
    path: String,
    depth: Option<U32>,
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

/// A watch request's options; `allowNetworkMounts` (envd 0.6.4, beyond the announced
/// version: the SDKs refuse it first) is refused.
fn watch_options(request: &WatchMsg) -> Result<WatchOptions, ConnectError> {
    if request.allow_network_mounts {
        return Err(ConnectError::new(
            Code::Unimplemented,
            "allowNetworkMounts is not served: a sandbox has no network mounts",
        ));
    }
    Ok(WatchOptions {
        recursive: request.recursive,
        include_entry: request.include_entry,
    })
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
                let options = watch_options(&request)?;
                let events = sandbox
                    .watch_dir(&request.path, options, user)
                    .await
                    .map_err(connect_error)?;
                Ok(watch_stream(events, deadline(&headers)))
            }
            "CreateWatcher" => {
                let request: WatchMsg = unary_request(&headers, body, limit).await?;
                let options = watch_options(&request)?;
                let id = sandbox
                    .create_watcher(&request.path, options, user)
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

/// Bytes of a refused upload's body read (and dropped) before the refusal is sent: the
/// client of a small upload is still writing it, and a refusal sent at once (the
/// connection then closed) reached it as a broken pipe instead of the error (the Python
/// SDK's `files.write(..., metadata=...)` in CI).
const REFUSED_BODY_DRAIN: usize = 1 << 20;
/// How long that read may take.
const REFUSED_BODY_WAIT: Duration = Duration::from_secs(2);

/// Reads and drops at most [`REFUSED_BODY_DRAIN`] bytes of `body` within
/// [`REFUSED_BODY_WAIT`].
async fn drain(body: Body) {
    let mut stream = body.into_data_stream();
    let mut seen = 0usize;
    let _ = tokio::time::timeout(REFUSED_BODY_WAIT, async {
        while let Some(Ok(chunk)) = stream.next().await {
            seen += chunk.len();
            if seen > REFUSED_BODY_DRAIN {
                return;
            }
        }
    })
    .await;
}

/// An upload refused by its headers alone: an encoding or file metadata.
fn refused_by_headers(headers: &HeaderMap) -> Option<Gate> {
    let bad = |message: &str| Gate {
        status: StatusCode::BAD_REQUEST,
        message: message.to_owned(),
    };
    if header_str(headers, "content-encoding")
        .is_some_and(|e| !e.trim().eq_ignore_ascii_case("identity"))
    {
        return Some(bad(
            "encoded (gzip) uploads are not supported: send the bytes as they are",
        ));
    }
    if headers
        .keys()
        .any(|name| name.as_str().starts_with("x-metadata-"))
    {
        return Some(bad(
            "file metadata (X-Metadata-* headers) is not supported: upload without metadata",
        ));
    }
    None
}

/// `POST /files`: a multipart upload (each part's file name its path, or `path` for a
/// single part) or the raw bytes of `path`; answers the written files.
pub(crate) async fn upload(
    State(state): State<ProxyState>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    request: axum::extract::Request,
) -> Response {
    if let Err(gate) = sandbox_of(&state, &headers) {
        return gate.into_response();
    }
    if let Some(gate) = refused_by_headers(&headers) {
        drain(request.into_body()).await;
        return gate.into_response();
    }
    let result = async {
        let sandbox = sandbox_of(&state, &headers)?;
        let bad = |message: &str| Gate {
            status: StatusCode::BAD_REQUEST,
            message: message.to_owned(),
        };
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
}
