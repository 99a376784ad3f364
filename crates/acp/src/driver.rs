//! [`AcpHarnessDriver`]: the `ama_worker` lane with an ACP agent as the declared process.
//!
//! ```text
//! run(input) ── sandbox of the lease ── duplex port? ── no → SandboxAcpUnsupportedError text
//!    │ read /workspace/.openma/harness-state/acp.json (resume candidate)
//!    │ a system prompt → /workspace/AGENTS.md
//!    │ spawn the declared process (declared env + HarnessEnvSource, e.g. the session token)
//!    │ ACP turn over its stdio (turn.rs); its stderr to the HarnessOutputSink
//!    │ (a runtime with leases: renewed for 90 s every 30 s while the turn runs)
//!    │ turn ended → write acp.json, close stdin, wait briefly, SIGTERM → completed / aborted
//!    └ turn failed → SIGTERM; the error names the agent's exit when it died → the run fails
//! ```
//!
//! A failed turn is an `Err`, so the host's transaction resolves the run `failed` and
//! publishes nothing (reference §2.6); an abort resolves `aborted`.
//!
//! With [`AcpHarnessDriver::with_retention`] (a warm session of `omabox serve`), a turn that
//! ended is not closed: the agent, its connection and its ACP session go into the
//! [`AcpAgentSlot`] as a [`LiveAcpAgent`] (`acp.json` is written all the same, so a cold
//! turn after an eviction resumes the same session).

use crate::events::{AcpEvent, AcpEventSink, EventEmitter};
use crate::live::{AcpAgentSlot, LiveAcpAgent};
use crate::state::{ACP_STATE_PATH, AcpHarnessState};
use crate::turn::{Keep, PermissionPolicy, TurnOutcome, TurnRequest, run_turn};
use crate::wire::transport;
use async_trait::async_trait;
use omabox_contract::AbortSignal;
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
    DuplexKillSignal, SandboxDuplexProcess, SandboxDuplexProcessPort, SandboxLeaseOptions,
    SandboxPort, SandboxProcessExit, run_with_sandbox_lease,
};
use std::sync::Arc;
use std::time::Duration;

/// The contract's `SandboxAcpUnsupportedError` text (reference §10).
pub const SANDBOX_ACP_UNSUPPORTED: &str =
    "sandbox does not support duplex processes required by ACP";

/// How long the agent may take to exit once its stdin closed (or to be seen dead after its
/// connection broke) before it gets SIGTERM. Short: the turn has ended and every agent
/// measured (claude-code-acp, codex-acp) keeps running on a closed stdin, so this is pure
/// wait; an agent persists its session as the turn goes, and SIGTERM lets it exit cleanly.
pub(crate) const EXIT_GRACE: Duration = Duration::from_millis(500);

/// How long the agent's stderr may take to drain after it exited or was signalled.
pub(crate) const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Where the system prompt goes.
pub const AGENTS_MD_PATH: &str = "/workspace/AGENTS.md";

/// The runtime lease the harness holds while a prompt runs, and how often it renews it.
const LEASE_TTL: Duration = Duration::from_secs(90);
const LEASE_RENEWAL: Duration = Duration::from_secs(30);

