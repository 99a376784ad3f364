//! The `gvisor` managed-runtime provider: [`GvisorSandboxPort`] behind the managed ports
//! (`omabox_sandbox::managed`), as the docker backend's.
//!
//! - `/workspace` is the workspace binding's `hostPath` bound into the sandbox, and
//!   `/mnt/session/outputs` the outputs binding's `hostPath`: the session's checkpoint is
//!   restored there by the persistence ports before the sandbox starts, and collected from
//!   there after.
//! - A runtime id is the sandbox id (`omabox-gv-<32 hex>`, also its runsc container id and
//!   directory name); the lease metadata carries the backend's directory, so a reap from
//!   another process finds runsc's state and the sandbox's directory.
//! - Attach works in the process that created the runtime (its agent connection is the
//!   container's stdio, which dies with that process). Reap and status work from any
//!   process on this machine.
//! - `process` runtime checkpoints: `capture_processes` checkpoints a live sandbox into a
//!   runtime checkpoint that outlives it and this process (`checkpoints.rs`);
//!   `restore_processes` starts a new sandbox from one, binding the restoring run's
//!   directories (any process on this machine: the checkpoint is on disk).
//!
//! Must never reap what is not the lease's sandbox: the id must be one of ours and the
//! directory absolute; only `<dir>/sandboxes/<id>` is removed.

use std::path::{Path, PathBuf};
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

use crate::{GvisorRuntime, GvisorSandboxPort, PROVIDER, SandboxSpec};

/// Lease metadata key: the backend's directory (`GvisorConfig::dir`).
pub const DIR_METADATA_KEY: &str = "dir";

/// The runtimes this process created and still holds, by runtime id.
static LIVE: LazyLock<LiveRuntimes<GvisorSandboxPort>> = LazyLock::new(LiveRuntimes::default);

/// The `gvisor` [`ManagedSandboxProvider`].
#[derive(Debug, Clone)]
pub struct GvisorManagedProvider {
    /// Makes sandboxes; `None` for a provider that only reaps and observes (another
    /// process's leases).
    runtime: Option<GvisorRuntime>,
    /// The runsc binary reaps use.
    runsc: PathBuf,
}

impl GvisorManagedProvider {
    /// A provider making sandboxes of `runtime`.
    pub fn new(runtime: GvisorRuntime) -> Self {
        let runsc = runtime.runsc_binary().to_path_buf();
        Self {
            runtime: Some(runtime),
            runsc,
        }
    }

    /// A provider that reaps and observes leases (from any process) with `runsc`, and
    /// creates nothing.
    pub fn reaper(runsc: PathBuf) -> Self {
        Self {
            runtime: None,
            runsc,
        }
    }

    /// What a sandbox of `acquisition` binds.
    fn spec(acquisition: &AcquisitionContext) -> SandboxSpec {
        SandboxSpec {
            workspace: Some(acquisition.workspace_host_path.clone()),
            outputs: acquisition.outputs_host_path.clone(),
            user_home: false,
            image_root: None,
        }
    }

    /// A sandbox this process made, held for attach and handed to the managed runtime.
    fn provided(runtime: &GvisorRuntime, sandbox: crate::GvisorSandbox) -> ProvidedSandbox {
        let runtime_id = sandbox.id().to_owned();
        let port = Arc::new(GvisorSandboxPort::new(Arc::new(sandbox)));
        let mut metadata = Meta::new();
        metadata.insert(
            DIR_METADATA_KEY.into(),
            MetaValue::String(runtime.dir().to_string_lossy().into_owned()),
        );
        LIVE.insert(runtime_id.clone(), Arc::clone(&port));
        ProvidedSandbox {
            sandbox: port as Arc<dyn SandboxPort>,
            runtime_id,
            metadata,
        }
    }

    fn runtime(&self) -> Result<&GvisorRuntime, PortError> {
        self.runtime.as_ref().ok_or_else(|| {
            PortError::new("this gvisor provider only reaps (it was built without a runtime)")
        })
    }

    /// The sandbox directory a lease names, if its id is one of ours and its metadata names
    /// an absolute backend directory.
    fn sandbox_of(lease: &ManagedSandboxLease) -> Result<(PathBuf, &str), PortError> {
        let id = lease.runtime_id.as_str();
        if !is_sandbox_id(id) {
            return Err(PortError::invalid_argument(format!(
                "{id:?} is not a gvisor runtime id"
            )));
        }
        let dir = lease
            .metadata
            .as_ref()
            .and_then(|m| m.get(DIR_METADATA_KEY))
            .and_then(|v| match v {
                MetaValue::String(s) => Some(PathBuf::from(s)),
                _ => None,
            })
            .filter(|dir| dir.is_absolute())
            .ok_or_else(|| {
                PortError::invalid_argument(format!(
                    "the lease of gvisor runtime {id} names no backend directory"
                ))
            })?;
        Ok((dir, id))
    }
}

