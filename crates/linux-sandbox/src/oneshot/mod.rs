//! One command in a fresh sandbox, without an agent: what `omabox sandbox run` needs.
//!
//! [`LinuxRuntime::start_one_shot`] builds the same sandbox as [`LinuxRuntime::start`]
//! (same state dir with `owner.json` first, id range, cgroup, user namespace, setup
//! stage, identity record, teardown), with two differences that save most of a start
//! (and PID 1 is forked before the plan is known — [`OneShotFork::fork`], which the CLI
//! calls first thing — so its own start-up overlaps the host's working out of the plan,
//! state dir, cgroup and user namespace: born into its PID namespace only, it makes its
//! network, mount, IPC and UTS namespaces, off the host's CPU;
//! [`LinuxRuntime::start_forked`] sends it the plan, command and env as a
//! length-prefixed [`ForkedPlan`] JSON once the state dir exists, then PID 1 makes its
//! own cgroup on v1 as root (the host records and removes it like its own) while the host
//! makes the user namespace, and the go (namespace fd and id range's base) follows, then
//! the seccomp program (`harden::encode_program`), which the host builds while PID 1 sets
//! up the sandbox and PID 1 reads just before it installs it; PID 1 exits if the host goes
//! away, removing the cgroup it made, so a host killed at any point leaves nothing
//! `omabox reap` cannot find):
//!
//! - PID 1 is a fork of the calling process that runs the setup stage in place
//!   (`child.rs`), not an exec of `omabox-sandbox-init`: no second binary is loaded. A
//!   fork is only safe from a single-threaded process (the child allocates), so the
//!   start refuses to run in a process with more than one thread.
//! - Instead of serving the agent protocol, PID 1 starts the one command with three
//!   host pipes as its stdin, stdout and stderr, forwards kill requests to its process
//!   group, reaps, and reports its exit on the status pipe. Once the command has exited
//!   and no process is left in the namespace, PID 1 exits without waiting for the
//!   host's kill, so its teardown overlaps the host's reading of the exit.
//!
//! The host side reads [`OneShotEvent`]s from the status pipe and relays stdio itself
//! (the caller's loop, e.g. the CLI's), which also refreshes the owner record
//! ([`OneShotSandbox::heartbeat`]): no heartbeat thread, the caller stays single-threaded. Status messages are lines: `R` + the
//! [`SetupReport`] JSON when the sandbox is ready, then exactly one of `X<code>` (exited),
//! `S<signal>` (killed by a signal), `N<text>` (the command could not be started) or `I`
//! (the host asked to stop before the command started), and after an exit `D` once no
//! process is left in the sandbox (PID 1 then exits). A setup failure is `E` + text
//! up to EOF, as for the init binary.

mod child;

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use crate::handoff::{self, InitSpec, SetupReport};
use crate::identity::DestroyError;
use crate::plan::{PlanError, SandboxPlan};
use crate::sandbox::{LinuxRuntime, LinuxSandbox, StartError, host};
use crate::sys;

/// The status and control bytes between the host and a one-shot PID 1.
mod wire {
    /// Control: SIGTERM the command's process group (or, before it started, run nothing).
    pub(super) const TERM: u8 = b'T';
    /// Control: SIGKILL the command's process group.
    pub(super) const KILL: u8 = b'K';
    /// Status: the command exited with a code.
    pub(super) const EXITED: u8 = b'X';
    /// Status: a signal ended the command.
    pub(super) const SIGNALED: u8 = b'S';
    /// Status: the command could not be started.
    pub(super) const NOT_STARTED: u8 = b'N';
    /// Status: stopped before the command started.
    pub(super) const INTERRUPTED: u8 = b'I';
    /// Status: after the command's exit, no process is left in the sandbox (PID 1 is
    /// exiting).
    pub(super) const EMPTY: u8 = b'D';

    /// The status line for a `waitpid` status.
    pub(super) fn exit_line(status: i32) -> String {
        if libc::WIFSIGNALED(status) {
            format!("{}{}\n", SIGNALED as char, libc::WTERMSIG(status))
        } else {
            format!("{}{}\n", EXITED as char, libc::WEXITSTATUS(status))
        }
    }
}

