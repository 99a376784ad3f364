//! Wiring: the one place that knows which backend crate provides which managed-runtime
//! provider driver, and how the persistence ports of a data directory are built (the CLI
//! and the runner both use it).
//!
//! ```text
//!   <data-dir>/omabox.db  ── SqliteStore (fences, orphans, lease journal)
//!   <data-dir>/blobs/     ── BlobStore ─┬─ FilesystemWorkspacePort  (/workspace)
//!                                       └─ FilesystemSessionOutputPort (/mnt/session/outputs)
//!   --backend linux ── omabox_backend_linux::managed  (namespaces, cgroups, seccomp, Landlock)
//!   --backend local ── omabox_backend_local::managed  (test mode only, no isolation)
//!   --backend docker ── omabox_backend_docker::managed (containers of the engine at DOCKER_HOST)
//!   --backend gvisor ── omabox_backend_gvisor::managed (runsc sandboxes under <data-dir>/gvisor)
//! ```
//!
//! The host never names a backend; this module is where names become drivers — for
//! running work items (`provider_driver`), for reaping leases a dead host left behind
//! (`sandbox_resolver`, which needs no live handle: leases carry what a reap needs) and for
//! plain tool sandboxes (`sandbox_factories`, the `SANDBOX_PROVIDER` map of
//! `omabox sandbox run`). No other module names a backend crate's types for wiring.

use anyhow::Context as _;
use omabox_acp::{AcpEventSink, AcpHarnessDriver, AcpTurnOptions};
use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory};
use omabox_backend_linux::managed::{
    LINUX_PROVIDER, LinuxManagedProvider, LinuxManagedRuntimeOptions,
};
use omabox_backend_local::LocalSubprocessFactory;
use omabox_backend_local::managed::{
    LOCAL_PROVIDER, LocalManagedProvider, LocalManagedRuntimeOptions,
};
use omabox_contract::UsageLedgerPort;
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, ManagedSandboxPort, SessionOutputPort,
    WorkspacePersistencePort,
};
use omabox_host::catalog::ConformanceCatalog;
use omabox_host::reconciler::SandboxPortResolver;
use omabox_persistence::{
    BlobStore, CheckpointLimits, FilesystemSessionOutputPort, FilesystemWorkspacePort,
    ProgressObserver, WorkspaceOptions,
};
use omabox_sandbox::managed::{
    HarnessEnvSource, HarnessOutputSink, ProviderManagedRuntime, ProviderManagedRuntimeDriver,
    ProviderManagedRuntimeOptions,
};
use omabox_sandbox::session_inputs::{
    LeaseSandboxes, MemoryStoreHost, MemoryStorePolicy, SandboxSessionInputs,
};
use omabox_sandbox::{
    LOCAL_SUBPROCESS, SandboxFactoryContext, SandboxFactoryEnv, SandboxFactoryRegistry,
    SandboxProviderName,
};
use std::path::Path;
use std::sync::Arc;

/// The backends `omabox run --backend` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Linux namespaces, cgroups, seccomp and Landlock (root). The default.
    Linux,
    /// A local subprocess with NO isolation; only in test mode (OMABOX_TEST_MODE=1).
    Local,
    /// Containers of the Docker Engine at `DOCKER_HOST` (omabox-agent as their PID 1).
    Docker,
    /// Sandboxes under gVisor's runsc (root; the host's `/usr` under a generated `/etc`).
    Gvisor,
}

impl Backend {
    /// The backend a `--backend` name selects (`local-subprocess` is `local`'s OpenMA name);
    /// `None` for every other name.
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            LINUX_PROVIDER => Some(Self::Linux),
            LOCAL_PROVIDER | LOCAL_SUBPROCESS => Some(Self::Local),
            omabox_backend_docker::PROVIDER => Some(Self::Docker),
            omabox_backend_gvisor::PROVIDER => Some(Self::Gvisor),
            _ => None,
        }
    }

    /// The provider id in leases and descriptors.
    pub fn provider(self) -> &'static str {
        match self {
            Backend::Linux => LINUX_PROVIDER,
            Backend::Local => LOCAL_PROVIDER,
            Backend::Docker => omabox_backend_docker::PROVIDER,
            Backend::Gvisor => omabox_backend_gvisor::PROVIDER,
        }
    }
}

