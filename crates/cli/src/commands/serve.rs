//! `omabox serve [--listen ADDR] [--config FILE]`: the HTTP edge (`omabox-proxy`) over this
//! machine's store — the hosted inference proxy, the MCP proxy, session file promotion,
//! `/healthz`, `/metrics` and `/openapi.json` — until SIGINT or SIGTERM.
//!
//! Session tokens and vault secrets live in the SQLite store of the data directory (tokens
//! hashed). File promotion reads the session's last publication from the same store and blob
//! store `omabox run` publishes to.
//!
//! Runs over HTTP (issue 30; docs/http-api.md): `POST /v1/sessions/{id}/runs` queues a run
//! in the store's run queue, `GET /v1/runs/{id}` and `/v1/runs/{id}/events` report it; this
//! process's [`RunWorker`] claims queued runs (at most `--max-runs` at once) and runs them
//! like `omabox run`. With `--database-url`, every serve host on the database shares the
//! queue, and a run queued or ended on any host wakes the others (`LISTEN`/`NOTIFY`).
//!
//! E2B's sandbox control plane (`/sandboxes`, `/v2/sandboxes`; docs/http-api.md) runs linux
//! sandboxes owned by this process ([`SandboxHost`]); they are killed when serve stops.
//!
//! Operator access (file promotion and content) always needs a key: `OMABOX_API_KEY` (or the
//! config's `operator_api_key_env` / `operator_api_key`), else the key generated on first
//! start into `<data-dir>/serve-api-key` (0600; printed once, when generated). Requests are
//! served only when their Host is the config's `public_url` or a loopback name.

use anyhow::Context as _;
use async_trait::async_trait;
use clap::Args;
use omabox_contract::{PortError, RuntimeResourcePublication, SecretString};
use omabox_host::work_item::session_scope;
use omabox_node::config::{Flags, Key};
use omabox_node::runs::{RunQueueService, RunWorker};
use omabox_node::sandboxes::{SandboxHost, ServeBackend};
use omabox_node::session::publication;
use omabox_node::store_choice::ChosenStore;
use omabox_node::{DataDir, NodeConfig, Runner};
use omabox_persistence::{BlobStore, FilesystemSessionOutputPort, FilesystemWorkspacePort};
use omabox_proxy::files::{PublicationLookup, PublishedSessionFiles};
use omabox_proxy::operator_key::{self, KeyOrigin};
use omabox_proxy::promoted::PromotedStore;
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

/// Options of `omabox serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8787")]
    listen: SocketAddr,
    /// What runs the sandboxes of the E2B API: `linux` (namespaces; templates are images;
    /// a pause keeps files), `gvisor` (runsc; the base template or an image; a pause keeps
    /// processes and memory) or `docker` (containers of the engine at DOCKER_HOST; templates are its
    /// image references, `base` OMABOX_LINUX_IMAGE; a pause keeps files). Runs use
    /// `omabox run`'s backend setting, not this.
    #[arg(long, value_enum, default_value = "linux")]
    backend: SandboxBackend,
    /// Configuration file (TOML when it ends in .toml, JSON otherwise): model cards, MCP
    /// servers, operator key. Without it: no cards (ANTHROPIC_API_KEY/ANTHROPIC_BASE_URL
    /// fallback), no MCP servers.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Time to receive a request head, in ms, from its first byte or from accept (config
    /// limits.header_read_timeout_ms; default 10000).
    #[arg(long, value_name = "MS")]
    header_read_timeout_ms: Option<u64>,
    /// How long an idle connection is kept for its next request, in ms; the header-read
    /// timeout while the server is crowded (config limits.keepalive_timeout_ms; default
    /// 610000, beyond the E2B SDKs' 300 s pools).
    #[arg(long, value_name = "MS")]
    keepalive_timeout_ms: Option<u64>,
    /// Close a connection on which no byte moved either way for this long, in ms; bounds
    /// streamed proxy bodies too (config limits.idle_timeout_ms; default 300000).
    #[arg(long, value_name = "MS")]
    idle_timeout_ms: Option<u64>,
    /// Connections served at once; beyond it, accepting pauses (config
    /// limits.max_connections; default 1024).
    #[arg(long, value_name = "N")]
    max_connections: Option<usize>,
    /// Largest buffered request body in bytes; proxy bodies stream and are excepted (config
    /// limits.max_body_bytes; default 1048576).
    #[arg(long, value_name = "BYTES")]
    max_body_bytes: Option<usize>,
    /// Queued runs (`POST /v1/sessions/{id}/runs`) this server runs at once; it claims no
    /// more from the queue (default 4).
    #[arg(long, value_name = "N")]
    max_runs: Option<u64>,
}

