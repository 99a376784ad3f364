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
    CreatedSandbox, NetworkUpdate, NewSandbox, SandboxInfo, SandboxMetrics, SandboxService,
    SandboxServiceError,
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
    async fn pause(&self, id: &str) -> Result<bool, SandboxServiceError> {
        let mut sandboxes = self.sandboxes.lock().unwrap();
        let info = sandboxes
            .get_mut(id)
            .ok_or_else(|| SandboxServiceError::NotFound(id.into()))?;
        Ok(!std::mem::replace(&mut info.paused, true))
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
    ];
    for (method, path, body) in routes {
        for key in [None, Some("wrong"), Some("")] {
            let (status, _, value) = call(&state, method, path, key, body).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{method} {path} {key:?}");
            assert_error(
                &value,
                401,
                if key.is_none() { "missing" } else { "invalid" },
            );
        }
    }
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
