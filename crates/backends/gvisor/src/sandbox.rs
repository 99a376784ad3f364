//! A gvisor sandbox's life: create (bundle, `runsc run`, agent handshake), pause (detach
//! the agent, `runsc checkpoint` into the sandbox's directory, processes and memory kept
//! on disk, nothing running), resume (`runsc restore` with new stdio pipes, wake byte,
//! handshake), fork (N restores of one checkpoint, each with its own copy of the
//! workspace and its own id) and destroy (container and directory removed, checkpoint
//! included).
//!
//! Never: follow a sandbox-made symlink on the host (the workspace copy of a fork copies
//! links as links and nothing but regular files, directories and links); leave a
//! container behind a failed step (each failure deletes what it started).

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use omabox_agent::AgentClient;
use omabox_egress::{Resolver, SystemResolver};
use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::network::{GvisorNetwork, OwnNetwork};
use crate::runsc::{Runsc, Stdio2};
pub(crate) use crate::slot::RunscSlot;
use crate::stream::{AgentPipes, ClientStream};
use crate::{GvisorError, bundle};

/// Restores tried before a resume or fork fails (see `GvisorSandbox::boot`).
const RESTORE_ATTEMPTS: u32 = 3;
/// How long a foreground runsc may take to end after `runsc kill` before it is killed.
const RUNSC_END: std::time::Duration = std::time::Duration::from_secs(10);

/// Where a gvisor backend keeps its sandboxes and how it runs runsc.
#[derive(Debug, Clone)]
pub struct GvisorConfig {
    /// The `runsc` executable.
    pub runsc: PathBuf,
    /// The backend's directory (sandboxes, the shared root, runsc's state).
    pub dir: PathBuf,
    /// The `omabox-gvisor-init` executable (static).
    pub init: PathBuf,
    /// runsc's platform: `ptrace` works without `/dev/kvm`.
    pub platform: String,
    /// Each sandbox's resource limits.
    pub limits: GvisorLimits,
    /// What each sandbox may reach (`crate::network`).
    pub network: GvisorNetwork,
    /// Test mode only: `NAME=IP,...` answered before the host's resolver
    /// (`OMABOX_LINUX_TEST_HOSTS`).
    pub test_hosts: Option<String>,
    /// An image's unpacked rootfs (read-only; the caller keeps it in place for the
    /// runtime's life) as every sandbox's root, under a writable overlay in the sandbox's
    /// memory; `None`: the host's `/usr` under a generated `/etc`.
    pub image_root: Option<PathBuf>,
}

/// A sandbox's resource limits, enforced by runsc through the sandbox's own cgroup
/// (`/omabox-gvisor/<id>`, under every controller on cgroup v1). Exceeding the memory limit
/// kills the whole sandbox (gVisor's kernel is one host process): its commands end with
/// SIGKILL.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GvisorLimits {
    /// Memory in bytes (the Sentry's and every process's), when limited.
    pub memory_bytes: Option<u64>,
    /// Processes and threads, when limited.
    pub pids: Option<u64>,
    /// CPU in thousandths of a CPU (1000 = one CPU), when limited.
    pub millicpus: Option<u64>,
}

pub(crate) struct Shared {
    runsc: Runsc,
    pub(crate) dir: PathBuf,
    /// The sandboxes' root: the generated one or an image's.
    root: PathBuf,
    /// Whether `root` is an image's.
    image: bool,
    /// The generated root (its `etc/resolv.conf` is bound into an image's).
    generated: PathBuf,
    init: PathBuf,
    limits: GvisorLimits,
    network: GvisorNetwork,
    resolver: Arc<dyn Resolver>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("runsc", &self.runsc)
            .field("dir", &self.dir)
            .field("limits", &self.limits)
            .field("network", &self.network)
            .finish_non_exhaustive()
    }
}

