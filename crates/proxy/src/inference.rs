//! The hosted inference proxy as data (reference §5): constants, token extraction, sub-path parsing, the endpoint catalog, upstream URL rules and header
//! planning. Pure: no I/O and no HTTP types, so every rule is tested on its own; the route in
//! [`crate::routes::inference`] only translates.
//!
//! Must never: put a session token or an upstream key in an error, a URL or a log line.

use crate::sub_path::{SubPath, base_segments, upstream_url};
use std::collections::BTreeMap;

pub use omabox_contract::hosted_inference::{
    HOSTED_INFERENCE_PROXY_PREFIX, HOSTED_INFERENCE_TOKEN_ENV, HOSTED_INFERENCE_URL_ENV,
    HostedInferenceCapability, MODEL_PROVIDER_SECRET_ENV_KEYS, OPENAI_BASE_URL_ENV,
    apply_hosted_inference_to_agent_env, build_hosted_inference_base_url, encode_uri_component,
    project_hosted_inference_env,
};

/// Inbound credential headers: never forwarded upstream.
pub const INBOUND_CREDENTIAL_HEADERS: [&str; 5] = [
    "authorization",
    "x-api-key",
    "api-key",
    "x-goog-api-key",
    "proxy-authorization",
];

/// Hop-by-hop headers: dropped in both directions.
pub const HOP_BY_HOP_HEADERS: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailers",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// Default base URL of a provider for the legacy (un-prefixed) URL rule.
pub fn default_provider_base(provider: &str) -> Option<&'static str> {
    match provider.to_ascii_lowercase().as_str() {
        "deepseek" => Some("https://api.deepseek.com"),
        "openai" => Some("https://api.openai.com"),
        "anthropic" => Some("https://api.anthropic.com"),
        _ => None,
    }
}

/// A wire protocol the proxy can route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum WireProtocol {
    /// Anthropic Messages.
    #[serde(rename = "anthropic-messages")]
    AnthropicMessages,
    /// OpenAI Chat Completions.
    #[serde(rename = "openai-chat")]
    OpenAiChat,
    /// OpenAI Responses.
    #[serde(rename = "openai-responses")]
    OpenAiResponses,
    /// Google Gemini.
    #[serde(rename = "gemini")]
    Gemini,
}

impl WireProtocol {
    /// The proxy path segment clients put after the session id.
    pub fn proxy_path_segment(self) -> &'static str {
        match self {
            Self::OpenAiChat | Self::OpenAiResponses => "openai/v1",
            Self::AnthropicMessages => "anthropic",
            Self::Gemini => "gemini",
        }
    }

    fn is_openai(self) -> bool {
        matches!(self, Self::OpenAiChat | Self::OpenAiResponses)
    }
}

/// One routable endpoint of a model card.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProtocolEndpoint {
    /// The wire protocol it speaks.
    pub protocol: WireProtocol,
    /// Its proxy path segment (derived from the protocol when absent in config).
    #[serde(default)]
    pub proxy_path_segment: Option<String>,
    /// Its upstream base URL.
    pub upstream_base_url: String,
}

impl ProtocolEndpoint {
    /// An endpoint with the protocol's own path segment.
    pub fn new(protocol: WireProtocol, upstream_base_url: impl Into<String>) -> Self {
        Self {
            protocol,
            proxy_path_segment: Some(protocol.proxy_path_segment().to_owned()),
            upstream_base_url: upstream_base_url.into(),
        }
    }
}

/// `isHostedInferenceProxyPath`: `^/v1/oma/inference-proxy/<non-slash segment>`.
pub fn is_hosted_inference_proxy_path(path: &str) -> bool {
    path.strip_prefix(HOSTED_INFERENCE_PROXY_PREFIX)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
}

/// How the client presented its session token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenTransport {
    /// `Authorization` (with or without `Bearer `).
    Bearer,
    /// `x-api-key`.
    XApiKey,
}

/// The outcome of [`extract_hosted_inference_proxy_token`]. `Debug` never shows the token.
#[derive(Clone, PartialEq, Eq)]
pub enum TokenExtraction {
    /// Neither header carried a token.
    Missing,
    /// Both carried one and they differ.
    Mismatch,
    /// The token and how it came.
    Ok {
        /// The presented token.
        token: String,
        /// Which header carried it.
        transport: TokenTransport,
    },
}

