//! [`DockerConfig`]: everything one docker sandbox is made from, as typed data. Reads no
//! process environment (the engine's address is [`crate::Engine`]'s business); must never
//! hold a secret.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::network::DockerNetwork;

/// The label naming a container's sandbox id.
pub const SANDBOX_LABEL: &str = "omabox.sandbox";

/// The label naming the host (an omabox process) that owns a container; [`crate::reap`]
/// removes the containers whose host is gone.
pub const HOST_LABEL: &str = "omabox.host";

/// The agent binary's file name, and where it is in every container.
pub const AGENT_BINARY: &str = "omabox-agent";

/// The agent's path inside a container (copied there before the start).
pub const AGENT_PATH: &str = "/.omabox/omabox-agent";

/// Resource limits of one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerLimits {
    /// Memory limit in bytes (swap included: the same value is the memory+swap limit).
    pub memory_bytes: u64,
    /// CPU limit in billionths of a CPU (`1_000_000_000` = one CPU).
    pub nano_cpus: u64,
    /// Most processes (and threads) the container may have at once.
    pub pids: u32,
}

impl Default for DockerLimits {
    /// 1 GiB, one CPU, 512 processes: the linux backend's defaults.
    fn default() -> Self {
        Self {
            memory_bytes: 1 << 30,
            nano_cpus: 1_000_000_000,
            pids: 512,
        }
    }
}

/// One docker sandbox.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The image: a registry reference (`127.0.0.1:5000/test/busybox:1`, pulled through
    /// the engine when it does not have it) or a reference the engine has locally.
    pub image: String,
    /// The static `omabox-agent` binary copied into the container.
    pub agent_binary: PathBuf,
    /// This host's id, the container's [`HOST_LABEL`].
    pub host_id: String,
    /// Resource limits.
    pub limits: DockerLimits,
    /// The host directory bound at `/workspace` (`None`: an empty directory of the
    /// container's own layer).
    pub workspace: Option<PathBuf>,
    /// The host directory bound at `/mnt/session/outputs`.
    pub outputs: Option<PathBuf>,
    /// Exec timeout when the caller gives none.
    pub exec_timeout: Duration,
    /// What the container may reach (`none` by default: loopback only).
    pub network: DockerNetwork,
    /// Test mode only (the caller's check): `NAME=IP,...` answered before the host's
    /// resolver for the container's network, for tests whose servers live in namespaces
    /// they made.
    pub test_hosts: Option<String>,
    /// E2B's user `user` (uid and gid 1000) with a writable `/home/user`, added to the
    /// image's accounts when it lacks them (`omabox_agent_port::add_user_account`).
    pub user_home: bool,
}

impl DockerConfig {
    /// A config for `image` with the agent found by [`locate_agent`], no bindings and the
    /// default limits.
    pub fn new(image: impl Into<String>, host_id: impl Into<String>) -> Self {
        Self {
            image: image.into(),
            agent_binary: locate_agent(None).unwrap_or_else(|_| PathBuf::from(AGENT_BINARY)),
            host_id: host_id.into(),
            limits: DockerLimits::default(),
            workspace: None,
            outputs: None,
            exec_timeout: crate::port::DEFAULT_EXEC_TIMEOUT,
            network: DockerNetwork::default(),
            test_hosts: None,
            user_home: false,
        }
    }
}

/// The `omabox-agent` binary: `explicit`, else next to this executable or one directory
/// up (cargo's `deps/` for tests). `Err`: the paths tried.
pub fn locate_agent(explicit: Option<&Path>) -> Result<PathBuf, String> {
    omabox_sandbox::locate::beside_executable(AGENT_BINARY, explicit)
}