/// Printed when linux sandboxes cannot be made here.
pub const LOCAL_HINT: &str = "for development without isolation, run with `--backend local` and \
                              OMABOX_TEST_MODE=1 (commands then run as plain subprocesses on this machine)";

/// The persistence ports of one data directory, sharing one blob store.
#[derive(Debug, Clone)]
pub struct Persistence {
    /// `/workspace` checkpoints and restores.
    pub workspace: Arc<FilesystemWorkspacePort>,
    /// `/mnt/session/outputs` collection.
    pub outputs: Arc<FilesystemSessionOutputPort>,
}

impl Persistence {
    /// Opens the blob store of `data_dir` (`--blob-dir`, else `<data-dir>/blobs`);
    /// `progress` receives restore, checkpoint and export progress; `limits` bound each
    /// checkpoint.
    pub fn open(
        data_dir: &crate::DataDir,
        progress: Option<Arc<dyn ProgressObserver>>,
        limits: CheckpointLimits,
    ) -> anyhow::Result<Self> {
        let blob_dir = data_dir.blobs();
        let blobs =
            Arc::new(BlobStore::at(&blob_dir).with_context(|| {
                format!("cannot open the blob store in {}", blob_dir.display())
            })?);
        let data_dir = data_dir.root();
        let mut workspace = FilesystemWorkspacePort::with_store(data_dir, Arc::clone(&blobs))
            .with_options(WorkspaceOptions {
                limits,
                ..WorkspaceOptions::default()
            });
        if let Some(progress) = progress {
            workspace = workspace.with_progress(progress);
        }
        Ok(Self {
            workspace: Arc::new(workspace),
            outputs: Arc::new(FilesystemSessionOutputPort::with_store(data_dir, blobs)),
        })
    }
}

/// What a provider driver is built from.
#[derive(Clone)]
pub struct DriverInputs {
    /// The local backend's env (test mode).
    pub env: SandboxFactoryEnv,
    /// Creates linux sandboxes.
    pub linux_factory: LinuxSandboxFactory,
    /// What linux sandboxes are made from, prepared (image pinned and held, layer built).
    pub linux: LinuxSandboxConfig,
    /// `/workspace` persistence (host-directory bindings).
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence (host-directory bindings).
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Where the harness's stdout and stderr go.
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
    /// Where `sandbox_active_seconds` goes. Used only by backends whose terminate/reap really
    /// stop the runtime (linux); `local` never records usage.
    pub usage: Option<Arc<dyn UsageLedgerPort>>,
    /// Variables merged over the harness process's env at spawn time (the session token).
    pub harness_env: Option<Arc<dyn HarnessEnvSource>>,
    /// Credential egress of linux and docker sandboxes (`omabox run --credential`).
    pub credential_egress: Option<omabox_backend_linux::managed::CredentialEgressOptions>,
    /// Run the `ama_worker` lane as the ACP harness (`omabox run --acp-command`).
    pub acp: Option<AcpInputs>,
    /// `Environment.config.packages`, installed before the harness lane runs.
    pub packages: Option<omabox_sandbox::packages::EnvironmentPackages>,
    pub memory_stores: Option<Arc<dyn MemoryStoreHost>>,
    /// What docker containers are made from (`--backend docker`: [`docker_config`]).
    pub docker: Option<omabox_backend_docker::DockerConfig>,
    /// What gvisor sandboxes are made from (`--backend gvisor`: [`gvisor_config`]).
    pub gvisor: Option<omabox_backend_gvisor::GvisorConfig>,
}

/// What the ACP harness is built from.
#[derive(Clone)]
pub struct AcpInputs {
    /// The turn: prompt, permission policy, timeouts.
    pub turn: AcpTurnOptions,
    /// Where the turn's events go.
    pub events: Arc<dyn AcpEventSink>,
    /// Where the agent of a turn that ended is kept (a warm session, `crate::warm`).
    pub retain: Option<Arc<omabox_acp::AcpAgentSlot>>,
}