impl std::fmt::Debug for TokenExtraction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing => f.write_str("Missing"),
            Self::Mismatch => f.write_str("Mismatch"),
            Self::Ok { transport, .. } => f
                .debug_struct("Ok")
                .field("token", &"[redacted]")
                .field("transport", transport)
                .finish(),
        }
    }
}

/// `extractHostedInferenceProxyToken` over the values of `authorization` and `x-api-key`.
pub fn extract_hosted_inference_proxy_token(
    authorization: Option<&str>,
    x_api_key: Option<&str>,
) -> TokenExtraction {
    let bearer = authorization
        .map(|value| value.strip_prefix("Bearer ").unwrap_or(value).trim())
        .filter(|value| !value.is_empty());
    let api_key = x_api_key.map(str::trim).filter(|value| !value.is_empty());
    match (bearer, api_key) {
        (None, None) => TokenExtraction::Missing,
        (Some(bearer), Some(api_key)) if bearer != api_key => TokenExtraction::Mismatch,
        (Some(bearer), _) => TokenExtraction::Ok {
            token: bearer.to_owned(),
            transport: TokenTransport::Bearer,
        },
        (None, Some(api_key)) => TokenExtraction::Ok {
            token: api_key.to_owned(),
            transport: TokenTransport::XApiKey,
        },
    }
}

/// A sub-path split into its protocol prefix (if any) and the relative rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedSubPath {
    /// The family named by the prefix; `None` for an un-prefixed (legacy) path.
    pub prefix: Option<ProtocolPrefix>,
    /// The segments after the prefix.
    pub relative: Vec<String>,
}

/// A recognised protocol prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolPrefix {
    /// `openai/v1/`: openai-chat or openai-responses.
    OpenAi,
    /// `anthropic/`.
    Anthropic,
    /// `gemini/`.
    Gemini,
}

impl ProtocolPrefix {
    /// The protocols the prefix may route to, preferred first for `relative`.
    pub fn candidates(self, relative: &[String]) -> &'static [WireProtocol] {
        match self {
            Self::OpenAi if relative.first().is_some_and(|s| s.starts_with("responses")) => {
                &[WireProtocol::OpenAiResponses, WireProtocol::OpenAiChat]
            }
            Self::OpenAi => &[WireProtocol::OpenAiChat, WireProtocol::OpenAiResponses],
            Self::Anthropic => &[WireProtocol::AnthropicMessages],
            Self::Gemini => &[WireProtocol::Gemini],
        }
    }
}

/// `parseHostedInferenceSubPath` over decoded segments: prefixes in order `openai/v1/`,
/// `anthropic/`, `gemini/`; exactly a prefix leaves an empty relative path.
pub fn parse_hosted_inference_sub_path(sub_path: &SubPath) -> ParsedSubPath {
    let segments = sub_path.segments();
    let prefixes: [(&[&str], ProtocolPrefix); 3] = [
        (&["openai", "v1"], ProtocolPrefix::OpenAi),
        (&["anthropic"], ProtocolPrefix::Anthropic),
        (&["gemini"], ProtocolPrefix::Gemini),
    ];
    for (text, prefix) in prefixes {
        let matches = segments.len() >= text.len()
            && segments
                .iter()
                .zip(text)
                .all(|(segment, text)| segment == text);
        if matches {
            return ParsedSubPath {
                prefix: Some(prefix),
                relative: segments[text.len()..].to_vec(),
            };
        }
    }
    ParsedSubPath {
        prefix: None,
        relative: segments.to_vec(),
    }
}

/// `relative` starts with "v1/" (a "v1" followed by something).
fn starts_with_v1(relative: &[String]) -> bool {
    relative.len() > 1 && relative[0] == "v1"
}

/// A base URL's text without surrounding blanks and one trailing "/", and whether its path
/// ends with a `v1` segment; `None` when empty or not an absolute URL.
fn parse_base(base: &str) -> Option<(&str, bool)> {
    let base = base.trim();
    let base = base.strip_suffix('/').unwrap_or(base);
    let url = url::Url::parse(base).ok()?;
    let ends_with_v1 = base_segments(&url).last().is_some_and(|last| last == "v1");
    Some((base, ends_with_v1))
}

