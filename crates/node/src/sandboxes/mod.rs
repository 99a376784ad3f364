//! The long-lived sandboxes of `omabox serve` ([`SandboxHost`], the node's
//! [`SandboxService`]): linux sandboxes started from the node's typed config
//! (`NodeConfig::linux_config`, image and environment layer prepared once, before the
//! first start), or under `--backend gvisor` gvisor ones (`backend.rs`: the base template
//! only; a pause checkpoints their processes and memory), owned by serve's one process, each with an E2B-style id, its template,
//! metadata, environment variables, start and end time and a random access token, and
//! killed when its timeout expires (a timeout can be set again at any time).
//!
//! A sandbox can be paused (E2B's filesystem mode): its `/home/user`, `/workspace` and
//! `/tmp` are saved in the data dir (see [`saved`]), it is killed, and its record stays,
//! `paused`, with no timeout running, until a connect starts a new sandbox under the same id
//! and token with those files back, or a kill removes it.
//!
//! State lives in this process only. Every sandbox's state dir records serve as its owner,
//! so when serve dies without killing them, `omabox reap` destroys them (owner dead), and
//! the files of its paused sandboxes (`omabox reap` or the next serve on the same data dir).
//!
//! Must never: log a token, put one in an error, or compare one in time that depends on
//! its bytes; leave a sandbox running after [`SandboxHost::shutdown`].

mod backend;
mod envd;
mod fork;
mod lifecycle;
mod logs;
mod metrics;
mod prepare;
pub(crate) mod saved;
mod snapshots;
mod template_builds;
mod template_recipe;
mod token;

use crate::{DataDir, NodeConfig};
use anyhow::Context as _;
use async_trait::async_trait;
pub use backend::ServeBackend;
use backend::{DockerServing, GvisorServing, Running, docker_serving, gvisor_serving};
use omabox_agent::AgentClient;
use omabox_backend_gvisor::GvisorSandboxPort;
use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory};
use omabox_contract::SecretString;
use omabox_contract::networking::NetworkingConfig;
use omabox_proxy::e2b::{
    CreatedSandbox, LogLevel, NetworkUpdate, NewSandbox, SandboxInfo, SandboxLogEntry,
    SandboxMetrics, SandboxService, SandboxServiceError, SnapshotInfo,
};
use omabox_proxy::envd::SandboxEnvd;
use omabox_sandbox::SandboxFactoryContext;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};
use tokio::sync::{Notify, OnceCell};
use tokio::time::Instant;

pub use token::{new_access_token, new_sandbox_id, tokens_match};

/// The template of the default root (the node's image setting); any other template names
/// an image (a registry reference, an OCI layout or a rootfs path), prepared once.
pub const BASE_TEMPLATE: &str = "base";
/// Distinct templates (images) one serve prepares and keeps.
pub const MAX_TEMPLATES: usize = 32;
/// Sandboxes one serve runs at once (starting ones counted).
pub const MAX_SANDBOXES: usize = 1024;
/// Paused sandboxes one serve keeps at once.
pub const MAX_PAUSED: usize = 256;
/// Retry interval of a timed-out sandbox whose kill failed.
const KILL_RETRY: Duration = Duration::from_secs(5);

/// serve's sandboxes (module doc). Cheap to clone.
#[derive(Clone)]
pub struct SandboxHost {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SandboxHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxHost")
            .field("running", &self.inner.lock().len())
            .finish_non_exhaustive()
    }
}

/// The node's config with another image (a template's).
type ImageConfig = dyn Fn(&str) -> Result<LinuxSandboxConfig, String> + Send + Sync;