impl std::fmt::Debug for AcpInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcpInputs").finish_non_exhaustive()
    }
}

impl std::fmt::Debug for DriverInputs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DriverInputs")
            .field("env", &self.env)
            .finish_non_exhaustive()
    }
}

/// Checks, before anything is claimed, that `backend` can make sandboxes here (`probe_dir`:
/// a directory that exists, the probe's workdir); the error says why not and what to do
/// instead.
pub fn check_backend(
    backend: Backend,
    config: &crate::NodeConfig,
    probe_dir: &Path,
) -> anyhow::Result<()> {
    match backend {
        Backend::Local => {
            if !config.is_test_mode() {
                anyhow::bail!(
                    "the local backend runs commands without any isolation and is available \
                     only in test mode: set OMABOX_TEST_MODE=1 (or NODE_ENV=test)"
                );
            }
            Ok(())
        }
        Backend::Docker => docker_config(config).map(|_| ()),
        Backend::Gvisor => gvisor_config(config).map(|_| ()),
        Backend::Linux => {
            let ctx = SandboxFactoryContext {
                session_id: "probe".into(),
                workdir: probe_dir.to_path_buf(),
                memory_root: None,
                outputs_root: None,
            };
            let factory = LinuxSandboxFactory::new();
            // A bad setting is the user's input, named as such: no "this machine cannot"
            // and no hint about root.
            let linux = config
                .linux_config(&factory)
                .map_err(|error| anyhow::anyhow!("{error}"))?;
            factory.check_host_config(&ctx, &linux).map_err(|error| {
                let mut reason = error.to_string();
                let mut source = std::error::Error::source(&error);
                while let Some(next) = source {
                    reason.push_str(": ");
                    reason.push_str(&next.to_string());
                    source = next.source();
                }
                anyhow::anyhow!(
                    "cannot create linux sandboxes on this machine: {reason}\nhint: linux \
                         sandboxes need root, cgroups and the omabox-sandbox-init binary next to \
                         omabox (`cargo build --release --bins`); {LOCAL_HINT}"
                )
            })
        }
    }
}