impl ServeArgs {
    /// The flags that are settings.
    pub fn flags(&self, flags: Flags) -> Flags {
        let text = |n: Option<u64>| n.map(|n| n.to_string());
        flags
            .with_some(
                Key::ServeHeaderReadTimeoutMs,
                text(self.header_read_timeout_ms),
            )
            .with_some(
                Key::ServeKeepaliveTimeoutMs,
                text(self.keepalive_timeout_ms),
            )
            .with_some(Key::ServeIdleTimeoutMs, text(self.idle_timeout_ms))
            .with_some(
                Key::ServeMaxConnections,
                text(self.max_connections.map(|n| n as u64)),
            )
            .with_some(
                Key::ServeMaxBodyBytes,
                text(self.max_body_bytes.map(|n| n as u64)),
            )
            .with_some(Key::ServeMaxRuns, text(self.max_runs))
    }
}

/// `--backend` of `omabox serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SandboxBackend {
    Linux,
    Gvisor,
    Docker,
}

/// The serve configuration's limits with the settings (flags, env, node file) over them.
fn apply_limits(config: &NodeConfig, limits: &mut omabox_proxy::Limits) -> anyhow::Result<()> {
    let given = |key| -> anyhow::Result<Option<u64>> {
        Ok(config
            .given(key)
            .map(|_| config.number(key))
            .transpose()?
            .flatten())
    };
    if let Some(ms) = given(Key::ServeHeaderReadTimeoutMs)? {
        limits.header_read_timeout_ms = ms;
    }
    if let Some(ms) = given(Key::ServeKeepaliveTimeoutMs)? {
        limits.keepalive_timeout_ms = ms;
    }
    if let Some(ms) = given(Key::ServeIdleTimeoutMs)? {
        limits.idle_timeout_ms = ms;
    }
    if let Some(max) = given(Key::ServeMaxConnections)? {
        limits.max_connections = usize::try_from(max).unwrap_or(usize::MAX);
    }
    if let Some(max) = given(Key::ServeMaxBodyBytes)? {
        limits.max_body_bytes = usize::try_from(max).unwrap_or(usize::MAX);
    }
    limits.validate().context("invalid serve limits")?;
    Ok(())
}

/// The env var that holds the operator key.
const OPERATOR_KEY_ENV: &str = "OMABOX_API_KEY";

/// Serves until SIGINT/SIGTERM.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &ServeArgs,
) -> anyhow::Result<ExitCode> {
    // As many descriptors as the hard limit allows: the connection cap is derived from them
    // (omabox_proxy::server::connection_cap), and a low soft limit would only lower it.
    if let Err(error) = omabox_proxy::server::raise_nofile_limit() {
        tracing::warn!(%error, "cannot raise the file descriptor limit");
    }
    let settings = config;
    let mut config = match &args.config {
        Some(path) => ServeConfig::load(path)
            .with_context(|| format!("cannot load the configuration {}", path.display()))?,
        None => ServeConfig::default(),
    };
    apply_limits(settings, &mut config.limits)?;
    let limits = config.limits.clone();
    std::fs::create_dir_all(data_dir.root()).with_context(|| {
        format!(
            "cannot create the data directory {}",
            data_dir.root().display()
        )
    })?;
    // The data directory's SQLite store, or the PostgreSQL one `database_url` names (whose
    // run queue several serve hosts share).
    let store = omabox_node::store_choice::open(settings, data_dir).await?;
    // `--blob-dir` (shared by hosts) or the data dir's: serve only reads it.
    let blob_dir = data_dir.blobs();
    let blobs = Arc::new(
        BlobStore::at(&blob_dir)
            .with_context(|| format!("cannot open the blob store in {}", blob_dir.display()))?,
    );
    let files = PublishedSessionFiles::new(
        Arc::new(StorePublications(store.clone())),
        Arc::clone(&blobs),
        Arc::new(FilesystemWorkspacePort::with_store(
            data_dir.root(),
            Arc::clone(&blobs),
        )),
        Arc::new(FilesystemSessionOutputPort::with_store(
            data_dir.root(),
            blobs,
        )),
        PromotedStore::open(&data_dir.files_home())
            .context("cannot open the promoted-file store")?,
    );
    let env: BTreeMap<String, SecretString> = omabox_proxy::env_keys(&config)
        .into_iter()
        .filter_map(|key| {
            let value = settings.environment().text(&key)?;
            Some((key, SecretString::new(value)))
        })
        .collect();
    let (operator_key, key_origin) = operator_key(settings, &config, data_dir)?;
    let backend = match args.backend {
        SandboxBackend::Linux => ServeBackend::Linux,
        SandboxBackend::Gvisor => ServeBackend::Gvisor,
        SandboxBackend::Docker => ServeBackend::Docker,
    };
    let sandboxes = SandboxHost::new(settings, data_dir, backend).await?;
    let public_url = config.public_url.clone();
    let wake = Arc::new(tokio::sync::Notify::new());
    // On PostgreSQL every host's queued or ended run wakes this worker (`LISTEN`); its poll
    // is then only the fallback for claims of dead hosts.
    let run_listener = store
        .listen_for_runs(Arc::clone(&wake))
        .await
        .context("cannot listen for queued runs")?;
    let runs = RunQueueService::new(store.runs(), settings.clone(), Arc::clone(&wake));
    let worker = RunWorker::new(
        store.runs(),
        Runner::new(settings.clone(), data_dir.clone()),
        settings.clone(),
        host_id(),
        settings.number(Key::ServeMaxRuns)?.unwrap_or(4),
        wake,
    )?;
    let worker = if run_listener.is_some() {
        worker.with_poll(omabox_node::runs::LISTENING_POLL)
    } else {
        worker
    };
    let state = ProxyState::new(ProxyDeps {
        config,
        tokens: store.tokens(),
        vault: store.vault(),
        files: Some(Arc::new(files)),
        env,
        operator_key: operator_key.clone(),
        sandboxes: Some(Arc::new(sandboxes.clone())),
        runs: Some(Arc::new(runs)),
    })?;
    // Before anything is announced: a SIGTERM from then on drains and exits cleanly, and
    // the run worker cancels its runs (left claimed for any host once their claims expire).
    let signal = omabox_proxy::shutdown_signal();
    let (stop_worker, worker_stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        signal.await;
        let _ = stop_worker.send(());
    };
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let address = listener.local_addr()?;
    errln!("omabox serve: listening on http://{address}");
    announce_key(data_dir, key_origin, &operator_key, address);
    if public_url.is_none() && !address.ip().is_loopback() {
        errln!(
            "omabox serve: no public_url configured: only requests whose Host is a loopback name are served"
        );
    }
    let worker = tokio::spawn(worker.run(async move {
        let _ = worker_stopped.await;
    }));
    let served = omabox_proxy::serve(listener, omabox_proxy::router(state), &limits, shutdown)
        .await
        .context("the server failed");
    if let Err(error) = worker.await {
        errln!("omabox serve: the run worker failed: {error}");
    }
    // Every sandbox dies with serve (one that cannot be killed is `omabox reap`'s).
    for error in sandboxes.shutdown().await {
        errln!("omabox serve: {error}");
    }
    drop(run_listener);
    served?;
    errln!("omabox serve: stopped");
    Ok(ExitCode::SUCCESS)
}