/// The command a one-shot sandbox runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneShotCommand {
    /// Program (searched in the env's `PATH` unless it holds a `/`) and arguments.
    pub argv: Vec<String>,
    /// Set on top of the plan's env.
    pub env: Vec<(String, String)>,
}

/// What the status pipe says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OneShotEvent {
    /// The sandbox is built; the command is starting.
    Ready(SetupReport),
    /// The command exited with `code`.
    Exited(i32),
    /// Signal `n` ended the command.
    Signaled(i32),
    /// The command could not be started (why, e.g. "cannot start [..]: No such file").
    NotStarted(String),
    /// A kill request arrived before the command started: nothing ran.
    Interrupted,
    /// After the command's exit: no process of the sandbox is left (its PID 1 is
    /// exiting), so nothing can write to its stdio or its workspace any more.
    Empty,
}

/// The sandbox's memory limit killed a process in it ([`OneShotSandbox::out_of_memory`]).
/// Data only: the caller words it (`omabox_sandbox::OutOfMemory`'s text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The limit in bytes, when known.
    pub limit_bytes: Option<u64>,
}

/// A one-shot sandbox: the command's stdio pipes, its status, and the sandbox, which
/// dropping (or [`OneShotSandbox::destroy`]) tears down.
#[derive(Debug)]
pub struct OneShotSandbox {
    sandbox: LinuxSandbox,
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    status: std::fs::File,
    pending: Vec<u8>,
    status_eof: bool,
    /// PID 1 said no process is left (`D`): it has left the sandbox's cgroup too.
    empty: bool,
    /// Whether the sandbox holds a host directory the caller named
    /// ([`SandboxPlan::holds_host_dirs`]).
    holds_host_dirs: bool,
    control: OwnedFd,
}

/// A one-shot PID 1 forked ahead of its plan ([`OneShotFork::fork`]): it makes its network
/// namespace while the caller still works out the plan,
/// then waits for [`LinuxRuntime::start_forked`] to hand it over. Dropped unused, it is
/// killed and reaped (having made nothing but namespaces of its own).
#[derive(Debug)]
pub struct OneShotFork {
    pid: i32,
    pidfd: Option<OwnedFd>,
    ends: Option<HostEnds>,
    /// Whether it was forked as root (no user namespace of its own yet: the host sends
    /// one with the go).
    root: bool,
    /// The runtime dir made ready before the fork (see `runtime_dir::ensure`).
    runtime_dir: std::path::PathBuf,
    forked_us: (u64, u64),
}

impl OneShotFork {
    /// Forks the PID 1 of a one-shot sandbox from this process, which must be
    /// single-threaded, before the plan is known. `runtime_dir`: the one the runtime that
    /// takes it over uses (as root it goes on a tmpfs first, if it is to: after the fork
    /// PID 1 would not see that mount).
    pub fn fork(runtime_dir: &std::path::Path) -> Result<Self, StartError> {
        let started = sys::monotonic_us();
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if root {
            crate::runtime_dir::ensure(runtime_dir).map_err(host("prepare runtime dir"))?;
        }
        let fds = OneShotFds::new()?;
        let child_plan = child::ChildPlan {
            userns_sent: root,
            status: fds.status_w.as_raw_fd(),
            control: fds.control_child.as_raw_fd(),
            stdin: fds.stdin_r.as_raw_fd(),
            stdout: fds.stdout_w.as_raw_fd(),
            stderr: fds.stderr_w.as_raw_fd(),
            null: fds.null.as_raw_fd(),
            affinity: sys::affinity(),
        };
        // Only what must be made by the clone itself: the PID namespace (PID 1 can only
        // be born into it) and, unprivileged, the user namespace that owns the rest. PID 1
        // unshares the mount, IPC, UTS and network namespaces itself
        // (`child::OWN_NAMESPACES`), on its own CPU while this process works out the plan:
        // copying the host's mount table and making an IPC namespace (with its mqueue
        // mount) took ~85 µs of this process's clone here (all four ~110-125 µs, the
        // PID namespace alone ~30).
        let ns = if root {
            libc::CLONE_NEWPID
        } else {
            libc::CLONE_NEWPID | libc::CLONE_NEWUSER
        };
        // Nothing of this start creates a thread (the owner record's heartbeat is the
        // caller's: `OneShotSandbox::heartbeat`); the caller must not have one either.
        single_threaded()?;
        let (pid, pidfd) = fork_into(ns, &child_plan).map_err(host("clone sandbox init"))?;
        Ok(Self {
            pid,
            pidfd: Some(pidfd),
            ends: Some(fds.close_child_ends()),
            root,
            runtime_dir: runtime_dir.to_path_buf(),
            forked_us: (started, sys::monotonic_us()),
        })
    }
}