/// `resolveUpstreamInferenceUrl` (legacy, un-prefixed) over decoded segments: `None` when
/// the path is empty or a segment contains "..", or when there is no base.
pub fn resolve_upstream_inference_url(
    base_url: Option<&str>,
    provider: Option<&str>,
    relative: &[String],
    query: Option<&str>,
) -> Option<url::Url> {
    if relative.is_empty() || relative.iter().any(|segment| segment.contains("..")) {
        return None;
    }
    let root = match base_url.map(str::trim).filter(|base| !base.is_empty()) {
        Some(base) => base,
        None => default_provider_base(provider?)?,
    };
    let (root, ends_with_v1) = parse_base(root)?;
    let mut relative = relative;
    while ends_with_v1 && starts_with_v1(relative) {
        relative = &relative[1..];
    }
    upstream_url(root, relative, query)
}

/// The upstream URL of `relative` on an endpoint (protocol-prefixed edition).
pub fn endpoint_upstream_url(
    endpoint: &ProtocolEndpoint,
    relative: &[String],
    query: Option<&str>,
) -> Option<url::Url> {
    let (base, ends_with_v1) = parse_base(&endpoint.upstream_base_url)?;
    let mut relative = relative.to_vec();
    if endpoint.protocol.is_openai() && !relative.is_empty() {
        if !ends_with_v1 && !starts_with_v1(&relative) {
            relative.insert(0, "v1".to_owned());
        }
        while ends_with_v1 && starts_with_v1(&relative) {
            relative.remove(0);
        }
    }
    upstream_url(base, &relative, query)
}

/// The endpoint catalog of a model card: explicit non-empty `protocol_endpoints` win; else the
/// provider's defaults (unknown provider → none).
pub fn endpoint_catalog(
    provider: Option<&str>,
    base_url: Option<&str>,
    protocol_endpoints: &[ProtocolEndpoint],
) -> Vec<ProtocolEndpoint> {
    if !protocol_endpoints.is_empty() {
        return protocol_endpoints.to_vec();
    }
    let base = base_url.map(str::trim).filter(|base| !base.is_empty());
    let without_v1 = |default: &str| {
        let base = base.unwrap_or(default);
        let base = base.strip_suffix('/').unwrap_or(base);
        base.strip_suffix("/v1").unwrap_or(base).to_owned()
    };
    match provider.unwrap_or("").to_ascii_lowercase().as_str() {
        "deepseek" => vec![
            ProtocolEndpoint::new(WireProtocol::OpenAiChat, "https://api.deepseek.com"),
            ProtocolEndpoint::new(
                WireProtocol::AnthropicMessages,
                "https://api.deepseek.com/anthropic",
            ),
        ],
        "anthropic" | "ant" | "ant-compatible" => vec![ProtocolEndpoint::new(
            WireProtocol::AnthropicMessages,
            without_v1("https://api.anthropic.com"),
        )],
        "openai" | "oai" | "oai-compatible" => {
            let base = without_v1("https://api.openai.com");
            vec![
                ProtocolEndpoint::new(WireProtocol::OpenAiChat, base.clone()),
                ProtocolEndpoint::new(WireProtocol::OpenAiResponses, base),
            ]
        }
        "google" | "gemini" => {
            let base = base.unwrap_or("https://generativelanguage.googleapis.com");
            vec![ProtocolEndpoint::new(
                WireProtocol::Gemini,
                base.strip_suffix('/').unwrap_or(base),
            )]
        }
        _ => Vec::new(),
    }
}

/// Where a request goes, or why it cannot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamTarget {
    /// The upstream URL (with the inbound query).
    Url(url::Url),
    /// No URL can be built: 403 `forbidden`.
    NoUrl,
    /// The requested protocol has no endpoint: 409 `inference_protocol_unsupported`.
    ProtocolUnsupported,
}

