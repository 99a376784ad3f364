//! Processes inside a sandbox: duplex (live stdio) and background (logs + status).

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use omabox_contract::PortError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// `{command, args?, env?, cwd?}`: what to spawn as a duplex process.
///
/// `command` is an executable (absolute or on the sandbox's `PATH`), not shell text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxDuplexProcessSpec {
    /// The executable.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Changes to the sandbox's exec environment: `Some(value)` sets, `None` deletes (the
    /// TypeScript `undefined`).
    #[serde(default)]
    pub env: BTreeMap<String, Option<String>>,
    /// Working directory (a sandbox path); the backend's default when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

impl SandboxDuplexProcessSpec {
    /// The minimal spec `{command}`.
    pub fn new(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            ..Self::default()
        }
    }
}

/// The signals a duplex process can be sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum DuplexKillSignal {
    /// Ask to stop (the default).
    #[default]
    #[serde(rename = "SIGTERM")]
    Term,
    /// Stop now.
    #[serde(rename = "SIGKILL")]
    Kill,
}

impl DuplexKillSignal {
    /// `"SIGTERM"` / `"SIGKILL"`.
    pub fn as_str(self) -> &'static str {
        match self {
            DuplexKillSignal::Term => "SIGTERM",
            DuplexKillSignal::Kill => "SIGKILL",
        }
    }
}

/// `{code, signal}`: how a process ended. Exactly one is normally set; both are `null` when
/// the backend could not tell (for example the process failed to start). omabox adds
/// `outOfMemory` when the sandbox's memory limit killed it (absent otherwise, so the shape
/// stays the contract's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxProcessExit {
    /// Exit status, when it exited.
    pub code: Option<i32>,
    /// Signal name (`"SIGKILL"`), when a signal ended it.
    pub signal: Option<String>,
    /// The kernel's OOM killer ended it, enforcing the sandbox's memory limit (a backend
    /// that can tell: its memory cgroup counted the kill).
    #[serde(
        default,
        rename = "outOfMemory",
        skip_serializing_if = "Option::is_none"
    )]
    pub out_of_memory: Option<OutOfMemory>,
}

/// A process killed by the sandbox's memory limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutOfMemory {
    /// The limit in bytes, when known.
    pub limit_bytes: Option<u64>,
}

impl std::fmt::Display for OutOfMemory {
    /// `killed: out of memory (limit 32 MiB)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.limit_bytes {
            Some(bytes) => write!(
                f,
                "killed: out of memory (limit {} MiB)",
                bytes.div_ceil(1 << 20)
            ),
            None => f.write_str("killed: out of memory (the sandbox's memory limit)"),
        }
    }
}

/// Bytes into a process; `shutdown()` closes stdin (EOF).
pub type SandboxByteWriter = Box<dyn AsyncWrite + Send + Unpin>;
/// Bytes out of a process; end of stream when the process closed it.
pub type SandboxByteReader = Box<dyn AsyncRead + Send + Unpin>;
/// The `exited` promise: cloneable, resolves once, every clone sees the same value.
pub type SandboxExitFuture = Shared<BoxFuture<'static, Result<SandboxProcessExit, PortError>>>;

/// Kills a duplex process. Shared so the stdio halves can move to other tasks.
#[async_trait]
pub trait SandboxDuplexProcessControl: Send + Sync {
    /// Sends `signal`. A no-op once the process has exited; resolves when the signal was
    /// delivered (backends may also wait briefly for the exit and escalate to `SIGKILL`).
    async fn kill(&self, signal: DuplexKillSignal) -> Result<(), PortError>;
}

/// A live process: stdin, stdout, stderr, kill, exited.
pub struct SandboxDuplexProcess {
    /// The process's stdin.
    pub stdin: SandboxByteWriter,
    /// The process's stdout.
    pub stdout: SandboxByteReader,
    /// The process's stderr.
    pub stderr: SandboxByteReader,
    control: Arc<dyn SandboxDuplexProcessControl>,
    exited: SandboxExitFuture,
}

impl fmt::Debug for SandboxDuplexProcess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxDuplexProcess")
            .finish_non_exhaustive()
    }
}

impl SandboxDuplexProcess {
    /// Assembles a duplex process from its parts.
    pub fn new(
        stdin: SandboxByteWriter,
        stdout: SandboxByteReader,
        stderr: SandboxByteReader,
        control: Arc<dyn SandboxDuplexProcessControl>,
        exited: impl Future<Output = Result<SandboxProcessExit, PortError>> + Send + 'static,
    ) -> Self {
        Self {
            stdin,
            stdout,
            stderr,
            control,
            exited: exited.boxed().shared(),
        }
    }

