//! `omabox run --agent claude|codex` end to end: the real ACP agents from npm
//! (`@zed-industries/claude-code-acp`, Claude Code inside; `@zed-industries/codex-acp`)
//! installed into the host cache, run in a linux sandbox, their model calls going through the
//! in-process hosted inference proxy to a scripted upstream on this machine speaking the
//! Anthropic Messages API (claude) and the OpenAI Responses API (codex). No test reaches a
//! real model provider.
//!
//! The upstream (below) speaks the Messages API, streaming (SSE) or not, and is scripted
//! by the conversation it is sent: a user prompt containing "write the file" → a `Write`
//! tool call for `/workspace/hello.txt`; that tool's result → a `Bash` tool call dumping
//! the agent's env into `/workspace/env.txt`; that result → a final message; any other
//! prompt → a final message quoting the conversation's first user prompt (so the resumed
//! turn proves the agent saw the earlier one). The Responses script does the same with
//! `exec_command` calls (codex's shell tool).
//!
//! Needs root, linux sandboxes, `node` and `npm` on the host and the npm registry (the
//! package is installed once into `target/omabox-test-agents`); skips with a printed reason
//! where one is missing, fails under `CI=true`.

mod common;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Response, StatusCode};
use axum::routing::post;
use common::{describe, omabox_bin};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

/// The operator's model key: only the upstream may ever see it.
const OPERATOR_KEY: &str = "sk-ant-operator-3f9c1e0d7b";

/// One request the upstream received.
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: Vec<(String, String)>,
    body: Value,
}

/// The scripted Anthropic upstream on `127.0.0.1:<port>`, served by its own runtime.
struct Upstream {
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    _runtime: tokio::runtime::Runtime,
}

impl Upstream {
    fn start() -> Self {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/messages", post(messages))
            .route("/v1/messages/count_tokens", post(count_tokens))
            .route("/v1/responses", post(responses))
            .fallback(record_other)
            .with_state(Arc::clone(&seen));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        runtime.spawn(async move { axum::serve(listener, app).await });
        Self {
            port,
            seen,
            _runtime: runtime,
        }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    fn clear(&self) {
        self.seen.lock().unwrap().clear();
    }
}

/// What the upstream saw, shared with its handlers.
type Log = Arc<Mutex<Vec<Seen>>>;

fn record(seen: &Log, path: &str, headers: &HeaderMap, body: &Value) {
    seen.lock().unwrap().push(Seen {
        path: path.to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect(),
        body: body.clone(),
    });
}

async fn record_other(State(seen): State<Log>, request: axum::extract::Request) -> StatusCode {
    record(&seen, request.uri().path(), request.headers(), &Value::Null);
    StatusCode::NOT_FOUND
}

async fn count_tokens(
    State(seen): State<Log>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> axum::Json<Value> {
    record(&seen, "/v1/messages/count_tokens", &headers, &body);
    axum::Json(json!({ "input_tokens": 12 }))
}

async fn messages(
    State(seen): State<Log>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response<Body> {
    record(&seen, "/v1/messages", &headers, &body);
    let (blocks, stop) = script(&body);
    // Every answer is a new message (agents merge blocks of one message id).
    let id = format!("msg_{:016x}", rand_id());
    if body["stream"] == true {
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(sse(&id, &blocks, stop)))
            .unwrap()
    } else {
        let message = json!({
            "id": id, "type": "message", "role": "assistant",
            "model": "claude-scripted", "content": blocks, "stop_reason": stop,
            "stop_sequence": null, "usage": { "input_tokens": 12, "output_tokens": 3 },
        });
        Response::builder()
            .header("content-type", "application/json")
            .body(Body::from(message.to_string()))
            .unwrap()
    }
}

/// The scripted answer (module doc): content blocks and the stop reason.
fn script(body: &Value) -> (Vec<Value>, &'static str) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let texts = |message: &Value| -> String {
        match &message["content"] {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        }
    };
    // The newest result: an agent may merge consecutive results into one message.
    let tool_result_of = |message: &Value| -> Option<String> {
        message["content"]
            .as_array()?
            .iter()
            .rfind(|b| b["type"] == "tool_result")
            .and_then(|b| b["tool_use_id"].as_str().map(str::to_owned))
    };
    let tools: Vec<String> = body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|t| t["name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    let tool = |suffix: &str| tools.iter().find(|t| t.ends_with(suffix)).cloned();
    let Some(last) = messages.iter().rev().find(|m| m["role"] == "user") else {
        return (vec![text_block("hello")], "end_turn");
    };
    match tool_result_of(last).as_deref() {
        Some("toolu_write") => {
            if let Some(bash) = tool("Bash") {
                return (
                    vec![json!({
                        "type": "tool_use", "id": "toolu_env", "name": bash,
                        "input": { "command": "env > /workspace/env.txt", "description": "dump env" },
                    })],
                    "tool_use",
                );
            }
            return (vec![text_block("wrote hello.txt")], "end_turn");
        }
        Some(_) => return (vec![text_block("wrote hello.txt")], "end_turn"),
        None => {}
    }
    if texts(last).contains("write the file")
        && let Some(write) = tool("Write")
    {
        return (
            vec![json!({
                "type": "tool_use", "id": "toolu_write", "name": write,
                "input": { "file_path": "/workspace/hello.txt", "content": "written by the agent\n" },
            })],
            "tool_use",
        );
    }
    let first = messages
        .iter()
        .find(|m| m["role"] == "user")
        .map(texts)
        .unwrap_or_default();
    let remembered = if first.contains("write the file") {
        "you first asked me to write the file"
    } else {
        "this is our first exchange"
    };
    (vec![text_block(remembered)], "end_turn")
}

/// The OpenAI Responses endpoint (codex streams every call), scripted like [`script`]:
/// what follows the newest user message decides.
async fn responses(
    State(seen): State<Log>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Value>,
) -> Response<Body> {
    record(&seen, "/v1/responses", &headers, &body);
    let input = body["input"].as_array().cloned().unwrap_or_default();
    let text_of = |item: &Value| -> String {
        item["content"]
            .as_array()
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default()
    };
    let is_user = |item: &&Value| item["type"] == "message" && item["role"] == "user";
    let last_user = input.iter().rposition(|item| is_user(&item)).unwrap_or(0);
    let outputs: Vec<&str> = input[last_user..]
        .iter()
        .filter(|item| item["type"] == "function_call_output")
        .filter_map(|item| item["call_id"].as_str())
        .collect();
    let call = |id: &str, cmd: &str| {
        json!({"type": "function_call", "id": format!("fc_{id}"), "call_id": id,
               "name": "exec_command", "arguments": json!({"cmd": cmd}).to_string()})
    };
    let prompt = input.get(last_user).map(text_of).unwrap_or_default();
    let item = if outputs.contains(&"call_env") {
        message_item("wrote hello.txt")
    } else if outputs.contains(&"call_write") {
        call("call_env", "env > /workspace/env.txt")
    } else if prompt.contains("write the file") {
        call(
            "call_write",
            "printf 'written by the agent\\n' > /workspace/hello.txt",
        )
    } else if input
        .iter()
        .filter(is_user)
        .any(|item| text_of(item).contains("please write the file"))
    {
        message_item("you first asked me to write the file")
    } else {
        message_item("this is our first exchange")
    };
    let id = format!("resp_{:016x}", rand_id());
    let events = [
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": id}}),
        ),
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "response": {"id": id, "usage": {
                "input_tokens": 12, "input_tokens_details": null, "output_tokens": 3,
                "output_tokens_details": null, "total_tokens": 15}}}),
        ),
    ];
    let stream: String = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Body::from(stream))
        .unwrap()
}