struct Inner {
    factory: LinuxSandboxFactory,
    /// Set under `--backend gvisor`: every sandbox is a gvisor one.
    gvisor: Option<GvisorServing>,
    /// Set under `--backend docker`: every sandbox is a container.
    docker: Option<DockerServing>,
    /// The settings' config, prepared by the first create that needs it.
    unprepared: LinuxSandboxConfig,
    prepared: OnceCell<LinuxSandboxConfig>,
    /// How a template's config is made (`None`: only [`BASE_TEMPLATE`] is served).
    image_config: Option<Box<ImageConfig>>,
    /// Templates other than the base, each prepared once.
    templates: Mutex<HashMap<String, Arc<OnceCell<LinuxSandboxConfig>>>>,
    sandboxes: Mutex<HashMap<String, Arc<Entry>>>,
    starting: AtomicUsize,
    /// Set when [`SandboxHost::shutdown`] began: no create starts or stays after it.
    closed: AtomicBool,
    /// Paused sandboxes by id (their files in `saved`).
    paused: Mutex<HashMap<String, Paused>>,
    /// Where paused sandboxes' files are kept (`None`: no pause is offered).
    saved: Option<saved::SavedFiles>,
    /// What happened to each sandbox (`GET /sandboxes/{id}/logs`).
    logs: logs::Logs,
    /// Templates built through the E2B template API.
    builds: template_builds::TemplateBuilds,
    /// Filesystem snapshots (their files in `saved`).
    snapshots: snapshots::Snapshots,
}

/// What a sandbox was started from, and a resume starts it from again.
#[derive(Clone)]
struct StartWith {
    /// Its template (its snapshot's base when it came from one: never a snapshot).
    template: String,
    /// The create's environment variables.
    env_vars: BTreeMap<String, String>,
}

/// A paused sandbox: what a resume starts again.
struct Paused {
    info: SandboxInfo,
    token: SecretString,
    start_with: StartWith,
    /// The network a network update gave it (`None`: the node's).
    networking: Option<NetworkingConfig>,
    /// A gvisor sandbox paused with its memory (checkpointed, nothing running): a resume
    /// restores it. `None`: its files are in `saved`.
    in_memory: Option<GvisorSandboxPort>,
}

