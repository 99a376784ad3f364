//! [`DockerSandboxPort`]: a running container seen through the tool-sandbox seam.
//!
//! Every operation is one request to the agent that is the container's PID 1, so the exec
//! output is the linux backend's ([`format_exec_output`]: stdout, `"\n" + stderr`, trailing
//! whitespace trimmed, `"\n[exit <n>]"` unless 0, `124` after a timeout), and paths are
//! sandbox paths the agent resolves inside the container.
//!
//! # Capabilities
//!
//! Really implemented: duplex processes (streamed stdin with EOF, stdout and stderr,
//! `SIGTERM`/`SIGKILL`, `{code, signal}`), background processes (kill, logs, status), file
//! bytes, env vars for later execs, destroy, the Session outputs mount (only when an
//! outputs directory is bound), a runtime port with empty capability lists, and beyond the
//! seam the live network policy ([`DockerSandboxPort::set_networking`]) and credential
//! egress ([`DockerSandboxPort::attach_credentials`]). Not
//! offered: memory mounts, OOM notes on exits (docker reports OOM kills per container, not
//! per command).
//!
//! # Teardown
//!
//! [`DockerSandboxPort::terminate`] closes the agent connection and removes the container
//! (forced: the engine kills what still runs). Idempotent; afterwards every operation fails
//! with [`DockerError::Destroyed`]. Dropping the port without a terminate leaves the
//! container to its agent (which exits when its stdin closes, so nothing runs) and to
//! `omabox reap` (which removes it once this host is gone).
//!
//! Must never print an environment value, nor report a capability it does not implement.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use omabox_agent::client::exec_output::format_exec_output;
use omabox_agent::client::{AgentClient, ClientError, ExecRequest, WriteOptions};
use omabox_contract::PortError;
use omabox_sandbox::{
    ProcessHandle, SandboxCheckpointHandle, SandboxCheckpointKind, SandboxDestroyPort,
    SandboxDuplexProcess, SandboxDuplexProcessPort, SandboxDuplexProcessSpec, SandboxEnvVarsPort,
    SandboxFileBytesPort, SandboxPort, SandboxProcessPort, SandboxRuntimeCapabilities,
    SandboxRuntimeHandle, SandboxRuntimePort, SandboxRuntimeStatus, SandboxSessionOutputMountPort,
    SessionOutputMountCapabilities, SessionOutputMountDurability, SessionOutputMountRequest,
};

use omabox_contract::networking::NetworkPolicy;
use omabox_egress::{Resolver, SystemResolver};
use omabox_sandbox_net::SandboxNetwork;
use omabox_sandbox_net::credential_egress::{CA_ENV, CredentialTarget};

use crate::config::DockerConfig;
use crate::engine::Engine;
use crate::error::DockerError;
use crate::network::DockerNetwork;
use omabox_agent_port::{AgentFailure, CaTrustError, PortErrorOf, RootBundle, trust_ca};

/// The provider name of docker sandboxes (`--backend docker`, runtime handles).
pub const PROVIDER: &str = "docker";

/// Timeout of [`SandboxPort::exec`] when the caller gives none.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(120);

/// The bundle a container's image usually trusts (Debian's and Alpine's path).
const IMAGE_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// How long the host waits for the agent beyond a command's own timeout.
const AGENT_GRACE: Duration = Duration::from_secs(10);

/// A running container behind the tool-sandbox seam.
#[derive(Debug)]
pub struct DockerSandboxPort {
    engine: Engine,
    id: String,
    container: String,
    client: AgentClient,
    default_timeout: Duration,
    session_outputs: bool,
    destroyed: AtomicBool,
    teardown: tokio::sync::Mutex<()>,
    /// The host side of its network (`None` under networking `none`); dropping it closes
    /// everything bound in the container's namespace.
    network: std::sync::Mutex<Option<SandboxNetwork>>,
}

