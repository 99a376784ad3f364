//! What passes between the host and the setup stage before the agent takes over.
//!
//! The host writes one [`InitSpec`] (JSON) into the plan pipe and closes it; the setup
//! stage blocks on that read, so it runs no code of the plan before the host has moved
//! it into its cgroup. The setup stage answers on the status pipe with exactly one
//! message and closes it: `R` + [`SetupReport`] JSON (ready), `E` + text (setup failed),
//! or, written by the cloned child itself, `X` + errno (the exec failed).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::SandboxPlan;

pub use crate::sys::{monotonic_us, recv_fd};

/// Tag of a ready message.
pub const READY: u8 = b'R';
/// Tag of a setup failure.
pub const FAILED: u8 = b'E';
/// Tag of an exec failure (written between clone and exec).
pub const EXEC_FAILED: u8 = b'X';

/// Input of the setup stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitSpec {
    /// Sandbox id (for messages only).
    pub id: String,
    /// The plan to carry out.
    pub plan: SandboxPlan,
    /// Host directory owned by this sandbox (its state dir) where the setup stage mounts
    /// its scratch tmpfs, inside its private mount namespace; the host never sees the
    /// mount (nor does the sandbox see what the directory holds on the host).
    pub scratch_dir: PathBuf,
    /// cgroup v1 `tasks` files the setup stage writes `0` into before anything else,
    /// joining the sandbox cgroup itself (see `setup::join_cgroups`). Empty when the
    /// host moved it already (cgroup v2, or no cgroups).
    #[serde(default)]
    pub cgroup_join: Vec<PathBuf>,
    /// First host id of the sandbox's own user namespace range (as root): once the
    /// sandbox is built, the setup stage enters a user namespace mapping `0..65536` to
    /// it and becomes its uid/gid 0 (see `idmap`).
    #[serde(default)]
    pub id_base: Option<u32>,
    /// The host created that user namespace already (see `LinuxRuntime::start`) and
    /// sent it, before this spec, as one byte with the namespace fd attached
    /// (`SCM_RIGHTS`) on the agent socket, where the setup stage takes it
    /// ([`recv_fd`]) instead of creating one. The host does that while the setup stage
    /// still execs and starts, off the start's critical path.
    #[serde(default)]
    pub userns_sent: bool,
}

/// What the setup stage actually enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetupReport {
    /// Landlock ABI of the kernel (0 = none).
    pub landlock_abi: u32,
    /// Whether a Landlock ruleset was enforced (fully or partially).
    pub landlock_enforced: bool,
    /// Whether the seccomp filter is installed.
    pub seccomp: bool,
    /// Capabilities left in the bounding set (expected: 0).
    pub bounding_caps: u32,
    /// Microseconds spent in each setup step, in order (diagnostics for benchmarks).
    #[serde(default)]
    pub step_micros: Vec<(String, u64)>,
    /// Milestones of the setup stage as absolute `CLOCK_MONOTONIC` microseconds (see
    /// [`monotonic_us`]), to line up with the host's own (diagnostics for benchmarks).
    #[serde(default)]
    pub clock_us: Vec<(String, u64)>,
}
