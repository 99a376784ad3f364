//! An OpenMA agent definition as `omabox run --agent-json FILE` takes it: the agent's JSON
//! (as OpenMA stores it), of which omabox reads the `_oma` extension and `system`:
//!
//! ```json
//! { "name": "coder", "system": "You write tests first.",
//!   "_oma": { "harness": "acp-sandbox",
//!             "acp": { "agent": { "id": "claude-acp", "command": "/workspace/bin/agent",
//!                                 "args": ["--acp"], "env": { "LOG": "1" },
//!                                 "cwd": "/workspace" } } } }
//! ```
//!
//! `harness` may be omitted; any value but `acp-sandbox` is refused (`acp-proxy` sends the
//! loop to a user's local daemon: not a sandbox backend). `_oma.acp.agent.command` is
//! required (the contract's "acp-sandbox requires _oma.acp.agent.command"). `system` becomes
//! `/workspace/AGENTS.md`. Other fields are ignored.
//!
//! `_oma.acp.agent.id` is the optional ACP registry id (the contract's "acp.agent (command,
//! args, env, cwd, optional registry id)"; OpenMA's `AcpStatefulAgentSpec.id`, "canonical
//! ACP registry id", a slug). It is carried (the run's banner and `--json` report name it)
//! and never replaces the command: the definition's command is what runs. When it names an
//! agent omabox knows ([`known_by_registry_id`]: OpenMA's ids and aliases of Claude Code and
//! Codex), the run also gets that agent's native wiring, as `--agent NAME` does: its state
//! directory variables under `/workspace/.openma/harness-state/<agent>` (the definition's
//! own `env` wins), its inference adapter's spawn-time variables (claude:
//! `ANTHROPIC_BASE_URL`/`ANTHROPIC_AUTH_TOKEN` → the hosted inference proxy) and the proxy's
//! provider (codex: `openai`). omabox installs nothing for it: the command must exist in the
//! sandbox (an image), or use `--agent NAME`, whose pinned package omabox installs.

use anyhow::{Context, bail};
use omabox_acp::agents::{KnownAgent, known_agent};
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
    /// `_oma.acp.agent.id`, the ACP registry id.
    pub registry_id: Option<String>,
    /// The agent omabox knows by that id.
    pub known: Option<&'static KnownAgent>,
}

/// OpenMA's registry ids and legacy aliases of the agents omabox knows by name (its overlay
/// of the ACP registry: `claude-acp` with aliases `claude-agent-acp`, `claude-code-acp`;
/// `codex-acp` with `codex-cli`, `codex-acp-bridge`).
const REGISTRY_IDS: &[(&str, &str)] = &[
    ("claude-acp", "claude"),
    ("claude-agent-acp", "claude"),
    ("claude-code-acp", "claude"),
    ("codex-acp", "codex"),
    ("codex-cli", "codex"),
    ("codex-acp-bridge", "codex"),
];

/// The agent omabox knows under the ACP registry id `id`.
pub fn known_by_registry_id(id: &str) -> Option<&'static KnownAgent> {
    REGISTRY_IDS
        .iter()
        .find(|(registry, _)| *registry == id)
        .and_then(|(_, name)| known_agent(name))
}

/// A registry id: a slug of 1–128 characters of `a–z`, `A–Z`, `0–9`, `.`, `_`, `-`.
fn valid_registry_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
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
    id: Option<String>,
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
            id,
            command: Some(command),
            args,
            mut env,
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
        if let Some(id) = id.as_deref().filter(|id| !valid_registry_id(id)) {
            let shown: String = id.chars().take(64).collect();
            bail!(
                "_oma.acp.agent.id {shown:?} is not an ACP registry id (1–128 characters of \
                 A–Z, a–z, 0–9, '.', '_' and '-', e.g. \"claude-acp\")"
            );
        }
        let known = id.as_deref().and_then(known_by_registry_id);
        if let Some(agent) = known {
            // The known agent's state variables, under the definition's own.
            for (key, value) in agent.env() {
                env.entry(key).or_insert(value);
            }
        }
        Ok(Self {
            registry_id: id,
            known,
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
    fn the_registry_id_is_accepted_and_carried_and_a_known_one_brings_its_wiring() {
        // The public shape (OpenMA's AcpStatefulAgentSpec: id, command, args, env, cwd).
        let agent = OmaAgent::parse(
            r#"{"_oma":{"harness":"acp-sandbox","acp":{"agent":{"id":"claude-acp",
                "command":"claude-agent-acp","args":[],"env":{"HOME":"/home/me"},
                "cwd":"/workspace/app"}}}}"#,
        )
        .unwrap();
        assert_eq!(agent.registry_id.as_deref(), Some("claude-acp"));
        assert_eq!(agent.known.map(|k| k.name), Some("claude"));
        assert_eq!(
            agent.process.command, "claude-agent-acp",
            "the command runs as given"
        );
        let env = agent.process.env.unwrap();
        assert_eq!(
            env["CLAUDE_CONFIG_DIR"],
            "/workspace/.openma/harness-state/claude"
        );
        assert_eq!(env["HOME"], "/home/me", "the definition's env wins");
        for (id, name) in [
            ("claude-code-acp", "claude"),
            ("claude-agent-acp", "claude"),
            ("codex-acp", "codex"),
            ("codex-cli", "codex"),
            ("codex-acp-bridge", "codex"),
        ] {
            assert_eq!(known_by_registry_id(id).map(|k| k.name), Some(name), "{id}");
        }
        // An id omabox does not know is carried and changes nothing.
        let agent = OmaAgent::parse(
            r#"{"_oma":{"acp":{"agent":{"id":"gemini","command":"gemini","args":["--acp"]}}}}"#,
        )
        .unwrap();
        assert_eq!(agent.registry_id.as_deref(), Some("gemini"));
        assert_eq!(agent.known, None);
        assert_eq!(agent.process.env, None);
        // Not a slug.
        for bad in [r#""a b""#, r#""""#, r#""x/../y""#, r#"7"#] {
            let text = format!(r#"{{"_oma":{{"acp":{{"agent":{{"id":{bad},"command":"c"}}}}}}}}"#);
            assert!(OmaAgent::parse(&text).is_err(), "{bad}");
        }
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
