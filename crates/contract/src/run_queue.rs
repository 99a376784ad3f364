//! omabox extension: the run queue — work items accepted over HTTP (`POST
//! /v1/sessions/{id}/runs`) waiting for any host of a shared store to run them.
//!
//! **Not an OpenMA port.** The reference schedules work inside its hosted control plane; a
//! sandbox backend has no queue to call. This one is omabox's own, kept next to the other
//! store ports so that one behavioural suite runs it on every store.
//!
//! ```text
//!   enqueue ──► queued ──claim──► running ──finish──► completed | failed | cancelled
//!               │  ▲                  │ cancel: requested; its host sees it after a
//!               │  └── claim expired ─┘ renewal, aborts the run and finishes it cancelled
//!               └──cancel──► cancelled    (another host claims it again: attempt + 1)
//! ```
//!
//! Rules every implementation keeps, each decided in one transaction with one clock read:
//!
//! - **No run is claimed twice at once.** A claim is `(run, attempt)`; re-claiming (after
//!   the claim expired) bumps the attempt, and every call of an older attempt is refused.
//! - **Runs of one session never overlap, and start in order.** Only a session's oldest
//!   unended run may be claimed, and only while no live claim holds it.
//! - **A host holds at most `capacity` live claims.**
//! - **A cancelled run never starts again.** A queued run ends `cancelled` at once; a
//!   running one is marked, its host learns it from [`RunQueuePort::cancel_requested`] after
//!   each renewal and finishes it `cancelled` (keeping a revision it published meanwhile); a
//!   marked run whose host died is ended `cancelled` by the next claim that finds it.
//! - **Each run publishes at most once.** [`RunQueuePort::publish_for_run`] publishes through
//!   the fence *and* records the revision on the run (and the run id on the publication
//!   history row) in the same transaction, only while the claim is live. A claim that finds
//!   the run already published completes it with that revision instead of handing it out.
//!
//! Invariant: **no secret.** A run's `spec` carries vault secret *names*, never values; no
//! record, event or error of this port carries a token or a vault value.

use crate::{PortError, PublishRuntimeResourcesInput, PublishRuntimeResourcesResult};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// The most events kept per run; later ones are dropped.
pub const MAX_RUN_EVENTS: u64 = 1_000;

/// The largest event text kept, in bytes (longer ones are cut at a character boundary).
pub const MAX_RUN_EVENT_BYTES: usize = 8 * 1024;

/// Where a run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// Waiting for a host.
    Queued,
    /// Claimed by a host (its claim may have expired: then it is claimable again).
    Running,
    /// Ended; `revision` is what it published, if anything.
    Completed,
    /// Ended without a result; `error` says why.
    Failed,
    /// Ended by an operator's cancel (`revision`: what it published before it noticed).
    Cancelled,
}

impl RunStatus {
    /// The stored and wire literal.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Completed => "completed",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// The status of a stored literal.
    pub fn parse(literal: &str) -> Option<Self> {
        match literal {
            "queued" => Some(RunStatus::Queued),
            "running" => Some(RunStatus::Running),
            "completed" => Some(RunStatus::Completed),
            "failed" => Some(RunStatus::Failed),
            "cancelled" => Some(RunStatus::Cancelled),
            _ => None,
        }
    }

    /// True for `completed`, `failed` and `cancelled`.
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

/// A run to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRunInput {
    /// Unique; chosen by the caller (`run_<random>`).
    pub run_id: String,
    /// The session it runs in (runs of one session never overlap).
    pub session_id: String,
    /// What to run, as the front end's JSON (no secret values).
    pub spec: String,
}

/// One live claim: the proof a host holds a run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunClaim {
    /// The run.
    pub run_id: String,
    /// The host holding it.
    pub host_id: String,
    /// 1 for the first claim, +1 for each claim after an expiry.
    pub attempt: u64,
}

/// A run handed to a host.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedRun {
    /// The claim (renew it before it expires).
    pub claim: RunClaim,
    /// The session.
    pub session_id: String,
    /// The spec as enqueued.
    pub spec: String,
}

/// How a host ends a run.
#[derive(Debug, Clone, PartialEq)]
pub enum RunEnd {
    /// It ran to its end; `revision` is what it published, if it published.
    Completed {
        /// The published revision.
        revision: Option<u64>,
    },
    /// It could not run or failed; `error` is safe to show (no secret).
    Failed {
        /// Why.
        error: String,
    },
    /// Its host aborted it on a cancel request (a revision a publish recorded is kept).
    Cancelled,
}

