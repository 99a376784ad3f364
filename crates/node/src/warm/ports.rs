//! The decorators that let the host's fenced transaction keep a turn's runtime instead of
//! tearing it down, and hand it back to the session's next turn (module doc of
//! `crate::warm`). The transaction itself is unchanged: what differs is what a few port
//! calls do, decided by one [`Capture`] per run.
//!
//! ```text
//!   cold turn (keeping):  sandbox.acquire ─► recorded     terminate(completed) + live agent ─► kept
//!                         workspace/outputs bindings ─► recorded; release ─► kept when kept
//!                         fence.release(completed) ─► kept (the claim stays held, renewed)
//!   warm turn (reusing):  fence.acquire ─► the same claim again (re-entrant, same generation)
//!                         materialize / prepare / acquire ─► the kept binding / lease
//!                         (the outputs emptied), attach ─► nothing (already mounted)
//! ```
//!
//! A turn that does not end `completed` with a live agent releases everything through the
//! real ports, as a cold run does; so a failure never leaves a kept runtime.

use async_trait::async_trait;
use omabox_acp::{AcpAgentSlot, LiveAcpAgent};
use omabox_contract::{
    AbortSignal, AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, AcquireSandboxInput,
    AttachOutputsInput, AttachWorkspaceInput, CheckpointWorkspaceInput, CollectOutputsInput,
    FinalizeOutputsInput, ManagedRuntimeProviderCreateInput,
    ManagedRuntimeProviderDriverDescriptor, ManagedRuntimeProviderDriverPort,
    ManagedRuntimeProviderResources, ManagedSandboxLease, ManagedSandboxPort,
    MaterializeWorkspaceInput, OutputAbortReason, PortError, PrepareOutputsInput,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RenewRuntimeFenceResult,
    RuntimeLeaseJournalPort, RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourceScope,
    SandboxHeartbeatResult, SandboxObservation, SandboxResourceCapabilities, SessionOutputBinding,
    SessionOutputCapabilities, SessionOutputEntryCandidate, SessionOutputManifestCandidate,
    SessionOutputPort, TerminationReason, WorkspaceBinding, WorkspaceCheckpointCandidate,
    WorkspacePersistenceCapabilities, WorkspacePersistencePort,
};
use omabox_host::lease_journal::JournaledSandbox;
use omabox_persistence::FilesystemSessionOutputPort;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What a warm turn reuses: the kept runtime's lease and bindings.
#[derive(Debug, Clone)]
pub(crate) struct Reused {
    pub lease: ManagedSandboxLease,
    pub workspace: WorkspaceBinding,
    pub outputs: Option<SessionOutputBinding>,
    /// Makes the turn's checkpoint key its own: the claim's generation (and so the host's
    /// idempotency keys) is the same for every turn on the runtime, and the workspace port
    /// returns the candidate it already made for a key instead of capturing again.
    pub turn: String,
}

/// Whether the turn's runtime may be kept at its end: a live agent is there to prompt.
pub(crate) enum Agent {
    /// A cold turn: the ACP driver leaves its agent in this slot when the turn ended.
    Slot(Arc<AcpAgentSlot>),
    /// A warm turn: the agent it prompted (a failed prompt closes it).
    Live(Arc<LiveAcpAgent>),
}

/// What one run's decorators record and decide (module doc).
pub(crate) struct Capture {
    reused: Option<Reused>,
    agent: Agent,
    outputs_port: Arc<FilesystemSessionOutputPort>,
    state: Mutex<Captured>,
}

/// What the run allocated, as the decorators saw it.
#[derive(Default)]
pub(crate) struct Captured {
    /// The ports the provider created (the journaled sandbox among them), undecorated.
    pub resources: Option<ManagedRuntimeProviderResources>,
    pub lease: Option<ManagedSandboxLease>,
    pub workspace: Option<WorkspaceBinding>,
    pub outputs: Option<SessionOutputBinding>,
    pub fence: Option<RuntimeResourceFence>,
    /// Set by `terminate(completed)` when the runtime is kept: every later release is
    /// skipped.
    pub kept: bool,
}

impl Capture {
    /// A run that may keep its runtime; `reused` when it is a warm turn.
    pub(crate) fn new(
        reused: Option<Reused>,
        agent: Agent,
        outputs_port: Arc<FilesystemSessionOutputPort>,
    ) -> Arc<Self> {
        Arc::new(Self {
            reused,
            agent,
            outputs_port,
            state: Mutex::new(Captured::default()),
        })
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, Captured> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn kept(&self) -> bool {
        self.state().kept
    }

    fn agent_alive(&self) -> bool {
        match &self.agent {
            Agent::Slot(slot) => slot.is_full(),
            Agent::Live(agent) => agent.is_alive(),
        }
    }
}

/// The provider driver of a run that may keep its runtime: its ports decorated. A warm
/// turn's driver returns the kept runtime's ports (`resources`) instead of creating new
/// ones.
pub(crate) struct KeepingDriver {
    pub inner: Arc<dyn ManagedRuntimeProviderDriverPort>,
    /// A warm turn's ports (the kept runtime's, undecorated), its harness replaced.
    pub resources: Option<ManagedRuntimeProviderResources>,
    /// Journals the leases (the host's journal decorator would forget a kept lease).
    pub journal: Arc<dyn RuntimeLeaseJournalPort>,
    pub capture: Arc<Capture>,
}

#[async_trait]
impl ManagedRuntimeProviderDriverPort for KeepingDriver {
    fn descriptor(&self) -> ManagedRuntimeProviderDriverDescriptor {
        self.inner.descriptor()
    }

