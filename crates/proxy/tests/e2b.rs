//! E2B's REST control plane over a fake [`SandboxService`]: the operator key in `X-API-Key`
//! gates every route (401 in E2B's error shape), shapes and statuses are the spec's, bad
//! input is a 400 naming the cause, and the access token appears only where E2B returns it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use common::{MemoryTokens, MemoryVault};
use omabox_contract::SecretString;
use omabox_proxy::e2b::{
    CreatedSandbox, LogLevel, NetworkUpdate, NewSandbox, SandboxInfo, SandboxLogEntry,
    SandboxMetrics, SandboxService, SandboxServiceError,
};
use omabox_proxy::templates::{
    BuildLogEntry, BuildState, BuildStatus, FileSlot, TemplateBuildInfo, TemplateBuildRequest,
    TemplateBuildSpec, TemplateBuildTicket, TemplateInfo, TemplateService, TemplateTag,
};
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig, router};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tower::ServiceExt as _;

const KEY: &str = "operator-KEY-e2b";
const TOKEN: &str = "access-token-of-the-fake";

/// Sandboxes in a map; ids `sb0`, `sb1`, ...
#[derive(Default)]
struct Fake {
    sandboxes: Mutex<BTreeMap<String, SandboxInfo>>,
    created: Mutex<Vec<NewSandbox>>,
    networks: Mutex<Vec<NetworkUpdate>>,
    builds: Option<Arc<FakeBuilds>>,
}

/// Template building that records what reached it.
#[derive(Default)]
struct FakeBuilds {
    uploaded: Mutex<Vec<usize>>,
    started: Mutex<Vec<TemplateBuildSpec>>,
    /// Tag calls, as (target or name, tags, assigned).
    tagged: Mutex<Vec<(String, Vec<String>, bool)>>,
}

/// The fake's one template, `known` (id `t0`), with one ready build `b0`.
fn known_template() -> TemplateInfo {
    TemplateInfo {
        template_id: "t0".into(),
        name: "known".into(),
        created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(60),
        updated_at: SystemTime::UNIX_EPOCH + Duration::from_secs(120),
        last_spawned_at: None,
        spawn_count: 3,
        cpu_count: 2,
        memory_mb: 512,
        builds: vec![TemplateBuildInfo {
            build_id: "b0".into(),
            state: BuildState::Ready,
            created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(60),
            finished_at: Some(SystemTime::UNIX_EPOCH + Duration::from_secs(120)),
        }],
    }
}

#[async_trait::async_trait]
impl TemplateService for FakeBuilds {
    async fn request_build(
        &self,
        request: TemplateBuildRequest,
    ) -> Result<TemplateBuildTicket, SandboxServiceError> {
        Ok(TemplateBuildTicket {
            template_id: "t0".into(),
            build_id: "b0".into(),
            name: request.name,
            tags: request.tags,
        })
    }
    fn file_slot(&self, _: &str, _: &str) -> Result<FileSlot, SandboxServiceError> {
        Ok(FileSlot {
            present: false,
            upload_token: Some(SecretString::new("upload-token-of-the-fake")),
        })
    }
    async fn upload_file(
        &self,
        _: &str,
        _: &str,
        token: &str,
        body: omabox_proxy::envd::UploadBody<'_>,
    ) -> Result<(), SandboxServiceError> {
        if token != "upload-token-of-the-fake" {
            return Err(SandboxServiceError::Unauthorized(
                "wrong upload token".into(),
            ));
        }
        let mut bytes = Vec::new();
        tokio::io::AsyncReadExt::read_to_end(body, &mut bytes)
            .await
            .map_err(|e| SandboxServiceError::BadRequest(e.to_string()))?;
        self.uploaded.lock().unwrap().push(bytes.len());
        Ok(())
    }
    async fn start_build(
        &self,
        _: &str,
        _: &str,
        spec: TemplateBuildSpec,
    ) -> Result<(), SandboxServiceError> {
        self.started.lock().unwrap().push(spec);
        Ok(())
    }
    fn template_id(&self, name: &str) -> Option<String> {
        (name == "known").then(|| "t0".to_owned())
    }
    fn list(&self) -> Vec<TemplateInfo> {
        vec![known_template()]
    }
    fn info(&self, id_or_name: &str) -> Result<TemplateInfo, SandboxServiceError> {
        match id_or_name {
            "t0" | "known" => Ok(known_template()),
            other => Err(SandboxServiceError::Missing(format!(
                "template {other:?} not found"
            ))),
        }
    }
    async fn delete(&self, id_or_name: &str) -> Result<bool, SandboxServiceError> {
        Ok(self.info(id_or_name).is_ok())
    }
    fn assign_tags(&self, target: &str, tags: &[String]) -> Result<String, SandboxServiceError> {
        self.tagged
            .lock()
            .unwrap()
            .push((target.to_owned(), tags.to_vec(), true));
        Ok("b0".into())
    }
    fn remove_tags(&self, name: &str, tags: &[String]) -> Result<(), SandboxServiceError> {
        self.tagged
            .lock()
            .unwrap()
            .push((name.to_owned(), tags.to_vec(), false));
        Ok(())
    }
    fn tags(&self, id_or_name: &str) -> Result<Vec<TemplateTag>, SandboxServiceError> {
        self.info(id_or_name)?;
        Ok(vec![TemplateTag {
            tag: "default".into(),
            build_id: "b0".into(),
            created_at: SystemTime::UNIX_EPOCH + Duration::from_secs(120),
        }])
    }
    fn build_status(&self, _: &str, _: &str) -> Result<BuildStatus, SandboxServiceError> {
        let log = (0..150)
            .map(|n| BuildLogEntry {
                timestamp: SystemTime::UNIX_EPOCH,
                level: if n == 149 {
                    LogLevel::Error
                } else {
                    LogLevel::Info
                },
                message: format!("line {n}"),
            })
            .collect();
        Ok(BuildStatus {
            state: BuildState::Error,
            log,
            reason: Some("step 2 failed".into()),
        })
    }
}