/// Whether `id` is a sandbox id this backend makes (`omabox-gv-` and 32 hex digits).
pub fn is_sandbox_id(id: &str) -> bool {
    id.strip_prefix("omabox-gv-")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

#[async_trait]
impl ManagedSandboxProvider for GvisorManagedProvider {
    fn name(&self) -> &str {
        PROVIDER
    }

    fn capabilities(&self) -> ManagedSandboxProviderCapabilities {
        ManagedSandboxProviderCapabilities {
            duplex_process: true,
            process_checkpoints: true,
        }
    }

    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError> {
        acquisition.signal.throw_if_aborted()?;
        let runtime = self.runtime()?;
        // The directories belong to the persistence ports: made here so runsc never finds a
        // binding's source missing.
        acquisition.create_binding_dirs()?;
        let sandbox = runtime
            .create_with(Self::spec(&acquisition))
            .await
            .map_err(|e| PortError::new(crate::port::chain(&e)))?;
        Ok(Self::provided(runtime, sandbox))
    }

    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError> {
        LIVE.attached("gvisor", &lease.runtime_id)
            .map(|port| port as Arc<dyn SandboxPort>)
    }

    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        let port = LIVE.remove(&lease.runtime_id);
        if let Some(port) = port {
            return port
                .sandbox()
                .destroy()
                .await
                .map_err(|e| PortError::new(crate::port::chain(&e)));
        }
        let (dir, id) = Self::sandbox_of(lease)?;
        let (runsc, id) = (self.runsc.clone(), id.to_owned());
        tokio::task::spawn_blocking(move || crate::reap::reap_one(&runsc, &dir, &id))
            .await
            .map_err(|e| PortError::new(format!("the gvisor reap task failed: {e}")))?
            .map_err(|e| PortError::new(crate::port::chain(&e)))
    }

    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError> {
        let port = LIVE.get(&lease.runtime_id);
        if let Some(port) = port {
            return Ok(if port.is_alive().await {
                SandboxRuntimeStatus::Running
            } else {
                SandboxRuntimeStatus::Stopped
            });
        }
        let (dir, id) = Self::sandbox_of(lease)?;
        Ok(if crate::reap::owner_alive(&dir, id) {
            SandboxRuntimeStatus::Running
        } else {
            SandboxRuntimeStatus::Stopped
        })
    }

    /// Checkpoints the live sandbox (it stops) into a runtime checkpoint that outlives it
    /// (`checkpoints.rs`). Only a sandbox this process holds: its agent is ours to detach.
    async fn capture_processes(
        &self,
        lease: &ManagedSandboxLease,
        session_id: &str,
    ) -> Result<String, PortError> {
        let port = LIVE.attached("gvisor", &lease.runtime_id)?;
        port.sandbox()
            .capture(session_id)
            .await
            .map_err(|e| PortError::new(crate::port::chain(&e)))
    }

    async fn restore_processes(
        &self,
        checkpoint_id: &str,
        acquisition: AcquisitionContext,
    ) -> Result<ProvidedSandbox, PortError> {
        acquisition.signal.throw_if_aborted()?;
        let runtime = self.runtime()?;
        let sandbox = runtime
            .restore_checkpoint(
                checkpoint_id,
                Self::spec(&acquisition),
                &acquisition.scope.session_id,
            )
            .await
            .map_err(|e| PortError::new(crate::port::chain(&e)))?;
        Ok(Self::provided(runtime, sandbox))
    }

    async fn remove_processes(&self, checkpoint_id: &str) -> Result<(), PortError> {
        self.runtime()?
            .remove_checkpoint(checkpoint_id)
            .map_err(|e| PortError::new(crate::port::chain(&e)))
    }
}

impl omabox_sandbox_net::credential_egress::LiveSandboxes for GvisorManagedProvider {
    fn live_target(
        &self,
        id: &str,
    ) -> Option<Arc<dyn omabox_sandbox_net::credential_egress::CredentialTarget>> {
        LIVE.get(id)
            .map(|port| port as Arc<dyn omabox_sandbox_net::credential_egress::CredentialTarget>)
    }
}

/// Options of the `gvisor` provider driver.
#[derive(Clone)]
pub struct GvisorManagedRuntimeOptions {
    /// Makes the sandboxes (limits, network; bindings come from each acquisition).
    pub runtime: GvisorRuntime,
    /// `/workspace` persistence with host-directory (`hostPath`) bindings.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence with host-directory (`hostPath`) bindings.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Readiness probe timeout (default 10 s).
    pub readiness_timeout: Option<Duration>,
    /// Where harness output goes as it arrives.
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
    /// Credential egress: vault secrets injected for bound hosts (needs a network).
    /// `None`: `unsupported`.
    pub credential_egress: Option<CredentialEgressOptions>,
}

impl std::fmt::Debug for GvisorManagedRuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GvisorManagedRuntimeOptions")
            .field("runtime", &self.runtime)
            .field("readiness_timeout", &self.readiness_timeout)
            .finish_non_exhaustive()
    }
}

/// The `gvisor` driver as its concrete type.
pub async fn managed_runtime_provider_driver(
    options: GvisorManagedRuntimeOptions,
) -> Result<ProviderManagedRuntimeDriver, PortError> {
    let provider = Arc::new(GvisorManagedProvider::new(options.runtime));
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

/// `<dir>/sandboxes/<id>`.
pub(crate) fn sandbox_dir(dir: &Path, id: &str) -> PathBuf {
    dir.join("sandboxes").join(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_ids_and_absolute_dirs_name_a_sandbox_to_reap() {
        assert!(is_sandbox_id("omabox-gv-0123456789abcdef0123456789abcdef"));
        assert!(!is_sandbox_id("omabox-gv-../../etc"));
        assert!(!is_sandbox_id("omabox-gv-0123"));
        assert!(!is_sandbox_id("docker-1-2"));
        let lease = |id: &str, dir: &str| {
            let mut metadata = Meta::new();
            metadata.insert(DIR_METADATA_KEY.into(), MetaValue::String(dir.into()));
            ManagedSandboxLease {
                provider: PROVIDER.into(),
                runtime_id: id.into(),
                metadata: Some(metadata),
            }
        };
        let id = "omabox-gv-0123456789abcdef0123456789abcdef";
        assert!(GvisorManagedProvider::sandbox_of(&lease(id, "/data/gvisor")).is_ok());
        assert!(GvisorManagedProvider::sandbox_of(&lease(id, "data/gvisor")).is_err());
        assert!(GvisorManagedProvider::sandbox_of(&lease("omabox-gv-x", "/data")).is_err());
    }
}
