//! The logs `GET /sandboxes/{id}/logs` answers: per sandbox, what serve saw happen to it
//! (created, a process started with its command, a process ended with its code or signal,
//! network changed, paused, resumed, killed, timed out, its init gone), in serve's memory.
//!
//! Bounded: [`MAX_ENTRIES`] per sandbox (the oldest dropped, and said so on reading), each
//! text capped, and the logs of at most [`MAX_ENDED`] ended sandboxes kept after their end.
//!
//! Must never: hold a secret — no environment value (only variable names), no token; keep
//! a control character of a sandbox's text.

use omabox_proxy::e2b::{LogLevel, SandboxLogEntry};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

/// Entries one sandbox's log keeps (the oldest dropped beyond it).
pub const MAX_ENTRIES: usize = 1000;
/// Ended sandboxes whose logs are kept (the longest ended dropped beyond it).
pub const MAX_ENDED: usize = 256;
/// Characters of a message or a field value kept.
const MAX_TEXT: usize = 256;

/// `text` capped at [`MAX_TEXT`] characters, control characters shown as `?`.
pub(super) fn clean(text: &str) -> String {
    let mut shown: String = text
        .chars()
        .take(MAX_TEXT)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect();
    if text.chars().nth(MAX_TEXT).is_some() {
        shown.push('…');
    }
    shown
}

/// One sandbox's log.
#[derive(Debug, Default)]
pub(super) struct SandboxLog {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    entries: VecDeque<SandboxLogEntry>,
    dropped: u64,
}

impl SandboxLog {
    /// Adds an entry (`message` and values cleaned).
    pub(super) fn push(&self, level: LogLevel, message: &str, fields: &[(&str, String)]) {
        let entry = SandboxLogEntry {
            timestamp: SystemTime::now(),
            level,
            message: clean(message),
            fields: fields
                .iter()
                .map(|(key, value)| ((*key).to_owned(), clean(value)))
                .collect(),
        };
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.entries.len() >= MAX_ENTRIES {
            kept.entries.pop_front();
            kept.dropped += 1;
        }
        kept.entries.push_back(entry);
    }

    /// Shorthand for an `info` entry with an `event` field.
    pub(super) fn info(&self, event: &str, message: &str) {
        self.push(LogLevel::Info, message, &[("event", event.to_owned())]);
    }

    /// The entries, oldest first; a `warn` entry first when older ones were dropped.
    pub(super) fn entries(&self) -> Vec<SandboxLogEntry> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        let mut entries = Vec::with_capacity(kept.entries.len() + 1);
        if kept.dropped > 0 {
            entries.push(SandboxLogEntry {
                timestamp: kept
                    .entries
                    .front()
                    .map_or_else(SystemTime::now, |e| e.timestamp),
                level: LogLevel::Warn,
                message: format!(
                    "{} earlier entries were dropped (a log keeps {MAX_ENTRIES})",
                    kept.dropped
                ),
                fields: BTreeMap::from([("event".to_owned(), "dropped".to_owned())]),
            });
        }
        entries.extend(kept.entries.iter().cloned());
        entries
    }
}

/// Every sandbox's log: those of live (running or paused) sandboxes, and of the last
/// [`MAX_ENDED`] ended ones.
#[derive(Debug, Default)]
pub(super) struct Logs {
    state: Mutex<LogsState>,
}

#[derive(Debug, Default)]
struct LogsState {
    by_id: HashMap<String, Arc<SandboxLog>>,
    /// Ended sandboxes, longest ended first.
    ended: VecDeque<String>,
}

impl Logs {
    fn state(&self) -> std::sync::MutexGuard<'_, LogsState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The log of `id`, made when it has none.
    pub(super) fn open(&self, id: &str) -> Arc<SandboxLog> {
        Arc::clone(self.state().by_id.entry(id.to_owned()).or_default())
    }

    /// The log of `id`, if kept.
    pub(super) fn get(&self, id: &str) -> Option<Arc<SandboxLog>> {
        self.state().by_id.get(id).cloned()
    }

    /// Ends `id`'s sandbox with a last entry; its log is kept among the last
    /// [`MAX_ENDED`] ended ones.
    pub(super) fn end(&self, id: &str, level: LogLevel, event: &str, message: &str) {
        let mut state = self.state();
        let Some(log) = state.by_id.get(id).cloned() else {
            return;
        };
        log.push(level, message, &[("event", event.to_owned())]);
        if state.ended.iter().any(|ended| ended == id) {
            return;
        }
        state.ended.push_back(id.to_owned());
        while state.ended.len() > MAX_ENDED {
            if let Some(oldest) = state.ended.pop_front() {
                state.by_id.remove(&oldest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_keeps_its_newest_entries_and_says_how_many_were_dropped() {
        let log = SandboxLog::default();
        for n in 0..MAX_ENTRIES + 5 {
            log.info("test", &format!("entry {n}"));
        }
        let entries = log.entries();
        assert_eq!(entries.len(), MAX_ENTRIES + 1);
        assert_eq!(entries[0].level, LogLevel::Warn);
        assert!(entries[0].message.starts_with("5 earlier entries"));
        assert_eq!(entries[1].message, "entry 5");
        assert_eq!(
            entries[MAX_ENTRIES].message,
            format!("entry {}", MAX_ENTRIES + 4)
        );
    }

    #[test]
    fn texts_are_capped_and_control_characters_replaced() {
        assert_eq!(clean("a\x1b[2Jb\n"), "a?[2Jb?");
        let long = "x".repeat(MAX_TEXT + 10);
        assert_eq!(clean(&long).chars().count(), MAX_TEXT + 1);
    }

    #[test]
    fn only_the_last_ended_logs_are_kept() {
        let logs = Logs::default();
        for n in 0..MAX_ENDED + 2 {
            logs.open(&format!("s{n}")).info("created", "created");
            logs.end(&format!("s{n}"), LogLevel::Info, "killed", "killed");
        }
        logs.open("live");
        assert!(logs.get("s0").is_none() && logs.get("s1").is_none());
        assert!(logs.get("s2").is_some() && logs.get("live").is_some());
        let last = logs.get(&format!("s{}", MAX_ENDED + 1)).unwrap().entries();
        assert_eq!(last.last().unwrap().message, "killed");
    }
}
