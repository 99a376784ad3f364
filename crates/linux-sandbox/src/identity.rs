//! [`SandboxIdentity`]: everything needed to find and destroy a sandbox from another
//! process (a lease, `reap` after a crash), with no handle, token or secret. Teardown
//! from an identity must never signal a recycled pid (boot id + start time + pidfd) nor
//! recurse into a host directory.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupPaths;
use crate::idmap;
use crate::sys;

pub(crate) use crate::state_dir::IDENTITY_FILE;

/// Why a teardown did not complete. Retrying is safe.
#[derive(Debug, thiserror::Error)]
#[error("{step}")]
pub struct DestroyError {
    /// What was being done.
    pub step: &'static str,
    /// Why it failed.
    #[source]
    pub source: io::Error,
}

pub(crate) fn destroy_err(step: &'static str) -> impl FnOnce(io::Error) -> DestroyError {
    move |source| DestroyError { step, source }
}

/// Everything needed to find and destroy a sandbox from another process. No handle,
/// token or secret: safe to put in a lease or a log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxIdentity {
    /// Sandbox id.
    pub id: String,
    /// Host pid of the sandbox's PID 1 (the agent).
    pub pid: i32,
    /// Its start time in clock ticks since boot (`/proc/<pid>/stat` field 22): with the
    /// boot id, tells it apart from a later process that reuses the pid.
    pub start_time: u64,
    /// `/proc/sys/kernel/random/boot_id` at start.
    pub boot_id: String,
    /// The sandbox's cgroup directories.
    pub cgroup: CgroupPaths,
    /// Host-side state directory.
    pub state_dir: PathBuf,
    /// First host id of the sandbox's user namespace range (see `idmap`), when it has
    /// one of its own (always as root). Freed on destroy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_base: Option<u32>,
}

/// What a destroy found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DestroyOutcome {
    /// The sandbox's PID 1 was still running and got killed.
    pub killed: bool,
}

impl SandboxIdentity {
    /// Destroys the sandbox from any process: kills its PID 1 if it is still the same
    /// process (boot id and start time match), which takes the whole pid namespace with
    /// it; kills whatever is left in its cgroup; removes the cgroup and the state dir.
    /// Idempotent: destroying twice, or a sandbox that already died, is fine.
    pub fn destroy(&self, timeout: Duration) -> Result<DestroyOutcome, DestroyError> {
        let mut killed = false;
        if self.is_alive() {
            // pidfd first, then re-check: the pidfd pins the process, so if the start time
            // still matches now, the signal cannot reach a recycled pid.
            if let Ok(pidfd) = sys::pidfd_open(self.pid)
                && self.is_alive()
            {
                killed = sys::pidfd_kill(pidfd.as_fd(), libc::SIGKILL)
                    .map_err(destroy_err("kill sandbox init"))?;
                let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
                sys::pidfd_wait_exit(pidfd.as_fd(), ms)
                    .map_err(destroy_err("wait for sandbox init"))?;
            }
        }
        self.cgroup
            .remove(timeout)
            .map_err(destroy_err("remove cgroup"))?;
        self.release().map_err(destroy_err("remove state dir"))?;
        Ok(DestroyOutcome { killed })
    }

    /// Frees the id range (first: a crash in between leaves a slot whose state dir
    /// still exists, which `destroy` frees again) and removes the state dir.
    pub(crate) fn release(&self) -> io::Result<()> {
        if let Some(base) = self.id_base {
            idmap::free(idmap::IdRange { base }, &self.state_dir)?;
        }
        crate::state_dir::remove(&self.state_dir)
    }

    /// Whether the sandbox's PID 1 is still this identity's process (a zombie counts as
    /// dead).
    pub fn is_alive(&self) -> bool {
        if sys::boot_id().ok().as_deref() != Some(self.boot_id.as_str()) {
            return false;
        }
        if sys::process_start_time(self.pid).ok().flatten() != Some(self.start_time) {
            return false;
        }
        // A zombie still has its stat entry; state 'Z' means it is gone for our purposes.
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid))
            .ok()
            .and_then(|s| {
                s.rsplit_once(')')
                    .and_then(|(_, r)| r.split_whitespace().next().map(|st| st != "Z"))
            })
            .unwrap_or(false)
    }

    /// Identities of every sandbox with a state dir under `runtime_dir` (leftovers of
    /// crashed hosts included). Unreadable entries are skipped.
    pub fn list(runtime_dir: &Path) -> io::Result<Vec<Self>> {
        let mut out = Vec::new();
        let entries = match std::fs::read_dir(runtime_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let path = entry?.path().join(IDENTITY_FILE);
            if let Ok(bytes) = std::fs::read(&path)
                && let Ok(id) = serde_json::from_slice(&bytes)
            {
                out.push(id);
            }
        }
        Ok(out)
    }
}

impl SandboxIdentity {
    /// A pidfd for this sandbox's init, verified to be this identity's process (boot id and
    /// start time re-checked after opening it, so it cannot refer to a recycled pid): what
    /// `omabox-sandbox-net` enters the sandbox's network namespace through.
    pub fn pidfd(&self) -> io::Result<std::os::fd::OwnedFd> {
        let pidfd = sys::pidfd_open(self.pid)?;
        if !self.is_alive() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox {} is not running", self.id),
            ));
        }
        Ok(pidfd)
    }
}
