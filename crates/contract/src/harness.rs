//! Running the harness in prepared compute, and the supervisor protocol
//! `openma-harness-supervisor-v1` (JSON Lines: commands on stdin, events on stdout).

use crate::{
    AbortSignal, HarnessDriverDeclaration, HarnessIdentity, ManagedSandboxLease, PortError,
    RuntimeProcessDeclaration, RuntimeResourceFence, RuntimeResourceScope, SUPERVISOR_PROTOCOL_V1,
    SandboxHarnessDriverCapabilities,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How a harness run ended (when it did not fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ManagedWorkExecutionResult {
    /// The harness finished its work.
    Completed,
    /// The harness was stopped by cancellation.
    Aborted,
}

/// Why the host stops a supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupervisorStopReason {
    /// Cancelled.
    Aborted,
    /// Failed.
    Failed,
}

/// Host → supervisor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum HarnessSupervisorCommand {
    /// Start the harness.
    #[serde(rename = "start", rename_all = "camelCase")]
    Start {
        /// The work item.
        scope: RuntimeResourceScope,
        /// The harness.
        harness: HarnessIdentity,
        /// `/workspace`.
        workspace_path: String,
        /// `/mnt/session/outputs`, or null.
        output_path: Option<String>,
    },
    /// Finish and report `drained`.
    #[serde(rename = "drain")]
    Drain,
    /// A live checkpoint was published.
    #[serde(rename = "checkpoint.commit", rename_all = "camelCase")]
    CheckpointCommit {
        /// The checkpoint.
        checkpoint_id: String,
    },
    /// A live checkpoint was refused.
    #[serde(rename = "checkpoint.reject", rename_all = "camelCase")]
    CheckpointReject {
        /// The checkpoint.
        checkpoint_id: String,
        /// Why.
        message: String,
    },
    /// Stop now.
    #[serde(rename = "stop")]
    Stop {
        /// Why.
        reason: SupervisorStopReason,
    },
}

impl HarnessSupervisorCommand {
    /// One JSON Lines record: the JSON text and a trailing newline.
    pub fn to_json_line(&self) -> String {
        let mut line = serde_json::to_string(self).unwrap_or_default();
        line.push('\n');
        line
    }
}

/// Supervisor → host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum HarnessSupervisorEvent {
    /// The supervisor speaks the given protocol.
    #[serde(rename = "ready")]
    Ready {
        /// Always `openma-harness-supervisor-v1` after validation.
        protocol: String,
    },
    /// Liveness.
    #[serde(rename = "heartbeat")]
    Heartbeat {
        /// Non-negative sequence.
        sequence: u64,
    },
    /// A live turn asks to be checkpointed.
    #[serde(rename = "checkpoint", rename_all = "camelCase")]
    Checkpoint {
        /// The checkpoint.
        checkpoint_id: String,
        /// The session.
        session_id: String,
        /// The turn, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        turn_id: Option<String>,
    },
    /// The harness finished.
    #[serde(rename = "completed", rename_all = "camelCase")]
    Completed {
        /// Its exit code.
        exit_code: i64,
    },
    /// Draining finished.
    #[serde(rename = "drained")]
    Drained,
    /// The supervisor failed.
    #[serde(rename = "error")]
    Error {
        /// Why.
        message: String,
    },
}

