//! Orphans: persisted cleanup work for compute whose terminate failed. Never holds a token.

use crate::{ManagedSandboxLease, PortError, RuntimeResourceScope, TerminationReason};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One queued reap.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeOrphanRecord {
    /// [`runtime_orphan_id`] of the record.
    pub id: String,
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// Generation that allocated the compute.
    pub generation: u64,
    /// Owner that allocated it.
    pub owner_id: String,
    /// The lease to reap.
    pub sandbox: ManagedSandboxLease,
    /// Termination reason to reap with.
    pub reason: TerminationReason,
    /// Failed reap attempts so far.
    pub attempts: u64,
    /// The last (redacted) error.
    pub last_error: String,
}

/// Input of [`RuntimeOrphanPort::enqueue`].
#[derive(Debug, Clone, PartialEq)]
pub struct EnqueueRuntimeOrphanInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// Generation.
    pub generation: u64,
    /// Owner.
    pub owner_id: String,
    /// The lease.
    pub sandbox: ManagedSandboxLease,
    /// Reason.
    pub reason: TerminationReason,
    /// The terminate failure, already redacted.
    pub error: PortError,
}

/// The durable queue of reaps.
#[async_trait]
pub trait RuntimeOrphanPort: Send + Sync {
    /// Upserts by id, keeping the attempt count of an existing record.
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError>;
    /// Up to `limit` records, ordered by id.
    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError>;
    /// Counts a failed reap and records its error. Unknown id: no-op.
    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError>;
    /// Removes a reaped record.
    async fn resolve(&self, id: &str) -> Result<(), PortError>;
}

/// JSON array text of `[workspaceId, environmentId, sessionId, workId, generation,
/// provider, runtimeId]`, e.g. `["w","e","s","k",1,"p","r"]`.
pub fn runtime_orphan_id(
    scope: &RuntimeResourceScope,
    generation: u64,
    sandbox: &ManagedSandboxLease,
) -> String {
    serde_json::json!([
        scope.workspace_id,
        scope.environment_id,
        scope.session_id,
        scope.work_id,
        generation,
        sandbox.provider,
        sandbox.runtime_id
    ])
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orphan_id_is_compact_json_array_text() {
        let scope = RuntimeResourceScope::new("w", "e", "s", "k");
        let lease = ManagedSandboxLease {
            provider: "p".into(),
            runtime_id: "r".into(),
            metadata: None,
        };
        assert_eq!(
            runtime_orphan_id(&scope, 1, &lease),
            r#"["w","e","s","k",1,"p","r"]"#
        );
    }
}
