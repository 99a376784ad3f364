//! E2B's template building routes, as the SDKs' `Template.build` calls them (`spec/openapi.yml`
//! of e2b-dev/E2B): `POST /v3/templates` (202: a template and a build), `GET
//! /templates/{id}/files/{hash}` (201: whether a `COPY` step's files are there, and where to
//! upload them), `PUT /templates/{id}/files/{hash}` (serve's own upload URL: the archive,
//! streamed, with the slot's `X-Omabox-Upload-Token` instead of the operator key, as a
//! presigned URL would be), `POST /v2/templates/{id}/builds/{build}` (202: started; 400
//! naming a step omabox cannot honour) and `GET /templates/{id}/builds/{build}/status`
//! (`logsOffset`, `limit`, `level`), `GET /templates/{id}/builds/{build}/logs` (the same
//! log, selected as a v2 sandbox log is: `cursor`, `direction`, `level`), and `GET
//! /templates/aliases/{name}` (`Template.exists`). What is built is listed (`GET
//! /templates` and `/v2/templates`, `GET /templates/{id}` with its builds), removed
//! (`DELETE /templates/{id}`, which removes a snapshot of that id too), tagged (`POST|DELETE
//! /templates/tags`, `GET /templates/{id}/tags`: `Template.assign_tags`, `remove_tags`,
//! `get_tags`) and updated (`PATCH /templates/{id}` and `/v2/templates/{id}`: `public`,
//! which only `false` can be, see [`update_v1`]). Over [`SandboxService::templates`].
//!
//! Must never: put a token in a URL or an answer other than the file slot's; take an
//! upload past [`MAX_TEMPLATE_FILE_BYTES`]; answer more than [`MAX_STATUS_LOG_ENTRIES`]
//! log entries at once.

use super::e2b::{Answer, E2bError, authorize, json_body, shorten};
use super::e2b_logs::{LogQuery, LogRoute, level_param, number_param};
use crate::e2b::{LogLevel, SandboxServiceError, rfc3339};
use crate::envd::ENVD_VERSION;
use crate::routes::header_str;
use crate::state::ProxyState;
use crate::templates::{
    BuildLogEntry, MAX_STATUS_LOG_ENTRIES, MAX_TEMPLATE_FILE_BYTES, MAX_TEMPLATE_STEPS,
    TemplateBuildRequest, TemplateBuildSpec, TemplateInfo, TemplateService, TemplateStep,
};
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::IntoResponse;
use futures::StreamExt as _;
use serde::Deserialize;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The header an upload carries its slot's token in.
const UPLOAD_TOKEN_HEADER: &str = "x-omabox-upload-token";
/// Bytes of a template name or tag.
const MAX_NAME_BYTES: usize = 128;
/// Tags one build may get.
const MAX_TAGS: usize = 16;
/// Arguments one step may have, and bytes of one argument.
const MAX_STEP_ARGS: usize = 64;
const MAX_ARG_BYTES: usize = 16 * 1024;

fn service(state: &ProxyState, headers: &HeaderMap) -> Result<Arc<dyn TemplateService>, E2bError> {
    authorize(state, headers)?
        .templates()
        .ok_or_else(|| E2bError::bad_request("template building is not offered by this server"))
}

/// A text of the path: UTF-8 (else 400, after the key matched).
fn segments<T>(path: Result<Path<T>, PathRejection>) -> Result<T, E2bError> {
    path.map(|Path(segments)| segments)
        .map_err(|_| E2bError::bad_request("the path is not UTF-8 text"))
}

fn not_found(error: SandboxServiceError) -> E2bError {
    error.into()
}

