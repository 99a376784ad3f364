//! The canonical event log of an ACP turn: what the agent said and did, as omabox's own JSON
//! shape (one object per line when written as JSON Lines), independent of the ACP wire.
//!
//! ```text
//! {"type":"session","acpSessionId":"s-1","resumed":false}
//! {"type":"agent_message","text":"Hello"}
//! {"type":"tool_call","toolCallId":"t-1","title":"write file","kind":"edit","status":"pending"}
//! {"type":"tool_call_update","toolCallId":"t-1","status":"completed"}
//! {"type":"plan","entries":[{"content":"step","status":"pending","priority":"high"}]}
//! {"type":"permission","toolCallId":"t-1","decision":"allowed","optionId":"allow"}
//! {"type":"warning","message":"…"}
//! {"type":"stop","reason":"end_turn"}
//! ```
//!
//! The agent is untrusted input: every text it feeds in is capped ([`MAX_TEXT_BYTES`] per
//! field, [`MAX_PLAN_ENTRIES`] per plan) and a turn emits at most [`MAX_EVENTS`] events (the
//! last one a `warning` that the log was truncated). No event carries an env value or the
//! session token: events are built only from what the agent sent and from omabox's
//! decisions.

use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The longest text kept in one event field; longer text is cut at a character boundary and
/// ends with `…[truncated]`.
pub const MAX_TEXT_BYTES: usize = 64 * 1024;
/// The most plan entries kept from one plan update.
pub const MAX_PLAN_ENTRIES: usize = 256;
/// The most events one turn emits, the truncation warning included.
pub const MAX_EVENTS: usize = 10_000;

/// One entry of the event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AcpEvent {
    /// The ACP session the turn runs in; `resumed` when it was loaded (`session/load`).
    #[serde(rename_all = "camelCase")]
    Session {
        /// The agent's session id.
        acp_session_id: String,
        /// Loaded from the harness state rather than created.
        resumed: bool,
    },
    /// A chunk of the agent's reply text.
    AgentMessage {
        /// The text.
        text: String,
    },
    /// A tool call the agent started.
    #[serde(rename_all = "camelCase")]
    ToolCall {
        /// The agent's id of the call.
        tool_call_id: String,
        /// What it does, in the agent's words.
        title: String,
        /// ACP's tool kind (`read`, `edit`, `execute`, …).
        kind: String,
        /// ACP's status (`pending`, `in_progress`, `completed`, `failed`).
        status: String,
    },
    /// A change to a tool call.
    #[serde(rename_all = "camelCase")]
    ToolCallUpdate {
        /// The agent's id of the call.
        tool_call_id: String,
        /// The new status, when it changed.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        status: Option<String>,
        /// The new title, when it changed.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        title: Option<String>,
    },
    /// The agent's plan (each update replaces the whole plan).
    Plan {
        /// The entries.
        entries: Vec<PlanEntry>,
    },
    /// How a permission request of the agent was answered.
    #[serde(rename_all = "camelCase")]
    Permission {
        /// The tool call it asked about.
        tool_call_id: String,
        /// `allowed` or `denied`.
        decision: String,
        /// The option chosen, when one was.
        #[serde(skip_serializing_if = "Option::is_none", default)]
        option_id: Option<String>,
    },
    /// Something the user should know that did not fail the turn.
    Warning {
        /// What happened.
        message: String,
    },
    /// The turn ended; `reason` is ACP's stop reason (`end_turn`, `cancelled`, …).
    Stop {
        /// The reason.
        reason: String,
    },
}

/// One entry of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanEntry {
    /// What the step is.
    pub content: String,
    /// `pending`, `in_progress`, `completed`.
    pub status: String,
    /// `high`, `medium`, `low`.
    pub priority: String,
}

/// Receives the events of a turn as they happen (e.g. the CLI printing them). Called from the
/// connection's tasks; must not block.
pub trait AcpEventSink: Send + Sync {
    /// One event.
    fn event(&self, event: &AcpEvent);
}

/// `text` cut to [`MAX_TEXT_BYTES`] at a character boundary.
pub fn cap_text(text: &str) -> String {
    if text.len() <= MAX_TEXT_BYTES {
        return text.to_owned();
    }
    let mut end = MAX_TEXT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…[truncated]", &text[..end])
}

/// Forwards events to a sink, at most [`MAX_EVENTS`] per turn.
#[derive(Clone)]
pub(crate) struct EventEmitter {
    sink: Option<Arc<dyn AcpEventSink>>,
    emitted: Arc<AtomicUsize>,
}

impl EventEmitter {
    pub(crate) fn new(sink: Option<Arc<dyn AcpEventSink>>) -> Self {
        Self {
            sink,
            emitted: Arc::new(AtomicUsize::new(0)),
        }
    }

    pub(crate) fn emit(&self, event: AcpEvent) {
        let Some(sink) = &self.sink else { return };
        let index = self.emitted.fetch_add(1, Ordering::SeqCst);
        if index + 1 < MAX_EVENTS {
            sink.event(&event);
        } else if index + 1 == MAX_EVENTS {
            sink.event(&AcpEvent::Warning {
                message: format!(
                    "the event log of this turn reached {MAX_EVENTS} events; later events are dropped"
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Collect(Mutex<Vec<AcpEvent>>);
    impl AcpEventSink for Collect {
        fn event(&self, event: &AcpEvent) {
            self.0.lock().unwrap().push(event.clone());
        }
    }

    #[test]
    fn events_have_the_documented_json_shape() {
        let event = AcpEvent::ToolCall {
            tool_call_id: "t-1".into(),
            title: "write".into(),
            kind: "edit".into(),
            status: "pending".into(),
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"type":"tool_call","toolCallId":"t-1","title":"write","kind":"edit","status":"pending"}"#
        );
        let event = AcpEvent::Session {
            acp_session_id: "s".into(),
            resumed: true,
        };
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"type":"session","acpSessionId":"s","resumed":true}"#
        );
    }

    #[test]
    fn long_text_is_cut_at_a_character_boundary() {
        let text = "é".repeat(MAX_TEXT_BYTES);
        let capped = cap_text(&text);
        assert!(capped.len() <= MAX_TEXT_BYTES + "…[truncated]".len());
        assert!(capped.ends_with("…[truncated]"));
        assert_eq!(cap_text("short"), "short");
    }

    #[test]
    fn a_turn_emits_at_most_max_events_and_says_so() {
        let sink = Arc::new(Collect::default());
        let emitter = EventEmitter::new(Some(Arc::clone(&sink) as _));
        for _ in 0..MAX_EVENTS + 50 {
            emitter.emit(AcpEvent::AgentMessage { text: "x".into() });
        }
        let events = sink.0.lock().unwrap();
        assert_eq!(events.len(), MAX_EVENTS);
        assert!(matches!(events.last(), Some(AcpEvent::Warning { .. })));
    }
}
