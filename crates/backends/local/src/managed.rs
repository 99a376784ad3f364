//! The `local` managed-runtime provider driver: [`LocalSubprocessSandbox`] behind the managed
//! ports (test mode only, **no isolation**).
//!
//! - `/workspace` is the workspace binding's `hostPath` used as the workdir, and
//!   `/mnt/session/outputs` the outputs binding's `hostPath` (commands see these host paths
//!   directly: cwd/`PWD` is the workspace, `OMA_OUTPUTS_DIR` the outputs directory).
//! - A runtime is an in-process object: runtime ids are `local-<hostPid>-<n>`, the lease
//!   metadata is `{"hostPid": <pid>}`, and live runtimes are kept in a process-wide table, so
//!   a fresh driver instance in the same process can observe and reap them.
//! - **Limitation (documented, not hidden):** a lease from another process cannot be reached.
//!   `reap` of such a lease succeeds without touching anything (its subprocesses belonged to
//!   that host process; they are killed when it drops them, not when it is `kill -9`ed), and
//!   `status` answers `unknown`. The linux backend reaps across processes; this one is for
//!   tests.

use crate::error::LocalSandboxError;
use crate::sandbox::{DEFAULT_EXEC_TIMEOUT_MS, LocalSubprocessOptions, LocalSubprocessSandbox};
use async_trait::async_trait;
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, ManagedSandboxLease, Meta, PortError, SessionOutputPort,
    WorkspacePersistencePort,
};
use omabox_sandbox::managed::{
    AcquisitionContext, HarnessOutputSink, ManagedSandboxProvider,
    ManagedSandboxProviderCapabilities, ProvidedSandbox, ProviderManagedRuntimeDriver,
    ProviderManagedRuntimeDriverOptions,
};
use omabox_sandbox::{
    SandboxDestroyPort, SandboxFactoryEnv, SandboxPort, SandboxRuntimeStatus, is_test_mode,
};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The provider id of this backend in leases, descriptors and the catalog.
pub const LOCAL_PROVIDER: &str = "local";
/// Lease metadata key: the pid of the host process that owns the runtime.
pub const HOST_PID_METADATA_KEY: &str = "hostPid";

type LiveTable = HashMap<String, Arc<LocalSubprocessSandbox>>;

/// Live local runtimes of this process, by runtime id.
static LIVE: LazyLock<Mutex<LiveTable>> = LazyLock::new(|| Mutex::new(HashMap::new()));
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

fn live() -> MutexGuard<'static, LiveTable> {
    LIVE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The `local` [`ManagedSandboxProvider`].
#[derive(Debug, Clone)]
pub struct LocalManagedProvider {
    default_timeout_ms: u64,
}

impl LocalManagedProvider {
    /// A provider, or the test-mode error outside test mode (`OMABOX_TEST_MODE=1` or
    /// `NODE_ENV=test` in `env`).
    pub fn new(env: &SandboxFactoryEnv) -> Result<Self, PortError> {
        if !is_test_mode(env) {
            return Err(LocalSandboxError::NotTestMode.into());
        }
        Ok(Self {
            default_timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
        })
    }

    /// Ids of the local runtimes alive in this process (for leak checks).
    pub fn live_runtime_ids() -> Vec<String> {
        let mut ids: Vec<String> = live().keys().cloned().collect();
        ids.sort();
        ids
    }

    fn owned_by_this_process(lease: &ManagedSandboxLease) -> bool {
        let pid = lease
            .metadata
            .as_ref()
            .and_then(|meta| meta.get(HOST_PID_METADATA_KEY))
            .and_then(|value| match value {
                omabox_contract::MetaValue::Number(number) => number.as_u64(),
                _ => None,
            });
        pid == Some(u64::from(std::process::id()))
    }
}

#[async_trait]
impl ManagedSandboxProvider for LocalManagedProvider {
    fn name(&self) -> &str {
        LOCAL_PROVIDER
    }

