//! [`ProviderRuntimeCheckpoint`]: the contract's `RuntimeCheckpointPort` of kind `process`
//! over a provider that captures and restores processes
//! ([`ManagedSandboxProvider::capture_processes`]).
//!
//! ```text
//!   run N   … harness ─► workspace.checkpoint ─► create: provider.capture_processes(lease)
//!                                                  └─► ref {provider, checkpointId, kind
//!                                                       process, echoes of the input}
//!   run N+1 workspace.materialize ─┐ (recorded by this run's ports)
//!           outputs.prepare ───────┤
//!           restore(ref) ──────────┴─► provider.restore_processes(id, those bindings)
//!                                      ─► readiness ─► lease;  the checkpoint is removed
//! ```
//!
//! The contract's `restore` gets no bindings, yet a restored runtime must bind the
//! workspace this run materialized (the published revision, the truth) and this run's
//! outputs directory. One value of this module is made per run (the driver's `create`), so
//! it wraps that run's workspace and outputs ports and records the bindings they hand out
//! for the run's generation.
//!
//! A checkpoint is restored at most once: a restore consumes it (the restored runtime's
//! processes have moved on from it, and the run publishes a newer one when it completes).
//! A run that fails after consuming one leaves the previous publication's ref pointing at
//! nothing: the next restore fails and, as the contract wants of a warm start, the host
//! acquires cold. Checkpoints never restored are the provider's to expire (its reap).
//!
//! Never: restore another provider's checkpoint, restore without this run's bindings, or
//! put anything but the provider's opaque id into the ref (no path, no secret).

use super::provider::ManagedSandboxProvider;
use super::runtime::ProviderManagedRuntime;
use async_trait::async_trait;
use omabox_contract::{
    AttachOutputsInput, AttachWorkspaceInput, CheckpointWorkspaceInput, CollectOutputsInput,
    CreateRuntimeCheckpointInput, FinalizeOutputsInput, ManagedRuntimePlan, ManagedSandboxLease,
    MaterializeWorkspaceInput, OutputAbortReason, PortError, PrepareOutputsInput,
    RuntimeCheckpointKind, RuntimeCheckpointPort, RuntimeCheckpointRef, RuntimeResourceFence,
    RuntimeResourceScope, SessionOutputBinding, SessionOutputCapabilities,
    SessionOutputEntryCandidate, SessionOutputManifestCandidate, SessionOutputPort,
    WorkspaceBinding, WorkspaceCheckpointCandidate, WorkspacePersistenceCapabilities,
    WorkspacePersistencePort,
};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The bindings one run's ports handed out, by scope and generation.
#[derive(Debug, Default)]
struct RunBindings {
    workspace: Mutex<HashMap<(RuntimeResourceScope, u64), WorkspaceBinding>>,
    outputs: Mutex<HashMap<(RuntimeResourceScope, u64), SessionOutputBinding>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One run's `process` runtime checkpoints, with the workspace and outputs ports that record
/// its bindings (module doc).
pub(crate) struct ProviderRuntimeCheckpoint {
    runtime: Arc<ProviderManagedRuntime>,
    plan: ManagedRuntimePlan,
    bindings: Arc<RunBindings>,
}

impl ProviderRuntimeCheckpoint {
    /// The run's checkpoint port and its recording workspace and outputs ports.
    pub(crate) fn for_run(
        runtime: Arc<ProviderManagedRuntime>,
        plan: ManagedRuntimePlan,
        workspace: Arc<dyn WorkspacePersistencePort>,
        outputs: Arc<dyn SessionOutputPort>,
    ) -> (
        Arc<Self>,
        Arc<dyn WorkspacePersistencePort>,
        Arc<dyn SessionOutputPort>,
    ) {
        let bindings = Arc::new(RunBindings::default());
        let port = Arc::new(Self {
            runtime,
            plan,
            bindings: Arc::clone(&bindings),
        });
        let workspace = Arc::new(RecordingWorkspace {
            inner: workspace,
            bindings: Arc::clone(&bindings),
        });
        let outputs = Arc::new(RecordingOutputs {
            inner: outputs,
            bindings,
        });
        (port, workspace, outputs)
    }

