//! The mechanism of omabox's default backend: a sandbox made of Linux namespaces, cgroups,
//! seccomp and Landlock, whose PID 1 is the omabox agent, reached over a unix socketpair.
//!
//! This crate is mechanism only. It turns a declarative [`SandboxPlan`] (rootfs, binds,
//! limits, network policy, env, hostname, hardening) into system calls; what a sandbox
//! may do is decided by the host and written in the plan. It reaches nothing of omabox but
//! `omabox-contract` (the networking config a plan carries) and `omabox-agent` (the PID 1
//! it serves): the backend that makes plans, resolves images, builds environment layers
//! and wires the network is `omabox-backend-linux`, which hands this crate a rootfs path
//! and a plan, and binds its own sockets in a sandbox's namespace through
//! `omabox-sandbox-net`.
//!
//! # What a running sandbox guarantees
//!
//! - Its processes live in their own mount, pid, network, ipc, uts and cgroup namespaces
//!   (plus a user namespace when the host is not root). PID 1 is the agent (or, for a
//!   [`oneshot`] sandbox, a supervisor of its one command); host processes are
//!   invisible and unsignallable; killing PID 1 kills every process in it.
//! - Its filesystem is built from the plan alone: read-only host `/usr` & co. or an
//!   overlay over a rootfs directory (a local directory, or a rootfs tarball or OCI image
//!   layout that `omabox-image`'s cache unpacked once into its content-addressed cache,
//!   refusing path traversal, writes through symlinks and tampered blobs; omabox pulls
//!   nothing from registries), a generated `/etc`, the plan's binds, fresh
//!   `/proc` (sensitive entries masked or read-only), a minimal `/dev`, size-limited
//!   tmpfs `/tmp`. After `pivot_root` the host tree is detached, not hidden.
//! - Its memory, task count and CPU are bounded by its own cgroup (v1 or v2), which the
//!   sandbox joins before it runs any code the plan controls.
//! - Its network namespace has loopback only and no route out. What it reaches beyond
//!   that is what the host binds inside it (`omabox-sandbox-net`'s `SandboxNetwork`, for
//!   every networking config but `none`): a DNS stub and relay listeners that admit by name.
//! - Every process runs with no capabilities in any set, locked securebits,
//!   `no_new_privs`, a seccomp filter refusing mount/keyring/bpf/perf/module/ptrace/
//!   namespace/raw-socket and similar calls with EPERM, Landlock (where the kernel has
//!   it) limiting writes to the writable binds and tmpfs, and a lowered `RLIMIT_NOFILE`.
//! - Teardown ([`LinuxSandbox::destroy`], its `Drop`, or [`SandboxIdentity::destroy`]
//!   from a fresh process) leaves no process, cgroup, mount or state directory.
//!
//! # What it must never do
//!
//! - Run anything of the plan's before the sandbox is in its cgroup and namespaces.
//! - Put a host secret into the sandbox (the host's `/etc/shadow`, ssh keys,
//!   machine-id, environment, terminal or open fds) or into a [`SandboxIdentity`].
//! - Allocate, lock or panic between `clone` and `execve` in the host process (a
//!   one-shot start, [`oneshot`], does not exec: it forks only a process it has checked
//!   to be single-threaded).
//! - Recursively delete a host directory during teardown.
//!
//! See `SECURITY.md` at the repository root for the escape tests and what is not
//! defended yet.

pub mod cgroup;
mod config;
mod fault;
pub mod handoff;
mod identity;
pub mod idmap;
pub mod image_use;
pub mod leftovers;
pub mod oneshot;
pub mod plan;
pub mod probe;
pub mod runtime_dir;
mod sandbox;
#[doc(hidden)]
pub mod setup;
mod spawn;
mod state_dir;
mod sys;
#[doc(hidden)]
pub mod zygote;

pub use cgroup::{CgroupLayout, CgroupPaths};
pub use config::{INIT_BINARY, RuntimeConfig};
pub use handoff::SetupReport;
pub use identity::{DestroyError, DestroyOutcome, SandboxIdentity};
pub use plan::{
    BindMount, CpuLimit, Hardening, Limits, Networking, PlanError, RootfsSource, SandboxPlan,
};
pub use probe::{LinuxCapabilities, MissingRequirement, ProbeError};
pub use sandbox::{LinuxRuntime, LinuxSandbox, StartError};
