//! A warm ACP agent: the process, its connection and its ACP session kept after a turn
//! (`omabox serve`'s retained runtime, issue 31), so the session's next turn is one
//! `session/prompt` on it instead of a new sandbox, a new agent and `session/resume`.
//!
//! ```text
//!   AcpHarnessDriver (with_retention) ─ turn ended ─► AcpAgentSlot::put(LiveAcpAgent)
//!   next turn: WarmAcpHarness::run ─► LiveAcpAgent::prompt ─► session/prompt (same session)
//!   eviction, failure, shutdown: LiveAcpAgent::stop ─► close stdin ─► SIGTERM after a grace
//! ```
//!
//! The agent read its environment (the session token among it) once, at spawn: a warm
//! agent keeps the token of the claim it was spawned under, so its holder keeps that claim
//! (the fence) for as long as the agent lives. A prompt that fails or is cancelled ends the
//! connection: the next turn is cold. What this must never do: send a prompt to an agent of
//! another session (the slot belongs to one run, the agent to one sandbox), or leave an agent
//! running after `stop`.

use crate::driver::{AcpTurnOptions, DRAIN_GRACE, EXIT_GRACE};
use crate::events::{AcpEvent, AcpEventSink, EventEmitter};
use crate::turn::{AcpTurnError, PromptJob, TurnOutcome};
use async_trait::async_trait;
use futures::FutureExt as _;
use omabox_contract::{
    AbortSignal, HarnessDriverType, ManagedWorkExecutionResult, PortError, RunHarnessInput,
    RuntimeResourceScope, SandboxHarnessDriverCapabilities, SandboxHarnessDriverPort,
};
use omabox_sandbox::{DuplexKillSignal, SandboxDuplexProcessControl, SandboxExitFuture};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Where a retaining [`crate::AcpHarnessDriver`] leaves the agent of a turn that ended.
#[derive(Default)]
pub struct AcpAgentSlot(Mutex<Option<LiveAcpAgent>>);

impl std::fmt::Debug for AcpAgentSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpAgentSlot")
            .field("full", &self.0.lock().is_ok_and(|slot| slot.is_some()))
            .finish()
    }
}

impl AcpAgentSlot {
    /// An empty slot.
    pub fn new() -> Self {
        Self::default()
    }

    pub(crate) fn put(&self, agent: LiveAcpAgent) {
        let old = self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(agent);
        if let Some(old) = old {
            tokio::spawn(old.stop());
        }
    }

    /// Whether a live agent is in the slot.
    pub fn is_full(&self) -> bool {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// The agent, if a turn left one.
    pub fn take(&self) -> Option<LiveAcpAgent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

/// An agent whose connection stays open between turns.
pub struct LiveAcpAgent {
    session_id: String,
    jobs: mpsc::Sender<PromptJob>,
    connection: JoinHandle<Result<TurnOutcome, AcpTurnError>>,
    control: Arc<dyn SandboxDuplexProcessControl>,
    exited: SandboxExitFuture,
    stderr: JoinHandle<()>,
    /// Set when a prompt found the agent gone (exited, its connection closed): the turn
    /// failed for that alone and may run again cold.
    lost: AtomicBool,
}

impl std::fmt::Debug for LiveAcpAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAcpAgent")
            .field("session_id", &self.session_id)
            .finish_non_exhaustive()
    }
}

impl LiveAcpAgent {
    pub(crate) fn new(
        session_id: String,
        jobs: mpsc::Sender<PromptJob>,
        connection: JoinHandle<Result<TurnOutcome, AcpTurnError>>,
        control: Arc<dyn SandboxDuplexProcessControl>,
        exited: SandboxExitFuture,
        stderr: JoinHandle<()>,
    ) -> Self {
        Self {
            session_id,
            jobs,
            connection,
            control,
            exited,
            stderr,
            lost: AtomicBool::new(false),
        }
    }

    /// Whether a prompt failed because the agent was gone rather than because of the turn.
    pub fn was_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    fn gone(&self, message: String) -> PortError {
        self.lost.store(true, Ordering::SeqCst);
        PortError::new(message)
    }

