//! `SessionOutputPort`: `/mnt/session/outputs` to a durable manifest.

use crate::json::Meta;
use crate::{
    AbortSignal, ManagedSandboxLease, OutputStrategy, PortError, RuntimePublicationCandidate,
    RuntimeResourceFence, RuntimeResourceScope, SessionOutputCapabilities,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// A prepared outputs directory, ready to attach at `/mnt/session/outputs`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOutputBinding {
    /// Binding id.
    pub binding_id: String,
    /// Always `/mnt/session/outputs`.
    pub mount_path: String,
    /// Opaque adapter state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

/// One collected output file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOutputEntryCandidate {
    /// Path under `/mnt/session/outputs/`.
    pub logical_path: String,
    /// `sha256:<hex>`.
    pub content_hash: String,
    /// Size in bytes.
    pub size: u64,
    /// Media type, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
}

/// A finalized manifest, not user-visible until published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOutputManifestCandidate {
    /// Manifest id.
    pub id: String,
    /// Content hash of the manifest.
    pub content_hash: String,
    /// Number of entries.
    pub entries: u64,
    /// Opaque adapter metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

impl SessionOutputManifestCandidate {
    /// The manifest as it is published.
    pub fn to_publication_candidate(&self) -> RuntimePublicationCandidate {
        RuntimePublicationCandidate {
            id: self.id.clone(),
            content_hash: self.content_hash.clone(),
            metadata: self.metadata.clone(),
        }
    }
}

/// Why unpublished outputs are discarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputAbortReason {
    /// A step failed.
    Failed,
    /// Ownership was lost.
    LeaseLost,
}

/// Input of [`SessionOutputPort::prepare`].
#[derive(Debug, Clone)]
pub struct PrepareOutputsInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: OutputStrategy,
    /// `<workId>:<generation>:outputs-prepare`.
    pub idempotency_key: String,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of [`SessionOutputPort::attach`].
#[derive(Debug, Clone)]
pub struct AttachOutputsInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: OutputStrategy,
    /// The prepared binding.
    pub binding: SessionOutputBinding,
    /// The sandbox.
    pub sandbox: ManagedSandboxLease,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of [`SessionOutputPort::collect`].
#[derive(Debug, Clone)]
pub struct CollectOutputsInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: OutputStrategy,
    /// The prepared binding.
    pub binding: SessionOutputBinding,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of [`SessionOutputPort::finalize`].
#[derive(Debug, Clone)]
pub struct FinalizeOutputsInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The planned strategy.
    pub strategy: OutputStrategy,
    /// The prepared binding.
    pub binding: SessionOutputBinding,
    /// What collect returned.
    pub entries: Vec<SessionOutputEntryCandidate>,
    /// `<workId>:<generation>:outputs-finalize[-<id>]`.
    pub idempotency_key: String,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Session outputs. Call order: prepare → attach → (collect → finalize)* → release | abort.
#[async_trait]
pub trait SessionOutputPort: Send + Sync {
    /// Strategies this port implements.
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError>;

    /// Prepares an outputs binding before compute exists.
    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError>;

    /// Attaches the binding to acquired compute.
    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError>;

    /// Lists the files written so far.
    async fn collect(
        &self,
        input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError>;

    /// Stores the entries immutably and returns a manifest candidate.
    async fn finalize(
        &self,
        input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError>;

    /// Forgets the binding after a successful publication.
    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<(), PortError>;

    /// Discards unpublished outputs.
    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        reason: OutputAbortReason,
    ) -> Result<(), PortError>;
}
