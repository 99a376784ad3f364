//! [`AcpHarnessDriver`]: the `ama_worker` lane with an ACP agent as the declared process.
//!
//! ```text
//! run(input) ── sandbox of the lease ── duplex port? ── no → SandboxAcpUnsupportedError text
//!    │ read /workspace/.openma/harness-state/acp.json (resume candidate)
//!    │ spawn the declared process (declared env + HarnessEnvSource, e.g. the session token)
//!    │ ACP turn over its stdio (turn.rs); its stderr to the HarnessOutputSink
//!    │ turn ended → write acp.json, close stdin, wait briefly, SIGTERM → completed / aborted
//!    └ turn failed → SIGTERM; the error names the agent's exit when it died → the run fails
//! ```
//!
//! A failed turn is an `Err`, so the host's transaction resolves the run `failed` and
//! publishes nothing (reference §2.6); an abort resolves `aborted`.

use crate::events::{AcpEvent, AcpEventSink, EventEmitter};
use crate::state::{ACP_STATE_PATH, AcpHarnessState};
use crate::turn::{PermissionPolicy, TurnOutcome, TurnRequest, run_turn};
use crate::wire::transport;
use async_trait::async_trait;
use omabox_contract::{
    HarnessDriverDeclaration, HarnessDriverType, ManagedWorkExecutionResult, PortError,
    RunHarnessInput, RuntimeProcessDeclaration, RuntimeResourceScope,
    SandboxHarnessDriverCapabilities, SandboxHarnessDriverPort,
};
use omabox_sandbox::managed::{
    HarnessEnvSource, HarnessOutputSink, HarnessStream, ProviderManagedRuntime, drain,
    harness_process_spec,
};
use omabox_sandbox::{
    DuplexKillSignal, SandboxDuplexProcess, SandboxDuplexProcessPort, SandboxPort,
    SandboxProcessExit,
};
use std::sync::Arc;
use std::time::Duration;

/// The contract's `SandboxAcpUnsupportedError` text (reference §10).
pub const SANDBOX_ACP_UNSUPPORTED: &str =
    "sandbox does not support duplex processes required by ACP";

/// How long the agent may take to exit once its stdin closed (or to be seen dead after its
/// connection broke) before it gets SIGTERM.
const EXIT_GRACE: Duration = Duration::from_secs(2);

/// What one ACP turn is asked to do.
#[derive(Debug, Clone)]
pub struct AcpTurnOptions {
    /// The user's prompt text.
    pub prompt: String,
    /// How the agent's permission requests are answered.
    pub permission: PermissionPolicy,
    /// How long `initialize` may take, and then `session/new` or `session/load` (default
    /// 60 s each: agents started through a package runner can be slow).
    pub initialize_timeout: Duration,
    /// How long the prompt's turn may take before it is cancelled and the run fails
    /// (default 30 min; OpenMA's in-worker harness uses 5 min per turn, but here the turn is
    /// the whole work item).
    pub turn_timeout: Duration,
    /// How long the agent may take to end its turn after `session/cancel` (default 10 s).
    pub cancel_grace: Duration,
}

impl AcpTurnOptions {
    /// Options with the defaults for `prompt`.
    pub fn new(prompt: impl Into<String>) -> Self {
        Self {
            prompt: prompt.into(),
            permission: PermissionPolicy::Allow,
            initialize_timeout: Duration::from_secs(60),
            turn_timeout: Duration::from_secs(30 * 60),
            cancel_grace: Duration::from_secs(10),
        }
    }
}

/// The ACP harness over a runtime's duplex processes (module doc).
#[derive(Clone)]
pub struct AcpHarnessDriver {
    runtime: Arc<ProviderManagedRuntime>,
    turn: AcpTurnOptions,
    events: Option<Arc<dyn AcpEventSink>>,
    output: Option<Arc<dyn HarnessOutputSink>>,
    harness_env: Option<Arc<dyn HarnessEnvSource>>,
}

impl std::fmt::Debug for AcpHarnessDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpHarnessDriver")
            .field("provider", &self.runtime.provider_name())
            .field("permission", &self.turn.permission)
            .field("initialize_timeout", &self.turn.initialize_timeout)
            .finish_non_exhaustive()
    }
}

impl AcpHarnessDriver {
    /// A driver over `runtime`'s sandboxes running one turn as `turn` says.
    pub fn new(runtime: Arc<ProviderManagedRuntime>, turn: AcpTurnOptions) -> Self {
        Self {
            runtime,
            turn,
            events: None,
            output: None,
            harness_env: None,
        }
    }

    /// Sends the turn's events to `sink` as they happen.
    pub fn with_events(mut self, sink: Arc<dyn AcpEventSink>) -> Self {
        self.events = Some(sink);
        self
    }

    /// Sends the agent's stderr to `output` (its stdout is the protocol).
    pub fn with_output(mut self, output: Arc<dyn HarnessOutputSink>) -> Self {
        self.output = Some(output);
        self
    }

    /// Merges `source`'s variables over the agent's declared env at spawn time.
    pub fn with_harness_env(mut self, source: Arc<dyn HarnessEnvSource>) -> Self {
        self.harness_env = Some(source);
        self
    }

    /// The saved session to resume, if the state file is there and belongs to `process`.
    async fn saved_session(
        &self,
        sandbox: &dyn SandboxPort,
        process: &RuntimeProcessDeclaration,
        events: &EventEmitter,
    ) -> Option<String> {
        // A missing file is the common case (a new session): not worth a warning.
        let text = sandbox.read_file(ACP_STATE_PATH).await.ok()?;
        match AcpHarnessState::resumable(&text, process) {
            Ok(resume) => resume,
            Err(reason) => {
                events.emit(AcpEvent::Warning {
                    message: format!("ignoring {ACP_STATE_PATH}: {reason}"),
                });
                None
            }
        }
    }