    fn provider(&self) -> &Arc<dyn ManagedSandboxProvider> {
        self.runtime.provider()
    }
}

#[async_trait]
impl RuntimeCheckpointPort for ProviderRuntimeCheckpoint {
    async fn create(
        &self,
        input: CreateRuntimeCheckpointInput,
    ) -> Result<RuntimeCheckpointRef, PortError> {
        if input.kind != RuntimeCheckpointKind::Process {
            return Err(PortError::capability(format!(
                "{} captures process runtime checkpoints only ({} requested)",
                self.provider().name(),
                input.kind
            )));
        }
        self.runtime.check_provider(&input.sandbox)?;
        let checkpoint_id = self
            .provider()
            .capture_processes(&input.sandbox, &input.scope.session_id)
            .await?;
        Ok(RuntimeCheckpointRef {
            provider: input.sandbox.provider.clone(),
            checkpoint_id,
            kind: RuntimeCheckpointKind::Process,
            source_runtime_id: input.sandbox.runtime_id.clone(),
            session_id: input.scope.session_id.clone(),
            work_generation: input.fence.generation,
            workspace_revision: input.workspace_revision,
            harness_version: input.harness_version,
            runtime_identity: input.runtime_identity,
        })
    }

    async fn restore(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        checkpoint: &RuntimeCheckpointRef,
    ) -> Result<ManagedSandboxLease, PortError> {
        let name = self.provider().name();
        if checkpoint.provider != name {
            return Err(PortError::invalid_argument(format!(
                "{name} cannot restore a runtime checkpoint of provider {:?}",
                checkpoint.provider
            )));
        }
        if checkpoint.kind != RuntimeCheckpointKind::Process {
            return Err(PortError::invalid_argument(format!(
                "{name} restores process runtime checkpoints only, not {}",
                checkpoint.kind
            )));
        }
        let key = (scope.clone(), fence.generation);
        let workspace = lock(&self.bindings.workspace)
            .get(&key)
            .cloned()
            .ok_or_else(|| {
                PortError::new(format!(
                    "{name} restores a runtime checkpoint only after this run materialized its \
                     workspace (generation {})",
                    fence.generation
                ))
            })?;
        let outputs = lock(&self.bindings.outputs).get(&key).cloned();
        let signal = omabox_contract::AbortSignal::never();
        let acquisition = self.runtime.bind(
            scope,
            fence.generation,
            &self.plan,
            &workspace,
            outputs.as_ref(),
            &signal,
        )?;
        acquisition.create_binding_dirs()?;
        let provided = self
            .provider()
            .restore_processes(&checkpoint.checkpoint_id, acquisition)
            .await?;
        let lease = self.runtime.admit(provided, &self.plan, &signal).await?;
        // Consumed (module doc); a checkpoint left behind is the provider's reap's.
        if let Err(error) = self
            .provider()
            .remove_processes(&checkpoint.checkpoint_id)
            .await
        {
            tracing::warn!(provider = %name, checkpoint = %checkpoint.checkpoint_id, %error, "removing a restored runtime checkpoint failed");
        }
        Ok(lease)
    }
}

/// The run's workspace port, recording the binding `materialize` hands out.
struct RecordingWorkspace {
    inner: Arc<dyn WorkspacePersistencePort>,
    bindings: Arc<RunBindings>,
}

#[async_trait]
impl WorkspacePersistencePort for RecordingWorkspace {
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
        let key = (input.scope.clone(), input.fence.generation);
        let binding = self.inner.materialize(input).await?;
        lock(&self.bindings.workspace).insert(key, binding.clone());
        Ok(binding)
    }

    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError> {
        self.inner.attach(input).await
    }

    async fn checkpoint(
        &self,
        input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        self.inner.checkpoint(input).await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        lock(&self.bindings.workspace).remove(&(scope.clone(), fence.generation));
        self.inner.release(scope, fence, binding).await
    }
}

/// The run's outputs port, recording the binding `prepare` hands out.
struct RecordingOutputs {
    inner: Arc<dyn SessionOutputPort>,
    bindings: Arc<RunBindings>,
}

impl RecordingOutputs {
    fn forget(&self, scope: &RuntimeResourceScope, fence: &RuntimeResourceFence) {
        lock(&self.bindings.outputs).remove(&(scope.clone(), fence.generation));
    }
}

#[async_trait]
impl SessionOutputPort for RecordingOutputs {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError> {
        let key = (input.scope.clone(), input.fence.generation);
        let binding = self.inner.prepare(input).await?;
        lock(&self.bindings.outputs).insert(key, binding.clone());
        Ok(binding)
    }

    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError> {
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
        self.forget(scope, fence);
        self.inner.release(scope, fence, binding).await
    }

    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        self.forget(scope, fence);
        self.inner.abort(scope, fence, binding, reason).await
    }
}