impl DockerSandboxPort {
    /// Makes the image present, then starts sandbox `id`'s container from `config`,
    /// connects to its agent and, under a networking config other than `none`, serves its
    /// network (see [`crate::network`]). Nothing is left behind when this fails.
    pub async fn start(
        engine: &Engine,
        config: &DockerConfig,
        id: &str,
    ) -> Result<Self, DockerError> {
        let resolver: Arc<dyn Resolver> = match &config.test_hosts {
            Some(hosts) => Arc::new(
                omabox_egress::FixedNames::parse(hosts, Arc::new(SystemResolver))
                    .map_err(DockerError::TestHosts)?,
            ),
            None => Arc::new(SystemResolver),
        };
        Self::start_resolving(engine, config, id, resolver).await
    }

    /// [`start`](Self::start) with the container's names resolved by `resolver` instead of
    /// the host's resolver (tests stand up their own "internet").
    pub async fn start_resolving(
        engine: &Engine,
        config: &DockerConfig,
        id: &str,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, DockerError> {
        crate::network::check(engine, &config.network)?;
        engine.ensure_image(&config.image).await?;
        let started = crate::container::start(engine, config, id).await?;
        if config.user_home
            && let Err(e) = omabox_agent_port::add_user_account(&started.client).await
        {
            let _ = engine.remove_container(&started.container).await;
            return Err(DockerError::UserAccount(e));
        }
        // The agent runs nothing until asked: no process of the container sees its
        // namespace before the host's listeners are there.
        let network = if config.network.reaches_out() {
            let served = crate::network::start(
                engine,
                &started.container,
                &config.network,
                config.limits.memory_bytes,
                resolver,
            )
            .await;
            match served {
                Ok(network) => Some(network),
                Err(e) => {
                    // The start's error is the one to report (the label reaps the rest).
                    let _ = engine.remove_container(&started.container).await;
                    return Err(e);
                }
            }
        } else {
            None
        };
        Ok(Self {
            engine: engine.clone(),
            id: id.to_owned(),
            container: started.container,
            client: started.client,
            default_timeout: config.exec_timeout,
            session_outputs: config.outputs.is_some(),
            destroyed: AtomicBool::new(false),
            teardown: tokio::sync::Mutex::new(()),
            network: std::sync::Mutex::new(network),
        })
    }

    /// Changes what the live container may reach (see [`SandboxNetwork::set_policy`];
    /// the gateway stays as it was started). A sandbox started under `none` has no
    /// network to change ([`DockerError::NoNetwork`]).
    pub fn set_networking(&self, network: &DockerNetwork) -> Result<(), DockerError> {
        self.check_open()?;
        let policy = network.policy().map_err(DockerError::Networking)?;
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(served) => served.set_policy(policy).map_err(DockerError::Network),
            None => Err(DockerError::NoNetwork),
        }
    }

