//! A gvisor sandbox behind the tool-sandbox seam (`SandboxPort`): exec, duplex and
//! background processes (`omabox-agent-port`, as the linux and docker backends serve
//! them), text and byte files, env vars for later commands, destroy, the Session outputs
//! mount (when an outputs directory is bound), a runtime port with empty capability lists
//! (pause/resume are [`GvisorSandbox`]'s own, unproven, see the crate doc), and beyond the
//! seam the live network policy ([`GvisorSandboxPort::set_networking`]) and credential
//! egress ([`GvisorSandboxPort::attach_credentials`]).
//!
//! The exec text is the agent client's combined form, the same as the linux backend's:
//! stdout then stderr, then `[timed out after N ms]` and `[exit N]` lines (a shell's
//! numbering; 128+n for a signal). Never: wait for a wedged agent past the timeout plus a
//! grace; put an env value in an error (the env error names the keys).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use omabox_agent::client::WriteOptions;
use omabox_agent::client::exec_output::format_exec_output;
use omabox_agent::{ClientError, ExecRequest};
use omabox_agent_port::{AgentFailure, CaTrustError, PortErrorOf, RootBundle, trust_ca};
use omabox_contract::PortError;
use omabox_contract::networking::NetworkPolicy;
use omabox_sandbox::{
    ProcessHandle, SandboxCheckpointHandle, SandboxCheckpointKind, SandboxDestroyPort,
    SandboxDuplexProcess, SandboxDuplexProcessPort, SandboxDuplexProcessSpec, SandboxEnvVarsPort,
    SandboxFileBytesPort, SandboxPort, SandboxProcessPort, SandboxRuntimeCapabilities,
    SandboxRuntimeHandle, SandboxRuntimePort, SandboxRuntimeStatus, SandboxSessionOutputMountPort,
    SessionOutputMountCapabilities, SessionOutputMountDurability, SessionOutputMountRequest,
};
use omabox_sandbox_net::credential_egress::{CA_ENV, CredentialTarget};

use crate::{GvisorError, GvisorNetwork, GvisorSandbox, State};

/// A command's default timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long past a command's timeout the agent may take to report it.
const AGENT_GRACE: Duration = Duration::from_secs(10);

/// [`GvisorSandbox`] as a `SandboxPort`.
#[derive(Debug, Clone)]
pub struct GvisorSandboxPort {
    sandbox: Arc<GvisorSandbox>,
}

impl GvisorSandboxPort {
    /// Wraps a sandbox.
    pub fn new(sandbox: Arc<GvisorSandbox>) -> Self {
        Self { sandbox }
    }

    /// The sandbox.
    pub fn sandbox(&self) -> &Arc<GvisorSandbox> {
        &self.sandbox
    }

    /// Changes what the live sandbox may reach (`SandboxNetwork::set_policy`; the gateway
    /// stays as it was started). A sandbox started under `none` has no network to change
    /// ([`GvisorError::NoNetwork`]).
    pub fn set_networking(&self, network: &GvisorNetwork) -> Result<(), GvisorError> {
        let policy = network.policy().map_err(GvisorError::Networking)?;
        self.sandbox
            .with_network(|served| served.set_policy(policy))?
            .map_err(GvisorError::Network)
    }

    /// The policy the sandbox's network applies now (`none` when it has none).
    pub fn network_policy(&self) -> Arc<NetworkPolicy> {
        self.sandbox
            .with_network(omabox_sandbox_net::SandboxNetwork::policy)
            .unwrap_or_else(|_| Arc::new(NetworkPolicy::None))
    }

    /// Attaches a credential egress binding's `credentials` (see
    /// [`omabox_sandbox_net::credential_egress`]): the relay intercepts their hosts, and
    /// every process started afterwards trusts their CA through
    /// `omabox_agent_port::SANDBOX_CA_FILE` (the
    /// root's bundle, read inside the sandbox, plus that CA) and the usual CA variables.
    /// Needs a network.
    pub async fn attach_credentials(
        &self,
        credentials: Arc<omabox_egress::intercept::Credentials>,
    ) -> Result<(), PortError> {
        self.sandbox.with_network(|_| ()).map_err(port_error)?;
        let client = self.sandbox.client().await.map_err(port_error)?;
        let root = RootBundle::InSandbox(crate::bundle::CA_BUNDLE);
        trust_ca(&client, root, &credentials.ca_pem(), &CA_ENV)
            .await
            .map_err(|e| match e {
                CaTrustError::Agent(failure) => self.port_error()(failure),
                too_large => {
                    PortError::new(format!("gvisor sandbox {}: {too_large}", self.sandbox.id()))
                }
            })?;
        self.sandbox
            .with_network(|served| served.set_credentials(Some(credentials)))
            .map_err(port_error)
    }

