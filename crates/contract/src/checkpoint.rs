//! `RuntimeCheckpointPort`: an optional warm start. Never canonical: the published workspace
//! is the truth, and a failed restore falls back to a fresh acquire.

use crate::{
    ManagedSandboxLease, PortError, RuntimeCheckpointKind, RuntimeResourceFence,
    RuntimeResourceScope,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A provider runtime checkpoint, as published beside the workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeCheckpointRef {
    /// Provider that created it.
    pub provider: String,
    /// Provider checkpoint id.
    pub checkpoint_id: String,
    /// What it captures.
    pub kind: RuntimeCheckpointKind,
    /// The runtime it was taken from.
    pub source_runtime_id: String,
    /// The session.
    pub session_id: String,
    /// Generation that created it.
    pub work_generation: u64,
    /// Workspace revision it belongs to.
    pub workspace_revision: u64,
    /// Harness version it can resume.
    pub harness_version: String,
    /// Stable JSON identity of the harness process (env names only, never values).
    pub runtime_identity: String,
}

/// Input of [`RuntimeCheckpointPort::create`].
#[derive(Debug, Clone)]
pub struct CreateRuntimeCheckpointInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The sandbox to checkpoint.
    pub sandbox: ManagedSandboxLease,
    /// Kind.
    pub kind: RuntimeCheckpointKind,
    /// The workspace candidate's revision.
    pub workspace_revision: u64,
    /// Harness version.
    pub harness_version: String,
    /// Runtime identity.
    pub runtime_identity: String,
}

/// Creates and restores provider runtime checkpoints.
#[async_trait]
pub trait RuntimeCheckpointPort: Send + Sync {
    /// Captures the runtime; the returned ref must echo the input's identity fields.
    async fn create(
        &self,
        input: CreateRuntimeCheckpointInput,
    ) -> Result<RuntimeCheckpointRef, PortError>;

    /// Restores a runtime from a ref; rejects a foreign provider's ref.
    async fn restore(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        checkpoint: &RuntimeCheckpointRef,
    ) -> Result<ManagedSandboxLease, PortError>;
}
