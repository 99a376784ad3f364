//! omabox's HTTP edge: the hosted inference proxy (reference §5), the MCP proxy, session file
//! promotion, E2B's sandbox control plane over a [`e2b::SandboxService`], and `/healthz`, `/metrics`, `/openapi.json`. The only crate that knows HTTP.
//!
//! A sandboxed agent calls its model and its MCP servers through this crate without ever
//! holding their credentials: it presents its short-lived session token, the token is
//! verified through [`omabox_contract::SessionTokenPort`], and the upstream credential (a
//! model-card key or a vault secret) is added here, on the server side.
//!
//! Layout: [`inference`] and [`mcp`] are the rules as pure data; `routes` translates HTTP to
//! them; [`status_of`] is the one mapping of errors to statuses; `forward` streams bodies both
//! ways without buffering and never follows redirects.
//!
//! Must never: log, return or put in a URL a session token, a model key or a vault secret
//! (credential headers are marked sensitive before tracing sees them); follow an upstream
//! redirect; buffer a streamed body.

#![forbid(unsafe_code)]

pub mod config;
pub mod e2b;
pub mod envd;
mod error;
pub mod files;
mod forward;
pub mod host_rule;
pub mod inference;
pub mod mcp;
pub mod metrics;
pub mod operator_key;
pub mod promoted;
mod routes;
pub mod runs;
pub mod server;
mod state;
pub mod sub_path;
pub mod templates;

pub use config::{ConfigError, Limits, McpServerConfig, ModelCard, ServeConfig};
pub use error::{ProxyError, status_of};
pub use routes::{SENSITIVE_HEADERS, router};
pub use server::serve;
pub use state::{ProxyDeps, ProxyState, env_keys};

/// The OpenAPI document served at `/openapi.json`.
pub use routes::ops::OPENAPI_JSON;

/// Resolves on the first SIGINT or SIGTERM after this call (call it inside the runtime,
/// before the server is announced).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    // Registered now, not at the future's first poll: a SIGTERM that arrives between the
    // caller's "listening" line and the server's first poll would otherwise meet the
    // default action and kill the process without a drain (seen under load).
    let handlers = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    );
    async move {
        let (Ok(mut interrupt), Ok(mut terminate)) = handlers else {
            // Without signal handlers only the process's death stops the server.
            std::future::pending::<()>().await;
            return;
        };
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down: draining in-flight requests");
    }
}
