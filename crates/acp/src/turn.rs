//! One ACP turn as the client: `initialize` (bounded by a timeout), `session/resume` of the
//! saved session when the agent advertises `sessionCapabilities.resume`, else `session/load`
//! when it can load sessions (neither, or a failure: `session/new`),
//! one `session/prompt`, `session/cancel` when the run is aborted, then close (returning
//! from the connection closes the agent's stdin).
//!
//! `session/update` notifications become [`AcpEvent`]s (replayed history during
//! `session/load` is dropped: the log is this turn's); `session/request_permission` is
//! answered by the [`PermissionPolicy`] at once, inside the dispatch loop.
//!
//! The client is the `agent-client-protocol` crate (5.x, `Client.v1()`), whose futures are
//! `Send`: the turn runs on the caller's tokio runtime, no `LocalSet`.
//!
//! A turn asked to [`Keep`] the connection (a warm session, `crate::live`) reports its
//! outcome as soon as the prompt returned and then stays connected, sending one more
//! `session/prompt` in the same ACP session per [`PromptJob`] until the job channel closes
//! or a prompt fails; events then go to the job's emitter.

use crate::events::{AcpEvent, EventEmitter, MAX_PLAN_ENTRIES, PlanEntry, cap_text};
use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, LoadSessionRequest, NewSessionRequest,
    PermissionOptionKind, PromptRequest, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, ResumeSessionRequest, SelectedPermissionOutcome,
    SessionNotification, SessionUpdate, TextContent,
};
use agent_client_protocol::{Agent, Client, ConnectTo};
use omabox_contract::AbortSignal;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How a permission request of the agent is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PermissionPolicy {
    /// Select the agent's first allow option (`allow_once`/`allow_always`): the sandbox is
    /// the boundary. The default.
    #[default]
    Allow,
    /// Select the agent's first reject option (or cancel the request when it offers none).
    Deny,
}

/// What one turn needs.
#[derive(Debug, Clone)]
pub(crate) struct TurnRequest {
    pub prompt: String,
    pub cwd: String,
    pub resume: Option<String>,
    pub permission: PermissionPolicy,
    pub initialize_timeout: Duration,
    pub turn_timeout: Duration,
    pub cancel_grace: Duration,
}

/// One more prompt for a kept connection (see [`Keep`]).
pub(crate) struct PromptJob {
    pub prompt: String,
    pub turn_timeout: Duration,
    pub cancel_grace: Duration,
    pub events: EventEmitter,
    pub signal: AbortSignal,
    pub reply: oneshot::Sender<Result<TurnOutcome, AcpTurnError>>,
}

/// Keeps the connection after a turn that ended (not aborted): `first` gets that turn's
/// outcome at once, then `jobs` are prompted in the same session one at a time.
pub(crate) struct Keep {
    pub first: oneshot::Sender<Result<TurnOutcome, AcpTurnError>>,
    pub jobs: mpsc::Receiver<PromptJob>,
}

/// The emitter the connection's handlers forward to: the current turn's.
#[derive(Clone)]
struct CurrentEvents(Arc<Mutex<EventEmitter>>);

impl CurrentEvents {
    fn emit(&self, event: AcpEvent) {
        let emitter = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        emitter.emit(event);
    }

    fn set(&self, emitter: EventEmitter) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = emitter;
    }
}

/// How a turn ended without a protocol failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TurnOutcome {
    /// The prompt returned a stop reason; `aborted` when the run was cancelled meanwhile.
    Ended {
        session_id: String,
        stop_reason: String,
        aborted: bool,
    },
    /// The run was aborted before a prompt was sent.
    AbortedBeforePrompt,
}

