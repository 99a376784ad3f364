//! Shared fixtures: in-memory token and vault ports, a loopback upstream stub that records
//! every request and streams SSE with a hold before its last events, a proxy on a real
//! socket, a TRACE log capture, and the Python SDK venv.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

pub mod escape;
pub mod python;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use omabox_contract::{
    IssueSessionTokenInput, PortError, RuntimeResourceScope, SecretString, SessionTokenClaims,
    SessionTokenPort, VaultSecretPort,
};
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use tokio::sync::Semaphore;

/// Session tokens in memory (until the store's twin lands).
#[derive(Debug, Default)]
pub struct MemoryTokens {
    tokens: Mutex<BTreeMap<String, SessionTokenClaims>>,
}

impl MemoryTokens {
    /// Registers `token` for `session_id`.
    pub fn insert(&self, token: &str, session_id: &str) {
        self.tokens.lock().unwrap().insert(
            token.to_owned(),
            SessionTokenClaims {
                scope: RuntimeResourceScope::new("local", "default", session_id, "main"),
                generation: 1,
                expires_at: "2999-01-01T00:00:00.000Z".to_owned(),
            },
        );
    }

    /// Forgets `token`.
    pub fn remove(&self, token: &str) {
        self.tokens.lock().unwrap().remove(token);
    }
}

#[async_trait]
impl SessionTokenPort for MemoryTokens {
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        let token = format!("tok-{}-{}", input.scope.session_id, input.generation);
        self.insert(&token, &input.scope.session_id);
        Ok(SecretString::new(token))
    }

    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        Ok(self.tokens.lock().unwrap().get(token).cloned())
    }

    async fn revoke(
        &self,
        scope: &RuntimeResourceScope,
        _generation: u64,
    ) -> Result<(), PortError> {
        self.tokens
            .lock()
            .unwrap()
            .retain(|_, claims| claims.scope != *scope);
        Ok(())
    }

    async fn extend(&self, _: &RuntimeResourceScope, _: u64, _: u64) -> Result<(), PortError> {
        Ok(())
    }
}

/// A vault in memory.
#[derive(Debug, Default)]
pub struct MemoryVault {
    secrets: Mutex<BTreeMap<String, String>>,
}

#[async_trait]
impl VaultSecretPort for MemoryVault {
    async fn get(&self, name: &str) -> Result<Option<SecretString>, PortError> {
        Ok(self
            .secrets
            .lock()
            .unwrap()
            .get(name)
            .map(SecretString::new))
    }
    async fn put(&self, name: &str, value: SecretString) -> Result<(), PortError> {
        self.secrets
            .lock()
            .unwrap()
            .insert(name.to_owned(), value.expose().to_owned());
        Ok(())
    }
    async fn delete(&self, name: &str) -> Result<(), PortError> {
        self.secrets.lock().unwrap().remove(name);
        Ok(())
    }
    async fn names(&self) -> Result<Vec<String>, PortError> {
        Ok(self.secrets.lock().unwrap().keys().cloned().collect())
    }
}

/// One request the stub received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path_and_query: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

/// The upstream stub.
#[derive(Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub recorded: Arc<Mutex<Vec<Recorded>>>,
    release: Arc<Semaphore>,
}

impl Upstream {
    /// `http://127.0.0.1:PORT`.
    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }
    /// Lets one held stream send its last events.
    pub fn release(&self) {
        self.release.add_permits(1);
    }
    /// Everything received so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.recorded.lock().unwrap().clone()
    }
}

const ANTHROPIC_FIRST: &[&str] = &[
    "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[],\"model\":\"stub\",\"stop_reason\":null,\"stop_sequence\":null,\"usage\":{\"input_tokens\":1,\"output_tokens\":1}}}\n\n",
    "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hello\"}}\n\n",
];
const ANTHROPIC_REST: &[&str] = &[
    "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\" world\"}}\n\n",
    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
    "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":2}}\n\n",
    "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
];
const OPENAI_FIRST: &[&str] = &[
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"stub\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
];
const OPENAI_REST: &[&str] = &[
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"stub\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" world\"},\"finish_reason\":null}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"stub\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: [DONE]\n\n",
];

/// Starts the stub: `/v1/messages` and `/v1/chat/completions` stream SSE and hold their
/// last events until [`Upstream::release`]; `/redirect` answers 302; `/mcp` streams one SSE
/// event; `/fast` answers a small JSON at once; anything else echoes 200.
pub async fn start_upstream() -> Upstream {
    let upstream = Upstream {
        addr: "127.0.0.1:0".parse().unwrap(),
        recorded: Arc::default(),
        release: Arc::new(Semaphore::new(0)),
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        ..upstream
    };
    let app = Router::new().fallback(stub).with_state(upstream.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    upstream
}

async fn stub(State(upstream): State<Upstream>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    upstream.recorded.lock().unwrap().push(Recorded {
        method: parts.method.to_string(),
        path_and_query: parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_owned())
            .unwrap_or_default(),
        headers: parts.headers,
        body: body.to_vec(),
    });
    let held = |first: &'static [&'static str], rest: &'static [&'static str]| {
        let release = Arc::clone(&upstream.release);
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<String, std::io::Error>>(8);
        tokio::spawn(async move {
            for event in first {
                let _ = tx.send(Ok((*event).to_owned())).await;
            }
            let Ok(permit) = release.acquire().await else {
                return;
            };
            permit.forget();
            for event in rest {
                let _ = tx.send(Ok((*event).to_owned())).await;
            }
        });
        let stream = tokio_stream_from(rx);
        (
            [
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
            ],
            Body::from_stream(stream),
        )
            .into_response()
    };
    match path.as_str() {
        "/v1/messages" => held(ANTHROPIC_FIRST, ANTHROPIC_REST),
        "/v1/chat/completions" => held(OPENAI_FIRST, OPENAI_REST),
        "/redirect" => (
            StatusCode::FOUND,
            [("location", "http://127.0.0.1:9/elsewhere")],
        )
            .into_response(),
        "/mcp" => (
            [
                ("content-type", "text/event-stream"),
                ("mcp-session-id", "m1"),
            ],
            "event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{}}\n\n",
        )
            .into_response(),
        "/fast" => ([("content-type", "application/json")], "{\"ok\":true}").into_response(),
        _ => (StatusCode::OK, body).into_response(),
    }
}