    fn agent_error(&self, op: &'static str, target: &str) -> impl FnOnce(ClientError) -> PortError {
        let port_error = self.port_error();
        let target = target.to_owned();
        move |source| port_error(AgentFailure { op, target, source })
    }

    /// How an agent failure reads: what, on what, in which sandbox, and the agent's chain.
    fn port_error(&self) -> PortErrorOf {
        let id = self.sandbox.id().to_owned();
        let memory_limit = self.sandbox.memory_limit();
        let runsc = self.sandbox.runsc_slot();
        Arc::new(move |AgentFailure { op, target, source }| {
            let mut message = format!(
                "{op} {target:?} in gvisor sandbox {id}: {}",
                chain(&GvisorError::Agent {
                    id: id.clone(),
                    source
                })
            );
            // The memory limit ends the whole sandbox (gVisor's kernel is one host process),
            // so its commands see the connection drop: say why.
            if let Some(limit) = memory_limit {
                let mib = limit >> 20;
                if crate::bundle::oom_kills(&id) > 0 {
                    let _ = write!(
                        message,
                        " (the sandbox exceeded its memory limit of {mib} MiB, which counts \
                         gVisor's kernel too, and was stopped)"
                    );
                } else if runsc.killed_from_outside() {
                    // The cgroup that counted it is gone with the container by now.
                    let _ = write!(
                        message,
                        " (the sandbox was killed, not by omabox: most likely by its memory \
                         limit of {mib} MiB, which counts gVisor's kernel too)"
                    );
                }
            }
            PortError::new(message)
        })
    }
}

pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let _ = write!(text, ": {s}");
        src = s.source();
    }
    text
}

fn port_error(e: GvisorError) -> PortError {
    PortError::new(chain(&e))
}

#[async_trait]
impl SandboxPort for GvisorSandboxPort {
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        let timeout = timeout_ms.map_or(DEFAULT_TIMEOUT, Duration::from_millis);
        let waited = timeout.saturating_add(AGENT_GRACE);
        let request = ExecRequest::shell(command).timeout(timeout);
        let output = tokio::time::timeout(waited, client.exec(request))
            .await
            .map_err(|_| {
                PortError::new(format!(
                    "exec {command:?} in gvisor sandbox {}: no answer within {waited:?}",
                    self.sandbox.id()
                ))
            })?
            .map_err(self.agent_error("exec", command))?;
        // No OOM note: runsc is given no cgroup (yet), so nothing counts OOM kills.
        Ok(format_exec_output(&output, timeout, None))
    }

    async fn read_file(&self, path: &str) -> Result<String, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        client
            .read_file(path)
            .await
            .map_err(self.agent_error("read file", path))
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<String, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        client
            .write_file(path, content)
            .await
            .map_err(self.agent_error("write file", path))
    }

    fn as_duplex_process(&self) -> Option<&dyn SandboxDuplexProcessPort> {
        Some(self)
    }

    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        Some(self)
    }

    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        Some(self)
    }

    fn as_env_vars(&self) -> Option<&dyn SandboxEnvVarsPort> {
        Some(self)
    }

    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        Some(self)
    }

    fn as_session_output_mount(&self) -> Option<&dyn SandboxSessionOutputMountPort> {
        Some(self)
    }

    fn as_runtime(&self) -> Option<&dyn SandboxRuntimePort> {
        Some(self)
    }
}

#[async_trait]
impl SandboxDuplexProcessPort for GvisorSandboxPort {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        let errors = self.port_error();
        omabox_agent_port::spawn_duplex(&client, spec, None, Arc::clone(&errors))
            .await
            .map_err(|f| errors(f))
    }
}

#[async_trait]
impl SandboxProcessPort for GvisorSandboxPort {
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        let errors = self.port_error();
        omabox_agent_port::start_background(&client, command, Arc::clone(&errors))
            .await
            .map_err(|f| errors(f))
    }
}