impl Inner {
    fn paused_map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Paused>> {
        self.paused.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        self.sandboxes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// One running sandbox.
struct Entry {
    port: Running,
    /// Its agent (a gvisor sandbox's changes with each resume: a new entry then).
    client: AgentClient,
    token: SecretString,
    /// Its processes and files.
    envd: Arc<envd::Envd>,
    /// What the routes show, and when the timer kills it.
    shown: Mutex<(SandboxInfo, Instant)>,
    /// Told when the deadline changed or the sandbox was removed.
    changed: Notify,
    removed: AtomicBool,
    /// Set while a kill (not a pause's) is in flight: the sandbox is gone for every route
    /// from then on (a get, timeout or refresh during it answers 404, never a success for a
    /// sandbox about to vanish); cleared if the kill fails.
    killing: AtomicBool,
    /// The previous CPU reading of a metrics call.
    cpu: metrics::CpuReadings,
    /// What a resume starts it from again.
    start_with: StartWith,
    /// The network a network update gave it (`None`: the node's).
    networking: Mutex<Option<NetworkingConfig>>,
    /// Set by the one pause in progress (a second waits for nothing: it is refused).
    pausing: AtomicBool,
}

impl Entry {
    /// Being killed (a pause's kill aside: the sandbox shows as running until it shows as
    /// paused).
    fn gone(&self) -> bool {
        self.killing.load(Ordering::Acquire) && !self.pausing.load(Ordering::Acquire)
    }

    fn shown(&self) -> std::sync::MutexGuard<'_, (SandboxInfo, Instant)> {
        self.shown.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The sandbox now ends `timeout` from now, or (`extend_only`) at the later of that and
    /// its current end.
    fn expire_in(&self, timeout: Duration, extend_only: bool) {
        let (wall, mono) = (SystemTime::now() + timeout, Instant::now() + timeout);
        let mut shown = self.shown();
        if !extend_only || mono > shown.1 {
            shown.0.end_at = wall;
            shown.1 = mono;
        }
        drop(shown);
        self.changed.notify_one();
    }
}

/// A guard counting one start in progress.
struct Starting<'a>(&'a AtomicUsize);

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SandboxHost {
    /// The host of the node's linux settings (registry credentials from the data dir's
    /// vault). Nothing is probed or started until the first create.
    pub async fn new(
        config: &NodeConfig,
        data_dir: &DataDir,
        backend: ServeBackend,
    ) -> anyhow::Result<Self> {
        let credentials = crate::registry_credentials::from_vault(data_dir, &|line| {
            tracing::warn!("{line}");
        })
        .await?;
        let factory = LinuxSandboxFactory::new().with_registry_credentials(credentials);
        let mut unprepared = config
            .linux_config(&factory)
            .context("the linux sandbox settings")?;
        // `/workspace` is the sandbox's own tmpfs: no host directory to leave behind.
        unprepared.workspace_tmpfs = true;
        // E2B's default user `user` with a writable `/home/user`.
        unprepared.user_home = true;
        let gvisor = match backend {
            ServeBackend::Gvisor => Some(gvisor_serving(config, &unprepared)?),
            ServeBackend::Linux | ServeBackend::Docker => None,
        };
        let docker = match backend {
            ServeBackend::Docker => Some(docker_serving(config, &unprepared).await?),
            ServeBackend::Linux | ServeBackend::Gvisor => None,
        };
        let saved = saved::SavedFiles::of_this_process(data_dir.root());
        let mut host = Self::build(factory.clone(), unprepared, Some(saved));
        let image_cache = config.image_cache().ok();
        let config = config.clone();
        let image_config = move |image: &str| {
            let mut made = config
                .linux_config_with_image(&factory, image)
                .map_err(|e| startup_error(&e))?;
            made.workspace_tmpfs = true;
            made.user_home = true;
            Ok(made)
        };
        if let Some(inner) = Arc::get_mut(&mut host.inner) {
            inner.gvisor = gvisor;
            inner.docker = docker;
            inner.image_config = Some(Box::new(image_config));
            inner.builds.files_dir = Some(
                data_dir
                    .root()
                    .join("template-files")
                    .join(format!("serve-{}", std::process::id())),
            );
            inner.builds.image_cache = image_cache;
        }
        Ok(host)
    }

    /// The host of an explicit (possibly unprepared) config; it offers no pause.
    pub fn with_config(factory: LinuxSandboxFactory, config: LinuxSandboxConfig) -> Self {
        Self::build(factory, config, None)
    }

    fn build(
        factory: LinuxSandboxFactory,
        config: LinuxSandboxConfig,
        saved: Option<saved::SavedFiles>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                factory,
                gvisor: None,
                docker: None,
                unprepared: config,
                prepared: OnceCell::new(),
                image_config: None,
                templates: Mutex::new(HashMap::new()),
                sandboxes: Mutex::new(HashMap::new()),
                starting: AtomicUsize::new(0),
                closed: AtomicBool::new(false),
                paused: Mutex::new(HashMap::new()),
                saved,
                logs: logs::Logs::default(),
                builds: template_builds::TemplateBuilds::default(),
                snapshots: snapshots::Snapshots::default(),
            }),
        }
    }

    /// Whether `token` is the access token of the running sandbox `sandbox_id` (compared
    /// in constant time).
    pub fn verify_access_token(&self, sandbox_id: &str, token: &str) -> bool {
        let entry = self.inner.lock().get(sandbox_id).cloned();
        entry.is_some_and(|entry| tokens_match(entry.token.expose(), token))
    }

    /// Kills every sandbox (serve is stopping); the errors of those that could not be.
    pub async fn shutdown(&self) -> Vec<String> {
        // Under the map's lock, so a create inserts either before (and is killed here) or
        // sees the flag (and kills its own sandbox).
        let entries: Vec<(String, Arc<Entry>)> = {
            let map = self.inner.lock();
            self.inner.closed.store(true, Ordering::Release);
            map.iter()
                .map(|(id, entry)| (id.clone(), Arc::clone(entry)))
                .collect()
        };
        let mut kills = tokio::task::JoinSet::new();
        for (id, entry) in entries {
            let inner = Arc::clone(&self.inner);
            kills.spawn(async move { kill_entry(&inner, &id, &entry).await });
        }
        let mut errors = Vec::new();
        while let Some(done) = kills.join_next().await {
            match done {
                Ok(Ok(())) => {}
                Ok(Err(error)) => errors.push(error.to_string()),
                Err(error) => errors.push(format!("a kill task failed: {error}")),
            }
        }
        // Paused sandboxes and snapshots end with serve (their records live in this process
        // only).
        let paused: Vec<Paused> = self.inner.paused_map().drain().map(|(_, p)| p).collect();
        for kept in paused.into_iter().filter_map(|p| p.in_memory) {
            if let Err(error) = kept.sandbox().destroy().await {
                errors.push(format!(
                    "cannot remove a paused sandbox: {}",
                    backend::chain(&error)
                ));
            }
        }
        self.inner.snapshots.clear();
        if let Some(saved) = &self.inner.saved {
            saved.remove_all();
        }
        self.inner.builds.remove_files();
        errors
    }
}

