//! Process controls behind the seam: signalling a duplex process (SIGTERM, then SIGKILL
//! after a grace period) and a background one (kill, logs, status). They only send
//! agent requests: must never signal anything on the host. A backend gives each control
//! its [`AgentErrorFn`], so an agent's refusal becomes that backend's error text and kind.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::{BoxFuture, Shared};
use omabox_agent::client::{BackgroundProcess, ClientError, ProcessKiller};
use omabox_agent::message::{BackgroundStatus, ProcessExit};
use omabox_contract::PortError;
use omabox_sandbox::{
    DuplexKillSignal, OutOfMemory, ProcessLogs, ProcessSignal, ProcessStatus,
    SandboxDuplexProcessControl, SandboxProcessControl, SandboxProcessExit,
};

/// How a backend turns an agent's failure of `op` on `target` into a port error (its own
/// error type's text and kind).
pub type AgentErrorFn = fn(op: &'static str, target: String, source: ClientError) -> PortError;

/// How long a duplex kill waits for the exit before escalating to `SIGKILL` (and after
/// it).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// The port's exit of a process the agent reported as `exit`; `out_of_memory` when the
/// sandbox's memory cgroup counted an OOM kill while it ran, taken only for a SIGKILL (what
/// the OOM killer sends); `None` for a backend that counts no OOM kill per process.
pub fn sandbox_exit(exit: &ProcessExit, out_of_memory: Option<OutOfMemory>) -> SandboxProcessExit {
    let killed = exit.signal.as_deref() == Some("SIGKILL") || exit.code == Some(137);
    SandboxProcessExit {
        code: exit.code,
        signal: exit.signal.clone(),
        out_of_memory: out_of_memory.filter(|_| killed),
    }
}

/// A process's exit, awaited by any number of callers.
pub type ExitFuture = Shared<BoxFuture<'static, Result<SandboxProcessExit, PortError>>>;

/// Signals a duplex process and waits for it to go.
pub struct DuplexControl {
    /// Sends the process group a signal.
    pub killer: ProcessKiller,
    /// Its exit.
    pub exited: ExitFuture,
    /// The backend's error for a failed kill.
    pub agent_error: AgentErrorFn,
}

impl std::fmt::Debug for DuplexControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DuplexControl").finish_non_exhaustive()
    }
}

impl DuplexControl {
    async fn exited_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.exited.clone())
            .await
            .is_ok()
    }
}

#[async_trait]
impl SandboxDuplexProcessControl for DuplexControl {
    /// Sends `signal` to the process group; after a `SIGTERM` that is not obeyed within
    /// two seconds, sends `SIGKILL`. Returns once the process exited or the waits ran out
    /// (an exit is only observed after stdout and stderr were read to their end).
    async fn kill(&self, signal: DuplexKillSignal) -> Result<(), PortError> {
        if self.exited.peek().is_some() {
            return Ok(());
        }
        self.killer
            .kill(signal.as_str())
            .map_err(|source| (self.agent_error)("kill", signal.as_str().to_owned(), source))?;
        if self.exited_within(KILL_WAIT).await {
            return Ok(());
        }
        if signal != DuplexKillSignal::Kill {
            self.killer
                .kill("SIGKILL")
                .map_err(|source| (self.agent_error)("kill", "SIGKILL".to_owned(), source))?;
            self.exited_within(KILL_WAIT).await;
        }
        Ok(())
    }
}

/// A background process kept by the agent.
pub struct BackgroundControl {
    /// The agent's handle of it.
    pub process: BackgroundProcess,
    /// The backend's error for a failed request.
    pub agent_error: AgentErrorFn,
}

impl std::fmt::Debug for BackgroundControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundControl")
            .field("id", &self.process.id())
            .finish_non_exhaustive()
    }
}

impl BackgroundControl {
    fn error(&self, op: &'static str) -> impl FnOnce(ClientError) -> PortError {
        let (target, agent_error) = (self.process.id().to_owned(), self.agent_error);
        move |source| agent_error(op, target, source)
    }
}

#[async_trait]
impl SandboxProcessControl for BackgroundControl {
    async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError> {
        self.process
            .kill(signal.as_str())
            .await
            .map_err(self.error("kill background process"))
    }

    async fn logs(&self) -> Result<ProcessLogs, PortError> {
        let logs = self
            .process
            .logs()
            .await
            .map_err(self.error("read logs of background process"))?;
        Ok(ProcessLogs {
            stdout: logs.stdout,
            stderr: logs.stderr,
        })
    }

    async fn status(&self) -> Result<ProcessStatus, PortError> {
        let status = self
            .process
            .status()
            .await
            .map_err(self.error("read status of background process"))?;
        Ok(match status {
            BackgroundStatus::Running => ProcessStatus::Running,
            BackgroundStatus::Completed => ProcessStatus::Completed,
            BackgroundStatus::Error => ProcessStatus::Error,
            BackgroundStatus::Killed => ProcessStatus::Killed,
        })
    }
}
