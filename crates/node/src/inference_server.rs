//! The hosted inference proxy `omabox run` serves itself for an ACP agent when no
//! `--inference-gateway` is given: the same proxy as `omabox serve` (`omabox_proxy`), bound
//! to a free port on the host's loopback for the length of the run, verifying the run's
//! session token against the same store.
//!
//! Upstream (the model the agent's calls go to), as `omabox serve` resolves it:
//! `--inference-config FILE` (serve's configuration format; its `models` are used), else a
//! default card for the agent's provider from the operator's environment —
//! `anthropic`: `ANTHROPIC_API_KEY` (+ `ANTHROPIC_BASE_URL`), `openai`: `OPENAI_API_KEY`
//! (+ `OPENAI_BASE_URL`). The key stays in this process: the sandbox sees only the
//! session token. Without any key the run still starts and the agent's model calls are
//! answered 403 (a warning, handed to the caller, says which variable is missing). The keys
//! and base URLs are settings (`crate::config`), read from the environment when the proxy
//! starts.

use crate::NodeConfig;
use crate::config::Key;
use crate::store_choice::ChosenStore;
use anyhow::Context;
use omabox_contract::SecretString;
use omabox_proxy::{ModelCard, ProxyDeps, ProxyState, ServeConfig};
use std::collections::BTreeMap;
use std::path::Path;
use tokio::sync::oneshot;

/// A running in-process proxy; stops when dropped.
#[derive(Debug)]
pub struct InferenceServer {
    url: String,
    stop: Option<oneshot::Sender<()>>,
}

impl InferenceServer {
    /// The gateway origin (`http://127.0.0.1:PORT/`), for `--inference-gateway`'s place.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for InferenceServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The configuration for `provider` (`anthropic`|`openai`): `config_file`'s, else the
/// settings' default card.
pub fn config(
    settings: &NodeConfig,
    config_file: Option<&Path>,
    provider: &str,
) -> anyhow::Result<ServeConfig> {
    let mut config = match config_file {
        Some(path) => ServeConfig::load(path)
            .with_context(|| format!("cannot load the configuration {}", path.display()))?,
        None => ServeConfig::default(),
    };
    if config_file.is_none() && provider == "openai" {
        config.models.default = Some(ModelCard {
            provider: Some("openai".to_owned()),
            base_url: settings
                .given_nonempty(Key::OpenaiBaseUrl)
                .map(str::to_owned),
            api_key_env: Some("OPENAI_API_KEY".to_owned()),
            ..ModelCard::default()
        });
    }
    Ok(config)
}

/// Starts the proxy on `127.0.0.1:0` over `store`'s session tokens and vault, with the
/// model keys of `settings`' environment; `warn` gets a line when there is no key.
pub async fn start(
    settings: &NodeConfig,
    store: &ChosenStore,
    config: ServeConfig,
    warn: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<InferenceServer> {
    let env: BTreeMap<String, SecretString> = omabox_proxy::env_keys(&config)
        .into_iter()
        .chain(["OPENAI_API_KEY".to_owned()])
        .filter_map(|key| {
            let value = settings.environment().text(&key)?;
            Some((key, SecretString::new(value)))
        })
        .collect();
    if !has_key(&config, &env) {
        warn(
            "omabox: warning: no model key for the agent (set ANTHROPIC_API_KEY, OPENAI_API_KEY or --inference-config): its model calls will be refused",
        );
    }
    let limits = config.limits.clone();
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens: store.tokens(),
        vault: store.vault(),
        files: None,
        env,
        // The operator routes are not used by a run; nobody knows this key.
        operator_key: SecretString::new(format!("{:032x}", rand::random::<u128>())),
        sandboxes: None,
        runs: None,
    })?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .context("cannot listen on the host's loopback for the inference proxy")?;
    let address = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        if let Err(error) =
            omabox_proxy::serve(listener, omabox_proxy::router(state), &limits, shutdown).await
        {
            tracing::warn!(%error, "the in-process inference proxy failed");
        }
    });
    Ok(InferenceServer {
        url: format!("http://{address}/"),
        stop: Some(stop),
    })
}

/// Whether some card (or the anthropic fallback) has its key.
fn has_key(config: &ServeConfig, env: &BTreeMap<String, SecretString>) -> bool {
    let cards = config
        .models
        .default
        .iter()
        .chain(config.models.sessions.values());
    let mut any_card = false;
    for card in cards {
        any_card = true;
        if card.api_key_vault.is_some()
            || card
                .api_key_env
                .as_ref()
                .is_some_and(|k| env.contains_key(k))
            || (card.api_key_env.is_none() && card.api_key_vault.is_none())
        {
            return true;
        }
    }
    !any_card && env.contains_key("ANTHROPIC_API_KEY")
}
