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
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

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

impl AcquisitionContext {
    /// Creates the binding directories (the workspace's, the outputs'): they belong to the
    /// persistence ports, and a backend must never have them made for it (by an engine or
    /// runsc, as root, or missing when bound).
    pub fn create_binding_dirs(&self) -> Result<(), PortError> {
        for dir in std::iter::once(&self.workspace_host_path).chain(self.outputs_host_path.iter()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                PortError::new(format!("creating the binding {}: {e}", dir.display()))
            })?;
        }
        Ok(())
    }
}

/// The runtimes a provider created in this process and still holds, by runtime id. Only
/// these can be attached: a runtime's agent connection belongs to the process that made it.
#[derive(Debug)]
pub struct LiveRuntimes<P>(Mutex<HashMap<String, Arc<P>>>);

impl<P> Default for LiveRuntimes<P> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<P> LiveRuntimes<P> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<P>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Holds `port` as runtime `id`.
    pub fn insert(&self, id: String, port: Arc<P>) {
        self.lock().insert(id, port);
    }

    /// The runtime `id`, when this process holds it.
    pub fn get(&self, id: &str) -> Option<Arc<P>> {
        self.lock().get(id).cloned()
    }

    /// Lets go of the runtime `id`, returning it when this process held it.
    pub fn remove(&self, id: &str) -> Option<Arc<P>> {
        self.lock().remove(id)
    }

    /// The runtime `id` for an attach, or the error saying it is another process's.
    pub fn attached(&self, backend: &str, id: &str) -> Result<Arc<P>, PortError> {
        self.get(id).ok_or_else(|| {
            PortError::new(format!(
                "{backend} runtime {id} is not attached in this process (its agent connection \
                 was another process's)"
            ))
        })
    }
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
    /// The provider captures a runtime's processes and memory and restores them into a new
    /// runtime ([`ManagedSandboxProvider::capture_processes`]): the managed ports then
    /// advertise and serve `process` runtime checkpoints.
    pub process_checkpoints: bool,
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

    /// Captures the processes and memory of the live runtime `lease` names into a
    /// checkpoint that outlives it and this process, kept for session `session_id` only
    /// ([`Self::restore_processes`] refuses another session's acquisition), and returns the
    /// checkpoint's id (an opaque name, never a path). The runtime stops; its lease is still
    /// terminated or reaped as usual. Only for providers whose capabilities say
    /// `process_checkpoints`.
    async fn capture_processes(
        &self,
        lease: &ManagedSandboxLease,
        session_id: &str,
    ) -> Result<String, PortError> {
        let _ = session_id;
        Err(PortError::capability(format!(
            "{} does not capture processes (runtime {})",
            self.name(),
            lease.runtime_id
        )))
    }

    /// A new *running* runtime whose processes go on from checkpoint `checkpoint_id`, with
    /// the acquisition's directories bound as `create` binds them (readiness is checked by
    /// the caller); refused unless the acquisition's session is the checkpoint's. The
    /// checkpoint is kept: [`Self::remove_processes`] removes it.
    async fn restore_processes(
        &self,
        checkpoint_id: &str,
        acquisition: AcquisitionContext,
    ) -> Result<ProvidedSandbox, PortError> {
        let _ = acquisition;
        Err(PortError::capability(format!(
            "{} does not restore processes (checkpoint {checkpoint_id:?})",
            self.name()
        )))
    }

    /// Removes checkpoint `checkpoint_id`. Idempotent: a checkpoint that is gone is removed.
    async fn remove_processes(&self, checkpoint_id: &str) -> Result<(), PortError> {
        Err(PortError::capability(format!(
            "{} keeps no process checkpoints ({checkpoint_id:?})",
            self.name()
        )))
    }
}
