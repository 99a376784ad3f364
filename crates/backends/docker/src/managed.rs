//! The `docker` managed-runtime provider: [`DockerSandboxPort`] behind the managed ports
//! (`omabox_sandbox::managed`).
//!
//! - `/workspace` is the workspace binding's `hostPath` bound into the container, and
//!   `/mnt/session/outputs` the outputs binding's `hostPath`: the session's checkpoint is
//!   restored there by the persistence ports before the container starts, and collected
//!   from there after.
//! - A runtime id is the sandbox id; its container is named `omabox-<runtime id>`, and the
//!   lease metadata carries the engine's container id and the host id.
//! - Attach works in the process that created the runtime (its agent connection is the
//!   attach stream, which dies with that process). Reap and status work from any process
//!   that reaches the same engine: they name the container, not the connection.
//!
//! Must never reap a container that is not the lease's (the name is derived from the
//! runtime id, which must be one of ours: `docker-` and hex).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use async_trait::async_trait;
use omabox_contract::{
    ManagedSandboxLease, Meta, MetaValue, PortError, SessionOutputPort, WorkspacePersistencePort,
};
use omabox_sandbox::managed::{
    AcquisitionContext, HarnessOutputSink, LiveRuntimes, ManagedSandboxProvider,
    ManagedSandboxProviderCapabilities, ProvidedSandbox, ProviderManagedRuntimeDriver,
    ProviderManagedRuntimeDriverOptions,
};
use omabox_sandbox::{SandboxPort, SandboxRuntimeStatus};

use omabox_sandbox_net::credential_egress::{CredentialEgress, CredentialEgressOptions};

use crate::config::DockerConfig;
use crate::engine::Engine;
use crate::port::{DockerSandboxPort, PROVIDER};

/// Lease metadata key: the engine's container id.
pub const CONTAINER_METADATA_KEY: &str = "container";
/// Lease metadata key: the host id (`omabox.host`).
pub const HOST_METADATA_KEY: &str = "host";

/// The runtimes this process created and still holds, by runtime id.
static LIVE: LazyLock<LiveRuntimes<DockerSandboxPort>> = LazyLock::new(LiveRuntimes::default);
static NEXT_RUNTIME: AtomicU64 = AtomicU64::new(1);

/// The `docker` [`ManagedSandboxProvider`].
#[derive(Debug, Clone)]
pub struct DockerManagedProvider {
    engine: Engine,
    config: DockerConfig,
}

impl DockerManagedProvider {
    /// A provider making containers of `engine` from `config` (its bindings are replaced by
    /// each acquisition's).
    pub fn new(engine: Engine, config: DockerConfig) -> Self {
        Self { engine, config }
    }

    /// The container name of `runtime_id`, if the id is one of ours.
    fn container_of(runtime_id: &str) -> Result<String, PortError> {
        let ours = runtime_id.strip_prefix("docker-").is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
        });
        if !ours {
            return Err(PortError::invalid_argument(format!(
                "{runtime_id:?} is not a docker runtime id"
            )));
        }
        Ok(format!("omabox-{runtime_id}"))
    }
}