impl HarnessSupervisorEvent {
    /// The event's type literal.
    pub fn type_name(&self) -> &'static str {
        match self {
            HarnessSupervisorEvent::Ready { .. } => "ready",
            HarnessSupervisorEvent::Heartbeat { .. } => "heartbeat",
            HarnessSupervisorEvent::Checkpoint { .. } => "checkpoint",
            HarnessSupervisorEvent::Completed { .. } => "completed",
            HarnessSupervisorEvent::Drained => "drained",
            HarnessSupervisorEvent::Error { .. } => "error",
        }
    }

    /// Parses and validates one JSON Lines record with the contract's exact error texts.
    /// Unknown fields are dropped; `turnId` is kept only when present.
    pub fn parse_line(line: &str) -> Result<Self, PortError> {
        use serde_json::Value;
        let value: Value = serde_json::from_str(line)
            .map_err(|_| PortError::new("Harness supervisor emitted invalid JSON"))?;
        let object = value
            .as_object()
            .filter(|object| object.contains_key("type"));
        let Some(object) = object else {
            return Err(PortError::new(
                "Harness supervisor event must be an object with a type",
            ));
        };
        let event_type = match &object["type"] {
            Value::String(event_type) => event_type.clone(),
            other => other.to_string(),
        };
        let non_empty_string = |key: &str| -> Option<String> {
            match object.get(key) {
                Some(Value::String(text)) if !text.is_empty() => Some(text.clone()),
                _ => None,
            }
        };
        match event_type.as_str() {
            "ready" => match object.get("protocol") {
                Some(Value::String(protocol)) if protocol == SUPERVISOR_PROTOCOL_V1 => {
                    Ok(HarnessSupervisorEvent::Ready {
                        protocol: protocol.clone(),
                    })
                }
                _ => Err(PortError::new(
                    "Harness supervisor emitted an unsupported ready protocol",
                )),
            },
            "heartbeat" => match object.get("sequence").and_then(safe_integer) {
                Some(sequence) if sequence >= 0 => Ok(HarnessSupervisorEvent::Heartbeat {
                    sequence: sequence as u64,
                }),
                _ => Err(PortError::new(
                    "Harness supervisor heartbeat sequence must be non-negative",
                )),
            },
            "checkpoint" => {
                let invalid = || PortError::new("Harness supervisor checkpoint request is invalid");
                let checkpoint_id = non_empty_string("checkpointId").ok_or_else(invalid)?;
                let session_id = non_empty_string("sessionId").ok_or_else(invalid)?;
                let turn_id = match object.get("turnId") {
                    None => None,
                    Some(_) => Some(non_empty_string("turnId").ok_or_else(invalid)?),
                };
                Ok(HarnessSupervisorEvent::Checkpoint {
                    checkpoint_id,
                    session_id,
                    turn_id,
                })
            }
            "completed" => match object.get("exitCode").and_then(safe_integer) {
                Some(exit_code) => Ok(HarnessSupervisorEvent::Completed { exit_code }),
                None => Err(PortError::new(
                    "Harness supervisor completion exitCode must be an integer",
                )),
            },
            "drained" => Ok(HarnessSupervisorEvent::Drained),
            "error" => match non_empty_string("message") {
                Some(message) => Ok(HarnessSupervisorEvent::Error { message }),
                None => Err(PortError::new(
                    "Harness supervisor error message must be non-empty",
                )),
            },
            other => Err(PortError::new(format!(
                "Unknown harness supervisor event: {other}"
            ))),
        }
    }
}

/// `Number.isSafeInteger` over a JSON value.
fn safe_integer(value: &serde_json::Value) -> Option<i64> {
    const MAX_SAFE: i64 = (1 << 53) - 1;
    let number = value.as_number()?;
    let integer = if let Some(integer) = number.as_i64() {
        integer
    } else {
        let float = number.as_f64()?;
        if float.fract() != 0.0 || float.abs() > MAX_SAFE as f64 {
            return None;
        }
        float as i64
    };
    (integer.abs() <= MAX_SAFE).then_some(integer)
}

/// A live-turn checkpoint request passed from the harness to the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveTurnCheckpoint {
    /// Checkpoint id (unique within a run).
    pub checkpoint_id: String,
    /// The session (must equal the scope's).
    pub session_id: String,
    /// The turn, when known.
    pub turn_id: Option<String>,
}

/// The host's live-checkpoint callback: publishes a live turn, or fails.
pub type LiveCheckpointCallback =
    Arc<dyn Fn(LiveTurnCheckpoint) -> BoxFuture<'static, Result<(), PortError>> + Send + Sync>;

/// Input of [`SandboxHarnessDriverPort::run`].
#[derive(Clone)]
pub struct RunHarnessInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held (never passed to the harness process).
    pub fence: RuntimeResourceFence,
    /// The sandbox.
    pub sandbox: ManagedSandboxLease,
    /// `/workspace`.
    pub workspace_path: String,
    /// `/mnt/session/outputs`, or none.
    pub output_path: Option<String>,
    /// What to run.
    pub driver: HarnessDriverDeclaration,
    /// Live-turn checkpoint callback.
    pub checkpoint: Option<LiveCheckpointCallback>,
    /// Cancellation.
    pub signal: AbortSignal,
}

impl std::fmt::Debug for RunHarnessInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunHarnessInput")
            .field("scope", &self.scope)
            .field("sandbox", &self.sandbox)
            .field("workspace_path", &self.workspace_path)
            .field("output_path", &self.output_path)
            .field("driver", &self.driver)
            .field("checkpoint", &self.checkpoint.is_some())
            .finish_non_exhaustive()
    }
}

