//! The official `anthropic` and `openai` Python SDKs (installed from PyPI by the test setup)
//! pointed at the proxy with the session token as their API key, against the loopback stub.
//!
//! Incremental delivery is proven without clocks: the stub holds its last events until the
//! test releases them, and the test releases them only after the SDK has printed the first
//! delta. A proxy that buffered would deadlock here (and fail on the timeout).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt as _, BufReader};

const ANTHROPIC_SCRIPT: &str = r#"
import os, sys, anthropic
client = anthropic.Anthropic(base_url=os.environ["PROXY_BASE"], api_key=os.environ["SESSION_TOKEN"], max_retries=0)
with client.messages.stream(model="stub", max_tokens=16, messages=[{"role": "user", "content": "hi"}]) as stream:
    for text in stream.text_stream:
        print("DELTA" + text, flush=True)
print("DONE", flush=True)
"#;

const OPENAI_SCRIPT: &str = r#"
import os, sys, openai
client = openai.OpenAI(base_url=os.environ["PROXY_BASE"], api_key=os.environ["SESSION_TOKEN"], max_retries=0)
stream = client.chat.completions.create(model="stub", messages=[{"role": "user", "content": "hi"}], stream=True)
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        print("DELTA" + chunk.choices[0].delta.content, flush=True)
print("DONE", flush=True)
"#;

const STATUS_SCRIPT: &str = r#"
import os, json, anthropic
for base, token in json.loads(os.environ["CASES"]):
    client = anthropic.Anthropic(base_url=base, api_key=token, max_retries=0)
    try:
        client.messages.create(model="stub", max_tokens=16, messages=[{"role": "user", "content": "hi"}])
        print("NOERROR", flush=True)
    except anthropic.APIStatusError as e:
        print("STATUS", e.status_code, e.response.text, flush=True)
"#;

/// Runs `script`; releases the stub after the first delta; returns the printed lines.
async fn run_sdk(
    python: &std::path::Path,
    script: &str,
    base: &str,
    token: &str,
    upstream: &Upstream,
) -> Vec<String> {
    let mut child = tokio::process::Command::new(python)
        .args(["-c", script])
        .env("PROXY_BASE", base)
        .env("SESSION_TOKEN", token)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    let read = async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if seen.iter().all(|l: &String| !l.starts_with("DELTA")) && line.starts_with("DELTA") {
                // The client has the first delta while the upstream still holds the rest.
                upstream.release();
            }
            eprintln!("sdk> {line}");
            seen.push(line);
        }
    };
    tokio::time::timeout(Duration::from_secs(120), read)
        .await
        .expect("the SDK did not finish: the stream was not delivered incrementally");
    assert!(child.wait().await.unwrap().success());
    seen
}

fn assert_upstream_saw_only_its_credential(request: &Recorded, token: &str) {
    for (name, value) in &request.headers {
        assert!(
            !String::from_utf8_lossy(value.as_bytes()).contains(token),
            "the session token reached the upstream in {name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_streams_through_the_proxy() {
    let Some(python) = python::sdk_python() else {
        return;
    };
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let proxy = start_proxy(state).await;
    let token = "tok-a-SESSION-111";
    let lines = run_sdk(
        &python,
        ANTHROPIC_SCRIPT,
        &format!("http://{proxy}/v1/oma/inference-proxy/sess-a/anthropic"),
        token,
        &upstream,
    )
    .await;
    assert_eq!(lines, ["DELTAHello", "DELTA world", "DONE"]);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path_and_query, "/v1/messages");
    assert_eq!(request.headers["x-api-key"], ANTHROPIC_UPSTREAM_KEY);
    assert!(request.headers.get("authorization").is_none());
    assert!(request.headers.get("anthropic-version").is_some());
    assert_upstream_saw_only_its_credential(request, token);
    assert_logs_clean(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_streams_through_the_proxy() {
    let Some(python) = python::sdk_python() else {
        return;
    };
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let proxy = start_proxy(state).await;
    let token = "tok-oai-SESSION-333";
    let lines = run_sdk(
        &python,
        OPENAI_SCRIPT,
        &format!("http://{proxy}/v1/oma/inference-proxy/sess-oai/openai/v1"),
        token,
        &upstream,
    )
    .await;
    assert_eq!(lines, ["DELTAHello", "DELTA world", "DONE"]);
    let requests = upstream.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.path_and_query, "/v1/chat/completions");
    assert_eq!(
        request.headers["authorization"],
        format!("Bearer {OPENAI_UPSTREAM_KEY}")
    );
    assert!(request.headers.get("x-api-key").is_none());
    assert_upstream_saw_only_its_credential(request, token);
    assert_logs_clean(&logs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_sees_the_reference_errors() {
    let Some(python) = python::sdk_python() else {
        return;
    };
    let logs = capture_logs();
    let upstream = start_upstream().await;
    let (state, _) = standard_state(&upstream).await;
    let proxy = start_proxy(state).await;
    let cases = [
        (
            "sess-a",
            "anthropic",
            "no-such-token",
            r#"STATUS 403 {"error":"forbidden"}"#,
        ),
        (
            "sess-a",
            "anthropic",
            "tok-b-SESSION-222",
            r#"STATUS 403 {"error":"forbidden"}"#,
        ),
        (
            "sess-none",
            "anthropic",
            "tok-none-SESSION-444",
            r#"STATUS 403 {"error":"forbidden"}"#,
        ),
        (
            "sess-oai",
            "anthropic",
            "tok-oai-SESSION-333",
            r#"STATUS 409 {"error":"inference_protocol_unsupported"}"#,
        ),
    ];
    let inputs: Vec<(String, &str)> = cases
        .iter()
        .map(|(session, prefix, token, _)| {
            (
                format!("http://{proxy}/v1/oma/inference-proxy/{session}/{prefix}"),
                *token,
            )
        })
        .collect();
    let output = tokio::process::Command::new(&python)
        .args(["-c", STATUS_SCRIPT])
        .env("CASES", serde_json::to_string(&inputs).unwrap())
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<String> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let expected: Vec<&str> = cases.iter().map(|case| case.3).collect();
    assert_eq!(lines, expected);
    assert!(upstream.requests().is_empty());
    assert_logs_clean(&logs);
}
