//! `MemoryRunQueue`: the in-memory twin of the SQLite and PostgreSQL run queues (omabox
//! extension; no reference twin exists). Its publications go through the
//! [`MemoryFenceStore`] it was given, with that store's clock, under the queue's lock, so
//! "publish and record the revision on the run" is one step as in the databases. Its
//! publication history holds only what `publish_for_run` published (the fence twin keeps
//! no history).

use super::fence::MemoryFenceStore;
use async_trait::async_trait;
use omabox_contract::{
    CancelOutcome, ClaimedRun, EnqueueRunInput, MAX_RUN_EVENTS, MAX_RUN_PAGE, PortError,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RunClaim, RunEnd, RunEvent,
    RunPage, RunQueuePort, RunRecord, RunStatus, cap_event,
};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// One queued run.
#[derive(Debug, Clone)]
struct Entry {
    record: RunRecord,
    spec: String,
    host_id: Option<String>,
    claim_expires_at_ms: Option<u64>,
    cancel_requested: bool,
    events: Vec<String>,
}

impl Entry {
    fn live(&self, claim: &RunClaim, now_ms: u64) -> bool {
        self.record.status == RunStatus::Running
            && self.record.attempts == claim.attempt
            && self.host_id.as_deref() == Some(claim.host_id.as_str())
            && self.claim_expires_at_ms.is_some_and(|at| at > now_ms)
    }

    fn claimed_live(&self, now_ms: u64) -> bool {
        self.record.status == RunStatus::Running
            && self.claim_expires_at_ms.is_some_and(|at| at > now_ms)
    }
}

#[derive(Default)]
struct State {
    /// In enqueue order.
    runs: Vec<Entry>,
    /// (session, revision, run id) of every publication made through the queue.
    history: Vec<(String, u64, String)>,
}

/// An in-memory [`RunQueuePort`] over a [`MemoryFenceStore`].
pub struct MemoryRunQueue {
    state: Mutex<State>,
    fences: Arc<MemoryFenceStore>,
}

impl MemoryRunQueue {
    /// An empty queue publishing through `fences` (whose clock it uses).
    pub fn new(fences: Arc<MemoryFenceStore>) -> Self {
        Self {
            state: Mutex::new(State::default()),
            fences,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every mutation is done on one entry after its checks: a poisoned state is whole.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for MemoryRunQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryRunQueue")
            .field("runs", &self.lock().runs.len())
            .finish_non_exhaustive()
    }
}

fn find<'a>(state: &'a mut State, run_id: &str) -> Option<&'a mut Entry> {
    state.runs.iter_mut().find(|e| e.record.run_id == run_id)
}

#[async_trait]
impl RunQueuePort for MemoryRunQueue {
    async fn enqueue(&self, input: EnqueueRunInput) -> Result<(), PortError> {
        let mut state = self.lock();
        if state.runs.iter().any(|e| e.record.run_id == input.run_id) {
            return Err(PortError::new(format!(
                "run {} is already queued",
                input.run_id
            )));
        }
        state.runs.push(Entry {
            record: RunRecord {
                run_id: input.run_id,
                session_id: input.session_id,
                status: RunStatus::Queued,
                revision: None,
                error: None,
                attempts: 0,
            },
            spec: input.spec,
            host_id: None,
            claim_expires_at_ms: None,
            cancel_requested: false,
            events: Vec::new(),
        });
        Ok(())
    }

    async fn claim(
        &self,
        host_id: &str,
        capacity: u64,
        ttl_ms: u64,
    ) -> Result<Option<ClaimedRun>, PortError> {
        let mut state = self.lock();
        let now_ms = self.fences.now_ms();
        let held = state
            .runs
            .iter()
            .filter(|e| e.claimed_live(now_ms) && e.host_id.as_deref() == Some(host_id))
            .count() as u64;
        if held >= capacity {
            return Ok(None);
        }
        loop {
            // Each session's oldest unended run, in enqueue order.
            let mut seen = std::collections::HashSet::new();
            let candidate = state.runs.iter().position(|e| {
                if e.record.status.is_ended() || !seen.insert(e.record.session_id.clone()) {
                    return false;
                }
                !e.claimed_live(now_ms)
            });
            let Some(index) = candidate else {
                return Ok(None);
            };
            let entry = &mut state.runs[index];
            if entry.cancel_requested || entry.record.revision.is_some() {
                // Cancelled while its dead host ran it, or published before that host died:
                // it is done either way.
                entry.record.status = if entry.cancel_requested {
                    RunStatus::Cancelled
                } else {
                    RunStatus::Completed
                };
                entry.host_id = None;
                entry.claim_expires_at_ms = None;
                continue;
            }
            entry.record.status = RunStatus::Running;
            entry.record.attempts += 1;
            entry.host_id = Some(host_id.to_owned());
            entry.claim_expires_at_ms = Some(now_ms.saturating_add(ttl_ms));
            return Ok(Some(ClaimedRun {
                claim: RunClaim {
                    run_id: entry.record.run_id.clone(),
                    host_id: host_id.to_owned(),
                    attempt: entry.record.attempts,
                },
                session_id: entry.record.session_id.clone(),
                spec: entry.spec.clone(),
            }));
        }
    }