impl Drop for OneShotFork {
    fn drop(&mut self) {
        if let Some(pidfd) = self.pidfd.take() {
            let _ = sys::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
            let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 1000);
            let _ = sys::pidfd_reap(pidfd.as_fd(), true);
        }
    }
}

/// What a forked PID 1 gets once its state dir exists, ahead of the go (the user namespace
/// and the id range's base): a 4-byte length (native endian), then this as JSON.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ForkedPlan {
    pub(super) spec: InitSpec,
    pub(super) argv: Vec<String>,
    pub(super) envp: Vec<String>,
    /// Set when PID 1 makes its own cgroup (v1, as root) while the host makes the user
    /// namespace.
    pub(super) cgroup: Option<ChildCgroup>,
}

/// Where a forked PID 1 makes its part of the cgroup: `layout`'s hierarchies (the host
/// makes the memory one meanwhile), under `parent`, named after the sandbox id, with the
/// plan's limits.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct ChildCgroup {
    pub(super) layout: crate::cgroup::CgroupLayout,
    pub(super) parent: String,
}

/// The most a [`ForkedPlan`] message may hold.
pub(super) const MAX_FORKED_PLAN: usize = 16 << 20;

impl LinuxRuntime {
    /// Starts a sandbox whose PID 1 runs `command` and reports its exit (see the module
    /// doc): [`OneShotFork::fork`], then [`LinuxRuntime::start_forked`].
    pub fn start_one_shot(
        &self,
        plan: &SandboxPlan,
        command: &OneShotCommand,
    ) -> Result<OneShotSandbox, StartError> {
        self.start_forked(OneShotFork::fork(&self.config.runtime_dir)?, plan, command)
    }

