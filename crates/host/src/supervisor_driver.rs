//! The supervised harness driver: runs the `openma_supervised` lane over any
//! [`HarnessSupervisorTransportPort`] (stdio, RPC, …).
//!
//! ```text
//!   open ──► send start ──► wait ready ──► loop { heartbeat | checkpoint | completed 0 }
//!                 (readyTimeoutMs/event)    (heartbeatTimeoutMs/event, "harness heartbeat")
//!        ──► send drain ──► wait drained ──► completed
//!                           (drainTimeoutMs/event, "drain")
//!   any failure: cancelled ? send stop{aborted}, resolve aborted
//!                          : send stop{failed},  fail with the original error
//!   always:      abort the internal signal, close the channel (errors ignored)
//! ```
//!
//! The fence is never sent to the supervisor: the `start` command carries the scope, the
//! harness identity and the two mount paths only.

use futures::StreamExt;
use omabox_contract::{
    AbortController, AbortSignal, HarnessDriverDeclaration, HarnessDriverType,
    HarnessSupervisorChannel, HarnessSupervisorCommand, HarnessSupervisorEvent,
    HarnessSupervisorEventStream, HarnessSupervisorTransportPort, LiveTurnCheckpoint,
    ManagedWorkExecutionResult, OpenSupervisorInput, PortError, RunHarnessInput,
    RuntimeResourceScope, SUPERVISOR_PROTOCOL_V1, SandboxHarnessDriverCapabilities,
    SandboxHarnessDriverPort, SupervisorProtocol, SupervisorStopReason,
};
use std::sync::Arc;
use std::time::Duration;

/// `Number.MAX_SAFE_INTEGER`: the largest deadline the contract accepts.
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// Phase names used in deadline errors.
const PHASE_READY: &str = "ready";
const PHASE_HEARTBEAT: &str = "harness heartbeat";
const PHASE_DRAIN: &str = "drain";

/// `SupervisedSandboxHarnessDriver`: advertises only `openma_supervised`.
#[derive(Clone)]
pub struct SupervisedSandboxHarnessDriver {
    transport: Arc<dyn HarnessSupervisorTransportPort>,
}

impl std::fmt::Debug for SupervisedSandboxHarnessDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SupervisedSandboxHarnessDriver")
            .finish_non_exhaustive()
    }
}

/// The fields of an `openma_supervised` declaration the driver reads.
struct SupervisedDeclaration<'a> {
    protocol: SupervisorProtocol,
    supervisor: &'a omabox_contract::RuntimeProcessDeclaration,
    harness: &'a omabox_contract::HarnessIdentity,
    ready_timeout_ms: i64,
    heartbeat_timeout_ms: i64,
    drain_timeout_ms: i64,
}

impl SupervisedSandboxHarnessDriver {
    /// A driver that opens supervisors through `transport`.
    pub fn new(transport: Arc<dyn HarnessSupervisorTransportPort>) -> Self {
        Self { transport }
    }