/// The upstream a session's model resolves to (a model card or the env fallback).
#[derive(Clone, Default)]
pub struct UpstreamModel {
    /// Provider id (`anthropic`, `openai`, `deepseek`, `gemini`, …).
    pub provider: Option<String>,
    /// Base URL.
    pub base_url: Option<String>,
    /// The upstream key; never logged.
    pub api_key: Option<omabox_contract::SecretString>,
    /// Headers set after the credential (overwrite).
    pub custom_headers: BTreeMap<String, String>,
    /// Explicit endpoints (win over the provider's defaults).
    pub protocol_endpoints: Vec<ProtocolEndpoint>,
}

impl std::fmt::Debug for UpstreamModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamModel")
            .field("provider", &self.provider)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "[redacted]"))
            .field("custom_headers", &self.custom_headers.keys())
            .field("protocol_endpoints", &self.protocol_endpoints)
            .finish()
    }
}

/// Plans the upstream URL of `sub_path` (and the inbound `query`) for `upstream`: a protocol
/// prefix routes through the endpoint catalog; an un-prefixed path uses the legacy rule.
pub fn plan_upstream_target(
    upstream: &UpstreamModel,
    sub_path: &SubPath,
    query: Option<&str>,
) -> UpstreamTarget {
    let parsed = parse_hosted_inference_sub_path(sub_path);
    let Some(prefix) = parsed.prefix else {
        return resolve_upstream_inference_url(
            upstream.base_url.as_deref(),
            upstream.provider.as_deref(),
            &parsed.relative,
            query,
        )
        .map_or(UpstreamTarget::NoUrl, UpstreamTarget::Url);
    };
    let catalog = endpoint_catalog(
        upstream.provider.as_deref(),
        upstream.base_url.as_deref(),
        &upstream.protocol_endpoints,
    );
    let endpoint = prefix
        .candidates(&parsed.relative)
        .iter()
        .find_map(|protocol| catalog.iter().find(|e| e.protocol == *protocol));
    match endpoint {
        None => UpstreamTarget::ProtocolUnsupported,
        Some(endpoint) => endpoint_upstream_url(endpoint, &parsed.relative, query)
            .map_or(UpstreamTarget::NoUrl, UpstreamTarget::Url),
    }
}

/// Whether an inbound request header is copied upstream.
pub fn is_forwarded_request_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    !HOP_BY_HOP_HEADERS.contains(&name.as_str())
        && !INBOUND_CREDENTIAL_HEADERS.contains(&name.as_str())
}

/// Whether an upstream response header is copied back to the client.
pub fn is_forwarded_response_header(name: &str) -> bool {
    !HOP_BY_HOP_HEADERS.contains(&name.to_ascii_lowercase().as_str())
}

/// Where the upstream credential goes for a provider: anthropic-ish → `x-api-key`,
/// gemini/google → `x-goog-api-key`, otherwise `authorization: Bearer`.
pub fn upstream_credential_header(provider: Option<&str>, api_key: &str) -> (&'static str, String) {
    match provider.unwrap_or("").to_ascii_lowercase().as_str() {
        "ant" | "anthropic" | "ant-compatible" => ("x-api-key", api_key.to_owned()),
        "gemini" | "google" => ("x-goog-api-key", api_key.to_owned()),
        _ => ("authorization", format!("Bearer {api_key}")),
    }
}

