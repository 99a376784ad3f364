//! Path escapes with the credential attached (issue 10 item 1): a proxied sub-path is decoded
//! once into segments and refused (400) before any upstream request when a segment could
//! escape; the upstream URL is built from segments. Checked against a REAL upstream listener
//! that records every request it receives (requests are written as raw bytes, so no client
//! library normalizes the path first), and as properties over generated paths: end to end
//! over sockets, and on the pure planners with many cases (the stable twin of the cargo-fuzz
//! target in `fuzz/`; `OMABOX_PATH_PROPTEST_CASES` raises the count).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::escape::{check_path_under, check_raw_tail};
use common::*;
use omabox_contract::{SecretString, VaultSecretPort as _};
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

const TOKEN: &str = "tok-a-SESSION-111";

/// Sends `GET <target>` as raw bytes and returns the status code.
async fn raw_get(addr: SocketAddr, target: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "GET {target} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {TOKEN}\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// A proxy whose default card and MCP server have a base path, over a recording upstream.
async fn fixture() -> (Upstream, SocketAddr) {
    let upstream = start_upstream().await;
    let base = upstream.base();
    let config = ServeConfig::from_json(&format!(
        r#"{{
          "models": {{ "default": {{ "provider": "anthropic", "base_url": "{base}/tenant/base",
                                     "api_key_vault": "anthropic-key" }} }},
          "mcp_servers": [ {{ "name": "tools", "url": "{base}/mcp/root", "vault_secret": "mcp-secret" }} ]
        }}"#
    ))
    .unwrap();
    let tokens = Arc::new(MemoryTokens::default());
    tokens.insert(TOKEN, "sess-a");
    let vault = Arc::new(MemoryVault::default());
    for (name, value) in [
        ("anthropic-key", ANTHROPIC_UPSTREAM_KEY),
        ("mcp-secret", MCP_VAULT_SECRET),
    ] {
        vault.put(name, SecretString::new(value)).await.unwrap();
    }
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens,
        vault,
        files: None,
        env: BTreeMap::new(),
        operator_key: SecretString::new("operator-KEY-777"),
        sandboxes: None,
        runs: None,
    })
    .unwrap();
    let addr = start_proxy(state).await;
    (upstream, addr)
}

const INFERENCE: &str = "/v1/oma/inference-proxy/sess-a";
const MCP: &str = "/v1/oma/mcp-proxy/sess-a/tools";

#[tokio::test]
async fn encoded_escapes_are_refused_before_any_upstream_request() {
    let (upstream, addr) = fixture().await;
    let tails = [
        "%252e%252e/admin",
        "anthropic/%252e%252e/%252e%252e/admin",
        "anthropic/v1/%2e%2e/%2e%2e/admin",
        "anthropic/v1/.%2e/admin",
        "anthropic/v1/messages%3Fadmin=1",
        "anthropic/v1/messages%253Fadmin=1",
        "anthropic/v1/a%2f..%2f..%2fadmin",
        "anthropic/v1/a%5c..%5cadmin",
        "anthropic/v1/a%255c..%255cadmin",
        "anthropic/v1/messages%23frag",
        "anthropic/v1/messages%00",
        "anthropic/v1/messages%0d%0aX-Injected:%201",
        "anthropic/v1//admin",
        "anthropic/v1/..;/admin",
        "anthropic/v1/%c0%ae%c0%ae/admin",
        "anthropic/v1/messages/",
    ];
    for tail in tails {
        for prefix in [INFERENCE, MCP] {
            let target = format!("{prefix}/{tail}");
            assert_eq!(raw_get(addr, &target).await, 400, "{target}");
        }
    }
    assert!(
        upstream.requests().is_empty(),
        "the upstream received {:?}",
        upstream
            .requests()
            .iter()
            .map(|r| r.path_and_query.clone())
            .collect::<Vec<_>>()
    );

    // Control: well-formed paths reach exactly the planned URL, the real query unchanged.
    assert_eq!(
        raw_get(
            addr,
            &format!("{INFERENCE}/anthropic/v1/models/a%20b?x=%3F&y=1")
        )
        .await,
        200
    );
    assert_eq!(raw_get(addr, &format!("{MCP}/sse?s=%2e%2e")).await, 200);
    let seen: Vec<String> = upstream
        .requests()
        .into_iter()
        .map(|r| r.path_and_query)
        .collect();
    assert_eq!(
        seen,
        [
            "/tenant/base/v1/models/a%20b?x=%3F&y=1",
            "/mcp/root/sse?s=%2e%2e"
        ]
    );
    let recorded = upstream.requests();
    assert_eq!(recorded[0].headers["x-api-key"], ANTHROPIC_UPSTREAM_KEY);
    assert_eq!(
        recorded[1].headers["authorization"],
        format!("Bearer {MCP_VAULT_SECRET}").as_str()
    );
}

