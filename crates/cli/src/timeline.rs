//! The timeline of one `omabox run`: what each port call of the host's transaction did and
//! how long it took.
//!
//! [`Timeline`] is the recorder; the decorators in [`crate::timed_ports`] feed it, one event
//! per port call, in the order the host made them. It prints each event as it happens (the
//! human mode) or only collects them (the `--json` mode, which reports [`Timeline::timings`]).
//! It also remembers the facts the final report needs (the claimed generation, the lease, the
//! published revision), so nothing has to be read back from the host.
//!
//! It never sees a fence token: the decorators record generations, ids and counts only.

use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One finished step of the transaction.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    /// Milliseconds since the run started, when the step finished.
    pub at_ms: f64,
    /// The port call (`sandbox.acquire`, …): the key of [`Timeline::timings`].
    pub step: &'static str,
    /// What happened, for people (`sandbox acquired`).
    pub label: String,
    /// Details (ids, counts, sizes), or the error.
    pub detail: String,
    /// How long the call took, in milliseconds.
    pub ms: f64,
    /// False when the call failed.
    pub ok: bool,
}

/// Facts gathered from the port calls for the final report.
#[derive(Debug, Clone, Default)]
pub struct RunFacts {
    /// The generation this run claimed.
    pub generation: Option<u64>,
    /// The revision of the publication the run started from.
    pub restored_revision: Option<u64>,
    /// The provider's runtime id of the sandbox.
    pub runtime_id: Option<String>,
    /// The revision this run published.
    pub published_revision: Option<u64>,
}

#[derive(Debug, Default)]
struct State {
    events: Vec<TimelineEvent>,
    /// Total time per step (a step may run several times: renewals, heartbeats).
    timings: BTreeMap<&'static str, Duration>,
    facts: RunFacts,
}

/// Records (and in human mode prints) the transaction's steps.
#[derive(Debug)]
pub struct Timeline {
    started: Instant,
    print: bool,
    state: Mutex<State>,
}

/// Milliseconds with a tenth of a millisecond kept.
pub fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 10_000.0).round() / 10.0
}

impl Timeline {
    /// A timeline starting now; `print` writes each event to stdout as it is recorded.
    pub fn new(print: bool) -> Self {
        Self {
            started: Instant::now(),
            print,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Adds `elapsed` to `step`'s total without an event (frequent calls: heartbeats,
    /// renewals).
    pub fn count(&self, step: &'static str, elapsed: Duration) {
        *self.state().timings.entry(step).or_default() += elapsed;
    }

    /// Records a finished step that began at `began`, and prints it in human mode.
    pub fn event(
        &self,
        step: &'static str,
        began: Instant,
        label: impl Into<String>,
        detail: impl Into<String>,
        ok: bool,
    ) {
        let took = began.elapsed();
        let event = TimelineEvent {
            at_ms: millis(self.started.elapsed()),
            step,
            label: label.into(),
            detail: detail.into(),
            ms: millis(took),
            ok,
        };
        if self.print {
            print_event(&event);
        }
        let mut state = self.state();
        *state.timings.entry(step).or_default() += took;
        state.events.push(event);
    }

    /// Updates the gathered facts.
    pub fn facts_mut(&self, update: impl FnOnce(&mut RunFacts)) {
        update(&mut self.state().facts);
    }

    /// The gathered facts.
    pub fn facts(&self) -> RunFacts {
        self.state().facts.clone()
    }

    /// Every recorded event, in order.
    pub fn events(&self) -> Vec<TimelineEvent> {
        self.state().events.clone()
    }

    /// Total milliseconds per step, plus `total` (the whole run so far).
    pub fn timings(&self) -> BTreeMap<String, f64> {
        let state = self.state();
        let mut timings: BTreeMap<String, f64> = state
            .timings
            .iter()
            .map(|(step, took)| ((*step).to_owned(), millis(*took)))
            .collect();
        timings.insert("total".to_owned(), millis(self.started.elapsed()));
        timings
    }
}

fn print_event(event: &TimelineEvent) {
    let mark = if event.ok { ' ' } else { '!' };
    let line = format!(
        "{mark}{:>9}  {:<24} {}{}\n",
        format!("+{:.0} ms", event.at_ms),
        event.label,
        event.detail,
        if event.ms >= 1.0 {
            format!("  [{:.0} ms]", event.ms)
        } else {
            String::new()
        }
    );
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(line.as_bytes());
    let _ = stdout.flush();
}

/// `1234` → `1.2 KiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `s` in `n` (with a plural `s` when `n != 1`).
pub fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_plurals_read_well() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(3 * 1024 * 1024 * 1024), "3.0 GiB");
        assert_eq!(plural(1, "file"), "1 file");
        assert_eq!(plural(2, "file"), "2 files");
    }

    #[test]
    fn timings_sum_repeated_steps() {
        let timeline = Timeline::new(false);
        timeline.count("fence.renew", Duration::from_millis(2));
        timeline.count("fence.renew", Duration::from_millis(3));
        let timings = timeline.timings();
        assert_eq!(timings["fence.renew"], 5.0);
        assert!(timings.contains_key("total"));
    }
}
