//! `ManagedSandboxPort`: the compute lifecycle of one work item, and nothing else.
//!
//! ```text
//!   acquire ──► lease ──► heartbeat* ──► [suspend (retained_runtime only)]
//!                                  └──► terminate(reason)      (fence held; idempotent)
//!   reap(lease, reason)   the token-free, repeatable retry from an orphan record
//! ```

use crate::json::Meta;
use crate::{
    AbortSignal, CredentialEgressBinding, ManagedRuntimePlan, PortError, RuntimeResourceFence,
    RuntimeResourceScope, SandboxResourceCapabilities, SessionOutputBinding, TerminationReason,
    WorkspaceBinding,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Serializable identity of provider compute. JSON-safe: no handle, token or secret.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedSandboxLease {
    /// The provider that owns the runtime.
    pub provider: String,
    /// The provider's runtime id.
    pub runtime_id: String,
    /// Opaque, non-secret adapter state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

/// Outcome of a heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SandboxHeartbeatResult {
    /// The runtime is alive.
    Alive,
    /// The runtime died or was deleted.
    Lost,
}

/// Observed runtime state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxState {
    /// Running.
    Running,
    /// Suspended.
    Suspended,
    /// Stopped or gone.
    Stopped,
    /// Not known without a probe.
    Unknown,
}

/// `{state}` returned by inspect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxObservation {
    /// The state.
    pub state: SandboxState,
}

/// Input of [`ManagedSandboxPort::acquire`].
#[derive(Debug, Clone)]
pub struct AcquireSandboxInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held (never to be written into the lease or provider commands).
    pub fence: RuntimeResourceFence,
    /// The admitted plan.
    pub plan: ManagedRuntimePlan,
    /// The materialized workspace.
    pub workspace: WorkspaceBinding,
    /// The prepared outputs binding, or none.
    pub outputs: Option<SessionOutputBinding>,
    /// The transient egress binding, or none.
    pub credential_egress: Option<CredentialEgressBinding>,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// The compute lifecycle port. Every method is required.
#[async_trait]
pub trait ManagedSandboxPort: Send + Sync {
    /// Lifecycle capabilities for this scope.
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError>;

    /// Allocates compute and returns its lease only once it is ready. A provider that fails
    /// after allocating cleans up its own partial allocation before returning the error.
    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError>;

    /// `lost` once the runtime died or was deleted.
    async fn heartbeat(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError>;

    /// Suspends a retained runtime; may add metadata to the lease. Only for
    /// `suspendResume: "supported"`.
    async fn suspend(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError>;

    /// Destroys the runtime while the fence is held. Idempotent for every reason.
    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError>;

    /// Destroys the runtime from a serialized lease with no fence token. Safe to repeat, and
    /// works from a fresh process with no in-memory handle.
    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError>;

    /// Observes the runtime.
    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError>;
}
