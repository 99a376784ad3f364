//! What every route shares: configuration, ports, the upstream client and metrics; and the
//! two resolutions routes need (a session's upstream model, an operator's access).

use crate::ProxyError;
use crate::config::{ModelCard, ServeConfig};
use crate::e2b::SandboxService;
use crate::files::SessionFilesPort;
use crate::host_rule::HostRule;
use crate::inference::UpstreamModel;
use crate::metrics::Metrics;
use crate::runs::RunService;
use omabox_contract::{SecretString, SessionTokenPort, VaultSecretPort};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Everything [`ProxyState::new`] needs.
pub struct ProxyDeps {
    /// The configuration.
    pub config: ServeConfig,
    /// Session tokens (verify only).
    pub tokens: Arc<dyn SessionTokenPort>,
    /// Vault secrets (model keys by name, MCP credentials).
    pub vault: Arc<dyn VaultSecretPort>,
    /// File promotion; `None` answers 400 (the backend cannot read bytes).
    pub files: Option<Arc<dyn SessionFilesPort>>,
    /// The env values the config names (`api_key_env`) plus `ANTHROPIC_API_KEY` and
    /// `ANTHROPIC_BASE_URL`, snapshotted at start.
    pub env: BTreeMap<String, SecretString>,
    /// The operator key: a bearer (or `x-api-key`) equal to it may call the operator routes
    /// (file promotion and content). There is no keyless mode.
    pub operator_key: SecretString,
    /// The sandboxes of the E2B-compatible routes; `None` answers them 503 (after the
    /// key check).
    pub sandboxes: Option<Arc<dyn SandboxService>>,
    /// The run queue of `/v1/sessions/{id}/runs` and `/v1/runs/{id}`; `None` answers them
    /// 400 (after the key check).
    pub runs: Option<Arc<dyn RunService>>,
}

impl std::fmt::Debug for ProxyDeps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyDeps")
            .field("env", &self.env.keys())
            .finish_non_exhaustive()
    }
}

/// The env var names a configuration reads (for [`ProxyDeps::env`]).
pub fn env_keys(config: &ServeConfig) -> Vec<String> {
    let mut keys = vec![
        "ANTHROPIC_API_KEY".to_owned(),
        "ANTHROPIC_BASE_URL".to_owned(),
    ];
    let cards = config
        .models
        .default
        .iter()
        .chain(config.models.sessions.values());
    keys.extend(cards.filter_map(|card| card.api_key_env.clone()));
    keys.sort();
    keys.dedup();
    keys
}

/// Shared state; cheap to clone.
#[derive(Clone, Debug)]
pub struct ProxyState {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: ServeConfig,
    pub(crate) tokens: Arc<dyn SessionTokenPort>,
    pub(crate) vault: Arc<dyn VaultSecretPort>,
    pub(crate) files: Option<Arc<dyn SessionFilesPort>>,
    pub(crate) env: BTreeMap<String, SecretString>,
    pub(crate) operator_key: SecretString,
    pub(crate) sandboxes: Option<Arc<dyn SandboxService>>,
    pub(crate) runs: Option<Arc<dyn RunService>>,
    pub(crate) host_rule: HostRule,
    pub(crate) client: reqwest::Client,
    pub(crate) metrics: Metrics,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyState").finish_non_exhaustive()
    }
}

impl ProxyState {
    /// Builds the state and its upstream client (rustls, redirects never followed, the
    /// configured idle timeout between upstream reads).
    pub fn new(deps: ProxyDeps) -> Result<Self, ProxyError> {
        // An empty key would be matched by an empty `X-API-Key` (or `Bearer `) header.
        if deps.operator_key.expose().trim().is_empty() {
            return Err(ProxyError::EmptyOperatorKey);
        }
        let host_rule = HostRule::new(deps.config.public_url.as_deref()).ok_or_else(|| {
            ProxyError::Internal("public_url must be an absolute http(s) URL".to_owned())
        })?;
        // reqwest is built without a crypto provider of its own: ring, as everywhere else.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            // An upstream that sends nothing for the idle timeout is cut off like a client.
            .read_timeout(std::time::Duration::from_millis(
                deps.config.limits.idle_timeout_ms,
            ))
            .connect_timeout(std::time::Duration::from_secs(10))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| ProxyError::Internal(format!("cannot build the HTTP client: {e}")))?;
        Ok(Self {
            inner: Arc::new(Inner {
                config: deps.config,
                tokens: deps.tokens,
                vault: deps.vault,
                files: deps.files,
                env: deps.env,
                operator_key: deps.operator_key,
                sandboxes: deps.sandboxes,
                runs: deps.runs,
                host_rule,
                client,
                metrics: Metrics::default(),
            }),
        })
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.inner.metrics
    }

    /// The session's upstream: its card (or the default card) when its key is available,
    /// else `ANTHROPIC_API_KEY` / `ANTHROPIC_BASE_URL`; `None` when neither exists.
    pub async fn resolve_upstream(
        &self,
        session_id: &str,
    ) -> Result<Option<UpstreamModel>, ProxyError> {
        let models = &self.inner.config.models;
        let card = models.sessions.get(session_id).or(models.default.as_ref());
        if let Some(card) = card
            && let Some(upstream) = self.card_upstream(card).await?
        {
            return Ok(Some(upstream));
        }
        let Some(api_key) = self.inner.env.get("ANTHROPIC_API_KEY").cloned() else {
            return Ok(None);
        };
        Ok(Some(UpstreamModel {
            provider: Some("anthropic".to_owned()),
            base_url: self
                .inner
                .env
                .get("ANTHROPIC_BASE_URL")
                .map(|url| url.expose().to_owned()),
            api_key: Some(api_key),
            ..UpstreamModel::default()
        }))
    }

    /// A card as an upstream; `None` when it names a key that is not available.
    async fn card_upstream(&self, card: &ModelCard) -> Result<Option<UpstreamModel>, ProxyError> {
        let api_key = match (&card.api_key_vault, &card.api_key_env) {
            (Some(name), _) => match self.inner.vault.get(name).await? {
                Some(key) => Some(key),
                None => card
                    .api_key_env
                    .as_ref()
                    .and_then(|env| self.inner.env.get(env).cloned()),
            },
            (None, Some(env)) => self.inner.env.get(env).cloned(),
            (None, None) => None,
        };
        let names_a_key = card.api_key_vault.is_some() || card.api_key_env.is_some();
        if names_a_key && api_key.is_none() {
            return Ok(None);
        }
        Ok(Some(UpstreamModel {
            provider: card.provider.clone(),
            base_url: card.base_url.clone(),
            api_key,
            custom_headers: card.custom_headers.clone(),
            protocol_endpoints: card.protocol_endpoints.clone(),
        }))
    }

    /// Checks an operator credential (`None`: none presented).
    pub fn operator_allows(&self, presented: Option<&str>) -> bool {
        let key = &self.inner.operator_key;
        // Compare digests so the comparison time says nothing about the key; an empty
        // credential never matches (ProxyState::new refuses an empty key too).
        presented.is_some_and(|presented| {
            !presented.is_empty()
                && Sha256::digest(presented.as_bytes()) == Sha256::digest(key.expose().as_bytes())
        })
    }
}
