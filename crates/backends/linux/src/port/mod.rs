//! [`LinuxSandboxPort`]: a running linux sandbox seen through the tool-sandbox seam
//! (`omabox_sandbox::SandboxPort` and the optional capabilities it really has).
//!
//! The port owns the [`LinuxSandbox`] (so dropping the port tears the sandbox down) and an
//! [`AgentClient`] connected to the agent that is the sandbox's PID 1. Every operation is
//! one agent request; paths are sandbox paths (`/workspace/...`,
//! `/mnt/session/outputs/...`, `/tmp/...`) resolved by the agent inside the sandbox, so
//! the host never interprets them.
//!
//! # Exec output convention
//!
//! [`SandboxPort::exec`] runs `/bin/sh -c <command>` and returns the contract's combined
//! output (see [`format_exec_output`]): stdout, then `"\n" + stderr` when stderr is
//! non-empty, trailing whitespace trimmed, then `"\n[exit <n>]"` when the status is not 0.
//! `<n>` is the exit code, or `128 + signal number` when a signal ended the command (the
//! shell's convention, so `[exit 137]` is SIGKILL), or `124` when the command ran past its
//! timeout (GNU `timeout`'s convention; a `[timed out after <ms> ms]` line precedes it).
//! When the kernel's OOM killer killed a process of the sandbox during a command that
//! ended by SIGKILL, a `[killed by the memory limit of <n> MiB]` line precedes it.
//! When a process the command left behind kept the output pipes open, a line
//! `[output truncated: ...]` says so: output is never cut silently.
//!
//! The default timeout is [`DEFAULT_EXEC_TIMEOUT`]. The agent kills the command's process
//! group when it expires; the host gives up on an agent that does not answer within
//! [`AGENT_GRACE`] after that.
//!
//! # Capabilities
//!
//! Really implemented, so reachable through the `as_*` accessors: duplex processes
//! (streamed stdin with EOF, stdout and stderr, `SIGTERM`/`SIGKILL`, `{code, signal}`),
//! background processes (kill, logs, status), file bytes, env vars for later execs,
//! destroy, the Session outputs mount (only when the sandbox was started with an outputs
//! bind) and a runtime port whose capability lists are empty (no lease, no suspend, no
//! checkpoint: a linux sandbox lives as long as its host process keeps it). Memory
//! mounts, workspace backup and command secrets are not offered.
//!
//! # Teardown
//!
//! [`LinuxSandboxPort::terminate`] (and [`SandboxDestroyPort::destroy`]) kill the
//! sandbox's PID 1, which takes its whole pid namespace with it, then remove its cgroup
//! and state directory. It is idempotent and safe to call concurrently; afterwards every
//! operation fails with [`LinuxPortError::Destroyed`]. Dropping the port does the same
//! (blocking) through [`LinuxSandbox`]'s `Drop`.
//!
//! # What this module must never do
//!
//! - Print an environment value (they may be secrets) in an error or log line.
//! - Report a capability it does not implement, or a stub that always fails.
//! - Leave a process, cgroup or state directory behind after a successful terminate.

use std::collections::BTreeMap;
use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use omabox_agent::client::{AgentClient, ClientError, ExecRequest, WriteOptions};
use omabox_agent::message::ErrorKind;
use omabox_contract::PortError;
use omabox_contract::networking::NetworkPolicy;
use omabox_egress::{Resolver, SystemResolver};
use omabox_sandbox::{
    ProcessHandle, SandboxCheckpointHandle, SandboxCheckpointKind, SandboxDestroyPort,
    SandboxDuplexProcess, SandboxDuplexProcessPort, SandboxDuplexProcessSpec, SandboxEnvVarsPort,
    SandboxFileBytesPort, SandboxPort, SandboxProcessPort, SandboxRuntimeCapabilities,
    SandboxRuntimeHandle, SandboxRuntimePort, SandboxRuntimeStatus, SandboxSessionOutputMountPort,
    SessionOutputMountCapabilities, SessionOutputMountDurability, SessionOutputMountRequest,
};

use crate::network::{NetworkError, SandboxNetwork};
use omabox_linux_sandbox::plan::{Networking, SandboxPlan};
use omabox_linux_sandbox::{
    DestroyError, LinuxRuntime, LinuxSandbox, SandboxIdentity, SetupReport, StartError,
};

