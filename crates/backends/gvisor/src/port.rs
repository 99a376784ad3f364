//! A gvisor sandbox behind the tool-sandbox seam (`SandboxPort`): exec, files, destroy.
//!
//! The exec text follows the linux backend's form: stdout then stderr, then
//! `[timed out after N ms]` and `[exit N]` lines (a shell's numbering; 128+n for a
//! signal). Never: wait for a wedged agent past the timeout plus a grace.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use omabox_agent::client::ExecOutput;
use omabox_agent::{ClientError, ExecRequest};
use omabox_contract::PortError;
use omabox_sandbox::{SandboxDestroyPort, SandboxPort};

use crate::{GvisorError, GvisorSandbox};

/// A command's default timeout.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long past a command's timeout the agent may take to report it.
const AGENT_GRACE: Duration = Duration::from_secs(10);
/// Exit number of a command killed by its timeout.
const TIMEOUT_EXIT: i32 = 124;

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

    fn agent_error(&self, op: &str, target: &str) -> impl FnOnce(ClientError) -> PortError {
        let id = self.sandbox.id().to_owned();
        let op = op.to_owned();
        let target = target.to_owned();
        move |e| {
            let message = format!(
                "{op} {target:?} in gvisor sandbox {id}: {}",
                chain(&GvisorError::Agent {
                    id: id.clone(),
                    source: e
                })
            );
            PortError::new(message)
        }
    }
}

fn chain(e: &dyn std::error::Error) -> String {
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

/// The contract's combined output of one exec.
fn format_output(output: &ExecOutput, timeout: Duration) -> String {
    let mut text = output.combined();
    if output.truncated {
        let _ = write!(
            text,
            "\n[output truncated: more than {} bytes]",
            omabox_agent::DEFAULT_MAX_EXEC_OUTPUT
        );
    }
    let status = if output.exit.timed_out {
        let _ = write!(text, "\n[timed out after {} ms]", timeout.as_millis());
        TIMEOUT_EXIT
    } else {
        omabox_contract::signals::shell_exit_code(output.exit.code, output.exit.signal.as_deref())
            .map_or(output.exit.code.unwrap_or(1), i32::from)
    };
    if status != 0 {
        let _ = write!(text, "\n[exit {status}]");
    }
    text
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
        Ok(format_output(&output, timeout))
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

    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        Some(self)
    }
}

#[async_trait]
impl SandboxDestroyPort for GvisorSandboxPort {
    async fn destroy(&self) -> Result<(), PortError> {
        self.sandbox.destroy().await.map_err(port_error)
    }
}
