//! The runner: one work item on this machine, end to end — the contract's fenced transaction
//! (the host's `WorkItemRunner`) around a harness in a sandbox, with everything a run needs
//! from this node assembled first. `omabox run` builds a [`RunRequest`] from its arguments
//! and hands it here; `omabox serve` hands it the runs arriving over HTTP (`crate::runs`),
//! whose publication goes through the run queue ([`QueuedRun`]).
//!
//! In order, as [`Runner::run`] reads:
//!
//! 1. checks that need nothing made: credential reach, what the backend can do, the gateway,
//!    a workspace seed apart from the data dir;
//! 2. the store; the Session files; the in-process inference proxy of an ACP run without a
//!    gateway (`crate::inference_server`); the `--agent` package (`crate::agent_cache`);
//! 3. the linux backend's typed settings for this run (`linux_env`: networking, gateway,
//!    environment layer, agent mount, memory mount), then its preparation steps — the image
//!    resolved, pulled and held, the environment layer built — so neither happens under a
//!    fence (docker's and gvisor's configs: `docker_env`, `gvisor_env`); the CA bundle of
//!    credential egress;
//! 4. the leftovers of dead runs (`crate::leftovers::before_run`), the seed's check; then
//!    ([`RunNotices::prepared`]) the persistence ports under the collection lock, the
//!    revision to restore (`crate::revision`);
//! 5. the provider driver (`crate::wiring`) with the session-token harness env, credential
//!    egress, packages, memory stores, registry credentials and the ACP harness;
//! 6. the transaction, observed by the caller's [`RunObservers`]; a rejection is explained
//!    (`crate::profile_hint`).
//!
//! What this must never do: write to a terminal (everything goes through the observers), read
//! the process environment (the settings are the [`NodeConfig`]'s), or put a session token,
//! a model key or a vault value anywhere but the harness env and the proxy.

mod docker_env;
mod gvisor_env;
mod linux_env;
mod observer;

pub use observer::{RunNotices, RunObservers};

use crate::config::Key;
use crate::environment::EnvironmentConfig;
use crate::harness_env::{SessionTokenEnv, check_gateway};
use crate::session::check_seed;
use crate::session_inputs::{
    DirMemoryStores, MemoryCommitFence, PromotedFileAccess, SessionInputs,
};
use crate::store_choice::ChosenStore;
use crate::warm::WarmSessions;
use crate::wiring::{self, AcpInputs, Backend, DriverInputs, Persistence};
use crate::{DataDir, NodeConfig, agent_cache, inference_server};
use anyhow::Context as _;
use omabox_acp::AcpTurnOptions;
use omabox_acp::agents::KnownAgent;
use omabox_backend_linux::credential_egress::EgressCredential;
use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory};
use omabox_backend_linux::managed::CredentialEgressOptions;
use omabox_contract::{
    AbortSignal, ManagedRuntimeProfile, PortError, RuntimeResourceScope, RuntimeSessionSnapshot,
    SessionOutputEntryCandidate,
};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_host::session_tokens::SessionTokenSlots;
use omabox_host::work_item::{
    SessionTokenIssuer, WorkItemPolicy, WorkItemPorts, WorkItemRunner, owner_id,
};
use omabox_proxy::promoted::PromotedStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The largest `SSL_CERT_FILE` bundle read (Debian's is ~220 KiB).
const CA_BUNDLE_MAX: u64 = 16 << 20;

/// One work item, as its front end resolved it.
#[derive(Debug, Clone)]
pub struct RunRequest {
    /// The sandbox backend.
    pub backend: Backend,
    /// The work item (`local/default/<session>/main`).
    pub scope: RuntimeResourceScope,
    /// Its profile: harness lane, entry process, workspace and outputs.
    pub profile: ManagedRuntimeProfile,
    /// A directory to seed a new session's `/workspace` from (copied).
    pub workspace_seed: Option<PathBuf>,
    /// Restore this published revision instead of the last one.
    pub from_revision: Option<u64>,
    /// The Environment's `config`: networking, packages, dockerfile.
    pub environment: Option<EnvironmentConfig>,
    /// Vault secrets injected into the sandbox's HTTPS requests (linux).
    pub credentials: Vec<EgressCredential>,
    /// Session resources and metadata.
    pub session_inputs: SessionInputs,
    /// The ACP harness, when the harness is an ACP agent.
    pub acp: Option<AcpRequest>,
    /// The OpenMA gateway origin the harness reaches the hosted inference proxy at (an ACP
    /// run without one gets the proxy served by this process).
    pub inference_gateway: Option<String>,
    /// The queued run this work item is (`omabox serve`): it publishes through the queue.
    pub queued: Option<QueuedRun>,
}

/// A run of the run queue, as its claiming host holds it.
#[derive(Clone)]
pub struct QueuedRun {
    /// The queue (in the store the run publishes to).
    pub queue: Arc<dyn omabox_contract::RunQueuePort>,
    /// The live claim.
    pub claim: omabox_contract::RunClaim,
}

impl std::fmt::Debug for QueuedRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueuedRun")
            .field("claim", &self.claim)
            .finish_non_exhaustive()
    }
}