    async fn create(
        &self,
        input: ManagedRuntimeProviderCreateInput,
    ) -> Result<ManagedRuntimeProviderResources, PortError> {
        let resources = match &self.resources {
            Some(resources) => resources.clone(),
            None => {
                let mut created = self.inner.create(input).await?;
                created.sandbox = Arc::new(JournaledSandbox::new(
                    created.sandbox,
                    Arc::clone(&self.journal),
                ));
                created
            }
        };
        self.capture.state().resources = Some(resources.clone());
        let capture = &self.capture;
        Ok(ManagedRuntimeProviderResources {
            sandbox: Arc::new(KeepingSandbox {
                inner: Arc::clone(&resources.sandbox),
                capture: Arc::clone(capture),
            }),
            workspace: Arc::new(KeepingWorkspace {
                inner: Arc::clone(&resources.workspace),
                capture: Arc::clone(capture),
            }),
            outputs: Arc::new(KeepingOutputs {
                inner: Arc::clone(&resources.outputs),
                capture: Arc::clone(capture),
            }),
            ..resources
        })
    }
}

struct KeepingSandbox {
    inner: Arc<dyn ManagedSandboxPort>,
    capture: Arc<Capture>,
}

#[async_trait]
impl ManagedSandboxPort for KeepingSandbox {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        let lease = match &self.capture.reused {
            Some(reused) => reused.lease.clone(),
            None => self.inner.acquire(input).await?,
        };
        self.capture.state().lease = Some(lease.clone());
        Ok(lease)
    }

    async fn heartbeat(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        self.inner.heartbeat(scope, fence, lease).await
    }

    async fn suspend(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        self.inner.suspend(scope, fence, lease, signal).await
    }

    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        // Kept only when the turn completed and its agent is there to take the next one.
        if reason == TerminationReason::Completed && self.capture.agent_alive() {
            self.capture.state().kept = true;
            return Ok(());
        }
        self.inner.terminate(scope, fence, lease, reason).await
    }

    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.inner.reap(scope, lease, reason).await
    }

    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        self.inner.inspect(lease).await
    }
}

struct KeepingWorkspace {
    inner: Arc<dyn WorkspacePersistencePort>,
    capture: Arc<Capture>,
}

#[async_trait]
impl WorkspacePersistencePort for KeepingWorkspace {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn materialize(
        &self,
        input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError> {
        // A warm turn's workspace is the kept one: it holds what the last turn published
        // (the claim was held since, so nobody else published).
        let binding = match &self.capture.reused {
            Some(reused) => reused.workspace.clone(),
            None => self.inner.materialize(input).await?,
        };
        self.capture.state().workspace = Some(binding.clone());
        Ok(binding)
    }

    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError> {
        if self.capture.reused.is_some() {
            return Ok(());
        }
        self.inner.attach(input).await
    }

    async fn checkpoint(
        &self,
        mut input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        if let Some(reused) = &self.capture.reused {
            input.idempotency_key = format!("{}:{}", input.idempotency_key, reused.turn);
        }
        self.inner.checkpoint(input).await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        if self.capture.kept() {
            return Ok(());
        }
        self.inner.release(scope, fence, binding).await
    }
}

struct KeepingOutputs {
    inner: Arc<dyn SessionOutputPort>,
    capture: Arc<Capture>,
}

#[async_trait]
impl SessionOutputPort for KeepingOutputs {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError> {
        let binding = match self.capture.reused.as_ref().and_then(|r| r.outputs.clone()) {
            Some(binding) => {
                // A turn's outputs are what it wrote: the kept directory starts empty again.
                self.capture
                    .outputs_port
                    .empty(&input.scope, &input.fence, &binding)
                    .await?;
                binding
            }
            None => self.inner.prepare(input).await?,
        };
        self.capture.state().outputs = Some(binding.clone());
        Ok(binding)
    }

    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError> {
        if self.capture.reused.is_some() {
            return Ok(());
        }
        self.inner.attach(input).await
    }

    async fn collect(
        &self,
        input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError> {
        self.inner.collect(input).await
    }

    async fn finalize(
        &self,
        input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError> {
        self.inner.finalize(input).await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<(), PortError> {
        if self.capture.kept() {
            return Ok(());
        }
        self.inner.release(scope, fence, binding).await
    }

    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        if self.capture.kept() {
            return Ok(());
        }
        self.inner.abort(scope, fence, binding, reason).await
    }
}

/// The outermost fence decorator (outside the session-token one): a kept runtime's claim is
/// not released, so its token (in the warm agent's environment) stays valid with it.
pub(crate) struct KeepingFence {
    pub inner: Arc<dyn RuntimeResourceFencePort>,
    pub capture: Arc<Capture>,
}

#[async_trait]
impl RuntimeResourceFencePort for KeepingFence {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        self.inner.acquire(input).await
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        self.inner.is_current(fence).await
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        self.inner.renew(fence, ttl_ms).await
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        self.inner.publish(input).await
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        {
            let mut state = self.capture.state();
            if state.kept && reason == TerminationReason::Completed {
                state.fence = Some(fence.clone());
                return Ok(());
            }
        }
        self.inner.release(fence, reason).await
    }
}