    /// The protocol from `open` to `drained`. Stores the channel in `channel` as soon as it
    /// exists so the caller can stop and close it whatever happens next.
    async fn drive(
        &self,
        input: &RunHarnessInput,
        declaration: &SupervisedDeclaration<'_>,
        signal: &AbortSignal,
        channel: &mut Option<Box<dyn HarnessSupervisorChannel>>,
    ) -> Result<ManagedWorkExecutionResult, PortError> {
        signal.throw_if_aborted()?;
        let opened = channel.insert(
            self.transport
                .open(OpenSupervisorInput {
                    scope: input.scope.clone(),
                    sandbox: input.sandbox.clone(),
                    process: declaration.supervisor.clone(),
                    signal: signal.clone(),
                })
                .await?,
        );
        let mut events = opened.events(signal.clone()).await?;
        opened
            .send(HarnessSupervisorCommand::Start {
                scope: input.scope.clone(),
                harness: declaration.harness.clone(),
                workspace_path: input.workspace_path.clone(),
                output_path: input.output_path.clone(),
            })
            .await?;

        // Ready: other events are skipped; each awaited event has its own deadline.
        loop {
            let event = next_with_deadline(
                &mut events,
                declaration.ready_timeout_ms,
                signal,
                PHASE_READY,
            )
            .await?;
            if let HarnessSupervisorEvent::Ready { protocol } = event {
                if protocol != protocol_literal(declaration.protocol) {
                    return Err(PortError::supervisor_protocol(format!(
                        "Supervisor protocol mismatch: {protocol}"
                    )));
                }
                break;
            }
        }

        // Running: heartbeats and live checkpoints until a clean completion.
        loop {
            let event = next_with_deadline(
                &mut events,
                declaration.heartbeat_timeout_ms,
                signal,
                PHASE_HEARTBEAT,
            )
            .await?;
            match event {
                HarnessSupervisorEvent::Heartbeat { .. } => continue,
                HarnessSupervisorEvent::Checkpoint {
                    checkpoint_id,
                    session_id,
                    turn_id,
                } => {
                    commit_checkpoint(
                        opened.as_ref(),
                        &input.scope,
                        input.checkpoint.as_ref(),
                        LiveTurnCheckpoint {
                            checkpoint_id,
                            session_id,
                            turn_id,
                        },
                    )
                    .await?;
                }
                HarnessSupervisorEvent::Error { message } => {
                    return Err(PortError::supervisor_protocol(message));
                }
                HarnessSupervisorEvent::Completed { exit_code } if exit_code != 0 => {
                    return Err(PortError::supervisor_protocol(format!(
                        "Harness exited with code {exit_code}"
                    )));
                }
                HarnessSupervisorEvent::Completed { .. } => break,
                other => {
                    return Err(PortError::supervisor_protocol(format!(
                        "Unexpected supervisor event before completion: {}",
                        other.type_name()
                    )));
                }
            }
        }

        // Drain: errors fail the run, everything but `drained` is skipped.
        opened.send(HarnessSupervisorCommand::Drain).await?;
        loop {
            match next_with_deadline(
                &mut events,
                declaration.drain_timeout_ms,
                signal,
                PHASE_DRAIN,
            )
            .await?
            {
                HarnessSupervisorEvent::Error { message } => {
                    return Err(PortError::supervisor_protocol(message));
                }
                HarnessSupervisorEvent::Drained => {
                    return Ok(ManagedWorkExecutionResult::Completed);
                }
                _ => continue,
            }
        }
    }
}

fn protocol_literal(protocol: SupervisorProtocol) -> &'static str {
    match protocol {
        SupervisorProtocol::V1 => SUPERVISOR_PROTOCOL_V1,
    }
}

/// Validates a live checkpoint request, commits it through the host callback and tells the
/// supervisor the outcome. A failed commit is reported with `checkpoint.reject` (delivery
/// errors ignored) and then fails the run with the callback's own error.
async fn commit_checkpoint(
    channel: &dyn HarnessSupervisorChannel,
    scope: &RuntimeResourceScope,
    callback: Option<&omabox_contract::LiveCheckpointCallback>,
    request: LiveTurnCheckpoint,
) -> Result<(), PortError> {
    let callback = match callback {
        Some(callback)
            if !request.checkpoint_id.is_empty() && request.session_id == scope.session_id =>
        {
            callback
        }
        _ => {
            return Err(PortError::supervisor_protocol(
                "Supervisor checkpoint request is invalid",
            ));
        }
    };
    let checkpoint_id = request.checkpoint_id.clone();
    let committed = async {
        callback(request).await?;
        channel
            .send(HarnessSupervisorCommand::CheckpointCommit {
                checkpoint_id: checkpoint_id.clone(),
            })
            .await
    }
    .await;
    if let Err(error) = committed {
        let _ = channel
            .send(HarnessSupervisorCommand::CheckpointReject {
                checkpoint_id,
                message: error.message().to_owned(),
            })
            .await;
        return Err(error);
    }
    Ok(())
}

