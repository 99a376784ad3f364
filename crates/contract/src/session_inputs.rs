//! Session inputs: files, repositories and memory stores a session brings into the sandbox.

use crate::{
    AbortSignal, ManagedSandboxLease, PortError, RuntimePublicationCandidate, RuntimeResourceFence,
    RuntimeResourceScope, WorkspaceBinding,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One resource of a session: an opaque object with a mandatory `type`.
///
/// Seen types: `file` {file_id, mount_path}, `github_repository` {url, mount_path,
/// checkout?}, `memory_store` {memory_store_id, mount_path, access}.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeSessionResourceSnapshot {
    /// The resource type.
    #[serde(rename = "type")]
    pub resource_type: String,
    /// Every other field, preserved exactly.
    #[serde(flatten)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

impl RuntimeSessionResourceSnapshot {
    /// A resource of `resource_type` with the given fields.
    pub fn new(
        resource_type: impl Into<String>,
        fields: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        Self {
            resource_type: resource_type.into(),
            fields,
        }
    }

    /// A string field.
    pub fn str_field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(serde_json::Value::as_str)
    }
}

/// The session a work item runs for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSessionSnapshot {
    /// Session id.
    pub id: String,
    /// Environment id.
    pub environment_id: String,
    /// Application-owned metadata, preserved exactly.
    pub metadata: BTreeMap<String, String>,
    /// Resources.
    pub resources: Vec<RuntimeSessionResourceSnapshot>,
}

/// A memory document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionMemoryDocument {
    /// Document id.
    pub id: String,
    /// Path inside the store.
    pub path: String,
    /// SHA-256 of the content.
    pub content_sha256: String,
    /// Content (full projection only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// Outcome of a memory mutation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionMemoryMutationResult {
    /// Applied.
    Applied {
        /// The document after the mutation.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        memory: Option<SessionMemoryDocument>,
    },
    /// The expected hash did not match.
    Conflict,
    /// No such document.
    NotFound,
}

/// How much of each memory document `list` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryListProjection {
    /// Ids, paths and hashes.
    Basic,
    /// With content.
    Full,
}

/// Memory-store access through the control plane.
#[async_trait]
pub trait SessionMemoryAccessPort: Send + Sync {
    /// Lists documents.
    async fn list(
        &self,
        memory_store_id: &str,
        projection: MemoryListProjection,
        signal: AbortSignal,
    ) -> Result<Vec<SessionMemoryDocument>, PortError>;
    /// Creates a document.
    async fn create(
        &self,
        memory_store_id: &str,
        path: &str,
        content: &str,
        signal: AbortSignal,
    ) -> Result<SessionMemoryMutationResult, PortError>;
    /// Updates a document if its hash still matches.
    async fn update(
        &self,
        memory_store_id: &str,
        memory_id: &str,
        path: &str,
        content: &str,
        expected_content_sha256: &str,
        signal: AbortSignal,
    ) -> Result<SessionMemoryMutationResult, PortError>;
    /// Deletes a document if its hash still matches.
    async fn delete(
        &self,
        memory_store_id: &str,
        memory_id: &str,
        expected_content_sha256: &str,
        signal: AbortSignal,
    ) -> Result<SessionMemoryMutationResult, PortError>;
}

/// A downloaded session file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DownloadedSessionFile {
    /// Bytes.
    pub content: Vec<u8>,
    /// File name, when known.
    pub filename: Option<String>,
    /// Media type, when known.
    pub mime_type: Option<String>,
}

/// Per-claim access to session content (wraps the work's sessions token; never persisted).
#[async_trait]
pub trait SessionInputAccessPort: Send + Sync {
    /// Downloads a file resource.
    async fn download_file(
        &self,
        file_id: &str,
        signal: AbortSignal,
    ) -> Result<DownloadedSessionFile, PortError>;

    /// Memory access, when the token covers attached stores.
    fn memories(&self) -> Option<Arc<dyn SessionMemoryAccessPort>> {
        None
    }
}

/// Who owns memory-store synchronization.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemoryStoreOwnership {
    /// The AMA worker syncs its own memory stores.
    Worker,
    /// The host's materializer does.
    Materializer,
}

/// `{memoryStore: ownership}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceOwnership {
    /// Memory-store ownership.
    pub memory_store: MemoryStoreOwnership,
}

/// Re-validates the fence right before a canonical mutation.
pub type AuthorizeCallback =
    Arc<dyn Fn() -> BoxFuture<'static, Result<bool, PortError>> + Send + Sync>;

/// What both materializer calls receive.
#[derive(Clone)]
pub struct SessionInputLifecycleContext {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// The session.
    pub session: RuntimeSessionSnapshot,
    /// The sandbox.
    pub sandbox: ManagedSandboxLease,
    /// Memory ownership.
    pub resource_ownership: ResourceOwnership,
    /// Per-claim content access; `None` when the caller supplied none.
    pub access: Option<Arc<dyn SessionInputAccessPort>>,
    /// Fence check before every canonical mutation.
    pub authorize: AuthorizeCallback,
    /// Cancellation.
    pub signal: AbortSignal,
}

impl std::fmt::Debug for SessionInputLifecycleContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionInputLifecycleContext")
            .field("scope", &self.scope)
            .field("session", &self.session)
            .field("sandbox", &self.sandbox)
            .field("resource_ownership", &self.resource_ownership)
            .field("access", &self.access.is_some())
            .finish_non_exhaustive()
    }
}

/// Input of [`SessionInputMaterializerPort::materialize`].
#[derive(Debug, Clone)]
pub struct MaterializeSessionInputsInput {
    /// Shared context.
    pub context: SessionInputLifecycleContext,
    /// The workspace binding.
    pub workspace: WorkspaceBinding,
    /// The last published workspace candidate.
    pub active_workspace_checkpoint: Option<RuntimePublicationCandidate>,
    /// `<workId>:<generation>:session-inputs-materialize`.
    pub idempotency_key: String,
}

/// Brings session resources into the sandbox, and keeps materializer-owned ones in sync.
#[async_trait]
pub trait SessionInputMaterializerPort: Send + Sync {
    /// Stages resources after attach and before the harness.
    async fn materialize(&self, input: MaterializeSessionInputsInput) -> Result<(), PortError>;

    /// Synchronizes materializer-owned resources back; worker-owned ones are a no-op.
    async fn synchronize(
        &self,
        context: SessionInputLifecycleContext,
        idempotency_key: String,
    ) -> Result<(), PortError>;
}
