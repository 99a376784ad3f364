//! Runs over HTTP (issue 30): `omabox serve`'s [`RunService`] (the proxy's port) over the
//! store's run queue, and the [`RunWorker`] that claims queued runs and runs them through
//! the [`Runner`], as `omabox run` does.
//!
//! ```text
//!   POST /v1/sessions/{id}/runs ─► RunQueueService::submit ─► queue.enqueue ─┐
//!                                                                             ▼
//!   any host's RunWorker: claim (capacity) ─► Runner::run (publish through the queue)
//!                         renew the claim every ttl/3 ─► finish (completed | failed)
//! ```
//!
//! A run's claim lives `lease_ttl_ms` (30 s by default, like the fence) and is renewed by
//! the host running it; a host that dies leaves it to expire and any host claims it again.
//! After each renewal the host asks whether the run was cancelled (`POST
//! /v1/runs/{id}/cancel` on any host); if so it aborts the run and ends it `cancelled`.
//! A run whose fence is still held by a dead host (`conflict`) is tried again while its
//! claim lives. On shutdown (SIGTERM) the worker cancels its runs and leaves them claimed:
//! their claims expire and any host runs them again. A run is never finished twice: the
//! queue refuses every call of a claim that is no longer live. An agent session's runtime
//! stays warm between its turns (`crate::warm`); a command run of a warm session ends the
//! warm runtime first and runs cold. Shutdown ends every warm runtime.
//!
//! What this must never do: put a credential of a run (`HOST=SECRET`, or the secret's
//! name) in its status, its events or a log line ([`spec::redact`]); block the server on
//! a run (events are dropped, not waited for, when the writer falls behind).

mod events;
pub mod spec;

use crate::runner::{QueuedRun, RunObservers};
use crate::warm::{WarmSessions, WarmSettings};
use crate::{NodeConfig, Runner};
use async_trait::async_trait;
use events::EventLog;
use omabox_contract::{
    AbortController, CancelOutcome, ClaimedRun, EnqueueRunInput, PortError, RunEnd, RunEvent,
    RunPage, RunQueuePort, RunRecord,
};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use omabox_proxy::runs::{RunService, RunServiceError, RunSpec};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

/// The claim ttl when `lease_ttl_ms` is not set: the fence's default.
pub const DEFAULT_CLAIM_TTL_MS: u64 = 30_000;

/// How often an idle worker looks at the queue (a run submitted to this host wakes it at
/// once; one submitted to another host is found by this poll, or at once where the store
/// notifies: [`LISTENING_POLL`]).
const POLL: Duration = Duration::from_millis(200);

/// The poll of a worker the store wakes for every queued or ended run (PostgreSQL's
/// `LISTEN`): what is left for it is a claim that expired because its host died, and a
/// notification lost while the listening connection was being re-made.
pub const LISTENING_POLL: Duration = Duration::from_secs(2);

/// How long a run whose fence another owner holds waits before it is tried again.
const CONFLICT_RETRY: Duration = Duration::from_millis(500);

/// The proxy's [`RunService`] over a run queue.
pub struct RunQueueService {
    queue: Arc<dyn RunQueuePort>,
    config: NodeConfig,
    wake: Arc<Notify>,
}

impl RunQueueService {
    /// Submits to `queue`, judging each request with `config` first; `wake` tells this
    /// host's worker.
    pub fn new(queue: Arc<dyn RunQueuePort>, config: NodeConfig, wake: Arc<Notify>) -> Self {
        Self {
            queue,
            config,
            wake,
        }
    }
}

impl std::fmt::Debug for RunQueueService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunQueueService").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for RunWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunWorker")
            .field("host_id", &self.host_id)
            .field("capacity", &self.capacity)
            .finish_non_exhaustive()
    }
}

fn internal(error: PortError) -> RunServiceError {
    RunServiceError::Internal(error.to_string())
}

#[async_trait]
impl RunService for RunQueueService {
    async fn submit(&self, session_id: &str, spec: RunSpec) -> Result<String, RunServiceError> {
        // Judged now, so a bad request is a 400 and never a queued run that fails.
        spec::request(&spec, session_id, &self.config, None).map_err(|error| {
            RunServiceError::BadRequest(spec::redact(&spec, &format!("{error:#}")))
        })?;
        let run_id = format!("run_{:032x}", rand::random::<u128>());
        let text = serde_json::to_string(&spec)
            .map_err(|error| RunServiceError::Internal(error.to_string()))?;
        self.queue
            .enqueue(EnqueueRunInput {
                run_id: run_id.clone(),
                session_id: session_id.to_owned(),
                spec: text,
            })
            .await
            .map_err(internal)?;
        self.wake.notify_one();
        Ok(run_id)
    }

    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, RunServiceError> {
        self.queue.status(run_id).await.map_err(internal)
    }

    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, RunServiceError> {
        self.queue
            .events(run_id, after, limit)
            .await
            .map_err(internal)
    }

    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, RunServiceError> {
        let outcome = self.queue.cancel(run_id).await.map_err(internal)?;
        if outcome == CancelOutcome::Cancelled {
            // The session's next run may be claimable now.
            self.wake.notify_one();
        }
        Ok(outcome)
    }