    /// Builds the sandbox of `plan` around a PID 1 forked earlier and lets it go. Returns
    /// once the setup stage is released, before it is ready: the ready message is the
    /// first [`OneShotEvent`].
    pub fn start_forked(
        &self,
        mut fork: OneShotFork,
        plan: &SandboxPlan,
        command: &OneShotCommand,
    ) -> Result<OneShotSandbox, StartError> {
        let mut clock = vec![
            ("host fork", fork.forked_us.0),
            ("host clone", fork.forked_us.1),
            ("host start", sys::monotonic_us()),
        ];
        plan.validate()?;
        self.caps.check(plan)?;
        if fork.root != self.caps.root {
            return Err(host("one-shot start")(io::Error::other(
                "the PID 1 was forked with other privileges than this runtime has",
            )));
        }
        if fork.runtime_dir != self.config.runtime_dir {
            return Err(host("one-shot start")(io::Error::other(
                "the PID 1 was forked for another runtime dir than this runtime's",
            )));
        }
        let argv: Vec<String> = command.argv.clone();
        if argv.first().is_none_or(String::is_empty) || argv.iter().any(|a| a.contains('\0')) {
            return Err(StartError::Command(
                "needs a program, without NUL bytes".into(),
            ));
        }
        let envp: Vec<String> = plan
            .env
            .iter()
            .filter(|(k, _)| !command.env.iter().any(|(c, _)| c == *k))
            .chain(command.env.iter().map(|(k, v)| (k, v)))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        if envp.iter().any(|e| e.contains('\0')) {
            return Err(PlanError::Env("<NUL>".into()).into());
        }
        let id = crate::sandbox::new_id();
        // On cgroup v1 as root the setup stage makes and joins the cgroup itself
        // (`ChildCgroup`); its directories follow from layout, parent and id. Otherwise
        // the host makes it (and, on v2, moves PID 1 in).
        let layout = self.cgroup_layout(plan);
        let planned = match &layout {
            Some(layout) if self.caps.root => Some(crate::leftovers::planned_cgroup(
                layout,
                &self.config.cgroup_parent,
                &id,
            )),
            _ => None,
        };
        let cgroup_join = planned
            .as_ref()
            .and_then(|p| p.self_join_files())
            .unwrap_or_default();
        // Joined by PID 1 itself (v1 as root): made by both sides at once, the memory
        // hierarchy (the costliest) by the host while PID 1 makes the others.
        let self_join = !cgroup_join.is_empty();
        let (host_part, child_part) = match &layout {
            Some(layout) if self_join => layout.split_v1("memory"),
            _ => (None, None),
        };
        let child_cgroup = child_part.map(|layout| ChildCgroup {
            layout,
            parent: self.config.cgroup_parent.clone(),
        });
        let forked = ForkedPlan {
            spec: InitSpec {
                id: id.clone(),
                plan: plan.clone(),
                scratch_dir: self.config.runtime_dir.join(&id),
                cgroup_join: cgroup_join.clone(),
                // Sent with the go (the range is claimed once the state dir exists).
                id_base: None,
                userns_sent: self.caps.root,
            },
            argv,
            envp,
            cgroup: child_cgroup,
        };
        let message = serde_json::to_vec(&forked).map_err(|e| host("encode plan")(e.into()))?;
        if message.len() > MAX_FORKED_PLAN {
            return Err(PlanError::Env("the plan is too large".into()).into());
        }
        clock.push(("host fds, argv", sys::monotonic_us()));
        let (Some(pidfd), Some(host_ends)) = (fork.pidfd.take(), fork.ends.take()) else {
            return Err(host("one-shot start")(io::Error::other(
                "the forked PID 1 was used already",
            )));
        };
        crate::fault::point("linux-start-cloned");
        let (mut sandbox, ids) = match self.create_state_for(id) {
            Ok(state) => state,
            Err(e) => {
                let _ = sys::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
                let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 1000);
                let _ = sys::pidfd_reap(pidfd.as_fd(), true);
                return Err(e);
            }
        };
        sandbox.adopt_init(fork.pid, pidfd);
        if self_join && let Some(planned) = planned {
            // PID 1 makes part of these (`ChildCgroup`); all recorded before it is told
            // to, so a start failing from here removes them (after PID 1's exit).
            sandbox.set_cgroup(planned);
        }
        // The plan first (EPIPE: the child died; its status says why): with the state dir
        // there, a cgroup PID 1 makes is found by `omabox reap` should this host die.
        let control = host_ends.control.as_fd();
        let _ = sys::write_all_fd(control, &(message.len() as u32).to_ne_bytes());
        let _ = sys::write_all_fd(control, &message);
        clock.push(("host plan sent", sys::monotonic_us()));
        crate::fault::point("linux-start-plan-sent");
        crate::image_use::record(&sandbox.identity().state_dir, plan)
            .map_err(host("record the image roots"))?;
        if !self.caps.root {
            crate::sandbox::write_id_maps(fork.pid)
                .map_err(host("write user namespace id maps"))?;
        }
        let pending_userns = self.begin_userns(ids)?;
        if !self_join {
            self.create_cgroup(&mut sandbox, plan)?;
        } else if let Some(part) = &host_part {
            // Recorded above; PID 1 joins it after the go.
            crate::cgroup::CgroupPaths::create(
                part,
                &self.config.cgroup_parent,
                sandbox.id(),
                &plan.limits,
            )
            .map_err(host("create cgroup"))?;
        }
        clock.push(("host cgroup create", sys::monotonic_us()));
        crate::fault::point("linux-start-cgroup");
        let userns_helper = self.send_userns(pending_userns, control)?;
        if userns_helper.is_none() {
            // No user namespace to hand over: the go is a plain byte.
            let _ = sys::write_all_fd(control, &[0]);
        }
        // Then the id range's base (0: none).
        let base = ids.map_or(0, |r| r.base);
        let _ = sys::write_all_fd(control, &base.to_ne_bytes());
        // The child is released: the namespace's helper goes now, off its path.
        drop(userns_helper);
        // Then the seccomp program, built while the child sets up the sandbox (it reads
        // it just before installing it, and only when the plan asks for seccomp).
        if plan.hardening.seccomp {
            let program = crate::setup::harden::build_program()
                .map_err(|e| host("build seccomp filter")(io::Error::other(e.to_string())))?;
            let _ = sys::write_all_fd(control, &crate::setup::harden::encode_program(&program));
        }
        clock.push(("host go sent", sys::monotonic_us()));
        crate::fault::point("linux-start-go-sent");
        sandbox.record_identity()?;
        clock.push(("host identity written", sys::monotonic_us()));
        crate::fault::point("linux-start-identity");
        sandbox.set_host_clock(clock);
        Ok(OneShotSandbox {
            sandbox,
            stdin: Some(host_ends.stdin),
            stdout: Some(host_ends.stdout),
            stderr: Some(host_ends.stderr),
            status: std::fs::File::from(host_ends.status),
            pending: Vec::new(),
            status_eof: false,
            empty: false,
            holds_host_dirs: plan.holds_host_dirs(),
            control: host_ends.control,
        })
    }
}

