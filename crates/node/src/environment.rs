//! What a linux sandbox of `omabox run` may reach: `--environment FILE` (an Environment's
//! `config`) and the inference gateway, turned into the linux backend's typed settings
//! (`LinuxSandboxConfig`).
//!
//! | source | setting | default |
//! |--------|---------|---------|
//! | `--environment FILE`'s `networking` | `network` | the operator's `OMABOX_LINUX_NETWORK`, else `limited` with nothing allowed (the gateway only) |
//! | `--inference-gateway URL` | `gateway` (address, and the URL's host name) | none |
//!
//! The file holds either the Environment object (`{"config": {...}}`) or its `config`
//! (`{"type": "cloud", "networking": {...}, "packages": {"type": "packages", ...}}`), as the
//! public Environment API spells them (`null` for a field means its default); anything but a
//! JSON object there (`[]`, `null`, a number) is refused, before the run claims anything. `packages` ({pip, npm, apt, cargo, gem, go}) are installed in the
//! sandbox before the harness starts (`omabox_sandbox::packages`; the networking must let
//! the package managers through, e.g. `allow_package_managers`); `packages.apt` and
//! `dockerfile` (the subset `RUN`, `ENV`, `WORKDIR`: `omabox_sandbox::dockerfile`, checked
//! here so a bad one fails before anything starts) become the image's environment layer
//! (a `LayerSpec`), built once per image and content before the run claims anything.
//!
//! The gateway URL as the sandbox sees it: a URL naming a host keeps its name (the
//! sandbox's DNS answers it with its own loopback, where the gateway listener is, so TLS
//! with that name works); one naming an IP address other than `127.0.0.1` is rewritten to
//! `127.0.0.1` on the same port, since the sandbox has no route to any other address.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::Path;

use crate::DataDir;
use anyhow::Context as _;
use std::collections::BTreeMap;

use omabox_backend_linux::env_layer::{CopyFile, LayerSpec};
use omabox_backend_linux::factory::GatewaySetting;
use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};
use omabox_sandbox::packages::EnvironmentPackages;
use serde::Deserialize;
use sha2::Digest as _;

/// An Environment's `config`, as far as omabox reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentConfig {
    /// `cloud` in the public API; any value is accepted.
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    /// What the sandbox may reach.
    #[serde(default)]
    pub networking: Option<NetworkingConfig>,
    /// Packages to install before the harness starts.
    #[serde(default)]
    pub packages: Option<EnvironmentPackages>,
    /// A Dockerfile of the subset omabox builds into the environment layer.
    #[serde(default)]
    pub dockerfile: Option<String>,
}

impl EnvironmentConfig {
    /// The environment layer of the linux sandboxes: the apt packages, the dockerfile and
    /// the files of `data_dir`'s file store its `COPY` steps take (path and SHA-256 each;
    /// `None` when there is neither apt nor dockerfile).
    pub fn env_layer(&self, data_dir: &DataDir) -> anyhow::Result<Option<LayerSpec>> {
        let apt = self
            .packages
            .as_ref()
            .and_then(|p| p.apt.clone())
            .unwrap_or_default();
        let dockerfile = self.dockerfile.as_deref().filter(|d| !d.trim().is_empty());
        if apt.is_empty() && dockerfile.is_none() {
            return Ok(None);
        }
        let copied = match dockerfile {
            Some(text) => omabox_sandbox::dockerfile::Dockerfile::parse(text)
                .context("`dockerfile`")?
                .copied_files(),
            None => Vec::new(),
        };
        let mut files = BTreeMap::new();
        if !copied.is_empty() {
            let store = omabox_proxy::promoted::PromotedStore::open(&data_dir.files_home())
                .context("cannot open the file store")?;
            for id in copied {
                let path = store
                    .content_path(&id)
                    .filter(|p| p.is_file())
                    .with_context(|| {
                        format!("`dockerfile` COPY {id}: no such file in omabox's file store")
                    })?;
                let bytes = std::fs::read(&path).with_context(|| format!("COPY {id}"))?;
                let sha256 = hex::encode(sha2::Sha256::digest(&bytes));
                files.insert(id, CopyFile { path, sha256 });
            }
        }
        LayerSpec::new(apt, dockerfile, files).map_err(|reason| {
            anyhow::anyhow!("--environment packages.apt and dockerfile: {reason}")
        })
    }