    async fn turn(
        &self,
        sandbox: Arc<dyn SandboxPort>,
        process: &RuntimeProcessDeclaration,
        input: &RunHarnessInput,
    ) -> Result<ManagedWorkExecutionResult, PortError> {
        let duplex = duplex_of(&*sandbox)?;
        let events = EventEmitter::new(self.events.clone());
        let resume = self.saved_session(&*sandbox, process, &events).await;
        let spec = harness_process_spec(
            process,
            self.harness_env.as_ref(),
            &input.scope,
            Some(input.fence.generation),
        );
        let child = duplex.spawn_duplex_process(spec).await?;
        let exited = child.exited();
        let control = child.control();
        let SandboxDuplexProcess {
            stdin,
            stdout,
            stderr,
            ..
        } = child;
        let stderr = tokio::spawn(drain(stderr, HarnessStream::Stderr, self.output.clone()));
        let request = TurnRequest {
            prompt: self.turn.prompt.clone(),
            cwd: process
                .cwd
                .clone()
                .unwrap_or_else(|| input.workspace_path.clone()),
            resume,
            permission: self.turn.permission,
            initialize_timeout: self.turn.initialize_timeout,
            turn_timeout: self.turn.turn_timeout,
            cancel_grace: self.turn.cancel_grace,
        };
        let outcome = run_turn(
            transport(stdin, stdout),
            request,
            events.clone(),
            input.signal.clone(),
        )
        .await;
        // The connection is closed (the agent's stdin with it): a well-behaved agent exits.
        let exit = tokio::time::timeout(EXIT_GRACE, exited.clone()).await.ok();
        if exit.is_none() {
            let _ = control.kill(DuplexKillSignal::Term).await;
        }
        let _ = tokio::time::timeout(EXIT_GRACE, stderr).await;
        match outcome {
            Ok(TurnOutcome::Ended {
                session_id,
                aborted,
                ..
            }) => {
                let state = AcpHarnessState::new(process, &session_id).to_json();
                if let Err(error) = sandbox.write_file(ACP_STATE_PATH, &state).await {
                    events.emit(AcpEvent::Warning {
                        message: format!(
                            "the ACP session cannot be resumed next run: writing {ACP_STATE_PATH} failed: {}",
                            error.message()
                        ),
                    });
                }
                Ok(if aborted || input.signal.is_aborted() {
                    ManagedWorkExecutionResult::Aborted
                } else {
                    ManagedWorkExecutionResult::Completed
                })
            }
            Ok(TurnOutcome::AbortedBeforePrompt) => Ok(ManagedWorkExecutionResult::Aborted),
            Err(_) if input.signal.is_aborted() => Ok(ManagedWorkExecutionResult::Aborted),
            Err(error) => Err(PortError::new(match exit {
                Some(Ok(exit)) if !error.is_timeout() => format!(
                    "the ACP agent exited ({}) before its turn ended: {error}",
                    describe_exit(&exit)
                ),
                _ => error.to_string(),
            })),
        }
    }
}

/// The sandbox's duplex process port, or the contract's `SandboxAcpUnsupportedError`.
fn duplex_of(sandbox: &dyn SandboxPort) -> Result<&dyn SandboxDuplexProcessPort, PortError> {
    sandbox
        .as_duplex_process()
        .ok_or_else(|| PortError::capability(SANDBOX_ACP_UNSUPPORTED))
}

fn describe_exit(exit: &SandboxProcessExit) -> String {
    match (&exit.code, &exit.signal) {
        (Some(code), _) => format!("code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "status unknown".to_owned(),
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for AcpHarnessDriver {
    async fn driver_capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        let drivers = if self.runtime.provider().capabilities().duplex_process {
            vec![HarnessDriverType::AmaWorker]
        } else {
            Vec::new()
        };
        Ok(SandboxHarnessDriverCapabilities { drivers })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        let HarnessDriverDeclaration::AmaWorker { process } = &input.driver else {
            return Err(PortError::new(format!(
                "the ACP harness cannot run {}",
                input.driver.driver_type()
            )));
        };
        input.signal.throw_if_aborted()?;
        let sandbox = self.runtime.sandbox(&input.sandbox).await?;
        self.turn(sandbox, process, &input).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox without duplex processes.
    struct PlainSandbox;

    #[async_trait]
    impl SandboxPort for PlainSandbox {
        async fn exec(&self, _: &str, _: Option<u64>) -> Result<String, PortError> {
            Ok(String::new())
        }
        async fn read_file(&self, _: &str) -> Result<String, PortError> {
            Ok(String::new())
        }
        async fn write_file(&self, path: &str, _: &str) -> Result<String, PortError> {
            Ok(path.to_owned())
        }
    }

    #[test]
    fn a_sandbox_without_duplex_processes_cannot_run_acp() {
        let error = duplex_of(&PlainSandbox).err().expect("unsupported");
        assert_eq!(
            error.message(),
            "sandbox does not support duplex processes required by ACP"
        );
    }

    #[test]
    fn exits_are_described() {
        let exit = |code, signal: Option<&str>| SandboxProcessExit {
            code,
            signal: signal.map(str::to_owned),
        };
        assert_eq!(describe_exit(&exit(Some(3), None)), "code 3");
        assert_eq!(
            describe_exit(&exit(None, Some("SIGKILL"))),
            "signal SIGKILL"
        );
        assert_eq!(describe_exit(&exit(None, None)), "status unknown");
    }
}