fn message_item(text: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{:016x}", rand_id()), "role": "assistant",
           "content": [{"type": "output_text", "text": text}]})
}

/// A fresh message id.
fn rand_id() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) ^ u64::from(std::process::id()) << 32
}

fn text_block(text: &str) -> Value {
    json!({ "type": "text", "text": text })
}

/// The Messages streaming events for `blocks`.
fn sse(id: &str, blocks: &[Value], stop: &str) -> String {
    let mut events = vec![(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": id, "type": "message", "role": "assistant",
            "model": "claude-scripted", "content": [], "stop_reason": null,
            "stop_sequence": null, "usage": {"input_tokens": 12, "output_tokens": 1}}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        if block["type"] == "text" {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": index,
                       "content_block": {"type": "text", "text": ""}}),
            ));
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index,
                       "delta": {"type": "text_delta", "text": block["text"]}}),
            ));
        } else {
            events.push((
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": {
                    "type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}}),
            ));
            events.push((
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {
                    "type": "input_json_delta", "partial_json": block["input"].to_string()}}),
            ));
        }
        events.push((
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push((
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
               "usage": {"output_tokens": 3}}),
    ));
    events.push(("message_stop", json!({"type": "message_stop"})));
    events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect()
}

/// The shared package cache of these tests (installed once per target dir).
fn agent_cache() -> PathBuf {
    let target = omabox_bin()
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir);
    target.join("omabox-test-agents")
}