    fn capabilities(&self) -> ManagedSandboxProviderCapabilities {
        ManagedSandboxProviderCapabilities {
            duplex_process: true,
            process_checkpoints: false,
        }
    }

    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError> {
        acquisition.signal.throw_if_aborted()?;
        let workdir: PathBuf = acquisition.workspace_host_path.clone();
        let outputs_root = acquisition.outputs_host_path.clone();
        let default_timeout_ms = self.default_timeout_ms;
        let sandbox = tokio::task::spawn_blocking(move || {
            // The directories belong to the persistence ports: create them first so the
            // sandbox never owns (and never removes) them.
            for dir in std::iter::once(&workdir).chain(outputs_root.iter()) {
                std::fs::create_dir_all(dir).map_err(|source| LocalSandboxError::Setup {
                    path: dir.clone(),
                    source,
                })?;
            }
            LocalSubprocessSandbox::new(LocalSubprocessOptions {
                workdir,
                outputs_root,
                default_timeout_ms,
            })
        })
        .await
        .map_err(|error| PortError::new(format!("local sandbox setup task failed: {error}")))??;
        let sandbox = Arc::new(sandbox);
        let pid = std::process::id();
        let runtime_id = format!(
            "local-{pid}-{}",
            NEXT_RUNTIME.fetch_add(1, Ordering::SeqCst)
        );
        let mut metadata = Meta::new();
        metadata.insert(HOST_PID_METADATA_KEY.into(), u64::from(pid).into());
        live().insert(runtime_id.clone(), Arc::clone(&sandbox));
        Ok(ProvidedSandbox {
            sandbox: sandbox as Arc<dyn SandboxPort>,
            runtime_id,
            metadata,
        })
    }

    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError> {
        live()
            .get(&lease.runtime_id)
            .map(|sandbox| Arc::clone(sandbox) as Arc<dyn SandboxPort>)
            .ok_or_else(|| {
                PortError::new(format!(
                    "local runtime {} is not alive in this process",
                    lease.runtime_id
                ))
            })
    }

    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        let sandbox = live().remove(&lease.runtime_id);
        match sandbox {
            Some(sandbox) => sandbox.destroy().await,
            None => {
                if !Self::owned_by_this_process(lease) {
                    tracing::warn!(
                        runtime = %lease.runtime_id,
                        "local runtime of another process cannot be reached; nothing to reap here"
                    );
                }
                Ok(())
            }
        }
    }

    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError> {
        let alive = live()
            .get(&lease.runtime_id)
            .map(|sandbox| sandbox.groups.check_open().is_ok());
        Ok(match alive {
            Some(true) => SandboxRuntimeStatus::Running,
            Some(false) => SandboxRuntimeStatus::Stopped,
            None if Self::owned_by_this_process(lease) => SandboxRuntimeStatus::Stopped,
            None => SandboxRuntimeStatus::Unknown,
        })
    }
}

/// Options of the `local` provider driver.
#[derive(Clone)]
pub struct LocalManagedRuntimeOptions {
    /// The read-only env (test mode is required).
    pub env: SandboxFactoryEnv,
    /// `/workspace` persistence with host-directory (`hostPath`) bindings.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence with host-directory (`hostPath`) bindings.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Readiness probe timeout (default 10 s).
    pub readiness_timeout: Option<Duration>,
    /// Where harness output goes as it arrives.
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
}

impl std::fmt::Debug for LocalManagedRuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalManagedRuntimeOptions")
            .field("env", &self.env)
            .field("readiness_timeout", &self.readiness_timeout)
            .finish_non_exhaustive()
    }
}

/// The `local` driver as its concrete type (access to the live tool sandboxes).
pub async fn managed_runtime_provider_driver(
    options: LocalManagedRuntimeOptions,
) -> Result<ProviderManagedRuntimeDriver, PortError> {
    let provider = Arc::new(LocalManagedProvider::new(&options.env)?);
    ProviderManagedRuntimeDriver::new(ProviderManagedRuntimeDriverOptions {
        provider,
        workspace: options.workspace,
        outputs: options.outputs,
        readiness_timeout: options.readiness_timeout,
        harness_output: options.harness_output,
    })
    .await
}

/// `createManagedRuntimeProviderDriver` of the `local` backend.
pub async fn create_managed_runtime_provider_driver(
    options: LocalManagedRuntimeOptions,
) -> Result<Arc<dyn ManagedRuntimeProviderDriverPort>, PortError> {
    Ok(Arc::new(managed_runtime_provider_driver(options).await?))
}
