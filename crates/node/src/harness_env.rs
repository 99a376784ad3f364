//! The harness env projection of `omabox run`: a claim's session token (and, with an
//! inference gateway, the hosted inference URL) merged into the harness process's env at
//! spawn time, through the sandbox crate's [`HarnessEnvSource`] hook.
//!
//! | variable                                   | without a gateway | with `--inference-gateway URL` |
//! |--------------------------------------------|-------------------|--------------------------------|
//! | `HOSTED_INFERENCE_TOKEN`                   | the claim's token | the claim's token              |
//! | `HOSTED_INFERENCE_URL`                     | —                 | `URL`'s origin + `/v1/oma/inference-proxy/<session>` |
//! | the nine provider keys, `OPENAI_BASE_URL`  | untouched         | removed (also from an inherited host env) |
//! | `--agent`'s adapter variables (`omabox_acp::agents`, e.g. `ANTHROPIC_BASE_URL`, `ANTHROPIC_AUTH_TOKEN`) | — | set from the URL and the token |
//!
//! The token comes from [`SessionTokenSlots`], filled by the `SessionTokenFence` when the
//! host claims the work item and emptied when it releases it; nothing here copies, logs or
//! persists it. With a gateway the projection is the contract's
//! [`apply_hosted_inference_to_agent_env`]; the provider keys are removed even if no token
//! is found (fail closed: the harness never falls back to a host model key).

use omabox_acp::agents::KnownAgent;
use omabox_contract::hosted_inference::{
    HOSTED_INFERENCE_TOKEN_ENV, HOSTED_INFERENCE_URL_ENV, HostedInferenceCapability,
    MODEL_PROVIDER_SECRET_ENV_KEYS, OPENAI_BASE_URL_ENV, apply_hosted_inference_to_agent_env,
    build_hosted_inference_base_url,
};
use omabox_contract::{RuntimeResourceScope, SecretString};
use omabox_host::session_tokens::SessionTokenSlots;
use omabox_sandbox::managed::HarnessEnvSource;
use std::collections::BTreeMap;

/// The session-token projection (module doc).
pub struct SessionTokenEnv {
    slots: SessionTokenSlots,
    gateway: Option<String>,
    agent: Option<&'static KnownAgent>,
}

impl std::fmt::Debug for SessionTokenEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTokenEnv")
            .field("slots", &self.slots)
            .field("gateway", &self.gateway.is_some())
            .finish()
    }
}

impl SessionTokenEnv {
    /// Projects the tokens of `slots`; `gateway` (an absolute URL, checked by
    /// [`check_gateway`]) enables the hosted inference projection.
    pub fn new(slots: SessionTokenSlots, gateway: Option<String>) -> Self {
        Self {
            slots,
            gateway,
            agent: None,
        }
    }

    /// Also projects `agent`'s inference adapter (its native base URL and token variables,
    /// see [`omabox_acp::agents`]) when a gateway and a token are there.
    pub fn with_agent(mut self, agent: Option<&'static KnownAgent>) -> Self {
        self.agent = agent;
        self
    }
}

/// Fails when `gateway` is not an absolute URL the proxy base-URL builder accepts.
pub fn check_gateway(gateway: &str) -> anyhow::Result<()> {
    if build_hosted_inference_base_url(gateway, "probe").is_none() {
        anyhow::bail!("--inference-gateway must be an absolute URL (e.g. http://HOST:PORT/)");
    }
    Ok(())
}

