//! A scripted ACP agent for omabox's tests (never used by omabox itself). It speaks real ACP
//! on stdio through the `agent-client-protocol` crate's agent side. The first argument picks
//! the behaviour:
//!
//! - `normal` (default): supports `session/load` (and fails it when a file `fail-load` is
//!   in its working directory); on prompt it says which session it is in
//!   (`loaded session <id>` or `new session <id>`), publishes a plan, starts tool call
//!   `write-1`, asks permission, writes `agent-was-here.txt` in its working directory when
//!   allowed (the session, whether `HOSTED_INFERENCE_TOKEN` is in its env, and Claude Code's
//!   `CLAUDE_CONFIG_DIR`/`ANTHROPIC_BASE_URL` when set), completes (or fails) the tool call and ends the turn with `end_turn`.
//! - `no-initialize`: never answers `initialize`.
//! - `exit-mid-prompt`: sends one message chunk on prompt, writes
//!   `crashed-agent-was-here.txt`, then exits with code 3.
//! - `hang`: on prompt, writes `agent-waiting-for-cancel`, waits until `session/cancel`,
//!   then ends the turn `cancelled`.

#![forbid(unsafe_code)]

use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    AgentCapabilities, CancelNotification, ContentBlock, ContentChunk, InitializeRequest,
    InitializeResponse, LoadSessionRequest, LoadSessionResponse, NewSessionRequest,
    NewSessionResponse, PermissionOption, PermissionOptionKind, Plan, PlanEntry, PlanEntryPriority,
    PlanEntryStatus, PromptRequest, PromptResponse, RequestPermissionOutcome,
    RequestPermissionRequest, SessionNotification, SessionUpdate, StopReason, TextContent,
    ToolCall, ToolCallStatus, ToolCallUpdate, ToolCallUpdateFields, ToolKind,
};
use agent_client_protocol::{Agent, Client, Stdio};
use std::sync::{Arc, Mutex};

#[derive(Default)]
struct State {
    session: Option<(String, bool)>,
}