/// Where the operator key came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeySource {
    /// The environment or the configuration.
    Given,
    /// The data dir's key file.
    File(KeyOrigin),
}

/// The operator key: `OMABOX_API_KEY`, the config's, or the data dir's (generated once).
fn operator_key(
    settings: &NodeConfig,
    config: &ServeConfig,
    data_dir: &DataDir,
) -> anyhow::Result<(SecretString, KeySource)> {
    let from_env = |name: &str| settings.environment().text(name);
    let given = settings
        .secret(Key::OperatorApiKey)
        .map(|key| key.expose().to_owned())
        .filter(|key| !key.is_empty())
        .or_else(|| config.operator_api_key_env.as_deref().and_then(from_env))
        .or_else(|| config.operator_api_key.clone());
    if let Some(key) = given {
        return Ok((SecretString::new(key), KeySource::Given));
    }
    let (key, origin) = operator_key::load_or_create(data_dir.root())?;
    Ok((key, KeySource::File(origin)))
}

/// Tells the operator how to authenticate; the key itself only right after generating it.
fn announce_key(data_dir: &DataDir, source: KeySource, key: &SecretString, address: SocketAddr) {
    let path = data_dir.operator_key();
    let usage = format!(
        "curl -H \"Authorization: Bearer $(cat {})\" http://{address}/v1/files/<id>/content",
        path.display()
    );
    match source {
        KeySource::Given => errln!(
            "omabox serve: operator routes need the configured key ({OPERATOR_KEY_ENV}) as \"Authorization: Bearer <key>\""
        ),
        KeySource::File(KeyOrigin::Generated) => errln!(
            "omabox serve: generated the operator key (shown this once; kept in {}, mode 0600):\n  {}\n  use it as: {usage}",
            path.display(),
            key.expose()
        ),
        KeySource::File(KeyOrigin::Existing) => {
            errln!(
                "omabox serve: operator key in {}; use it as: {usage}",
                path.display()
            );
        }
    }
}

/// This process's run-queue host id (`<hostname>:<pid>:<random>`, like a fence owner id).
fn host_id() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    omabox_host::work_item::owner_id(&hostname, std::process::id(), rand::random())
}

/// A session's last publication from the fence store (`local/default/<session>/main`, the
/// work item `omabox run` uses).
struct StorePublications(ChosenStore);

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