/// Why a turn failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AcpTurnError {
    /// `initialize` got no answer in time.
    #[error("the ACP agent did not answer initialize within {}", human(.0))]
    InitializeTimeout(Duration),
    /// `session/new` or `session/load` got no answer in time (the initialize timeout).
    #[error("the ACP agent did not answer {step} within {}", human(.timeout))]
    SetupTimeout {
        /// The ACP method.
        step: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The prompt's turn ran past the turn timeout (the agent was sent `session/cancel`).
    #[error("the ACP agent's turn did not end within {}", human(.0))]
    TurnTimeout(Duration),
    /// The agent kept running its turn after `session/cancel`.
    #[error("the ACP agent did not end its turn within {} of session/cancel", human(.0))]
    CancelIgnored(Duration),
    /// A request failed (the agent answered with an error, or the connection broke).
    #[error("ACP {step} failed: {message}")]
    Request {
        /// The ACP method.
        step: &'static str,
        /// The error, capped.
        message: String,
    },
    /// The connection itself failed.
    #[error("the ACP connection failed: {0}")]
    Connection(String),
}

impl AcpTurnError {
    /// A timeout of omabox's (the agent may well be alive): not to be blamed on its exit.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Self::InitializeTimeout(_)
                | Self::SetupTimeout { .. }
                | Self::TurnTimeout(_)
                | Self::CancelIgnored(_)
        )
    }
}

/// `60s`, or `500ms` when not whole seconds.
fn human(duration: &Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else {
        format!("{}ms", duration.as_millis())
    }
}

/// At most 1 KiB of an error text that may come from the agent, on one line (the crate's
/// errors carry pretty-printed JSON data).
fn short(error: impl std::fmt::Display) -> String {
    let text = error
        .to_string()
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if text.len() <= 1024 {
        return text;
    }
    let mut end = 1024;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Waits for the answer to a session setup request (bounded by the initialize timeout):
/// `None` when the run was aborted meanwhile.
async fn setup_step<T>(
    answer: impl Future<Output = Result<T, agent_client_protocol::Error>>,
    step: &'static str,
    request: &TurnRequest,
    signal: &AbortSignal,
) -> Result<Option<Result<T, agent_client_protocol::Error>>, AcpTurnError> {
    tokio::select! {
        biased;
        _ = signal.aborted() => Ok(None),
        answer = tokio::time::timeout(request.initialize_timeout, answer) => answer
            .map(Some)
            .map_err(|_| AcpTurnError::SetupTimeout {
                step,
                timeout: request.initialize_timeout,
            }),
    }
}

fn request_error(step: &'static str) -> impl Fn(agent_client_protocol::Error) -> AcpTurnError {
    move |error| AcpTurnError::Request {
        step,
        message: short(error),
    }
}

/// The JSON string of a serde enum (`"end_turn"`), or "" when it is not a string.
fn name_of<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(name)) => cap_text(&name),
        _ => String::new(),
    }
}

/// The event of one `session/update`, if it is one the log keeps.
fn event_of(update: SessionUpdate) -> Option<AcpEvent> {
    match update {
        SessionUpdate::AgentMessageChunk(chunk) => match chunk.content {
            ContentBlock::Text(text) => Some(AcpEvent::AgentMessage {
                text: cap_text(&text.text),
            }),
            _ => None,
        },
        SessionUpdate::ToolCall(call) => Some(AcpEvent::ToolCall {
            tool_call_id: name_of(&call.tool_call_id),
            title: cap_text(&call.title),
            kind: name_of(&call.kind),
            status: name_of(&call.status),
        }),
        SessionUpdate::ToolCallUpdate(update) => Some(AcpEvent::ToolCallUpdate {
            tool_call_id: name_of(&update.tool_call_id),
            status: update.fields.status.as_ref().map(name_of),
            title: update.fields.title.as_deref().map(cap_text),
        }),
        SessionUpdate::Plan(plan) => Some(AcpEvent::Plan {
            entries: plan
                .entries
                .iter()
                .take(MAX_PLAN_ENTRIES)
                .map(|entry| PlanEntry {
                    content: cap_text(&entry.content),
                    status: name_of(&entry.status),
                    priority: name_of(&entry.priority),
                })
                .collect(),
        }),
        _ => None,
    }
}