/// The managed-runtime provider driver of `backend`.
pub async fn provider_driver(
    backend: Backend,
    inputs: DriverInputs,
) -> anyhow::Result<Arc<dyn ManagedRuntimeProviderDriverPort>> {
    let DriverInputs {
        env,
        linux_factory,
        linux,
        workspace,
        outputs,
        harness_output,
        usage,
        harness_env,
        credential_egress,
        acp,
        packages,
        memory_stores,
        docker,
        gvisor,
    } = inputs;
    let acp_output = harness_output.clone();
    let with_env = |driver: ProviderManagedRuntimeDriver| {
        // Session inputs: the generic materializer over this driver's sandboxes. omabox's
        // `ama_worker` lane runs arbitrary commands, so it owns memory stores on every lane.
        let mut inputs = SandboxSessionInputs::new(
            backend.provider(),
            Arc::clone(driver.runtime()) as Arc<dyn LeaseSandboxes>,
        );
        if let Some(host) = &memory_stores {
            inputs =
                inputs.with_memory_stores(Arc::clone(host), MemoryStorePolicy::AlwaysMaterializer);
        }
        let driver = driver.with_session_inputs(Arc::new(inputs));
        let driver = match &harness_env {
            Some(source) => driver.with_harness_env(Arc::clone(source)),
            None => driver,
        };
        let driver = match packages.clone().filter(|p| !p.is_empty()) {
            Some(packages) => driver.with_environment_packages(packages),
            None => driver,
        };
        let Some(acp) = &acp else { return driver };
        let mut harness = AcpHarnessDriver::new(Arc::clone(driver.runtime()), acp.turn.clone())
            .with_events(Arc::clone(&acp.events));
        if let Some(output) = &acp_output {
            harness = harness.with_output(Arc::clone(output));
        }
        if let Some(source) = &harness_env {
            harness = harness.with_harness_env(Arc::clone(source));
        }
        if let Some(slot) = &acp.retain {
            harness = harness.with_retention(Arc::clone(slot));
        }
        driver.with_harness_driver(Arc::new(harness))
    };
    let driver = match backend {
        Backend::Local => omabox_backend_local::managed::managed_runtime_provider_driver(
            LocalManagedRuntimeOptions {
                env,
                workspace,
                outputs,
                readiness_timeout: None,
                harness_output,
            },
        )
        .await
        .map(|driver| Arc::new(with_env(driver)) as Arc<dyn ManagedRuntimeProviderDriverPort>),
        Backend::Docker => {
            let config = docker.context("no docker config for the docker backend")?;
            let engine = omabox_backend_docker::Engine::from_env()
                .await
                .map_err(|error| anyhow::anyhow!(omabox_backend_docker::describe(&error)))?;
            omabox_backend_docker::managed::managed_runtime_provider_driver(
                omabox_backend_docker::managed::DockerManagedRuntimeOptions {
                    engine,
                    config,
                    workspace,
                    outputs,
                    readiness_timeout: None,
                    harness_output,
                    credential_egress,
                },
            )
            .await
            .map(|driver| Arc::new(with_env(driver)) as Arc<dyn ManagedRuntimeProviderDriverPort>)
        }
        Backend::Gvisor => {
            let config = gvisor.context("no gvisor config for the gvisor backend")?;
            let runtime = omabox_backend_gvisor::GvisorRuntime::new(config)
                .map_err(|error| anyhow::anyhow!("{:#}", anyhow::Error::new(error)))?;
            omabox_backend_gvisor::managed::managed_runtime_provider_driver(
                omabox_backend_gvisor::managed::GvisorManagedRuntimeOptions {
                    runtime,
                    workspace,
                    outputs,
                    readiness_timeout: None,
                    harness_output,
                    credential_egress,
                },
            )
            .await
            .map(|driver| Arc::new(with_env(driver)) as Arc<dyn ManagedRuntimeProviderDriverPort>)
        }
        Backend::Linux => omabox_backend_linux::managed::managed_runtime_provider_driver(
            LinuxManagedRuntimeOptions {
                factory: linux_factory,
                config: linux,
                workspace,
                outputs,
                readiness_timeout: None,
                harness_output,
                credential_egress,
            },
        )
        .await
        .map(|driver| {
            if let Some(usage) = usage {
                driver.runtime().record_usage_into(usage);
            }
            Arc::new(with_env(driver)) as Arc<dyn ManagedRuntimeProviderDriverPort>
        }),
    };
    driver.with_context(|| format!("cannot set up the {} backend", backend.provider()))
}

/// Provider id → a sandbox port that can reap that provider's leases from a fresh process,
/// for the orphan reconciler and the abandoned-lease reaper. `local` is offered only in test
/// mode (its leases are reachable only from the process that made them, so a reap of a dead
/// process's local lease succeeds without touching anything — see the local backend).
pub fn sandbox_resolver(
    env: &SandboxFactoryEnv,
    usage: Arc<dyn UsageLedgerPort>,
) -> SandboxPortResolver {
    let linux_runtime = ProviderManagedRuntime::new(ProviderManagedRuntimeOptions::new(Arc::new(
        LinuxManagedProvider::new(LinuxSandboxFactory::new(), LinuxSandboxConfig::default()),
    )));
    linux_runtime.record_usage_into(usage);
    let linux: Arc<dyn ManagedSandboxPort> = Arc::new(linux_runtime);
    let local: Option<Arc<dyn ManagedSandboxPort>> =
        LocalManagedProvider::new(env).ok().map(|provider| {
            Arc::new(ProviderManagedRuntime::new(
                ProviderManagedRuntimeOptions::new(Arc::new(provider)),
            )) as Arc<dyn ManagedSandboxPort>
        });
    // Docker leases are reaped by container name at the engine of `DOCKER_HOST` (a client
    // that connects at its first request; no engine there fails that reap, with the reason).
    let docker: Option<Arc<dyn ManagedSandboxPort>> =
        omabox_backend_docker::Engine::from_env_pinned()
            .ok()
            .map(|engine| {
                let provider = omabox_backend_docker::managed::DockerManagedProvider::new(
                    engine,
                    omabox_backend_docker::DockerConfig::new(
                        String::new(),
                        omabox_backend_docker::host::current(),
                    ),
                );
                Arc::new(ProviderManagedRuntime::new(
                    ProviderManagedRuntimeOptions::new(Arc::new(provider)),
                )) as Arc<dyn ManagedSandboxPort>
            });
    // Gvisor leases name their backend directory: reaped with this machine's runsc.
    let gvisor: Option<Arc<dyn ManagedSandboxPort>> =
        omabox_backend_gvisor::locate_runsc().map(|runsc| {
            let provider = omabox_backend_gvisor::managed::GvisorManagedProvider::reaper(runsc);
            Arc::new(ProviderManagedRuntime::new(
                ProviderManagedRuntimeOptions::new(Arc::new(provider)),
            )) as Arc<dyn ManagedSandboxPort>
        });
    Arc::new(move |provider: &str| match provider {
        LINUX_PROVIDER => Some(Arc::clone(&linux)),
        LOCAL_PROVIDER => local.clone(),
        omabox_backend_docker::PROVIDER => docker.clone(),
        omabox_backend_gvisor::PROVIDER => gvisor.clone(),
        _ => None,
    })
}