/// What [`RunQueuePort::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The run was queued: it ended `cancelled` now.
    Cancelled,
    /// The run is running: its host aborts it after its next renewal and ends it `cancelled`
    /// (unless it ends first).
    Requested,
    /// The run had ended already with this status; nothing changed.
    AlreadyEnded(RunStatus),
    /// No such run.
    NotFound,
}

/// Most runs one [`RunQueuePort::session_runs`] page holds.
pub const MAX_RUN_PAGE: usize = 100;

/// One page of a session's runs, newest first.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunPage {
    /// The runs.
    pub runs: Vec<RunRecord>,
    /// Where the next (older) page starts, when there may be one: pass it as `before`.
    pub next: Option<u64>,
}

/// A run as the queue knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// Where it is.
    pub status: RunStatus,
    /// The revision it published (set in the publish transaction, so also while running).
    pub revision: Option<u64>,
    /// Why it failed.
    pub error: Option<String>,
    /// How many times it was claimed.
    pub attempts: u64,
}

/// One stored event of a run's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunEvent {
    /// 1, 2, 3, … per run.
    pub seq: u64,
    /// The event (JSON text; secret-free by its writer).
    pub text: String,
}

/// The run queue (omabox extension; see the module doc).
#[async_trait]
pub trait RunQueuePort: Send + Sync {
    /// Queues a run. A run id already queued is an error.
    async fn enqueue(&self, input: EnqueueRunInput) -> Result<(), PortError>;

    /// Claims the oldest claimable run for `host_id` for `ttl_ms`, or `None`: nothing is
    /// claimable, or the host already holds `capacity` live claims. A claimable run is a
    /// session's oldest unended run when it is queued or its claim expired. A run found
    /// already published (its last host died after publishing) is completed with that
    /// revision here and never handed out.
    async fn claim(
        &self,
        host_id: &str,
        capacity: u64,
        ttl_ms: u64,
    ) -> Result<Option<ClaimedRun>, PortError>;

    /// Extends a live claim to `ttl_ms` from now; `false` when it is no longer live (expired,
    /// re-claimed, or ended).
    async fn renew(&self, claim: &RunClaim, ttl_ms: u64) -> Result<bool, PortError>;

    /// Ends the run of a live claim; `false` (and nothing changes) when the claim is not
    /// live. A `Completed` without a revision keeps one a publish recorded.
    async fn finish(&self, claim: &RunClaim, end: RunEnd) -> Result<bool, PortError>;

    /// Publishes `input` through the fence of the same store and, in that transaction,
    /// records the revision on the run and the run id on the history row — only while
    /// `claim` is live; otherwise `Lost` and nothing is written.
    async fn publish_for_run(
        &self,
        claim: &RunClaim,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError>;

    /// The run, if queued ever.
    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, PortError>;

    /// Cancels a run: a queued one ends `cancelled` now, a running one is marked for its host
    /// (see [`CancelOutcome`]). Idempotent while it runs.
    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, PortError>;

    /// Whether the run of `claim` was asked to cancel (its host asks after each renewal).
    async fn cancel_requested(&self, claim: &RunClaim) -> Result<bool, PortError>;

    /// `session_id`'s runs newest first: at most `limit` (capped to [`MAX_RUN_PAGE`]) of
    /// those enqueued before the cursor `before` (a [`RunPage::next`]; `None`: the newest).
    async fn session_runs(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, PortError>;

    /// Appends an event to the run of a live claim (cut to [`MAX_RUN_EVENT_BYTES`]);
    /// beyond [`MAX_RUN_EVENTS`] events it is dropped. `false` when the claim is not live.
    async fn append_event(&self, claim: &RunClaim, text: &str) -> Result<bool, PortError>;

    /// Up to `limit` events of the run with `seq > after`, in order.
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, PortError>;

    /// The run ids recorded on `session_id`'s publication history, by revision (`None`
    /// for a revision no run published).
    async fn published_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(u64, Option<String>)>, PortError>;
}

/// `text` cut to [`MAX_RUN_EVENT_BYTES`] at a character boundary.
pub fn cap_event(text: &str) -> &str {
    if text.len() <= MAX_RUN_EVENT_BYTES {
        return text;
    }
    let mut end = MAX_RUN_EVENT_BYTES;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}