    /// The ACP session every prompt goes to.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// Whether the agent still runs and its connection is open (a crashed or disconnected
    /// agent is not reused).
    pub fn is_alive(&self) -> bool {
        self.exited.clone().now_or_never().is_none()
            && !self.connection.is_finished()
            && !self.jobs.is_closed()
    }

    /// One turn: `turn.prompt` in the agent's session, its events to `events`, cancelled by
    /// `signal` (`turn`'s timeouts apply). `Err` when the agent failed the prompt or is gone.
    pub async fn prompt(
        &self,
        turn: &AcpTurnOptions,
        events: Option<Arc<dyn AcpEventSink>>,
        signal: &AbortSignal,
    ) -> Result<ManagedWorkExecutionResult, PortError> {
        let events = EventEmitter::new(events);
        events.emit(AcpEvent::Session {
            acp_session_id: self.session_id.clone(),
            resumed: true,
        });
        let (reply, answer) = oneshot::channel();
        let job = PromptJob {
            prompt: turn.prompt.clone(),
            turn_timeout: turn.turn_timeout,
            cancel_grace: turn.cancel_grace,
            events,
            signal: signal.clone(),
            reply,
        };
        if self.jobs.send(job).await.is_err() {
            return Err(self.gone("the warm ACP agent's connection is closed".to_owned()));
        }
        let outcome = tokio::select! {
            answer = answer => answer.map_err(|_| self.gone("the warm ACP agent's connection closed during its turn".to_owned()))?,
            exit = self.exited.clone() => {
                return Err(self.gone(match exit {
                    Ok(exit) => format!("the warm ACP agent exited ({}) before its turn ended", crate::driver::describe_exit(&exit)),
                    Err(error) => format!("the warm ACP agent was lost: {}", error.message()),
                }));
            }
        };
        match outcome {
            Ok(TurnOutcome::Ended { aborted, .. }) => Ok(if aborted || signal.is_aborted() {
                ManagedWorkExecutionResult::Aborted
            } else {
                ManagedWorkExecutionResult::Completed
            }),
            Ok(TurnOutcome::AbortedBeforePrompt) => Ok(ManagedWorkExecutionResult::Aborted),
            Err(_) if signal.is_aborted() => Ok(ManagedWorkExecutionResult::Aborted),
            // A broken connection is mostly an agent that died: it is lost if it exits now.
            Err(error) => match tokio::time::timeout(EXIT_GRACE, self.exited.clone()).await {
                Ok(_) => Err(self.gone(format!(
                    "the warm ACP agent exited during its turn: {error}"
                ))),
                Err(_) => Err(PortError::new(error.to_string())),
            },
        }
    }

    /// Ends the agent: its connection closes (stdin with it), then SIGTERM if it is still
    /// running after a short grace, then its stderr drains (bounded).
    pub async fn stop(self) {
        let Self {
            jobs,
            connection,
            control,
            exited,
            stderr,
            ..
        } = self;
        drop(jobs);
        let _ = tokio::time::timeout(EXIT_GRACE, connection).await;
        if tokio::time::timeout(EXIT_GRACE, exited).await.is_err() {
            let _ = control.kill(DuplexKillSignal::Term).await;
        }
        let _ = tokio::time::timeout(DRAIN_GRACE, stderr).await;
    }
}

/// The harness of a warm turn: the session's next prompt on its [`LiveAcpAgent`].
pub struct WarmAcpHarness {
    agent: Arc<LiveAcpAgent>,
    turn: AcpTurnOptions,
    events: Option<Arc<dyn AcpEventSink>>,
}

impl std::fmt::Debug for WarmAcpHarness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmAcpHarness")
            .field("agent", &self.agent)
            .finish_non_exhaustive()
    }
}

impl WarmAcpHarness {
    /// `turn` on `agent`, its events to `events`.
    pub fn new(
        agent: Arc<LiveAcpAgent>,
        turn: AcpTurnOptions,
        events: Option<Arc<dyn AcpEventSink>>,
    ) -> Self {
        Self {
            agent,
            turn,
            events,
        }
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for WarmAcpHarness {
    async fn driver_capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        Ok(SandboxHarnessDriverCapabilities {
            drivers: vec![HarnessDriverType::AmaWorker],
        })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        input.signal.throw_if_aborted()?;
        self.agent
            .prompt(&self.turn, self.events.clone(), &input.signal)
            .await
    }
}