/// A create refused or undone because serve is stopping.
fn stopping() -> SandboxServiceError {
    SandboxServiceError::Unavailable("omabox serve is stopping: no new sandbox".into())
}

fn internal(message: String) -> SandboxServiceError {
    SandboxServiceError::Internal(message)
}

/// A factory error with its causes, one line.
fn startup_error(error: &dyn std::error::Error) -> String {
    let mut text = format!("cannot start a sandbox: {error}");
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The factory context of a serve sandbox: no host directories (its `/workspace` is its
/// own tmpfs).
fn context(sandbox_id: &str) -> SandboxFactoryContext {
    SandboxFactoryContext {
        session_id: sandbox_id.to_owned(),
        workdir: PathBuf::new(),
        memory_root: None,
        outputs_root: None,
    }
}

/// Kills `entry` (still `id` in the map) and removes it.
async fn kill_entry(
    inner: &Inner,
    id: &str,
    entry: &Arc<Entry>,
) -> Result<(), SandboxServiceError> {
    entry.killing.store(true, Ordering::Release);
    if let Err(error) = entry.port.terminate().await {
        entry.killing.store(false, Ordering::Release);
        return Err(internal(format!("cannot kill sandbox {id}: {error}")));
    }
    forget_entry(inner, id, entry);
    tracing::info!(sandbox = %id, "sandbox killed");
    Ok(())
}

/// Removes `entry` (still `id` in the map, no longer running) and ends its timer.
fn forget_entry(inner: &Inner, id: &str, entry: &Arc<Entry>) {
    {
        let mut map = inner.lock();
        if map.get(id).is_some_and(|found| Arc::ptr_eq(found, entry)) {
            map.remove(id);
        }
    }
    entry.removed.store(true, Ordering::Release);
    entry.changed.notify_one();
}

/// Kills the sandbox when its deadline passes; follows deadline changes; ends when it was
/// removed.
async fn watch_timeout(inner: Weak<Inner>, id: String, entry: Arc<Entry>) {
    loop {
        if entry.removed.load(Ordering::Acquire) {
            return;
        }
        let deadline = entry.shown().1;
        tokio::select! {
            () = tokio::time::sleep_until(deadline) => {
                if entry.shown().1 > Instant::now() {
                    continue;
                }
                let Some(inner) = inner.upgrade() else { return };
                tracing::info!(sandbox = %id, "sandbox timed out");
                match kill_entry(&inner, &id, &entry).await {
                    Ok(()) => inner.logs.end(&id, LogLevel::Info, "timeout", "sandbox timed out and was killed"),
                    Err(error) => {
                        tracing::error!(sandbox = %id, %error, "cannot kill a timed-out sandbox; retrying");
                        entry.shown().1 = Instant::now() + KILL_RETRY;
                    }
                }
            }
            () = entry.changed.notified() => {}
        }
    }
}

#[async_trait]
impl SandboxService for SandboxHost {
    async fn create(&self, request: NewSandbox) -> Result<CreatedSandbox, SandboxServiceError> {
        let _starting = self.reserve()?;
        let id = new_sandbox_id();
        let snapshot = self.inner.snapshots.find(&request.template_id);
        let start_with = StartWith {
            template: snapshot
                .as_ref()
                .map_or(&request.template_id, |s| &s.base_template)
                .clone(),
            env_vars: request.env_vars,
        };
        let (port, client, shape) = match snapshot.as_ref().and_then(|s| s.image()) {
            Some(image) => self.start_from_image(image, &start_with.env_vars).await?,
            None => {
                self.start(&id, &start_with.template, &start_with.env_vars)
                    .await?
            }
        };
        if let Some(snapshot) = &snapshot
            && let Err(error) = snapshot.restore(&client).await
        {
            let _ = port.terminate().await;
            return Err(error);
        }
        let started_at = SystemTime::now();
        let info = SandboxInfo {
            sandbox_id: id.clone(),
            template_id: request.template_id,
            started_at,
            end_at: started_at + request.timeout,
            metadata: request.metadata,
            cpu_count: shape.cpu_count,
            memory_mb: shape.memory_mb,
            disk_size_mb: 0,
            // What the sandbox reaches is the operator's setting, not the request's wish.
            allow_internet_access: Some(shape.internet),
            paused: false,
        };
        let token = new_access_token();
        // Logged before the sandbox is in the map, so nothing of it (a zero timeout's kill)
        // comes first.
        let template = &info.template_id;
        self.inner.logs.open(&id).push(
            LogLevel::Info,
            &format!(
                "sandbox created from template {template} (timeout {} s)",
                request.timeout.as_secs()
            ),
            &[("event", "created".into()), ("template", template.clone())],
        );
        self.insert(
            port,
            client,
            info.clone(),
            token.clone(),
            start_with,
            None,
            request.timeout,
        )
        .await?;
        tracing::info!(sandbox = %id, timeout_s = request.timeout.as_secs(), "sandbox created");
        Ok(CreatedSandbox {
            info,
            access_token: token,
        })
    }

    fn list(&self) -> Vec<SandboxInfo> {
        let entries: Vec<(String, Arc<Entry>)> = self
            .inner
            .lock()
            .iter()
            .map(|(id, entry)| (id.clone(), Arc::clone(entry)))
            .collect();
        let mut all: Vec<SandboxInfo> = entries
            .into_iter()
            .filter(|(id, entry)| self.running(id, entry))
            .map(|(_, entry)| entry.shown().0.clone())
            .collect();
        all.extend(self.inner.paused_map().values().map(|p| p.info.clone()));
        all
    }

    fn get(&self, sandbox_id: &str) -> Option<(SandboxInfo, SecretString)> {
        if let Some(paused) = self.inner.paused_map().get(sandbox_id) {
            return Some((paused.info.clone(), paused.token.clone()));
        }
        let entry = self.entry(sandbox_id).ok()?;
        if !self.running(sandbox_id, &entry) {
            return None;
        }
        let info = entry.shown().0.clone();
        Some((info, entry.token.clone()))
    }

    async fn kill(&self, sandbox_id: &str) -> Result<(), SandboxServiceError> {
        let paused = self.inner.paused_map().remove(sandbox_id);
        if let Some(paused) = paused {
            if let Some(saved) = &self.inner.saved {
                saved.remove(sandbox_id);
            }
            if let Some(kept) = &paused.in_memory
                && let Err(error) = kept.sandbox().destroy().await
            {
                return Err(internal(format!(
                    "cannot remove paused sandbox {sandbox_id}: {}",
                    backend::chain(&error)
                )));
            }
            tracing::info!(sandbox = %sandbox_id, "paused sandbox removed");
            let message = "paused sandbox killed (its files removed)";
            self.inner
                .logs
                .end(sandbox_id, LogLevel::Info, "killed", message);
            return Ok(());
        }
        let entry = self.entry(sandbox_id)?;
        kill_entry(&self.inner, sandbox_id, &entry).await?;
        self.inner
            .logs
            .end(sandbox_id, LogLevel::Info, "killed", "sandbox killed");
        Ok(())
    }

    fn set_timeout(&self, sandbox_id: &str, timeout: Duration) -> Result<(), SandboxServiceError> {
        self.entry(sandbox_id)?.expire_in(timeout, false);
        Ok(())
    }

    fn refresh(&self, sandbox_id: &str, duration: Duration) -> Result<(), SandboxServiceError> {
        self.entry(sandbox_id)?.expire_in(duration, true);
        Ok(())
    }

    fn envd(
        &self,
        sandbox_id: &str,
        access_token: &str,
    ) -> Result<Arc<dyn SandboxEnvd>, SandboxServiceError> {
        let entry = self.entry(sandbox_id)?;
        if !self.running(sandbox_id, &entry) {
            return Err(SandboxServiceError::NotFound(sandbox_id.to_owned()));
        }
        if access_token.is_empty() {
            return Err(SandboxServiceError::Unauthorized(
                "missing X-Access-Token header (the sandbox's envdAccessToken)".into(),
            ));
        }
        if !tokens_match(entry.token.expose(), access_token) {
            return Err(SandboxServiceError::Unauthorized(
                "X-Access-Token is not this sandbox's access token".into(),
            ));
        }
        Ok(entry.envd.clone())
    }

    async fn metrics(&self, sandbox_id: &str) -> Result<SandboxMetrics, SandboxServiceError> {
        let entry = self.running_entry(sandbox_id)?;
        let (cpu_count, memory_mb) = {
            let shown = entry.shown();
            (shown.0.cpu_count, shown.0.memory_mb)
        };
        let cgroup = entry.port.cgroup();
        metrics::sample(metrics::Sampled {
            cgroup: &cgroup,
            client: &entry.client,
            readings: &entry.cpu,
            cpu_count,
            memory_limit: memory_mb << 20,
        })
        .await
    }

    async fn update_network(
        &self,
        sandbox_id: &str,
        update: NetworkUpdate,
    ) -> Result<(), SandboxServiceError> {
        let entry = self.running_entry(sandbox_id)?;
        let config = match update {
            NetworkUpdate::Internet => {
                if self.inner.unprepared.network != NetworkingConfig::Unrestricted {
                    return Err(SandboxServiceError::BadRequest(
                        "an open internet (no denyOut, allow_internet_access not false) is not granted: this server's operator network (OMABOX_LINUX_NETWORK) is not unrestricted; name the hosts in allowOut with denyOut [\"0.0.0.0/0\"]".into(),
                    ));
                }
                NetworkingConfig::Unrestricted
            }
            NetworkUpdate::Only(hosts) => NetworkingConfig::Limited {
                allowed_hosts: hosts,
                allow_package_managers: false,
                allow_mcp_servers: false,
            },
        };
        self.apply_network(&entry.port, &config)?;
        *entry
            .networking
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(config);
        tracing::info!(sandbox = %sandbox_id, "sandbox network updated");
        if let Some(log) = self.inner.logs.get(sandbox_id) {
            log.info("network", "sandbox network updated");
        }
        Ok(())
    }

    fn templates(&self) -> Option<Arc<dyn omabox_proxy::templates::TemplateService>> {
        Some(Arc::new(self.clone()))
    }

    fn logs(&self, sandbox_id: &str) -> Result<Vec<SandboxLogEntry>, SandboxServiceError> {
        self.inner
            .logs
            .get(sandbox_id)
            .map(|log| log.entries())
            .ok_or_else(|| SandboxServiceError::NotFound(sandbox_id.to_owned()))
    }

    async fn pause(
        &self,
        sandbox_id: &str,
        keep_memory: bool,
    ) -> Result<bool, SandboxServiceError> {
        self.pause_sandbox(sandbox_id, keep_memory).await
    }

    fn pauses_memory(&self) -> bool {
        self.inner.gvisor.is_some()
    }

    async fn fork(
        &self,
        sandbox_id: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Result<CreatedSandbox, SandboxServiceError>>, SandboxServiceError> {
        self.fork_sandbox(sandbox_id, count, timeout).await
    }

    async fn create_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotInfo, SandboxServiceError> {
        self.take_snapshot(sandbox_id, name, memory).await
    }

    fn snapshots(&self) -> Vec<SnapshotInfo> {
        self.inner.snapshots.list()
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<bool, SandboxServiceError> {
        Ok(self.forget_snapshot(snapshot_id))
    }

    async fn resume(
        &self,
        sandbox_id: &str,
        timeout: Duration,
    ) -> Result<Option<CreatedSandbox>, SandboxServiceError> {
        self.resume_sandbox(sandbox_id, timeout).await
    }
}

impl SandboxHost {
    /// Whether the sandbox's PID 1 still runs; one that died on its own is gone for the
    /// caller and is cleaned up (cgroup, state dir) in the background.
    fn running(&self, sandbox_id: &str, entry: &Arc<Entry>) -> bool {
        if entry.gone() {
            return false;
        }
        if entry.port.is_alive(&entry.client) {
            return true;
        }
        if !entry.removed.load(Ordering::Acquire)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (inner, id, entry) = (
                Arc::clone(&self.inner),
                sandbox_id.to_owned(),
                Arc::clone(entry),
            );
            tracing::warn!(sandbox = %id, "the sandbox's init exited; removing it");
            runtime.spawn(async move {
                match kill_entry(&inner, &id, &entry).await {
                    Ok(()) => inner.logs.end(
                        &id,
                        LogLevel::Error,
                        "exited",
                        "the sandbox's init exited: the sandbox is gone",
                    ),
                    Err(error) => {
                        tracing::error!(sandbox = %id, %error, "cannot clean up an exited sandbox");
                    }
                }
            });
        }
        false
    }

    /// The sandbox `sandbox_id`, unless it is not there or being killed.
    fn entry(&self, sandbox_id: &str) -> Result<Arc<Entry>, SandboxServiceError> {
        self.inner
            .lock()
            .get(sandbox_id)
            .filter(|entry| !entry.gone())
            .cloned()
            .ok_or_else(|| SandboxServiceError::NotFound(sandbox_id.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::backend::cpu_count;
    use super::*;
    use omabox_backend_linux::CpuLimit;

    #[test]
    fn cpu_count_of_limits() {
        let quota = |quota_us, period_us| CpuLimit::Quota {
            quota_us,
            period_us,
        };
        assert_eq!(cpu_count(Some(&quota(200_000, 100_000))), 2);
        assert_eq!(cpu_count(Some(&quota(50_000, 100_000))), 1);
        assert_eq!(cpu_count(Some(&quota(150_000, 100_000))), 2);
        assert!(cpu_count(None) >= 1);
    }

    #[tokio::test]
    async fn an_unknown_template_is_refused_before_anything_starts() {
        let host =
            SandboxHost::with_config(LinuxSandboxFactory::new(), LinuxSandboxConfig::default());
        let request = NewSandbox {
            template_id: "python-3.12".into(),
            timeout: Duration::from_secs(5),
            metadata: Default::default(),
            env_vars: Default::default(),
            allow_internet_access: None,
        };
        let error = host.create(request).await.unwrap_err();
        assert!(matches!(error, SandboxServiceError::BadRequest(_)));
        assert!(
            error.to_string().contains("\"python-3.12\" is not known"),
            "{error}"
        );
        assert!(host.inner.prepared.get().is_none());
        assert!(host.list().is_empty());
        assert!(matches!(
            host.kill("nope").await,
            Err(SandboxServiceError::NotFound(_))
        ));
        assert!(host.set_timeout("nope", Duration::ZERO).is_err());
        assert!(!host.verify_access_token("nope", ""));
    }

    #[tokio::test]
    async fn a_create_after_shutdown_began_is_refused_before_anything_starts() {
        let host =
            SandboxHost::with_config(LinuxSandboxFactory::new(), LinuxSandboxConfig::default());
        assert!(host.shutdown().await.is_empty());
        let request = NewSandbox {
            template_id: BASE_TEMPLATE.into(),
            timeout: Duration::from_secs(5),
            metadata: Default::default(),
            env_vars: Default::default(),
            allow_internet_access: None,
        };
        let error = host.create(request).await.unwrap_err();
        assert!(
            matches!(error, SandboxServiceError::Unavailable(_)),
            "{error}"
        );
        assert!(error.to_string().contains("stopping"), "{error}");
        assert!(host.inner.prepared.get().is_none());
        assert!(host.list().is_empty());
    }
}
