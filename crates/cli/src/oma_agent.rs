//! An OpenMA agent definition as `omabox run --agent-json FILE` takes it: the agent's JSON
//! (as OpenMA stores it), of which omabox reads the `_oma` extension and `system`:
//!
//! ```json
//! { "name": "coder", "system": "You write tests first.",
//!   "_oma": { "harness": "acp-sandbox",
//!             "acp": { "agent": { "command": "/workspace/bin/agent", "args": ["--acp"],
//!                                 "env": { "LOG": "1" }, "cwd": "/workspace" } } } }
//! ```
//!
//! `harness` may be omitted; any value but `acp-sandbox` is refused (`acp-proxy` sends the
//! loop to a user's local daemon: not a sandbox backend). `_oma.acp.agent.command` is
//! required (the contract's "acp-sandbox requires _oma.acp.agent.command"). `system` becomes
//! `/workspace/AGENTS.md`. Other fields are ignored.

use anyhow::{Context, bail};
use omabox_contract::RuntimeProcessDeclaration;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// The largest definition file read.
const MAX_FILE_BYTES: u64 = crate::input_file::DOCUMENT_MAX;

/// What omabox runs of an agent definition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OmaAgent {
    /// The ACP agent process (cwd defaults to `/workspace`).
    pub process: RuntimeProcessDeclaration,
    /// The system prompt, for `/workspace/AGENTS.md`.
    pub system: Option<String>,
}

#[derive(Deserialize)]
struct Definition {
    #[serde(default)]
    system: Option<String>,
    #[serde(default, rename = "_oma")]
    oma: Option<OmaBlock>,
}

#[derive(Deserialize)]
struct OmaBlock {
    #[serde(default)]
    harness: Option<String>,
    #[serde(default)]
    acp: Option<AcpBlock>,
}

#[derive(Deserialize)]
struct AcpBlock {
    #[serde(default)]
    agent: Option<AgentBlock>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentBlock {
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    cwd: Option<String>,
}

impl OmaAgent {
    /// Reads and checks the definition at `path`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = crate::input_file::read_text(path, "--agent-json", MAX_FILE_BYTES)?;
        Self::parse(&text).with_context(|| format!("agent definition {}", path.display()))
    }

    /// Parses a definition's text.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let definition: Definition = serde_json::from_str(text).context("invalid JSON")?;
        let oma = definition
            .oma
            .context("no `_oma` block: not an ACP agent")?;
        if let Some(harness) = oma.harness.as_deref()
            && harness != "acp-sandbox"
        {
            bail!("_oma.harness {harness:?} is not run in a sandbox (omabox runs \"acp-sandbox\")");
        }
        let agent = oma.acp.and_then(|acp| acp.agent);
        let Some(AgentBlock {
            command: Some(command),
            args,
            env,
            cwd,
        }) = agent.filter(|a| a.command.as_deref().is_some_and(|c| !c.trim().is_empty()))
        else {
            bail!("acp-sandbox requires _oma.acp.agent.command");
        };
        if let Some(key) = env
            .keys()
            .find(|k| k.is_empty() || k.contains('=') || k.contains('\0'))
        {
            bail!("_oma.acp.agent.env has an invalid name {key:?}");
        }
        Ok(Self {
            process: RuntimeProcessDeclaration {
                command,
                args: Some(args),
                cwd: Some(cwd.unwrap_or_else(|| "/workspace".to_owned())),
                env: (!env.is_empty()).then_some(env),
            },
            system: definition.system.filter(|s| !s.is_empty()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acp_block_becomes_the_process_and_system_the_agents_md() {
        let agent = OmaAgent::parse(
            r#"{"name":"a","system":"be brief","model":"x",
                "_oma":{"harness":"acp-sandbox","acp":{"agent":{"command":"/w/agent",
                "args":["--acp"],"env":{"LOG":"1"}}}}}"#,
        )
        .unwrap();
        assert_eq!(agent.process.command, "/w/agent");
        assert_eq!(agent.process.args, Some(vec!["--acp".to_owned()]));
        assert_eq!(agent.process.cwd.as_deref(), Some("/workspace"));
        assert_eq!(agent.process.env.unwrap()["LOG"], "1");
        assert_eq!(agent.system.as_deref(), Some("be brief"));
    }

    #[test]
    fn a_definition_without_a_command_or_of_another_harness_is_refused() {
        for (text, expected) in [
            (
                r#"{"_oma":{"acp":{"agent":{}}}}"#,
                "acp-sandbox requires _oma.acp.agent.command",
            ),
            (
                r#"{"_oma":{"acp":{"agent":{"command":" "}}}}"#,
                "acp-sandbox requires",
            ),
            (
                r#"{"_oma":{"harness":"acp-proxy","acp":{"agent":{"command":"x"}}}}"#,
                "acp-proxy",
            ),
            (r#"{"name":"plain"}"#, "no `_oma` block"),
            (
                r#"{"_oma":{"acp":{"agent":{"command":"x","env":{"A=B":"c"}}}}}"#,
                "invalid name",
            ),
            ("[", "invalid JSON"),
        ] {
            let error = format!("{:#}", OmaAgent::parse(text).unwrap_err());
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