#[async_trait]
impl SandboxFileBytesPort for GvisorSandboxPort {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        client
            .read_file_bytes(path)
            .await
            .map_err(self.agent_error("read file", path))
    }

    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        client
            .write_file_bytes(
                path,
                bytes::Bytes::copy_from_slice(bytes),
                WriteOptions::default(),
            )
            .await
            .map_err(self.agent_error("write file", path))
    }
}

#[async_trait]
impl SandboxEnvVarsPort for GvisorSandboxPort {
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError> {
        let client = self.sandbox.client().await.map_err(port_error)?;
        // The target names the keys only: values may be secrets.
        let keys = vars.keys().cloned().collect::<Vec<_>>().join(", ");
        client
            .set_env(vars.into_iter().map(|(k, v)| (k, Some(v))))
            .await
            .map_err(self.agent_error("set env vars", &keys))
    }
}

#[async_trait]
impl SandboxDestroyPort for GvisorSandboxPort {
    async fn destroy(&self) -> Result<(), PortError> {
        self.sandbox.destroy().await.map_err(port_error)
    }
}

#[async_trait]
impl SandboxSessionOutputMountPort for GvisorSandboxPort {
    /// Durable when an outputs directory is bound: writes land in the host's directory.
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities> {
        self.sandbox
            .outputs()
            .is_some()
            .then_some(SessionOutputMountCapabilities {
                durability: SessionOutputMountDurability::Durable,
            })
    }

    /// The bind is in the sandbox's bundle from its start, so this only confirms it.
    async fn mount_session_outputs(
        &self,
        _request: SessionOutputMountRequest,
    ) -> Result<(), PortError> {
        if self.sandbox.outputs().is_some() {
            Ok(())
        } else {
            Err(PortError::capability(
                "this gvisor sandbox was started without an outputs directory; \
                 /mnt/session/outputs is not mounted",
            ))
        }
    }
}

#[async_trait]
impl SandboxRuntimePort for GvisorSandboxPort {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        SandboxRuntimeHandle {
            provider: crate::PROVIDER.to_owned(),
            runtime_id: self.sandbox.id().to_owned(),
        }
    }

    /// No lease renewal beyond liveness, no suspend, no checkpoint offered through this
    /// port: the lists are empty, honestly. Memory pause, resume, fork and images are
    /// `GvisorSandbox`'s (tested in `tests/sandbox.rs`), which `omabox serve --backend gvisor`
    /// uses directly; the contract's `process` runtime checkpoints are the managed
    /// provider's (`managed.rs`).
    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities {
        SandboxRuntimeCapabilities::default()
    }

    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError> {
        Ok(if self.is_alive().await {
            SandboxRuntimeStatus::Running
        } else {
            SandboxRuntimeStatus::Stopped
        })
    }

    async fn renew_lease(&self, _ttl_ms: u64) -> Result<(), PortError> {
        if self.is_alive().await {
            Ok(())
        } else {
            Err(PortError::new(format!(
                "the gvisor sandbox {} is no longer running",
                self.sandbox.id()
            )))
        }
    }

    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "gvisor sandboxes do not offer suspend ({kind:?} requested; runtimeCapabilities().suspend is empty)"
        )))
    }

    async fn resume(&self, handle: &SandboxCheckpointHandle) -> Result<(), PortError> {
        Err(PortError::invalid_argument(format!(
            "gvisor sandbox {} never suspends, so checkpoint {:?} of provider {:?} cannot be resumed",
            self.sandbox.id(),
            handle.checkpoint_id,
            handle.provider
        )))
    }

    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        _name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "gvisor sandboxes do not offer checkpoints ({kind:?} requested; runtimeCapabilities().checkpoint is empty)"
        )))
    }
}

impl GvisorSandboxPort {
    /// Whether the sandbox runs and its agent still answers.
    pub async fn is_alive(&self) -> bool {
        match self.sandbox.client().await {
            Ok(client) => client.closed_reason().is_none(),
            Err(GvisorError::NotRunning {
                state: State::Paused,
            }) => true,
            Err(_) => false,
        }
    }
}

#[async_trait]
impl CredentialTarget for GvisorSandboxPort {
    async fn attach_credentials(
        &self,
        credentials: Arc<omabox_egress::intercept::Credentials>,
    ) -> Result<(), PortError> {
        GvisorSandboxPort::attach_credentials(self, credentials).await
    }
}