fn text(session: &str, text: String) -> SessionNotification {
    SessionNotification::new(
        session.to_owned(),
        SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(TextContent::new(
            text,
        )))),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> agent_client_protocol::Result<()> {
    let mode = std::env::args().nth(1).unwrap_or_else(|| "normal".into());
    if mode == "no-initialize" {
        // Read nothing, answer nothing; the client's timeout ends this.
        loop {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
        }
    }
    let state = Arc::new(Mutex::new(State::default()));
    let (cancel_tx, cancel_rx) = tokio::sync::watch::channel(false);
    let (s1, s2, s3) = (Arc::clone(&state), Arc::clone(&state), Arc::clone(&state));
    Agent
        .v1()
        .name("omabox-fake-acp-agent")
        .on_receive_request(
            async move |request: InitializeRequest, responder, _cx| {
                responder.respond(
                    InitializeResponse::new(request.protocol_version)
                        .agent_capabilities(AgentCapabilities::new().load_session(true)),
                )
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |_request: NewSessionRequest, responder, _cx| {
                let id = format!("fake-{}-{}", std::process::id(), rand_suffix());
                let mut state = s1.lock().unwrap();
                state.session = Some((id.clone(), false));
                responder.respond(NewSessionResponse::new(id))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_request(
            async move |request: LoadSessionRequest, responder, _cx| {
                if std::path::Path::new("fail-load").exists() {
                    return responder.respond_with_error(
                        agent_client_protocol::Error::internal_error()
                            .data(serde_json::Value::from("told to fail session/load")),
                    );
                }
                let mut state = s2.lock().unwrap();
                state.session = Some((request.session_id.0.to_string(), true));
                responder.respond(LoadSessionResponse::new())
            },
            agent_client_protocol::on_receive_request!(),
        )
        .on_receive_notification(
            async move |_cancel: CancelNotification, _cx| {
                let _ = cancel_tx.send(true);
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: PromptRequest, responder, cx: ConnectionTo<Client>| {
                let (state, mode, cancelled) = (Arc::clone(&s3), mode.clone(), cancel_rx.clone());
                let session = request.session_id.0.to_string();
                cx.spawn({
                    let cx = cx.clone();
                    async move {
                        let reason = prompt(&cx, &session, &mode, state, cancelled).await?;
                        responder.respond(PromptResponse::new(reason))
                    }
                })
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_to(Stdio::new())
        .await
}

async fn prompt(
    cx: &ConnectionTo<Client>,
    session: &str,
    mode: &str,
    state: Arc<Mutex<State>>,
    mut cancelled: tokio::sync::watch::Receiver<bool>,
) -> agent_client_protocol::Result<StopReason> {
    let current = state.lock().unwrap().session.clone();
    let how = match current {
        Some((id, true)) if id == session => format!("loaded session {id}"),
        _ => format!("new session {session}"),
    };
    cx.send_notification(text(session, format!("hello from the fake agent, {how}")))?;
    match mode {
        "exit-mid-prompt" => {
            let _ = std::fs::write("crashed-agent-was-here.txt", "");
            std::process::exit(3)
        }
        "hang" => {
            let _ = std::fs::write("agent-waiting-for-cancel", "");
            let _ = cancelled.wait_for(|cancelled| *cancelled).await;
            return Ok(StopReason::Cancelled);
        }
        _ => {}
    }
    cx.send_notification(SessionNotification::new(
        session.to_owned(),
        SessionUpdate::Plan(Plan::new(vec![PlanEntry::new(
            "write agent-was-here.txt",
            PlanEntryPriority::High,
            PlanEntryStatus::InProgress,
        )])),
    ))?;
    cx.send_notification(SessionNotification::new(
        session.to_owned(),
        SessionUpdate::ToolCall(
            ToolCall::new("write-1", "write agent-was-here.txt").kind(ToolKind::Edit),
        ),
    ))?;
    let answer = cx
        .send_request(RequestPermissionRequest::new(
            session.to_owned(),
            ToolCallUpdate::new("write-1", ToolCallUpdateFields::new()),
            vec![
                PermissionOption::new("allow", "Allow", PermissionOptionKind::AllowOnce),
                PermissionOption::new("reject", "Reject", PermissionOptionKind::RejectOnce),
            ],
        ))
        .block_task()
        .await?;
    let allowed = matches!(&answer.outcome,
        RequestPermissionOutcome::Selected(selected) if selected.option_id.0.as_ref() == "allow");
    let status = if allowed && std::fs::write("agent-was-here.txt", written(&how)).is_ok() {
        ToolCallStatus::Completed
    } else {
        ToolCallStatus::Failed
    };
    cx.send_notification(SessionNotification::new(
        session.to_owned(),
        SessionUpdate::ToolCallUpdate(ToolCallUpdate::new(
            "write-1",
            ToolCallUpdateFields::new().status(status),
        )),
    ))?;
    Ok(StopReason::EndTurn)
}

/// What `agent-was-here.txt` says: the session, and whether the session token reached the
/// agent's env (never its value).
fn written(how: &str) -> String {
    let token = std::env::var_os("HOSTED_INFERENCE_TOKEN").is_some();
    let mut text = format!("{how}\ntoken in env: {token}\n");
    // Claude Code's native wiring, when the run gave it (never the token's value).
    if let Ok(dir) = std::env::var("CLAUDE_CONFIG_DIR") {
        text.push_str(&format!("claude config dir: {dir}\n"));
    }
    if let Ok(url) = std::env::var("ANTHROPIC_BASE_URL") {
        let auth = std::env::var_os("ANTHROPIC_AUTH_TOKEN").is_some();
        text.push_str(&format!(
            "anthropic base url: {url}\nanthropic auth token: {auth}\n"
        ));
    }
    text
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}
