//! `omabox serve` configuration: model cards (per session, with a default), URL MCP servers
//! and the operator key. TOML (`.toml`) or JSON (any other extension); every key is optional,
//! so an empty file (or none) is a valid configuration.
//!
//! ```toml
//! # The origin sandboxes reach omabox at: MCP server URLs are rewritten to it, and a request
//! # is served only when its Host (and Origin) is this origin or a loopback name.
//! public_url = "http://10.0.2.2:8787"
//! # Operator key for the session API (file promotion); OMABOX_API_KEY wins over it. Without
//! # one, `omabox serve` generates <data-dir>/serve-api-key on first start.
//! operator_api_key_env = "OMABOX_API_KEY"
//!
//! [models.default]
//! provider = "anthropic"                 # anthropic|ant|openai|oai|deepseek|gemini|google|…
//! base_url = "https://api.anthropic.com" # optional: the provider's default base
//! api_key_vault = "anthropic"            # a vault secret name, or:
//! # api_key_env = "ANTHROPIC_API_KEY"    # an env var of the omabox process
//! custom_headers = { "anthropic-beta" = "x" }
//!
//! [models.sessions.my-session]           # a per-session card wins over the default
//! provider = "deepseek"
//! api_key_env = "DEEPSEEK_API_KEY"
//! protocol_endpoints = [{ protocol = "openai-chat", upstreamBaseUrl = "https://api.deepseek.com" }]
//!
//! [limits]                               # every key optional; the defaults:
//! header_read_timeout_ms = 10000         # to receive a request head, from its first byte
//! keepalive_timeout_ms = 610000          # an idle connection kept for its next request
//! idle_timeout_ms = 300000               # no byte either way on a connection
//! max_connections = 1024                 # served at once; beyond, accepting pauses
//! max_body_bytes = 1048576               # buffered (JSON) bodies; proxy bodies stream
//!
//! [[mcp_servers]]
//! name = "github"
//! url = "https://mcp.example/mcp"
//! vault_secret = "github_token"
//! header = "Authorization"               # default; Authorization gets "Bearer <secret>",
//!                                        # any other header the raw secret
//! ```
//!
//! Without a card (or when its key is unavailable) a session falls back to
//! `ANTHROPIC_API_KEY` / `ANTHROPIC_BASE_URL` (provider `anthropic`), as the reference does.

use crate::inference::ProtocolEndpoint;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than a configuration may be.
    #[error("{path}: too large (max {} MiB)", max >> 20)]
    TooLarge {
        /// The file.
        path: String,
        /// The cap in bytes.
        max: u64,
    },
    /// TOML syntax or shape.
    #[error("invalid TOML configuration")]
    Toml(#[source] toml::de::Error),
    /// JSON syntax or shape.
    #[error("invalid JSON configuration")]
    Json(#[source] serde_json::Error),
    /// A value is out of range (the text says which).
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The largest configuration file read (`omabox serve --config`, `omabox run
/// --inference-config`).
pub const MAX_FILE_BYTES: u64 = 1 << 20;

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    /// The origin sandboxes reach omabox at (MCP URL rewriting, env projection).
    #[serde(default)]
    pub public_url: Option<String>,
    /// The operator key in clear (prefer `operator_api_key_env`).
    #[serde(default)]
    pub operator_api_key: Option<String>,
    /// The env var holding the operator key (`OMABOX_API_KEY` is always consulted first).
    #[serde(default)]
    pub operator_api_key_env: Option<String>,
    /// Model cards.
    #[serde(default)]
    pub models: ModelsConfig,
    /// URL MCP servers of the agent.
    #[serde(default)]
    pub mcp_servers: Vec<McpServerConfig>,
    /// Server limits.
    #[serde(default)]
    pub limits: Limits,
}

/// Server limits (see [`crate::server`]); every value must be positive.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Time to receive a request head, counted from accept or from the first byte of a
    /// next request on a kept-alive connection. Default 10 s.
    pub header_read_timeout_ms: u64,
    /// How long a connection is kept alive after a response, awaiting its next request:
    /// longer than clients keep idle connections (E2B's SDKs: 300 s), so that the server
    /// never closes one under a request being sent. While fewer than 1/8 of the connection
    /// slots are free, only `header_read_timeout_ms`. Default 610 s.
    pub keepalive_timeout_ms: u64,
    /// A connection on which no byte moved either way for this long is closed (slow or
    /// stalled bodies, streamed proxy bodies, awaited responses). Default 300 s.
    pub idle_timeout_ms: u64,
    /// Connections served at once; beyond it the server stops accepting until one ends.
    /// Default 1024.
    pub max_connections: usize,
    /// Largest buffered request body (the JSON routes); streamed proxy bodies are excepted.
    /// Default 1 MiB.
    pub max_body_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_read_timeout_ms: 10_000,
            keepalive_timeout_ms: 610_000,
            idle_timeout_ms: 300_000,
            max_connections: 1024,
            max_body_bytes: 1024 * 1024,
        }
    }
}

