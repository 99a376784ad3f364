//! The run observer: what the fenced transaction tells a caller about each named step it
//! finished — admission, the fence, the workspace, outputs, egress, the sandbox, the harness,
//! cleanup — and how long the step's port call took.
//!
//! The host calls [`RunObserver::step`] once per port call of the transaction (the heartbeat
//! monitor's renewals and heartbeats included), in the order it made them, from the task that
//! made them. A front end turns these events into a timeline, a `--json` report or an HTTP
//! event stream; it never needs to wrap a port to see the transaction.
//!
//! What this must never carry: the fence token. Every error in a [`StepOutcome::Failed`] has
//! passed the host's redaction (`[redacted]` in place of the token) before the observer sees
//! it, and the facts are generations, ids, leases, candidates and counts — values the contract
//! already keeps free of the token. Observers must be cheap and must not block: they run on
//! the transaction's path.

use omabox_contract::{
    ManagedRuntimePlan, ManagedSandboxLease, ManagedWorkExecutionResult, OutputAbortReason,
    PortError, RuntimeResourcePublication, SessionOutputBinding, SessionOutputEntryCandidate,
    TerminationReason, WorkspaceBinding, WorkspaceCheckpointCandidate,
};
use std::fmt;
use std::time::Duration;

/// Receives the transaction's steps. Implementations must not block.
pub trait RunObserver: Send + Sync {
    /// One finished step.
    fn step(&self, event: StepEvent);
}

/// The named steps of one work item, in the contract's vocabulary (`port.call`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RunStep {
    /// Provider admission (descriptor, then live ports).
    Admission,
    /// The fence claim.
    FenceAcquire,
    /// A heartbeat renewal of the fence.
    FenceRenew,
    /// The atomic publication.
    FencePublish,
    /// The fence release (cleanup).
    FenceRelease,
    /// Workspace restore.
    WorkspaceMaterialize,
    /// Workspace attach.
    WorkspaceAttach,
    /// Workspace capture.
    WorkspaceCheckpoint,
    /// Workspace binding release (cleanup).
    WorkspaceRelease,
    /// Outputs prepare.
    OutputsPrepare,
    /// Outputs attach.
    OutputsAttach,
    /// Outputs collect.
    OutputsCollect,
    /// Outputs finalize.
    OutputsFinalize,
    /// Published outputs release (cleanup).
    OutputsRelease,
    /// Unpublished outputs abort (cleanup).
    OutputsAbort,
    /// Credential egress prepare.
    CredentialEgressPrepare,
    /// Credential egress attach.
    CredentialEgressAttach,
    /// Credential egress revoke (cleanup).
    CredentialEgressRevoke,
    /// Credential egress release (cleanup).
    CredentialEgressRelease,
    /// Warm start from a runtime checkpoint.
    RuntimeCheckpointRestore,
    /// Runtime checkpoint capture.
    RuntimeCheckpointCreate,
    /// Fresh compute.
    SandboxAcquire,
    /// A heartbeat of the sandbox.
    SandboxHeartbeat,
    /// Suspending a retained runtime.
    SandboxSuspend,
    /// Terminating compute (cleanup).
    SandboxTerminate,
    /// Session inputs staged.
    SessionInputsMaterialize,
    /// The harness ran.
    HarnessRun,
    /// A failed terminate queued for the reaper (cleanup).
    OrphansEnqueue,
}