pub use omabox_agent::client::exec_output::{OomKill, exit_number, format_exec_output};
use omabox_agent_port::{AgentFailure, CaTrustError, OomWatch, PortErrorOf, RootBundle, trust_ca};

/// The provider name of linux sandboxes (`SANDBOX_PROVIDER=linux`, runtime handles).
pub const PROVIDER: &str = "linux";

/// Where the sandbox's trust bundle goes once a credential egress binding is attached
/// ([`LinuxSandboxPort::attach_credentials`]; `omabox-agent-port`'s).
pub use omabox_agent_port::SANDBOX_CA_FILE;

/// Timeout of [`SandboxPort::exec`] when the caller gives none.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(120);

/// How long the host waits for the agent beyond a command's own timeout before it
/// declares the agent unresponsive.
pub const AGENT_GRACE: Duration = Duration::from_secs(10);

/// Why an operation on a linux sandbox failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinuxPortError {
    /// The sandbox did not start (nothing is left behind).
    #[error("could not start the linux sandbox")]
    Start(#[from] StartError),
    /// The sandbox started but its agent did not complete the handshake (the sandbox
    /// was destroyed again).
    #[error("could not connect to the sandbox's agent")]
    Connect(#[source] ClientError),
    /// The agent refused or failed an operation.
    #[error("{op} {target:?} failed")]
    Agent {
        /// What was attempted (`exec`, `read file`, ...).
        op: &'static str,
        /// Its subject: a command or a sandbox path (never an env value).
        target: String,
        /// The agent's answer.
        #[source]
        source: ClientError,
    },
    /// The agent did not answer within the command's timeout plus [`AGENT_GRACE`].
    #[error("the sandbox's agent did not answer {op} {target:?} within {waited:?}")]
    Unresponsive {
        /// What was attempted.
        op: &'static str,
        /// Its subject.
        target: String,
        /// How long the host waited.
        waited: Duration,
    },
    /// The sandbox was destroyed; it accepts no more work.
    #[error("the linux sandbox {id} was destroyed")]
    Destroyed {
        /// Sandbox id.
        id: String,
    },
    /// Teardown did not complete; retrying is safe.
    #[error("destroying the linux sandbox {id} failed")]
    Destroy {
        /// Sandbox id.
        id: String,
        /// Which step failed.
        #[source]
        source: DestroyError,
    },
    /// The sandbox's network could not be set up or changed (the sandbox was destroyed
    /// again when this happened at start).
    #[error("the linux sandbox's network")]
    Network(#[source] crate::network::NetworkError),
    /// A blocking helper task of the host died (a bug; the sandbox is torn down by its
    /// owner's `Drop`).
    #[error("a linux sandbox helper task failed: {0}")]
    Task(String),
}

/// `error: source: source...`, since a [`PortError`] carries one message only.
fn chain(error: &dyn StdError) -> String {
    let mut text = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        let _ = write!(text, ": {e}");
        next = e.source();
    }
    text
}

impl From<LinuxPortError> for PortError {
    fn from(error: LinuxPortError) -> Self {
        let message = chain(&error);
        let invalid = matches!(
            &error,
            LinuxPortError::Agent { source, .. }
                if matches!(
                    source.remote_kind(),
                    Some(ErrorKind::InvalidRequest | ErrorKind::UnsafePath)
                ) || matches!(source, ClientError::UnknownSignal(_))
        );
        if invalid {
            PortError::invalid_argument(message)
        } else {
            PortError::new(message)
        }
    }
}

/// A running linux sandbox behind the tool-sandbox seam.
#[derive(Debug)]
pub struct LinuxSandboxPort {
    client: AgentClient,
    sandbox: tokio::sync::Mutex<Option<LinuxSandbox>>,
    /// The host side of its network (`None` under networking `none`).
    network: std::sync::Mutex<Option<SandboxNetwork>>,
    identity: SandboxIdentity,
    report: Option<SetupReport>,
    default_timeout: Duration,
    session_outputs: bool,
    destroyed: AtomicBool,
}

impl LinuxSandboxPort {
    /// Starts a sandbox from `plan` and connects to its agent. Nothing is left behind
    /// when this fails.
    pub async fn start(runtime: &LinuxRuntime, plan: &SandboxPlan) -> Result<Self, LinuxPortError> {
        Self::start_resolving(runtime, plan, Arc::new(SystemResolver)).await
    }

    /// [`start`](Self::start) with the sandbox's names resolved by `resolver` instead of
    /// the host's resolver (tests stand up their own "internet").
    pub async fn start_resolving(
        runtime: &LinuxRuntime,
        plan: &SandboxPlan,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, LinuxPortError> {
        let runtime = runtime.clone();
        let owned_plan = plan.clone();
        let mut sandbox = tokio::task::spawn_blocking(move || runtime.start(&owned_plan))
            .await
            .map_err(|e| LinuxPortError::Task(e.to_string()))??;
        // The network before the agent: nothing runs in the sandbox until the host asks
        // the agent, so no process sees the namespace before its listeners exist.
        let network = if plan.network.reaches_out() {
            let started = sandbox
                .identity()
                .pidfd()
                .map_err(NetworkError::Sandbox)
                .and_then(|pidfd| {
                    let setup = crate::network::setup(&plan.network, plan.limits.memory_bytes)?;
                    SandboxNetwork::start(pidfd, setup, resolver)
                });
            match started {
                Ok(network) => Some(network),
                Err(e) => {
                    let _ = tokio::task::spawn_blocking(move || sandbox.destroy()).await;
                    return Err(LinuxPortError::Network(e));
                }
            }
        } else {
            None
        };
        match sandbox.connect_agent().await {
            Ok(client) => {
                let port = Self::new(sandbox, client).with_session_outputs(plan.outputs.is_some());
                *port.network.lock().unwrap_or_else(|e| e.into_inner()) = network;
                Ok(port)
            }
            Err(source) => {
                drop(network);
                // Tear down off the async threads; a failed teardown is reported by the
                // sandbox's Drop and must not hide why the start failed.
                let _ = tokio::task::spawn_blocking(move || sandbox.destroy()).await;
                Err(LinuxPortError::Connect(source))
            }
        }
    }

    /// Changes what the live sandbox may reach (see [`SandboxNetwork::set_policy`]). A
    /// sandbox started under `none` has no network to change: starting one later would
    /// let its processes see the namespace change under them, so it is refused.
    pub fn set_networking(&self, networking: &Networking) -> Result<(), LinuxPortError> {
        self.check_open()?;
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(network) => crate::network::policy(networking)
                .and_then(|policy| network.set_policy(policy))
                .map_err(LinuxPortError::Network),
            None => Err(LinuxPortError::Network(NetworkError::NotStarted)),
        }
    }

    /// Attaches a credential egress binding's `credentials` (see
    /// [`crate::credential_egress`]): the relay intercepts their hosts, and every process
    /// started afterwards trusts their CA through [`SANDBOX_CA_FILE`]
    /// (the host bundle plus that CA) and the usual CA variables. Needs a network.
    pub async fn attach_credentials(
        &self,
        credentials: Arc<omabox_egress::intercept::Credentials>,
    ) -> Result<(), PortError> {
        self.check_open()?;
        let root = RootBundle::Host(
            std::fs::read(omabox_linux_sandbox::plan::CA_BUNDLE).unwrap_or_default(),
        );
        let vars = omabox_linux_sandbox::plan::CA_ENV;
        trust_ca(&self.client, root, &credentials.ca_pem(), vars)
            .await
            .map_err(|e| match e {
                CaTrustError::Agent(f) => {
                    PortError::from(self.agent_error(f.op, &f.target)(f.source))
                }
                too_large => PortError::new(too_large.to_string()),
            })?;
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        match slot.as_ref() {
            Some(network) => {
                network.set_credentials(Some(credentials));
                Ok(())
            }
            None => Err(LinuxPortError::Network(NetworkError::NotStarted).into()),
        }
    }

    /// The policy the sandbox's network applies now (`none` when it has none).
    pub fn network_policy(&self) -> Arc<NetworkPolicy> {
        let slot = self.network.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .map(SandboxNetwork::policy)
            .unwrap_or_else(|| Arc::new(NetworkPolicy::None))
    }

    /// Wraps a started sandbox and a client connected to its agent.
    pub fn new(sandbox: LinuxSandbox, client: AgentClient) -> Self {
        Self {
            client,
            identity: sandbox.identity().clone(),
            report: sandbox.report().cloned(),
            sandbox: tokio::sync::Mutex::new(Some(sandbox)),
            network: std::sync::Mutex::new(None),
            default_timeout: DEFAULT_EXEC_TIMEOUT,
            session_outputs: false,
            destroyed: AtomicBool::new(false),
        }
    }

    /// Sets the exec timeout used when the caller gives none.
    #[must_use]
    pub fn with_default_timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// Declares whether the sandbox was started with a `/mnt/session/outputs` bind (which
    /// makes the Session outputs mount capability available). [`start`](Self::start)
    /// sets it from the plan.
    #[must_use]
    pub fn with_session_outputs(mut self, mounted: bool) -> Self {
        self.session_outputs = mounted;
        self
    }

    /// Sandbox id (also the runtime id of [`SandboxRuntimePort::runtime_handle`]).
    pub fn id(&self) -> &str {
        &self.identity.id
    }

    /// The serializable identity: enough to destroy the sandbox from another process.
    pub fn identity(&self) -> &SandboxIdentity {
        &self.identity
    }

    /// What the setup stage enforced.
    pub fn report(&self) -> Option<&SetupReport> {
        self.report.as_ref()
    }

    /// The agent connection, for operations beyond the seam (tar, stat, readiness).
    pub fn client(&self) -> &AgentClient {
        &self.client
    }

    /// Whether the sandbox has not been destroyed and its PID 1 still runs.
    pub fn is_alive(&self) -> bool {
        !self.is_destroyed() && self.identity.is_alive()
    }

    /// Whether [`terminate`](Self::terminate) completed.
    pub fn is_destroyed(&self) -> bool {
        self.destroyed.load(Ordering::Acquire)
    }

    /// Kills every process of the sandbox and removes its cgroup and state directory.
    /// Idempotent; concurrent calls wait for the first. On error the sandbox is kept and
    /// a retry is safe.
    pub async fn terminate(&self) -> Result<(), LinuxPortError> {
        let mut slot = self.sandbox.lock().await;
        let Some(mut sandbox) = slot.take() else {
            return Ok(());
        };
        // Its sockets first, so nothing keeps the namespace once the processes are gone.
        drop(
            self.network
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take(),
        );
        let (sandbox, result) = tokio::task::spawn_blocking(move || {
            let result = sandbox.destroy();
            (sandbox, result)
        })
        .await
        .map_err(|e| LinuxPortError::Task(e.to_string()))?;
        match result {
            Ok(()) => {
                self.destroyed.store(true, Ordering::Release);
                Ok(())
            }
            Err(source) => {
                *slot = Some(sandbox);
                Err(LinuxPortError::Destroy {
                    id: self.identity.id.clone(),
                    source,
                })
            }
        }
    }

    fn check_open(&self) -> Result<(), LinuxPortError> {
        if self.is_destroyed() {
            return Err(LinuxPortError::Destroyed {
                id: self.identity.id.clone(),
            });
        }
        Ok(())
    }

    fn agent_error(
        &self,
        op: &'static str,
        target: &str,
    ) -> impl FnOnce(ClientError) -> LinuxPortError {
        let target = target.to_owned();
        let id = self.identity.id.clone();
        let destroyed = self.is_destroyed();
        move |source| {
            if destroyed {
                LinuxPortError::Destroyed { id }
            } else {
                LinuxPortError::Agent { op, target, source }
            }
        }
    }

    /// Runs `command` through `/bin/sh -c` and returns the combined output.
    pub async fn exec_command(
        &self,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<String, LinuxPortError> {
        self.check_open()?;
        let timeout = timeout.unwrap_or(self.default_timeout);
        let waited = timeout.saturating_add(AGENT_GRACE);
        let request = ExecRequest::shell(command).timeout(timeout);
        let oom_before = self.identity.cgroup.oom_kills();
        let output = tokio::time::timeout(waited, self.client.exec(request))
            .await
            .map_err(|_| LinuxPortError::Unresponsive {
                op: "exec",
                target: command.to_owned(),
                waited,
            })?
            .map_err(self.agent_error("exec", command))?;
        let oom = (self.identity.cgroup.oom_kills() > oom_before).then(|| OomKill {
            limit_bytes: self.identity.cgroup.memory_limit(),
        });
        Ok(format_exec_output(&output, timeout, oom))
    }

    async fn spawn_duplex(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, LinuxPortError> {
        self.check_open()?;
        // OOM kills the memory cgroup counts while the process runs are its when it ends
        // by SIGKILL: the harness's "exited (SIGKILL)" then says it was the memory limit.
        let oom: Arc<dyn OomWatch> = Arc::new(CgroupOom(self.identity.cgroup.clone()));
        omabox_agent_port::spawn_duplex(&self.client, spec, Some(oom), port_error())
            .await
            .map_err(|f| self.agent_failure(f))
    }

    /// An agent failure as this port's error (`Destroyed` once the sandbox is gone).
    fn agent_failure(&self, failure: AgentFailure) -> LinuxPortError {
        let AgentFailure { op, target, source } = failure;
        self.agent_error(op, &target)(source)
    }
}

/// How the shared process controls report an agent failure: as this backend's error.
fn port_error() -> PortErrorOf {
    Arc::new(|failure: AgentFailure| PortError::from(LinuxPortError::from(failure)))
}

impl From<AgentFailure> for LinuxPortError {
    fn from(AgentFailure { op, target, source }: AgentFailure) -> Self {
        Self::Agent { op, target, source }
    }
}

/// The sandbox's memory cgroup as the OOM count the shared process port reads.
struct CgroupOom(omabox_linux_sandbox::CgroupPaths);

impl OomWatch for CgroupOom {
    fn oom_kills(&self) -> Option<u64> {
        self.0.oom_kills()
    }

    fn memory_limit(&self) -> Option<u64> {
        self.0.memory_limit()
    }
}

#[async_trait]
impl SandboxPort for LinuxSandboxPort {
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
impl SandboxDuplexProcessPort for LinuxSandboxPort {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        Ok(self.spawn_duplex(spec).await?)
    }
}

#[async_trait]
impl SandboxProcessPort for LinuxSandboxPort {
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
impl SandboxFileBytesPort for LinuxSandboxPort {
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
impl SandboxEnvVarsPort for LinuxSandboxPort {
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
impl SandboxSessionOutputMountPort for LinuxSandboxPort {
    /// Durable when the sandbox was started with an outputs bind: writes land directly in
    /// the host's outputs directory.
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities> {
        self.session_outputs
            .then_some(SessionOutputMountCapabilities {
                durability: SessionOutputMountDurability::Durable,
            })
    }

    /// The bind is made when the sandbox starts, so this only confirms it exists.
    async fn mount_session_outputs(
        &self,
        _request: SessionOutputMountRequest,
    ) -> Result<(), PortError> {
        self.check_open()?;
        if self.session_outputs {
            Ok(())
        } else {
            Err(PortError::capability(
                "this linux sandbox was started without an outputs root; \
                 /mnt/session/outputs is not mounted",
            ))
        }
    }
}

#[async_trait]
impl SandboxDestroyPort for LinuxSandboxPort {
    async fn destroy(&self) -> Result<(), PortError> {
        Ok(self.terminate().await?)
    }
}

#[async_trait]
impl SandboxRuntimePort for LinuxSandboxPort {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        SandboxRuntimeHandle {
            provider: PROVIDER.to_owned(),
            runtime_id: self.identity.id.clone(),
        }
    }

    /// No lease, no suspend, no checkpoint: the lists are empty, honestly.
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

    /// A linux sandbox has no lease to renew; this succeeds while it is alive and fails
    /// (lease lost) once it is gone.
    async fn renew_lease(&self, _ttl_ms: u64) -> Result<(), PortError> {
        if self.is_alive() {
            Ok(())
        } else {
            Err(PortError::new(format!(
                "the linux sandbox {} is no longer running",
                self.identity.id
            )))
        }
    }

    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "linux sandboxes cannot suspend ({kind:?} requested; runtimeCapabilities().suspend is empty)"
        )))
    }

    async fn resume(&self, handle: &SandboxCheckpointHandle) -> Result<(), PortError> {
        if handle.provider != PROVIDER {
            return Err(PortError::invalid_argument(format!(
                "checkpoint of provider {:?} cannot be resumed by the {PROVIDER} provider",
                handle.provider
            )));
        }
        Err(PortError::invalid_argument(format!(
            "linux sandbox {} never suspends, so it has no own runtime-scoped checkpoint to resume",
            self.identity.id
        )))
    }

    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        _name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::capability(format!(
            "linux sandboxes take no checkpoints ({kind:?} requested; runtimeCapabilities().checkpoint is empty)"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_errors_carry_the_whole_chain() {
        let e = LinuxPortError::Agent {
            op: "read file",
            target: "/workspace/x".into(),
            source: ClientError::Timeout(Duration::from_secs(1)),
        };
        assert_eq!(
            PortError::from(e).message(),
            "read file \"/workspace/x\" failed: no reply from the agent within 1s"
        );
    }
}