/// A name or tag: 1–128 bytes of letters, digits, `-`, `_`, `.`, `/`.
fn check_name(what: &str, name: &str) -> Result<(), E2bError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if ok {
        Ok(())
    } else {
        Err(E2bError::bad_request(format!(
            "{what} {:?} must be 1 to {MAX_NAME_BYTES} letters, digits, '-', '_', '.' or '/'",
            shorten(name)
        )))
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct BuildRequestBody {
    name: Option<String>,
    alias: Option<String>,
    tags: Option<Vec<String>>,
}

/// `POST /v3/templates` → 202 `TemplateRequestResponseV3`.
pub(crate) async fn request_build(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let service = service(&state, &headers)?;
    let body: BuildRequestBody = json_body(&state, &headers, body).await?.unwrap_or_default();
    let given = body
        .name
        .or(body.alias)
        .ok_or_else(|| E2bError::bad_request("name is required"))?;
    // `NAME:TAG` counts as `NAME` with the tag among `tags` (E2B's rule).
    let (name, tag) = match given.rsplit_once(':') {
        Some((name, tag)) => (name.to_owned(), Some(tag.to_owned())),
        None => (given, None),
    };
    check_name("name", &name)?;
    let mut tags = body.tags.unwrap_or_default();
    if let Some(tag) = tag
        && !tags.contains(&tag)
    {
        tags.insert(0, tag);
    }
    check_tags(&tags)?;
    let ticket = service
        .request_build(TemplateBuildRequest { name, tags })
        .await?;
    let body = json!({
        "templateID": ticket.template_id,
        "buildID": ticket.build_id,
        "public": false,
        "names": [ticket.name],
        "aliases": [ticket.name],
        "tags": ticket.tags,
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

/// 1 to [`MAX_TAGS`] tags, each a valid name.
fn check_tags(tags: &[String]) -> Result<(), E2bError> {
    if tags.len() > MAX_TAGS {
        return Err(E2bError::bad_request(format!(
            "at most {MAX_TAGS} tags at once"
        )));
    }
    tags.iter().try_for_each(|tag| check_name("tag", tag))
}

/// The file hash of a path: 1–128 letters and digits (the SDK's is SHA-256 hex).
fn check_hash(hash: &str) -> Result<(), E2bError> {
    if hash.is_empty() || hash.len() > 128 || !hash.chars().all(|c| c.is_ascii_alphanumeric()) {
        return Err(E2bError::bad_request(format!(
            "files hash {:?} must be 1 to 128 letters and digits",
            shorten(hash)
        )));
    }
    Ok(())
}

/// serve's own URL as the caller reached it (the Host rule admitted that host).
fn own_url(state: &ProxyState, headers: &HeaderMap) -> String {
    if let Some(public) = &state.inner.config.public_url {
        return public.trim_end_matches('/').to_owned();
    }
    let host = header_str(headers, "host").unwrap_or("127.0.0.1");
    format!("http://{host}")
}

/// `GET /templates/{id}/files/{hash}` → 201 `TemplateBuildFileUpload`.
pub(crate) async fn file_slot(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Answer {
    let service = service(&state, &headers)?;
    let (template_id, hash) = segments(path)?;
    check_hash(&hash)?;
    let slot = service.file_slot(&template_id, &hash).map_err(not_found)?;
    let mut body = json!({ "present": slot.present });
    if let Some(token) = slot.upload_token {
        let url = format!(
            "{}/templates/{}/files/{hash}",
            own_url(&state, &headers),
            url::form_urlencoded::byte_serialize(template_id.as_bytes()).collect::<String>()
        );
        body["url"] = json!(url);
        body["headers"] = json!({ UPLOAD_TOKEN_HEADER: token.expose() });
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `PUT /templates/{id}/files/{hash}`: the upload (no operator key: the slot's token).
pub(crate) async fn upload(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Answer {
    let token = header_str(&headers, UPLOAD_TOKEN_HEADER).unwrap_or_default();
    if token.is_empty() {
        return Err(E2bError::new(
            StatusCode::UNAUTHORIZED,
            "missing X-Omabox-Upload-Token (from GET /templates/{id}/files/{hash})",
        ));
    }
    let service = state
        .inner
        .sandboxes
        .clone()
        .and_then(|s| s.templates())
        .ok_or_else(|| E2bError::bad_request("template building is not offered by this server"))?;
    let (template_id, hash) = segments(path)?;
    check_hash(&hash)?;
    if header_str(&headers, "content-length")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .is_some_and(|declared| declared > MAX_TEMPLATE_FILE_BYTES)
    {
        return Err(too_large());
    }
    let over = Arc::new(AtomicBool::new(false));
    let seen = AtomicU64::new(0);
    let flag = Arc::clone(&over);
    let stream = body.into_data_stream().map(move |chunk| {
        let chunk = chunk.map_err(std::io::Error::other)?;
        let total = seen.fetch_add(chunk.len() as u64, Ordering::Relaxed) + chunk.len() as u64;
        if total > MAX_TEMPLATE_FILE_BYTES {
            flag.store(true, Ordering::Relaxed);
            return Err(std::io::Error::other("upload too large"));
        }
        Ok(chunk)
    });
    let mut reader = tokio_util::io::StreamReader::new(Box::pin(stream));
    let stored = service
        .upload_file(&template_id, &hash, token, &mut reader)
        .await;
    if over.load(Ordering::Relaxed) {
        return Err(too_large());
    }
    stored?;
    Ok(StatusCode::OK.into_response())
}

fn too_large() -> E2bError {
    E2bError::bad_request(format!(
        "a template file upload may hold at most {} MiB",
        MAX_TEMPLATE_FILE_BYTES >> 20
    ))
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct StepBody {
    #[serde(rename = "type")]
    kind: String,
    args: Option<Vec<String>>,
    files_hash: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct BuildStartBody {
    from_image: Option<String>,
    from_template: Option<String>,
    from_image_registry: Option<Value>,
    steps: Option<Vec<StepBody>>,
    start_cmd: Option<String>,
    ready_cmd: Option<String>,
}

/// `POST /v2/templates/{id}/builds/{build}` → 202.
pub(crate) async fn start_build(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    body: Body,
) -> Answer {
    let service = service(&state, &headers)?;
    let (template_id, build_id) = segments(path)?;
    let body: BuildStartBody = json_body(&state, &headers, body).await?.unwrap_or_default();
    let steps = body.steps.unwrap_or_default();
    if steps.len() > MAX_TEMPLATE_STEPS {
        return Err(E2bError::bad_request(format!(
            "a build may have at most {MAX_TEMPLATE_STEPS} steps"
        )));
    }
    let mut checked = Vec::with_capacity(steps.len());
    for (index, step) in steps.into_iter().enumerate() {
        let args = step.args.unwrap_or_default();
        if args.len() > MAX_STEP_ARGS || args.iter().any(|a| a.len() > MAX_ARG_BYTES) {
            return Err(E2bError::bad_request(format!(
                "step {} has more than {MAX_STEP_ARGS} arguments or one over {MAX_ARG_BYTES} bytes",
                index + 1
            )));
        }
        checked.push(TemplateStep {
            kind: step.kind,
            args,
            files_hash: step.files_hash,
        });
    }
    let spec = TemplateBuildSpec {
        from_image: body.from_image,
        from_template: body.from_template,
        registry_credentials: body.from_image_registry.is_some_and(|v| !v.is_null()),
        steps: checked,
        start_cmd: body.start_cmd,
        ready_cmd: body.ready_cmd,
    };
    service.start_build(&template_id, &build_id, spec).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `GET /templates/{id}/builds/{build}/status` → 200 `TemplateBuildInfo`.
pub(crate) async fn build_status(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Answer {
    let service = service(&state, &headers)?;
    let (template_id, build_id) = segments(path)?;
    let (mut offset, mut limit, mut level) = (0usize, MAX_STATUS_LOG_ENTRIES, LogLevel::Debug);
    for (key, value) in url::form_urlencoded::parse(uri.query().unwrap_or_default().as_bytes()) {
        let number =
            || number_param(&key, &value).map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        match key.as_ref() {
            "logsOffset" => offset = number()?,
            "limit" => limit = number()?.min(MAX_STATUS_LOG_ENTRIES),
            "level" => level = level_param(&value)?,
            _ => {}
        }
    }
    let status = service
        .build_status(&template_id, &build_id)
        .map_err(not_found)?;
    let entries: Vec<Value> = status
        .log
        .iter()
        .filter(|entry| entry.level >= level)
        .skip(offset)
        .take(limit)
        .map(build_log_entry)
        .collect();
    let lines: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!(format!(
                "{} {}",
                e["timestamp"].as_str().unwrap_or(""),
                e["message"].as_str().unwrap_or("")
            ))
        })
        .collect();
    let mut body = json!({
        "templateID": template_id,
        "buildID": build_id,
        "status": status.state.as_str(),
        "logEntries": entries,
        "logs": lines,
    });
    if let Some(reason) = status.reason {
        body["reason"] = json!({ "message": reason });
    }
    Ok(Json(body).into_response())
}

/// `GET /templates/{id}/builds/{build}/logs` → 200 `TemplateBuildLogsResponse`: the build's
/// log (what `status` shows), at most 100 entries (`cursor` in ms since the epoch,
/// `direction`, `level`; `source` may be either of E2B's: serve keeps one log).
pub(crate) async fn build_logs(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
    uri: Uri,
) -> Answer {
    let service = service(&state, &headers)?;
    let (template_id, build_id) = segments(path)?;
    let query = LogQuery::parse(uri.query().unwrap_or_default(), LogRoute::Build)?;
    let status = service
        .build_status(&template_id, &build_id)
        .map_err(not_found)?;
    let logs: Vec<Value> = query
        .select(status.log)
        .iter()
        .map(build_log_entry)
        .collect();
    Ok(Json(json!({ "logs": logs })).into_response())
}

/// `BuildLogEntry`, as both of a build's log routes answer it.
fn build_log_entry(entry: &BuildLogEntry) -> Value {
    json!({
        "timestamp": rfc3339(entry.timestamp),
        "level": entry.level.as_str(),
        "message": entry.message,
    })
}

/// `GET /templates/aliases/{name}` → 200 `TemplateAliasResponse`; 404 when no template has
/// the name.
pub(crate) async fn alias(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = service(&state, &headers)?;
    let name = segments(path)?;
    match service.template_id(&name) {
        Some(id) => Ok(Json(json!({ "templateID": id, "public": false })).into_response()),
        None => Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!("template {:?} not found", shorten(&name)),
        )),
    }
}

/// `Template` (`GET /templates`), and with `builds`, `TemplateWithBuilds`.
fn template_body(info: &TemplateInfo, with_builds: bool) -> Value {
    let last_ready = info
        .builds
        .iter()
        .find(|build| build.state == crate::templates::BuildState::Ready);
    let mut body = json!({
        "templateID": info.template_id,
        "buildID": last_ready.map_or("", |build| build.build_id.as_str()),
        "cpuCount": info.cpu_count,
        "memoryMB": info.memory_mb,
        "diskSizeMB": 0,
        "public": false,
        "aliases": [info.name],
        "names": [info.name],
        "createdAt": rfc3339(info.created_at),
        "updatedAt": rfc3339(info.updated_at),
        "createdBy": null,
        "lastSpawnedAt": info.last_spawned_at.map(rfc3339),
        "spawnCount": info.spawn_count,
        "buildCount": info.builds.len(),
        "envdVersion": ENVD_VERSION,
        "buildStatus": info.builds.first().map_or("waiting", |build| build.state.as_str()),
    });
    if with_builds {
        body["builds"] = info
            .builds
            .iter()
            .map(|build| {
                let mut entry = json!({
                    "buildID": build.build_id,
                    "status": build.state.as_str(),
                    "createdAt": rfc3339(build.created_at),
                    "updatedAt": rfc3339(build.finished_at.unwrap_or(build.created_at)),
                    "cpuCount": info.cpu_count,
                    "memoryMB": info.memory_mb,
                    "envdVersion": ENVD_VERSION,
                });
                if let Some(finished) = build.finished_at {
                    entry["finishedAt"] = json!(rfc3339(finished));
                }
                entry
            })
            .collect();
    }
    body
}

/// `GET /templates` and `GET /v2/templates` → 200 `[Template]`, all in one page (serve keeps
/// few: no `x-next-token`).
pub(crate) async fn list(State(state): State<ProxyState>, headers: HeaderMap) -> Answer {
    let service = service(&state, &headers)?;
    let templates: Vec<Value> = service
        .list()
        .iter()
        .map(|info| template_body(info, false))
        .collect();
    Ok(Json(templates).into_response())
}

/// `GET /templates/{id}` → 200 `TemplateWithBuilds` (its id or name); 404 when none.
pub(crate) async fn get(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = service(&state, &headers)?;
    let id = segments(path)?;
    let info = service.info(&id).map_err(not_found)?;
    Ok(Json(template_body(&info, true)).into_response())
}

/// `DELETE /templates/{id}` → 204 when `id` (an id or name) is a snapshot or a built
/// template, removed; 404 otherwise. Sandboxes started from it run on.
pub(crate) async fn delete(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer {
    let sandboxes = authorize(&state, &headers)?;
    let id = segments(path)?;
    if sandboxes.delete_snapshot(&id).await? {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    if let Some(templates) = sandboxes.templates()
        && templates.delete(&id).await?
    {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    Err(E2bError::new(
        StatusCode::NOT_FOUND,
        format!("template {:?} not found", shorten(&id)),
    ))
}

/// `TemplateUpdateRequest`.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TemplateUpdate {
    public: Option<bool>,
}

/// The update both `PATCH` routes make: none, for a template that exists, or a 400 for
/// `public: true`. A template of serve is used only with serve's one key: there is no other
/// team to make it public to, and saying it was made public would be a lie.
async fn update(
    state: &ProxyState,
    headers: &HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Result<TemplateInfo, E2bError> {
    let service = service(state, headers)?;
    let id = segments(path)?;
    let update: TemplateUpdate = json_body(state, headers, body).await?.unwrap_or_default();
    let info = service.info(&id).map_err(not_found)?;
    if update.public == Some(true) {
        return Err(E2bError::bad_request(
            "public templates are not offered by this server: its templates are used with its own key only",
        ));
    }
    Ok(info)
}

/// `PATCH /templates/{id}` `{"public"?}` → 200 (see [`update`]).
pub(crate) async fn update_v1(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    update(&state, &headers, path, body).await?;
    Ok(StatusCode::OK.into_response())
}

/// `PATCH /v2/templates/{id}` `{"public"?}` → 200 `TemplateUpdateResponse` (its names).
pub(crate) async fn update_v2(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    body: Body,
) -> Answer {
    let info = update(&state, &headers, path, body).await?;
    Ok(Json(json!({ "names": [info.name] })).into_response())
}

/// The body of both tag calls: `target` (assign) or `name` (remove), and the tags.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct TagsBody {
    target: Option<String>,
    name: Option<String>,
    tags: Option<Vec<String>>,
}

/// A tag call's body: its `field` (`target` or `name`, required) and 1 to [`MAX_TAGS`] valid
/// tags.
async fn tags_body(
    state: &ProxyState,
    headers: &HeaderMap,
    body: Body,
    field: &str,
) -> Result<(String, Vec<String>), E2bError> {
    let body: TagsBody = json_body(state, headers, body).await?.unwrap_or_default();
    let named = match field {
        "target" => body.target,
        _ => body.name,
    };
    let named = named.ok_or_else(|| E2bError::bad_request(format!("{field} is required")))?;
    let tags = body.tags.unwrap_or_default();
    if tags.is_empty() {
        return Err(E2bError::bad_request("tags must name at least one tag"));
    }
    check_tags(&tags)?;
    Ok((named, tags))
}

/// `POST /templates/tags` `{"target": "NAME:TAG", "tags": [...]}` → 201
/// `AssignedTemplateTags`.
pub(crate) async fn assign_tags(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let service = service(&state, &headers)?;
    let (target, tags) = tags_body(&state, &headers, body, "target").await?;
    let build_id = service.assign_tags(&target, &tags).map_err(not_found)?;
    Ok((
        StatusCode::CREATED,
        Json(json!({ "tags": tags, "buildID": build_id })),
    )
        .into_response())
}

/// `DELETE /templates/tags` `{"name": NAME, "tags": [...]}` → 204.
pub(crate) async fn remove_tags(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let service = service(&state, &headers)?;
    let (name, tags) = tags_body(&state, &headers, body, "name").await?;
    service.remove_tags(&name, &tags).map_err(not_found)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /templates/{id}/tags` → 200 `[TemplateTag]`.
pub(crate) async fn tags(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Answer {
    let service = service(&state, &headers)?;
    let id = segments(path)?;
    let tags: Vec<Value> = service
        .tags(&id)
        .map_err(not_found)?
        .into_iter()
        .map(|tag| {
            json!({
                "tag": tag.tag,
                "buildID": tag.build_id,
                "createdAt": rfc3339(tag.created_at),
            })
        })
        .collect();
    Ok(Json(tags).into_response())
}
