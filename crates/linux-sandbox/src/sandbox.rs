//! The host side: [`LinuxRuntime`] starts sandboxes, [`LinuxSandbox`] owns one and tears
//! it down (explicitly or on drop); `identity` lets a fresh process tear one down with
//! no handle at all.
//!
//! Start, as a checklist:
//!
//! 1. validate the plan and check it against the probed capabilities;
//! 2. create the state dir (`<runtime_dir>/<id>`) and, first in it, `owner.json` (this host
//!    process; see `leftovers`, which reaps the state dirs of dead owners); as root, claim
//!    the sandbox's host id range (see `idmap`);
//! 3. clone a child into new mount/pid/ipc/uts namespaces that execs the setup stage at
//!    once (see `spawn`) in a session of its own; the setup stage enters a new network
//!    namespace first thing, and its own user namespace last (with the range);
//! 4. create the cgroup with its limits and, as root, the sandbox's user namespace
//!    (mapped to its range; sent to the child on the agent socket), both overlapping the
//!    child's exec and network namespace creation, then release the child by writing the
//!    plan into its plan pipe (it
//!    blocks on that read, so no plan-controlled code runs before it is in the cgroup).
//!    On cgroup v1 the child joins the cgroup itself as the first step after that read
//!    (`setup::join_cgroups` says why); otherwise the host moves it in before the write;
//! 5. write `identity.json` (while the setup stage works);
//! 6. wait for its one status message: ready (with what it enforced) or an error, and
//!    hand back the agent end of the socketpair.
//!
//! Every step's resource is owned by the half-built [`LinuxSandbox`] from the moment it
//! exists, so a failure anywhere drops it and its `Drop` cleans up.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::cgroup::CgroupPaths;
use crate::config::{INIT_BINARY, RuntimeConfig};
use crate::handoff::{self, InitSpec, SetupReport};
use crate::identity::{DestroyError, IDENTITY_FILE, SandboxIdentity, destroy_err};
use crate::idmap;
use crate::plan::{PlanError, SandboxPlan};
use crate::probe::{LinuxCapabilities, MissingRequirement, ProbeError};
use crate::spawn::{self, ExecSpec};
use crate::sys::{self, Reaped};

