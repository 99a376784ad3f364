//! omabox's gvisor backend: each sandbox is a runsc (gVisor) container whose process is
//! `omabox-gvisor-init`, the omabox agent serving over the container's stdio, so exec,
//! processes (duplex and background, from `omabox-agent-port`), files and env vars speak
//! the same protocol as the linux backend. gVisor's checkpoint and restore give memory pause,
//! resume and fork ([`GvisorSandbox`], tested by `tests/sandbox.rs`), and memory snapshots
//! to start sandboxes from ([`GvisorImage`]). They need Debian 13's
//! runsc (0.0~20240729; scripts/setup installs it): Debian 12's crashed restored processes.
//! That runsc still brings back epoll registrations removed before a checkpoint, which made
//! the restored init use memory it had freed; the init filters their events
//! (`src/bin/omabox-gvisor-init/stale_epoll.rs`).
//!
//! What it isolates and what it does not is SECURITY.md's gVisor row. Never: give a
//! sandbox the host's `/etc`, home directories or omabox's data directory (`bundle`);
//! put text a sandbox controls into an argument of runsc; let a sandbox's output grow a
//! host buffer without bound (the agent client caps it).

mod bundle;
pub mod catalog;
mod checkpoints;
mod copy;
mod disk_room;
mod fork;
mod image;
mod layers;
pub mod managed;
mod network;
mod port;
pub mod reap;
mod runsc;
mod sandbox;
mod slot;
mod stream;

use std::path::PathBuf;

pub use bundle::{CGROUP_PARENT, INIT_PATH, OUTPUTS, WORKSPACE};
pub use checkpoints::{CHECKPOINT_RETENTION, is_checkpoint_id};
pub use disk_room::CHECKPOINT_DISK_RESERVE;
pub use image::GvisorImage;
pub use network::GvisorNetwork;
pub use omabox_sandbox_net::GatewayAccess;
pub use port::GvisorSandboxPort;
pub use runsc::Runsc;
pub use sandbox::{GvisorConfig, GvisorLimits, GvisorRuntime, GvisorSandbox, SandboxSpec, State};

/// The provider name of gvisor sandboxes (`--backend gvisor`).
pub const PROVIDER: &str = "gvisor";

/// Where `runsc` is looked for (Debian's package installs `/usr/bin/runsc`).
const RUNSC_PATHS: [&str; 3] = ["/usr/bin/runsc", "/usr/sbin/runsc", "/usr/local/bin/runsc"];

/// The `runsc` executable, when installed.
pub fn locate_runsc() -> Option<std::path::PathBuf> {
    RUNSC_PATHS
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
}

/// The `omabox-gvisor-init` binary next to this executable or one directory up (cargo's
/// `deps/` for tests). `Err`: the paths tried.
pub fn locate_init() -> Result<std::path::PathBuf, String> {
    omabox_sandbox::locate::beside_executable(INIT_BINARY, None)
}

/// Whether this process runs as root (runsc makes its sandbox's namespaces and cgroups).
pub fn runs_as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What the host writes first on a restored sandbox's new stdin pipe: `omabox-gvisor-init`
/// discards everything before it (the old connection's last frames) and then serves.
pub const WAKE: &[u8] = b"\0omabox-gvisor-wake\n";

/// The init binary's file name (found next to the `omabox` executable).
pub const INIT_BINARY: &str = "omabox-gvisor-init";

/// Errors of the gvisor backend.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GvisorError {
    /// `runsc` could not be started.
    #[error("cannot run {}", binary.display())]
    Spawn {
        /// The runsc binary.
        binary: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `runsc <op>` failed.
    #[error("runsc {op} failed ({status}): {log_tail}")]
    Runsc {
        /// The subcommand.
        op: &'static str,
        /// Its exit status.
        status: String,
        /// The end of runsc's log.
        log_tail: String,
    },
    /// Host file system work failed.
    #[error("{what}")]
    Io {
        /// What was being done.
        what: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The agent in the sandbox failed.
    #[error("the agent of gvisor sandbox {id} failed")]
    Agent {
        /// The sandbox.
        id: String,
        /// Why.
        #[source]
        source: omabox_agent::ClientError,
    },
    /// E2B's user could not be added to an image root's accounts.
    #[error(transparent)]
    UserAccount(#[from] omabox_agent_port::UserAccountError),
    /// The agent of a started or restored sandbox did not complete its handshake.
    #[error("the agent of gvisor sandbox {id} did not answer: {log_tail}")]
    Handshake {
        /// The sandbox.
        id: String,
        /// The end of the container's log (runsc and the init write there).
        log_tail: String,
        /// Why.
        #[source]
        source: omabox_agent::ClientError,
    },
    /// The sandbox is not running (paused or destroyed).
    #[error("the gvisor sandbox is not running (it is {state:?})")]
    NotRunning {
        /// Its state.
        state: State,
    },
    /// The networking config does not compile.
    #[error("networking")]
    Networking(#[source] omabox_contract::networking::NetworkingError),
    /// The host side of the sandbox's network could not be set up or changed.
    #[error("the sandbox's network")]
    Network(#[source] omabox_sandbox_net::NetworkError),
    /// The sandbox was started under networking `none`: there is no network to change.
    #[error("the gvisor sandbox has no network (it was started with networking none)")]
    NoNetwork,
    /// `OMABOX_LINUX_TEST_HOSTS` does not parse.
    #[error("test hosts: {0}")]
    TestHosts(String),
    /// A runtime checkpoint (`checkpoints.rs`) cannot be kept or restored.
    #[error("gvisor runtime checkpoint {id:?}: {why}")]
    Checkpoint {
        /// The checkpoint id (as given).
        id: String,
        /// Why.
        why: String,
    },
    /// The backend's file system has no room for a checkpoint (`disk_room.rs`).
    #[error(
        "not enough disk space under {} for the checkpoint: {free_mib} MiB free, about \
         {needed_mib} MiB needed (the sandbox's memory in use plus a reserve); the sandbox \
         runs on",
        dir.display()
    )]
    NoDiskRoom {
        /// The backend's directory.
        dir: PathBuf,
        /// Free MiB.
        free_mib: u64,
        /// MiB a checkpoint needs.
        needed_mib: u64,
    },
    /// The sandbox is not paused (resume and fork need a checkpoint).
    #[error("the gvisor sandbox is not paused (it is {state:?})")]
    NotPaused {
        /// Its state.
        state: State,
    },
}