    /// Reads `path`: an Environment object or its `config`.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text =
            crate::input_file::read_text(path, "--environment", crate::input_file::DOCUMENT_MAX)?;
        Self::parse(&text).with_context(|| format!("--environment {}", path.display()))
    }

    /// Parses an Environment object or its `config` (JSON text), checked as [`Self::load`]
    /// checks a file.
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let value: serde_json::Value = serde_json::from_str(text).context("not JSON")?;
        // Only an object is an Environment or a config: serde would read a struct from an
        // array too (`[]` as an empty environment), and `null` only by luck of the error.
        let serde_json::Value::Object(mut object) = value else {
            anyhow::bail!(
                "must be a JSON object (an Environment or its `config`), not {}",
                json_kind(&value)
            );
        };
        let config = match object.remove("config") {
            Some(serde_json::Value::Object(config)) => config,
            Some(other) => anyhow::bail!(
                "the Environment's `config` must be a JSON object, not {}",
                json_kind(&other)
            ),
            None => object,
        };
        let config: Self = serde_json::from_value(serde_json::Value::Object(config))
            .context("not an Environment config")?;
        if let Some(packages) = &config.packages {
            packages.validate().context("packages")?;
        }
        if let Some(dockerfile) = &config.dockerfile {
            omabox_sandbox::dockerfile::Dockerfile::parse(dockerfile).context("`dockerfile`")?;
        }
        if let Some(networking) = &config.networking {
            NetworkPolicy::compile(networking, &[]).context("networking")?;
        }
        Ok(config)
    }
}

/// What a JSON value is, for messages.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// The gateway as the host reaches it and as the sandbox does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayRoute {
    /// Where the host reaches the gateway, and the name the sandbox knows it by.
    pub gateway: GatewaySetting,
    /// The URL the harness in the sandbox is given.
    pub sandbox_url: String,
}

/// Routes `url` (checked by `check_gateway`) into a linux sandbox: resolves its host on
/// the host side.
pub async fn gateway_route(url: &str) -> anyhow::Result<GatewayRoute> {
    let mut parsed = url::Url::parse(url).context("--inference-gateway")?;
    let port = parsed
        .port_or_known_default()
        .context("--inference-gateway names no port")?;
    let host = parsed
        .host()
        .context("--inference-gateway names no host")?
        .to_owned();
    let (addr, name) = match host {
        url::Host::Ipv4(ip) => (SocketAddr::new(IpAddr::V4(ip), port), None),
        url::Host::Ipv6(ip) => (SocketAddr::new(IpAddr::V6(ip), port), None),
        url::Host::Domain(name) => {
            let addr = tokio::net::lookup_host((name.as_str(), port))
                .await
                .ok()
                .and_then(|mut addrs| addrs.next())
                .with_context(|| format!("--inference-gateway: {name} does not resolve"))?;
            (addr, Some(name))
        }
    };
    let gateway = GatewaySetting {
        addr,
        name: name.clone(),
    };
    if name.is_none() && addr.ip() != IpAddr::V4(Ipv4Addr::LOCALHOST) {
        let _ = parsed.set_ip_host(IpAddr::V4(Ipv4Addr::LOCALHOST));
    }
    Ok(GatewayRoute {
        gateway,
        sandbox_url: parsed.to_string(),
    })
}