/// Why a sandbox did not start. Nothing is left behind in any case.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The plan is not one this build can carry out.
    #[error("invalid sandbox plan")]
    Plan(#[from] PlanError),
    /// The machine lacks something the plan needs.
    #[error(transparent)]
    Missing(#[from] MissingRequirement),
    /// Probing the machine failed.
    #[error(transparent)]
    Probe(#[from] ProbeError),
    /// The setup-stage binary was not found.
    #[error(
        "{INIT_BINARY} not found (looked for {0}): install it next to the omabox binary or on PATH, or set OMABOX_LINUX_INIT to its path"
    )]
    InitBinaryMissing(String),
    /// A host-side step failed.
    #[error("{step}")]
    Host {
        /// What was being done.
        step: &'static str,
        /// Why it failed.
        #[source]
        source: io::Error,
    },
    /// The child could not exec the setup stage.
    #[error("executing {INIT_BINARY} failed")]
    Exec(#[source] io::Error),
    /// The setup stage reported a failure.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// The setup stage exited without a word.
    #[error("sandbox setup stage exited before it was ready ({0})")]
    Died(String),
    /// The one-shot command cannot be run.
    #[error("invalid command: {0}")]
    Command(String),
    /// The setup stage did not report within the timeout.
    #[error("sandbox setup did not finish within {0:?}")]
    Timeout(Duration),
}

pub(crate) fn host(step: &'static str) -> impl Fn(io::Error) -> StartError {
    move |source| StartError::Host { step, source }
}

/// Starts sandboxes with one probed set of capabilities.
#[derive(Debug, Clone)]
pub struct LinuxRuntime {
    pub(crate) config: RuntimeConfig,
    pub(crate) caps: LinuxCapabilities,
    /// `None` for a runtime that only starts one-shot sandboxes (no exec).
    init_binary: Option<PathBuf>,
    /// Read once: it cannot change while this process runs.
    boot_id: String,
    /// The pre-started setup stage starts fork from (see `zygote`), shared by clones.
    zygote: crate::zygote::SharedZygote,
}

/// As root, the runtime dir goes on a tmpfs before anything is forked
/// ([`crate::runtime_dir`]).
fn prepare_runtime_dir(config: &RuntimeConfig, caps: &LinuxCapabilities) -> Result<(), StartError> {
    if caps.root {
        crate::runtime_dir::ensure(&config.runtime_dir).map_err(host("prepare runtime dir"))?;
    }
    Ok(())
}

impl LinuxRuntime {
    /// Probes the machine and locates the setup-stage binary.
    pub fn new(config: RuntimeConfig) -> Result<Self, StartError> {
        let caps = LinuxCapabilities::probe()?;
        prepare_runtime_dir(&config, &caps)?;
        let init_binary = Some(
            spawn::locate_init(config.init_binary.as_deref(), &config.init_search_path)
                .map_err(StartError::InitBinaryMissing)?,
        );
        let boot_id = sys::boot_id().map_err(host("read boot id"))?;
        Ok(Self {
            config,
            caps,
            init_binary,
            boot_id,
            zygote: Default::default(),
        })
    }

    /// Probes the machine for a runtime that starts only one-shot sandboxes
    /// ([`LinuxRuntime::start_one_shot`]): their PID 1 is a fork of this process, so no
    /// setup-stage binary is needed; [`LinuxRuntime::start`] then fails with
    /// [`StartError::InitBinaryMissing`].
    pub fn new_one_shot(config: RuntimeConfig) -> Result<Self, StartError> {
        let caps = LinuxCapabilities::probe()?;
        prepare_runtime_dir(&config, &caps)?;
        let boot_id = sys::boot_id().map_err(host("read boot id"))?;
        Ok(Self {
            config,
            caps,
            init_binary: None,
            boot_id,
            zygote: Default::default(),
        })
    }

    /// What the probe found.
    pub fn capabilities(&self) -> &LinuxCapabilities {
        &self.caps
    }

    /// Settings.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Starts a sandbox and returns once its setup stage reported ready. Blocking
    /// (a few milliseconds); from async code call it on `spawn_blocking`. The steps are
    /// the module doc's checklist; the half-built sandbox owns every resource from the
    /// moment it exists, so a failing step drops it and its `Drop` cleans up.
    pub fn start(&self, plan: &SandboxPlan) -> Result<LinuxSandbox, StartError> {
        let mut clock = vec![("host start", sys::monotonic_us())];
        let mut mark = |what| clock.push((what, sys::monotonic_us()));
        plan.validate()?;
        self.caps.check(plan)?;
        let (mut sandbox, ids) = self.create_state()?;
        crate::image_use::record(&sandbox.identity.state_dir, plan)
            .map_err(host("record the image roots"))?;
        mark("host state dir");
        let init = self.prepare_init(plan)?;
        mark("host fds, argv");
        let channels = self.spawn_init(&mut sandbox, init)?;
        mark("host clone");
        crate::fault::point("linux-start-cloned");
        let pending_userns = self.begin_userns(ids)?;
        let cgroup_join = self.create_cgroup(&mut sandbox, plan)?;
        mark("host cgroup create");
        crate::fault::point("linux-start-cgroup");
        let userns_helper = self.send_userns(pending_userns, channels.agent.as_fd())?;
        let userns_sent = userns_helper.is_some();
        mark("host user namespace");
        let spec = InitSpec {
            id: sandbox.identity.id.clone(),
            plan: plan.clone(),
            scratch_dir: sandbox.identity.state_dir.clone(),
            cgroup_join,
            id_base: ids.map(|r| r.base),
            userns_sent,
        };
        send_plan(channels.plan, &spec)?;
        // The child has the namespace and its go: the helper goes now, off its path.
        drop(userns_helper);
        mark("host plan sent");
        crate::fault::point("linux-start-plan-sent");
        sandbox.record_identity()?;
        mark("host identity written");
        crate::fault::point("linux-start-identity");
        let msg = read_status(channels.status, self.config.ready_timeout)?;
        mark("host ready read");
        sandbox.accept_status(&msg)?;
        sandbox.agent = Some(channels.agent);
        mark("host done");
        sandbox.timeline = merge_timelines(clock, sandbox.report.as_ref());
        if let Some(init) = &self.init_binary {
            // For the next start (after this one: its cost is not this start's).
            crate::zygote::ensure(&self.zygote, init);
        }
        Ok(sandbox)
    }

    /// Step 2: the runtime and state dirs (owner-only), the half-built sandbox that owns
    /// them from here on, and, as root, its host id range.
    fn create_state(&self) -> Result<(LinuxSandbox, Option<idmap::IdRange>), StartError> {
        let (sandbox, ids) = self.create_state_for(new_id())?;
        crate::leftovers::keep_alive(&sandbox.identity.state_dir);
        Ok((sandbox, ids))
    }

    /// [`Self::create_state`] for a given id, without adding the owner record to the
    /// heartbeat (a one-shot host has no heartbeat thread): starts no thread.
    pub(crate) fn create_state_for(
        &self,
        id: String,
    ) -> Result<(LinuxSandbox, Option<idmap::IdRange>), StartError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.config.runtime_dir)
            .map_err(host("create runtime dir"))?;
        let state_dir = self.config.runtime_dir.join(&id);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&state_dir)
            .map_err(host("create state dir"))?;
        let mut sandbox = LinuxSandbox {
            identity: SandboxIdentity {
                id,
                pid: 0,
                start_time: 0,
                boot_id: self.boot_id.clone(),
                cgroup: CgroupPaths {
                    dirs: Vec::new(),
                    unified: false,
                },
                state_dir: state_dir.clone(),
                id_base: None,
            },
            pidfd: None,
            agent: None,
            report: None,
            timeline: Vec::new(),
            host_clock: Vec::new(),
            destroy_timeout: self.config.destroy_timeout,
            destroyed: false,
        };
        // The owner record first: a host killed from here on leaves a state dir that
        // `leftovers::reap_leftovers` knows to be abandoned.
        crate::leftovers::Owner::record(&state_dir, &self.boot_id)
            .map_err(host("write owner record"))?;
        crate::fault::point("linux-start-state-dir");
        let ids = if self.caps.root {
            let r = idmap::allocate(&state_dir).map_err(host("allocate sandbox id range"))?;
            sandbox.identity.id_base = Some(r.base);
            Some(r)
        } else {
            None
        };
        Ok((sandbox, ids))
    }

    /// Step 3a: the three channels and what the child will exec, all built before the
    /// clone (the child may not allocate).
    fn prepare_init(&self, plan: &SandboxPlan) -> Result<PreparedInit, StartError> {
        let (agent_host, agent_child) = sys::socketpair().map_err(host("create socketpair"))?;
        let (plan_r, plan_w) = sys::pipe().map_err(host("create plan pipe"))?;
        let (status_r, status_w) = sys::pipe().map_err(host("create status pipe"))?;
        let null = spawn::dev_null().map_err(host("open /dev/null"))?;
        let Some(init_binary) = &self.init_binary else {
            return Err(StartError::InitBinaryMissing(
                "nowhere: this runtime starts one-shot sandboxes only".into(),
            ));
        };
        let mut argv = vec![sys::cstr(init_binary).map_err(host("init path"))?];
        for (flag, fd) in [
            ("--plan-fd", &plan_r),
            ("--status-fd", &status_w),
            ("--agent-fd", &agent_child),
        ] {
            argv.push(CString::new(flag).unwrap_or_default());
            argv.push(spawn::fd_arg(fd));
        }
        let envp = plan
            .env
            .iter()
            .map(|(k, v)| CString::new(format!("{k}={v}")))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| PlanError::Env("<NUL>".into()))?;
        let exec = ExecSpec {
            program: argv[0].clone(),
            argv,
            envp,
            keep: vec![
                plan_r.as_raw_fd(),
                status_w.as_raw_fd(),
                agent_child.as_raw_fd(),
            ],
            stdio: null.as_raw_fd(),
            error_fd: status_w.as_raw_fd(),
        };
        Ok(PreparedInit {
            exec,
            child_ends: vec![plan_r, status_w, agent_child, null],
            host_ends: Channels {
                plan: plan_w,
                status: status_r,
                agent: agent_host,
            },
        })
    }

    /// Step 3b: clone + exec the setup stage into new namespaces. No CLONE_NEWNET: the
    /// setup stage unshares its network namespace itself, before it reads the plan (see
    /// `setup::isolate_network`). As root, it also enters the sandbox's own user
    /// namespace itself once it has built the sandbox (see `setup::run`); otherwise the
    /// clone creates one, mapped to the caller's uid.
    fn spawn_init(
        &self,
        sandbox: &mut LinuxSandbox,
        init: PreparedInit,
    ) -> Result<Channels, StartError> {
        let mut ns =
            libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;
        if !self.caps.root {
            ns |= libc::CLONE_NEWUSER;
        }
        let fds = [0, 1, 2, 3].map(|i| init.child_ends[i].as_fd());
        let child = match crate::zygote::fork(&self.zygote, fds, ns) {
            Some(child) => child,
            None => spawn::clone_exec(&init.exec, ns).map_err(host("clone sandbox init"))?,
        };
        sandbox.identity.pid = child.pid;
        sandbox.pidfd = Some(child.pidfd);
        drop(init.child_ends);
        if !self.caps.root {
            write_id_maps(child.pid).map_err(host("write user namespace id maps"))?;
        }
        Ok(init.host_ends)
    }

    /// The cgroup hierarchies a sandbox of `plan` joins: the host's, less any whose
    /// limit would be a no-op ([`crate::CgroupLayout::for_limits`]).
    pub(crate) fn cgroup_layout(&self, plan: &SandboxPlan) -> Option<crate::CgroupLayout> {
        self.caps
            .cgroup
            .as_ref()
            .map(|layout| layout.for_limits(&plan.limits, crate::sys::possible_cpus))
    }

    /// Step 4: the cgroup with its limits (created while the child execs, on the other
    /// core). On cgroup v1 (as root) the setup stage joins it itself, first thing after
    /// reading the plan (see `setup::join_cgroups` for why): returns the files it writes.
    /// Otherwise the host moves it now.
    pub(crate) fn create_cgroup(
        &self,
        sandbox: &mut LinuxSandbox,
        plan: &SandboxPlan,
    ) -> Result<Vec<PathBuf>, StartError> {
        if let Some(layout) = &self.cgroup_layout(plan) {
            sandbox.identity.cgroup = CgroupPaths::create(
                layout,
                &self.config.cgroup_parent,
                &sandbox.identity.id,
                &plan.limits,
            )
            .map_err(host("create cgroup"))?;
        }
        match sandbox.identity.cgroup.self_join_files() {
            Some(files) if self.caps.root => Ok(files),
            _ => {
                sandbox
                    .identity
                    .cgroup
                    .add(sandbox.identity.pid)
                    .map_err(host("move init into cgroup"))?;
                Ok(Vec::new())
            }
        }
    }
}

