//! Fencing and publication: who owns a work item now, and which resources are authoritative.
//!
//! ```text
//!   acquire ──► acquired{fence(generation g, token), publication?}   (new owner: g = g+1)
//!          └──► conflict{expiresAt}                                  (another owner holds it)
//!   renew(fence)   ──► renewed{fence} | lost
//!   publish(fence, candidates) ──► published{revision} | lost       (ONE atomic check+advance)
//!   release(fence, reason)                                           (never fails the caller)
//! ```

use crate::json::{Meta, Nullable};
use crate::{PortError, RuntimeCheckpointRef, RuntimeResourceScope, SecretString};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Proof of ownership of one work item for one generation.
///
/// The token is a secret: it must never be logged or persisted, and no lease, checkpoint or
/// orphan record has a field for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeResourceFence {
    /// The tenant workspace.
    pub workspace_id: String,
    /// The environment.
    pub environment_id: String,
    /// The session.
    pub session_id: String,
    /// The work item.
    pub work_id: String,
    /// Who holds the fence.
    pub owner_id: String,
    /// Monotonically increasing ownership generation of this work item.
    pub generation: u64,
    /// Opaque proof of ownership.
    pub token: SecretString,
    /// ISO-8601 expiry.
    pub expires_at: String,
}

impl RuntimeResourceFence {
    /// The work item this fence guards.
    pub fn scope(&self) -> RuntimeResourceScope {
        RuntimeResourceScope::new(
            &self.workspace_id,
            &self.environment_id,
            &self.session_id,
            &self.work_id,
        )
    }

    /// True when both fences are the same claim: scope, owner, generation and token.
    pub fn same_claim(&self, other: &RuntimeResourceFence) -> bool {
        self.scope() == other.scope()
            && self.owner_id == other.owner_id
            && self.generation == other.generation
            && self.token == other.token
    }
}

/// An immutable resource version, inactive until published.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimePublicationCandidate {
    /// Candidate id.
    pub id: String,
    /// Content hash (`sha256:<hex>` for omabox's own stores).
    pub content_hash: String,
    /// Opaque, non-secret adapter metadata.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

impl RuntimePublicationCandidate {
    /// Same candidate for publication purposes: id and content hash.
    pub fn same_content(&self, other: &RuntimePublicationCandidate) -> bool {
        self.id == other.id && self.content_hash == other.content_hash
    }
}

/// The authoritative "active pointer" of a work item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeResourcePublication {
    /// Generation that published it.
    pub generation: u64,
    /// Publication revision (1, 2, …).
    pub revision: u64,
    /// The published workspace.
    pub workspace_candidate: RuntimePublicationCandidate,
    /// The published outputs manifest, or null.
    pub output_candidate: Option<RuntimePublicationCandidate>,
    /// The published runtime checkpoint: absent, null, or a ref.
    #[serde(default, skip_serializing_if = "Nullable::is_absent")]
    pub runtime_checkpoint: Nullable<RuntimeCheckpointRef>,
}

/// Input of [`RuntimeResourceFencePort::acquire`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcquireRuntimeFenceInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// Who asks.
    pub owner_id: String,
    /// Lease time to live in milliseconds.
    pub ttl_ms: u64,
}

/// Outcome of [`RuntimeResourceFencePort::acquire`].
// The acquired variant is the common one and is moved once; boxing it would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AcquireRuntimeFenceResult {
    /// The caller owns the work item.
    Acquired {
        /// The fence to present on every later call.
        fence: RuntimeResourceFence,
        /// The last publication, possibly from an earlier generation.
        publication: Option<RuntimeResourcePublication>,
    },
    /// Another owner holds an unexpired fence.
    Conflict {
        /// When the other owner's fence expires.
        #[serde(rename = "expiresAt")]
        expires_at: Option<String>,
    },
}

/// Outcome of [`RuntimeResourceFencePort::renew`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RenewRuntimeFenceResult {
    /// The fence was extended.
    Renewed {
        /// The renewed fence (new `expiresAt`).
        fence: RuntimeResourceFence,
    },
    /// The fence is no longer current.
    Lost,
}

/// Outcome of [`RuntimeResourceFencePort::publish`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PublishRuntimeResourcesResult {
    /// The active pointer now names the candidates.
    Published {
        /// The publication revision.
        revision: u64,
    },
    /// The fence is no longer current; nothing changed.
    Lost,
}

/// Input of [`RuntimeResourceFencePort::publish`].
#[derive(Debug, Clone, PartialEq)]
pub struct PublishRuntimeResourcesInput {
    /// The fence the caller holds.
    pub fence: RuntimeResourceFence,
    /// The workspace candidate to activate.
    pub workspace_candidate: RuntimePublicationCandidate,
    /// The outputs manifest to activate, or none.
    pub output_candidate: Option<RuntimePublicationCandidate>,
    /// The runtime checkpoint: absent (key omitted), null, or a ref.
    pub runtime_checkpoint: Nullable<RuntimeCheckpointRef>,
}

/// Why a fence, sandbox, egress binding or orphan is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminationReason {
    /// The work item finished and published.
    Completed,
    /// A step failed.
    Failed,
    /// Ownership was lost (fence lost, sandbox lost, cancelled, publish rejected).
    LeaseLost,
}

impl TerminationReason {
    /// The wire literal.
    pub fn as_str(self) -> &'static str {
        match self {
            TerminationReason::Completed => "completed",
            TerminationReason::Failed => "failed",
            TerminationReason::LeaseLost => "lease_lost",
        }
    }
}

impl std::fmt::Display for TerminationReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The authoritative control plane for work-item ownership.
///
/// Call order: `acquire` → (`renew` | `isCurrent`)* → `publish`* → `release`.
#[async_trait]
pub trait RuntimeResourceFencePort: Send + Sync {
    /// Claims the work item: a new generation for a new owner, the same fence again for the
    /// same owner while it is unexpired, `conflict` while another owner holds it.
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError>;

    /// Read-only ownership check, used right before external mutations that cannot be part of
    /// the publish transaction.
    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError>;

    /// Extends the fence by `ttl_ms` from now, or reports it lost.
    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError>;

    /// Validates generation and token and advances the active pointer in ONE atomic
    /// operation. An identical republish by the same generation returns the same revision.
    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError>;

    /// Clears the active fence if it is still this one. Never fails for a stale fence.
    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError>;
}