/// The networking of a linux run: `environment`'s (else the operator's
/// `OMABOX_LINUX_NETWORK`, already in the config: `None`, else `limited` with nothing
/// allowed, the gateway only).
pub fn linux_network(
    environment: Option<&EnvironmentConfig>,
    operator_network: Option<&str>,
) -> Option<NetworkingConfig> {
    match (
        environment.and_then(|e| e.networking.as_ref()),
        operator_network,
    ) {
        (Some(config), _) => Some(config.clone()),
        (None, Some(_)) => None,
        (None, None) => Some(NetworkingConfig::Limited {
            allowed_hosts: Vec::new(),
            allow_package_managers: false,
            allow_mcp_servers: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_environment_or_its_config_is_read() {
        let limited = NetworkingConfig::Limited {
            allowed_hosts: vec!["api.example.com".into()],
            allow_package_managers: true,
            allow_mcp_servers: false,
        };
        for text in [
            r#"{"type":"cloud","networking":{"type":"limited","allowed_hosts":["api.example.com"],"allow_package_managers":true}}"#,
            r#"{"config":{"type":"cloud","networking":{"type":"limited","allowed_hosts":["api.example.com"],"allow_package_managers":true},"packages":{"pip":[]}}}"#,
        ] {
            let config = EnvironmentConfig::parse(text).unwrap();
            assert_eq!(config.networking, Some(limited.clone()));
        }
        assert_eq!(
            EnvironmentConfig::parse("{}").unwrap(),
            EnvironmentConfig::default()
        );
    }

    #[test]
    fn what_omabox_cannot_do_is_refused_naming_it() {
        for (text, says) in [
            (
                r#"{"packages":{"pip":["--pre"]}}"#,
                "invalid pip package name",
            ),
            (
                r#"{"packages":{"brew":["x"]}}"#,
                "not an Environment config",
            ),
            (r#"{"dockerfile":"FROM debian"}"#, "`dockerfile`"),
            (r#"{"dockerfile":"RUN true\nADD a b"}"#, "`dockerfile`"),
            (
                r#"{"networking":{"type":"open"}}"#,
                "not an Environment config",
            ),
            (
                r#"{"networking":{"type":"limited","allowed_hosts":["10.0.0.1"]}}"#,
                "networking",
            ),
            (r#"{"network":{}}"#, "not an Environment config"),
            ("[", "not JSON"),
            (
                "[]",
                "must be a JSON object (an Environment or its `config`), not an array",
            ),
            ("null", "not null"),
            ("42", "not a number"),
            (r#""cloud""#, "not a string"),
            (
                r#"{"config":[]}"#,
                "`config` must be a JSON object, not an array",
            ),
            (
                r#"{"config":null}"#,
                "`config` must be a JSON object, not null",
            ),
            (
                r#"{"dockerfile":"RUN --mount=type=secret,id=k cat /run/secrets/k"}"#,
                "line 1: RUN --mount=type=secret,id=k is not supported",
            ),
            (
                r#"{"packages":{"type":"pip","pip":["six"]}}"#,
                "not an Environment config",
            ),
        ] {
            let err = format!("{:#}", EnvironmentConfig::parse(text).unwrap_err());
            assert!(err.contains(says), "{text}: {err}");
        }
    }

    /// The public Environment API's exact shapes: the Environment object a retrieve
    /// returns (every packages list, `"type": "packages"`), and create params whose
    /// fields are `null` ("Fields default to null").
    #[test]
    fn the_public_apis_environment_json_is_read() {
        let response = r#"{"id":"env_011CZkZ9X2dpNyB7HsEFoRfW","type":"environment","name":"python-data","description":null,
            "config":{"type":"cloud",
                "networking":{"type":"limited","allowed_hosts":["api.example.com"],"allow_mcp_servers":false,"allow_package_managers":true},
                "packages":{"type":"packages","apt":[],"cargo":[],"gem":[],"go":[],"npm":[],"pip":["pandas==2.2.0"]}},
            "metadata":{},"archived_at":null,"created_at":"2026-04-01T00:00:00Z","updated_at":"2026-04-01T00:00:00Z"}"#;
        let config = EnvironmentConfig::parse(response).unwrap();
        assert_eq!(config.kind.as_deref(), Some("cloud"));
        let packages = config.packages.unwrap();
        assert_eq!(packages.pip, Some(vec!["pandas==2.2.0".to_owned()]));
        assert!(!packages.is_empty());
        assert_eq!(
            config.networking,
            Some(NetworkingConfig::Limited {
                allowed_hosts: vec!["api.example.com".into()],
                allow_package_managers: true,
                allow_mcp_servers: false,
            })
        );
        let params = r#"{"type":"cloud",
            "networking":{"type":"limited","allowed_hosts":null,"allow_mcp_servers":null,"allow_package_managers":null},
            "packages":{"type":"packages","apt":null,"cargo":null,"gem":null,"go":null,"npm":null,"pip":null}}"#;
        let config = EnvironmentConfig::parse(params).unwrap();
        assert!(config.packages.unwrap().is_empty());
        assert_eq!(
            config.networking,
            Some(NetworkingConfig::Limited {
                allowed_hosts: vec![],
                allow_package_managers: false,
                allow_mcp_servers: false,
            })
        );
        let nulls = r#"{"type":"cloud","networking":null,"packages":null,"dockerfile":null}"#;
        assert_eq!(
            EnvironmentConfig::parse(nulls).unwrap(),
            EnvironmentConfig {
                kind: Some("cloud".into()),
                ..EnvironmentConfig::default()
            }
        );
    }

    #[tokio::test]
    async fn the_gateway_keeps_its_name_or_moves_to_the_sandbox_loopback() {
        let addr = |route: &GatewayRoute| route.gateway.addr.to_string();
        let route = gateway_route("http://127.0.0.1:8787/").await.unwrap();
        assert_eq!(
            (addr(&route), route.gateway.name),
            ("127.0.0.1:8787".into(), None)
        );
        assert_eq!(route.sandbox_url, "http://127.0.0.1:8787/");
        let route = gateway_route("http://10.1.2.3:9000/x").await.unwrap();
        assert_eq!(addr(&route), "10.1.2.3:9000");
        assert_eq!(route.sandbox_url, "http://127.0.0.1:9000/x");
        let route = gateway_route("http://[::1]:8787/").await.unwrap();
        assert_eq!(addr(&route), "[::1]:8787");
        assert_eq!(route.sandbox_url, "http://127.0.0.1:8787/");
        let route = gateway_route("http://localhost:8787/").await.unwrap();
        assert_eq!(
            route.gateway.name.as_deref(),
            Some("localhost"),
            "{route:?}"
        );
        assert_eq!(route.sandbox_url, "http://localhost:8787/");
    }

    #[test]
    fn a_run_defaults_to_limited_unless_the_operator_or_the_environment_says() {
        assert_eq!(
            linux_network(None, None),
            Some(NetworkingConfig::Limited {
                allowed_hosts: vec![],
                allow_package_managers: false,
                allow_mcp_servers: false
            })
        );
        assert_eq!(linux_network(None, Some("none")), None);
        let env = EnvironmentConfig {
            networking: Some(NetworkingConfig::Unrestricted),
            ..EnvironmentConfig::default()
        };
        assert_eq!(
            linux_network(Some(&env), Some("none")),
            Some(NetworkingConfig::Unrestricted)
        );
    }
}