/// `true` when this machine can run the test (root, sandboxes, node, npm).
fn available() -> bool {
    if !common::linux_available() {
        return false;
    }
    let missing = ["node", "npm"].into_iter().find(|tool| {
        !Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    omabox_test_support::require_capability(
        missing.map(|tool| format!("`{tool}` is not on the host's PATH (apt install nodejs npm)")),
    )
}

struct Setup {
    dirs: common::TestDirs,
    upstream: Upstream,
}

impl Setup {
    fn new() -> Option<Self> {
        if !available() {
            return None;
        }
        Some(Self {
            dirs: common::TestDirs::new("agent"),
            upstream: Upstream::start(),
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        self.command_in(&self.dirs, args)
    }

    /// [`Self::command`] in other dirs (another host): the same agent cache and upstream.
    fn command_in(&self, dirs: &common::TestDirs, args: &[&str]) -> Command {
        let mut command = dirs.command(args);
        command
            .env("OMABOX_AGENT_CACHE", agent_cache())
            .env("ANTHROPIC_API_KEY", OPERATOR_KEY)
            .env(
                "ANTHROPIC_BASE_URL",
                format!("http://127.0.0.1:{}", self.upstream.port),
            )
            .env("OPENAI_API_KEY", OPERATOR_KEY)
            .env(
                "OPENAI_BASE_URL",
                format!("http://127.0.0.1:{}", self.upstream.port),
            )
            .env("OMABOX_LOG", "debug")
            .env_remove("OMABOX_LINUX_MEMORY")
            .env_remove("OMABOX_INFERENCE_GATEWAY")
            .env_remove("OMABOX_LINUX_NETWORK")
            .env_remove("OMABOX_ACP_TURN_TIMEOUT_MS");
        command
    }

    fn turn(&self, agent: &str, session: &str, prompt: &str) -> (Value, Output) {
        let output = self
            .command(&[
                "run",
                "--json",
                "--agent",
                agent,
                "--session",
                session,
                "--prompt",
                prompt,
            ])
            .output()
            .expect("omabox runs");
        // JSON Lines: the events as they arrived, then the report.
        let stdout = String::from_utf8_lossy(&output.stdout);
        let report = stdout
            .lines()
            .last()
            .and_then(|line| serde_json::from_str(line).ok())
            .unwrap_or(Value::Null);
        (report, output)
    }

    fn export(&self, session: &str) -> tempfile::TempDir {
        self.dirs.export(session)
    }
}

fn events(report: &Value) -> Vec<Value> {
    report["acpEvents"].as_array().cloned().unwrap_or_default()
}

/// Every file under `dir` with its bytes.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            } else if entry.file_type().unwrap().is_file() {
                out.push((path.clone(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle.as_bytes())
}

/// How one agent shows up in the test's checks.
struct Expect {
    agent: &'static str,
    /// The model endpoint it calls.
    path: &'static str,
    /// The credential header the upstream must see (the operator key), and the one it
    /// must not see at all.
    key_header: (&'static str, String),
    other_header: &'static str,
    /// The tool call that writes the file.
    write_kind: &'static str,
    write_id: &'static str,
    /// What its env must show, and where its own session files live.
    env_line: &'static str,
    provider_key: &'static str,
    native_state: &'static str,
}

#[test]
fn claude_writes_a_file_through_the_proxy_and_resumes_its_session() {
    agent_turns(&Expect {
        agent: "claude",
        path: "/v1/messages",
        key_header: ("x-api-key", OPERATOR_KEY.to_owned()),
        other_header: "authorization",
        write_kind: "edit",
        write_id: "toolu_write",
        env_line: "ANTHROPIC_BASE_URL=http://127.0.0.1:",
        provider_key: "ANTHROPIC_API_KEY",
        native_state: ".openma/harness-state/claude/projects/-workspace",
    });
}

#[test]
fn codex_writes_a_file_through_the_proxy_and_resumes_its_session() {
    agent_turns(&Expect {
        agent: "codex",
        path: "/v1/responses",
        key_header: ("authorization", format!("Bearer {OPERATOR_KEY}")),
        other_header: "x-api-key",
        write_kind: "execute",
        write_id: "call_write",
        env_line: "HOSTED_INFERENCE_URL=http://127.0.0.1:",
        provider_key: "OPENAI_API_KEY",
        native_state: ".openma/harness-state/codex/sessions",
    });
}

/// Two turns of `expect.agent` in one session (module doc).
fn agent_turns(expect: &Expect) {
    let Some(setup) = Setup::new() else { return };
    let session_id = format!("agent-{}", expect.agent);

    // Turn 1: the agent writes the file and dumps its env.
    let (first, output) = setup.turn(expect.agent, &session_id, "please write the file");
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(first["result"]["type"], "completed", "{first}");
    let turn = events(&first);
    let session = turn.iter().find(|e| e["type"] == "session").unwrap();
    assert_eq!(session["resumed"], false);
    let acp_session = session["acpSessionId"].as_str().unwrap().to_owned();
    let write = turn
        .iter()
        .find(|e| e["type"] == "tool_call" && e["kind"] == expect.write_kind)
        .unwrap_or_else(|| panic!("no writing tool call: {turn:?}"));
    assert_eq!(write["toolCallId"], expect.write_id);
    assert!(
        turn.iter()
            .any(|e| e["type"] == "tool_call_update" && e["status"] == "completed"),
        "{turn:?}"
    );
    assert!(
        turn.iter()
            .any(|e| e["type"] == "stop" && e["reason"] == "end_turn")
    );

    // The upstream saw the operator's key on every call, and nothing of the session token.
    let seen = setup.upstream.seen();
    let calls: Vec<&Seen> = seen.iter().filter(|s| s.path == expect.path).collect();
    assert!(
        calls.len() >= 3,
        "expected write, env-dump and final calls: {seen:?}"
    );
    for call in &seen {
        let (name, value) = &expect.key_header;
        let key = call.headers.iter().find(|(k, _)| k == name);
        assert_eq!(key.map(|(_, v)| v), Some(value), "{call:?}");
        assert!(
            !call.headers.iter().any(|(k, _)| k == expect.other_header),
            "{call:?}"
        );
        let all = format!("{:?}{}", call.headers, call.body);
        assert!(
            !all.contains("omst_"),
            "the session token reached the upstream"
        );
    }

    // The file is in the published workspace; the sandbox never held the operator key.
    let exported = setup.export(&session_id);
    let ws = exported.path().join("ws");
    assert_eq!(
        std::fs::read_to_string(ws.join("hello.txt")).unwrap(),
        "written by the agent\n"
    );
    let env = std::fs::read_to_string(ws.join("env.txt")).expect("the agent dumped its env");
    assert!(!env.contains(OPERATOR_KEY), "{env}");
    assert!(!env.contains(expect.provider_key), "{env}");
    assert!(env.contains(expect.env_line), "{env}");
    assert!(
        env.contains(&format!("/v1/oma/inference-proxy/{session_id}")),
        "{env}"
    );
    for (path, bytes) in files(&ws) {
        assert!(!contains(&bytes, OPERATOR_KEY), "operator key in {path:?}");
        if !path.ends_with("env.txt") {
            assert!(!contains(&bytes, "omst_"), "session token kept in {path:?}");
        }
    }
    assert!(
        ws.join(expect.native_state).is_dir(),
        "the agent's own session files are checkpointed"
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains(OPERATOR_KEY) && !stderr.contains("omst_"));

    // Turn 2: the same ACP session, and the agent sees the first turn.
    setup.upstream.clear();
    let (second, output) = setup.turn(expect.agent, &session_id, "what did I ask before?");
    assert!(output.status.success(), "{}", describe(&output));
    let turn = events(&second);
    let session = turn.iter().find(|e| e["type"] == "session").unwrap();
    assert_eq!(session["resumed"], true, "{turn:?}");
    assert_eq!(session["acpSessionId"], acp_session.as_str());
    let seen = setup.upstream.seen();
    let last = seen
        .iter()
        .rfind(|s| s.path == expect.path)
        .expect("a model call");
    assert!(
        last.body.to_string().contains("please write the file"),
        "the resumed turn does not carry the first: {}",
        last.body
    );
    // ... down to the first turn's last message: nothing was lost when the agent was
    // stopped after its turn.
    assert!(
        last.body.to_string().contains("wrote hello.txt"),
        "the resumed turn lost the end of the first: {}",
        last.body
    );
    let message: String = turn
        .iter()
        .filter(|e| e["type"] == "agent_message")
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        message.contains("you first asked me to write the file"),
        "{turn:?}"
    );
}

#[test]
fn an_agent_without_node_on_the_host_fails_clearly() {
    let Some(setup) = Setup::new() else { return };
    let output = setup
        .command(&["run", "--agent", "claude", "--prompt", "hi"])
        .env("PATH", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--agent claude runs on node"),
        "{}",
        describe(&output)
    );
}

/// `{"agent": "claude", "prompt": …}` posted to `omabox serve` (issue 30): the queued run
/// is the same agent turn as `omabox run --agent claude`, through serve's worker; its ACP
/// events are in the run's timeline and the operator key in none of them.
#[test]
fn claude_runs_as_a_queued_run_posted_to_serve() {
    let Some(setup) = Setup::new() else { return };
    const API_KEY: &str = "agents-serve-operator-key";
    let mut command = setup.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", API_KEY)
        .env_remove("OMABOX_LOG");
    let serve = common::serve::Serve::start(command);
    let call = |method: &str, path: &str, body: &str| -> (u16, String) {
        use std::io::{Read as _, Write as _};
        let mut stream = std::net::TcpStream::connect(&serve.addr).unwrap();
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nhost: {}\r\nauthorization: Bearer {API_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            serve.addr,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").unwrap().1.to_owned();
        (status, body)
    };
    let (status, answer) = call(
        "POST",
        "/v1/sessions/agent-over-http/runs",
        r#"{"agent": "claude", "prompt": "please write the file"}"#,
    );
    assert_eq!(status, 201, "{answer}");
    let run_id = serde_json::from_str::<Value>(&answer).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let start = std::time::Instant::now();
    let run = loop {
        let (_, body) = call("GET", &format!("/v1/runs/{run_id}"), "");
        let run: Value = serde_json::from_str(&body).unwrap();
        if run["status"] == "completed" || run["status"] == "failed" {
            break run;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(600),
            "{run}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    };
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 1, "{run}");
    let (_, events) = call("GET", &format!("/v1/runs/{run_id}/events"), "");
    assert!(events.contains(r#""type":"acp""#), "{events}");
    assert!(events.contains("toolu_write"), "{events}");
    assert!(
        !events.contains(OPERATOR_KEY) && !events.contains("omst_"),
        "{events}"
    );
    let log = serve.stop().join("\n");
    assert!(
        !log.contains(OPERATOR_KEY) && !log.contains("omst_"),
        "{log}"
    );
    let exported = setup.export("agent-over-http");
    assert_eq!(
        std::fs::read_to_string(exported.path().join("ws/hello.txt")).unwrap(),
        "written by the agent\n"
    );
}

// Warm sessions on `omabox serve` (issue 31): after a turn the session's sandbox and its ACP
// agent stay up, and the next turn is one prompt on the live agent. The marker that the
// agent process is the same one: the session token in the environment its tools see (the
// agent read it at spawn; a cold turn spawns a new agent with a rotated token). Compared,
// never printed.

const WARM_KEY: &str = "agents-warm-operator-key";

/// `omabox serve` of `setup` with `env` on top.
fn warm_serve(setup: &Setup, env: &[(&str, &str)]) -> common::serve::Serve {
    let mut command = setup.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", WARM_KEY)
        .env_remove("OMABOX_LOG");
    for (name, value) in env {
        command.env(name, value);
    }
    common::serve::Serve::start(command)
}

/// One claude turn posted to `session`, waited for: its final status and its events (ACP
/// events parsed).
fn warm_turn(addr: &str, session: &str, prompt: &str) -> (Value, Vec<Value>) {
    let body = json!({ "agent": "claude", "prompt": prompt }).to_string();
    warm_run(addr, session, &body)
}

/// The run `body` posted to `session`, waited for (as [`warm_turn`]).
fn warm_run(addr: &str, session: &str, body: &str) -> (Value, Vec<Value>) {
    let call = |method: &str, path: &str, body: &str| {
        common::serve::http_request(addr, addr, Some(WARM_KEY), method, path, body)
    };
    let (status, answer) = call("POST", &format!("/v1/sessions/{session}/runs"), body);
    assert_eq!(status, 201, "{answer}");
    let run_id = serde_json::from_str::<Value>(&answer).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let start = std::time::Instant::now();
    let run = loop {
        let (_, body) = call("GET", &format!("/v1/runs/{run_id}"), "");
        let run: Value = serde_json::from_str(&body).unwrap();
        if run["status"] == "completed" || run["status"] == "failed" {
            break run;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(600),
            "{run}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let (_, stream) = call("GET", &format!("/v1/runs/{run_id}/events"), "");
    let events = stream
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .map(|mut event| {
            if event["type"] == "acp"
                && let Some(text) = event["event"].as_str()
                && let Ok(parsed) = serde_json::from_str::<Value>(text)
            {
                event["event"] = parsed;
            }
            event
        })
        .collect();
    (run, events)
}

/// The ACP session id a turn ran in.
fn acp_session(events: &[Value]) -> String {
    events
        .iter()
        .find(|e| e["type"] == "acp" && e["event"]["type"] == "session")
        .and_then(|e| e["event"]["acpSessionId"].as_str())
        .unwrap_or_else(|| panic!("no ACP session event: {events:?}"))
        .to_owned()
}

/// Whether the turn ran on a kept runtime (the runner says so in a notice).
fn ran_warm(events: &[Value]) -> bool {
    events.iter().any(|e| {
        e["type"] == "notice"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.starts_with("warm session:"))
    })
}

/// The `HOSTED_INFERENCE_TOKEN=` line of the env the agent's tool dumped into the session's
/// published workspace (the marker of the agent process, module section doc).
fn agent_token_line(setup: &Setup, session: &str) -> String {
    let exported = setup.export(session);
    let env = std::fs::read_to_string(exported.path().join("ws/env.txt")).unwrap();
    env.lines()
        .find(|line| line.starts_with("HOSTED_INFERENCE_TOKEN="))
        .map(str::to_owned)
        .expect("the agent's env has its session token")
}

#[test]
fn a_warm_session_takes_its_next_turn_on_the_same_agent_and_publishes_each() {
    let Some(setup) = Setup::new() else { return };
    let serve = warm_serve(&setup, &[]);

    let (first, first_events) = warm_turn(&serve.addr, "warm-1", "please write the file");
    assert_eq!(first["status"], "completed", "{first}");
    assert_eq!(first["revision"], 1, "{first}");
    assert!(!ran_warm(&first_events), "{first_events:?}");
    let first_marker = agent_token_line(&setup, "warm-1");

    let (second, second_events) = warm_turn(&serve.addr, "warm-1", "please write the file");
    assert_eq!(second["status"], "completed", "{second}");
    assert_eq!(second["revision"], 2, "{second} {second_events:?}");
    assert!(ran_warm(&second_events), "{second_events:?}");
    // The same ACP session on the same agent process.
    assert_eq!(acp_session(&first_events), acp_session(&second_events));
    assert!(
        agent_token_line(&setup, "warm-1") == first_marker,
        "the second turn ran in another agent process"
    );
    // Published through the queue, incrementally, as any turn.
    assert!(
        second_events
            .iter()
            .any(|e| e["type"] == "step" && e["step"] == "fence.publish" && e["revision"] == 2),
        "{second_events:?}"
    );
    assert!(
        second_events
            .iter()
            .any(|e| e["type"] == "acp" && e["event"]["type"] == "tool_call"),
        "{second_events:?}"
    );
    // The warm turn's timeline has no credential (the session token, the operator key).
    let timeline = format!("{first_events:?}{second_events:?}");
    assert!(
        !timeline.contains(OPERATOR_KEY) && !timeline.contains("omst_"),
        "a credential in a timeline"
    );
    // A command run of the session ends the warm runtime first and runs cold, from
    // revision 2: nothing of the warm runtime is left after it.
    let (run, events) = warm_run(
        &serve.addr,
        "warm-1",
        r#"{"command": ["cat", "hello.txt"]}"#,
    );
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 3, "{run}");
    assert!(
        events.iter().any(|e| e["type"] == "output"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("written by the agent"))),
        "{events:?}"
    );
    assert!(leftovers(&setup).is_empty(), "{:?}", leftovers(&setup));
    let log = serve.stop().join("\n");
    assert!(
        !log.contains(OPERATOR_KEY) && !log.contains("omst_"),
        "{log}"
    );
    assert!(leftovers(&setup).is_empty(), "{:?}", leftovers(&setup));
}

#[test]
fn an_evicted_warm_session_takes_a_cold_turn_with_the_same_workspace() {
    let Some(setup) = Setup::new() else { return };
    // One warm session at most: b's turn evicts a's runtime.
    let serve = warm_serve(&setup, &[("OMABOX_SERVE_WARM_MAX", "1")]);
    let (a, a_first) = warm_turn(&serve.addr, "evict-a", "please write the file");
    assert_eq!(a["status"], "completed", "{a}");
    let a_marker = agent_token_line(&setup, "evict-a");
    let (b, _) = warm_turn(&serve.addr, "evict-b", "please write the file");
    assert_eq!(b["status"], "completed", "{b}");

    // a's second turn is cold: a new agent, resuming the same ACP session.
    let (a, a_second) = warm_turn(&serve.addr, "evict-a", "please write the file");
    assert_eq!(a["status"], "completed", "{a}");
    assert_eq!(a["revision"], 2, "{a}");
    assert!(!ran_warm(&a_second), "{a_second:?}");
    assert!(
        agent_token_line(&setup, "evict-a") != a_marker,
        "the evicted session's turn reused its agent"
    );
    assert_eq!(acp_session(&a_first), acp_session(&a_second));

    // c takes the same two turns warm: its workspace is a's, the same files with the same
    // bytes (the env dump and the agent's own session files aside).
    for revision in [1, 2] {
        let (c, c_events) = warm_turn(&serve.addr, "evict-c", "please write the file");
        assert_eq!(c["status"], "completed", "{c}");
        assert_eq!(c["revision"], revision, "{c}");
        assert_eq!(ran_warm(&c_events), revision == 2, "{c_events:?}");
    }
    let (a_ws, c_ws) = (setup.export("evict-a"), setup.export("evict-c"));
    let tree = |dir: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files: Vec<_> = files(&dir.join("ws"))
            .into_iter()
            .map(|(path, bytes)| (path.strip_prefix(dir).unwrap().to_path_buf(), bytes))
            .filter(|(path, _)| !path.starts_with("ws/.openma") && path != Path::new("ws/env.txt"))
            .collect();
        files.sort();
        files
    };
    let a_tree = tree(a_ws.path());
    assert!(!a_tree.is_empty());
    assert_eq!(a_tree, tree(c_ws.path()));
    serve.stop();
    assert!(leftovers(&setup).is_empty(), "{:?}", leftovers(&setup));
}

#[test]
fn warm_sessions_live_side_by_side_and_end_after_their_ttl() {
    let Some(setup) = Setup::new() else { return };
    let serve = warm_serve(&setup, &[("OMABOX_SERVE_WARM_TTL_MS", "20000")]);
    let (x, _) = warm_turn(&serve.addr, "ttl-x", "please write the file");
    assert_eq!(x["status"], "completed", "{x}");
    // y's cold turn (its sweep of dead runs' leftovers included) leaves x's runtime alone.
    let (y, _) = warm_turn(&serve.addr, "ttl-y", "please write the file");
    assert_eq!(y["status"], "completed", "{y}");
    let (x, x_events) = warm_turn(&serve.addr, "ttl-x", "please write the file");
    assert_eq!(x["status"], "completed", "{x}");
    assert!(ran_warm(&x_events), "{x_events:?}");
    // Idle past their ttl, both end: agent, sandbox, bindings (a hung keeper fails the
    // test at the limit, not a timing).
    let start = std::time::Instant::now();
    while !leftovers(&setup).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "{:?}",
            leftovers(&setup)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // Its claim was released with it: the next turn is cold at once, from revision 1.
    let (y, y_events) = warm_turn(&serve.addr, "ttl-y", "please write the file");
    assert_eq!(y["status"], "completed", "{y}");
    assert_eq!(y["revision"], 2, "{y}");
    assert!(!ran_warm(&y_events), "{y_events:?}");
    assert!(
        !y_events.iter().any(|e| e["type"] == "notice"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("held by another owner"))),
        "{y_events:?}"
    );
    serve.stop();
}

#[test]
fn a_warm_session_whose_agent_died_takes_a_cold_turn() {
    let Some(setup) = Setup::new() else { return };
    let serve = warm_serve(&setup, &[]);
    let (run, _) = warm_turn(&serve.addr, "crashed-warm", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    let marker = agent_token_line(&setup, "crashed-warm");
    // The kept agent (node running the ACP adapter, and what it started) dies between turns.
    let cgroup_parent = &setup.dirs.cgroup_parent;
    let mut killed = 0;
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let in_sandbox = std::fs::read_to_string(entry.path().join("cgroup"))
            .is_ok_and(|cgroup| cgroup.contains(cgroup_parent.as_str()));
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if in_sandbox && contains(&cmdline, "claude") {
            let pid: i32 = entry.file_name().to_string_lossy().parse().unwrap();
            // SAFETY: plain kill(2) on a process of this test's sandbox.
            if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
                killed += 1;
            }
        }
    }
    assert!(killed > 0, "no agent process found in the kept sandbox");
    let (run, events) = warm_turn(&serve.addr, "crashed-warm", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 2, "{run}");
    // Seen dead before the turn, or found dead by it (then the same turn ran again cold).
    let fell_back = events.iter().any(|e| {
        e["type"] == "notice"
            && e["text"]
                .as_str()
                .is_some_and(|t| t.contains("the agent was gone; the turn runs cold"))
    });
    assert!(!ran_warm(&events) || fell_back, "{events:?}");
    assert!(agent_token_line(&setup, "crashed-warm") != marker);
    serve.stop();
    assert!(leftovers(&setup).is_empty(), "{:?}", leftovers(&setup));
}

#[test]
fn a_warm_session_ends_when_memory_runs_low() {
    let Some(setup) = Setup::new() else { return };
    // More than any machine has available: always under pressure.
    let serve = warm_serve(&setup, &[("OMABOX_SERVE_WARM_MIN_AVAILABLE", "1024T")]);
    let (run, _) = warm_turn(&serve.addr, "low-memory", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    let start = std::time::Instant::now();
    while !leftovers(&setup).is_empty() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(120),
            "{:?}",
            leftovers(&setup)
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let (run, events) = warm_turn(&serve.addr, "low-memory", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 2, "{run}");
    assert!(!ran_warm(&events), "{events:?}");
    serve.stop();
}

#[test]
fn a_killed_serve_with_a_warm_session_leaves_nothing_after_reap() {
    let Some(setup) = Setup::new() else { return };
    let mut serve = warm_serve(&setup, &[("OMABOX_LEASE_TTL_MS", "1000")]);
    let (run, _) = warm_turn(&serve.addr, "killed-warm", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    // The kept runtime is there: its sandbox and its agent.
    assert!(!leftovers(&setup).is_empty());
    serve.child().kill().unwrap();
    serve.child().wait().unwrap();
    // The kept claim expires (1 s) once nobody renews it; then reap takes the sandbox.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let output = setup
        .command(&["reap", "--json"])
        .env("OMABOX_LEASE_TTL_MS", "1000")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    // Reaped through the lease journal (the kept runtime's lease was never terminated), not
    // only by the sweep of sandboxes whose owner is gone, which would find it too.
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["abandoned"]["reaped"], 1, "{report}");
    assert!(leftovers(&setup).is_empty(), "{:?}", leftovers(&setup));
    // The session goes on, cold, from what the warm runtime's turn published.
    let serve = warm_serve(&setup, &[]);
    let (run, _) = warm_turn(&serve.addr, "killed-warm", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 2, "{run}");
    serve.stop();
}

/// Two hosts on one PostgreSQL run queue (a shared blob dir): host A keeps session `s` warm
/// after its turn; with A busy (`--max-runs 1`, a long command run of another session), host
/// B claims `s`'s next turn and gets `conflict` while A holds the claim. A's keeper sees
/// that run running elsewhere and lets the warm runtime go, so B's turn runs cold and
/// completes well before A's warm ttl (200 s) would have released it.
#[test]
fn a_turn_another_host_claims_gets_the_warm_runtime_released() {
    let Some(setup) = Setup::new() else { return };
    let Some(server) = omabox_test_support::postgres::TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("warm_two_hosts").unwrap();
    let shared = tempfile::tempdir().unwrap();
    let blobs = shared.path().join("blobs");
    let other = common::TestDirs::new("agent-b");
    let serve = |dirs: Option<&common::TestDirs>| {
        let args = [
            "--blob-dir",
            blobs.to_str().unwrap(),
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--max-runs",
            "1",
        ];
        // Host B has its own data dir.
        let mut command = match dirs {
            None => setup.command(&args),
            Some(dirs) => setup.command_in(dirs, &args),
        };
        command
            .env("OMABOX_DATABASE_URL", &url)
            .env("OMABOX_API_KEY", WARM_KEY)
            .env("OMABOX_SERVE_WARM_TTL_MS", "200000")
            .env_remove("OMABOX_LOG");
        common::serve::Serve::start(command)
    };
    let a = serve(None);
    let (run, _) = warm_turn(&a.addr, "s", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    // A is busy with another session's long command; only then does B start.
    let call = |addr: &str, method: &str, path: &str, body: &str| {
        common::serve::http_request(addr, addr, Some(WARM_KEY), method, path, body)
    };
    let (status, answer) = call(
        &a.addr,
        "POST",
        "/v1/sessions/busy/runs",
        r#"{"command": ["sh", "-c", "sleep 60"]}"#,
    );
    assert_eq!(status, 201, "{answer}");
    let busy = serde_json::from_str::<Value>(&answer).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, body) = call(&a.addr, "GET", &format!("/v1/runs/{busy}"), "");
        if serde_json::from_str::<Value>(&body).unwrap()["status"] == "running" {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "A never ran its busy run: {body}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let b = serve(Some(&other));
    let started = std::time::Instant::now();
    let (run, _) = warm_turn(&b.addr, "s", "please write the file");
    assert_eq!(run["status"], "completed", "{run}");
    assert_eq!(run["revision"], 2, "{run}");
    // Not a timing target: without the keeper's release B waits out A's 200 s ttl.
    assert!(
        started.elapsed() < std::time::Duration::from_secs(120),
        "B's turn waited {:?} for A's warm runtime",
        started.elapsed()
    );
    let _ = call(&a.addr, "POST", &format!("/v1/runs/{busy}/cancel"), "");
    b.stop();
    a.stop();
}

/// What a serve of `setup` left: sandbox state dirs, cgroups, processes in them, binding
/// dirs (empty when everything ended).
fn leftovers(setup: &Setup) -> Vec<String> {
    let dirs = &setup.dirs;
    let mut left = Vec::new();
    for entry in std::fs::read_dir(dirs.runtime_dir.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        left.push(format!("state dir {}", entry.path().display()));
    }
    for parent in common::cgroup_parent_dirs(&dirs.cgroup_parent) {
        for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
            if entry.path().is_dir() {
                left.push(format!("cgroup {}", entry.path().display()));
            }
        }
    }
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if std::fs::read_to_string(entry.path().join("cgroup"))
            .is_ok_and(|cgroup| cgroup.contains(&dirs.cgroup_parent))
        {
            left.push(format!("process {}", entry.file_name().to_string_lossy()));
        }
    }
    for area in ["runtime", "runtime-outputs"] {
        let mut stack = vec![dirs.data.path().join(area)];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with("wsb_") || name.starts_with("outb_") {
                    left.push(format!("binding {}", entry.path().display()));
                } else if entry.path().is_dir() {
                    stack.push(entry.path());
                }
            }
        }
    }
    left
}