impl LinuxRuntime {
    /// Step 4a (as root): starts making the sandbox's user namespace, mapped to its id
    /// range, here while the child still execs and starts (the setup stage would
    /// otherwise make it itself, on the start's critical path); the caller makes the
    /// cgroup while the namespace's helper starts. `None`: no id range.
    pub(crate) fn begin_userns(
        &self,
        ids: Option<idmap::IdRange>,
    ) -> Result<Option<idmap::PendingUserns>, StartError> {
        ids.map(idmap::begin_userns)
            .transpose()
            .map_err(host("create user namespace"))
    }

    /// Step 4b: finishes the namespace and sends it to the child on `to` ahead of the
    /// plan. `None`: none, nothing sent. Else the helper that made the namespace, for
    /// the caller to drop once the child is released (see [`idmap::create_userns`]).
    pub(crate) fn send_userns(
        &self,
        pending: Option<idmap::PendingUserns>,
        to: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Option<idmap::UsernsHelper>, StartError> {
        let Some(pending) = pending else {
            return Ok(None);
        };
        let (ns, helper) = pending.finish().map_err(host("create user namespace"))?;
        match sys::send_fd(to, ns.as_fd()) {
            // The child already died (as for the plan): its status message says why.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
                ) =>
            {
                Ok(Some(helper))
            }
            r => r
                .map(|()| Some(helper))
                .map_err(host("send user namespace")),
        }
    }
}