#[async_trait]
impl ManagedSandboxProvider for DockerManagedProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> ManagedSandboxProviderCapabilities {
        ManagedSandboxProviderCapabilities {
            duplex_process: true,
            process_checkpoints: false,
        }
    }

    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError> {
        acquisition.signal.throw_if_aborted()?;
        // The directories belong to the persistence ports: made here so the engine never
        // creates (as root) a binding's host path itself.
        acquisition.create_binding_dirs()?;
        let runtime_id = format!(
            "docker-{:x}-{:x}",
            std::process::id(),
            NEXT_RUNTIME.fetch_add(1, Ordering::SeqCst)
        );
        let config = DockerConfig {
            workspace: Some(acquisition.workspace_host_path.clone()),
            outputs: acquisition.outputs_host_path.clone(),
            ..self.config.clone()
        };
        let port = Arc::new(DockerSandboxPort::start(&self.engine, &config, &runtime_id).await?);
        let mut metadata = Meta::new();
        metadata.insert(
            CONTAINER_METADATA_KEY.into(),
            MetaValue::String(port.container().to_owned()),
        );
        metadata.insert(
            HOST_METADATA_KEY.into(),
            MetaValue::String(config.host_id.clone()),
        );
        LIVE.insert(runtime_id.clone(), Arc::clone(&port));
        Ok(ProvidedSandbox {
            sandbox: port as Arc<dyn SandboxPort>,
            runtime_id,
            metadata,
        })
    }

    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError> {
        LIVE.attached("docker", &lease.runtime_id)
            .map(|port| port as Arc<dyn SandboxPort>)
    }

    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        let port = LIVE.remove(&lease.runtime_id);
        if let Some(port) = port {
            return Ok(port.terminate().await?);
        }
        let container = Self::container_of(&lease.runtime_id)?;
        Ok(self.engine.remove_container(&container).await?)
    }

    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError> {
        let port = LIVE.get(&lease.runtime_id);
        if let Some(port) = port {
            return Ok(if port.is_alive() {
                SandboxRuntimeStatus::Running
            } else {
                SandboxRuntimeStatus::Stopped
            });
        }
        let container = Self::container_of(&lease.runtime_id)?;
        Ok(match self.engine.container_running(&container).await? {
            Some(true) => SandboxRuntimeStatus::Running,
            Some(false) | None => SandboxRuntimeStatus::Stopped,
        })
    }
}

impl omabox_sandbox_net::credential_egress::LiveSandboxes for DockerManagedProvider {
    fn live_target(
        &self,
        id: &str,
    ) -> Option<Arc<dyn omabox_sandbox_net::credential_egress::CredentialTarget>> {
        LIVE.get(id)
            .map(|port| port as Arc<dyn omabox_sandbox_net::credential_egress::CredentialTarget>)
    }
}

/// Options of the `docker` provider driver.
#[derive(Clone)]
pub struct DockerManagedRuntimeOptions {
    /// The engine containers are made in.
    pub engine: Engine,
    /// Image, agent, host id, limits (bindings come from each acquisition).
    pub config: DockerConfig,
    /// `/workspace` persistence with host-directory (`hostPath`) bindings.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence with host-directory (`hostPath`) bindings.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Readiness probe timeout (default 10 s).
    pub readiness_timeout: Option<Duration>,
    /// Where harness output goes as it arrives.
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
    /// Credential egress: vault secrets injected for bound hosts (see
    /// [`omabox_sandbox_net::credential_egress`]; needs a network). `None`: `unsupported`.
    pub credential_egress: Option<CredentialEgressOptions>,
}

impl std::fmt::Debug for DockerManagedRuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerManagedRuntimeOptions")
            .field("engine", &self.engine.host())
            .field("config", &self.config)
            .field("readiness_timeout", &self.readiness_timeout)
            .finish_non_exhaustive()
    }
}

/// The `docker` driver as its concrete type.
pub async fn managed_runtime_provider_driver(
    options: DockerManagedRuntimeOptions,
) -> Result<ProviderManagedRuntimeDriver, PortError> {
    let provider = Arc::new(DockerManagedProvider::new(options.engine, options.config));
    let driver = ProviderManagedRuntimeDriver::new(ProviderManagedRuntimeDriverOptions {
        provider: Arc::clone(&provider) as _,
        workspace: options.workspace,
        outputs: options.outputs,
        readiness_timeout: options.readiness_timeout,
        harness_output: options.harness_output,
    })
    .await?;
    Ok(match options.credential_egress {
        None => driver,
        Some(egress) => {
            let port = egress.into_port(PROVIDER, provider);
            driver.with_credential_egress(Arc::new(port), CredentialEgress::capabilities_value())
        }
    })
}