/// The upstream request headers: inbound headers except hop-by-hop and inbound credentials,
/// then the upstream credential, then the custom headers (overwriting). Names are lowercased.
pub fn plan_upstream_headers<'a>(
    inbound: impl IntoIterator<Item = (&'a str, &'a [u8])>,
    upstream: &UpstreamModel,
) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = inbound
        .into_iter()
        .filter(|(name, _)| is_forwarded_request_header(name))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.to_vec()))
        .collect();
    let mut set = |name: &str, value: Vec<u8>| {
        out.retain(|(existing, _)| existing != name);
        out.push((name.to_owned(), value));
    };
    if let Some(key) = &upstream.api_key {
        let (name, value) = upstream_credential_header(upstream.provider.as_deref(), key.expose());
        set(name, value.into_bytes());
    }
    for (name, value) in &upstream.custom_headers {
        set(&name.to_ascii_lowercase(), value.clone().into_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::SecretString;

    #[test]
    fn proxy_path_matcher() {
        assert!(is_hosted_inference_proxy_path("/v1/oma/inference-proxy/s1"));
        assert!(is_hosted_inference_proxy_path(
            "/v1/oma/inference-proxy/s1/anthropic/v1/messages"
        ));
        assert!(!is_hosted_inference_proxy_path("/v1/oma/inference-proxy/"));
        assert!(!is_hosted_inference_proxy_path(
            "/v1/oma/inference-proxy//x"
        ));
        assert!(!is_hosted_inference_proxy_path(
            "/v1/oma/inference-proxyx/s"
        ));
    }

    #[test]
    fn token_extraction() {
        use TokenExtraction::*;
        assert_eq!(extract_hosted_inference_proxy_token(None, None), Missing);
        assert_eq!(
            extract_hosted_inference_proxy_token(Some("Bearer  "), Some(" ")),
            Missing
        );
        assert_eq!(
            extract_hosted_inference_proxy_token(Some("Bearer a"), Some("b")),
            Mismatch
        );
        assert_eq!(
            extract_hosted_inference_proxy_token(Some("Bearer a"), Some(" a ")),
            Ok {
                token: "a".into(),
                transport: TokenTransport::Bearer
            }
        );
        assert_eq!(
            extract_hosted_inference_proxy_token(Some(" raw "), None),
            Ok {
                token: "raw".into(),
                transport: TokenTransport::Bearer
            }
        );
        assert_eq!(
            extract_hosted_inference_proxy_token(None, Some("k")),
            Ok {
                token: "k".into(),
                transport: TokenTransport::XApiKey
            }
        );
        let debug = format!(
            "{:?}",
            extract_hosted_inference_proxy_token(None, Some("very-secret"))
        );
        assert!(!debug.contains("very-secret"));
    }

    fn sp(raw: &str) -> SubPath {
        SubPath::parse(raw).unwrap()
    }

    fn segs(raw: &str) -> Vec<String> {
        sp(raw).segments().to_vec()
    }

    fn text(url: Option<url::Url>) -> Option<String> {
        url.map(String::from)
    }

    #[test]
    fn sub_path_prefixes() {
        let parsed = parse_hosted_inference_sub_path(&sp("openai/v1/chat/completions"));
        assert_eq!(parsed.prefix, Some(ProtocolPrefix::OpenAi));
        assert_eq!(parsed.relative, ["chat", "completions"]);
        let parsed = parse_hosted_inference_sub_path(&sp("anthropic"));
        assert_eq!(parsed.prefix, Some(ProtocolPrefix::Anthropic));
        assert!(parsed.relative.is_empty());
        let parsed = parse_hosted_inference_sub_path(&sp("gemini/v1beta/models"));
        assert_eq!(parsed.prefix, Some(ProtocolPrefix::Gemini));
        let parsed = parse_hosted_inference_sub_path(&sp("anthropicx/v1"));
        assert_eq!(parsed.prefix, None);
        assert_eq!(parsed.relative, ["anthropicx", "v1"]);
        let parsed = parse_hosted_inference_sub_path(&sp("openai/v2"));
        assert_eq!(parsed.prefix, None);
    }

    #[test]
    fn legacy_url_rule_dedups_v1() {
        assert_eq!(
            text(resolve_upstream_inference_url(
                Some("https://x.test/v1/"),
                None,
                &segs("v1/v1/messages"),
                None
            ))
            .as_deref(),
            Some("https://x.test/v1/messages")
        );
        assert_eq!(
            text(resolve_upstream_inference_url(
                None,
                Some("anthropic"),
                &segs("v1/messages"),
                Some("beta=true")
            ))
            .as_deref(),
            Some("https://api.anthropic.com/v1/messages?beta=true")
        );
        assert_eq!(
            resolve_upstream_inference_url(None, Some("x"), &segs("a"), None),
            None
        );
        assert_eq!(
            resolve_upstream_inference_url(Some("https://x"), None, &[], None),
            None
        );
        assert_eq!(
            resolve_upstream_inference_url(Some("https://x"), None, &segs("a/b..c"), None),
            None
        );
        assert_eq!(
            resolve_upstream_inference_url(Some("not a url"), None, &segs("a"), None),
            None
        );
    }

    #[test]
    fn deepseek_endpoints() {
        let upstream = UpstreamModel {
            provider: Some("deepseek".into()),
            ..UpstreamModel::default()
        };
        let url = |raw: &str| match plan_upstream_target(&upstream, &sp(raw), None) {
            UpstreamTarget::Url(url) => Some(String::from(url)),
            _ => None,
        };
        assert_eq!(
            url("openai/v1/chat/completions").as_deref(),
            Some("https://api.deepseek.com/v1/chat/completions")
        );
        assert_eq!(
            url("anthropic/v1/messages").as_deref(),
            Some("https://api.deepseek.com/anthropic/v1/messages")
        );
        assert_eq!(
            plan_upstream_target(&upstream, &sp("gemini/v1beta/models"), None),
            UpstreamTarget::ProtocolUnsupported
        );
    }

    #[test]
    fn catalog_defaults() {
        let ant = endpoint_catalog(Some("Anthropic"), Some("https://a.test/v1/"), &[]);
        assert_eq!(
            ant,
            [ProtocolEndpoint::new(
                WireProtocol::AnthropicMessages,
                "https://a.test"
            )]
        );
        let oai = endpoint_catalog(Some("oai-compatible"), None, &[]);
        assert_eq!(oai.len(), 2);
        assert_eq!(oai[0].upstream_base_url, "https://api.openai.com");
        let gem = endpoint_catalog(Some("google"), None, &[]);
        assert_eq!(
            gem[0].upstream_base_url,
            "https://generativelanguage.googleapis.com"
        );
        assert!(endpoint_catalog(Some("mystery"), Some("https://m"), &[]).is_empty());
        let explicit = [ProtocolEndpoint::new(WireProtocol::Gemini, "https://g")];
        assert_eq!(
            endpoint_catalog(Some("anthropic"), None, &explicit),
            explicit
        );
    }

    #[test]
    fn openai_url_rules() {
        let endpoint = ProtocolEndpoint::new(WireProtocol::OpenAiChat, "https://o.test/v1/");
        assert_eq!(
            text(endpoint_upstream_url(
                &endpoint,
                &segs("v1/chat/completions"),
                None
            ))
            .as_deref(),
            Some("https://o.test/v1/chat/completions")
        );
        assert_eq!(
            text(endpoint_upstream_url(&endpoint, &[], None)).as_deref(),
            Some("https://o.test/v1")
        );
        let endpoint = ProtocolEndpoint::new(WireProtocol::OpenAiResponses, "https://o.test");
        assert_eq!(
            text(endpoint_upstream_url(&endpoint, &segs("responses"), None)).as_deref(),
            Some("https://o.test/v1/responses")
        );
    }

    #[test]
    fn headers_strip_credentials_and_set_upstream_key() {
        let inbound: Vec<(&str, &[u8])> = vec![
            ("Authorization", b"Bearer session"),
            ("x-api-key", b"session"),
            ("api-key", b"session"),
            ("x-goog-api-key", b"session"),
            ("proxy-authorization", b"session"),
            ("connection", b"keep-alive"),
            ("host", b"proxy"),
            ("content-length", b"3"),
            ("content-type", b"application/json"),
            ("anthropic-version", b"2023-06-01"),
        ];
        let mut upstream = UpstreamModel {
            provider: Some("anthropic".into()),
            api_key: Some(SecretString::new("up-key")),
            custom_headers: BTreeMap::from([("anthropic-version".into(), "custom".into())]),
            ..UpstreamModel::default()
        };
        let planned = plan_upstream_headers(inbound.clone(), &upstream);
        let names: Vec<&str> = planned.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "x-api-key", "anthropic-version"]);
        assert_eq!(planned[1].1, b"up-key");
        assert_eq!(planned[2].1, b"custom");

        upstream.provider = Some("gemini".into());
        let planned = plan_upstream_headers(inbound.clone(), &upstream);
        assert!(planned.contains(&("x-goog-api-key".into(), b"up-key".to_vec())));
        upstream.provider = Some("openai".into());
        let planned = plan_upstream_headers(inbound, &upstream);
        assert!(planned.contains(&("authorization".into(), b"Bearer up-key".to_vec())));
        assert!(!planned.iter().any(|(n, _)| n == "x-api-key"));
    }
}