fn tokio_stream_from(
    mut rx: tokio::sync::mpsc::Receiver<Result<String, std::io::Error>>,
) -> impl futures::Stream<Item = Result<String, std::io::Error>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The secrets a standard fixture uses; none may ever reach a log line.
pub const ANTHROPIC_UPSTREAM_KEY: &str = "sk-ant-UPSTREAM-0123456789";
pub const OPENAI_UPSTREAM_KEY: &str = "sk-oai-UPSTREAM-9876543210";
pub const MCP_VAULT_SECRET: &str = "mcp-VAULT-SECRET-55555";

/// The standard fixture's configuration: a default anthropic card (key in the vault), an
/// openai card for `sess-oai` (key in env), a card whose key is missing for `sess-none`, a
/// deepseek card with explicit endpoints, and one MCP server.
pub fn standard_config(upstream: &Upstream) -> ServeConfig {
    let base = upstream.base();
    ServeConfig::from_json(&format!(
        r#"{{
          "models": {{
            "default": {{ "provider": "anthropic", "base_url": "{base}", "api_key_vault": "anthropic-key",
                          "custom_headers": {{ "x-custom": "yes" }} }},
            "sessions": {{
              "sess-oai": {{ "provider": "openai", "base_url": "{base}/v1", "api_key_env": "OPENAI_UPSTREAM_KEY" }},
              "sess-none": {{ "provider": "anthropic", "api_key_vault": "absent" }}
            }}
          }},
          "mcp_servers": [ {{ "name": "tools", "url": "{base}/mcp", "vault_secret": "mcp-secret" }} ]
        }}"#
    ))
    .unwrap()
}

/// The standard state: tokens `tok-a` (sess-a), `tok-b` (sess-b), `tok-oai` (sess-oai),
/// `tok-none` (sess-none).
pub async fn standard_state(upstream: &Upstream) -> (ProxyState, Arc<MemoryTokens>) {
    standard_state_with(standard_config(upstream)).await
}

/// [`standard_state`] over another configuration.
pub async fn standard_state_with(config: ServeConfig) -> (ProxyState, Arc<MemoryTokens>) {
    let tokens = Arc::new(MemoryTokens::default());
    for (token, session) in [
        ("tok-a-SESSION-111", "sess-a"),
        ("tok-b-SESSION-222", "sess-b"),
        ("tok-oai-SESSION-333", "sess-oai"),
        ("tok-none-SESSION-444", "sess-none"),
    ] {
        tokens.insert(token, session);
    }
    let vault = Arc::new(MemoryVault::default());
    vault
        .put("anthropic-key", SecretString::new(ANTHROPIC_UPSTREAM_KEY))
        .await
        .unwrap();
    vault
        .put("mcp-secret", SecretString::new(MCP_VAULT_SECRET))
        .await
        .unwrap();
    let env = BTreeMap::from([(
        "OPENAI_UPSTREAM_KEY".to_owned(),
        SecretString::new(OPENAI_UPSTREAM_KEY),
    )]);
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens: tokens.clone(),
        vault,
        files: None,
        env,
        operator_key: SecretString::new("operator-KEY-777"),
        sandboxes: None,
        runs: None,
    })
    .unwrap();
    (state, tokens)
}

/// Every secret of the standard fixture.
pub const ALL_SECRETS: &[&str] = &[
    "tok-a-SESSION-111",
    "tok-b-SESSION-222",
    "tok-oai-SESSION-333",
    "tok-none-SESSION-444",
    ANTHROPIC_UPSTREAM_KEY,
    OPENAI_UPSTREAM_KEY,
    MCP_VAULT_SECRET,
    "operator-KEY-777",
];

/// Serves `state` on a loopback port.
pub async fn start_proxy(state: ProxyState) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let limits = omabox_proxy::Limits::default();
    let app = omabox_proxy::router(state);
    tokio::spawn(async move {
        omabox_proxy::serve(listener, app, &limits, std::future::pending()).await
    });
    addr
}

/// Captured log output of the whole test process (TRACE, every target).
#[derive(Clone, Default)]
pub struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Installs (once) a TRACE subscriber writing to a buffer and returns the buffer.
pub fn capture_logs() -> LogBuffer {
    static LOGS: OnceLock<LogBuffer> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buffer = LogBuffer::default();
        let writer = buffer.clone();
        tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .init();
        buffer
    })
    .clone()
}

/// Asserts no secret of the fixture appears in the captured logs (and that logs were
/// captured at all).
pub fn assert_logs_clean(logs: &LogBuffer) {
    let text = logs.text();
    assert!(!text.is_empty(), "no log was captured");
    for secret in ALL_SECRETS {
        assert!(
            !text.contains(secret),
            "a secret leaked into the logs: {secret}"
        );
    }
}