/// Runs the hand in prepared compute.
#[async_trait]
pub trait SandboxHarnessDriverPort: Send + Sync {
    /// Lanes this driver runs.
    async fn driver_capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError>;

    /// Runs the harness to completion (`completed`), cancellation (`aborted`) or failure.
    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError>;
}

/// Stream of validated supervisor events.
pub type HarnessSupervisorEventStream =
    BoxStream<'static, Result<HarnessSupervisorEvent, PortError>>;

/// An open channel to a supervisor process.
#[async_trait]
pub trait HarnessSupervisorChannel: Send + Sync {
    /// Sends one command. Fails after `close` ("Harness supervisor channel is closed") or
    /// once the open signal aborted (with its reason).
    async fn send(&self, command: HarnessSupervisorCommand) -> Result<(), PortError>;

    /// The event stream; can be taken once ("Harness supervisor event stream can only be
    /// consumed once"). The stream ends with the signal's reason when `signal` aborts.
    async fn events(&self, signal: AbortSignal) -> Result<HarnessSupervisorEventStream, PortError>;

    /// Closes stdin and stops the process. Idempotent; never fails.
    async fn close(&self) -> Result<(), PortError>;
}

/// Input of [`HarnessSupervisorTransportPort::open`].
#[derive(Debug, Clone)]
pub struct OpenSupervisorInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The sandbox.
    pub sandbox: ManagedSandboxLease,
    /// The supervisor process.
    pub process: RuntimeProcessDeclaration,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Starts a supervisor process and opens its channel (stdio, RPC, …).
#[async_trait]
pub trait HarnessSupervisorTransportPort: Send + Sync {
    /// Spawns the supervisor and returns its channel.
    async fn open(
        &self,
        input: OpenSupervisorInput,
    ) -> Result<Box<dyn HarnessSupervisorChannel>, PortError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_validation_text() {
        let cases = [
            ("nope", "Harness supervisor emitted invalid JSON"),
            (
                "null",
                "Harness supervisor event must be an object with a type",
            ),
            (
                "{}",
                "Harness supervisor event must be an object with a type",
            ),
            (
                r#"{"type":"ready","protocol":"v0"}"#,
                "Harness supervisor emitted an unsupported ready protocol",
            ),
            (
                r#"{"type":"heartbeat","sequence":-1}"#,
                "Harness supervisor heartbeat sequence must be non-negative",
            ),
            (
                r#"{"type":"heartbeat","sequence":1.5}"#,
                "Harness supervisor heartbeat sequence must be non-negative",
            ),
            (
                r#"{"type":"checkpoint","checkpointId":"","sessionId":"s"}"#,
                "Harness supervisor checkpoint request is invalid",
            ),
            (
                r#"{"type":"checkpoint","checkpointId":"c","sessionId":"s","turnId":""}"#,
                "Harness supervisor checkpoint request is invalid",
            ),
            (
                r#"{"type":"completed","exitCode":"0"}"#,
                "Harness supervisor completion exitCode must be an integer",
            ),
            (
                r#"{"type":"error","message":""}"#,
                "Harness supervisor error message must be non-empty",
            ),
            (
                r#"{"type":"dance"}"#,
                "Unknown harness supervisor event: dance",
            ),
        ];
        for (line, message) in cases {
            assert_eq!(
                HarnessSupervisorEvent::parse_line(line)
                    .unwrap_err()
                    .message(),
                message,
                "{line}"
            );
        }
    }

    #[test]
    fn valid_events_are_rebuilt_with_known_fields_only() {
        let event = HarnessSupervisorEvent::parse_line(
            r#"{"type":"checkpoint","checkpointId":"c1","sessionId":"s","extra":1}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&event).unwrap(),
            r#"{"type":"checkpoint","checkpointId":"c1","sessionId":"s"}"#
        );
        assert_eq!(
            HarnessSupervisorEvent::parse_line(r#"{"type":"completed","exitCode":3.0}"#).unwrap(),
            HarnessSupervisorEvent::Completed { exit_code: 3 }
        );
    }

    #[test]
    fn commands_are_json_lines() {
        assert_eq!(
            HarnessSupervisorCommand::Drain.to_json_line(),
            "{\"type\":\"drain\"}\n"
        );
        assert_eq!(
            HarnessSupervisorCommand::Stop {
                reason: SupervisorStopReason::Aborted
            }
            .to_json_line(),
            "{\"type\":\"stop\",\"reason\":\"aborted\"}\n"
        );
    }
}