/// The next event within `timeout_ms`, or the contract's deadline, close and abort errors.
async fn next_with_deadline(
    events: &mut HarnessSupervisorEventStream,
    timeout_ms: i64,
    signal: &AbortSignal,
    phase: &str,
) -> Result<HarnessSupervisorEvent, PortError> {
    if timeout_ms <= 0 || timeout_ms > MAX_SAFE_INTEGER {
        return Err(PortError::supervisor_protocol(format!(
            "{phase} timeout must be a positive integer"
        )));
    }
    signal.throw_if_aborted()?;
    // Checked above: 0 < timeout_ms <= 2^53 - 1, so the conversion is lossless.
    let deadline = Duration::from_millis(timeout_ms.unsigned_abs());
    tokio::select! {
        biased;
        reason = signal.aborted() => Err(reason),
        next = events.next() => match next {
            Some(event) => event,
            None => Err(PortError::supervisor_protocol(format!(
                "Supervisor closed before {phase}"
            ))),
        },
        () = tokio::time::sleep(deadline) => Err(PortError::supervisor_protocol(format!(
            "{phase} timed out after {timeout_ms}ms"
        ))),
    }
}

/// Forwards the caller's abort to the internal controller for as long as it lives; dropping it
/// aborts the controller ("Supervisor driver closed") and stops the forwarding task.
struct SignalLink {
    controller: AbortController,
    forward: tokio::task::JoinHandle<()>,
}

impl SignalLink {
    fn start(outer: &AbortSignal, controller: &AbortController) -> Self {
        let forward = tokio::spawn({
            let outer = outer.clone();
            let controller = controller.clone();
            async move {
                let inner = controller.signal();
                tokio::select! {
                    reason = outer.aborted() => controller.abort(reason),
                    () = inner.token().cancelled() => {}
                }
            }
        });
        Self {
            controller: controller.clone(),
            forward,
        }
    }
}

impl Drop for SignalLink {
    fn drop(&mut self) {
        self.controller
            .abort(PortError::new("Supervisor driver closed"));
        self.forward.abort();
    }
}

#[async_trait::async_trait]
impl SandboxHarnessDriverPort for SupervisedSandboxHarnessDriver {
    async fn driver_capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        Ok(SandboxHarnessDriverCapabilities {
            drivers: vec![HarnessDriverType::OpenmaSupervised],
        })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        let declaration = match &input.driver {
            HarnessDriverDeclaration::OpenmaSupervised {
                protocol,
                supervisor,
                harness,
                ready_timeout_ms,
                heartbeat_timeout_ms,
                drain_timeout_ms,
            } => SupervisedDeclaration {
                protocol: *protocol,
                supervisor,
                harness,
                ready_timeout_ms: *ready_timeout_ms,
                heartbeat_timeout_ms: *heartbeat_timeout_ms,
                drain_timeout_ms: *drain_timeout_ms,
            },
            other => {
                return Err(PortError::supervisor_protocol(format!(
                    "Supervised driver cannot run {}",
                    other.driver_type()
                )));
            }
        };

        // The internal controller follows the caller's signal and also fires when this run
        // ends (or its future is dropped), so the transport and the event stream never
        // outlive the run.
        let controller = AbortController::new();
        if let Some(reason) = input.signal.reason() {
            controller.abort(reason);
        }
        let link = SignalLink::start(&input.signal, &controller);

        let signal = controller.signal();
        let mut channel: Option<Box<dyn HarnessSupervisorChannel>> = None;
        let driven = self
            .drive(&input, &declaration, &signal, &mut channel)
            .await;
        let outcome = match driven {
            Ok(result) => Ok(result),
            Err(error) => {
                // The listener of the JS original runs synchronously; make sure a caller
                // abort that raced the failure is seen here too.
                if let Some(reason) = input.signal.reason() {
                    controller.abort(reason);
                }
                let (reason, outcome) = if controller.is_aborted() {
                    (
                        SupervisorStopReason::Aborted,
                        Ok(ManagedWorkExecutionResult::Aborted),
                    )
                } else {
                    (SupervisorStopReason::Failed, Err(error))
                };
                if let Some(channel) = channel.as_ref() {
                    let _ = channel
                        .send(HarnessSupervisorCommand::Stop { reason })
                        .await;
                }
                outcome
            }
        };

        drop(link);
        if let Some(channel) = channel.as_ref() {
            let _ = channel.close().await;
        }
        outcome
    }
}

#[cfg(test)]
mod tests;
