//! [`FakeHarness`]: a scripted `SandboxHarnessDriverPort` with the behaviours the catalogue
//! needs: complete, fail, wait for abort, and request live-turn checkpoints.
//!
//! Defaults: lanes `[ama_worker]`; `run` → `completed`.

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, HarnessDriverType, LiveTurnCheckpoint, ManagedWorkExecutionResult, PortError,
    RunHarnessInput, RuntimeResourceScope, SandboxHarnessDriverCapabilities,
    SandboxHarnessDriverPort,
};

impl WithSignal for RunHarnessInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// A live checkpoint request with no turn id.
pub fn live_checkpoint(checkpoint_id: &str, session_id: &str) -> LiveTurnCheckpoint {
    LiveTurnCheckpoint {
        checkpoint_id: checkpoint_id.to_owned(),
        session_id: session_id.to_owned(),
        turn_id: None,
    }
}

/// Calls the host's live-checkpoint callback; a harness without one fails.
pub async fn request_checkpoint(
    input: &RunHarnessInput,
    request: LiveTurnCheckpoint,
) -> Result<(), PortError> {
    match &input.checkpoint {
        Some(callback) => callback(request).await,
        None => Err(PortError::new(
            "the host passed no live checkpoint callback",
        )),
    }
}

/// A scripted harness driver.
#[derive(Debug)]
pub struct FakeHarness {
    log: CallLog,
    /// `driverCapabilities`.
    pub driver_capabilities: Step<RuntimeResourceScope, SandboxHarnessDriverCapabilities>,
    /// `run`.
    pub run: Step<RunHarnessInput, ManagedWorkExecutionResult>,
}

impl FakeHarness {
    /// An `ama_worker` harness that completes.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            driver_capabilities: Step::new(|_| async {
                Ok(SandboxHarnessDriverCapabilities {
                    drivers: vec![HarnessDriverType::AmaWorker],
                })
            }),
            run: Step::new(|_| async { Ok(ManagedWorkExecutionResult::Completed) }),
        }
    }

    /// Advertises exactly `drivers`.
    pub fn advertises(&self, drivers: Vec<HarnessDriverType>) {
        self.driver_capabilities
            .returns(SandboxHarnessDriverCapabilities { drivers });
    }

    /// `run` requests each live checkpoint in order (stopping at the first error, which it
    /// returns), then completes.
    pub fn requests_checkpoints(&self, requests: Vec<LiveTurnCheckpoint>) {
        self.run.set(move |input: RunHarnessInput| {
            let requests = requests.clone();
            async move {
                for request in requests {
                    request_checkpoint(&input, request).await?;
                }
                Ok(ManagedWorkExecutionResult::Completed)
            }
        });
    }

    /// `run` blocks until its signal aborts, then reports `aborted` (a cooperative hand).
    pub fn waits_for_abort(&self) {
        self.run
            .waits_for_abort(ManagedWorkExecutionResult::Aborted);
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for FakeHarness {
    async fn driver_capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        self.log.push(format!("{}.capabilities", names::HARNESS));
        self.driver_capabilities.invoke(scope.clone()).await
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        self.log.push(format!("{}.run", names::HARNESS));
        self.run.invoke(input).await
    }
}
