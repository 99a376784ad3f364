//! The ACP harness's event log as `omabox run --acp-command` shows it.
//!
//! Human mode prints each event on stdout as it arrives: agent message chunks as plain text
//! (joined), every other event on its own `[kind] …` line; control characters other than
//! newline and tab are shown as U+FFFD (the agent is untrusted), and within an event's line
//! its fields (tool titles, plan entries, warnings) are one line each, escaped
//! (`terminal_safe::one_line`): a title cannot pose as the next event's line. `--json` streams JSON Lines: each
//! event, as it arrives, is one line holding one canonical event (`omabox_acp::events`,
//! `{"type":"tool_call",…}`), and the run's report ends the stream as one more line (the
//! object with `result`), whose `acpEvents` array repeats the whole log (bounded by
//! `omabox_acp::events::MAX_EVENTS`).

use crate::terminal_safe::one_line;
use omabox_acp::{AcpEvent, AcpEventSink};
use std::io::Write as _;
use std::sync::Mutex;

/// Collects the events and prints them (human lines, or JSON Lines with `--json`).
#[derive(Debug)]
pub struct AcpEventLog {
    human: bool,
    state: Mutex<LogState>,
}

#[derive(Debug, Default)]
struct LogState {
    events: Vec<AcpEvent>,
    /// A message is being printed (the next non-message event starts a new line).
    in_message: bool,
}

impl AcpEventLog {
    /// A log that prints human lines (`human`) or JSON Lines (`--json`).
    pub fn new(human: bool) -> Self {
        Self {
            human,
            state: Mutex::new(LogState::default()),
        }
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<AcpEvent> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .events
            .clone()
    }

    /// Ends an unfinished message line.
    pub fn finish(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.human && state.in_message {
            outln!();
            state.in_message = false;
        }
    }
}

/// `text` as it may reach a terminal: the agent is untrusted, so control characters other
/// than newline and tab (escape sequences could retitle the terminal, write the clipboard,
/// or hide lines) become U+FFFD.
fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    let hostile = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(hostile) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars()
            .map(|c| if hostile(c) { '\u{fffd}' } else { c })
            .collect(),
    )
}

/// The human line of a non-message event.
fn line_of(event: &AcpEvent) -> String {
    match event {
        AcpEvent::Session {
            acp_session_id,
            resumed,
        } => {
            let how = if *resumed { "resumed" } else { "new" };
            format!("[session] {how} ACP session {acp_session_id}")
        }
        AcpEvent::AgentMessage { text } => text.clone(),
        AcpEvent::ToolCall {
            tool_call_id,
            title,
            kind,
            status,
        } => format!(
            "[tool] {} ({kind}, {status}) #{tool_call_id}",
            one_line(title)
        ),
        AcpEvent::ToolCallUpdate {
            tool_call_id,
            status,
            title,
        } => format!(
            "[tool] #{tool_call_id} {}{}",
            status.as_deref().unwrap_or("updated"),
            title
                .as_deref()
                .map(|t| format!(": {}", one_line(t)))
                .unwrap_or_default()
        ),
        AcpEvent::Plan { entries } => {
            let mut text = "[plan]".to_owned();
            for entry in entries {
                text.push_str(&format!(
                    "\n  - [{}] {} ({})",
                    entry.status,
                    one_line(&entry.content),
                    entry.priority
                ));
            }
            text
        }
        AcpEvent::Permission {
            tool_call_id,
            decision,
            ..
        } => format!("[permission] #{tool_call_id} {decision}"),
        AcpEvent::Warning { message } => format!("[warning] {}", one_line(message)),
        AcpEvent::Stop { reason } => format!("[stop] {}", one_line(reason)),
    }
}

impl AcpEventSink for AcpEventLog {
    fn event(&self, event: &AcpEvent) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.events.push(event.clone());
        let mut out = std::io::stdout().lock();
        if !self.human {
            if let Ok(line) = serde_json::to_string(event) {
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
            }
            return;
        }
        match event {
            AcpEvent::AgentMessage { text } => {
                let _ = write!(out, "{}", printable(text));
                state.in_message = true;
            }
            other => {
                if state.in_message {
                    let _ = writeln!(out);
                    state.in_message = false;
                }
                let _ = writeln!(out, "{}", printable(&line_of(other)));
            }
        }
        let _ = out.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_never_reach_the_terminal() {
        assert_eq!(printable("plain\ttext\n"), "plain\ttext\n");
        assert_eq!(
            printable("\x1b]52;c;cHduZWQ=\x07title\r\u{9b}2J"),
            "\u{fffd}]52;c;cHduZWQ=\u{fffd}title\u{fffd}\u{fffd}2J"
        );
    }

    #[test]
    fn a_tool_title_cannot_pose_as_another_event_line() {
        let line = line_of(&AcpEvent::ToolCall {
            tool_call_id: "t1".into(),
            title: "ls\n[stop] end_turn\u{202e}".into(),
            kind: "execute".into(),
            status: "pending".into(),
        });
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains(r"ls\n[stop] end_turn\u{202e}"), "{line}");
    }

    #[test]
    fn events_are_collected_in_order() {
        let log = AcpEventLog::new(false);
        log.event(&AcpEvent::AgentMessage { text: "hi".into() });
        log.event(&AcpEvent::Stop {
            reason: "end_turn".into(),
        });
        assert_eq!(log.events().len(), 2);
        assert_eq!(
            line_of(&AcpEvent::Stop {
                reason: "end_turn".into()
            }),
            "[stop] end_turn"
        );
    }
}