/// What containers of `--backend docker` are made from: the `image` setting (a registry
/// reference the engine pulls, or an image it has; required), the `omabox-agent` binary next
/// to this executable, this process's host id. The error says what is missing.
pub fn docker_config(
    config: &crate::NodeConfig,
) -> anyhow::Result<omabox_backend_docker::DockerConfig> {
    use omabox_backend_docker::config::locate_agent;
    let image = config.given_nonempty(crate::config::Key::Image).context(
        "the docker backend needs an image: --image REF or OMABOX_LINUX_IMAGE (a registry \
             reference, or an image the engine has)",
    )?;
    if Path::new(image).is_absolute() {
        anyhow::bail!(
            "image {image}: the docker backend takes an engine's image reference, not a path"
        );
    }
    let agent = locate_agent(None).map_err(|tried| {
        anyhow::anyhow!(
            "the docker backend needs the omabox-agent binary next to omabox (tried {tried}; \
             cargo build --bins)"
        )
    })?;
    Ok(omabox_backend_docker::DockerConfig {
        agent_binary: agent,
        ..omabox_backend_docker::DockerConfig::new(image, omabox_backend_docker::host::current())
    })
}

/// What sandboxes of `--backend gvisor` are made from: Debian's runsc (ptrace platform),
/// the `omabox-gvisor-init` binary next to this executable, `<data-dir>/gvisor`, and the
/// `linux_memory` and `linux_cpus` settings as limits (through the sandbox's own cgroup;
/// the memory limit counts gVisor's kernel too). Refused, never dropped: `linux_pids` (a
/// pids cgroup would count gVisor's own threads, not the sandbox's processes). Networking
/// none and the host's `/usr` as root: the run sets the network and an image's root
/// (`runner::gvisor_env`). The error says what is missing.
pub fn gvisor_config(
    config: &crate::NodeConfig,
) -> anyhow::Result<omabox_backend_gvisor::GvisorConfig> {
    use crate::config::Key;
    use omabox_backend_linux::factory::{parse_memory_size, parse_millicpus};
    if config
        .given_nonempty(Key::LinuxPids)
        .is_some_and(|v| v.trim() != "unlimited")
    {
        anyhow::bail!(
            "linux_pids (OMABOX_LINUX_PIDS): the gvisor backend cannot limit a sandbox's \
             processes (a pids cgroup would count gVisor's own threads); unset it, or use the \
             linux or docker backend"
        );
    }
    let limited = |key: Key| {
        config
            .given_nonempty(key)
            .filter(|v| v.trim() != "unlimited")
    };
    let memory_bytes = limited(Key::LinuxMemory)
        .map(|text| {
            parse_memory_size(text)
                .map_err(|e| anyhow::anyhow!("linux_memory (OMABOX_LINUX_MEMORY): {e}"))
        })
        .transpose()?;
    let millicpus = limited(Key::LinuxCpus)
        .map(|text| {
            parse_millicpus(text)
                .map_err(|e| anyhow::anyhow!("linux_cpus (OMABOX_LINUX_CPUS): {e}"))
        })
        .transpose()?;
    if !omabox_backend_gvisor::runs_as_root() {
        anyhow::bail!("the gvisor backend needs root here (runsc makes its sandbox's namespaces)");
    }
    let runsc = omabox_backend_gvisor::locate_runsc()
        .context("runsc (gVisor) is not installed: `apt-get install runsc`, or scripts/setup")?;
    let init = omabox_backend_gvisor::locate_init().map_err(|tried| {
        anyhow::anyhow!(
            "{} is not installed beside omabox (looked at {tried}; cargo build --bins)",
            omabox_backend_gvisor::INIT_BINARY
        )
    })?;
    let data_dir = config.data_dir()?;
    Ok(omabox_backend_gvisor::GvisorConfig {
        runsc,
        dir: data_dir.root().join("gvisor"),
        init,
        platform: "ptrace".into(),
        limits: omabox_backend_gvisor::GvisorLimits {
            memory_bytes,
            pids: None,
            millicpus,
        },
        network: omabox_backend_gvisor::GvisorNetwork::default(),
        test_hosts: None,
        image_root: None,
    })
}