impl RunStep {
    /// `port.call`, e.g. `sandbox.acquire`: the key of a timings table.
    pub fn name(self) -> &'static str {
        match self {
            RunStep::Admission => "admission",
            RunStep::FenceAcquire => "fence.acquire",
            RunStep::FenceRenew => "fence.renew",
            RunStep::FencePublish => "fence.publish",
            RunStep::FenceRelease => "fence.release",
            RunStep::WorkspaceMaterialize => "workspace.materialize",
            RunStep::WorkspaceAttach => "workspace.attach",
            RunStep::WorkspaceCheckpoint => "workspace.checkpoint",
            RunStep::WorkspaceRelease => "workspace.release",
            RunStep::OutputsPrepare => "outputs.prepare",
            RunStep::OutputsAttach => "outputs.attach",
            RunStep::OutputsCollect => "outputs.collect",
            RunStep::OutputsFinalize => "outputs.finalize",
            RunStep::OutputsRelease => "outputs.release",
            RunStep::OutputsAbort => "outputs.abort",
            RunStep::CredentialEgressPrepare => "credential_egress.prepare",
            RunStep::CredentialEgressAttach => "credential_egress.attach",
            RunStep::CredentialEgressRevoke => "credential_egress.revoke",
            RunStep::CredentialEgressRelease => "credential_egress.release",
            RunStep::RuntimeCheckpointRestore => "runtime_checkpoint.restore",
            RunStep::RuntimeCheckpointCreate => "runtime_checkpoint.create",
            RunStep::SandboxAcquire => "sandbox.acquire",
            RunStep::SandboxHeartbeat => "sandbox.heartbeat",
            RunStep::SandboxSuspend => "sandbox.suspend",
            RunStep::SandboxTerminate => "sandbox.terminate",
            RunStep::SessionInputsMaterialize => "session_inputs.materialize",
            RunStep::HarnessRun => "harness.run",
            RunStep::OrphansEnqueue => "orphans.enqueue",
        }
    }
}

impl fmt::Display for RunStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One finished step.
#[derive(Debug, Clone)]
pub struct StepEvent {
    /// Which step.
    pub step: RunStep,
    /// How long its port call took.
    pub elapsed: Duration,
    /// What it produced, or its (redacted) error.
    pub outcome: StepOutcome,
}

/// How a step ended.
#[derive(Debug, Clone)]
pub enum StepOutcome {
    /// The port answered; the facts say what it answered.
    Done(StepFacts),
    /// The port failed. The error is redacted: it never contains the fence token.
    Failed(PortError),
}

/// What a successful step produced (token-free values only).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum StepFacts {
    /// Nothing worth reporting (attach, release, a renewal, a live heartbeat).
    Nothing,
    /// Admission selected this plan of `provider`.
    Admitted {
        /// The admitted provider.
        provider: String,
        /// Its resolved plan.
        plan: Box<ManagedRuntimePlan>,
    },
    /// The fence was claimed.
    FenceClaimed {
        /// The new generation.
        generation: u64,
        /// The publication the run starts from.
        publication: Option<Box<RuntimeResourcePublication>>,
    },
    /// Another owner holds the work item.
    FenceConflict {
        /// When its fence expires.
        expires_at: Option<String>,
    },
    /// A renewal, a heartbeat or the publication found ownership gone.
    Lost,
    /// Published.
    Published {
        /// The publication revision.
        revision: u64,
    },
    /// The fence was released.
    FenceReleased {
        /// The released generation.
        generation: u64,
        /// Why.
        reason: TerminationReason,
    },
    /// The workspace binding, restored from `from_checkpoint` (none: a new work item).
    Workspace {
        /// The binding.
        binding: WorkspaceBinding,
        /// The published candidate id it was restored from.
        from_checkpoint: Option<String>,
    },
    /// The workspace candidate.
    Checkpoint(WorkspaceCheckpointCandidate),
    /// The outputs binding.
    Outputs(SessionOutputBinding),
    /// The collected output entries.
    Collected(Vec<SessionOutputEntryCandidate>),
    /// The finalized output manifest.
    Finalized {
        /// Its id.
        manifest_id: String,
    },
    /// Unpublished outputs were discarded.
    OutputsAborted(OutputAbortReason),
    /// Compute (acquired, restored or suspended).
    Sandbox(Box<ManagedSandboxLease>),
    /// Compute was terminated.
    Terminated {
        /// The provider's runtime id.
        runtime_id: String,
        /// Why.
        reason: TerminationReason,
    },
    /// A terminate failed; the runtime was queued for the reaper.
    Orphaned {
        /// The provider's runtime id.
        runtime_id: String,
    },
    /// The harness settled.
    Harness(ManagedWorkExecutionResult),
}