/// What one sandbox binds besides the shared root.
#[derive(Debug, Clone, Default)]
pub struct SandboxSpec {
    /// The host directory bound at `/workspace` (the caller's, kept by
    /// [`GvisorSandbox::destroy`]); `None`: an empty one of the sandbox's own.
    pub workspace: Option<PathBuf>,
    /// The host directory bound at `/mnt/session/outputs`, when the sandbox has one.
    pub outputs: Option<PathBuf>,
    /// E2B's user `user` with a writable `/home/user` (`bundle::Layout::user_home`; under
    /// an image root, added to the image's accounts through the agent).
    pub user_home: bool,
    /// An image's unpacked rootfs (read-only; the caller keeps it in place for the
    /// sandbox's life, as for [`GvisorConfig::image_root`]) as this sandbox's root instead
    /// of the runtime's: serve's templates naming images.
    pub image_root: Option<PathBuf>,
}

/// Creates gvisor sandboxes.
#[derive(Debug, Clone)]
pub struct GvisorRuntime {
    pub(crate) shared: Arc<Shared>,
}

impl GvisorRuntime {
    /// Prepares the backend's directory (the shared root, runsc's state root).
    pub fn new(config: GvisorConfig) -> Result<Self, GvisorError> {
        let state = config.dir.join("runsc");
        std::fs::create_dir_all(config.dir.join("sandboxes"))
            .and_then(|()| std::fs::create_dir_all(&state))
            .map_err(|e| GvisorError::Io {
                what: format!("creating {}", config.dir.display()),
                source: e,
            })?;
        // Checkpoints hold sandboxes' memory: root only.
        for private in [config.dir.join("sandboxes"), state.clone()] {
            std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).map_err(
                |e| GvisorError::Io {
                    what: format!("making {} private", private.display()),
                    source: e,
                },
            )?;
        }
        let generated = bundle::prepare_root(&config.dir)?;
        config.network.policy().map_err(GvisorError::Networking)?;
        let resolver: Arc<dyn Resolver> = match &config.test_hosts {
            Some(hosts) => Arc::new(
                omabox_egress::FixedNames::parse(hosts, Arc::new(SystemResolver))
                    .map_err(GvisorError::TestHosts)?,
            ),
            None => Arc::new(SystemResolver),
        };
        Ok(Self {
            shared: Arc::new(Shared {
                runsc: Runsc {
                    binary: config.runsc,
                    root: state,
                    platform: config.platform,
                    overlay_root: config.image_root.is_some(),
                    subreaper: Some(config.init.clone()),
                },
                dir: config.dir,
                image: config.image_root.is_some(),
                root: config.image_root.unwrap_or_else(|| generated.clone()),
                generated,
                init: config.init,
                limits: config.limits,
                network: config.network,
                resolver,
            }),
        })
    }

    /// This runtime with its sandboxes' names resolved by `resolver` instead of the host's
    /// (tests stand up their own "internet").
    pub fn with_resolver(self, resolver: Arc<dyn Resolver>) -> Self {
        let shared = &self.shared;
        Self {
            shared: Arc::new(Shared {
                runsc: shared.runsc.clone(),
                dir: shared.dir.clone(),
                root: shared.root.clone(),
                image: shared.image,
                generated: shared.generated.clone(),
                init: shared.init.clone(),
                limits: shared.limits,
                network: shared.network.clone(),
                resolver,
            }),
        }
    }

    /// The runsc executable.
    pub fn runsc_binary(&self) -> &Path {
        &self.shared.runsc.binary
    }

    /// The backend's directory (sandboxes, the shared root, runsc's state).
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Starts a sandbox with an empty workspace and connects to its agent.
    pub async fn create(&self) -> Result<GvisorSandbox, GvisorError> {
        self.create_in(None).await
    }

    /// Starts a sandbox whose `/workspace` is `workspace` (an existing host directory the
    /// caller chose and keeps: [`GvisorSandbox::destroy`] leaves it), or an empty one of its
    /// own with `None`.
    pub async fn create_in(
        &self,
        workspace: Option<PathBuf>,
    ) -> Result<GvisorSandbox, GvisorError> {
        self.create_with(SandboxSpec {
            workspace,
            ..SandboxSpec::default()
        })
        .await
    }

    /// Starts a sandbox binding what `spec` names and, under a networking config other
    /// than `none`, serving its network (`crate::network`) before anything runs in it.
    pub async fn create_with(&self, spec: SandboxSpec) -> Result<GvisorSandbox, GvisorError> {
        self.start(spec, None).await
    }

    /// [`Self::create_with`], restoring the processes of checkpoint directory `image` when
    /// given (its mounts must be the ones `spec` names).
    pub(crate) async fn start(
        &self,
        spec: SandboxSpec,
        image: Option<PathBuf>,
    ) -> Result<GvisorSandbox, GvisorError> {
        let mut sandbox = GvisorSandbox::layout(self.shared.clone())?;
        sandbox.outputs = spec.outputs;
        sandbox.user_home = spec.user_home;
        sandbox.image_root = spec.image_root;
        match spec.workspace {
            Some(dir) => {
                sandbox.workspace = dir;
                sandbox.own_workspace = false;
            }
            None => std::fs::create_dir_all(sandbox.workspace()).map_err(|e| GvisorError::Io {
                what: "creating the workspace".into(),
                source: e,
            })?,
        }
        let fresh = image.is_none();
        let sandbox = sandbox.start_in_place(image).await?;
        // An image's own `/etc` gets E2B's user (a restore has it from its checkpoint).
        if fresh && sandbox.user_home && (sandbox.image_root.is_some() || self.shared.image) {
            let added = match sandbox.client().await {
                Ok(client) => omabox_agent_port::add_user_account(&client)
                    .await
                    .map_err(GvisorError::from),
                Err(e) => Err(e),
            };
            if let Err(e) = added {
                let _ = sandbox.destroy().await;
                return Err(e);
            }
        }
        Ok(sandbox)
    }
}

