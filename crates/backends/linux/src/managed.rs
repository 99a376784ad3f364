//! The `linux` managed-runtime provider driver: [`LinuxSandboxPort`] behind the managed
//! ports (`omabox_sandbox::managed`).
//!
//! - `create` maps the acquisition into a [`SandboxFactoryContext`]: the workspace
//!   binding's `hostPath` is the writable bind at `/workspace`, the outputs binding's
//!   `hostPath` the bind at `/mnt/session/outputs`; everything else (image, limits, runtime
//!   dir, init binary) comes from the provider's typed, prepared
//!   [`LinuxSandboxConfig`]: an acquire never pulls, resolves a tag or builds a layer
//!   (the caller prepared them before any fence: [`LinuxSandboxFactory::prepare_image`],
//!   [`LinuxSandboxFactory::prepare_env_layer`]).
//! - The lease is `{provider: "linux", runtimeId: <sandbox id>, metadata: {
//!   "omabox.linux.identity.v1": <SandboxIdentity JSON>, "omabox.linux.image.v1":
//!   {reference, digest}}}`: the pid, start time, boot id, cgroup paths and state dir,
//!   and the image with the digest it was pinned to when prepared; nothing secret. `reap` and `status` work from that alone,
//!   so a fresh process can reap a sandbox whose host died.
//! - `attach` reaches only sandboxes this provider instance started (the agent connection
//!   belongs to the process that created the sandbox).
//!
//! Never: put a handle, token or env value into the lease; destroy a sandbox whose
//! identity does not match the lease's runtime id.

use crate::factory::{LinuxSandboxConfig, LinuxSandboxFactory};
use crate::port::LinuxSandboxPort;
use async_trait::async_trait;
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, ManagedSandboxLease, Meta, MetaValue, PortError,
    SessionOutputPort, WorkspacePersistencePort,
};
use omabox_linux_sandbox::SandboxIdentity;
use omabox_sandbox::managed::{
    AcquisitionContext, HarnessOutputSink, ManagedSandboxProvider,
    ManagedSandboxProviderCapabilities, ProvidedSandbox, ProviderManagedRuntimeDriver,
    ProviderManagedRuntimeDriverOptions,
};
use omabox_sandbox::{SandboxFactoryContext, SandboxPort, SandboxRuntimeStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// The provider id of this backend in leases, descriptors and the catalog (the port's
/// [`PROVIDER`](crate::port::PROVIDER)).
pub const LINUX_PROVIDER: &str = crate::port::PROVIDER;
/// Lease metadata key holding the serialized [`SandboxIdentity`].
pub const IDENTITY_METADATA_KEY: &str = "omabox.linux.identity.v1";
/// Lease metadata key holding the image the sandbox was made from
/// ([`crate::factory::LeaseImage`] JSON: reference and resolved digest; absent for the
/// preinstalled root and a directory image has no digest).
pub const IMAGE_METADATA_KEY: &str = "omabox.linux.image.v1";
/// How long a reap waits for a killed sandbox to go away.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `linux` [`ManagedSandboxProvider`].
#[derive(Debug)]
pub struct LinuxManagedProvider {
    factory: LinuxSandboxFactory,
    config: LinuxSandboxConfig,
    live: Mutex<HashMap<String, Arc<LinuxSandboxPort>>>,
}

impl LinuxManagedProvider {
    /// A provider creating sandboxes with `factory` as `config` says (prepared: its
    /// image and layer, if any, are kept by the provider, the image held from removal,
    /// for as long as it lives). A provider that only reaps and reports needs
    /// [`LinuxSandboxConfig::default`].
    pub fn new(factory: LinuxSandboxFactory, config: LinuxSandboxConfig) -> Self {
        Self {
            factory,
            config,
            live: Mutex::new(HashMap::new()),
        }
    }

    /// The live tool sandbox of runtime `id`, when this process created it.
    pub fn live_port(&self, id: &str) -> Option<Arc<LinuxSandboxPort>> {
        self.live().get(id).cloned()
    }

    fn live(&self) -> MutexGuard<'_, HashMap<String, Arc<LinuxSandboxPort>>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sandbox identity a lease carries; it must name the lease's runtime.
    pub fn identity_of(lease: &ManagedSandboxLease) -> Result<SandboxIdentity, PortError> {
        let text = lease
            .metadata
            .as_ref()
            .and_then(|meta| meta.get(IDENTITY_METADATA_KEY))
            .and_then(MetaValue::as_str)
            .ok_or_else(|| {
                PortError::new(format!(
                    "linux lease {} has no sandbox identity ({IDENTITY_METADATA_KEY})",
                    lease.runtime_id
                ))
            })?;
        let identity: SandboxIdentity = serde_json::from_str(text).map_err(|error| {
            PortError::new(format!(
                "linux lease {} has an invalid sandbox identity: {error}",
                lease.runtime_id
            ))
        })?;
        if identity.id != lease.runtime_id {
            return Err(PortError::new(format!(
                "linux lease {} carries the identity of sandbox {}",
                lease.runtime_id, identity.id
            )));
        }
        Ok(identity)
    }
}

impl crate::credential_egress::LiveSandboxes for LinuxManagedProvider {
    fn live_target(&self, id: &str) -> Option<Arc<dyn crate::credential_egress::CredentialTarget>> {
        self.live()
            .get(id)
            .cloned()
            .map(|port| port as Arc<dyn crate::credential_egress::CredentialTarget>)
    }
}

#[async_trait]
impl ManagedSandboxProvider for LinuxManagedProvider {
    fn name(&self) -> &str {
        LINUX_PROVIDER
    }

    fn capabilities(&self) -> ManagedSandboxProviderCapabilities {
        ManagedSandboxProviderCapabilities {
            duplex_process: true,
            process_checkpoints: false,
        }
    }

    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError> {
        acquisition.signal.throw_if_aborted()?;
        let ctx = SandboxFactoryContext {
            session_id: acquisition.scope.session_id.clone(),
            workdir: acquisition.workspace_host_path.clone(),
            memory_root: None,
            outputs_root: acquisition.outputs_host_path.clone(),
        };
        let port = self
            .factory
            .create_port_with_config(&ctx, &self.config)
            .await?;
        let image = self.config.lease_image();
        let port = Arc::new(port);
        let identity = serde_json::to_string(port.identity()).map_err(|error| {
            PortError::new(format!("cannot serialize the sandbox identity: {error}"))
        });
        let identity = match identity {
            Ok(identity) => identity,
            Err(error) => {
                let _ = port.terminate().await;
                return Err(error);
            }
        };
        let runtime_id = port.id().to_owned();
        let mut metadata = Meta::new();
        metadata.insert(IDENTITY_METADATA_KEY.into(), MetaValue::String(identity));
        if let Some(image) = image.and_then(|i| serde_json::to_string(&i).ok()) {
            metadata.insert(IMAGE_METADATA_KEY.into(), MetaValue::String(image));
        }
        self.live().insert(runtime_id.clone(), Arc::clone(&port));
        Ok(ProvidedSandbox {
            sandbox: port as Arc<dyn SandboxPort>,
            runtime_id,
            metadata,
        })
    }

    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError> {
        self.live()
            .get(&lease.runtime_id)
            .map(|port| Arc::clone(port) as Arc<dyn SandboxPort>)
            .ok_or_else(|| {
                PortError::new(format!(
                    "linux sandbox {} is not attached to this process (its agent connection \
                     belongs to the process that created it)",
                    lease.runtime_id
                ))
            })
    }

    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        let identity = Self::identity_of(lease)?;
        let live = self.live().remove(&lease.runtime_id);
        if let Some(port) = live {
            port.terminate().await?;
        }
        tokio::task::spawn_blocking(move || identity.destroy(REAP_TIMEOUT))
            .await
            .map_err(|error| PortError::new(format!("linux reap task failed: {error}")))?
            .map_err(|error| {
                PortError::new(format!(
                    "linux sandbox {} reap failed: {error}",
                    lease.runtime_id
                ))
            })?;
        Ok(())
    }

    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError> {
        let live = self.live().get(&lease.runtime_id).cloned();
        if let Some(port) = live {
            return Ok(if port.is_alive() {
                SandboxRuntimeStatus::Running
            } else {
                SandboxRuntimeStatus::Stopped
            });
        }
        let identity = Self::identity_of(lease)?;
        Ok(if identity.is_alive() {
            SandboxRuntimeStatus::Running
        } else {
            SandboxRuntimeStatus::Stopped
        })
    }

    async fn last_alive_ms(&self, lease: &ManagedSandboxLease) -> Option<u64> {
        let identity = Self::identity_of(lease).ok()?;
        omabox_linux_sandbox::leftovers::last_alive_ms(&identity.state_dir)
    }
}