/// What one ACP turn is asked to do.
#[derive(Debug, Clone)]
pub struct AcpTurnOptions {
    /// The user's prompt text.
    pub prompt: String,
    /// The agent's system prompt, written to `/workspace/AGENTS.md` before it starts (as
    /// OpenMA's acp-sandbox harness does); `None` leaves the workspace's own file alone.
    pub system_prompt: Option<String>,
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
            system_prompt: None,
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
    retain: Option<Arc<AcpAgentSlot>>,
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
            retain: None,
        }
    }

    /// Keeps the agent of a turn that ended in `slot` instead of closing it (module doc).
    pub fn with_retention(mut self, slot: Arc<AcpAgentSlot>) -> Self {
        self.retain = Some(slot);
        self
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
        if let Some(system) = &self.turn.system_prompt {
            sandbox
                .write_file(AGENTS_MD_PATH, system)
                .await
                .map_err(|error| {
                    PortError::new(format!(
                        "cannot write the system prompt to {AGENTS_MD_PATH}: {}",
                        error.message()
                    ))
                })?;
        }
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
        let turn_events = events.clone();
        let Some(slot) = &self.retain else {
            let outcome = under_lease(&*sandbox, &input.signal, move |signal| {
                run_turn(transport(stdin, stdout), request, turn_events, signal, None)
            })
            .await;
            // The connection is closed (the agent's stdin with it): a well-behaved agent exits.
            let exit = tokio::time::timeout(EXIT_GRACE, exited.clone()).await.ok();
            if exit.is_none() {
                let _ = control.kill(DuplexKillSignal::Term).await;
            }
            let _ = tokio::time::timeout(DRAIN_GRACE, stderr).await;
            return self
                .ended(&*sandbox, process, input, &events, outcome, exit)
                .await;
        };
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        let (jobs_tx, jobs_rx) = tokio::sync::mpsc::channel(1);
        let keep = Keep {
            first: first_tx,
            jobs: jobs_rx,
        };
        let connection = tokio::spawn(run_turn(
            transport(stdin, stdout),
            request,
            turn_events,
            input.signal.clone(),
            Some(keep),
        ));
        let mut connection = Some(connection);
        let pending = &mut connection;
        let outcome = under_lease(&*sandbox, &input.signal, move |_| async move {
            // The first turn's outcome: at once when the connection is kept, else when it
            // ended.
            match first_rx.await {
                Ok(outcome) => (outcome, true),
                Err(_) => match pending.take() {
                    Some(task) => (
                        task.await.unwrap_or_else(|error| {
                            Err(crate::turn::AcpTurnError::Connection(error.to_string()))
                        }),
                        false,
                    ),
                    None => (
                        Err(crate::turn::AcpTurnError::Connection(
                            "the ACP connection task is gone".to_owned(),
                        )),
                        false,
                    ),
                },
            }
        })
        .await;
        if let Ok((Ok(TurnOutcome::Ended { session_id, .. }), true)) = &outcome
            && let Some(task) = connection.take()
            && !input.signal.is_aborted()
        {
            slot.put(LiveAcpAgent::new(
                session_id.clone(),
                jobs_tx,
                task,
                control,
                exited,
                stderr,
            ));
            let kept = outcome.map(|(outcome, _)| outcome);
            return self
                .ended(&*sandbox, process, input, &events, kept, None)
                .await;
        }
        // Not kept: close as an unkept turn does.
        drop(jobs_tx);
        if let Some(task) = connection.take() {
            let _ = tokio::time::timeout(EXIT_GRACE, task).await;
        }
        let exit = tokio::time::timeout(EXIT_GRACE, exited.clone()).await.ok();
        if exit.is_none() {
            let _ = control.kill(DuplexKillSignal::Term).await;
        }
        let _ = tokio::time::timeout(DRAIN_GRACE, stderr).await;
        let outcome = outcome.map(|(outcome, _)| outcome);
        self.ended(&*sandbox, process, input, &events, outcome, exit)
            .await
    }

    /// The run's result from the turn's `outcome` (`exit`: the agent's, when it exited);
    /// saves the session for the next run of the session.
    async fn ended(
        &self,
        sandbox: &dyn SandboxPort,
        process: &RuntimeProcessDeclaration,
        input: &RunHarnessInput,
        events: &EventEmitter,
        outcome: Result<Result<TurnOutcome, crate::turn::AcpTurnError>, PortError>,
        exit: Option<Result<SandboxProcessExit, PortError>>,
    ) -> Result<ManagedWorkExecutionResult, PortError> {
        let outcome = outcome?; // the lease was lost: the run fails
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

/// Runs `turn` while renewing the sandbox runtime's lease (90 s, every 30 s) when the
/// runtime has leases; otherwise just runs it. A lost lease aborts the turn's signal and
/// fails with "sandbox runtime <id> lost its lease".
async fn under_lease<T, F, Fut>(
    sandbox: &dyn SandboxPort,
    signal: &AbortSignal,
    turn: F,
) -> Result<T, PortError>
where
    F: FnOnce(AbortSignal) -> Fut,
    Fut: Future<Output = T>,
{
    let Some(runtime) = sandbox
        .as_runtime()
        .filter(|runtime| runtime.runtime_capabilities().lease)
    else {
        return Ok(turn(signal.clone()).await);
    };
    let options = SandboxLeaseOptions {
        ttl_ms: LEASE_TTL.as_millis() as u64,
        interval_ms: Some(LEASE_RENEWAL.as_millis() as u64),
        signal: Some(signal.clone()),
    };
    run_with_sandbox_lease(
        runtime,
        options,
        |signal| async move { Ok(turn(signal).await) },
    )
    .await
    .map_err(PortError::from)
}

/// The sandbox's duplex process port, or the contract's `SandboxAcpUnsupportedError`.
fn duplex_of(sandbox: &dyn SandboxPort) -> Result<&dyn SandboxDuplexProcessPort, PortError> {
    sandbox
        .as_duplex_process()
        .ok_or_else(|| PortError::capability(SANDBOX_ACP_UNSUPPORTED))
}

pub(crate) fn describe_exit(exit: &SandboxProcessExit) -> String {
    let how = match (&exit.code, &exit.signal) {
        (Some(code), _) => format!("code {code}"),
        (None, Some(signal)) => format!("signal {signal}"),
        (None, None) => "status unknown".to_owned(),
    };
    match exit.out_of_memory {
        Some(oom) => format!("{how}, {oom}"),
        None => how,
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

    /// A runtime whose lease renewals are counted; renewals fail from `fail_from` on.
    struct LeasedSandbox {
        lease: bool,
        renewals: std::sync::atomic::AtomicU32,
        fail_from: u32,
    }

    impl LeasedSandbox {
        fn new(lease: bool, fail_from: u32) -> Self {
            Self {
                lease,
                renewals: Default::default(),
                fail_from,
            }
        }

        fn renewals(&self) -> u32 {
            self.renewals.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    #[async_trait]
    impl SandboxPort for LeasedSandbox {
        async fn exec(&self, _: &str, _: Option<u64>) -> Result<String, PortError> {
            Ok(String::new())
        }
        async fn read_file(&self, _: &str) -> Result<String, PortError> {
            Ok(String::new())
        }
        async fn write_file(&self, path: &str, _: &str) -> Result<String, PortError> {
            Ok(path.to_owned())
        }
        fn as_runtime(&self) -> Option<&dyn omabox_sandbox::SandboxRuntimePort> {
            Some(self)
        }
    }

    #[async_trait]
    impl omabox_sandbox::SandboxRuntimePort for LeasedSandbox {
        fn runtime_handle(&self) -> omabox_sandbox::SandboxRuntimeHandle {
            omabox_sandbox::SandboxRuntimeHandle {
                provider: "fake".into(),
                runtime_id: "rt-1".into(),
            }
        }
        fn runtime_capabilities(&self) -> omabox_sandbox::SandboxRuntimeCapabilities {
            omabox_sandbox::SandboxRuntimeCapabilities {
                lease: self.lease,
                suspend: vec![],
                checkpoint: vec![],
            }
        }
        async fn status(&self) -> Result<omabox_sandbox::SandboxRuntimeStatus, PortError> {
            Ok(omabox_sandbox::SandboxRuntimeStatus::Running)
        }
        async fn renew_lease(&self, ttl_ms: u64) -> Result<(), PortError> {
            assert_eq!(ttl_ms, 90_000);
            let n = self
                .renewals
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n >= self.fail_from {
                return Err(PortError::new("gone"));
            }
            Ok(())
        }
        async fn suspend(
            &self,
            _: omabox_sandbox::SandboxCheckpointKind,
        ) -> Result<omabox_sandbox::SandboxCheckpointHandle, PortError> {
            Err(PortError::new("unsupported"))
        }
        async fn resume(
            &self,
            _: &omabox_sandbox::SandboxCheckpointHandle,
        ) -> Result<(), PortError> {
            Err(PortError::new("unsupported"))
        }
        async fn checkpoint(
            &self,
            _: omabox_sandbox::SandboxCheckpointKind,
            _: Option<&str>,
        ) -> Result<omabox_sandbox::SandboxCheckpointHandle, PortError> {
            Err(PortError::new("unsupported"))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_leased_runtime_is_renewed_every_30_s_while_the_turn_runs() {
        let sandbox = LeasedSandbox::new(true, u32::MAX);
        let signal = omabox_contract::AbortController::new().signal();
        let turn = |_| async {
            tokio::time::sleep(Duration::from_secs(100)).await;
            "ended"
        };
        assert_eq!(under_lease(&sandbox, &signal, turn).await.unwrap(), "ended");
        // Once before the turn, then at 30, 60 and 90 s.
        assert_eq!(sandbox.renewals(), 4);

        let unleased = LeasedSandbox::new(false, 0);
        let turn = |_| async { "ended" };
        assert_eq!(
            under_lease(&unleased, &signal, turn).await.unwrap(),
            "ended"
        );
        assert_eq!(unleased.renewals(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_lease_aborts_the_turn_and_fails_the_run() {
        let sandbox = LeasedSandbox::new(true, 2);
        let signal = omabox_contract::AbortController::new().signal();
        let turn = |_| async {
            tokio::time::sleep(Duration::from_secs(600)).await;
            "ended"
        };
        let error = under_lease(&sandbox, &signal, turn).await.unwrap_err();
        assert_eq!(error.message(), "sandbox runtime rt-1 lost its lease");
        assert_eq!(sandbox.renewals(), 3);
    }

    #[test]
    fn exits_are_described() {
        let exit = |code, signal: Option<&str>| SandboxProcessExit {
            code,
            signal: signal.map(str::to_owned),
            out_of_memory: None,
        };
        assert_eq!(describe_exit(&exit(Some(3), None)), "code 3");
        assert_eq!(
            describe_exit(&exit(None, Some("SIGKILL"))),
            "signal SIGKILL"
        );
        assert_eq!(describe_exit(&exit(None, None)), "status unknown");
        let oom = SandboxProcessExit {
            out_of_memory: Some(omabox_sandbox::OutOfMemory {
                limit_bytes: Some(2 << 30),
            }),
            ..exit(None, Some("SIGKILL"))
        };
        assert_eq!(
            describe_exit(&oom),
            "signal SIGKILL, killed: out of memory (limit 2048 MiB)"
        );
    }
}
