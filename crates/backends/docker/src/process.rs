//! Process controls behind the seam: signalling a duplex process (SIGTERM, then SIGKILL
//! after a grace period) and a background one (kill, logs, status). They only send
//! agent requests: must never signal anything on the host.
//!
//! The same as the linux backend's `port/process.rs` but for the error type and OOM notes
//! (a container's OOM kills are not counted per process): a crate both backends could share
//! would need `omabox-sandbox` and `omabox-agent` together, which neither of them may name.

use std::time::Duration;

use async_trait::async_trait;
use futures::future::{BoxFuture, Shared};
use omabox_agent::client::{BackgroundProcess, ClientError, ProcessKiller};
use omabox_agent::message::{BackgroundStatus, ProcessExit};
use omabox_contract::PortError;
use omabox_sandbox::{
    DuplexKillSignal, ProcessLogs, ProcessSignal, ProcessStatus, SandboxDuplexProcessControl,
    SandboxProcessControl, SandboxProcessExit,
};

use crate::error::DockerError;

/// How long a duplex kill waits for the exit before escalating to `SIGKILL` (and after
/// it).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// The port's exit of a process the agent reported as `exit` (no OOM note: see the module
/// doc).
pub(crate) fn sandbox_exit(exit: &ProcessExit) -> SandboxProcessExit {
    SandboxProcessExit {
        code: exit.code,
        signal: exit.signal.clone(),
        out_of_memory: None,
    }
}

pub(crate) type ExitFuture = Shared<BoxFuture<'static, Result<SandboxProcessExit, PortError>>>;

/// Signals a duplex process and waits for it to go.
pub(crate) struct DuplexControl {
    pub(crate) killer: ProcessKiller,
    pub(crate) exited: ExitFuture,
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
            .map_err(|source| DockerError::Agent {
                op: "kill",
                target: signal.as_str().to_owned(),
                source,
            })?;
        if self.exited_within(KILL_WAIT).await {
            return Ok(());
        }
        if signal != DuplexKillSignal::Kill {
            self.killer
                .kill("SIGKILL")
                .map_err(|source| DockerError::Agent {
                    op: "kill",
                    target: "SIGKILL".to_owned(),
                    source,
                })?;
            self.exited_within(KILL_WAIT).await;
        }
        Ok(())
    }
}

/// A background process kept by the agent.
pub(crate) struct BackgroundControl {
    pub(crate) process: BackgroundProcess,
}

impl BackgroundControl {
    fn error(&self, op: &'static str) -> impl FnOnce(ClientError) -> PortError {
        let target = self.process.id().to_owned();
        move |source| DockerError::Agent { op, target, source }.into()
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
