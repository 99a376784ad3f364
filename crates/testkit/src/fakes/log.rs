//! [`CallLog`]: the ordered record of every port call a fixture's fakes received.
//!
//! Every fake appends one entry per call, at the moment the call starts, whatever the
//! scripted outcome: `"<port>.<method>"`, with `":<reason>"` for the calls that take a
//! termination/abort reason (`"sandbox.terminate:failed"`, `"outputs.abort:lease_lost"`,
//! `"fence.release:completed"`, `"egress.revoke:completed"`).
//!
//! The TypeScript tests record only the calls each fixture cares about, under per-file names
//! (`"terminate:failed"` and `"release:failed"` in the fault matrix, `"sandbox.terminate"` in
//! the runtime-host tests). [`CallLog::select`], [`CallLog::select_bare`] and
//! [`CallLog::fault_matrix_calls`] project the full log onto those views.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Port names as they appear in entries.
pub mod names {
    /// `fence.*`
    pub const FENCE: &str = "fence";
    /// `sandbox.*`
    pub const SANDBOX: &str = "sandbox";
    /// `workspace.*`
    pub const WORKSPACE: &str = "workspace";
    /// `outputs.*`
    pub const OUTPUTS: &str = "outputs";
    /// `harness.*`
    pub const HARNESS: &str = "harness";
    /// `runtime_checkpoint.*`
    pub const RUNTIME_CHECKPOINT: &str = "runtime_checkpoint";
    /// `egress.*`
    pub const EGRESS: &str = "egress";
    /// `session_inputs.*`
    pub const SESSION_INPUTS: &str = "session_inputs";
    /// `orphans.*`
    pub const ORPHANS: &str = "orphans";
    /// `scheduler.*`
    pub const SCHEDULER: &str = "scheduler";
}

/// A shared, ordered call record. Clones share the same record.
#[derive(Debug, Clone, Default)]
pub struct CallLog {
    entries: Arc<Mutex<Vec<String>>>,
}

impl CallLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<String>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends an entry.
    pub fn push(&self, entry: impl Into<String>) {
        self.lock().push(entry.into());
    }

    /// Every entry, in call order.
    pub fn entries(&self) -> Vec<String> {
        self.lock().clone()
    }

    /// True when an entry equals `entry` exactly.
    pub fn contains(&self, entry: &str) -> bool {
        self.lock().iter().any(|candidate| candidate == entry)
    }

    /// Index of the first entry equal to `entry`.
    pub fn position(&self, entry: &str) -> Option<usize> {
        self.lock().iter().position(|candidate| candidate == entry)
    }

    /// How many entries name `call` (the part before any `":reason"`).
    pub fn count(&self, call: &str) -> usize {
        self.lock()
            .iter()
            .filter(|entry| call_name(entry) == call)
            .count()
    }

    /// The entries whose call name is one of `calls`, reasons kept.
    pub fn select(&self, calls: &[&str]) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|entry| calls.contains(&call_name(entry)))
            .cloned()
            .collect()
    }

    /// The entries whose call name is one of `calls`, reasons dropped.
    pub fn select_bare(&self, calls: &[&str]) -> Vec<String> {
        self.lock()
            .iter()
            .map(|entry| call_name(entry))
            .filter(|name| calls.contains(name))
            .map(str::to_owned)
            .collect()
    }

    /// The fault-matrix fixture's `calls`: `terminate:<reason>`, `outputs.release`,
    /// `outputs.abort:<reason>`, `workspace.release`, `release:<reason>` (the fence's).
    pub fn fault_matrix_calls(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter_map(|entry| match call_name(entry) {
                "sandbox.terminate" => Some(entry.replacen("sandbox.", "", 1)),
                "fence.release" => Some(entry.replacen("fence.", "", 1)),
                "outputs.release" | "outputs.abort" | "workspace.release" => Some(entry.clone()),
                _ => None,
            })
            .collect()
    }
}

/// `"port.method"` of an entry.
fn call_name(entry: &str) -> &str {
    entry.split_once(':').map_or(entry, |(name, _)| name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projections() {
        let log = CallLog::new();
        for entry in [
            "fence.acquire",
            "sandbox.terminate:failed",
            "outputs.abort:failed",
            "workspace.release",
            "fence.release:failed",
        ] {
            log.push(entry);
        }
        assert_eq!(
            log.fault_matrix_calls(),
            [
                "terminate:failed",
                "outputs.abort:failed",
                "workspace.release",
                "release:failed"
            ]
        );
        assert_eq!(
            log.select_bare(&["fence.acquire", "sandbox.terminate"]),
            ["fence.acquire", "sandbox.terminate"]
        );
        assert_eq!(log.select(&["outputs.abort"]), ["outputs.abort:failed"]);
        assert_eq!(log.count("fence.release"), 1);
    }
}
