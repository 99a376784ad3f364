//! The backend side of the managed composition: [`ManagedSandboxProvider`].
//!
//! A provider creates tool sandboxes for the managed ports and can find, observe and destroy
//! them again from a serialized lease alone. It never sees the fence: the acquisition context
//! carries the generation (for naming and logs) but no token, so a provider cannot leak what
//! it was never given.

use crate::port::SandboxPort;
use crate::runtime::SandboxRuntimeStatus;
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, ManagedRuntimePlan, ManagedSandboxLease, Meta, PortError, RuntimeResourceScope,
    SessionOutputBinding, WorkspaceBinding,
};
use std::path::PathBuf;
use std::sync::Arc;

/// The metadata key of a binding that names the host directory to bind-mount.
pub const HOST_PATH_METADATA_KEY: &str = "hostPath";

/// What a provider gets to create one runtime. No fence token: only what it needs.
#[derive(Debug, Clone)]
pub struct AcquisitionContext {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence generation that acquires (not a secret; for names and logs).
    pub generation: u64,
    /// The admitted plan (the harness declaration included).
    pub plan: ManagedRuntimePlan,
    /// The materialized workspace binding.
    pub workspace: WorkspaceBinding,
    /// The prepared outputs binding, when outputs are enabled.
    pub outputs: Option<SessionOutputBinding>,
    /// The host directory to bind at `/workspace` (the workspace binding's `hostPath`).
    pub workspace_host_path: PathBuf,
    /// The host directory to bind at `/mnt/session/outputs` (the outputs binding's
    /// `hostPath`), when outputs are enabled.
    pub outputs_host_path: Option<PathBuf>,
    /// Cancellation of the acquire.
    pub signal: AbortSignal,
}

/// A runtime the provider created: the live tool sandbox and its serializable identity.
#[derive(Clone)]
pub struct ProvidedSandbox {
    /// The live tool sandbox (stays in this process).
    pub sandbox: Arc<dyn SandboxPort>,
    /// The provider's runtime id (non-empty).
    pub runtime_id: String,
    /// JSON-safe, non-secret data the provider needs to find the runtime again from another
    /// process (e.g. a serialized sandbox identity). Becomes the lease metadata.
    pub metadata: Meta,
}

impl std::fmt::Debug for ProvidedSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProvidedSandbox")
            .field("runtime_id", &self.runtime_id)
            .field("metadata", &self.metadata)
            .finish_non_exhaustive()
    }
}

/// What a provider's sandboxes can do, as data, known before any sandbox exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManagedSandboxProviderCapabilities {
    /// Every sandbox implements [`crate::SandboxDuplexProcessPort`] (needed by both harness
    /// lanes).
    pub duplex_process: bool,
}

/// A backend of [`super::ProviderManagedRuntime`].
///
/// Contract of each method:
/// - `create` returns a *running* sandbox with `/workspace` and (when given)
///   `/mnt/session/outputs` bound to the context's host directories; readiness is checked by
///   the caller afterwards. A provider that fails half way cleans up its own partial state.
/// - `attach`, `reap` and `status` work from the lease alone (no in-memory handle needed);
///   the caller has already checked `lease.provider == name()`.
/// - `reap` is idempotent: reaping a runtime that is gone (or never existed) succeeds.
#[async_trait]
pub trait ManagedSandboxProvider: Send + Sync {
    /// The provider id written into every lease.
    fn name(&self) -> &str;

    /// Static facts about this provider's sandboxes.
    fn capabilities(&self) -> ManagedSandboxProviderCapabilities;

    /// Creates one runtime.
    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError>;

    /// Reconnects to a live runtime of this process from its lease, or fails clearly when
    /// this process cannot reach it.
    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError>;

    /// Destroys the runtime named by the lease. Idempotent; works from a fresh process.
    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError>;

    /// Observes the runtime without waking it.
    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError>;

    /// For a runtime found already stopped: the last moment (ms since the epoch) it is known
    /// to have been alive, if the provider can tell (e.g. its host's last heartbeat). The
    /// usage ledger bills a crashed runtime up to there. Default: it cannot tell.
    async fn last_alive_ms(&self, _lease: &ManagedSandboxLease) -> Option<u64> {
        None
    }
}
