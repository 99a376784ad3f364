//! The setup stage: runs inside the new namespaces as PID 1, single-threaded, right
//! after the exec, and turns a [`SandboxPlan`] into the sandbox before the agent starts.
//! Used only by the `omabox-sandbox-init` binary.
//!
//! The order is a checklist; each step needs the rights the later ones take away.

mod etc;
pub mod harden;
mod home;
mod mounts;

use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use crate::handoff::{InitSpec, SetupReport};
use crate::idmap::{self, IdRange};
use crate::plan::RootfsSource;
use crate::sys;

/// Why the sandbox could not be set up. Sent to the host as text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// A step failed.
    #[error("{step}: {source}")]
    Step {
        /// What was being done.
        step: String,
        /// Why it failed.
        source: io::Error,
    },
    /// A mount target in the rootfs is a symlink.
    #[error("refusing to mount over symlink {0:?} in the rootfs")]
    Symlink(PathBuf),
    /// Landlock could not be applied.
    #[error("landlock: {0}")]
    Landlock(String),
    /// Landlock is required but the kernel lacks it.
    #[error(
        "landlock is required by the plan but this kernel has none (needs Linux >= 5.13 with CONFIG_SECURITY_LANDLOCK and landlock in the lsm= boot list)"
    )]
    LandlockMissing,
    /// The seccomp filter could not be built or installed.
    #[error("seccomp: {0}")]
    Seccomp(String),
}

/// The network namespace, created by the setup stage itself right after its exec and
/// before it reads the plan (so while the host still prepares the cgroup: creating a
/// network namespace costs ~0.5 ms, and this way it runs in parallel with the host's
/// work instead of inside the host's `clone`, during which the host thread sleeps). Nothing of the
/// plan runs before it, so no sandbox code ever sees the host's network.
pub fn isolate_network() -> Result<(), SetupError> {
    sys::unshare(libc::CLONE_NEWNET).map_err(|source| SetupError::Step {
        step: "unshare network namespace".into(),
        source,
    })
}

/// Work of the setup stage that needs neither the plan nor the host, done while the
/// setup stage waits for them (the host is still making the cgroup then): building the
/// seccomp filter (a few hundred microseconds) takes it off the start's critical path —
/// or the host builds it and sends it while the setup stage works ([`Early::seccomp_from`]).
pub struct Early {
    seccomp: Seccomp,
}

/// Where the setup stage's seccomp program comes from.
enum Seccomp {
    /// Built when it is installed.
    Build,
    /// Built already.
    Built(Result<seccompiler::BpfProgram, SetupError>),
    /// Received when it is installed (called only if the plan has seccomp on).
    Receive(Box<dyn FnOnce() -> Result<seccompiler::BpfProgram, SetupError>>),
}

impl std::fmt::Debug for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seccomp = match &self.seccomp {
            Seccomp::Build => "build",
            Seccomp::Built(_) => "built",
            Seccomp::Receive(_) => "receive",
        };
        f.debug_struct("Early").field("seccomp", &seccomp).finish()
    }
}

impl Early {
    /// Does the work now.
    pub fn prepare() -> Self {
        Self {
            seccomp: Seccomp::Built(harden::build_program()),
        }
    }

    /// Nothing done ahead: [`run`] does it all.
    pub fn none() -> Self {
        Self {
            seccomp: Seccomp::Build,
        }
    }

    /// The seccomp program comes from `receive`, which [`run`] calls just before it
    /// installs the filter, and only when the plan asks for one.
    pub fn seccomp_from(
        receive: impl FnOnce() -> Result<seccompiler::BpfProgram, SetupError> + 'static,
    ) -> Self {
        Self {
            seccomp: Seccomp::Receive(Box::new(receive)),
        }
    }
}