#[async_trait::async_trait]
impl SandboxService for Fake {
    async fn create(&self, request: NewSandbox) -> Result<CreatedSandbox, SandboxServiceError> {
        if request.template_id != "base" {
            return Err(SandboxServiceError::BadRequest("unknown template".into()));
        }
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + sandboxes.len() as u64);
        let info = SandboxInfo {
            sandbox_id: format!("sb{}", sandboxes.len()),
            template_id: request.template_id.clone(),
            started_at: now,
            end_at: now + request.timeout,
            metadata: request.metadata.clone(),
            cpu_count: 2,
            memory_mb: 512,
            disk_size_mb: 0,
            allow_internet_access: request.allow_internet_access,
            paused: false,
        };
        sandboxes.insert(info.sandbox_id.clone(), info.clone());
        self.created.lock().unwrap().push(request);
        Ok(CreatedSandbox {
            info,
            access_token: SecretString::new(TOKEN),
        })
    }
    fn list(&self) -> Vec<SandboxInfo> {
        self.sandboxes.lock().unwrap().values().cloned().collect()
    }
    fn get(&self, id: &str) -> Option<(SandboxInfo, SecretString)> {
        let info = self.sandboxes.lock().unwrap().get(id).cloned()?;
        Some((info, SecretString::new(TOKEN)))
    }
    async fn kill(&self, id: &str) -> Result<(), SandboxServiceError> {
        self.sandboxes
            .lock()
            .unwrap()
            .remove(id)
            .map(drop)
            .ok_or_else(|| SandboxServiceError::NotFound(id.into()))
    }
    fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), SandboxServiceError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let info = sandboxes
            .get_mut(id)
            .ok_or_else(|| SandboxServiceError::NotFound(id.into()))?;
        info.end_at = info.started_at + timeout;
        Ok(())
    }
    fn refresh(&self, id: &str, duration: Duration) -> Result<(), SandboxServiceError> {
        self.set_timeout(id, duration)
    }
    fn envd(
        &self,
        id: &str,
        token: &str,
    ) -> Result<Arc<dyn omabox_proxy::envd::SandboxEnvd>, SandboxServiceError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(SandboxServiceError::NotFound(id.into()));
        }
        if token != TOKEN {
            return Err(SandboxServiceError::Unauthorized("wrong token".into()));
        }
        Err(SandboxServiceError::Unavailable(
            "the fake runs no processes".into(),
        ))
    }
    async fn metrics(&self, id: &str) -> Result<SandboxMetrics, SandboxServiceError> {
        match self.sandboxes.lock().unwrap().get(id) {
            Some(info) if !info.paused => Ok(SandboxMetrics {
                timestamp: SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250),
                cpu_count: 2,
                cpu_used_pct: 12.5,
                mem_used: 3 << 20,
                mem_total: 512 << 20,
                mem_cache: 1 << 20,
                disk_used: 4096,
                disk_total: 32 << 20,
            }),
            _ => Err(SandboxServiceError::NotFound(id.into())),
        }
    }
    async fn update_network(
        &self,
        id: &str,
        update: NetworkUpdate,
    ) -> Result<(), SandboxServiceError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(SandboxServiceError::NotFound(id.into()));
        }
        self.networks.lock().unwrap().push(update);
        Ok(())
    }
    async fn pause(&self, id: &str, _keep_memory: bool) -> Result<bool, SandboxServiceError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let info = sandboxes
            .get_mut(id)
            .ok_or_else(|| SandboxServiceError::NotFound(id.into()))?;
        Ok(!std::mem::replace(&mut info.paused, true))
    }
    fn logs(&self, id: &str) -> Result<Vec<SandboxLogEntry>, SandboxServiceError> {
        if !self.sandboxes.lock().unwrap().contains_key(id) {
            return Err(SandboxServiceError::NotFound(id.into()));
        }
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        let entry = |ms, level, message: &str, event: &str| SandboxLogEntry {
            timestamp: at(ms),
            level,
            message: message.into(),
            fields: BTreeMap::from([("event".to_owned(), event.to_owned())]),
        };
        Ok(vec![
            entry(1_700_000_000_000, LogLevel::Info, "created", "created"),
            entry(
                1_700_000_001_000,
                LogLevel::Info,
                "process 7 started: ls",
                "process_start",
            ),
            entry(
                1_700_000_002_000,
                LogLevel::Warn,
                "process 7 exited with code 2",
                "process_end",
            ),
        ])
    }
    fn templates(&self) -> Option<Arc<dyn TemplateService>> {
        self.builds
            .clone()
            .map(|builds| builds as Arc<dyn TemplateService>)
    }
    async fn resume(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<Option<CreatedSandbox>, SandboxServiceError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        match sandboxes.get_mut(id) {
            Some(info) if info.paused => {
                info.paused = false;
                info.end_at = info.started_at + timeout;
                Ok(Some(CreatedSandbox {
                    info: info.clone(),
                    access_token: SecretString::new(TOKEN),
                }))
            }
            _ => Ok(None),
        }
    }
}