/// The conformance catalog of this binary: OpenMA's twelve rows, then each backend's own
/// (`linux`, `local`, `docker`, `gvisor`).
pub fn catalog() -> ConformanceCatalog {
    let mut catalog = ConformanceCatalog::openma();
    catalog
        .extend([
            omabox_backend_linux::catalog::conformance_row(),
            omabox_backend_local::catalog::conformance_row(),
            omabox_backend_docker::catalog::conformance_row(),
            omabox_backend_gvisor::catalog::conformance_row(),
        ])
        .expect("backend ids are distinct from OpenMA's");
    catalog
}

/// The `SANDBOX_PROVIDER` map of this binary: every tool-sandbox backend it was built with
/// (local-subprocess resolves only in test mode).
pub fn sandbox_factories(linux: &LinuxSandboxFactory) -> SandboxFactoryRegistry {
    let mut registry = SandboxFactoryRegistry::new();
    registry.register(SandboxProviderName::Linux, Arc::new(linux.clone()));
    registry.register_local_subprocess(Arc::new(LocalSubprocessFactory::new()));
    registry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_select_one_backend() {
        assert_eq!(Backend::from_name("linux"), Some(Backend::Linux));
        assert_eq!(Backend::from_name("local"), Some(Backend::Local));
        assert_eq!(Backend::from_name("local-subprocess"), Some(Backend::Local));
        assert_eq!(Backend::from_name("daytona"), None);
        assert_eq!(Backend::Local.provider(), "local");
        assert_eq!(Backend::from_name("docker"), Some(Backend::Docker));
        assert_eq!(Backend::Docker.provider(), "docker");
        assert_eq!(Backend::from_name("gvisor"), Some(Backend::Gvisor));
        assert_eq!(Backend::Gvisor.provider(), "gvisor");
    }

    #[test]
    fn the_catalog_appends_every_backend_after_the_openma_rows() {
        let catalog = catalog();
        let ids: Vec<&str> = catalog.rows().iter().map(|row| row.id.as_str()).collect();
        assert_eq!(ids.len(), 16);
        assert_eq!(&ids[12..], ["linux", "local", "docker", "gvisor"]);
        assert_eq!(
            catalog.rows()[..12],
            omabox_host::catalog::openma_rows()[..]
        );
        for backend in [
            Backend::Linux,
            Backend::Local,
            Backend::Docker,
            Backend::Gvisor,
        ] {
            let row = catalog.require(backend.provider()).unwrap();
            // Only gVisor captures processes.
            assert_eq!(
                row.runtime_checkpoints.is_empty(),
                backend != Backend::Gvisor,
                "{}",
                backend.provider()
            );
        }
    }
}
