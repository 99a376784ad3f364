//! The timeline of one `omabox run`: the renderer of the work-item runner's observer events.
//!
//! [`Timeline`] is the [`RunObserver`] the CLI hands to a run: each step the host reports
//! becomes one [`TimelineEvent`] (label and detail for people, the step name for machines),
//! printed as it happens in human mode or only collected for `--json`, which also reports
//! [`Timeline::timings`]. Frequent successful steps (renewals, heartbeats, outputs attach)
//! only add to the timings. It remembers the facts the final report needs (the claimed
//! generation, the lease, the published revision), so nothing is read back from the host.
//!
//! It is also the persistence [`ProgressObserver`] of the run: it keeps the totals of the last
//! restore, seed and checkpoint for the workspace steps' details and forwards every update to
//! the progress bars.
//!
//! What it must never do: show a text the host did not redact. It renders only observer
//! events (whose errors the host redacted) and persistence counts — no port's raw error.

use omabox_contract::{ManagedWorkExecutionResult, OutputAbortReason, PortError};
use omabox_host::run_observer::{RunObserver, RunStep, StepEvent, StepFacts, StepOutcome};
use omabox_persistence::{Progress, ProgressObserver, ProgressPhase};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// One finished step of the transaction.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEvent {
    /// Milliseconds since the run started, when the step finished.
    pub at_ms: f64,
    /// The step (`sandbox.acquire`, …): the key of [`Timeline::timings`].
    pub step: &'static str,
    /// What happened, for people (`sandbox acquired`).
    pub label: String,
    /// Details (ids, counts, sizes), or the (redacted) error.
    pub detail: String,
    /// How long the call took, in milliseconds.
    pub ms: f64,
    /// False when the call failed.
    pub ok: bool,
}

/// Facts gathered from the steps for the final report.
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
    /// The sandbox's image as its lease records it (`reference@digest`: a tag's digest
    /// at this acquire), when it has one.
    pub image: Option<String>,
    /// What the workspace restore could not bring back (missing or damaged blobs; the
    /// binding's metadata lists at most 100).
    pub workspace_lost: Vec<omabox_persistence::Damage>,
    /// How many workspace entries were lost.
    pub workspace_lost_count: u64,
}

#[derive(Debug, Default)]
struct State {
    events: Vec<TimelineEvent>,
    /// Total time per step (a step may run several times: renewals, heartbeats).
    timings: BTreeMap<&'static str, Duration>,
    facts: RunFacts,
    /// The admitted harness lane, for the harness step's detail.
    lane: Option<String>,
    /// The last finished restore / seed / checkpoint totals.
    progress: BTreeMap<u8, Progress>,
}

/// Records (and in human mode prints) the transaction's steps.
#[derive(Debug)]
pub struct Timeline {
    started: Mutex<Instant>,
    print: bool,
    bars: Option<Arc<dyn ProgressObserver>>,
    state: Mutex<State>,
}

/// Milliseconds with a tenth of a millisecond kept.
pub fn millis(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 10_000.0).round() / 10.0
}