/// Options of the `linux` provider driver.
#[derive(Clone)]
pub struct LinuxManagedRuntimeOptions {
    /// Creates the sandboxes.
    pub factory: LinuxSandboxFactory,
    /// What every sandbox is made from (prepared: image and layer).
    pub config: LinuxSandboxConfig,
    /// `/workspace` persistence with host-directory (`hostPath`) bindings.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence with host-directory (`hostPath`) bindings.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Readiness probe timeout (default 10 s).
    pub readiness_timeout: Option<Duration>,
    /// Where harness output goes as it arrives.
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
    /// Credential egress: vault secrets injected for bound hosts (see
    /// [`crate::credential_egress`]). `None`: credential egress is `unsupported`.
    pub credential_egress: Option<CredentialEgressOptions>,
}

/// What the credential egress port of the driver injects, from where.
pub use omabox_sandbox_net::credential_egress::CredentialEgressOptions;

impl std::fmt::Debug for LinuxManagedRuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LinuxManagedRuntimeOptions")
            .field("factory", &self.factory)
            .field("config", &self.config)
            .field("readiness_timeout", &self.readiness_timeout)
            .finish_non_exhaustive()
    }
}

/// The `linux` driver as its concrete type (access to the live tool sandboxes).
pub async fn managed_runtime_provider_driver(
    options: LinuxManagedRuntimeOptions,
) -> Result<ProviderManagedRuntimeDriver, PortError> {
    let provider = Arc::new(LinuxManagedProvider::new(options.factory, options.config));
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
            let port = egress.into_port(crate::port::PROVIDER, provider);
            driver.with_credential_egress(
                Arc::new(port),
                crate::credential_egress::CredentialEgress::capabilities_value(),
            )
        }
    })
}

/// `createManagedRuntimeProviderDriver` of the `linux` backend.
pub async fn create_managed_runtime_provider_driver(
    options: LinuxManagedRuntimeOptions,
) -> Result<Arc<dyn ManagedRuntimeProviderDriverPort>, PortError> {
    Ok(Arc::new(managed_runtime_provider_driver(options).await?))
}