/// An ACP agent as the harness.
#[derive(Debug, Clone)]
pub struct AcpRequest {
    /// The turn: prompt, system prompt, permission policy, timeouts.
    pub turn: AcpTurnOptions,
    /// `--agent NAME`: its package is installed and mounted (linux).
    pub install: Option<&'static KnownAgent>,
    /// The agent whose inference adapter the harness gets (`--agent`'s, or the one an agent
    /// definition's registry id names).
    pub adapter: Option<&'static KnownAgent>,
    /// The in-process proxy's configuration file (its `models`), else the settings' keys.
    pub inference_config: Option<PathBuf>,
}

/// How a run ended, and what its report can still ask for.
#[derive(Debug)]
pub struct RunOutcome {
    /// The fence owner id of this run.
    pub owner_id: String,
    /// The contract's result, or why the run was rejected (explained for the profile).
    pub result: Result<ManagedRuntimeRunResult, PortError>,
    scope: RuntimeResourceScope,
    store: ChosenStore,
    persistence: Persistence,
}

impl RunOutcome {
    /// The output entries of `published` (the revision this run published, as its observer
    /// saw it), empty when it published nothing or they cannot be read.
    pub async fn published_outputs(
        &self,
        published: Option<u64>,
    ) -> Vec<SessionOutputEntryCandidate> {
        let Some(revision) = published else {
            return Vec::new();
        };
        let Ok(Some(publication)) = crate::session::publication(&self.store, &self.scope).await
        else {
            return Vec::new();
        };
        let Some(candidate) = publication
            .output_candidate
            .filter(|_| publication.revision == revision)
        else {
            return Vec::new();
        };
        match self.persistence.outputs.read_manifest(&candidate).await {
            Ok(manifest) => manifest.entries,
            Err(error) => {
                tracing::warn!(%error, "cannot read the published outputs manifest");
                Vec::new()
            }
        }
    }
}

impl RunOutcome {
    /// The outcome of a warm turn (`crate::warm`).
    pub(crate) fn warm(
        owner_id: String,
        result: Result<ManagedRuntimeRunResult, PortError>,
        scope: RuntimeResourceScope,
        store: ChosenStore,
        persistence: Persistence,
    ) -> Self {
        Self {
            owner_id,
            result,
            scope,
            store,
            persistence,
        }
    }
}

/// Runs work items on this node.
#[derive(Debug, Clone)]
pub struct Runner {
    config: NodeConfig,
    data_dir: DataDir,
    warm: Option<WarmSessions>,
}

impl Runner {
    /// A runner over `data_dir` with `config`'s settings.
    pub fn new(config: NodeConfig, data_dir: DataDir) -> Self {
        Self {
            config,
            data_dir,
            warm: None,
        }
    }

    /// Keeps agent sessions warm between their turns in `warm` (`omabox serve`).
    pub fn with_warm(mut self, warm: WarmSessions) -> Self {
        self.warm = Some(warm);
        self
    }

    /// The warm sessions of this runner, when it keeps them.
    pub fn warm(&self) -> Option<&WarmSessions> {
        self.warm.as_ref()
    }

    /// What can be judged before a request is even built: the settings a run uses and
    /// whether `backend` can make sandboxes here (the error says why not and what to do).
    pub fn check_backend(&self, backend: Backend) -> anyhow::Result<()> {
        self.config.checkpoint_limits()?;
        wiring::check_backend(backend, &self.config, &self.config.tmp_dir())
    }