    /// Attaches a credential egress binding's `credentials` (see
    /// [`omabox_sandbox_net::credential_egress`]): the relay intercepts their hosts, and
    /// every process started afterwards trusts their CA through
    /// `omabox_agent_port::SANDBOX_CA_FILE` (the
    /// container's own bundle, read inside it, plus that CA) and the usual CA variables.
    /// Needs a network.
    pub async fn attach_credentials(
        &self,
        credentials: Arc<omabox_egress::intercept::Credentials>,
    ) -> Result<(), DockerError> {
        self.check_open()?;
        if self
            .network
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
        {
            return Err(DockerError::NoNetwork);
        }
        // The image's bundle, whatever it holds, is the container's own trust; a missing
        // one is none. Capped: the image is not ours.
        let root = RootBundle::InSandbox(IMAGE_CA_BUNDLE);
        trust_ca(&self.client, root, &credentials.ca_pem(), &CA_ENV)
            .await
            .map_err(|e| match e {
                CaTrustError::Agent(f) => self.agent_error(f.op, &f.target)(f.source),
                CaTrustError::BundleTooLarge { max, .. } => DockerError::CaBundle {
                    path: IMAGE_CA_BUNDLE,
                    max,
                },
            })?;
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(network) => {
                network.set_credentials(Some(credentials));
                Ok(())
            }
            None => Err(DockerError::NoNetwork),
        }
    }

    /// The policy the container's network applies now (`none` when it has none).
    pub fn network_policy(&self) -> Arc<NetworkPolicy> {
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .map(SandboxNetwork::policy)
            .unwrap_or_else(|| Arc::new(NetworkPolicy::None))
    }

    /// Sandbox id (the container's `omabox.sandbox` label).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The engine's container id.
    pub fn container(&self) -> &str {
        &self.container
    }

    /// The agent connection, for operations beyond the seam (tar, stat, readiness).
    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// Whether [`terminate`](Self::terminate) completed.
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// Whether the sandbox was not destroyed and its agent still answers.
    pub fn is_alive(&self) -> bool {
        !self.is_destroyed() && self.client.closed_reason().is_none()
    }

    /// Removes the container (killing what runs in it). Idempotent; concurrent calls wait
    /// for the first. On error the sandbox stays usable as far as it still is, and a retry
    /// is safe.
    pub async fn terminate(&self) -> Result<(), DockerError> {
        let _one = self.teardown.lock().await;
        if self.is_destroyed() {
            return Ok(());
        }
        self.engine.remove_container(&self.container).await?;
        self.destroyed.store(true, Ordering::Release);
        // Its namespace is gone with the container; the host's tasks and sockets go too.
        drop(
            self.network
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        Ok(())
    }

    fn check_open(&self) -> Result<(), DockerError> {
        if self.is_destroyed() {
            return Err(DockerError::Destroyed {
                id: self.id.clone(),
            });
        }
        Ok(())
    }

    fn agent_error(
        &self,
        op: &'static str,
        target: &str,
    ) -> impl FnOnce(ClientError) -> DockerError {
        let target = target.to_owned();
        let id = self.id.clone();
        let destroyed = self.is_destroyed();
        move |source| {
            if destroyed {
                DockerError::Destroyed { id }
            } else {
                DockerError::Agent { op, target, source }
            }
        }
    }

    /// Runs `command` through `/bin/sh -c` and returns the combined output.
    pub async fn exec_command(
        &self,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<String, DockerError> {
        self.check_open()?;
        let timeout = timeout.unwrap_or(self.default_timeout);
        let waited = timeout.saturating_add(AGENT_GRACE);
        let request = ExecRequest::shell(command).timeout(timeout);
        let output = tokio::time::timeout(waited, self.client.exec(request))
            .await
            .map_err(|_| DockerError::Unresponsive {
                op: "exec",
                target: command.to_owned(),
                waited,
            })?
            .map_err(self.agent_error("exec", command))?;
        Ok(format_exec_output(&output, timeout, None))
    }

    async fn spawn_duplex(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, DockerError> {
        self.check_open()?;
        // No OOM watch: a container's OOM kills are not counted per process.
        omabox_agent_port::spawn_duplex(&self.client, spec, None, port_error())
            .await
            .map_err(|f| self.agent_failure(f))
    }

    /// An agent failure as this port's error (`Destroyed` once the container is gone).
    fn agent_failure(&self, failure: AgentFailure) -> DockerError {
        let AgentFailure { op, target, source } = failure;
        self.agent_error(op, &target)(source)
    }
}

/// How the shared process controls report an agent failure: as this backend's error.
fn port_error() -> PortErrorOf {
    Arc::new(|AgentFailure { op, target, source }| {
        PortError::from(DockerError::Agent { op, target, source })
    })
}

#[async_trait]
impl SandboxPort for DockerSandboxPort {
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError> {
        Ok(self
            .exec_command(command, timeout_ms.map(Duration::from_millis))
            .await?)
    }

    async fn read_file(&self, path: &str) -> Result<String, PortError> {
        self.check_open()?;
        Ok(self
            .client
            .read_file(path)
            .await
            .map_err(self.agent_error("read file", path))?)
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<String, PortError> {
        self.check_open()?;
        Ok(self
            .client
            .write_file(path, content)
            .await
            .map_err(self.agent_error("write file", path))?)
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

    fn as_session_output_mount(&self) -> Option<&dyn SandboxSessionOutputMountPort> {
        Some(self)
    }

    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        Some(self)
    }

    fn as_runtime(&self) -> Option<&dyn SandboxRuntimePort> {
        Some(self)
    }
}

#[async_trait]
impl SandboxDuplexProcessPort for DockerSandboxPort {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        Ok(self.spawn_duplex(spec).await?)
    }
}

#[async_trait]
impl SandboxProcessPort for DockerSandboxPort {
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError> {
        self.check_open()?;
        Ok(
            omabox_agent_port::start_background(&self.client, command, port_error())
                .await
                .map_err(|f| self.agent_failure(f))?,
        )
    }
}

#[async_trait]
impl SandboxFileBytesPort for DockerSandboxPort {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        self.check_open()?;
        Ok(self
            .client
            .read_file_bytes(path)
            .await
            .map_err(self.agent_error("read file", path))?)
    }

    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError> {
        self.check_open()?;
        Ok(self
            .client
            .write_file_bytes(path, Bytes::copy_from_slice(bytes), WriteOptions::default())
            .await
            .map_err(self.agent_error("write file", path))?)
    }
}

#[async_trait]
impl SandboxEnvVarsPort for DockerSandboxPort {
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError> {
        self.check_open()?;
        // The target names the keys only: values may be secrets.
        let keys = vars.keys().cloned().collect::<Vec<_>>().join(", ");
        Ok(self
            .client
            .set_env(vars.into_iter().map(|(k, v)| (k, Some(v))))
            .await
            .map_err(self.agent_error("set env vars", &keys))?)
    }
}

#[async_trait]
impl SandboxSessionOutputMountPort for DockerSandboxPort {
    /// Durable when an outputs directory is bound: writes land in the host's directory.
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities> {
        self.session_outputs
            .then_some(SessionOutputMountCapabilities {
                durability: SessionOutputMountDurability::Durable,
            })
    }

    /// The bind is made when the container is created, so this only confirms it exists.
    async fn mount_session_outputs(
        &self,
        _request: SessionOutputMountRequest,
    ) -> Result<(), PortError> {
        self.check_open()?;
        if self.session_outputs {
            Ok(())
        } else {
            Err(PortError::capability(
                "this docker sandbox was started without an outputs directory; \
                 /mnt/session/outputs is not mounted",
            ))
        }
    }
}

#[async_trait]
impl SandboxDestroyPort for DockerSandboxPort {
    async fn destroy(&self) -> Result<(), PortError> {
        Ok(self.terminate().await?)
    }
}

#[async_trait]
impl SandboxRuntimePort for DockerSandboxPort {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        SandboxRuntimeHandle {
            provider: PROVIDER.to_owned(),
            runtime_id: self.id.clone(),
        }
    }

    /// No lease, no suspend, no checkpoint yet: the lists are empty, honestly.
    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities {
        SandboxRuntimeCapabilities::default()
    }

    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError> {
        Ok(if self.is_alive() {
            SandboxRuntimeStatus::Running
        } else {
            SandboxRuntimeStatus::Stopped
        })
    }

    async fn renew_lease(&self, _ttl_ms: u64) -> Result<(), PortError> {
        if self.is_alive() {
            Ok(())
        } else {
            Err(PortError::new(format!(
                "the docker sandbox {} is no longer running",
                self.id
            )))
        }
    }

    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "docker sandboxes cannot suspend yet ({kind:?} requested; runtimeCapabilities().suspend is empty)"
        )))
    }

    async fn resume(&self, handle: &SandboxCheckpointHandle) -> Result<(), PortError> {
        Err(PortError::invalid_argument(format!(
            "docker sandbox {} never suspends, so checkpoint {:?} of provider {:?} cannot be resumed",
            self.id, handle.checkpoint_id, handle.provider
        )))
    }

    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        _name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "docker sandboxes take no checkpoints yet ({kind:?} requested; runtimeCapabilities().checkpoint is empty)"
        )))
    }
}

#[async_trait]
impl CredentialTarget for DockerSandboxPort {
    async fn attach_credentials(
        &self,
        credentials: Arc<omabox_egress::intercept::Credentials>,
    ) -> Result<(), PortError> {
        Ok(DockerSandboxPort::attach_credentials(self, credentials).await?)
    }
}