/// Whether the sandbox's processes are running or saved on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Running; the agent is connected.
    Running,
    /// Checkpointed to the sandbox's directory; nothing runs.
    Paused,
    /// Destroyed.
    Gone,
}

#[derive(Debug)]
pub(crate) struct Live {
    pub(crate) state: State,
    client: Option<AgentClient>,
    /// Our own copies of the host's ends of the agent's pipes: the client's copies close
    /// when it detaches; these keep the agent from reading EOF on fd 0 (or failing to
    /// write fd 1) until the checkpoint.
    kept: Option<[OwnedFd; 2]>,
    /// Set once the client detached: its stream then reads EOF without reading.
    gate: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// One gvisor sandbox (a runsc container) and its agent connection.
#[derive(Debug)]
pub struct GvisorSandbox {
    id: String,
    pub(crate) dir: PathBuf,
    workspace: PathBuf,
    outputs: Option<PathBuf>,
    /// Whether it has E2B's user and home ([`SandboxSpec::user_home`]).
    pub(crate) user_home: bool,
    /// Its own image root ([`SandboxSpec::image_root`]); `None`: the runtime's root.
    pub(crate) image_root: Option<PathBuf>,
    /// Whether the workspace is the sandbox's own (not a caller's directory): then forks
    /// share it through overlay layers (`layers.rs`) instead of copying it.
    pub(crate) own_workspace: bool,
    /// The sandbox's own network namespace and the host side of its network (`None` under
    /// networking `none`).
    network: std::sync::Mutex<Option<OwnNetwork>>,
    /// runsc in the foreground, waiting for the container ([`Runsc::run`] says why); shared
    /// with the port, which reads its exit to explain a lost agent.
    runsc: RunscSlot,
    pub(crate) shared: Arc<Shared>,
    pub(crate) live: Mutex<Live>,
}

impl GvisorSandbox {
    pub(crate) fn layout(shared: Arc<Shared>) -> Result<Self, GvisorError> {
        let id = format!("omabox-gv-{}", uuid::Uuid::new_v4().simple());
        let dir = shared.dir.join("sandboxes").join(&id);
        std::fs::create_dir(&dir).map_err(|e| GvisorError::Io {
            what: format!("creating {}", dir.display()),
            source: e,
        })?;
        // Before anything runs: whose it is, so `reap::reap_orphans` removes it once we are
        // gone (kill -9).
        let owner = omabox_sandbox::host_id::current();
        std::fs::write(dir.join(crate::reap::OWNER_FILE), owner).map_err(|e| GvisorError::Io {
            what: format!("writing the owner of {}", dir.display()),
            source: e,
        })?;
        Ok(Self {
            id,
            runsc: RunscSlot::default(),
            workspace: dir.join("workspace"),
            outputs: None,
            user_home: false,
            image_root: None,
            own_workspace: true,
            network: std::sync::Mutex::new(None),
            dir,
            shared,
            live: Mutex::new(Live {
                state: State::Gone,
                client: None,
                kept: None,
                gate: None,
            }),
        })
    }