impl Limits {
    /// Fails when a value is zero.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let zero = [
            ("header_read_timeout_ms", self.header_read_timeout_ms == 0),
            ("keepalive_timeout_ms", self.keepalive_timeout_ms == 0),
            ("idle_timeout_ms", self.idle_timeout_ms == 0),
            ("max_connections", self.max_connections == 0),
            ("max_body_bytes", self.max_body_bytes == 0),
        ];
        match zero.iter().find(|(_, is_zero)| *is_zero) {
            Some((name, _)) => Err(ConfigError::Invalid(format!(
                "limits.{name} must be positive"
            ))),
            None => Ok(()),
        }
    }
}

/// Model cards: a default and per-session overrides.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelsConfig {
    /// The card of sessions without their own.
    #[serde(default)]
    pub default: Option<ModelCard>,
    /// Cards by session id.
    #[serde(default)]
    pub sessions: BTreeMap<String, ModelCard>,
}

/// A model card: where a session's model calls go and with which key.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// Provider id.
    #[serde(default)]
    pub provider: Option<String>,
    /// Base URL (default: the provider's).
    #[serde(default)]
    pub base_url: Option<String>,
    /// The key's vault secret name.
    #[serde(default)]
    pub api_key_vault: Option<String>,
    /// The env var holding the key.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Headers set upstream after the credential.
    #[serde(default)]
    pub custom_headers: BTreeMap<String, String>,
    /// Explicit endpoints (win over the provider's defaults).
    #[serde(default)]
    pub protocol_endpoints: Vec<ProtocolEndpoint>,
}

/// A URL MCP server of the agent.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// Its name (a path segment of the proxy URL).
    pub name: String,
    /// Its upstream URL.
    pub url: String,
    /// The vault secret added on the server side.
    #[serde(default)]
    pub vault_secret: Option<String>,
    /// The header that carries it (default `Authorization`, as `Bearer <secret>`).
    #[serde(default)]
    pub header: Option<String>,
}

impl ServeConfig {
    /// Loads `path`: TOML when it ends in `.toml`, JSON otherwise.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        use std::io::Read as _;
        let read_error = |source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        };
        // Capped: the path may name /dev/zero or a huge file.
        let mut bytes = Vec::new();
        std::fs::File::open(path)
            .and_then(|file| file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes))
            .map_err(read_error)?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(ConfigError::TooLarge {
                path: path.display().to_string(),
                max: MAX_FILE_BYTES,
            });
        }
        let text = String::from_utf8(bytes).map_err(|_| {
            read_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not UTF-8 text",
            ))
        })?;
        let is_toml = path.extension().is_some_and(|ext| ext == "toml");
        let config = if is_toml {
            Self::from_toml(&text)?
        } else {
            Self::from_json(&text)?
        };
        Ok(config)
    }

    /// Parses and validates TOML.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(ConfigError::Toml)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses and validates JSON.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let config: Self = serde_json::from_str(text).map_err(ConfigError::Json)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.limits.validate()?;
        if crate::host_rule::HostRule::new(self.public_url.as_deref()).is_none() {
            return Err(ConfigError::Invalid(
                "public_url must be an absolute http(s) URL with a host".to_owned(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for server in &self.mcp_servers {
            let valid = !server.name.is_empty()
                && server
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if !valid {
                return Err(ConfigError::Invalid(format!(
                    "MCP server name {:?} must be 1+ characters of A–Z, a–z, 0–9, '.', '_', '-'",
                    server.name
                )));
            }
            if !names.insert(server.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "MCP server {:?} is listed twice",
                    server.name
                )));
            }
            match url::Url::parse(&server.url) {
                Ok(url) if matches!(url.scheme(), "http" | "https") => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "MCP server {:?} needs an http(s) URL",
                        server.name
                    )));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_valid() {
        assert!(ServeConfig::from_toml("").unwrap().models.default.is_none());
        assert!(ServeConfig::from_json("{}").unwrap().mcp_servers.is_empty());
    }

    #[test]
    fn documented_example_parses() {
        let doc = include_str!("config.rs");
        let example: String = doc
            .lines()
            .skip_while(|line| !line.starts_with("//! ```toml"))
            .skip(1)
            .take_while(|line| !line.starts_with("//! ```"))
            .map(|line| format!("{}\n", line.trim_start_matches("//!").trim_start()))
            .collect();
        let config = ServeConfig::from_toml(&example).unwrap();
        assert_eq!(config.mcp_servers[0].name, "github");
        assert_eq!(
            config.models.sessions["my-session"]
                .protocol_endpoints
                .len(),
            1
        );
    }

    #[test]
    fn bad_mcp_server_is_refused() {
        let err = ServeConfig::from_json(r#"{"mcp_servers":[{"name":"a/b","url":"http://x"}]}"#)
            .unwrap_err();
        assert!(err.to_string().contains("MCP server"));
    }
}