/// The answer to a permission request under `policy`, and its event.
fn decide(
    policy: PermissionPolicy,
    request: &RequestPermissionRequest,
) -> (RequestPermissionResponse, AcpEvent) {
    let kinds: &[PermissionOptionKind] = match policy {
        PermissionPolicy::Allow => &[
            PermissionOptionKind::AllowOnce,
            PermissionOptionKind::AllowAlways,
        ],
        PermissionPolicy::Deny => &[
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ],
    };
    let chosen = request
        .options
        .iter()
        .find(|option| kinds.contains(&option.kind));
    let allowed = policy == PermissionPolicy::Allow && chosen.is_some();
    let event = AcpEvent::Permission {
        tool_call_id: name_of(&request.tool_call.tool_call_id),
        decision: if allowed { "allowed" } else { "denied" }.to_owned(),
        option_id: chosen.map(|option| name_of(&option.option_id)),
    };
    let outcome = match chosen {
        Some(option) => RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(
            option.option_id.clone(),
        )),
        None => RequestPermissionOutcome::Cancelled,
    };
    (RequestPermissionResponse::new(outcome), event)
}

/// Runs one turn over `transport`; with `keep`, more turns (module doc).
pub(crate) async fn run_turn(
    transport: impl ConnectTo<Client> + 'static,
    request: TurnRequest,
    events: EventEmitter,
    signal: AbortSignal,
    keep: Option<Keep>,
) -> Result<TurnOutcome, AcpTurnError> {
    // Set while `session/load` replays the loaded session's history.
    let replaying = Arc::new(AtomicBool::new(false));
    let current = CurrentEvents(Arc::new(Mutex::new(events.clone())));
    let (updates, updates_replaying) = (current.clone(), Arc::clone(&replaying));
    let (permissions, policy) = (current.clone(), request.permission);
    let result = Client
        .v1()
        .name("omabox")
        .on_receive_notification(
            async move |notification: SessionNotification, _cx| {
                if !updates_replaying.load(Ordering::SeqCst)
                    && let Some(event) = event_of(notification.update)
                {
                    updates.emit(event);
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                let (response, event) = decide(policy, &request);
                permissions.emit(event);
                responder.respond(response)
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let outcome = conversation(&cx, request, events, replaying, signal).await;
            let Some(keep) = keep else {
                return Ok(outcome);
            };
            let session_id = match &outcome {
                Ok(TurnOutcome::Ended {
                    session_id,
                    aborted: false,
                    ..
                }) => session_id.clone(),
                _ => return Ok(outcome),
            };
            if keep.first.send(outcome.clone()).is_err() {
                return Ok(outcome);
            }
            let mut jobs = keep.jobs;
            while let Some(job) = jobs.recv().await {
                current.set(job.events.clone());
                let prompted = prompt(
                    &cx,
                    &session_id,
                    &job.prompt,
                    (job.turn_timeout, job.cancel_grace),
                    &job.events,
                    &job.signal,
                )
                .await;
                // A failed or cancelled prompt leaves the agent in a state the next turn
                // must not inherit: the connection ends (the next turn is cold).
                let ended = matches!(prompted, Ok(TurnOutcome::Ended { aborted: false, .. }));
                let _ = job.reply.send(prompted);
                if !ended {
                    break;
                }
            }
            Ok(outcome)
        })
        .await;
    match result {
        Ok(outcome) => outcome,
        Err(error) => Err(AcpTurnError::Connection(short(error))),
    }
}

async fn conversation(
    cx: &ConnectionTo<Agent>,
    request: TurnRequest,
    events: EventEmitter,
    replaying: Arc<AtomicBool>,
    signal: AbortSignal,
) -> Result<TurnOutcome, AcpTurnError> {
    let initialize = cx
        .send_request(InitializeRequest::new(ProtocolVersion::V1))
        .block_task();
    let initialized = tokio::select! {
        biased;
        _ = signal.aborted() => return Ok(TurnOutcome::AbortedBeforePrompt),
        answer = tokio::time::timeout(request.initialize_timeout, initialize) => answer,
    };
    let initialized = initialized
        .map_err(|_| AcpTurnError::InitializeTimeout(request.initialize_timeout))?
        .map_err(request_error("initialize"))?;
    let can_load = initialized.agent_capabilities.load_session;
    let can_resume = initialized
        .agent_capabilities
        .session_capabilities
        .resume
        .is_some();

    // The saved session, reopened: session/resume (no history replay) when the agent
    // advertises it, else session/load (its replayed history is not this turn's log).
    let mut session = None;
    if let Some(saved) = &request.resume {
        let reopened = if can_resume {
            let resume = ResumeSessionRequest::new(saved.clone(), request.cwd.clone());
            let answer = cx.send_request(resume).block_task();
            let answer = setup_step(answer, "session/resume", &request, &signal).await?;
            Some(("session/resume", answer.map(|a| a.map(drop))))
        } else if can_load {
            replaying.store(true, Ordering::SeqCst);
            let load = LoadSessionRequest::new(saved.clone(), request.cwd.clone());
            let answer = cx.send_request(load).block_task();
            let answer = setup_step(answer, "session/load", &request, &signal).await?;
            replaying.store(false, Ordering::SeqCst);
            Some(("session/load", answer.map(|a| a.map(drop))))
        } else {
            events.emit(AcpEvent::Warning {
                message:
                    "the ACP agent can neither resume nor load sessions; starting a new session"
                        .to_owned(),
            });
            None
        };
        match reopened {
            Some((_, None)) => return Ok(TurnOutcome::AbortedBeforePrompt),
            Some((_, Some(Ok(())))) => session = Some((saved.clone(), true)),
            Some((step, Some(Err(error)))) => events.emit(AcpEvent::Warning {
                message: format!(
                    "{step} of the saved ACP session failed ({}); starting a new session",
                    short(error)
                ),
            }),
            None => {}
        }
    }
    let (session_id, resumed) = match session {
        Some(session) => session,
        None => {
            let new = cx
                .send_request(NewSessionRequest::new(request.cwd.clone()))
                .block_task();
            let Some(created) = setup_step(new, "session/new", &request, &signal).await? else {
                return Ok(TurnOutcome::AbortedBeforePrompt);
            };
            let created = created.map_err(request_error("session/new"))?;
            (name_of(&created.session_id), false)
        }
    };
    events.emit(AcpEvent::Session {
        acp_session_id: session_id.clone(),
        resumed,
    });

    prompt(
        cx,
        &session_id,
        &request.prompt,
        (request.turn_timeout, request.cancel_grace),
        &events,
        &signal,
    )
    .await
}

/// One `session/prompt` in `session_id`: `session/cancel` when `signal` aborts it or it runs
/// past `limits.0` (the turn timeout), then at most `limits.1` (the cancel grace) for the
/// agent to end it.
async fn prompt(
    cx: &ConnectionTo<Agent>,
    session_id: &str,
    text: &str,
    (turn_timeout, cancel_grace): (Duration, Duration),
    events: &EventEmitter,
    signal: &AbortSignal,
) -> Result<TurnOutcome, AcpTurnError> {
    let prompt = cx
        .send_request(PromptRequest::new(
            session_id.to_owned(),
            vec![ContentBlock::Text(TextContent::new(text.to_owned()))],
        ))
        .block_task();
    tokio::pin!(prompt);
    let mut aborted = false;
    let answer = tokio::select! {
        answer = &mut prompt => answer,
        _ = signal.aborted() => {
            aborted = true;
            cx.send_notification(CancelNotification::new(session_id.to_owned()))
                .map_err(request_error("session/cancel"))?;
            tokio::time::timeout(cancel_grace, &mut prompt)
                .await
                .map_err(|_| AcpTurnError::CancelIgnored(cancel_grace))?
        }
        _ = tokio::time::sleep(turn_timeout) => {
            let _ = cx.send_notification(CancelNotification::new(session_id.to_owned()));
            let _ = tokio::time::timeout(cancel_grace, &mut prompt).await;
            return Err(AcpTurnError::TurnTimeout(turn_timeout));
        }
    };
    let answer = answer.map_err(request_error("session/prompt"))?;
    let stop_reason = name_of(&answer.stop_reason);
    events.emit(AcpEvent::Stop {
        reason: stop_reason.clone(),
    });
    Ok(TurnOutcome::Ended {
        session_id: session_id.to_owned(),
        stop_reason,
        aborted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use agent_client_protocol::v1::schema::{
        PermissionOption, ToolCallUpdate, ToolCallUpdateFields,
    };

    #[test]
    fn error_texts_are_one_short_line() {
        assert_eq!(short("a {\n  \"b\": 1\n}"), "a { \"b\": 1 }");
        let long = short("é".repeat(2000));
        assert!(long.len() <= 1024 + "…".len() && long.ends_with('…'));
    }

    #[test]
    fn updates_become_capped_events() {
        use agent_client_protocol::v1::schema::{ContentChunk, ToolCall, ToolKind};
        let long = "x".repeat(crate::events::MAX_TEXT_BYTES + 10);
        let chunk = SessionUpdate::AgentMessageChunk(ContentChunk::new(ContentBlock::Text(
            TextContent::new(long),
        )));
        let Some(AcpEvent::AgentMessage { text }) = event_of(chunk) else {
            panic!("a message event");
        };
        assert!(text.ends_with("…[truncated]"));
        let call = SessionUpdate::ToolCall(ToolCall::new("t", "run tests").kind(ToolKind::Execute));
        assert_eq!(
            event_of(call),
            Some(AcpEvent::ToolCall {
                tool_call_id: "t".into(),
                title: "run tests".into(),
                kind: "execute".into(),
                status: "pending".into(),
            })
        );
        let plan = agent_client_protocol::v1::schema::Plan::new(
            (0..MAX_PLAN_ENTRIES + 5)
                .map(|i| {
                    agent_client_protocol::v1::schema::PlanEntry::new(
                        format!("step {i}"),
                        agent_client_protocol::v1::schema::PlanEntryPriority::Low,
                        agent_client_protocol::v1::schema::PlanEntryStatus::Pending,
                    )
                })
                .collect(),
        );
        let Some(AcpEvent::Plan { entries }) = event_of(SessionUpdate::Plan(plan)) else {
            panic!("a plan event");
        };
        assert_eq!(entries.len(), MAX_PLAN_ENTRIES);
        assert_eq!(entries[0].priority, "low");
    }

    fn request(options: Vec<PermissionOption>) -> RequestPermissionRequest {
        RequestPermissionRequest::new(
            "s",
            ToolCallUpdate::new("t-1", ToolCallUpdateFields::new()),
            options,
        )
    }

    fn options() -> Vec<PermissionOption> {
        vec![
            PermissionOption::new("no", "No", PermissionOptionKind::RejectOnce),
            PermissionOption::new("yes", "Yes", PermissionOptionKind::AllowOnce),
            PermissionOption::new("always", "Always", PermissionOptionKind::AllowAlways),
        ]
    }

    #[test]
    fn allow_picks_the_first_allow_option() {
        let (response, event) = decide(PermissionPolicy::Allow, &request(options()));
        assert_eq!(
            serde_json::to_value(&response).unwrap()["outcome"]["optionId"],
            "yes"
        );
        assert_eq!(
            event,
            AcpEvent::Permission {
                tool_call_id: "t-1".into(),
                decision: "allowed".into(),
                option_id: Some("yes".into()),
            }
        );
    }

    #[test]
    fn deny_picks_a_reject_option_or_cancels() {
        let (response, event) = decide(PermissionPolicy::Deny, &request(options()));
        assert_eq!(
            serde_json::to_value(&response).unwrap()["outcome"]["optionId"],
            "no"
        );
        assert!(matches!(event, AcpEvent::Permission { ref decision, .. } if decision == "denied"));
        let (response, _) = decide(PermissionPolicy::Deny, &request(Vec::new()));
        assert_eq!(
            serde_json::to_value(&response).unwrap()["outcome"]["outcome"],
            "cancelled"
        );
        let (_, event) = decide(PermissionPolicy::Allow, &request(Vec::new()));
        assert!(matches!(event, AcpEvent::Permission { ref decision, .. } if decision == "denied"));
    }
}
