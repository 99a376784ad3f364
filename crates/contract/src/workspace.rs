//! `WorkspacePersistencePort`: `/workspace` across work items.

use crate::json::Meta;
use crate::{
    AbortSignal, ManagedSandboxLease, PortError, RuntimePublicationCandidate, RuntimeResourceFence,
    RuntimeResourceScope, WorkspacePersistenceCapabilities, WorkspaceStrategy,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A materialized workspace, ready to attach at `/workspace`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceBinding {
    /// Binding id (not a secret).
    pub binding_id: String,
    /// Always `/workspace`.
    pub mount_path: String,
    /// Opaque adapter state (e.g. the host path).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

/// An immutable workspace version, inactive until published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceCheckpointCandidate {
    /// Candidate id.
    pub id: String,
    /// Content hash.
    pub content_hash: String,
    /// Revision the adapter assigns (omabox: the fence generation).
    pub revision: u64,
    /// Opaque adapter metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

impl WorkspaceCheckpointCandidate {
    /// The candidate as it is published.
    pub fn to_publication_candidate(&self) -> RuntimePublicationCandidate {
        RuntimePublicationCandidate {
            id: self.id.clone(),
            content_hash: self.content_hash.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// Input of [`WorkspacePersistencePort::materialize`].
#[derive(Debug, Clone)]
pub struct MaterializeWorkspaceInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: WorkspaceStrategy,
    /// The last published workspace candidate, if any.
    pub active_checkpoint: Option<RuntimePublicationCandidate>,
    /// `<workId>:<generation>:workspace-materialize`.
    pub idempotency_key: String,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of [`WorkspacePersistencePort::attach`].
#[derive(Debug, Clone)]
pub struct AttachWorkspaceInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: WorkspaceStrategy,
    /// The materialized binding.
    pub binding: WorkspaceBinding,
    /// The sandbox to attach to.
    pub sandbox: ManagedSandboxLease,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of [`WorkspacePersistencePort::checkpoint`].
#[derive(Debug, Clone)]
pub struct CheckpointWorkspaceInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: WorkspaceStrategy,
    /// The materialized binding.
    pub binding: WorkspaceBinding,
    /// The sandbox the workspace is attached to.
    pub sandbox: ManagedSandboxLease,
    /// `<workId>:<generation>:workspace-checkpoint[-<id>]`.
    pub idempotency_key: String,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Workspace persistence. Call order: materialize → attach → checkpoint* → release.
#[async_trait]
pub trait WorkspacePersistencePort: Send + Sync {
    /// Strategies this port implements.
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError>;

    /// Prepares the workspace (restoring `active_checkpoint` when given) before compute exists.
    async fn materialize(
        &self,
        input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError>;

    /// Attaches the binding to acquired compute.
    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError>;

    /// Captures an immutable candidate; it stays inactive until the fence publishes it.
    async fn checkpoint(
        &self,
        input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError>;

    /// Forgets the binding. Best-effort cleanup; the host ignores its errors.
    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError>;
}
