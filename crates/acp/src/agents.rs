//! The ACP agents omabox knows by name (`omabox run --agent NAME`): which npm package holds
//! each, how it is started inside the sandbox, and its inference adapter — the native
//! settings that send its model calls to the hosted inference proxy.
//!
//! | agent    | package (pinned)                      | model calls go to                          | token from |
//! |----------|---------------------------------------|--------------------------------------------|------------|
//! | `claude` | `@zed-industries/claude-code-acp`     | `ANTHROPIC_BASE_URL` = `<proxy>/anthropic` | `ANTHROPIC_AUTH_TOKEN` (spawn-time copy of the session token) |
//! | `codex`  | `@zed-industries/codex-acp`           | provider `omabox` (`-c model_providers.omabox…`), base `<proxy>/openai/v1`, Responses API; `sandbox_mode="danger-full-access"` (omabox's sandbox is the boundary) | `HOSTED_INFERENCE_TOKEN` itself (`env_key`) |
//!
//! `<proxy>` is `HOSTED_INFERENCE_URL`. Each agent keeps its native session files under
//! [`HARNESS_STATE_DIR`] in `/workspace`, so the checkpoint carries them to the next run of
//! the session and `session/load` finds the earlier turns (filesystem resume). Nothing here
//! writes the token anywhere: it exists only in the agent process's env, set at spawn time.
//! The provider keys are removed from the agent's env by the hosted-inference projection
//! before these variables are added.
//!
//! The versions are pinned so a run is reproducible and a cache entry never changes under a
//! session; the claude adapter's package is the last line that runs on node 20
//! (`@agentclientprotocol/claude-agent-acp`, its successor, needs node 22).

use omabox_contract::SecretString;
use std::collections::BTreeMap;

/// Where the agents keep their native state in the sandbox (inside `/workspace`, so it is
/// checkpointed with the workspace).
pub const HARNESS_STATE_DIR: &str = "/workspace/.openma/harness-state";

/// Where the agent's package cache is mounted (read-only) in the sandbox.
pub const AGENT_MOUNT: &str = "/opt/omabox/agent";

/// How the agent's program is started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentEntry {
    /// `node <mount>/node_modules/<script>`: the sandbox needs `node` on its PATH.
    Node(&'static str),
    /// `<mount>/node_modules/<binary>`: a native program shipped in the package.
    Binary(&'static str),
}

/// How the agent's model calls reach the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InferenceAdapter {
    /// Anthropic Messages through `ANTHROPIC_BASE_URL` / `ANTHROPIC_AUTH_TOKEN`.
    ClaudeCode,
    /// OpenAI Responses through a codex model provider reading `HOSTED_INFERENCE_TOKEN`.
    Codex,
}

/// An ACP agent omabox can install and run by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KnownAgent {
    /// The `--agent` name.
    pub name: &'static str,
    /// The npm package.
    pub package: &'static str,
    /// Its pinned version.
    pub version: &'static str,
    /// How it is started.
    pub entry: AgentEntry,
    /// Its inference adapter.
    pub adapter: InferenceAdapter,
    /// The wire protocol its upstream must speak (the model card's provider when omabox
    /// serves the proxy itself): `anthropic` or `openai`.
    pub provider: &'static str,
}

/// Every known agent.
pub const KNOWN_AGENTS: &[KnownAgent] = &[
    KnownAgent {
        name: "claude",
        package: "@zed-industries/claude-code-acp",
        version: "0.16.2",
        entry: AgentEntry::Node("@zed-industries/claude-code-acp/dist/index.js"),
        adapter: InferenceAdapter::ClaudeCode,
        provider: "anthropic",
    },
    KnownAgent {
        name: "codex",
        package: "@zed-industries/codex-acp",
        version: "0.16.0",
        entry: AgentEntry::Binary("@zed-industries/codex-acp-linux-x64/bin/codex-acp"),
        adapter: InferenceAdapter::Codex,
        provider: "openai",
    },
];

/// The agent called `name`.
pub fn known_agent(name: &str) -> Option<&'static KnownAgent> {
    KNOWN_AGENTS.iter().find(|agent| agent.name == name)
}

impl KnownAgent {
    /// `package@version`, what npm installs.
    pub fn spec(&self) -> String {
        format!("{}@{}", self.package, self.version)
    }

    /// The cache entry's directory name (`<name>-<version>`).
    pub fn cache_name(&self) -> String {
        format!("{}-{}", self.name, self.version)
    }

    /// The path (relative to the install prefix) that must exist for an install to count:
    /// the program itself.
    pub fn entry_path(&self) -> String {
        match self.entry {
            AgentEntry::Node(path) | AgentEntry::Binary(path) => format!("node_modules/{path}"),
        }
    }

