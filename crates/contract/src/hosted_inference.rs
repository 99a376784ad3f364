//! The hosted inference env projection (reference §5.1–§5.2) as pure data: which variables
//! an agent receives when the hosted inference proxy is enabled (`HOSTED_INFERENCE_URL`,
//! `HOSTED_INFERENCE_TOKEN`), which provider keys are removed from its env, and how the proxy
//! base URL is built from a gateway URL. Shared by the HTTP edge (which serves that URL) and
//! the work-item runner (which projects the env at spawn time).
//!
//! Must never: log or keep a token (it is a [`crate::SecretString`] until the env map is built).

use std::collections::BTreeMap;

/// Provider secret env keys removed from an agent's env when the proxy is enabled.
pub const MODEL_PROVIDER_SECRET_ENV_KEYS: [&str; 9] = [
    "DEEPSEEK_API_KEY",
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "XAI_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "OPENROUTER_API_KEY",
];

/// Also deleted from the agent env when the proxy is enabled.
pub const OPENAI_BASE_URL_ENV: &str = "OPENAI_BASE_URL";
/// The base URL env var the agent receives.
pub const HOSTED_INFERENCE_URL_ENV: &str = "HOSTED_INFERENCE_URL";
/// The session token env var the agent receives.
pub const HOSTED_INFERENCE_TOKEN_ENV: &str = "HOSTED_INFERENCE_TOKEN";

/// The proxy's mount point.
pub const HOSTED_INFERENCE_PROXY_PREFIX: &str = "/v1/oma/inference-proxy";

/// `buildHostedInferenceBaseUrl`: the gateway URL without credentials, query or fragment, its
/// path replaced by `/v1/oma/inference-proxy/<urlencoded session>`. `None` when the gateway
/// is not an absolute URL.
pub fn build_hosted_inference_base_url(gateway_base_url: &str, session_id: &str) -> Option<String> {
    base_url_with_path(
        gateway_base_url,
        &format!(
            "{HOSTED_INFERENCE_PROXY_PREFIX}/{}",
            encode_uri_component(session_id)
        ),
    )
}

/// Replaces the path of `gateway` (and clears user info, query and fragment).
pub fn base_url_with_path(gateway: &str, path: &str) -> Option<String> {
    let mut url = url::Url::parse(gateway).ok()?;
    if url.cannot_be_a_base() {
        return None;
    }
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    let mut text = url.origin().ascii_serialization();
    if text == "null" {
        return None;
    }
    text.push_str(path);
    if text.ends_with('/') {
        text.pop();
    }
    Some(text)
}

/// JavaScript's `encodeURIComponent`.
pub fn encode_uri_component(value: &str) -> String {
    const SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'_')
        .remove(b'.')
        .remove(b'!')
        .remove(b'~')
        .remove(b'*')
        .remove(b'\'')
        .remove(b'(')
        .remove(b')');
    percent_encoding::utf8_percent_encode(value, SET).to_string()
}

/// `projectHostedInferenceEnv`: the two variables an agent receives.
pub fn project_hosted_inference_env(
    session_id: &str,
    gateway_base_url: &str,
    sessions_token: &str,
) -> Option<BTreeMap<String, String>> {
    let url = build_hosted_inference_base_url(gateway_base_url, session_id)?;
    Some(BTreeMap::from([
        (HOSTED_INFERENCE_URL_ENV.to_owned(), url),
        (
            HOSTED_INFERENCE_TOKEN_ENV.to_owned(),
            sessions_token.to_owned(),
        ),
    ]))
}

/// The capability `applyHostedInferenceToAgentEnv` needs.
#[derive(Debug, Clone)]
pub struct HostedInferenceCapability {
    /// The OpenMA origin the sandbox can reach.
    pub gateway_base_url: String,
    /// The session token (the Work `sessions_token`).
    pub sessions_token: crate::SecretString,
}

/// `applyHostedInferenceToAgentEnv`: when enabled (`enable_proxy` and a capability), a copy of
/// `env` without the nine provider keys and `OPENAI_BASE_URL`, with `HOSTED_INFERENCE_URL` and
/// `HOSTED_INFERENCE_TOKEN` set; otherwise an unchanged copy. `None` when the gateway URL is
/// not an absolute URL.
pub fn apply_hosted_inference_to_agent_env(
    session_id: &str,
    env: &BTreeMap<String, String>,
    capability: Option<&HostedInferenceCapability>,
    enable_proxy: bool,
) -> Option<BTreeMap<String, String>> {
    let mut out = env.clone();
    let Some(capability) = capability.filter(|_| enable_proxy) else {
        return Some(out);
    };
    let projected = project_hosted_inference_env(
        session_id,
        &capability.gateway_base_url,
        capability.sessions_token.expose(),
    )?;
    for key in MODEL_PROVIDER_SECRET_ENV_KEYS {
        out.remove(key);
    }
    out.remove(OPENAI_BASE_URL_ENV);
    out.extend(projected);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SecretString;

    #[test]
    fn base_url_replaces_path_and_encodes_session() {
        assert_eq!(
            build_hosted_inference_base_url("https://api.openma.test/v1/", "session/01").as_deref(),
            Some("https://api.openma.test/v1/oma/inference-proxy/session%2F01")
        );
        assert_eq!(
            build_hosted_inference_base_url("https://u:p@h.test:8443/x?q=1#f", "s").as_deref(),
            Some("https://h.test:8443/v1/oma/inference-proxy/s")
        );
        assert_eq!(build_hosted_inference_base_url("not a url", "s"), None);
    }

    #[test]
    fn env_projection_strips_provider_keys() {
        let mut env: BTreeMap<String, String> = MODEL_PROVIDER_SECRET_ENV_KEYS
            .iter()
            .map(|k| (k.to_string(), "secret".to_owned()))
            .collect();
        env.insert("OPENAI_BASE_URL".into(), "https://x".into());
        env.insert("KEEP".into(), "1".into());
        env.insert(HOSTED_INFERENCE_TOKEN_ENV.into(), "old".into());
        let capability = HostedInferenceCapability {
            gateway_base_url: "http://127.0.0.1:8787".into(),
            sessions_token: SecretString::new("tok"),
        };
        let out = apply_hosted_inference_to_agent_env("s1", &env, Some(&capability), true).unwrap();
        assert_eq!(
            out.keys().collect::<Vec<_>>(),
            ["HOSTED_INFERENCE_TOKEN", "HOSTED_INFERENCE_URL", "KEEP"]
        );
        assert_eq!(out["HOSTED_INFERENCE_TOKEN"], "tok");
        assert_eq!(
            out["HOSTED_INFERENCE_URL"],
            "http://127.0.0.1:8787/v1/oma/inference-proxy/s1"
        );
        assert_eq!(
            apply_hosted_inference_to_agent_env("s1", &env, Some(&capability), false).unwrap(),
            env
        );
        assert_eq!(
            apply_hosted_inference_to_agent_env("s1", &env, None, true).unwrap(),
            env
        );
    }
}
