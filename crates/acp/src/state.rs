//! The ACP harness state that lets the next run of a session resume the agent's session
//! (reference §10): `/workspace/.openma/harness-state/acp.json` =
//! `{"version":1,"configurationSha256":"<hex>","acpSessionId":"<id>"}`, written through the
//! sandbox's file port after a turn, so the workspace checkpoint carries it.
//!
//! The configuration hash covers the agent's command, arguments and cwd — never its env,
//! whose values may be secrets (`HOSTED_INFERENCE_TOKEN` is referenced by name from the env
//! at spawn time and never copied here). A state file whose hash differs belongs to another
//! agent configuration and is ignored.

use omabox_contract::RuntimeProcessDeclaration;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where the state lives in the sandbox.
pub const ACP_STATE_PATH: &str = "/workspace/.openma/harness-state/acp.json";
/// The longest state file read back (it is workspace content, so untrusted).
const MAX_STATE_BYTES: usize = 16 * 1024;
/// The longest session id kept.
const MAX_SESSION_ID_BYTES: usize = 1024;

/// The state file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcpHarnessState {
    /// Always 1.
    pub version: u32,
    /// [`configuration_sha256`] of the agent it belongs to.
    pub configuration_sha256: String,
    /// The agent's session id.
    pub acp_session_id: String,
}

/// SHA-256 (hex) of the agent configuration key: command, args and cwd as a JSON array.
pub fn configuration_sha256(process: &RuntimeProcessDeclaration) -> String {
    let key = serde_json::json!([
        "acp-agent-v1",
        process.command,
        process.args.clone().unwrap_or_default(),
        process.cwd,
    ]);
    hex::encode(Sha256::digest(key.to_string().as_bytes()))
}

impl AcpHarnessState {
    /// The state of session `acp_session_id` of the agent `process`.
    pub fn new(process: &RuntimeProcessDeclaration, acp_session_id: &str) -> Self {
        Self {
            version: 1,
            configuration_sha256: configuration_sha256(process),
            acp_session_id: acp_session_id.to_owned(),
        }
    }

    /// The file's text.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("the state serializes")
    }

    /// The session to resume from `text` for `process`: `Ok(None)` when the state belongs to
    /// another configuration, `Err(reason)` when it is not a valid state file.
    pub fn resumable(
        text: &str,
        process: &RuntimeProcessDeclaration,
    ) -> Result<Option<String>, String> {
        if text.len() > MAX_STATE_BYTES {
            return Err(format!("it is larger than {MAX_STATE_BYTES} bytes"));
        }
        let state: AcpHarnessState =
            serde_json::from_str(text).map_err(|error| format!("it is not valid: {error}"))?;
        if state.version != 1 {
            return Err(format!("its version {} is not 1", state.version));
        }
        if state.acp_session_id.is_empty() || state.acp_session_id.len() > MAX_SESSION_ID_BYTES {
            return Err("its session id is empty or too long".to_owned());
        }
        if state.configuration_sha256 != configuration_sha256(process) {
            return Ok(None);
        }
        Ok(Some(state.acp_session_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn agent(args: &[&str]) -> RuntimeProcessDeclaration {
        RuntimeProcessDeclaration {
            command: "/workspace/agent".into(),
            args: Some(args.iter().map(|a| (*a).to_owned()).collect()),
            cwd: None,
            env: Some(BTreeMap::from([(
                "HOSTED_INFERENCE_TOKEN".to_owned(),
                "omst_secret".to_owned(),
            )])),
        }
    }

    #[test]
    fn state_round_trips_for_the_same_configuration_only() {
        let state = AcpHarnessState::new(&agent(&["--acp"]), "sess-1");
        let text = state.to_json();
        assert!(text.starts_with(r#"{"version":1,"configurationSha256":""#));
        assert!(!text.contains("omst_secret"));
        assert_eq!(
            AcpHarnessState::resumable(&text, &agent(&["--acp"])),
            Ok(Some("sess-1".to_owned()))
        );
        assert_eq!(
            AcpHarnessState::resumable(&text, &agent(&["--other"])),
            Ok(None)
        );
    }

    #[test]
    fn the_env_is_not_part_of_the_configuration() {
        let mut other = agent(&["--acp"]);
        other.env = None;
        assert_eq!(
            configuration_sha256(&other),
            configuration_sha256(&agent(&["--acp"]))
        );
    }

    #[test]
    fn invalid_state_is_an_error() {
        let process = agent(&[]);
        assert!(AcpHarnessState::resumable("{", &process).is_err());
        assert!(AcpHarnessState::resumable(&"x".repeat(20_000), &process).is_err());
        let wrong = r#"{"version":2,"configurationSha256":"x","acpSessionId":"s"}"#;
        assert!(AcpHarnessState::resumable(wrong, &process).is_err());
    }
}