    async fn list(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, RunServiceError> {
        self.queue
            .session_runs(session_id, before, limit)
            .await
            .map_err(internal)
    }
}

/// Claims queued runs and runs them on this host.
pub struct RunWorker {
    queue: Arc<dyn RunQueuePort>,
    runner: Runner,
    config: NodeConfig,
    host_id: String,
    capacity: u64,
    claim_ttl_ms: u64,
    wake: Arc<Notify>,
    poll: Duration,
}

/// What every run task of a worker shares.
struct Shared {
    queue: Arc<dyn RunQueuePort>,
    runner: Runner,
    config: NodeConfig,
    claim_ttl_ms: u64,
    stopping: AtomicBool,
    /// The cancel switch of every run in progress, by run id.
    running: Mutex<HashMap<String, AbortController>>,
}

impl RunWorker {
    /// A worker over `queue` running at most `capacity` runs at once as `host_id`.
    pub fn new(
        queue: Arc<dyn RunQueuePort>,
        runner: Runner,
        config: NodeConfig,
        host_id: String,
        capacity: u64,
        wake: Arc<Notify>,
    ) -> anyhow::Result<Self> {
        let claim_ttl_ms = config
            .number(crate::config::Key::LeaseTtlMs)?
            .unwrap_or(DEFAULT_CLAIM_TTL_MS);
        // Agent sessions stay warm between their turns (crate::warm).
        let runner = runner.with_warm(WarmSessions::new(WarmSettings::from_config(&config)?));
        Ok(Self {
            queue,
            runner,
            config,
            host_id,
            capacity: capacity.max(1),
            claim_ttl_ms,
            wake,
            poll: POLL,
        })
    }

