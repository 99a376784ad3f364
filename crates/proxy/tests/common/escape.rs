//! The path-escape property, written independently of the planner it checks: whatever raw
//! sub-path a client sends, every upstream URL the planners build stays on the configured
//! base's origin, under its path, and adds only segments that no amount of percent-decoding
//! turns into `.`, `..` or a separator. Shared by `tests/path_escape.rs` (proptest, on
//! stable, in CI) and `fuzz/fuzz_targets/planner.rs` (cargo-fuzz, nightly).

use omabox_proxy::inference::{
    ProtocolEndpoint, UpstreamModel, UpstreamTarget, WireProtocol, plan_upstream_target,
};
use omabox_proxy::mcp::mcp_upstream_url;
use omabox_proxy::sub_path::SubPath;
use percent_encoding::percent_decode_str;
use url::Url;

/// Upstream models and the URL every request planned for them must stay under.
pub fn upstreams() -> Vec<(UpstreamModel, &'static str)> {
    let card = |provider: &str, base: Option<&str>| UpstreamModel {
        provider: Some(provider.to_owned()),
        base_url: base.map(str::to_owned),
        ..UpstreamModel::default()
    };
    let explicit = UpstreamModel {
        provider: Some("custom".to_owned()),
        protocol_endpoints: vec![
            ProtocolEndpoint::new(WireProtocol::OpenAiChat, "https://up.test/oai/v1/"),
            ProtocolEndpoint::new(WireProtocol::Gemini, "https://up.test/gem"),
        ],
        base_url: Some("https://up.test/legacy/root".to_owned()),
        ..UpstreamModel::default()
    };
    vec![
        (
            card("anthropic", Some("https://up.test/tenant/base")),
            "https://up.test/tenant/base",
        ),
        (
            card("openai", Some("https://up.test/tenant/v1/")),
            "https://up.test/tenant",
        ),
        (
            card("gemini", Some("https://up.test/g/")),
            "https://up.test/g",
        ),
        (card("deepseek", None), "https://api.deepseek.com/"),
        (explicit, "https://up.test/"),
    ]
}

/// MCP server URLs (each is its own allowed base).
pub const MCP_SERVERS: [&str; 3] = [
    "https://up.test/mcp/root/",
    "https://up.test/mcp?k=v",
    "http://up.test:8080/a/b",
];

/// Checks every planner on one raw tail (and raw query); `Err` describes a violation.
pub fn check_raw_tail(raw: &str, query: Option<&str>) -> Result<(), String> {
    let Ok(sub_path) = SubPath::parse(raw) else {
        return Ok(());
    };
    for (upstream, allowed) in upstreams() {
        if let UpstreamTarget::Url(url) = plan_upstream_target(&upstream, &sub_path, query) {
            check_under(&url, allowed).map_err(|e| format!("{raw:?} on {allowed}: {e}"))?;
        }
    }
    for server in MCP_SERVERS {
        if let Some(url) = mcp_upstream_url(server, &sub_path, query) {
            check_under(&url, server).map_err(|e| format!("{raw:?} on {server}: {e}"))?;
        }
    }
    Ok(())
}

/// `url` is on `allowed`'s origin, under its path, and its segments are inert.
pub fn check_under(url: &Url, allowed: &str) -> Result<(), String> {
    let allowed = Url::parse(allowed).map_err(|e| e.to_string())?;
    if url.origin() != allowed.origin() {
        return Err(format!("origin of {url}"));
    }
    if url.fragment().is_some() {
        return Err(format!("fragment in {url}"));
    }
    check_path_under(url.path(), allowed.path())
}

/// A raw request path (as an upstream receives it) is under `allowed_path` and inert.
pub fn check_path_under(path: &str, allowed_path: &str) -> Result<(), String> {
    let allowed: Vec<&str> = allowed_path.split('/').filter(|s| !s.is_empty()).collect();
    let segments: Vec<&str> = path.strip_prefix('/').unwrap_or(path).split('/').collect();
    if segments.len() < allowed.len() || segments[..allowed.len()] != allowed[..] {
        return Err(format!("{path} leaves {allowed_path}"));
    }
    for (index, segment) in segments.iter().enumerate() {
        if segment.is_empty() && index + 1 != segments.len() {
            return Err(format!("empty segment in {path}"));
        }
        let decoded = decode_fully(segment);
        if decoded == "." || decoded == ".." || decoded.contains(['/', '\\', '?', '#', '\0']) {
            return Err(format!(
                "segment {segment:?} of {path} decodes to {decoded:?}"
            ));
        }
    }
    Ok(())
}

/// Percent-decodes until nothing changes (as a naive upstream might).
pub fn decode_fully(text: &str) -> String {
    let mut text = text.to_owned();
    for _ in 0..8 {
        let next = percent_decode_str(&text).decode_utf8_lossy().into_owned();
        if next == text {
            break;
        }
        text = next;
    }
    text
}
