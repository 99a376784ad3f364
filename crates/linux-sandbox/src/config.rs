//! What a [`LinuxRuntime`](crate::LinuxRuntime) is told: where its state, cgroups and
//! setup-stage binary are, and how long a start and a teardown may take. Policy-free (what
//! a sandbox may do is its plan's), and below every other module: the runtime dir's readers
//! (`leftovers`, `image_use`) need it without the runtime.

use std::path::PathBuf;
use std::time::Duration;

/// File name of the setup-stage binary.
pub const INIT_BINARY: &str = "omabox-sandbox-init";

/// Host-side settings (policy-free: where things go, not what a sandbox may do).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeConfig {
    /// Parent of every sandbox's state dir; leftovers are found here.
    pub runtime_dir: PathBuf,
    /// Cgroup directory (below each hierarchy's root) holding one directory per sandbox.
    pub cgroup_parent: String,
    /// The setup-stage binary; `None`: next to the current executable (or one level
    /// up, for test binaries in `deps/`), then in [`Self::init_search_path`].
    pub init_binary: Option<PathBuf>,
    /// Directories searched for the setup-stage binary after the executable's own, in
    /// order (the caller's `PATH`, as its settings have it; this crate reads no process
    /// environment). Empty: none.
    pub init_search_path: Vec<PathBuf>,
    /// How long the setup stage may take before the start is abandoned.
    pub ready_timeout: Duration,
    /// How long teardown waits for the sandbox's processes and cgroup to go.
    pub destroy_timeout: Duration,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            runtime_dir: PathBuf::from("/run/omabox"),
            cgroup_parent: "omabox".into(),
            init_binary: None,
            init_search_path: Vec::new(),
            ready_timeout: Duration::from_secs(10),
            destroy_timeout: Duration::from_secs(10),
        }
    }
}