/// The host's ends of the three channels to the setup stage.
struct Channels {
    plan: OwnedFd,
    status: OwnedFd,
    agent: OwnedFd,
}

/// What [`LinuxRuntime::spawn_init`] needs, prepared before the clone.
struct PreparedInit {
    exec: ExecSpec,
    /// The child's ends (and its stdio), closed in the host once it has exec'd.
    child_ends: Vec<OwnedFd>,
    host_ends: Channels,
}

/// Step 4 (end): releases the setup stage with the plan. EPIPE means the child already
/// died; its status message says why.
fn send_plan(plan_w: OwnedFd, spec: &InitSpec) -> Result<(), StartError> {
    let json = serde_json::to_vec(spec).map_err(|e| host("encode plan")(e.into()))?;
    let _ = std::fs::File::from(plan_w).write_all(&json);
    Ok(())
}

/// A fresh sandbox id: 16 hex digits.
pub(crate) fn new_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..16].to_owned()
}

/// The host's milestones and the setup stage's, in time order.
fn merge_timelines(
    host: Vec<(&'static str, u64)>,
    report: Option<&SetupReport>,
) -> Vec<(String, u64)> {
    let mut timeline: Vec<(String, u64)> = host
        .into_iter()
        .map(|(what, t)| (what.to_owned(), t))
        .collect();
    if let Some(r) = report {
        timeline.extend(r.clock_us.iter().cloned());
    }
    timeline.sort_by_key(|(_, t)| *t);
    timeline
}

pub(crate) fn write_id_maps(pid: i32) -> io::Result<()> {
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    std::fs::write(format!("/proc/{pid}/setgroups"), "deny")?;
    std::fs::write(format!("/proc/{pid}/gid_map"), format!("0 {gid} 1\n"))?;
    std::fs::write(format!("/proc/{pid}/uid_map"), format!("0 {uid} 1\n"))
}

/// Reads the status pipe to EOF (or until `timeout`).
fn read_status(fd: OwnedFd, timeout: Duration) -> Result<Vec<u8>, StartError> {
    let deadline = std::time::Instant::now() + timeout;
    let mut file = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let mut pfd = libc::pollfd {
            fd: file.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `pfd` is one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(host("wait for sandbox status")(e));
        }
        if r == 0 {
            return Err(StartError::Timeout(timeout));
        }
        match file.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > 1 << 20 {
                    return Err(StartError::Setup("oversized status message".into()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(host("read sandbox status")(e)),
        }
    }
}

/// A running sandbox. Dropping it destroys it; [`LinuxSandbox::destroy`] does the same
/// and reports errors.
#[derive(Debug)]
pub struct LinuxSandbox {
    identity: SandboxIdentity,
    pidfd: Option<OwnedFd>,
    agent: Option<OwnedFd>,
    report: Option<SetupReport>,
    timeline: Vec<(String, u64)>,
    /// The host's milestones of a one-shot start, merged into `timeline` when ready.
    host_clock: Vec<(&'static str, u64)>,
    destroy_timeout: Duration,
    destroyed: bool,
}

impl LinuxSandbox {
    /// Sandbox id.
    pub fn id(&self) -> &str {
        &self.identity.id
    }

    /// Host pid of the sandbox's PID 1 (the agent).
    pub fn pid(&self) -> i32 {
        self.identity.pid
    }

    /// The serializable identity (for a lease, and for [`SandboxIdentity::destroy`]).
    pub fn identity(&self) -> &SandboxIdentity {
        &self.identity
    }

    /// What the setup stage enforced.
    pub fn report(&self) -> Option<&SetupReport> {
        self.report.as_ref()
    }

    /// Milestones of the start, host's and setup stage's, as absolute `CLOCK_MONOTONIC`
    /// microseconds in time order (diagnostics for benchmarks).
    pub fn start_timeline(&self) -> &[(String, u64)] {
        &self.timeline
    }

    /// Whether PID 1 is still running (a non-reaping check through the pidfd).
    pub fn is_alive(&self) -> bool {
        let Some(fd) = &self.pidfd else {
            return false;
        };
        !matches!(sys::pidfd_wait_exit(fd.as_fd(), 0), Ok(true))
    }

    /// Takes the host end of the agent socketpair (once). The agent serves exactly
    /// one connection on it; when it is closed, the agent exits and the sandbox dies.
    pub fn take_agent_stream(&mut self) -> Option<UnixStream> {
        self.agent.take().map(UnixStream::from)
    }

    /// Takes the agent stream and performs the protocol handshake.
    pub async fn connect_agent(
        &mut self,
    ) -> Result<omabox_agent::client::AgentClient, omabox_agent::client::ClientError> {
        let stream = self.take_agent_stream().ok_or_else(|| {
            omabox_agent::client::ClientError::ConnectionLost {
                reason: "the agent stream was already taken".into(),
            }
        })?;
        let io_err = |e: io::Error| omabox_agent::client::ClientError::ConnectionLost {
            reason: e.to_string(),
        };
        stream.set_nonblocking(true).map_err(io_err)?;
        let stream = tokio::net::UnixStream::from_std(stream).map_err(io_err)?;
        omabox_agent::client::AgentClient::connect(stream).await
    }

    /// SIGKILLs PID 1, which takes every process of the pid namespace with it, then
    /// removes cgroup and state dir. Idempotent.
    pub fn kill(&mut self) -> Result<(), DestroyError> {
        self.destroy()
    }

    /// Same as [`kill`](Self::kill): the sandbox is gone when this returns `Ok`.
    pub fn destroy(&mut self) -> Result<(), DestroyError> {
        if self.destroyed {
            return Ok(());
        }
        self.agent = None;
        if let Some(fd) = &self.pidfd {
            sys::pidfd_kill(fd.as_fd(), libc::SIGKILL).map_err(destroy_err("kill sandbox init"))?;
            // PID 1 finishes exiting only once every process of its namespace is gone.
            let ms = self.destroy_timeout.as_millis().min(i32::MAX as u128) as i32;
            sys::pidfd_wait_exit(fd.as_fd(), ms).map_err(destroy_err("wait for sandbox"))?;
            match sys::pidfd_reap(fd.as_fd(), true).map_err(destroy_err("reap sandbox init"))? {
                Reaped::Running => {
                    return Err(DestroyError {
                        step: "wait for sandbox",
                        source: io::Error::new(
                            io::ErrorKind::TimedOut,
                            "sandbox processes did not exit in time",
                        ),
                    });
                }
                Reaped::Exited { .. } | Reaped::Gone => {}
            }
            self.pidfd = None;
        }
        self.identity
            .cgroup
            .remove(self.destroy_timeout)
            .map_err(destroy_err("remove cgroup"))?;
        self.identity
            .release()
            .map_err(destroy_err("remove state dir"))?;
        self.destroyed = true;
        Ok(())
    }

    /// Teardown of a sandbox whose PID 1 said it is empty and is exiting (every other
    /// process of it reaped, its cgroup already removed by the caller): frees the state dir
    /// and the id range without waiting for PID 1's exit to finish, which runs no code of
    /// the sandbox's any more. PID 1 is left unreaped: for a caller that exits next
    /// ([`OneShotSandbox::destroy_before_exit`](crate::oneshot::OneShotSandbox::destroy_before_exit)).
    pub(crate) fn release_while_exiting(&mut self) -> Result<(), DestroyError> {
        if self.destroyed {
            return Ok(());
        }
        self.agent = None;
        if let Some(fd) = self.pidfd.take() {
            // It is exiting already; the kill only makes sure it cannot linger.
            sys::pidfd_kill(fd.as_fd(), libc::SIGKILL).map_err(destroy_err("kill sandbox init"))?;
        }
        self.identity
            .release()
            .map_err(destroy_err("remove state dir"))?;
        self.destroyed = true;
        Ok(())
    }

    /// Step 5: records the identity for out-of-process teardown while the setup stage
    /// works (it is complete now: pid, start time, cgroup; the start time is read only
    /// after the clone returned, i.e. after the child's exec, because reading
    /// /proc/<pid>/stat during an exec can stall). From here a crashed host's leftover is
    /// found and reaped by `SandboxIdentity::list`.
    pub(crate) fn record_identity(&mut self) -> Result<(), StartError> {
        self.identity.start_time = sys::process_start_time(self.identity.pid)
            .map_err(host("read init start time"))?
            .unwrap_or(0);
        let json = serde_json::to_vec_pretty(&self.identity)
            .map_err(|e| host("encode identity")(e.into()))?;
        std::fs::write(self.identity.state_dir.join(IDENTITY_FILE), json)
            .map_err(host("write identity"))
    }

    /// Step 6: the setup stage's one status message: ready (with what it enforced) or
    /// why it failed.
    pub(crate) fn accept_status(&mut self, msg: &[u8]) -> Result<(), StartError> {
        match msg.first() {
            Some(&handoff::READY) => {
                let report: SetupReport = serde_json::from_slice(&msg[1..])
                    .map_err(|e| StartError::Setup(format!("malformed ready message: {e}")))?;
                self.report = Some(report);
                Ok(())
            }
            Some(&handoff::FAILED) => Err(StartError::Setup(
                String::from_utf8_lossy(&msg[1..]).into_owned(),
            )),
            Some(&handoff::EXEC_FAILED) if msg.len() == 5 => {
                let errno = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
                Err(StartError::Exec(io::Error::from_raw_os_error(errno)))
            }
            _ => Err(StartError::Died(self.exit_status())),
        }
    }

    /// A one-shot start's PID 1, cloned by `oneshot`.
    pub(crate) fn adopt_init(&mut self, pid: i32, pidfd: OwnedFd) {
        self.identity.pid = pid;
        self.pidfd = Some(pidfd);
    }

    /// A one-shot start's host milestones so far.
    /// The cgroup directories of a sandbox whose PID 1 makes them itself (destroy
    /// removes them as if the host had made them).
    pub(crate) fn set_cgroup(&mut self, cgroup: CgroupPaths) {
        self.identity.cgroup = cgroup;
    }

    pub(crate) fn set_host_clock(&mut self, clock: Vec<(&'static str, u64)>) {
        self.host_clock = clock;
    }

    /// A one-shot sandbox reported ready with `report`.
    pub(crate) fn set_ready(&mut self, report: SetupReport) {
        let mut clock = std::mem::take(&mut self.host_clock);
        clock.push(("host ready read", sys::monotonic_us()));
        clock.push(("host done", sys::monotonic_us()));
        self.timeline = merge_timelines(clock, Some(&report));
        self.report = Some(report);
    }

    /// PID 1 ended without a word: how (reaps it).
    pub(crate) fn died(&mut self) -> StartError {
        StartError::Died(self.exit_status())
    }

    /// Describes how PID 1 ended (after killing it if it is still running).
    fn exit_status(&mut self) -> String {
        let Some(fd) = &self.pidfd else {
            return "not started".into();
        };
        let _ = sys::pidfd_wait_exit(fd.as_fd(), 1000);
        match sys::pidfd_reap(fd.as_fd(), true) {
            Ok(Reaped::Exited { code, status }) => {
                self.pidfd = None;
                if code == libc::CLD_EXITED {
                    format!("exit code {status}")
                } else {
                    format!("killed by signal {status}")
                }
            }
            Ok(Reaped::Running) => "still running".into(),
            Ok(Reaped::Gone) => "already reaped".into(),
            Err(e) => format!("wait failed: {e}"),
        }
    }
}

impl Drop for LinuxSandbox {
    fn drop(&mut self) {
        if let Err(e) = self.destroy() {
            eprintln!(
                "omabox-linux-sandbox: destroying sandbox {} failed: {e}: {:?}",
                self.identity.id,
                std::error::Error::source(&e)
            );
        }
    }
}