    /// Looks at the queue every `poll` when nothing woke it (default 200 ms; see
    /// [`LISTENING_POLL`]).
    #[must_use]
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Claims and runs until `stop` resolves; then cancels the runs in progress (left
    /// claimed, for any host once their claims expire) and waits for their cleanup.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let shared = Arc::new(Shared {
            queue: Arc::clone(&self.queue),
            runner: self.runner.clone(),
            config: self.config.clone(),
            claim_ttl_ms: self.claim_ttl_ms,
            stopping: AtomicBool::new(false),
            running: Mutex::new(HashMap::new()),
        });
        let mut tasks = tokio::task::JoinSet::new();
        tokio::pin!(stop);
        loop {
            while (tasks.len() as u64) < self.capacity {
                match self
                    .queue
                    .claim(&self.host_id, self.capacity, self.claim_ttl_ms)
                    .await
                {
                    Ok(Some(run)) => {
                        tracing::info!(run_id = %run.claim.run_id, attempt = run.claim.attempt, "run claimed");
                        // Registered before the task first runs, so a stop that comes before
                        // it does still cancels it.
                        let controller = AbortController::new();
                        lock(&shared.running).insert(run.claim.run_id.clone(), controller.clone());
                        tasks.spawn(run_one(Arc::clone(&shared), run, controller));
                    }
                    Ok(None) => break,
                    Err(error) => {
                        tracing::warn!(%error, "cannot claim a run");
                        break;
                    }
                }
            }
            tokio::select! {
                () = &mut stop => break,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(self.poll) => {}
                Some(_) = tasks.join_next() => {}
            }
        }
        shared.stopping.store(true, Ordering::SeqCst);
        for controller in lock(&shared.running).values() {
            controller.abort(PortError::new("omabox serve is stopping"));
        }
        while tasks.join_next().await.is_some() {}
        // Every kept runtime ends with serve (SIGTERM): its sandbox, agent and claim.
        if let Some(warm) = self.runner.warm() {
            warm.shutdown().await;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs one claimed run (its `controller` already in `shared.running`) to its end (or to
/// this host's shutdown).
async fn run_one(shared: Arc<Shared>, run: ClaimedRun, controller: AbortController) {
    let claim = run.claim.clone();
    let flags = Arc::new(RunFlags::default());
    let renewer = tokio::spawn(renew(
        Arc::clone(&shared),
        claim.clone(),
        controller.clone(),
        Arc::clone(&flags),
    ));
    let log = EventLog::start(Arc::clone(&shared.queue), claim.clone());
    let end = execute(&shared, &run, &controller, &flags, &log).await;
    renewer.abort();
    log.close().await;
    lock(&shared.running).remove(&claim.run_id);
    let Some(end) = end else {
        return;
    };
    match shared.queue.finish(&claim, end).await {
        Ok(true) => tracing::info!(run_id = %claim.run_id, "run ended"),
        Ok(false) => tracing::warn!(run_id = %claim.run_id, "run ended after its claim was lost"),
        Err(error) => tracing::warn!(run_id = %claim.run_id, %error, "cannot record a run's end"),
    }
}

/// What a run's renewer learnt.
#[derive(Default)]
struct RunFlags {
    /// The claim is no longer this host's: nothing may be recorded.
    lost: AtomicBool,
    /// An operator cancelled the run: it ends `cancelled`.
    cancelled: AtomicBool,
}

/// Renews `claim` every third of its ttl; aborts the run when the claim is lost, or when the
/// run was cancelled (then it keeps renewing, so the run's end can be recorded).
async fn renew(
    shared: Arc<Shared>,
    claim: omabox_contract::RunClaim,
    controller: AbortController,
    flags: Arc<RunFlags>,
) {
    let every = Duration::from_millis((shared.claim_ttl_ms / 3).max(50));
    loop {
        tokio::time::sleep(every).await;
        match shared.queue.renew(&claim, shared.claim_ttl_ms).await {
            Ok(true) => {}
            Ok(false) => {
                flags.lost.store(true, Ordering::SeqCst);
                controller.abort(PortError::new("the run's claim was lost"));
                return;
            }
            // A store hiccup: the next renewal may succeed before the claim expires.
            Err(error) => {
                tracing::warn!(%error, "cannot renew a run's claim");
                continue;
            }
        }
        if flags.cancelled.load(Ordering::SeqCst) {
            continue;
        }
        match shared.queue.cancel_requested(&claim).await {
            Ok(true) => {
                tracing::info!(run_id = %claim.run_id, "run cancelled");
                flags.cancelled.store(true, Ordering::SeqCst);
                controller.abort(PortError::new("the run was cancelled"));
            }
            Ok(false) => {}
            Err(error) => tracing::warn!(%error, "cannot read a run's cancel request"),
        }
    }
}

/// The run's end to record, or `None` when nothing may be recorded (this host is stopping
/// or lost the claim: another host runs it).
async fn execute(
    shared: &Shared,
    run: &ClaimedRun,
    controller: &AbortController,
    flags: &RunFlags,
    log: &Arc<EventLog>,
) -> Option<RunEnd> {
    let lost = &flags.lost;
    let spec: RunSpec = match serde_json::from_str(&run.spec) {
        Ok(spec) => spec,
        Err(error) => {
            return Some(RunEnd::Failed {
                error: format!("the queued run is not a run request: {error}"),
            });
        }
    };
    let failed = |text: String| RunEnd::Failed {
        error: spec::redact(&spec, &text),
    };
    let queued = QueuedRun {
        queue: Arc::clone(&shared.queue),
        claim: run.claim.clone(),
    };
    loop {
        // A stop (or a lost claim, or a cancel) that came before this run began: nothing is
        // started (a stopping host leaves the claim for any host once it expires).
        if shared.stopping.load(Ordering::SeqCst) || lost.load(Ordering::SeqCst) {
            return None;
        }
        if flags.cancelled.load(Ordering::SeqCst) {
            return Some(RunEnd::Cancelled);
        }
        let request =
            match spec::request(&spec, &run.session_id, &shared.config, Some(queued.clone())) {
                Ok(request) => request,
                Err(error) => return Some(failed(format!("{error:#}"))),
            };
        if let Err(error) = shared.runner.check_backend(request.backend) {
            return Some(failed(format!("{error:#}")));
        }
        let observers: RunObservers = log.observers(&spec);
        let outcome = shared
            .runner
            .run(request, observers, controller.signal())
            .await;
        if shared.stopping.load(Ordering::SeqCst) || lost.load(Ordering::SeqCst) {
            return None;
        }
        if flags.cancelled.load(Ordering::SeqCst) {
            log.line("the run was cancelled");
            return Some(RunEnd::Cancelled);
        }
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(error) => return Some(failed(format!("{error:#}"))),
        };
        return Some(match outcome.result {
            Ok(ManagedRuntimeRunResult::Completed { revision }) => RunEnd::Completed {
                revision: Some(revision),
            },
            Ok(ManagedRuntimeRunResult::Conflict { .. }) => {
                // Another owner (a host that died with the fence) holds the work item until
                // its fence expires; this claim keeps the run meanwhile.
                log.line("the session's work item is held by another owner; retrying");
                tokio::time::sleep(CONFLICT_RETRY).await;
                if shared.stopping.load(Ordering::SeqCst) || lost.load(Ordering::SeqCst) {
                    return None;
                }
                if flags.cancelled.load(Ordering::SeqCst) {
                    return Some(RunEnd::Cancelled);
                }
                continue;
            }
            Ok(ManagedRuntimeRunResult::LeaseLost) => {
                failed("the work item's lease was lost; nothing was published".to_owned())
            }
            Ok(ManagedRuntimeRunResult::Failed { error }) => failed(error.to_string()),
            Err(error) => failed(error.to_string()),
        });
    }
}