    /// Runs `request` to its end (module doc), reporting to `observers`; `signal` cancels
    /// it (full cleanup). An error is a run that never started: nothing was claimed.
    pub async fn run(
        &self,
        request: RunRequest,
        observers: RunObservers,
        signal: AbortSignal,
    ) -> anyhow::Result<RunOutcome> {
        let (config, data_dir) = (&self.config, &self.data_dir);
        // A warm session's next turn runs on its kept runtime; any other run of a session
        // ends the session's kept runtime first (crate::warm).
        let mut keep = None;
        if let Some(warm) = &self.warm {
            let identity = crate::warm::turn::identity(&request);
            if let Some(kept) = warm.reusable(&request.scope, identity.as_deref()).await {
                // Boxed: the warm turn's future is large and rarely the one awaited.
                let warm_turn = Box::pin(crate::warm::turn::run(
                    warm,
                    kept,
                    request.clone(),
                    observers.clone(),
                    signal.clone(),
                ));
                if let Some(outcome) = warm_turn.await? {
                    return Ok(outcome);
                }
                // The kept agent was gone: the same turn, cold.
            }
            keep = identity.filter(|_| warm.enabled());
        }
        let notices = Arc::clone(&observers.notices);
        let env = config.factory_env();
        let RunRequest {
            backend,
            scope,
            profile,
            workspace_seed,
            from_revision,
            environment,
            credentials,
            session_inputs,
            acp,
            inference_gateway,
            queued,
        } = request;
        crate::credential_reach::check(
            &credentials,
            environment.as_ref().and_then(|e| e.networking.as_ref()),
            config.given(Key::LinuxNetwork),
        )?;
        let clones = crate::session_inputs::clones_repositories(&session_inputs.resources);
        let memory = crate::session_inputs::uses_memory_stores(&session_inputs.resources);
        if backend != Backend::Linux && (clones || memory) {
            anyhow::bail!(
                "git and memory resources need the linux backend (its enforced egress path and its /mnt/memory)"
            );
        }
        if let Some(gateway) = &inference_gateway {
            check_gateway(gateway)?;
        }
        if let Some(seed) = &workspace_seed {
            crate::data_dir::check_apart("--workspace", seed, data_dir.root())?;
        }
        if backend == Backend::Local {
            refuse_on_local(environment.as_ref())?;
        }
        if matches!(backend, Backend::Docker | Backend::Gvisor) {
            refuse_unserved(backend, environment.as_ref())?;
        }
        let install = acp.as_ref().and_then(|a| a.install);
        let adapter = acp.as_ref().and_then(|a| a.adapter);
        let proxy_config = match &acp {
            Some(acp) if inference_gateway.is_none() => Some(inference_server::config(
                config,
                acp.inference_config.as_deref(),
                adapter.map_or("anthropic", |a| a.provider),
            )?),
            _ => None,
        };
        let store = crate::store_choice::open(config, data_dir).await?;
        session_inputs.check_files(data_dir)?;
        // An agent turn without a gateway gets the proxy served by this process.
        let mut gateway = inference_gateway;
        let mut inference_server_running = None;
        if let Some(proxy_config) = proxy_config {
            let warn_to = Arc::clone(&notices);
            let server =
                inference_server::start(config, &store, proxy_config, &|line| warn_to.line(line))
                    .await?;
            gateway = Some(server.url().to_owned());
            inference_server_running = Some(server);
        }
        if let Some(agent) = install
            && !linux_env::has_image(config)
        {
            agent_cache::check_node(agent)?;
        }
        let agent_dir = match install {
            Some(agent) => Some(agent_cache::ensure_installed(
                &config.agent_cache(data_dir)?,
                agent,
                notices.install(),
            )?),
            None => None,
        };
        let warn_to = Arc::clone(&notices);
        let registry_credentials =
            crate::registry_credentials::from_vault(data_dir, &|line| warn_to.line(line)).await?;
        let mut harness_gateway = gateway.clone();
        let mut linux = LinuxSandboxConfig::default();
        let factory = LinuxSandboxFactory::new().with_registry_credentials(registry_credentials);
        if backend == Backend::Linux {
            let run = linux_env::RunSandboxes {
                environment: environment.as_ref(),
                gateway: gateway.as_deref(),
                agent_dir: agent_dir.as_deref(),
                memory_mount: memory,
            };
            let (composed, sandbox_url) =
                linux_env::compose(config, data_dir, &factory, run).await?;
            linux = linux_env::prepare(&factory, composed, &notices).await?;
            harness_gateway = sandbox_url.or(harness_gateway);
        }
        let mut docker = None;
        if backend == Backend::Docker {
            let (composed, sandbox_url) =
                docker_env::compose(config, environment.as_ref(), gateway.as_deref()).await?;
            harness_gateway = sandbox_url.or(harness_gateway);
            docker = Some(composed);
        }
        let mut gvisor = None;
        if backend == Backend::Gvisor {
            let (mut composed, sandbox_url) =
                gvisor_env::compose(config, environment.as_ref(), gateway.as_deref()).await?;
            if linux_env::has_image(config) {
                // `linux` (unused by the gvisor driver) holds the image for the run.
                linux = gvisor_env::with_image(config, &factory, &notices, &mut composed).await?;
            }
            harness_gateway = sandbox_url.or(harness_gateway);
            gvisor = Some(composed);
        }
        // The roots real servers are checked against under credential egress: SSL_CERT_FILE's
        // bundle when set (the usual knob for a host behind its own CA), else the system's.
        let upstream_roots =
            match config.checked(Key::SslCertFile)? {
                Some(path) if clones || !credentials.is_empty() => Some(
                    crate::input_file::read_bytes(Path::new(path), "SSL_CERT_FILE", CA_BUNDLE_MAX)?,
                ),
                _ => None,
            };
        if let Some(warning) = crate::leftovers::before_run(config, data_dir, &store).await {
            notices.line(&warning);
        }
        if let Some(seed) = &workspace_seed {
            check_seed(&store, &scope, seed).await?;
        }

        notices.prepared();
        let persistence = Persistence::open(
            data_dir,
            observers.progress.clone(),
            config.checkpoint_limits()?,
        )?;
        // From here until the run returned (its publication committed or given up), a
        // collection that removes young blobs waits for this run, and this run for it.
        let _writer = {
            let blobs = Arc::clone(persistence.workspace.store());
            let warn_to = Arc::clone(&notices);
            tokio::task::spawn_blocking(move || {
                blobs.hold_as_writer(|| {
                    warn_to.line(
                        "omabox run: waiting for `omabox gc` to finish collecting the blob store",
                    );
                })
            })
            .await
            .context("the blob store lock task failed")?
            .context("cannot lock the blob store for this run")?
        };
        if let Some(seed) = &workspace_seed {
            persistence
                .workspace
                .seed_new_session(scope.clone(), seed.clone());
        }
        crate::revision::choose_restore(&store, &persistence, &scope, from_revision).await?;
        // Memory-store write-backs wait in a stage until this run's publication (the fence
        // decorator below commits them then, or discards them).
        let memory_stores = DirMemoryStores::new(data_dir);
        let token_slots = SessionTokenSlots::new();
        let agent_slot = keep
            .is_some()
            .then(|| Arc::new(omabox_acp::AcpAgentSlot::new()));
        let driver = wiring::provider_driver(
            backend,
            DriverInputs {
                env,
                linux_factory: factory,
                linux,
                workspace: Arc::clone(&persistence.workspace) as _,
                outputs: Arc::clone(&persistence.outputs) as _,
                harness_output: Some(Arc::clone(&observers.harness_output)),
                usage: Some(store.usage()),
                harness_env: Some(Arc::new(
                    SessionTokenEnv::new(token_slots.clone(), harness_gateway).with_agent(adapter),
                ) as _),
                // A repository resource requires credential egress (the host's rule), with or
                // without a secret to inject.
                credential_egress: (!credentials.is_empty() || clones).then(|| {
                    CredentialEgressOptions {
                        vault: store.vault(),
                        rules: credentials.clone(),
                        upstream_roots,
                    }
                }),
                packages: environment.as_ref().and_then(|e| e.packages.clone()),
                memory_stores: Some(Arc::new(memory_stores.clone()) as _),
                docker,
                gvisor,
                acp: acp.as_ref().map(|acp| AcpInputs {
                    turn: acp.turn.clone(),
                    events: observers
                        .acp_events
                        .clone()
                        .unwrap_or_else(|| Arc::new(NoAcpEvents)),
                    retain: agent_slot.clone(),
                }),
            },
        )
        .await?;
        let lease_ttl_ms = config.number(Key::LeaseTtlMs)?;
        let policy = WorkItemPolicy::new(process_owner_id(), lease_ttl_ms);
        let owner_id = policy.owner_id.clone();
        let fences: Arc<dyn omabox_contract::RuntimeResourceFencePort> = Arc::new(
            MemoryCommitFence::new(&store, memory_stores.stage()).publishing_through(queued),
        );
        let keeping = match (&keep, &agent_slot) {
            (Some(_), Some(slot)) => Some(crate::warm::turn::Keeping::new(
                &policy,
                &store,
                &persistence,
                &token_slots,
                Arc::clone(slot),
                Arc::clone(&driver),
                Arc::clone(&fences),
            )),
            _ => None,
        };
        let ports = match &keeping {
            Some(keeping) => keeping.ports(&store),
            None => WorkItemPorts {
                driver,
                fences,
                orphans: store.orphans(),
                lease_journal: Some(store.journal()),
                session_tokens: Some(SessionTokenIssuer {
                    tokens: store.tokens(),
                    sink: Arc::new(token_slots.clone()),
                }),
            },
        };
        let runner = WorkItemRunner::new(policy, ports)?;
        let mut input = ManagedRuntimeRunInput::new(scope.clone(), profile.clone());
        input.signal = Some(signal);
        input.observer = Some(Arc::clone(&observers.steps));
        if !session_inputs.resources.is_empty() {
            input.session = Some(RuntimeSessionSnapshot {
                id: scope.session_id.clone(),
                environment_id: scope.environment_id.clone(),
                metadata: session_inputs.metadata,
                resources: session_inputs.resources,
            });
            let files = PromotedStore::open(&data_dir.files_home())
                .context("cannot open the file store")?;
            input.session_input_access = Some(Arc::new(PromotedFileAccess::new(files)));
        }
        notices.starting(&owner_id);
        let result = runner.run(input).await.map_err(|error| {
            let strategies = persistence.workspace.strategies();
            crate::profile_hint::explain_rejection(&profile, strategies, error)
        });
        drop(runner);
        if let (Some(keeping), Some(warm), Some(identity)) = (keeping, &self.warm, keep) {
            let guards: Vec<Box<dyn std::any::Any + Send + Sync>> = inference_server_running
                .take()
                .into_iter()
                .map(|server| Box::new(server) as _)
                .collect();
            Box::pin(keeping.finish(
                warm,
                crate::warm::turn::Finished {
                    scope: scope.clone(),
                    identity,
                    result: &result,
                    store: store.clone(),
                    persistence: persistence.clone(),
                    token_slots,
                    memory_stores,
                    guards,
                },
            ))
            .await;
        }
        Ok(RunOutcome {
            owner_id,
            result,
            scope,
            store,
            persistence,
        })
    }
}