impl HarnessEnvSource for SessionTokenEnv {
    fn env_for(
        &self,
        scope: &RuntimeResourceScope,
        generation: Option<u64>,
    ) -> BTreeMap<String, Option<SecretString>> {
        let token = match generation {
            Some(generation) => self.slots.get(scope, generation),
            None => self.slots.current(scope),
        };
        let mut env = BTreeMap::new();
        let Some(gateway) = &self.gateway else {
            if let Some(token) = token {
                env.insert(HOSTED_INFERENCE_TOKEN_ENV.to_owned(), Some(token));
            }
            return env;
        };
        for key in MODEL_PROVIDER_SECRET_ENV_KEYS
            .iter()
            .copied()
            .chain([OPENAI_BASE_URL_ENV])
        {
            env.insert(key.to_owned(), None);
        }
        let Some(token) = token else {
            return env;
        };
        let capability = HostedInferenceCapability {
            gateway_base_url: gateway.clone(),
            sessions_token: token,
        };
        let projected = apply_hosted_inference_to_agent_env(
            &scope.session_id,
            &BTreeMap::new(),
            Some(&capability),
            true,
        )
        .unwrap_or_default();
        if let (Some(agent), Some(url)) = (self.agent, projected.get(HOSTED_INFERENCE_URL_ENV)) {
            env.extend(agent.inference_env(url, &capability.sessions_token));
        }
        env.extend(
            projected
                .into_iter()
                .map(|(key, value)| (key, Some(SecretString::new(value)))),
        );
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_host::session_tokens::SessionTokenSink;

    fn scope() -> RuntimeResourceScope {
        RuntimeResourceScope::new("w", "e", "sess one", "main")
    }

    fn exposed(env: &BTreeMap<String, Option<SecretString>>) -> BTreeMap<String, Option<String>> {
        env.iter()
            .map(|(key, value)| (key.clone(), value.as_ref().map(|v| v.expose().to_owned())))
            .collect()
    }

    #[test]
    fn without_a_gateway_only_the_token_is_set() {
        let slots = SessionTokenSlots::new();
        slots.deliver(&scope(), 2, SecretString::new("omst_a"));
        let env = SessionTokenEnv::new(slots, None);
        let expected = BTreeMap::from([(
            HOSTED_INFERENCE_TOKEN_ENV.to_owned(),
            Some("omst_a".to_owned()),
        )]);
        assert_eq!(exposed(&env.env_for(&scope(), Some(2))), expected);
        assert_eq!(exposed(&env.env_for(&scope(), None)), expected);
        assert!(env.env_for(&scope(), Some(1)).is_empty());
    }

    #[test]
    fn the_scope_lookup_takes_the_newest_generation() {
        let slots = SessionTokenSlots::new();
        slots.deliver(&scope(), 1, SecretString::new("omst_old"));
        slots.deliver(&scope(), 3, SecretString::new("omst_new"));
        let env = exposed(&SessionTokenEnv::new(slots, None).env_for(&scope(), None));
        assert_eq!(env[HOSTED_INFERENCE_TOKEN_ENV].as_deref(), Some("omst_new"));
    }

    #[test]
    fn a_gateway_projects_the_url_and_removes_the_provider_keys() {
        let slots = SessionTokenSlots::new();
        slots.deliver(&scope(), 1, SecretString::new("omst_a"));
        let env = SessionTokenEnv::new(slots, Some("http://u:p@127.0.0.1:9/x?q#f".into()));
        let env = exposed(&env.env_for(&scope(), Some(1)));
        assert_eq!(
            env[HOSTED_INFERENCE_URL_ENV].as_deref(),
            Some("http://127.0.0.1:9/v1/oma/inference-proxy/sess%20one")
        );
        assert_eq!(env[HOSTED_INFERENCE_TOKEN_ENV].as_deref(), Some("omst_a"));
        for key in MODEL_PROVIDER_SECRET_ENV_KEYS {
            assert_eq!(env[key], None, "{key}");
        }
        assert_eq!(env[OPENAI_BASE_URL_ENV], None);
        assert_eq!(env.len(), 12);
    }

    #[test]
    fn an_agent_adapter_adds_its_native_variables() {
        let slots = SessionTokenSlots::new();
        slots.deliver(&scope(), 1, SecretString::new("omst_a"));
        let claude = omabox_acp::agents::known_agent("claude");
        let env =
            SessionTokenEnv::new(slots, Some("http://127.0.0.1:9/".into())).with_agent(claude);
        let env = exposed(&env.env_for(&scope(), Some(1)));
        assert_eq!(
            env["ANTHROPIC_BASE_URL"].as_deref(),
            Some("http://127.0.0.1:9/v1/oma/inference-proxy/sess%20one/anthropic")
        );
        assert_eq!(env["ANTHROPIC_AUTH_TOKEN"].as_deref(), Some("omst_a"));
        assert_eq!(env["ANTHROPIC_API_KEY"], None);
    }

    #[test]
    fn a_gateway_without_a_token_still_removes_the_provider_keys() {
        let env = SessionTokenEnv::new(SessionTokenSlots::new(), Some("http://h/".into()));
        let env = env.env_for(&scope(), Some(1));
        assert_eq!(env.len(), 10);
        assert!(env.values().all(Option::is_none));
    }

    #[test]
    fn the_gateway_is_checked() {
        assert!(check_gateway("http://127.0.0.1:9/").is_ok());
        assert!(check_gateway("not a url").is_err());
    }
}
