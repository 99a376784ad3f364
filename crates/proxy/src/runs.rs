//! Runs over HTTP as a port: what `POST /v1/sessions/{id}/runs`, `GET
//! /v1/sessions/{id}/runs`, `GET /v1/runs/{id}`, `POST /v1/runs/{id}/cancel` and `GET
//! /v1/runs/{id}/events` (`routes/runs.rs`) ask of whoever queues and runs work items. This crate validates the body into a [`RunSpec`] and defines [`RunService`]; the
//! node implements it over the store's run queue and its runner, so the HTTP edge never
//! names a store or a backend.
//!
//! Must never: echo a credential of the body (`credentials`: vault secret *names* bound to
//! hosts) in a response, an error or a log line — a bad one is refused by its position only.

use async_trait::async_trait;
use omabox_contract::{CancelOutcome, RunEvent, RunPage, RunRecord};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Arguments of a command run, at most.
pub const MAX_COMMAND_ARGS: usize = 256;
/// Credentials of one run, at most.
pub const MAX_CREDENTIALS: usize = 64;
/// Session resources of one run, at most.
pub const MAX_RESOURCES: usize = 64;

/// A validated run request: `{"command": [...]}` or `{"agent": "claude", "prompt": "…"}`,
/// plus what `omabox run` takes besides. Stored in the queue as this JSON.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The harness command and its arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// A known ACP agent (`claude`, `codex`), with `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<String>,
    /// The agent's prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// `linux` (default) or `local` (test mode only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    /// An Environment `config` (or an Environment holding one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<Value>,
    /// Session resources in the contract's JSON shapes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<Value>,
    /// `HOST[/PREFIX]=SECRET[:bearer|basic|token]`, as `omabox run --credential`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub credentials: Vec<String>,
}

/// Why a run request is refused: the message names the field, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRunBody(pub String);

fn bad(message: impl Into<String>) -> BadRunBody {
    BadRunBody(message.into())
}

fn strings(value: Value, field: &str, max: usize) -> Result<Vec<String>, BadRunBody> {
    let Value::Array(items) = value else {
        return Err(bad(format!("`{field}` must be an array of strings")));
    };
    if items.len() > max {
        return Err(bad(format!("`{field}` has more than {max} items")));
    }
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| match item {
            Value::String(text) => Ok(text),
            _ => Err(bad(format!("`{field}[{index}]` must be a string"))),
        })
        .collect()
}

fn text(value: Value, field: &str) -> Result<String, BadRunBody> {
    match value {
        Value::String(text) => Ok(text),
        _ => Err(bad(format!("`{field}` must be a string"))),
    }
}

impl RunSpec {
    /// Validates a request body: a JSON object with known fields of the right types, and
    /// exactly one of `command` and `agent`.
    pub fn parse(body: &[u8]) -> Result<Self, BadRunBody> {
        let value: Value =
            serde_json::from_slice(body).map_err(|_| bad("the body must be a JSON object"))?;
        let Value::Object(object) = value else {
            return Err(bad("the body must be a JSON object"));
        };
        let mut spec = RunSpec::default();
        for (field, value) in object {
            match field.as_str() {
                "command" => spec.command = Some(strings(value, "command", MAX_COMMAND_ARGS)?),
                "agent" => spec.agent = Some(text(value, "agent")?),
                "prompt" => spec.prompt = Some(text(value, "prompt")?),
                "backend" => spec.backend = Some(text(value, "backend")?),
                "environment" => match value {
                    Value::Object(_) => spec.environment = Some(value),
                    _ => return Err(bad("`environment` must be a JSON object")),
                },
                "resources" => match value {
                    Value::Array(items) if items.len() <= MAX_RESOURCES => spec.resources = items,
                    Value::Array(_) => {
                        return Err(bad(format!(
                            "`resources` has more than {MAX_RESOURCES} items"
                        )));
                    }
                    _ => return Err(bad("`resources` must be an array")),
                },
                "credentials" => {
                    spec.credentials = strings(value, "credentials", MAX_CREDENTIALS)?;
                }
                other => {
                    let shown: String = other.chars().take(64).collect();
                    return Err(bad(format!("unknown field `{}`", shown.escape_debug())));
                }
            }
        }
        match (&spec.command, &spec.agent) {
            (Some(_), Some(_)) => return Err(bad("give `command` or `agent`, not both")),
            (None, None) => return Err(bad("`command` (an array of strings) is required")),
            (Some(command), None) if command.first().is_none_or(|c| c.trim().is_empty()) => {
                return Err(bad("`command` must name a program"));
            }
            (None, Some(_)) if spec.prompt.as_deref().is_none_or(|p| p.trim().is_empty()) => {
                return Err(bad("`agent` needs a non-empty `prompt`"));
            }
            (Some(_), None) if spec.prompt.is_some() => {
                return Err(bad("`prompt` is for an `agent` run"));
            }
            _ => {}
        }
        Ok(spec)
    }
}

/// Why a run service call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunServiceError {
    /// The request cannot be run (the text names the field and why, never a credential).
    #[error("{0}")]
    BadRequest(String),
    /// The queue failed; details go to the log only.
    #[error("{0}")]
    Internal(String),
}

/// The node's run queue and runner as the routes see them.
#[async_trait]
pub trait RunService: Send + Sync {
    /// Queues `spec` in `session_id`; returns the new run id.
    async fn submit(&self, session_id: &str, spec: RunSpec) -> Result<String, RunServiceError>;
    /// The run, if it exists.
    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, RunServiceError>;
    /// Up to `limit` stored events of the run after `after`.
    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, RunServiceError>;
    /// Cancels the run (a queued one now, a running one by its host).
    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, RunServiceError>;
    /// The session's runs, newest first, from the cursor `before`.
    async fn list(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, RunServiceError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_run_parses_and_bad_fields_are_named() {
        let spec =
            RunSpec::parse(br#"{"command": ["echo", "hi"], "credentials": ["h=s"]}"#).unwrap();
        assert_eq!(spec.command.unwrap(), ["echo", "hi"]);
        for (body, field) in [
            (&br#"{"command": "echo"}"#[..], "`command`"),
            (br#"{"command": ["echo", 3]}"#, "`command[1]`"),
            (
                br#"{"command": ["true"], "credentials": "x"}"#,
                "`credentials`",
            ),
            (
                br#"{"command": ["true"], "environment": []}"#,
                "`environment`",
            ),
            (br#"{"command": ["true"], "bogus": 1}"#, "`bogus`"),
            (br#"{"agent": "claude"}"#, "`prompt`"),
            (br#"{}"#, "`command`"),
            (br#"[1]"#, "JSON object"),
        ] {
            let error = RunSpec::parse(body).unwrap_err().to_string();
            assert!(error.contains(field), "{error}");
        }
    }

    #[test]
    fn a_bad_credential_is_never_echoed() {
        let error = RunSpec::parse(br#"{"command": ["true"], "credentials": ["ok", 7]}"#)
            .unwrap_err()
            .to_string();
        assert_eq!(error, "`credentials[1]` must be a string");
    }
}