/// Carries out the plan. On success the calling process is PID 1 of a fully built and
/// locked-down sandbox; on error the caller reports and exits (the host tears down).
/// `userns`: the sandbox's user namespace as the host sent it (`spec.userns_sent`);
/// `None` with an `id_base`: created here. `early`: what was prepared while waiting.
pub fn run(
    spec: &InitSpec,
    userns: Option<OwnedFd>,
    early: Early,
) -> Result<SetupReport, SetupError> {
    let plan = &spec.plan;
    let mut clock = StepClock::new();
    // 0. Into the sandbox cgroup (v1), before this process allocates anything more.
    join_cgroups(&spec.cgroup_join)?;
    clock.lap("join cgroup");
    // Small SysV IPC / mqueue limits for our own IPC namespace, while /proc/sys is
    // still writable.
    harden::ipc_limits()?;
    // 1. Our own cgroup namespace, rooted at the sandbox cgroup we are now in.
    sys::unshare(libc::CLONE_NEWCGROUP).map_err(|source| SetupError::Step {
        step: "unshare cgroup namespace".into(),
        source,
    })?;
    clock.lap("cgroup namespace");
    // 2. The sandbox's user namespace (as root): the host's, or created now, so the
    //    writable binds can be idmapped through it; entered last, once the sandbox is
    //    built.
    let userns = match (spec.id_base, userns) {
        (Some(base), Some(ns)) => Some((ns, IdRange { base })),
        (Some(base), None) => {
            let range = IdRange { base };
            let (ns, helper) = idmap::create_userns(range).map_err(|source| SetupError::Step {
                step: "create user namespace".into(),
                source,
            })?;
            drop(helper);
            Some((ns, range))
        }
        (None, _) => None,
    };
    clock.lap("user namespace");
    // 3. The mount tree, then the pivot into it.
    let root = mounts::build(plan, &spec.scratch_dir, userns.as_ref())?;
    clock.lap("build mount tree");
    mounts::pivot(&root)?;
    clock.lap("pivot_root");
    mounts::finish(plan)?;
    clock.lap("mask /proc, seal /");
    // 3. Identity and network.
    sys::sethostname(&plan.hostname).map_err(|source| SetupError::Step {
        step: "set hostname".into(),
        source,
    })?;
    sys::loopback_up().map_err(|source| SetupError::Step {
        step: "bring up loopback".into(),
        source,
    })?;
    let workdir = if plan.workspace.is_some() || plan.workspace_tmpfs {
        "/workspace"
    } else {
        "/"
    };
    std::env::set_current_dir(workdir).map_err(|source| SetupError::Step {
        step: format!("chdir {workdir}"),
        source,
    })?;
    clock.lap("hostname, loopback, chdir");
    // A sandbox with its own root filesystem keeps the file-ownership capabilities of its
    // root, but only inside a user namespace of its own id range (never without one: they
    // would be the host's). So does one with the `user` account: its agent switches to
    // uid 1000 (SETUID, SETGID) and gives files to it (CHOWN).
    let power = match (&plan.rootfs, &userns) {
        (RootfsSource::Directory { .. }, Some(_)) => harden::RootPower::FileOwnership,
        (_, Some(_)) if plan.user_home => harden::RootPower::FileOwnership,
        _ => harden::RootPower::None,
    };
    // 4. Into the user namespace, as its root: from here this process and everything
    //    it starts are the sandbox's unprivileged host ids.
    if let Some((ns, _)) = userns {
        idmap::enter(&ns).map_err(|source| SetupError::Step {
            step: "enter user namespace".into(),
            source,
        })?;
        clock.lap("enter user namespace");
    }
    // 5. Hardening, most powerful rights last to go.
    harden::rlimits(plan)?;
    let bounding_caps = harden::drop_capabilities(power)?;
    harden::no_new_privs()?;
    clock.lap("rlimits, capabilities, no_new_privs");
    let landlock_abi = harden::landlock_abi().unwrap_or(0);
    let landlock_enforced = if plan.hardening.landlock {
        if landlock_abi == 0 && plan.hardening.require_landlock {
            return Err(SetupError::LandlockMissing);
        }
        harden::landlock(plan)?
    } else {
        false
    };
    clock.lap("landlock");
    if plan.hardening.seccomp {
        let program = match early.seccomp {
            Seccomp::Build => harden::build_program()?,
            Seccomp::Built(built) => built?,
            Seccomp::Receive(receive) => receive()?,
        };
        harden::seccomp(&program)?;
    }
    clock.lap("seccomp");
    Ok(SetupReport {
        landlock_abi,
        landlock_enforced,
        seccomp: plan.hardening.seccomp,
        bounding_caps,
        step_micros: clock.laps,
        clock_us: Vec::new(),
    })
}

/// Joins the sandbox's cgroup v1 directories by writing `0` (the calling thread) into
/// each `tasks` file. The host creates the directories and writes the limits before it
/// sends the go (a one-shot PID 1 makes them itself, just before), so the limits hold
/// from here on; a failure fails the start.
///
/// Why not the host writing our pid into `cgroup.procs`: moving a whole thread group
/// takes the kernel's global `cgroup_threadgroup_rwsem` for writing, which waits for an
/// RCU grace period whenever no other migration happened in the last few milliseconds
/// (measured: 7–19 ms on a 2-vCPU VM, most of a sandbox start). Moving only the calling
/// thread needs no such lock. It moves the whole process because this process is
/// single-threaded here: no thread exists before the agent's runtime starts.
fn join_cgroups(tasks_files: &[PathBuf]) -> Result<(), SetupError> {
    use std::io::Write;
    debug_assert_eq!(
        std::fs::read_dir("/proc/self/task").map(|d| d.count()).ok(),
        Some(1),
        "the setup stage must be single-threaded when it joins its cgroup"
    );
    for f in tasks_files {
        std::fs::OpenOptions::new()
            .write(true)
            .open(f)
            .and_then(|mut file| file.write_all(b"0"))
            .map_err(|source| SetupError::Step {
                step: format!("join cgroup {}", f.display()),
                source,
            })?;
    }
    Ok(())
}

struct StepClock {
    last: std::time::Instant,
    laps: Vec<(String, u64)>,
}

impl StepClock {
    fn new() -> Self {
        Self {
            last: std::time::Instant::now(),
            laps: Vec::new(),
        }
    }

    fn lap(&mut self, what: &str) {
        let now = std::time::Instant::now();
        let us = now.duration_since(self.last).as_micros() as u64;
        self.laps.push((what.to_owned(), us));
        self.last = now;
    }
}