/// What the local backend (no isolation, the host's own processes) cannot do of an
/// Environment.
fn refuse_on_local(environment: Option<&EnvironmentConfig>) -> anyhow::Result<()> {
    let Some(environment) = environment else {
        return Ok(());
    };
    if environment.packages.as_ref().is_some_and(|p| !p.is_empty()) {
        anyhow::bail!(
            "--environment packages: the local backend runs on the host; packages are installed in linux sandboxes only"
        );
    }
    if environment.networking.is_some() {
        anyhow::bail!(
            "--environment networking: the local backend has no isolation and enforces no network policy"
        );
    }
    if environment
        .dockerfile
        .as_deref()
        .is_some_and(|d| !d.trim().is_empty())
    {
        anyhow::bail!(
            "--environment dockerfile: the local backend runs on the host; environment layers are built for linux sandboxes only"
        );
    }
    Ok(())
}

/// What the docker and gvisor backends do not serve yet: packages and environment layers
/// are refused, never silently dropped.
fn refuse_unserved(
    backend: Backend,
    environment: Option<&EnvironmentConfig>,
) -> anyhow::Result<()> {
    let Some(environment) = environment else {
        return Ok(());
    };
    let name = backend.provider();
    if environment.packages.as_ref().is_some_and(|p| !p.is_empty()) {
        anyhow::bail!("--environment packages: not served by the {name} backend yet");
    }
    if environment
        .dockerfile
        .as_deref()
        .is_some_and(|d| !d.trim().is_empty())
    {
        anyhow::bail!("--environment dockerfile: not served by the {name} backend yet");
    }
    Ok(())
}

/// This process's fence owner id (`<hostname>:<pid>:<random>`).
fn process_owner_id() -> String {
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    owner_id(&hostname, std::process::id(), rand::random())
}

/// An ACP harness whose caller keeps no events.
struct NoAcpEvents;

impl omabox_acp::AcpEventSink for NoAcpEvents {
    fn event(&self, _: &omabox_acp::AcpEvent) {}
}