    /// Serves the sandbox's network and boots it (restoring `image` when given); a sandbox
    /// that does not start is destroyed, its directory with it.
    pub(crate) async fn start_in_place(self, image: Option<PathBuf>) -> Result<Self, GvisorError> {
        let booted = match self.serve_network() {
            Ok(()) => self.boot(image).await,
            Err(e) => Err(e),
        };
        match booted {
            Ok(()) => Ok(self),
            Err(e) => {
                let _ = self.destroy().await;
                Err(e)
            }
        }
    }

    /// The runsc container id (also the directory name).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The host directory bound at `/workspace`.
    pub fn workspace(&self) -> PathBuf {
        self.workspace.clone()
    }

    /// The host directory bound at `/mnt/session/outputs`, if any.
    pub fn outputs(&self) -> Option<&Path> {
        self.outputs.as_deref()
    }

    fn network_slot(&self) -> std::sync::MutexGuard<'_, Option<OwnNetwork>> {
        self.network
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Under a config other than `none`: the sandbox's namespace, with the host's side of
    /// its network bound in it.
    pub(crate) fn serve_network(&self) -> Result<(), GvisorError> {
        if !self.shared.network.reaches_out() {
            return Ok(());
        }
        let own = crate::network::start(
            &self.shared.network,
            self.shared.limits.memory_bytes,
            Arc::clone(&self.shared.resolver),
        )?;
        *self.network_slot() = Some(own);
        Ok(())
    }

    /// Runs `f` on the host side of the sandbox's network; `NoNetwork` under `none`.
    pub(crate) fn with_network<T>(
        &self,
        f: impl FnOnce(&omabox_sandbox_net::SandboxNetwork) -> T,
    ) -> Result<T, GvisorError> {
        self.network_slot()
            .as_ref()
            .map(|own| f(&own.served))
            .ok_or(GvisorError::NoNetwork)
    }

    /// The directory of the sandbox's checkpoint (present while paused).
    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.join("checkpoint")
    }

    /// The memory limit this sandbox was started with.
    pub fn memory_limit(&self) -> Option<u64> {
        self.shared.limits.memory_bytes
    }

    /// The sandbox's foreground runsc, for the port's account of a lost agent.
    pub(crate) fn runsc_slot(&self) -> RunscSlot {
        self.runsc.clone()
    }

