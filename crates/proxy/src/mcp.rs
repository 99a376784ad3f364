//! The MCP proxy as data: rewriting an agent's URL MCP servers so the sandbox reaches them
//! through omabox, which adds the vault credential on the server side. Pure.
//!
//! Must never: return a vault secret or its value in a rewritten server.

use crate::config::McpServerConfig;
use crate::sub_path::{SubPath, upstream_url};
use omabox_contract::hosted_inference::{base_url_with_path, encode_uri_component};

/// The proxy's mount point.
pub const MCP_PROXY_PREFIX: &str = "/v1/oma/mcp-proxy";

/// A server as the sandbox sees it: its name and the proxy URL. No credential.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RewrittenMcpServer {
    /// The server's name.
    pub name: String,
    /// `{gateway}/v1/oma/mcp-proxy/{session}/{server}`.
    pub url: String,
}

/// Rewrites every server to `{gateway}/v1/oma/mcp-proxy/{session}/{server}` (both segments
/// URL-encoded). `None` when the gateway is not an absolute URL.
pub fn rewrite_mcp_servers(
    servers: &[McpServerConfig],
    gateway_base_url: &str,
    session_id: &str,
) -> Option<Vec<RewrittenMcpServer>> {
    servers
        .iter()
        .map(|server| {
            let path = format!(
                "{MCP_PROXY_PREFIX}/{}/{}",
                encode_uri_component(session_id),
                encode_uri_component(&server.name)
            );
            Some(RewrittenMcpServer {
                name: server.name.clone(),
                url: base_url_with_path(gateway_base_url, &path)?,
            })
        })
        .collect()
}

/// The upstream URL of a decoded sub-path (and the raw inbound query) on a server's URL:
/// the segments are appended to the server URL's path; the queries are joined. `None` when
/// the server URL is not an absolute http(s) URL.
pub fn mcp_upstream_url(server_url: &str, rest: &SubPath, query: Option<&str>) -> Option<url::Url> {
    upstream_url(server_url, rest.segments(), query)
}

/// The header name and value that carry a vault secret to an MCP server: `Authorization`
/// (the default) gets `Bearer <secret>`, any other header the raw secret.
pub fn mcp_credential_header(header: Option<&str>, secret: &str) -> (String, String) {
    let name = header.unwrap_or("authorization").to_ascii_lowercase();
    let value = if name == "authorization" {
        format!("Bearer {secret}")
    } else {
        secret.to_owned()
    };
    (name, value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_without_credentials() {
        let servers = vec![McpServerConfig {
            name: "git hub".into(),
            url: "https://mcp.example/mcp".into(),
            vault_secret: Some("gh".into()),
            header: None,
        }];
        let rewritten = rewrite_mcp_servers(&servers, "http://10.0.2.2:8787/x?y", "s/1").unwrap();
        assert_eq!(
            rewritten,
            [RewrittenMcpServer {
                name: "git hub".into(),
                url: "http://10.0.2.2:8787/v1/oma/mcp-proxy/s%2F1/git%20hub".into()
            }]
        );
        assert!(rewrite_mcp_servers(&servers, "nope", "s").is_none());
    }

    #[test]
    fn upstream_urls() {
        let url = |base: &str, raw: &str, query: Option<&str>| {
            mcp_upstream_url(base, &SubPath::parse(raw).unwrap(), query).map(String::from)
        };
        assert_eq!(
            url("https://m/mcp", "", Some("a=1")).as_deref(),
            Some("https://m/mcp?a=1")
        );
        assert_eq!(
            url("https://m/mcp/", "", None).as_deref(),
            Some("https://m/mcp/")
        );
        assert_eq!(
            url("https://m/mcp/", "sse", None).as_deref(),
            Some("https://m/mcp/sse")
        );
        assert!(SubPath::parse("../x").is_err());
    }

    #[test]
    fn credential_header() {
        assert_eq!(
            mcp_credential_header(None, "s"),
            ("authorization".into(), "Bearer s".into())
        );
        assert_eq!(
            mcp_credential_header(Some("X-Token"), "s"),
            ("x-token".into(), "s".into())
        );
    }
}