impl Timeline {
    /// A timeline starting now; `print` writes each event to stdout as it is recorded;
    /// `bars` receives persistence progress.
    pub fn new(print: bool, bars: Option<Arc<dyn ProgressObserver>>) -> Self {
        Self {
            started: Mutex::new(Instant::now()),
            print,
            bars,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the run started.
    pub fn elapsed(&self) -> Duration {
        self.started().elapsed()
    }

    /// The run starts now (what came before was the node's preparation: installs, pulls).
    pub fn restart(&self) {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    fn started(&self) -> Instant {
        *self.started.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `took` to `step`'s total without an event.
    fn count(&self, step: &'static str, took: Duration) {
        *self.state().timings.entry(step).or_default() += took;
    }

    /// Records a finished step that took `took`, and prints it in human mode.
    fn record(&self, step: &'static str, took: Duration, line: Line) {
        let event = TimelineEvent {
            at_ms: millis(self.started().elapsed()),
            step,
            label: line.label.to_owned(),
            detail: line.detail,
            ms: millis(took),
            ok: line.ok,
        };
        if self.print {
            print_event(&event);
        }
        let mut state = self.state();
        *state.timings.entry(step).or_default() += took;
        state.events.push(event);
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
        timings.insert("total".to_owned(), millis(self.started().elapsed()));
        timings
    }

    /// Updates the facts from a step and takes what its detail needs from the state.
    fn note(&self, step: RunStep, facts: &StepFacts) -> Context {
        let mut state = self.state();
        match facts {
            StepFacts::Admitted { plan, .. } => {
                state.lane = Some(plan.driver.driver_type().to_string())
            }
            StepFacts::FenceClaimed {
                generation,
                publication,
            } => {
                state.facts.generation = Some(*generation);
                state.facts.restored_revision = publication.as_ref().map(|p| p.revision);
            }
            StepFacts::Sandbox(lease) if step == RunStep::SandboxAcquire => {
                state.facts.runtime_id = Some(lease.runtime_id.clone());
                state.facts.image = lease_image(lease);
            }
            StepFacts::Published { revision } => {
                state.facts.published_revision = Some(*revision);
            }
            StepFacts::Workspace { binding, .. } => {
                let (lost, count) = omabox_persistence::binding_losses(binding.metadata.as_ref());
                if count > 0 {
                    warn_lost(&lost, count, state.facts.restored_revision);
                }
                state.facts.workspace_lost = lost;
                state.facts.workspace_lost_count = count;
            }
            _ => {}
        }
        let progress = match step {
            RunStep::WorkspaceMaterialize => state
                .progress
                .remove(&phase_key(ProgressPhase::Restore))
                .or_else(|| state.progress.remove(&phase_key(ProgressPhase::Seed))),
            RunStep::WorkspaceCheckpoint => {
                state.progress.remove(&phase_key(ProgressPhase::Checkpoint))
            }
            _ => None,
        };
        Context {
            lane: state.lane.clone().unwrap_or_else(|| "harness".to_owned()),
            runtime_id: state.facts.runtime_id.clone(),
            progress,
            lost: state.facts.workspace_lost_count,
        }
    }
}

impl RunObserver for Timeline {
    fn step(&self, event: StepEvent) {
        let name = event.step.name();
        let line = match &event.outcome {
            StepOutcome::Done(facts) => {
                let context = self.note(event.step, facts);
                done(event.step, facts, &context)
            }
            StepOutcome::Failed(error) => {
                let lane = self.state().lane.clone();
                Some(failed(
                    event.step,
                    error,
                    lane.as_deref().unwrap_or("harness"),
                ))
            }
        };
        match line {
            Some(line) => self.record(name, event.elapsed, line),
            None => self.count(name, event.elapsed),
        }
    }
}

impl ProgressObserver for Timeline {
    fn update(&self, progress: Progress) {
        if progress.files_done == progress.files_total {
            self.state()
                .progress
                .insert(phase_key(progress.phase), progress);
        }
        if let Some(bars) = &self.bars {
            bars.update(progress);
        }
    }
}

fn phase_key(phase: ProgressPhase) -> u8 {
    match phase {
        ProgressPhase::Restore => 0,
        ProgressPhase::Checkpoint => 1,
        ProgressPhase::Seed => 2,
        ProgressPhase::Export => 3,
    }
}

/// `reference@digest` (or the reference alone) of the image a linux lease records.
fn lease_image(lease: &omabox_contract::ManagedSandboxLease) -> Option<String> {
    let text = lease
        .metadata
        .as_ref()?
        .get(omabox_backend_linux::managed::IMAGE_METADATA_KEY)?
        .as_str()?;
    let image: omabox_backend_linux::factory::LeaseImage = serde_json::from_str(text).ok()?;
    Some(match image.digest {
        Some(digest) if !image.reference.contains('@') => format!("{}@{digest}", image.reference),
        _ => image.reference,
    })
}

/// What a step's detail needs beyond its facts.
struct Context {
    lane: String,
    runtime_id: Option<String>,
    progress: Option<Progress>,
    /// Workspace entries the restore lost.
    lost: u64,
}

/// Says on stderr, in every mode, what the workspace restore lost (a damaged revision): the
/// run goes on without it, never silently.
fn warn_lost(lost: &[omabox_persistence::Damage], count: u64, revision: Option<u64>) {
    let revision = revision.map_or_else(
        || "its last revision".to_owned(),
        |r| format!("revision {r}"),
    );
    let mut text = format!(
        "omabox: warning: {count} workspace entr{} of {revision} could not be restored (its stored \
         content is missing or damaged); the run continues without {}:\n",
        if count == 1 { "y" } else { "ies" },
        if count == 1 { "it" } else { "them" }
    );
    for damage in lost.iter().take(20) {
        text.push_str(&format!(
            "  {}: {} ({})\n",
            crate::terminal_safe::one_line(
                damage.path.as_deref().unwrap_or("/workspace (every path)")
            ),
            damage.problem,
            damage.object
        ));
    }
    if count > 20 {
        text.push_str(&format!(
            "  … and {} more (--json lists up to 100)\n",
            count - 20
        ));
    }
    text.push_str(
        "  `omabox fsck --session <id>` lists the intact revisions; `omabox run --from-revision N` \
         continues from one of them instead\n",
    );
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// One rendered step.
struct Line {
    label: &'static str,
    detail: String,
    ok: bool,
}

fn line(label: &'static str, detail: impl Into<String>, ok: bool) -> Option<Line> {
    Some(Line {
        label,
        detail: detail.into(),
        ok,
    })
}

/// The line of a successful step; `None` for frequent steps that are only timed.
fn done(step: RunStep, facts: &StepFacts, context: &Context) -> Option<Line> {
    match (step, facts) {
        (RunStep::Admission, StepFacts::Admitted { provider, plan }) => line(
            "admitted",
            format!(
                "{provider} → workspace {}, outputs {}, lane {}",
                plan.workspace_strategy,
                plan.output_strategy
                    .map_or_else(|| "none".to_owned(), |s| s.to_string()),
                plan.driver.driver_type()
            ),
            true,
        ),
        (
            RunStep::FenceAcquire,
            StepFacts::FenceClaimed {
                generation,
                publication,
            },
        ) => {
            let from = match publication {
                Some(p) => format!(
                    "; last published revision {} (generation {})",
                    p.revision, p.generation
                ),
                None => "; nothing published yet".to_owned(),
            };
            line(
                "fence claimed",
                format!("generation {generation}{from}"),
                true,
            )
        }
        (_, StepFacts::FenceConflict { expires_at }) => line(
            "fence held elsewhere",
            format!(
                "another owner holds the work item until {}",
                expires_at.as_deref().unwrap_or("(unknown)")
            ),
            false,
        ),
        (RunStep::FenceRenew, StepFacts::Lost) => line(
            "fence lost",
            "renewal refused: the fence is no longer current",
            false,
        ),
        (RunStep::FencePublish, StepFacts::Lost) => {
            line("publish refused", "the fence is no longer current", false)
        }
        (RunStep::SandboxHeartbeat, StepFacts::Lost) => line(
            "sandbox lost",
            format!(
                "{} is no longer running",
                context.runtime_id.as_deref().unwrap_or("the sandbox")
            ),
            false,
        ),
        (_, StepFacts::Published { revision }) => {
            line("published", format!("revision {revision}"), true)
        }
        (_, StepFacts::FenceReleased { generation, reason }) => line(
            "fence released",
            format!("generation {generation} ({reason})"),
            true,
        ),
        (
            _,
            StepFacts::Workspace {
                from_checkpoint, ..
            },
        ) => {
            let detail = match (context.progress, from_checkpoint) {
                (Some(p), Some(from)) => format!(
                    "restored {} ({}) from {}",
                    plural(p.files_total, "file"),
                    human_bytes(p.bytes_total),
                    short_id(from)
                ),
                (Some(p), None) => format!(
                    "seeded {} ({}) from --workspace",
                    plural(p.files_total, "file"),
                    human_bytes(p.bytes_total)
                ),
                (None, Some(from)) => format!("restored from {}", short_id(from)),
                (None, None) => "empty (new session)".to_owned(),
            };
            if context.lost > 0 {
                return line(
                    "workspace materialized",
                    format!("{detail}; LOST {} (see the warning)", context.lost),
                    true,
                );
            }
            line("workspace materialized", detail, true)
        }
        (RunStep::WorkspaceAttach, _) => line("workspace attached", "bound at /workspace", true),
        (_, StepFacts::Checkpoint(candidate)) => {
            let counts = context.progress.map_or_else(String::new, |p| {
                format!(
                    ": {} ({})",
                    plural(p.files_total, "file"),
                    human_bytes(p.bytes_total)
                )
            });
            line(
                "workspace checkpointed",
                format!("{}{counts}", short_id(&candidate.id)),
                true,
            )
        }
        (RunStep::WorkspaceRelease, _) => line(
            "workspace released",
            "binding removed (the checkpoint keeps it)",
            true,
        ),
        (_, StepFacts::Outputs(binding)) => line(
            "outputs prepared",
            format!(
                "{} at {}",
                short_id(&binding.binding_id),
                binding.mount_path
            ),
            true,
        ),
        (_, StepFacts::Collected(entries)) => {
            let bytes: u64 = entries.iter().map(|entry| entry.size).sum();
            let mut names: Vec<&str> = entries
                .iter()
                .take(3)
                .map(|entry| entry.logical_path.as_str())
                .collect();
            if entries.len() > 3 {
                names.push("…");
            }
            let count = match entries.len() {
                1 => "1 entry".to_owned(),
                n => format!("{n} entries"),
            };
            let names = if names.is_empty() {
                String::new()
            } else {
                format!(": {}", names.join(", "))
            };
            line(
                "outputs collected",
                format!("{count} ({}){names}", human_bytes(bytes)),
                true,
            )
        }
        (_, StepFacts::Finalized { manifest_id }) => line(
            "outputs finalized",
            format!("manifest {}", short_id(manifest_id)),
            true,
        ),
        (RunStep::OutputsRelease, _) => line(
            "outputs released",
            "published manifest kept, staging removed",
            true,
        ),
        (_, StepFacts::OutputsAborted(reason)) => line(
            "outputs aborted",
            format!(
                "nothing published ({})",
                match reason {
                    OutputAbortReason::Failed => "failed",
                    OutputAbortReason::LeaseLost => "lease_lost",
                }
            ),
            true,
        ),
        (RunStep::SandboxAcquire, StepFacts::Sandbox(lease)) => line(
            "sandbox acquired",
            match lease_image(lease) {
                Some(image) => format!("{} {} image {image}", lease.provider, lease.runtime_id),
                None => format!("{} {}", lease.provider, lease.runtime_id),
            },
            true,
        ),
        (RunStep::SandboxSuspend, StepFacts::Sandbox(lease)) => {
            line("sandbox suspended", lease.runtime_id.clone(), true)
        }
        (RunStep::RuntimeCheckpointRestore, StepFacts::Sandbox(lease)) => line(
            "runtime restored",
            format!("{} {}", lease.provider, lease.runtime_id),
            true,
        ),
        (_, StepFacts::Terminated { runtime_id, reason }) => line(
            "sandbox terminated",
            format!("{runtime_id} ({reason})"),
            true,
        ),
        (_, StepFacts::Orphaned { runtime_id }) => line(
            "orphan queued",
            format!("{runtime_id}: terminate failed; `omabox reap` retries it"),
            false,
        ),
        (_, StepFacts::Harness(result)) => match result {
            ManagedWorkExecutionResult::Completed => line(
                "harness exited",
                format!("{}: completed (exit 0)", context.lane),
                true,
            ),
            ManagedWorkExecutionResult::Aborted => line(
                "harness stopped",
                format!("{}: aborted", context.lane),
                false,
            ),
        },
        (RunStep::CredentialEgressPrepare, _) => line("egress prepared", "", true),
        (RunStep::CredentialEgressAttach, _) => line("egress attached", "", true),
        (RunStep::CredentialEgressRevoke, _) => line("egress revoked", "", true),
        (RunStep::CredentialEgressRelease, _) => line("egress released", "", true),
        (RunStep::SessionInputsMaterialize, _) => line("session inputs staged", "", true),
        (RunStep::RuntimeCheckpointCreate, _) => line("runtime checkpointed", "", true),
        _ => None,
    }
}

/// The line of a failed step: its label and the host-redacted error.
fn failed(step: RunStep, error: &PortError, lane: &str) -> Line {
    let label = match step {
        RunStep::Admission => "admission refused",
        RunStep::FenceAcquire => "fence claim failed",
        RunStep::FenceRenew => "fence renewal failed",
        RunStep::FencePublish => "publish failed",
        RunStep::FenceRelease => "fence released",
        RunStep::WorkspaceMaterialize => "workspace restore failed",
        RunStep::WorkspaceAttach => "workspace attached",
        RunStep::WorkspaceCheckpoint => "workspace checkpoint failed",
        RunStep::WorkspaceRelease => "workspace released",
        RunStep::OutputsPrepare => "outputs prepare failed",
        RunStep::OutputsAttach => "outputs attach failed",
        RunStep::OutputsCollect => "outputs collect failed",
        RunStep::OutputsFinalize => "outputs finalize failed",
        RunStep::OutputsRelease => "outputs release failed",
        RunStep::OutputsAbort => "outputs aborted",
        RunStep::SandboxAcquire => "sandbox acquire failed",
        RunStep::SandboxHeartbeat => "sandbox heartbeat failed",
        RunStep::SandboxSuspend => "sandbox suspended",
        RunStep::SandboxTerminate => "sandbox terminated",
        RunStep::OrphansEnqueue => "orphan queue failed",
        RunStep::HarnessRun => "harness failed",
        _ => "step failed",
    };
    let detail = if step == RunStep::HarnessRun {
        format!("{lane}: {}", error.message())
    } else {
        error.message().to_owned()
    };
    Line {
        label,
        detail,
        ok: false,
    }
}

fn print_event(event: &TimelineEvent) {
    let mark = if event.ok { ' ' } else { '!' };
    let line = format!(
        "{mark}{:>9}  {:<24} {}{}\n",
        format!("+{:.0} ms", event.at_ms),
        event.label,
        crate::terminal_safe::one_line(&event.detail),
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

/// `wcp_0123456789abcdef…` → `wcp_0123456789ab`.
fn short_id(id: &str) -> String {
    id.chars().take(16).collect()
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

    fn event(step: RunStep, ms: u64, outcome: StepOutcome) -> StepEvent {
        StepEvent {
            step,
            elapsed: Duration::from_millis(ms),
            outcome,
        }
    }

    #[test]
    fn frequent_steps_are_timed_and_failures_are_events() {
        let timeline = Timeline::new(false, None);
        timeline.step(event(
            RunStep::FenceRenew,
            2,
            StepOutcome::Done(StepFacts::Nothing),
        ));
        timeline.step(event(
            RunStep::FenceRenew,
            3,
            StepOutcome::Done(StepFacts::Nothing),
        ));
        timeline.step(event(
            RunStep::HarnessRun,
            1,
            StepOutcome::Failed(PortError::new("exit 3")),
        ));
        let timings = timeline.timings();
        assert_eq!(timings["fence.renew"], 5.0);
        assert!(timings.contains_key("total"));
        let events = timeline.events();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].step, "harness.run");
        assert_eq!(events[0].detail, "harness: exit 3");
        assert!(!events[0].ok);
    }

    #[test]
    fn facts_come_from_the_steps() {
        let timeline = Timeline::new(false, None);
        timeline.step(event(
            RunStep::FenceAcquire,
            1,
            StepOutcome::Done(StepFacts::FenceClaimed {
                generation: 4,
                publication: None,
            }),
        ));
        timeline.step(event(
            RunStep::FencePublish,
            1,
            StepOutcome::Done(StepFacts::Published { revision: 4 }),
        ));
        let facts = timeline.facts();
        assert_eq!(facts.generation, Some(4));
        assert_eq!(facts.restored_revision, None);
        assert_eq!(facts.published_revision, Some(4));
        assert_eq!(
            timeline.events()[0].detail,
            "generation 4; nothing published yet"
        );
    }

    #[test]
    fn a_lost_sandbox_is_named_by_its_runtime_id() {
        let timeline = Timeline::new(false, None);
        let lease = omabox_testkit::fakes::lease("fake", "rt-7");
        timeline.step(event(
            RunStep::SandboxAcquire,
            1,
            StepOutcome::Done(StepFacts::Sandbox(Box::new(lease))),
        ));
        timeline.step(event(
            RunStep::SandboxHeartbeat,
            1,
            StepOutcome::Done(StepFacts::Nothing),
        ));
        timeline.step(event(
            RunStep::SandboxHeartbeat,
            1,
            StepOutcome::Done(StepFacts::Lost),
        ));
        let events = timeline.events();
        assert_eq!(events.len(), 2, "a live heartbeat is only timed");
        assert_eq!(events[1].detail, "rt-7 is no longer running");
        assert!(!events[1].ok);
        assert_eq!(timeline.facts().runtime_id.as_deref(), Some("rt-7"));
    }
}