    /// Sends `signal` to the process.
    pub fn kill(
        &self,
        signal: DuplexKillSignal,
    ) -> impl Future<Output = Result<(), PortError>> + Send + 'static {
        let control = Arc::clone(&self.control);
        async move { control.kill(signal).await }
    }

    /// A handle that can kill the process after the stdio halves moved elsewhere.
    pub fn control(&self) -> Arc<dyn SandboxDuplexProcessControl> {
        Arc::clone(&self.control)
    }

    /// Resolves when the process has exited.
    pub fn exited(&self) -> SandboxExitFuture {
        self.exited.clone()
    }
}

/// Live processes with streaming stdio (required by ACP and supervised harnesses).
///
/// A backend whose stdin cannot stream must not implement this: a duplex process whose
/// stdin writes always fail does not satisfy the contract.
#[async_trait]
pub trait SandboxDuplexProcessPort: Send + Sync {
    /// Spawns `spec` with stdin, stdout and stderr connected.
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError>;
}

/// Signals a background process can be sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProcessSignal {
    /// `SIGTERM`.
    #[serde(rename = "SIGTERM")]
    Term,
    /// `SIGKILL`.
    #[serde(rename = "SIGKILL")]
    Kill,
    /// `SIGINT`.
    #[serde(rename = "SIGINT")]
    Int,
    /// `SIGHUP`.
    #[serde(rename = "SIGHUP")]
    Hup,
    /// `SIGQUIT`.
    #[serde(rename = "SIGQUIT")]
    Quit,
    /// `SIGUSR1`.
    #[serde(rename = "SIGUSR1")]
    Usr1,
    /// `SIGUSR2`.
    #[serde(rename = "SIGUSR2")]
    Usr2,
}

impl ProcessSignal {
    /// Every signal, for parsing.
    pub const ALL: &'static [ProcessSignal] = &[
        ProcessSignal::Term,
        ProcessSignal::Kill,
        ProcessSignal::Int,
        ProcessSignal::Hup,
        ProcessSignal::Quit,
        ProcessSignal::Usr1,
        ProcessSignal::Usr2,
    ];

    /// The signal's name (`"SIGTERM"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProcessSignal::Term => "SIGTERM",
            ProcessSignal::Kill => "SIGKILL",
            ProcessSignal::Int => "SIGINT",
            ProcessSignal::Hup => "SIGHUP",
            ProcessSignal::Quit => "SIGQUIT",
            ProcessSignal::Usr1 => "SIGUSR1",
            ProcessSignal::Usr2 => "SIGUSR2",
        }
    }

    /// Parses a signal name (`"SIGTERM"`); a clear error for anything else.
    pub fn parse(name: &str) -> Result<Self, PortError> {
        Self::ALL
            .iter()
            .copied()
            .find(|signal| signal.as_str() == name)
            .ok_or_else(|| {
                PortError::invalid_argument(format!(
                    "unsupported signal {name:?}; expected one of SIGTERM, SIGKILL, SIGINT, \
                     SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2"
                ))
            })
    }
}

impl From<DuplexKillSignal> for ProcessSignal {
    fn from(signal: DuplexKillSignal) -> Self {
        match signal {
            DuplexKillSignal::Term => ProcessSignal::Term,
            DuplexKillSignal::Kill => ProcessSignal::Kill,
        }
    }
}

/// `"running" | "completed" | "error" | "killed"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProcessStatus {
    /// Still running.
    Running,
    /// Exited with status 0.
    Completed,
    /// Exited with a non-zero status.
    Error,
    /// Ended by a signal.
    Killed,
}

/// `{stdout, stderr}` collected so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessLogs {
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

/// The backend side of a [`ProcessHandle`].
#[async_trait]
pub trait SandboxProcessControl: Send + Sync {
    /// Sends `signal`.
    async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError>;
    /// Output collected so far.
    async fn logs(&self) -> Result<ProcessLogs, PortError>;
    /// Current status.
    async fn status(&self) -> Result<ProcessStatus, PortError>;
}

/// `{id, pid, kill, getLogs, getStatus}`: a background process. Cloning shares the process.
#[derive(Clone)]
pub struct ProcessHandle {
    /// Backend-unique id.
    pub id: String,
    /// The process id inside the sandbox.
    pub pid: u32,
    control: Arc<dyn SandboxProcessControl>,
}

impl fmt::Debug for ProcessHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessHandle")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl ProcessHandle {
    /// Assembles a handle.
    pub fn new(id: impl Into<String>, pid: u32, control: Arc<dyn SandboxProcessControl>) -> Self {
        Self {
            id: id.into(),
            pid,
            control,
        }
    }

    /// Sends `signal`.
    pub async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError> {
        self.control.kill(signal).await
    }

    /// Output collected so far.
    pub async fn logs(&self) -> Result<ProcessLogs, PortError> {
        self.control.logs().await
    }

    /// Current status.
    pub async fn status(&self) -> Result<ProcessStatus, PortError> {
        self.control.status().await
    }
}

/// Background processes.
#[async_trait]
pub trait SandboxProcessPort: Send + Sync {
    /// Starts `command` through the sandbox's shell in the background.
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError>;
}