    /// The command and arguments, the package directory being at `mount` ([`AGENT_MOUNT`]
    /// in a sandbox). They never change between runs (the ACP state's configuration hash
    /// covers them): what varies, such as `HOSTED_INFERENCE_URL`, is read from the env when
    /// the agent starts.
    pub fn command(&self, mount: &str) -> Vec<String> {
        let mount = mount.trim_end_matches('/');
        let mut command = match self.entry {
            AgentEntry::Node(script) => {
                vec!["node".to_owned(), format!("{mount}/node_modules/{script}")]
            }
            AgentEntry::Binary(binary) => vec![format!("{mount}/node_modules/{binary}")],
        };
        if self.adapter == InferenceAdapter::Codex {
            // codex refuses a CODEX_HOME that does not exist (a new session has none), and
            // its provider's base URL is config, not env: the shell makes both from the env.
            let script = concat!(
                "mkdir -p \"$CODEX_HOME\" && exec \"$0\" -c ",
                "\"model_providers.omabox.base_url=\\\"${HOSTED_INFERENCE_URL%/}/openai/v1\\\"\" \"$@\""
            );
            command.splice(
                0..0,
                ["/bin/sh".to_owned(), "-c".to_owned(), script.to_owned()],
            );
            for setting in [
                "model_provider=\"omabox\"",
                "model_providers.omabox.name=\"omabox\"",
                "model_providers.omabox.env_key=\"HOSTED_INFERENCE_TOKEN\"",
                "model_providers.omabox.wire_api=\"responses\"",
                // The sandbox is the boundary; codex's own (nested) sandbox cannot work in it.
                "sandbox_mode=\"danger-full-access\"",
                // The commands codex runs never see the session token, and no shell
                // snapshot (an env dump codex keeps in CODEX_HOME, which is checkpointed)
                // records it.
                "shell_environment_policy.exclude=[\"HOSTED_INFERENCE_TOKEN\"]",
                "features.shell_snapshot=false",
            ] {
                command.push("-c".to_owned());
                command.push(setting.to_owned());
            }
        }
        command
    }

    /// The agent's declared (non-secret) env: where it keeps its state, and no telemetry or
    /// self-update (the sandbox reaches nothing but the gateway by default anyway).
    pub fn env(&self) -> BTreeMap<String, String> {
        let pairs: &[(&str, String)] = match self.adapter {
            InferenceAdapter::ClaudeCode => &[
                ("CLAUDE_CONFIG_DIR", format!("{HARNESS_STATE_DIR}/claude")),
                ("DISABLE_TELEMETRY", "1".into()),
                ("DISABLE_ERROR_REPORTING", "1".into()),
                ("DISABLE_AUTOUPDATER", "1".into()),
                ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
                ("HOME", "/tmp".into()),
            ],
            InferenceAdapter::Codex => &[
                ("CODEX_HOME", format!("{HARNESS_STATE_DIR}/codex")),
                ("HOME", "/tmp".into()),
            ],
        };
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    /// The spawn-time variables that point the agent's model calls at the proxy, given
    /// `HOSTED_INFERENCE_URL` and the session token.
    pub fn inference_env(
        &self,
        inference_url: &str,
        token: &SecretString,
    ) -> BTreeMap<String, Option<SecretString>> {
        let mut env = BTreeMap::new();
        if self.adapter == InferenceAdapter::ClaudeCode {
            let base = format!("{}/anthropic", inference_url.trim_end_matches('/'));
            env.insert(
                "ANTHROPIC_BASE_URL".to_owned(),
                Some(SecretString::new(base)),
            );
            env.insert("ANTHROPIC_AUTH_TOKEN".to_owned(), Some(token.clone()));
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claude_reads_the_proxy_from_its_native_env() {
        let claude = known_agent("claude").unwrap();
        assert_eq!(
            claude.command(AGENT_MOUNT),
            [
                "node",
                "/opt/omabox/agent/node_modules/@zed-industries/claude-code-acp/dist/index.js"
            ]
        );
        let token = SecretString::new("tok".to_owned());
        let env = claude.inference_env("http://127.0.0.1:9/v1/oma/inference-proxy/s1/", &token);
        assert_eq!(
            env["ANTHROPIC_BASE_URL"].as_ref().unwrap().expose(),
            "http://127.0.0.1:9/v1/oma/inference-proxy/s1/anthropic"
        );
        assert_eq!(
            env["ANTHROPIC_AUTH_TOKEN"].as_ref().unwrap().expose(),
            "tok"
        );
        assert!(claude.env()["CLAUDE_CONFIG_DIR"].starts_with(HARNESS_STATE_DIR));
    }

    #[test]
    fn codex_names_the_proxy_in_its_provider_config_and_the_token_by_variable() {
        let codex = known_agent("codex").unwrap();
        let command = codex.command(AGENT_MOUNT);
        assert_eq!(command[..2], ["/bin/sh", "-c"]);
        assert!(command[2].contains("${HOSTED_INFERENCE_URL%/}/openai/v1"));
        assert!(command[3].ends_with("/bin/codex-acp"));
        assert!(
            command
                .contains(&"model_providers.omabox.env_key=\"HOSTED_INFERENCE_TOKEN\"".to_owned())
        );
        let token = SecretString::new("tok".to_owned());
        assert!(codex.inference_env("http://h:1/x", &token).is_empty());
        assert!(known_agent("gemini").is_none());
    }

    #[test]
    fn codex_reads_the_proxy_url_from_the_env_when_it_starts() {
        // The wrapper's expansion, checked with the real shell (codex itself replaced).
        let mut command = known_agent("codex").unwrap().command(AGENT_MOUNT);
        command[3] = "echo".to_owned();
        let out = std::process::Command::new(&command[0])
            .args(&command[1..])
            .env(
                "CODEX_HOME",
                std::env::temp_dir().join("omabox-codex-home-test"),
            )
            .env(
                "HOSTED_INFERENCE_URL",
                "http://127.0.0.1:9/v1/oma/inference-proxy/s%201/",
            )
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(
            text.starts_with(
                "-c model_providers.omabox.base_url=\"http://127.0.0.1:9/v1/oma/inference-proxy/s%201/openai/v1\" -c model_provider="
            ),
            "{text}"
        );
        let _ = std::fs::remove_dir(std::env::temp_dir().join("omabox-codex-home-test"));
    }
}