impl OneShotSandbox {
    /// The sandbox (id, pid, identity, start timeline once ready).
    pub fn sandbox(&self) -> &LinuxSandbox {
        &self.sandbox
    }

    /// The write end of the command's stdin (once).
    pub fn take_stdin(&mut self) -> Option<OwnedFd> {
        self.stdin.take()
    }

    /// The read end of the command's stdout (once).
    pub fn take_stdout(&mut self) -> Option<OwnedFd> {
        self.stdout.take()
    }

    /// The read end of the command's stderr (once).
    pub fn take_stderr(&mut self) -> Option<OwnedFd> {
        self.stderr.take()
    }

    /// Poll this for readability, then call [`OneShotSandbox::read_events`].
    pub fn status_fd(&self) -> BorrowedFd<'_> {
        self.status.as_fd()
    }

    /// Reads what the status pipe holds (one read; call when it polled readable) and
    /// returns the complete events in it. A setup failure, or PID 1 ending without a
    /// word, is the error. After the command's exit, EOF only means PID 1 is gone.
    pub fn read_events(&mut self) -> Result<Vec<OneShotEvent>, StartError> {
        let mut buf = [0u8; 4096];
        let n = loop {
            match self.status.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(host("read sandbox status")(e)),
            }
        };
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() > 1 << 20 {
            return Err(StartError::Setup("oversized status message".into()));
        }
        if n == 0 {
            self.status_eof = true;
        }
        let mut events = Vec::new();
        while let Some(end) = self.pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            events.push(self.parse(&line[..line.len() - 1])?);
        }
        if self.status_eof && !self.pending.is_empty() {
            // An unterminated message before EOF: the setup stage's failure (or a
            // malformed message, which `accept_status` reports).
            let msg = std::mem::take(&mut self.pending);
            self.sandbox.accept_status(&msg)?;
            return Err(StartError::Setup("malformed status message".into()));
        }
        Ok(events)
    }

    /// Whether the status pipe reached EOF (PID 1 has exited or closed it).
    pub fn status_closed(&self) -> bool {
        self.status_eof
    }

    /// Why PID 1 ended before the command's exit was reported (reaps it).
    pub fn died(&mut self) -> StartError {
        self.sandbox.died()
    }

    fn parse(&mut self, line: &[u8]) -> Result<OneShotEvent, StartError> {
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let number = |b: &[u8]| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse::<i32>().ok())
                .ok_or_else(|| StartError::Setup(format!("malformed status line {:?}", text(b))))
        };
        Ok(match line.first() {
            Some(&handoff::READY) => {
                let report: SetupReport = serde_json::from_slice(&line[1..])
                    .map_err(|e| StartError::Setup(format!("malformed ready message: {e}")))?;
                self.sandbox.set_ready(report.clone());
                OneShotEvent::Ready(report)
            }
            Some(&wire::EXITED) => OneShotEvent::Exited(number(&line[1..])?),
            Some(&wire::SIGNALED) => OneShotEvent::Signaled(number(&line[1..])?),
            Some(&wire::NOT_STARTED) => OneShotEvent::NotStarted(text(&line[1..])),
            Some(&wire::INTERRUPTED) => OneShotEvent::Interrupted,
            Some(&wire::EMPTY) => {
                self.empty = true;
                OneShotEvent::Empty
            }
            _ => {
                return Err(StartError::Setup(format!(
                    "malformed status line {:?}",
                    text(line)
                )));
            }
        })
    }

    /// Refreshes the owner record's mtime (what `leftovers::last_alive_ms` reads). A
    /// one-shot host has no heartbeat thread (it stays single-threaded): its loop calls
    /// this every [`OWNER_HEARTBEAT`](crate::leftovers::OWNER_HEARTBEAT).
    pub fn heartbeat(&self) -> io::Result<()> {
        crate::leftovers::touch(
            &self
                .sandbox
                .identity()
                .state_dir
                .join(crate::leftovers::OWNER_FILE),
        )
    }

    /// Whether the sandbox's memory limit killed a process in it (its memory cgroup counted
    /// an OOM kill; a new cgroup counts from 0), and that limit. Read it before
    /// [`destroy`](Self::destroy).
    pub fn out_of_memory(&self) -> Option<OutOfMemory> {
        let cgroup = &self.sandbox.identity().cgroup;
        (cgroup.oom_kills()? > 0).then(|| OutOfMemory {
            limit_bytes: cgroup.memory_limit(),
        })
    }

    /// Asks PID 1 to send SIGTERM (`kill == false`) or SIGKILL to the command's process
    /// group; before the command started, a request means it never starts.
    pub fn kill(&self, kill: bool) -> io::Result<()> {
        let byte = if kill { wire::KILL } else { wire::TERM };
        sys::write_all_fd(self.control.as_fd(), &[byte])
    }

    /// Kills everything in the sandbox and removes its cgroup, state dir and id range.
    pub fn destroy(mut self) -> Result<(), DestroyError> {
        if self.empty {
            // Empty since PID 1 left it: removed while PID 1 exits (what is left, if
            // PID 1 could not leave, goes after it as always).
            self.sandbox.identity().cgroup.remove_if_empty();
        }
        self.sandbox.destroy()
    }

    /// [`destroy`](Self::destroy) for a caller that exits right after (`omabox sandbox
    /// run`): once PID 1 said the sandbox is empty, and if the sandbox holds no host
    /// directory the caller named, the cgroup, state dir and id range go at once and PID
    /// 1's exit (a few hundred microseconds: its mount namespace's teardown) finishes
    /// while the caller exits; the host's reaper reaps it once the caller is gone (bwrap
    /// does not wait for its PID 1 either). Otherwise the same as `destroy`: a sandbox
    /// that holds, say, the workspace's filesystem is gone before this returns, so that
    /// filesystem is no longer in use once the caller has exited. A long-lived caller
    /// must use `destroy` (this would leave it a zombie to reap).
    pub fn destroy_before_exit(mut self) -> Result<(), DestroyError> {
        if !self.empty || self.holds_host_dirs {
            return self.destroy();
        }
        let cgroup = &self.sandbox.identity().cgroup;
        cgroup.remove_if_empty();
        if cgroup.exists() {
            // PID 1 could not leave it: the cgroup goes after PID 1, as always.
            self.sandbox.destroy()
        } else {
            self.sandbox.release_while_exiting()
        }
    }
}

