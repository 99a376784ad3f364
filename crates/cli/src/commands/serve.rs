//! `omabox serve [--listen ADDR] [--config FILE]`: the HTTP edge (`omabox-proxy`) over this
//! machine's store — the hosted inference proxy, the MCP proxy, session file promotion,
//! `/healthz`, `/metrics` and `/openapi.json` — until SIGINT or SIGTERM.
//!
//! Session tokens and vault secrets live in the SQLite store of the data directory (tokens
//! hashed). File promotion reads the session's last publication from the same store and blob
//! store `omabox run` publishes to.
//!
//! Operator access (file promotion): a bearer equal to `OMABOX_API_KEY` (or the config's
//! `operator_api_key_env` / `operator_api_key`). Without a key, a loopback listener is open
//! to local callers and any other listener refuses every operator request.

use crate::session::{open_store, publication};
use anyhow::Context as _;
use async_trait::async_trait;
use clap::Args;
use omabox_contract::{PortError, RuntimeResourcePublication, SecretString};
use omabox_host::work_item::session_scope;
use omabox_persistence::{BlobStore, FilesystemSessionOutputPort, FilesystemWorkspacePort};
use omabox_proxy::files::{PublicationLookup, PublishedSessionFiles};
use omabox_proxy::{OperatorAccess, ProxyDeps, ProxyState, ServeConfig};
use omabox_store::SqliteStore;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Options of `omabox serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// Configuration file (TOML when it ends in .toml, JSON otherwise): model cards, MCP
    /// servers, operator key. Without it: no cards (ANTHROPIC_API_KEY/ANTHROPIC_BASE_URL
    /// fallback), no MCP servers.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

/// The env var that holds the operator key.
const OPERATOR_KEY_ENV: &str = "OMABOX_API_KEY";

/// Serves until SIGINT/SIGTERM.
pub async fn run(data_dir: &Path, args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let config = match &args.config {
        Some(path) => ServeConfig::load(path)
            .with_context(|| format!("cannot load the configuration {}", path.display()))?,
        None => ServeConfig::default(),
    };
    std::fs::create_dir_all(data_dir)
        .with_context(|| format!("cannot create the data directory {}", data_dir.display()))?;
    let store = Arc::new(open_store(data_dir).await?);
    let blobs = Arc::new(
        BlobStore::new(data_dir)
            .with_context(|| format!("cannot open the blob store in {}", data_dir.display()))?,
    );
    let files = PublishedSessionFiles::new(
        Arc::new(StorePublications(Arc::clone(&store))),
        Arc::clone(&blobs),
        Arc::new(FilesystemWorkspacePort::with_store(
            data_dir,
            Arc::clone(&blobs),
        )),
        Arc::new(FilesystemSessionOutputPort::with_store(data_dir, blobs)),
    );
    let env: BTreeMap<String, SecretString> = omabox_proxy::env_keys(&config)
        .into_iter()
        .filter_map(|key| {
            let value = std::env::var(&key).ok().filter(|v| !v.is_empty())?;
            Some((key, SecretString::new(value)))
        })
        .collect();
    let operator = operator_access(&config, args.listen);
    if matches!(operator, OperatorAccess::Closed) {
        eprintln!(
            "omabox serve: no operator key ({OPERATOR_KEY_ENV}) on a non-loopback listener: file promotion is refused"
        );
    }
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens: store.clone(),
        vault: store,
        files: Some(Arc::new(files)),
        env,
        operator,
    })?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    eprintln!("omabox serve: listening on http://{address}");
    omabox_proxy::serve(
        listener,
        omabox_proxy::router(state),
        omabox_proxy::shutdown_signal(),
    )
    .await
    .context("the server failed")?;
    eprintln!("omabox serve: stopped");
    Ok(ExitCode::SUCCESS)
}

fn operator_access(config: &ServeConfig, listen: SocketAddr) -> OperatorAccess {
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let key = from_env(OPERATOR_KEY_ENV)
        .or_else(|| config.operator_api_key_env.as_deref().and_then(from_env))
        .or_else(|| config.operator_api_key.clone());
    match key {
        Some(key) => OperatorAccess::Key(SecretString::new(key)),
        None if listen.ip().is_loopback() => OperatorAccess::Open,
        None => OperatorAccess::Closed,
    }
}

/// A session's last publication from the fence store (`local/default/<session>/main`, the
/// work item `omabox run` uses).
struct StorePublications(Arc<SqliteStore>);

#[async_trait]
impl PublicationLookup for StorePublications {
    async fn publication(
        &self,
        session_id: &str,
    ) -> Result<Option<RuntimeResourcePublication>, PortError> {
        let scope = session_scope(session_id);
        publication(&self.0, &scope)
            .await
            .map_err(|error| PortError::new(format!("{error:#}")))
    }
}
