//! [`FakeWorkspace`]: a scripted `WorkspacePersistencePort`.
//!
//! Defaults: strategies `[checkpoint_restore]`; `materialize` → `{workspace-fault,
//! /workspace}`; `attach` → ok; `checkpoint` → `{workspace-candidate, sha256:workspace,
//! revision 1}`; `release` → ok.

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AttachWorkspaceInput, CheckpointWorkspaceInput, MaterializeWorkspaceInput,
    PortError, RuntimeResourceFence, RuntimeResourceScope, WORKSPACE_MOUNT_PATH, WorkspaceBinding,
    WorkspaceCheckpointCandidate, WorkspacePersistenceCapabilities, WorkspacePersistencePort,
    WorkspaceStrategy,
};

/// Input of `release`.
#[derive(Debug, Clone)]
pub struct WorkspaceReleaseCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: WorkspaceBinding,
}

impl WithSignal for MaterializeWorkspaceInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for AttachWorkspaceInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for CheckpointWorkspaceInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// A workspace binding at `/workspace`.
pub fn workspace_binding(binding_id: &str) -> WorkspaceBinding {
    WorkspaceBinding {
        binding_id: binding_id.to_owned(),
        mount_path: WORKSPACE_MOUNT_PATH.to_owned(),
        metadata: None,
    }
}

/// A workspace candidate without metadata.
pub fn workspace_candidate(
    id: &str,
    content_hash: &str,
    revision: u64,
) -> WorkspaceCheckpointCandidate {
    WorkspaceCheckpointCandidate {
        id: id.to_owned(),
        content_hash: content_hash.to_owned(),
        revision,
        metadata: None,
    }
}

/// A scripted workspace persistence port.
#[derive(Debug)]
pub struct FakeWorkspace {
    log: CallLog,
    /// `capabilities`.
    pub capabilities: Step<RuntimeResourceScope, WorkspacePersistenceCapabilities>,
    /// `materialize`.
    pub materialize: Step<MaterializeWorkspaceInput, WorkspaceBinding>,
    /// `attach`.
    pub attach: Step<AttachWorkspaceInput, ()>,
    /// `checkpoint`.
    pub checkpoint: Step<CheckpointWorkspaceInput, WorkspaceCheckpointCandidate>,
    /// `release`.
    pub release: Step<WorkspaceReleaseCall, ()>,
}

impl FakeWorkspace {
    /// The fault-matrix workspace port.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            capabilities: Step::new(|_| async {
                Ok(WorkspacePersistenceCapabilities {
                    strategies: vec![WorkspaceStrategy::CheckpointRestore],
                })
            }),
            materialize: Step::new(|_| async { Ok(workspace_binding("workspace-fault")) }),
            attach: Step::new(|_| async { Ok(()) }),
            checkpoint: Step::new(|_| async {
                Ok(workspace_candidate(
                    "workspace-candidate",
                    "sha256:workspace",
                    1,
                ))
            }),
            release: Step::new(|_| async { Ok(()) }),
        }
    }

    /// Makes `capabilities` advertise exactly `strategies`.
    pub fn advertises(&self, strategies: Vec<WorkspaceStrategy>) {
        self.capabilities
            .returns(WorkspacePersistenceCapabilities { strategies });
    }
}

#[async_trait]
impl WorkspacePersistencePort for FakeWorkspace {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError> {
        self.log.push(format!("{}.capabilities", names::WORKSPACE));
        self.capabilities.invoke(scope.clone()).await
    }

    async fn materialize(
        &self,
        input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError> {
        self.log.push(format!("{}.materialize", names::WORKSPACE));
        self.materialize.invoke(input).await
    }

    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError> {
        self.log.push(format!("{}.attach", names::WORKSPACE));
        self.attach.invoke(input).await
    }

    async fn checkpoint(
        &self,
        input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        self.log.push(format!("{}.checkpoint", names::WORKSPACE));
        self.checkpoint.invoke(input).await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.release", names::WORKSPACE));
        self.release
            .invoke(WorkspaceReleaseCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
            })
            .await
    }
}