/// The pipes and sockets of a one-shot start, every fd above stdio (the child puts
/// `/dev/null` on 0–2 first thing).
struct OneShotFds {
    status_r: OwnedFd,
    status_w: OwnedFd,
    control_host: OwnedFd,
    control_child: OwnedFd,
    stdin_r: OwnedFd,
    stdin_w: OwnedFd,
    stdout_r: OwnedFd,
    stdout_w: OwnedFd,
    stderr_r: OwnedFd,
    stderr_w: OwnedFd,
    null: OwnedFd,
}

/// The host's ends, once the child's are closed.
#[derive(Debug)]
struct HostEnds {
    status: OwnedFd,
    control: OwnedFd,
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
}

impl OneShotFds {
    fn new() -> Result<Self, StartError> {
        let pipe = || -> io::Result<(OwnedFd, OwnedFd)> {
            let (r, w) = sys::pipe()?;
            Ok((above_stdio(r)?, above_stdio(w)?))
        };
        let err = host("create one-shot pipes");
        let (status_r, status_w) = pipe().map_err(&err)?;
        let (stdin_r, stdin_w) = pipe().map_err(&err)?;
        let (stdout_r, stdout_w) = pipe().map_err(&err)?;
        let (stderr_r, stderr_w) = pipe().map_err(&err)?;
        let (control_host, control_child) = sys::socketpair().map_err(&err)?;
        Ok(Self {
            status_r,
            status_w,
            control_host,
            control_child: above_stdio(control_child).map_err(&err)?,
            stdin_r,
            stdin_w,
            stdout_r,
            stdout_w,
            stderr_r,
            stderr_w,
            null: crate::spawn::dev_null().map_err(host("open /dev/null"))?,
        })
    }