/// Pieces raw tails are made of: traversal in every encoding, separators, parameters, and
/// the route words the planners react to.
const PIECES: &[&str] = &[
    "a",
    "v1",
    "openai",
    "anthropic",
    "gemini",
    "responses",
    "messages",
    ".",
    "..",
    "%2e",
    "%2E",
    "%252e",
    "%25252e",
    "%2f",
    "%2F",
    "%252f",
    "%5c",
    "%255c",
    "\\",
    "%3f",
    "%3F",
    "%253f",
    "%23",
    "%2523",
    "%00",
    "%0a",
    "%25",
    "%",
    "%zz",
    ";",
    "..;",
    "%c0%ae",
    "%ff",
    "~",
    "%7e",
    "/",
    "//",
    ":",
    "@",
    "%40",
    " ",
    "%20",
    "+",
];

fn raw_tail_strategy(max: usize) -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        4 => prop::sample::select(PIECES).prop_map(str::to_owned),
        1 => any::<u8>().prop_map(|b| format!("%{b:02x}")),
        1 => (0x21_u8..0x7f).prop_map(|b| char::from(b).to_string()),
    ];
    prop::collection::vec(piece, 0..max).prop_map(|pieces| pieces.concat())
}

fn cases() -> u32 {
    std::env::var("OMABOX_PATH_PROPTEST_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(10_000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

    /// The planners (inference: legacy and every protocol prefix; MCP) never build a URL
    /// outside the configured base, whatever the raw sub-path and query.
    #[test]
    fn planned_urls_never_leave_the_base(raw in raw_tail_strategy(12), query in proptest::option::of("[a-z%=&?.]{0,8}")) {
        check_raw_tail(&raw, query.as_deref()).map_err(TestCaseError::fail)?;
    }
}

struct Live {
    runtime: tokio::runtime::Runtime,
    upstream: Upstream,
    addr: SocketAddr,
}

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let (upstream, addr) = runtime.block_on(fixture());
        Live {
            runtime,
            upstream,
            addr,
        }
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

    /// End to end: whatever raw path a client sends, every request the real upstream
    /// receives is under the configured base path, inert, and carries no query.
    #[test]
    fn no_upstream_request_leaves_the_base_path(raw in raw_tail_strategy(8), mcp in any::<bool>()) {
        let live = live();
        let target = if mcp { format!("{MCP}/{raw}") } else { format!("{INFERENCE}/{raw}") };
        // Bytes hyper cannot parse as a request target never reach a route; skip them.
        prop_assume!(axum::http::uri::PathAndQuery::try_from(target.as_str()).is_ok() && !target.contains('?'));
        let before = live.upstream.requests().len();
        live.runtime.block_on(raw_get(live.addr, &target));
        for request in &live.upstream.requests()[before..] {
            let allowed = if mcp { "/mcp/root" } else { "/tenant/base" };
            prop_assert!(!request.path_and_query.contains('?'), "query from the path: {}", request.path_and_query);
            check_path_under(&request.path_and_query, allowed).map_err(TestCaseError::fail)?;
        }
    }
}