fn state(service: Option<Arc<Fake>>) -> ProxyState {
    let mut config = ServeConfig::default();
    config.limits.max_body_bytes = 4096;
    ProxyState::new(ProxyDeps {
        config,
        tokens: Arc::new(MemoryTokens::default()),
        vault: Arc::new(MemoryVault::default()),
        files: None,
        env: Default::default(),
        operator_key: SecretString::new(KEY),
        sandboxes: service.map(|s| s as Arc<dyn SandboxService>),
        runs: None,
    })
    .unwrap()
}

async fn call(
    state: &ProxyState,
    method: &str,
    path: &str,
    key: Option<&str>,
    body: Option<&str>,
) -> (StatusCode, axum::http::HeaderMap, Value) {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "localhost:8787");
    if let Some(key) = key {
        builder = builder.header("x-api-key", key);
    }
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    let request = builder
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
        .unwrap();
    let response = router(state.clone()).oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).unwrap_or_else(|_| panic!("not JSON: {bytes:?}"))
    };
    (status, headers, value)
}

fn assert_error(value: &Value, code: u16, needle: &str) {
    assert_eq!(value["code"], code, "{value}");
    let message = value["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
    assert!(!message.contains(TOKEN) && !message.contains(KEY));
}

#[tokio::test]
async fn every_route_needs_the_operator_key_in_x_api_key() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let routes = [
        ("POST", "/sandboxes", Some(r#"{"templateID":"base"}"#)),
        ("GET", "/sandboxes", None),
        ("GET", "/v2/sandboxes", None),
        ("GET", "/sandboxes/sb0", None),
        ("DELETE", "/sandboxes/sb0", None),
        ("POST", "/sandboxes/sb0/timeout", Some(r#"{"timeout":5}"#)),
        ("POST", "/sandboxes/sb0/refreshes", None),
        ("GET", "/sandboxes/sb0/metrics", None),
        ("GET", "/sandboxes/metrics?sandbox_ids=sb0", None),
        ("PUT", "/sandboxes/sb0/network", Some("{}")),
        ("POST", "/sandboxes/sb0/pause", None),
        ("POST", "/sandboxes/sb0/connect", None),
        ("POST", "/sandboxes/sb0/resume", None),
        ("GET", "/sandboxes/sb0/logs", None),
        ("GET", "/v2/sandboxes/sb0/logs", None),
        ("POST", "/v3/templates", Some(r#"{"name":"t"}"#)),
        ("GET", "/templates/t0/files/abc", None),
        ("POST", "/v2/templates/t0/builds/b0", Some("{}")),
        ("GET", "/templates/t0/builds/b0/status", None),
        ("GET", "/templates/t0/builds/b0/logs", None),
        ("GET", "/templates", None),
        ("GET", "/v2/templates", None),
        ("PATCH", "/templates/t0", Some(r#"{"public":false}"#)),
        ("PATCH", "/v2/templates/t0", Some(r#"{"public":false}"#)),
        ("GET", "/templates/t0", None),
        ("DELETE", "/templates/t0", None),
        ("GET", "/templates/t0/tags", None),
        (
            "POST",
            "/templates/tags",
            Some(r#"{"target":"known","tags":["x"]}"#),
        ),
        (
            "DELETE",
            "/templates/tags",
            Some(r#"{"name":"known","tags":["x"]}"#),
        ),
    ];
    for (method, path, body) in routes {
        for key in [None, Some("wrong"), Some("")] {
            let (status, headers, value) = call(&state, method, path, key, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} {key:?}");
            // Refused before its body was read: the connection ends, and says so (a
            // client reusing it would lose its next request).
            assert_eq!(
                headers.get("connection").map(|v| v.to_str().unwrap()),
                Some("close"),
                "{method} {path} {key:?}"
            );
            assert_error(
                &value,
                401,
                if key.is_none() { "missing" } else { "invalid" },
            );
        }
    }
    // A template upload carries its slot's token instead of the key; without one, 401.
    let (status, headers, value) =
        call(&state, "PUT", "/templates/t0/files/abc", None, Some("x")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_error(&value, 401, "missing X-Omabox-Upload-Token");
    assert_eq!(headers["connection"], "close");
    // With the key, a service that builds no templates says so.
    let (status, _, value) = call(
        &state,
        "POST",
        "/v3/templates",
        Some(KEY),
        Some(r#"{"name":"t"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&value, 400, "template building is not offered");
    // The operator key as a bearer is not E2B's scheme.
    let request = Request::get("/sandboxes")
        .header("host", "localhost")
        .header("authorization", format!("Bearer {KEY}"))
        .body(Body::empty())
        .unwrap();
    let response = router(state.clone()).oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert!(fake.created.lock().unwrap().is_empty());
    // With the key but no service: 503 in E2B's shape.
    let (status, _, value) = call(&self::state(None), "GET", "/sandboxes", Some(KEY), None).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_error(&value, 503, "no sandbox service");
}

#[tokio::test]
async fn create_get_list_timeout_kill_in_e2b_shapes() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let (status, _, created) = call(
        &state,
        "POST",
        "/sandboxes",
        Some(KEY),
        Some(
            r#"{"templateID":"base","timeout":60,"metadata":{"user":"abc"},"envVars":{"A":"1"},"secure":true,"allow_internet_access":true,"autoPause":false}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["sandboxID"], "sb0");
    assert_eq!(created["templateID"], "base");
    assert_eq!(created["envdAccessToken"], TOKEN);
    assert_eq!(created["clientID"], "omabox");
    assert!(created["envdVersion"].is_string());
    {
        let made = fake.created.lock().unwrap();
        assert_eq!(made[0].timeout, Duration::from_secs(60));
        assert_eq!(made[0].env_vars.get("A").map(String::as_str), Some("1"));
        assert_eq!(made[0].allow_internet_access, Some(true));
    }

    let (status, _, detail) = call(&state, "GET", "/sandboxes/sb0", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(detail["startedAt"], "1970-01-01T00:16:40.000Z");
    assert_eq!(detail["endAt"], "1970-01-01T00:17:40.000Z");
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["cpuCount"], 2);
    assert_eq!(detail["memoryMB"], 512);
    assert_eq!(detail["diskSizeMB"], 0);
    assert_eq!(detail["metadata"]["user"], "abc");
    assert_eq!(detail["envdAccessToken"], TOKEN);
    assert_eq!(detail["allowInternetAccess"], true);

    call(
        &state,
        "POST",
        "/sandboxes",
        Some(KEY),
        Some(r#"{"templateID":"base"}"#),
    )
    .await;
    let (_, _, listed) = call(&state, "GET", "/sandboxes", Some(KEY), None).await;
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert!(listed[0].get("envdAccessToken").is_none(), "{listed}");
    let (_, _, filtered) = call(
        &state,
        "GET",
        "/sandboxes?metadata=user%3Dabc",
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(filtered.as_array().unwrap().len(), 1);
    // v2: newest first, paged by X-Next-Token.
    let (status, headers, page) =
        call(&state, "GET", "/v2/sandboxes?limit=1", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page[0]["sandboxID"], "sb1");
    assert_eq!(headers["x-total-running"], "2");
    let next = headers["x-next-token"].to_str().unwrap().to_owned();
    let (_, headers, page) = call(
        &state,
        "GET",
        &format!("/v2/sandboxes?limit=1&nextToken={next}"),
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(page[0]["sandboxID"], "sb0");
    assert!(headers.get("x-next-token").is_none());
    let (_, _, paused) = call(&state, "GET", "/v2/sandboxes?state=paused", Some(KEY), None).await;
    assert_eq!(paused, Value::Array(vec![]));

    let (status, _, _) = call(
        &state,
        "POST",
        "/sandboxes/sb0/timeout",
        Some(KEY),
        Some(r#"{"timeout":120}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, _, detail) = call(&state, "GET", "/sandboxes/sb0", Some(KEY), None).await;
    assert_eq!(detail["endAt"], "1970-01-01T00:18:40.000Z");
    let (status, _, _) = call(&state, "POST", "/sandboxes/sb0/refreshes", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let (status, _, _) = call(&state, "DELETE", "/sandboxes/sb0", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, value) = call(&state, "DELETE", "/sandboxes/sb0", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&value, 404, "sandbox \"sb0\" not found");
    let (status, _, value) = call(&state, "GET", "/sandboxes/nope", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&value, 404, "not found");
    let (status, _, value) = call(
        &state,
        "POST",
        "/sandboxes/nope/timeout",
        Some(KEY),
        Some(r#"{"timeout":1}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&value, 404, "not found");
}

#[tokio::test]
async fn bad_input_is_a_400_naming_the_cause() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let huge = format!(
        r#"{{"templateID":"base","metadata":{{"a":"{}"}}}}"#,
        "x".repeat(5000)
    );
    let cases: [(&str, &str, &str, &str); 10] = [
        (
            "POST",
            "/sandboxes",
            r#"{"templateID":"base","timeout":-1}"#,
            "timeout must be between 0 and 86400",
        ),
        (
            "POST",
            "/sandboxes",
            r#"{"templateID":"base","timeout":99999999}"#,
            "timeout must be between",
        ),
        (
            "POST",
            "/sandboxes",
            r#"{"templateID":"base","timeout":"1"}"#,
            "not valid JSON",
        ),
        (
            "POST",
            "/sandboxes",
            r#"{"templateID":"other"}"#,
            "unknown template",
        ),
        ("POST", "/sandboxes", "not json", "not valid JSON"),
        ("POST", "/sandboxes", r#"{"timeout":5}"#, "templateID"),
        ("POST", "/sandboxes", &huge, "too large"),
        (
            "POST",
            "/sandboxes",
            r#"{"templateID":"base","autoPause":true}"#,
            "autoPause is not supported",
        ),
        (
            "POST",
            "/sandboxes/sb0/timeout",
            r#"{"timeout":-5}"#,
            "timeout must be between",
        ),
        (
            "POST",
            "/sandboxes/sb0/refreshes",
            r#"{"duration":3601}"#,
            "duration must be between 0 and 3600",
        ),
    ];
    for (method, path, body, needle) in cases {
        let (status, _, value) = call(&state, method, path, Some(KEY), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {value}");
        assert_error(&value, 400, needle);
    }
    let (status, _, value) = call(&state, "POST", "/sandboxes", Some(KEY), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&value, 400, "templateID is required");
    let (status, _, value) = call(&state, "GET", "/v2/sandboxes?limit=1000", Some(KEY), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&value, 400, "limit must be between 1 and 100");
    assert!(fake.created.lock().unwrap().is_empty());
}

#[tokio::test]
async fn an_id_that_is_not_utf8_is_a_401_before_the_key_and_an_e2b_400_after() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let routes = [
        ("GET", "/sandboxes/%ff%fe", None),
        ("DELETE", "/sandboxes/%ff", None),
        ("POST", "/sandboxes/%ff/timeout", Some(r#"{"timeout":5}"#)),
        ("POST", "/sandboxes/%c3/refreshes", None),
    ];
    for (method, path, body) in routes {
        let (status, _, value) = call(&state, method, path, None, body).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path}: {value}");
        assert_error(&value, 401, "missing");
        let (status, _, value) = call(&state, method, path, Some(KEY), body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {path}: {value}");
        assert_error(&value, 400, "sandbox id");
    }
}

#[tokio::test]
async fn a_body_error_echoes_at_most_a_short_piece_of_the_callers_text() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let long = "S".repeat(3000);
    for body in [
        format!(r#"{{"templateID":"base","timeout":"{long}"}}"#),
        format!(r#"{{"templateID":"base","timeout":"a\"{long}"}}"#),
        format!(r#"{{"templateID":"base","autoPause":"{long}"}}"#),
        format!(r#"{{"templateID":"base","{long}":1,"timeout":"x"}}"#),
    ] {
        let (status, _, value) = call(&state, "POST", "/sandboxes", Some(KEY), Some(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{value}");
        assert_error(&value, 400, "not valid JSON");
        let message = value["message"].as_str().unwrap();
        assert!(!message.contains(&"S".repeat(65)), "{message}");
        assert!(message.len() < 400, "{message}");
    }
    let (status, _, value) = call(
        &state,
        "POST",
        "/sandboxes/sb0/timeout",
        Some(KEY),
        Some(&format!(r#"{{"timeout":"{long}"}}"#)),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        !value["message"].as_str().unwrap().contains(&"S".repeat(65)),
        "{value}"
    );
    assert!(fake.created.lock().unwrap().is_empty());
}

#[test]
fn an_empty_operator_key_is_refused_so_an_empty_header_never_authorizes() {
    let deps = |key: &str| ProxyDeps {
        config: ServeConfig::default(),
        tokens: Arc::new(MemoryTokens::default()),
        vault: Arc::new(MemoryVault::default()),
        files: None,
        env: Default::default(),
        operator_key: SecretString::new(key),
        sandboxes: Some(Arc::new(Fake::default()) as Arc<dyn SandboxService>),
        runs: None,
    };
    for key in ["", " ", "\t"] {
        let Err(error) = ProxyState::new(deps(key)) else {
            panic!("the empty operator key {key:?} was accepted");
        };
        assert!(error.to_string().contains("operator key"), "{error}");
    }
    assert!(ProxyState::new(deps(KEY)).is_ok());
}

#[tokio::test]
async fn metrics_network_pause_and_resume_in_e2b_shapes() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let create = Some(r#"{"templateID":"base","timeout":60}"#);
    call(&state, "POST", "/sandboxes", Some(KEY), create).await;
    call(&state, "POST", "/sandboxes", Some(KEY), create).await;

    let (status, _, metrics) = call(&state, "GET", "/sandboxes/sb0/metrics", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{metrics}");
    assert_eq!(
        metrics,
        serde_json::json!([{
            "timestamp": "2023-11-14T22:13:20.250Z", "timestampUnix": 1_700_000_000u64,
            "cpuCount": 2, "cpuUsedPct": 12.5, "memUsed": 3 << 20, "memTotal": 512 << 20,
            "memCache": 1 << 20, "diskUsed": 4096, "diskTotal": 32 << 20,
        }])
    );
    let path = "/sandboxes/metrics?sandbox_ids=sb1,nosuch,sb0";
    let (status, _, many) = call(&state, "GET", path, Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{many}");
    let ids: Vec<&String> = many["sandboxes"].as_object().unwrap().keys().collect();
    assert_eq!(ids, ["sb0", "sb1"]);
    let too_many: Vec<String> = (0..101).map(|i| format!("s{i}")).collect();
    let path = format!("/sandboxes/metrics?sandbox_ids={}", too_many.join(","));
    let (status, _, error) = call(&state, "GET", &path, Some(KEY), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "more than 100");
    let (status, _, error) = call(&state, "GET", "/sandboxes/metrics", Some(KEY), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "sandbox_ids is required");

    let allow = Some(r#"{"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"]}"#);
    let (status, _, _) = call(&state, "PUT", "/sandboxes/sb0/network", Some(KEY), allow).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let bad = Some(r#"{"allowOut":["1.1.1.1"],"denyOut":["0.0.0.0/0"]}"#);
    let (status, _, error) = call(&state, "PUT", "/sandboxes/sb0/network", Some(KEY), bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "allowOut");
    let (status, _, _) = call(&state, "PUT", "/sandboxes/nope/network", Some(KEY), allow).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(
        *fake.networks.lock().unwrap(),
        [NetworkUpdate::Only(vec!["api.example.com".into()])]
    );

    let memory = Some(r#"{"memory":true}"#);
    let (status, _, error) = call(&state, "POST", "/sandboxes/sb0/pause", Some(KEY), memory).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "only filesystem pause is served");
    assert!(!fake.sandboxes.lock().unwrap()["sb0"].paused);
    let (status, _, _) = call(&state, "POST", "/sandboxes/sb0/pause", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, error) = call(&state, "POST", "/sandboxes/sb0/pause", Some(KEY), None).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_error(&error, 409, "already paused");
    let (_, _, detail) = call(&state, "GET", "/sandboxes/sb0", Some(KEY), None).await;
    assert_eq!(detail["state"], "paused");
    let (_, headers, paused) =
        call(&state, "GET", "/v2/sandboxes?state=paused", Some(KEY), None).await;
    assert_eq!(paused.as_array().unwrap().len(), 1, "{paused}");
    assert_eq!(paused[0]["sandboxID"], "sb0");
    assert!(headers.get("x-total-running").is_none());
    let (_, headers, both) = call(&state, "GET", "/v2/sandboxes", Some(KEY), None).await;
    assert_eq!(both.as_array().unwrap().len(), 2, "{both}");
    assert_eq!(headers["x-total-running"], "1");
    let (_, _, running) = call(&state, "GET", "/sandboxes", Some(KEY), None).await;
    assert_eq!(
        running.as_array().unwrap().len(),
        1,
        "v1 lists running ones: {running}"
    );
    let (status, _, resumed) =
        call(&state, "POST", "/sandboxes/sb0/connect", Some(KEY), None).await;
    assert_eq!(status, StatusCode::CREATED, "{resumed}");
    assert_eq!(resumed["sandboxID"], "sb0");
    assert_eq!(resumed["envdAccessToken"], TOKEN);
    let (status, _, _) = call(&state, "POST", "/sandboxes/sb0/connect", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "a running sandbox's connect");

    // The deprecated resume: 409 running, 201 paused, 404 unknown.
    let resume = Some(r#"{"timeout":30}"#);
    let (status, _, error) = call(&state, "POST", "/sandboxes/sb0/resume", Some(KEY), resume).await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_error(&error, 409, "already running");
    call(&state, "POST", "/sandboxes/sb0/pause", Some(KEY), None).await;
    let (status, _, resumed) =
        call(&state, "POST", "/sandboxes/sb0/resume", Some(KEY), resume).await;
    assert_eq!(status, StatusCode::CREATED, "{resumed}");
    assert_eq!(resumed["envdAccessToken"], TOKEN);
    let (status, _, _) = call(&state, "POST", "/sandboxes/nope/resume", Some(KEY), resume).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn sandbox_logs_in_e2b_shapes_v1_and_v2() {
    let fake = Arc::new(Fake::default());
    let state = state(Some(Arc::clone(&fake)));
    let create = Some(r#"{"templateID":"base","timeout":60}"#);
    call(&state, "POST", "/sandboxes", Some(KEY), create).await;

    let (status, _, v1) = call(&state, "GET", "/sandboxes/sb0/logs", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{v1}");
    assert_eq!(
        v1["logs"][0],
        serde_json::json!({"timestamp": "2023-11-14T22:13:20.000Z", "line": "created"})
    );
    assert_eq!(
        v1["logEntries"][2],
        serde_json::json!({
            "timestamp": "2023-11-14T22:13:22.000Z", "level": "warn",
            "message": "process 7 exited with code 2", "fields": {"event": "process_end"},
        })
    );
    let path = "/sandboxes/sb0/logs?start=1700000001000&limit=1";
    let (_, _, v1) = call(&state, "GET", path, Some(KEY), None).await;
    assert_eq!(v1["logs"].as_array().unwrap().len(), 1, "{v1}");
    assert_eq!(v1["logs"][0]["line"], "process 7 started: ls");

    let path = "/v2/sandboxes/sb0/logs?direction=backward&limit=2";
    let (status, _, v2) = call(&state, "GET", path, Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{v2}");
    let messages: Vec<&str> = v2["logs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        ["process 7 exited with code 2", "process 7 started: ls"]
    );
    let (_, _, warned) = call(
        &state,
        "GET",
        "/v2/sandboxes/sb0/logs?level=warn",
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(warned["logs"].as_array().unwrap().len(), 1, "{warned}");

    let (status, _, error) = call(
        &state,
        "GET",
        "/v2/sandboxes/sb0/logs?direction=sideways",
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "direction must be forward or backward");
    let (status, _, error) = call(&state, "GET", "/sandboxes/nope/logs", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&error, 404, "sandbox \"nope\" not found");
}

#[tokio::test]
async fn template_building_in_e2b_shapes_and_bounded() {
    let builds = Arc::new(FakeBuilds::default());
    let fake = Arc::new(Fake {
        builds: Some(Arc::clone(&builds)),
        ..Fake::default()
    });
    let state = state(Some(Arc::clone(&fake)));
    let body = Some(r#"{"name":"my-tpl","tags":["v1"]}"#);
    let (status, _, made) = call(&state, "POST", "/v3/templates", Some(KEY), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{made}");
    assert_eq!(
        made,
        serde_json::json!({"templateID": "t0", "buildID": "b0", "public": false,
            "names": ["my-tpl"], "aliases": ["my-tpl"], "tags": ["v1"]})
    );
    let bad = Some(r#"{"name":"no spaces please"}"#);
    let (status, _, error) = call(&state, "POST", "/v3/templates", Some(KEY), bad).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "must be 1 to 128 letters");

    // The upload slot: serve's own URL, the token in a header (not the URL).
    let (status, _, slot) = call(&state, "GET", "/templates/t0/files/abc1", Some(KEY), None).await;
    assert_eq!(status, StatusCode::CREATED, "{slot}");
    assert_eq!(slot["present"], false);
    assert_eq!(slot["url"], "http://localhost:8787/templates/t0/files/abc1");
    assert_eq!(
        slot["headers"]["x-omabox-upload-token"],
        "upload-token-of-the-fake"
    );
    let (status, _, error) = call(&state, "GET", "/templates/t0/files/a.b", Some(KEY), None).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "letters and digits");
    let upload = |body: Body, declared: Option<u64>| {
        let mut builder = Request::put("/templates/t0/files/abc1")
            .header("host", "localhost:8787")
            .header("x-omabox-upload-token", "upload-token-of-the-fake");
        if let Some(length) = declared {
            builder = builder.header("content-length", length);
        }
        router(state.clone()).oneshot(builder.body(body).unwrap())
    };
    let response = upload(Body::from("0123456789"), None).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(*builds.uploaded.lock().unwrap(), [10]);
    // Over 64 MiB: refused from its declared length, or as it streams past the cap.
    let response = upload(Body::from("x"), Some((64 << 20) + 1)).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let mib = axum::body::Bytes::from(vec![b'x'; 1 << 20]);
    let chunks = futures::stream::iter((0..65).map(move |_| Ok::<_, std::io::Error>(mib.clone())));
    let response = upload(Body::from_stream(chunks), None).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&bytes).contains("at most 64 MiB"));
    assert_eq!(
        builds.uploaded.lock().unwrap().len(),
        1,
        "nothing over the cap was stored"
    );

    // The build: steps passed on (filesHash kept); more than 256 refused.
    let start = r#"{"fromTemplate":"base","steps":[{"type":"COPY","args":["a","/b","",""],"filesHash":"abc1","force":false},{"type":"RUN","args":["true"]}],"force":false}"#;
    let (status, _, _) = call(
        &state,
        "POST",
        "/v2/templates/t0/builds/b0",
        Some(KEY),
        Some(start),
    )
    .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let started = builds.started.lock().unwrap()[0].clone();
    assert_eq!(started.from_template.as_deref(), Some("base"));
    assert_eq!(started.steps[0].files_hash.as_deref(), Some("abc1"));
    assert_eq!(started.steps[1].args, ["true"]);
    let many: Vec<String> = (0..257)
        .map(|_| r#"{"type":"RUN","args":["true"]}"#.to_owned())
        .collect();
    let many = format!(r#"{{"steps":[{}]}}"#, many.join(","));
    let mut config = ServeConfig::default();
    config.limits.max_body_bytes = 1 << 20;
    let roomy = ProxyState::new(ProxyDeps {
        config,
        tokens: Arc::new(MemoryTokens::default()),
        vault: Arc::new(MemoryVault::default()),
        files: None,
        env: Default::default(),
        operator_key: SecretString::new(KEY),
        sandboxes: Some(Arc::clone(&fake) as Arc<dyn SandboxService>),
        runs: None,
    })
    .unwrap();
    let (status, _, error) = call(
        &roomy,
        "POST",
        "/v2/templates/t0/builds/b0",
        Some(KEY),
        Some(&many),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "at most 256 steps");

    // Status: 100 log entries a call, from logsOffset; the reason of a failure.
    let path = "/templates/t0/builds/b0/status";
    let (status, _, first) = call(&state, "GET", path, Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    assert_eq!(first["status"], "error");
    assert_eq!(first["logEntries"].as_array().unwrap().len(), 100);
    assert_eq!(first["reason"]["message"], "step 2 failed");
    let (_, _, rest) = call(
        &state,
        "GET",
        &format!("{path}?logsOffset=100"),
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(rest["logEntries"].as_array().unwrap().len(), 50);
    assert_eq!(rest["logEntries"][49]["level"], "error");
    let (_, _, errors) = call(
        &state,
        "GET",
        &format!("{path}?level=error"),
        Some(KEY),
        None,
    )
    .await;
    assert_eq!(errors["logEntries"].as_array().unwrap().len(), 1);
    for (query, needle) in [("?level=fatal", "level"), ("?logsOffset=x", "logsOffset")] {
        let (status, _, error) =
            call(&state, "GET", &format!("{path}{query}"), Some(KEY), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_error(&error, 400, needle);
    }

    let (status, _, alias) = call(&state, "GET", "/templates/aliases/known", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(alias["templateID"], "t0");
    let (status, _, _) = call(&state, "GET", "/templates/aliases/unknown", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn built_templates_are_listed_tagged_and_deleted_in_e2b_shapes() {
    let builds = Arc::new(FakeBuilds::default());
    let fake = Arc::new(Fake {
        builds: Some(Arc::clone(&builds)),
        ..Fake::default()
    });
    let state = state(Some(Arc::clone(&fake)));
    // `NAME:TAG` is the name with the tag first among the tags (E2B's rule).
    let body = Some(r#"{"name":"my-tpl:v2","tags":["stable"]}"#);
    let (status, _, made) = call(&state, "POST", "/v3/templates", Some(KEY), body).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{made}");
    assert_eq!(made["names"], serde_json::json!(["my-tpl"]));
    assert_eq!(made["tags"], serde_json::json!(["v2", "stable"]));

    let (status, _, list) = call(&state, "GET", "/templates", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{list}");
    assert_eq!(
        list,
        serde_json::json!([{
            "templateID": "t0", "buildID": "b0", "cpuCount": 2, "memoryMB": 512,
            "diskSizeMB": 0, "public": false, "aliases": ["known"], "names": ["known"],
            "createdAt": "1970-01-01T00:01:00.000Z", "updatedAt": "1970-01-01T00:02:00.000Z",
            "createdBy": null, "lastSpawnedAt": null, "spawnCount": 3, "buildCount": 1,
            "envdVersion": omabox_proxy::envd::ENVD_VERSION, "buildStatus": "ready",
        }])
    );
    let (status, _, v2) = call(&state, "GET", "/v2/templates", Some(KEY), None).await;
    assert_eq!((status, &v2), (StatusCode::OK, &list));
    let (status, _, one) = call(&state, "GET", "/templates/known", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    assert_eq!(one["templateID"], "t0");
    assert_eq!(one["builds"][0]["buildID"], "b0");
    assert_eq!(one["builds"][0]["status"], "ready");
    assert_eq!(one["builds"][0]["finishedAt"], "1970-01-01T00:02:00.000Z");
    let (status, _, error) = call(&state, "GET", "/templates/nope", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&error, 404, "nope");

    let (status, _, tags) = call(&state, "GET", "/templates/t0/tags", Some(KEY), None).await;
    assert_eq!(status, StatusCode::OK, "{tags}");
    assert_eq!(
        tags,
        serde_json::json!([{"tag": "default", "buildID": "b0",
            "createdAt": "1970-01-01T00:02:00.000Z"}])
    );
    let assign = Some(r#"{"target":"known:default","tags":["prod","stable"]}"#);
    let (status, _, assigned) = call(&state, "POST", "/templates/tags", Some(KEY), assign).await;
    assert_eq!(status, StatusCode::CREATED, "{assigned}");
    assert_eq!(
        assigned,
        serde_json::json!({"tags": ["prod", "stable"], "buildID": "b0"})
    );
    let remove = Some(r#"{"name":"known","tags":["prod"]}"#);
    let (status, _, _) = call(&state, "DELETE", "/templates/tags", Some(KEY), remove).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        *builds.tagged.lock().unwrap(),
        [
            (
                "known:default".to_owned(),
                vec!["prod".to_owned(), "stable".to_owned()],
                true
            ),
            ("known".to_owned(), vec!["prod".to_owned()], false),
        ]
    );
    // Bad tag calls are refused before they reach the service.
    for (method, body, needle) in [
        ("POST", r#"{"tags":["x"]}"#, "target is required"),
        (
            "POST",
            r#"{"target":"known","tags":[]}"#,
            "at least one tag",
        ),
        (
            "POST",
            r#"{"target":"known","tags":["a b"]}"#,
            "tag \"a b\"",
        ),
        ("DELETE", r#"{"tags":["x"]}"#, "name is required"),
        ("DELETE", r#"{"name":"known"}"#, "at least one tag"),
    ] {
        let (status, _, error) =
            call(&state, method, "/templates/tags", Some(KEY), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{method} {body}");
        assert_error(&error, 400, needle);
    }
    let many: Vec<String> = (0..17).map(|n| format!("\"t{n}\"")).collect();
    let many = format!(r#"{{"target":"known","tags":[{}]}}"#, many.join(","));
    let (status, _, error) = call(&state, "POST", "/templates/tags", Some(KEY), Some(&many)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "at most 16 tags");
    assert_eq!(builds.tagged.lock().unwrap().len(), 2);

    // A build's log as `TemplateBuildLogsResponse`: 100 entries at most, as asked.
    let logs = |query: &'static str| {
        let state = state.clone();
        async move {
            let path = format!("/templates/t0/builds/b0/logs{query}");
            let (status, _, body) = call(&state, "GET", &path, Some(KEY), None).await;
            let messages: Vec<String> = body["logs"]
                .as_array()
                .map(|logs| {
                    let text = |entry: &Value| entry["message"].as_str().unwrap().to_owned();
                    logs.iter().map(text).collect()
                })
                .unwrap_or_default();
            (status, body, messages)
        }
    };
    let (status, body, messages) = logs("").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(messages.len(), 100);
    assert_eq!(
        body["logs"][0],
        serde_json::json!({"timestamp": "1970-01-01T00:00:00.000Z", "level": "info",
            "message": "line 0"})
    );
    let (_, _, messages) = logs("?direction=backward&limit=2&source=persistent").await;
    assert_eq!(messages, ["line 149", "line 148"]);
    let (_, _, messages) = logs("?level=error&cursor=0").await;
    assert_eq!(messages, ["line 149"]);
    for (query, needle) in [("?limit=101", "at most 100"), ("?source=disk", "source")] {
        let (status, body, _) = logs(query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}");
        assert_error(&body, 400, needle);
    }

    // An update: `public: false` (or nothing) is what a template here is; `true` is refused.
    for (path, body) in [
        ("/templates/known", r#"{"public":false}"#),
        ("/v2/templates/t0", "{}"),
    ] {
        let (status, _, answer) = call(&state, "PATCH", path, Some(KEY), Some(body)).await;
        assert_eq!(status, StatusCode::OK, "{path}: {answer}");
        if path.starts_with("/v2") {
            assert_eq!(answer, serde_json::json!({"names": ["known"]}));
        }
    }
    let public = Some(r#"{"public":true}"#);
    let (status, _, error) = call(&state, "PATCH", "/v2/templates/t0", Some(KEY), public).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_error(&error, 400, "public templates are not offered");
    let (status, _, error) = call(&state, "PATCH", "/templates/nope", Some(KEY), public).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&error, 404, "nope");

    // Delete: a built template (by name or id) is 204; anything else 404.
    let (status, _, _) = call(&state, "DELETE", "/templates/known", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _, error) = call(&state, "DELETE", "/templates/nope", Some(KEY), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&error, 404, "template \"nope\" not found");
}