    /// The sandbox's own directory (removed by [`GvisorSandbox::destroy`]).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn bundle(&self) -> PathBuf {
        self.dir.join("bundle")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("runsc.log")
    }

    /// Current state.
    pub async fn state(&self) -> State {
        self.live.lock().await.state
    }

    /// The connected agent; `NotRunning` while paused or after destroy.
    pub async fn client(&self) -> Result<AgentClient, GvisorError> {
        let live = self.live.lock().await;
        match (&live.client, live.state) {
            (Some(c), State::Running) => Ok(c.clone()),
            (_, state) => Err(GvisorError::NotRunning { state }),
        }
    }

    /// Writes the bundle, runs (or, with `image`, restores) the container on new stdio
    /// pipes and connects to the agent.
    pub(crate) async fn boot(&self, image: Option<PathBuf>) -> Result<(), GvisorError> {
        let Some(image) = image else {
            return self.boot_once(None).await;
        };
        // A restore that fails (runsc 2022-12-19 crashed restored processes right away,
        // tests/repro/runsc_restore.py) leaves the image unchanged, so it is tried again.
        let mut attempt = 1;
        loop {
            match self.boot_once(Some(image.clone())).await {
                Ok(()) => return Ok(()),
                Err(e) if attempt < RESTORE_ATTEMPTS => {
                    tracing::warn!(id = %self.id, attempt, error = %e, "gvisor restore failed; trying again");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn boot_once(&self, image: Option<PathBuf>) -> Result<(), GvisorError> {
        let netns = self
            .network_slot()
            .as_ref()
            .map(|own| own.netns.try_clone())
            .transpose()
            .map_err(|e| GvisorError::Io {
                what: "passing the sandbox's network namespace".into(),
                source: e,
            })?;
        let workspace = self.workspace();
        let resolv_conf = self.shared.generated.join("etc/resolv.conf");
        let (root, image_root) = match &self.image_root {
            Some(root) => (root, true),
            None => (&self.shared.root, self.shared.image),
        };
        let config = bundle::config(&bundle::Layout {
            root,
            image: image_root,
            resolv_conf: &resolv_conf,
            workspace: &workspace,
            outputs: self.outputs.as_deref(),
            init: &self.shared.init,
            hostname: "omabox",
            host_network: netns.is_some(),
            user_home: self.user_home,
        });
        let config = bundle::with_cgroup(config, &self.id, &self.shared.limits);
        bundle::write(&self.bundle(), &config)?;
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| GvisorError::Io { what, source: e }
        };
        // Both ends close on exec: runsc gets its copies of the container's ends as its
        // stdin and stdout, and nothing else inherits any.
        let (agent_in, host_out) = std::io::pipe().map_err(io("creating the agent's pipes"))?;
        let (host_in, agent_out) = std::io::pipe().map_err(io("creating the agent's pipes"))?;
        let (agent_in, agent_out) = (OwnedFd::from(agent_in), OwnedFd::from(agent_out));
        let mut runsc = self.shared.runsc.clone();
        // An image root is written in the sandbox's memory (`--overlay2 root:memory`).
        runsc.overlay_root |= image_root;
        let (id, bundle, log) = (self.id.clone(), self.bundle(), self.log());
        let restoring = image.is_some();
        let child = blocking(move || {
            let stdio = Stdio2 {
                stdin: &agent_in,
                stdout: &agent_out,
            };
            let netns = netns.as_ref().map(AsFd::as_fd);
            match image {
                None => runsc.run(&id, &bundle, stdio, &log, netns),
                Some(image) => runsc.restore(&id, &bundle, &image, stdio, &log, netns),
            }
        })
        .await?;
        if restoring {
            omabox_sandbox::fault::point("gvisor-restoring");
        }
        match self.connect_booted(host_in, host_out, restoring).await {
            Ok((client, gate, kept)) => {
                let mut live = self.live.lock().await;
                live.client = Some(client);
                live.gate = Some(gate);
                live.kept = Some(kept);
                self.runsc.set(child);
                live.state = State::Running;
                Ok(())
            }
            Err(e) => {
                // Whatever started is stopped: runsc, the container, its cgroups.
                self.end_container(Some(child)).await;
                Err(e)
            }
        }
    }

    /// Connects to the agent of a container just started on these pipe ends.
    async fn connect_booted(
        &self,
        host_in: std::io::PipeReader,
        host_out: std::io::PipeWriter,
        restoring: bool,
    ) -> Result<
        (
            AgentClient,
            Arc<std::sync::atomic::AtomicBool>,
            [OwnedFd; 2],
        ),
        GvisorError,
    > {
        let io = |what: &str| {
            let what = what.to_owned();
            move |e| GvisorError::Io { what, source: e }
        };
        let (host_in, host_out) = (OwnedFd::from(host_in), OwnedFd::from(host_out));
        let kept = [
            host_in
                .try_clone()
                .map_err(io("keeping the agent's pipes"))?,
            host_out
                .try_clone()
                .map_err(io("keeping the agent's pipes"))?,
        ];
        let reader = tokio::net::unix::pipe::Receiver::from_owned_fd(host_in)
            .map_err(io("reading the agent's pipe"))?;
        let writer = tokio::net::unix::pipe::Sender::from_owned_fd(host_out)
            .map_err(io("writing the agent's pipe"))?;
        let host = tokio::io::join(reader, writer);
        let gate = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let client = self.connect(host, restoring, gate.clone()).await?;
        if restoring {
            // A restored process that crashes does so right away: one round trip shows
            // the agent is alive before the sandbox counts as resumed.
            client.ping().await.map_err(|e| GvisorError::Agent {
                id: self.id.clone(),
                source: e,
            })?;
        }
        Ok((client, gate, kept))
    }

    /// Ends the container and what runsc keeps of it: `runsc kill` while the foreground
    /// runsc still waits (it then reaps the sandbox and removes the container), that runsc
    /// killed itself if it does not end within [`RUNSC_END`], `runsc delete --force` for
    /// anything left, and the sandbox's cgroups.
    async fn end_container(&self, child: Option<std::process::Child>) {
        let runsc = self.shared.runsc.clone();
        let (id, log) = (self.id.clone(), self.log());
        let _ = blocking(move || {
            end_container(&runsc, &id, &log, child);
            Ok(())
        })
        .await;
    }

    async fn connect(
        &self,
        mut host: AgentPipes,
        wake: bool,
        gate: Arc<std::sync::atomic::AtomicBool>,
    ) -> Result<AgentClient, GvisorError> {
        if wake {
            host.write_all(crate::WAKE)
                .await
                .map_err(|e| GvisorError::Io {
                    what: "waking the restored agent".into(),
                    source: e,
                })?;
        }
        AgentClient::connect(ClientStream { inner: host, gate })
            .await
            .map_err(|e| GvisorError::Handshake {
                id: self.id.clone(),
                log_tail: crate::runsc::tail(&self.log()),
                source: e,
            })
    }

    /// Checkpoints the running sandbox to its directory: its processes and memory are
    /// kept there and nothing runs until [`GvisorSandbox::resume`]. Refused, the sandbox
    /// running on, when the disk has no room for it ([`GvisorError::NoDiskRoom`]).
    pub async fn pause(&self) -> Result<(), GvisorError> {
        let mut live = self.live.lock().await;
        if live.state != State::Running {
            return Err(GvisorError::NotRunning { state: live.state });
        }
        crate::disk_room::check(&self.dir, &self.id)?;
        let client = live
            .client
            .take()
            .ok_or(GvisorError::NotRunning { state: live.state })?;
        client.detach().await.map_err(|e| GvisorError::Agent {
            id: self.id.clone(),
            source: e,
        })?;
        // The old client's reader may still poll its copy of the pipe: it must not
        // take the init's answer.
        if let Some(gate) = live.gate.take() {
            gate.store(true, std::sync::atomic::Ordering::SeqCst);
        }

        let image = self.checkpoint_dir();
        let _ = std::fs::remove_dir_all(&image);
        std::fs::create_dir(&image).map_err(|e| GvisorError::Io {
            what: "creating the checkpoint directory".into(),
            source: e,
        })?;
        let runsc = self.shared.runsc.clone();
        let (id, log) = (self.id.clone(), self.log());
        let result = blocking(move || runsc.checkpoint(&id, &image, &log)).await;
        omabox_sandbox::fault::point("gvisor-checkpointed");
        live.kept = None;
        // The checkpoint stopped the container and its foreground runsc ends; after a failed
        // one its state is unknown: either way nothing half-paused is left running.
        let child = self.runsc.take();
        self.end_container(child).await;
        match result {
            Ok(()) => {
                live.state = State::Paused;
                Ok(())
            }
            Err(e) => {
                live.state = State::Gone;
                Err(e)
            }
        }
    }

    /// Restores the paused sandbox from its checkpoint and reconnects to its agent.
    pub async fn resume(&self) -> Result<(), GvisorError> {
        {
            let live = self.live.lock().await;
            if live.state != State::Paused {
                return Err(GvisorError::NotPaused { state: live.state });
            }
        }
        self.boot(Some(self.checkpoint_dir())).await?;
        let _ = std::fs::remove_dir_all(self.checkpoint_dir());
        Ok(())
    }

    /// Kills the container (if any) and removes the sandbox's directory, its
    /// checkpoint and workspace included.
    pub async fn destroy(&self) -> Result<(), GvisorError> {
        let mut live = self.live.lock().await;
        live.client = None;
        live.kept = None;
        live.state = State::Gone;
        let child = self.runsc.take();
        let runsc = self.shared.runsc.clone();
        let (id, log, dir) = (self.id.clone(), self.log(), self.dir.clone());
        let backend_dir = self.shared.dir.clone();
        let network = self.network_slot().take();
        blocking(move || {
            end_container(&runsc, &id, &log, child);
            // Its processes are gone: the host's sockets in the namespace and the
            // namespace go too.
            drop(network);
            remove_sandbox_dir(&dir, &backend_dir)
        })
        .await
    }
}

impl Drop for GvisorSandbox {
    /// A sandbox whose handle is dropped without [`GvisorSandbox::destroy`] (a panic, an
    /// early return) is destroyed here, synchronously: no container or checkpoint of it
    /// outlives its owner.
    fn drop(&mut self) {
        let live = self.live.get_mut();
        if live.state == State::Gone && !self.dir.exists() {
            return;
        }
        // The client and our pipe ends first: the init reads EOF and stops everything.
        live.client = None;
        live.kept = None;
        let child = self.runsc.take();
        end_container(&self.shared.runsc, &self.id, &self.log(), child);
        drop(self.network_slot().take());
        let _ = remove_sandbox_dir(&self.dir, &self.shared.dir);
    }
}

/// Removes a sandbox's directory (its workspace overlay unmounted first), then, when it
/// stacked layers, the layers no sandbox of `backend_dir` stacks any more (a sandbox that
/// never forked costs no scan of the others).
pub(crate) fn remove_sandbox_dir(dir: &Path, backend_dir: &Path) -> Result<(), GvisorError> {
    let layered = !crate::layers::lowers(dir).is_empty();
    if let Err(e) = crate::layers::unmount(dir) {
        return Err(GvisorError::Io {
            what: format!("unmounting the workspace of {}", dir.display()),
            source: e,
        });
    }
    let removed = match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GvisorError::Io {
            what: format!("removing {}", dir.display()),
            source: e,
        }),
        _ => Ok(()),
    };
    if layered {
        crate::layers::collect_bases(backend_dir);
    }
    removed
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, GvisorError> + Send + 'static,
) -> Result<T, GvisorError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| GvisorError::Io {
            what: "a runsc step".into(),
            source: std::io::Error::other(e.to_string()),
        })?
}

/// [`GvisorSandbox::end_container`], synchronously (also for `Drop`).
fn end_container(runsc: &Runsc, id: &str, log: &Path, child: Option<std::process::Child>) {
    if let Some(mut child) = child {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = runsc.kill(id, log);
            let deadline = std::time::Instant::now() + RUNSC_END;
            while matches!(child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    }
    // Absent (the foreground runsc removed it, or it never started) is fine.
    let _ = runsc.delete(id, log);
    crate::bundle::remove_cgroups(id);
}