    async fn renew(&self, claim: &RunClaim, ttl_ms: u64) -> Result<bool, PortError> {
        let mut state = self.lock();
        let now_ms = self.fences.now_ms();
        Ok(match find(&mut state, &claim.run_id) {
            Some(entry) if entry.live(claim, now_ms) => {
                entry.claim_expires_at_ms = Some(now_ms.saturating_add(ttl_ms));
                true
            }
            _ => false,
        })
    }

    async fn finish(&self, claim: &RunClaim, end: RunEnd) -> Result<bool, PortError> {
        let mut state = self.lock();
        let now_ms = self.fences.now_ms();
        let Some(entry) = find(&mut state, &claim.run_id).filter(|e| e.live(claim, now_ms)) else {
            return Ok(false);
        };
        match end {
            RunEnd::Completed { revision } => {
                entry.record.status = RunStatus::Completed;
                entry.record.revision = revision.or(entry.record.revision);
            }
            RunEnd::Failed { error } => {
                entry.record.status = RunStatus::Failed;
                entry.record.error = Some(error);
            }
            RunEnd::Cancelled => entry.record.status = RunStatus::Cancelled,
        }
        entry.host_id = None;
        entry.claim_expires_at_ms = None;
        Ok(true)
    }

    async fn publish_for_run(
        &self,
        claim: &RunClaim,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        let mut state = self.lock();
        let now_ms = self.fences.now_ms();
        let Some(entry) = find(&mut state, &claim.run_id).filter(|e| e.live(claim, now_ms)) else {
            return Ok(PublishRuntimeResourcesResult::Lost);
        };
        let Some(revision) = self.fences.publish_now(&input) else {
            return Ok(PublishRuntimeResourcesResult::Lost);
        };
        entry.record.revision = Some(revision);
        let session = entry.record.session_id.clone();
        if !state
            .history
            .iter()
            .any(|(s, r, _)| *s == session && *r == revision)
        {
            state
                .history
                .push((session, revision, claim.run_id.clone()));
        }
        Ok(PublishRuntimeResourcesResult::Published { revision })
    }

    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        Ok(find(&mut self.lock(), run_id).map(|e| e.record.clone()))
    }

    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, PortError> {
        let mut state = self.lock();
        let Some(entry) = find(&mut state, run_id) else {
            return Ok(CancelOutcome::NotFound);
        };
        Ok(match entry.record.status {
            RunStatus::Queued => {
                entry.record.status = RunStatus::Cancelled;
                CancelOutcome::Cancelled
            }
            RunStatus::Running => {
                entry.cancel_requested = true;
                CancelOutcome::Requested
            }
            ended => CancelOutcome::AlreadyEnded(ended),
        })
    }

    async fn cancel_requested(&self, claim: &RunClaim) -> Result<bool, PortError> {
        let mut state = self.lock();
        Ok(find(&mut state, &claim.run_id).is_some_and(|e| e.cancel_requested))
    }

    async fn session_runs(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        let state = self.lock();
        let limit = limit.clamp(1, MAX_RUN_PAGE);
        // A run's cursor is its 1-based position in enqueue order.
        let runs: Vec<(u64, RunRecord)> = state
            .runs
            .iter()
            .enumerate()
            .map(|(index, e)| (index as u64 + 1, e))
            .filter(|(seq, e)| {
                e.record.session_id == session_id && before.is_none_or(|before| *seq < before)
            })
            .rev()
            .take(limit)
            .map(|(seq, e)| (seq, e.record.clone()))
            .collect();
        let next = (runs.len() == limit)
            .then(|| runs.last().map(|(seq, _)| *seq))
            .flatten();
        Ok(RunPage {
            runs: runs.into_iter().map(|(_, record)| record).collect(),
            next,
        })
    }

    async fn append_event(&self, claim: &RunClaim, text: &str) -> Result<bool, PortError> {
        let mut state = self.lock();
        let now_ms = self.fences.now_ms();
        let Some(entry) = find(&mut state, &claim.run_id).filter(|e| e.live(claim, now_ms)) else {
            return Ok(false);
        };
        if (entry.events.len() as u64) < MAX_RUN_EVENTS {
            entry.events.push(cap_event(text).to_owned());
        }
        Ok(true)
    }

    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, PortError> {
        let mut state = self.lock();
        let Some(entry) = find(&mut state, run_id) else {
            return Ok(Vec::new());
        };
        Ok(entry
            .events
            .iter()
            .enumerate()
            .map(|(index, text)| RunEvent {
                seq: index as u64 + 1,
                text: text.clone(),
            })
            .filter(|event| event.seq > after)
            .take(limit)
            .collect())
    }

    async fn published_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(u64, Option<String>)>, PortError> {
        let state = self.lock();
        let mut runs: Vec<(u64, Option<String>)> = state
            .history
            .iter()
            .filter(|(session, _, _)| session == session_id)
            .map(|(_, revision, run)| (*revision, Some(run.clone())))
            .collect();
        runs.sort();
        Ok(runs)
    }
}