    fn close_child_ends(self) -> HostEnds {
        HostEnds {
            status: self.status_r,
            control: self.control_host,
            stdin: self.stdin_w,
            stdout: self.stdout_r,
            stderr: self.stderr_r,
        }
    }
}

/// `fd` itself if it is above 2, else a close-on-exec duplicate that is.
fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on an open fd returns a new fd only we own.
    let dup = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(dup) })
}

/// Refuses to fork from a process with other threads: the child could find a lock
/// (malloc's, say) held by a thread that does not exist in it.
fn single_threaded() -> Result<(), StartError> {
    use std::os::unix::fs::MetadataExt;
    // A task directory's link count is its number of threads plus two.
    let links = std::fs::metadata("/proc/self/task")
        .map_err(host("count threads"))?
        .nlink();
    if links != 3 {
        return Err(StartError::Host {
            step: "one-shot start",
            source: io::Error::other(format!(
                "needs a single-threaded process; this one has {} threads",
                links.saturating_sub(2)
            )),
        });
    }
    Ok(())
}

/// `clone3` into new namespaces without `CLONE_VM`: a fork whose child runs
/// `child::main` and never returns. Returns the child's pid and a pidfd for it.
fn fork_into(ns_flags: libc::c_int, plan: &child::ChildPlan) -> io::Result<(i32, OwnedFd)> {
    let mut pidfd: libc::c_int = -1;
    let mut args = CloneArgs {
        flags: (ns_flags | libc::CLONE_PIDFD) as u64,
        pidfd: &mut pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        ..CloneArgs::default()
    };
    // Every signal blocked across the clone, so no handler of ours runs in the child
    // before it has reset them (`child::detach_from_host`).
    // SAFETY: sigset_t is plain data, initialized by sigfillset; only this thread's mask
    // changes, and it is restored below.
    let mut old: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above: `all` and `old` are initialized sigset_t values on this stack.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // SAFETY: clone3 with a valid, live `clone_args` and no stack: fork semantics, the
    // child continues on a copy of this stack. The process is single-threaded (checked
    // by the caller), so the child may allocate; it never returns from here.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if ret == 0 {
        child::main(plan);
    }
    let err = io::Error::last_os_error();
    // SAFETY: restores the mask saved above.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if ret < 0 {
        return Err(err);
    }
    // The child works (its namespaces, then the setup stage) while we work out and
    // send its plan: off our CPU, or the scheduler may queue it behind us or us behind
    // it. It takes its whole mask back when the plan arrives, which is after this.
    if let Some(mask) = &plan.affinity {
        sys::keep_off_this_cpu(ret as libc::pid_t, mask);
    }
    // SAFETY: the kernel stored a fresh pidfd that only we own.
    Ok((ret as i32, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

/// `struct clone_args` of `clone3(2)` (the first, 64-byte version).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}
