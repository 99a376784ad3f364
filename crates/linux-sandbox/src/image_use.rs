//! Which image roots and environment layers the sandboxes of a runtime dir read, so that
//! `omabox image rm|prune` never deletes one from under a sandbox.
//!
//! A start writes [`ROOTS_FILE`] into the sandbox's state dir before the setup stage is
//! let go (it mounts the roots only after the go), and the file goes with the state dir
//! at destroy, once PID 1 is gone. A sandbox whose host crashed keeps its state dir until
//! `omabox reap` destroys it, so its roots stay protected while it may still run.
//!
//! Between its resolution and this record a start holds the image
//! (`ResolvedImage::hold`, a shared flock the backend's factory keeps until the start returned);
//! a removal takes that lock exclusively without waiting and reads these records only
//! then, so checking and deleting are one step against starts (`omabox_image`'s
//! `removal.rs`): an image is deleted only when no start is between its resolution and
//! its record, and no record names it.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::RuntimeConfig;
use crate::plan::{RootfsSource, SandboxPlan};

pub use crate::state_dir::ROOTS_FILE;

/// What [`ROOTS_FILE`] holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootsRecord {
    /// The rootfs directory (an image's unpacked root), when not the host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rootfs: Option<PathBuf>,
    /// Extra read-only lower layers (environment layers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<PathBuf>,
}

/// A root in use: the sandbox id and the path it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RootInUse {
    /// The sandbox (its state dir's name).
    pub sandbox: String,
    /// The rootfs or layer directory.
    pub path: PathBuf,
}

/// Writes the record for `plan` into `state_dir`; nothing when the plan reads no
/// directory root.
pub(crate) fn record(state_dir: &Path, plan: &SandboxPlan) -> io::Result<()> {
    let rootfs = match &plan.rootfs {
        RootfsSource::Directory { path } => Some(path.clone()),
        _ => None,
    };
    if rootfs.is_none() && plan.root_layers.is_empty() {
        return Ok(());
    }
    let record = RootsRecord {
        rootfs,
        layers: plan.root_layers.clone(),
    };
    std::fs::write(
        state_dir.join(ROOTS_FILE),
        serde_json::to_vec(&record).map_err(io::Error::other)?,
    )
}

/// Every root a sandbox with a state dir under `config.runtime_dir` reads (running, or
/// left by a crashed host and not reaped yet). A runtime dir that does not exist has none.
pub fn roots_in_use(config: &RuntimeConfig) -> io::Result<Vec<RootInUse>> {
    let entries = match std::fs::read_dir(&config.runtime_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut roots = Vec::new();
    for entry in entries {
        let entry = entry?;
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Some(bytes) = crate::state_dir::read_small(&entry.path().join(ROOTS_FILE)) else {
            continue;
        };
        let Ok(record) = serde_json::from_slice::<RootsRecord>(&bytes) else {
            continue;
        };
        for path in record.rootfs.into_iter().chain(record.layers) {
            roots.push(RootInUse {
                sandbox: id.clone(),
                path,
            });
        }
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_root_is_in_use_until_its_state_dir_goes() {
        let runtime = tempfile::tempdir().unwrap();
        let config = RuntimeConfig {
            runtime_dir: runtime.path().to_path_buf(),
            ..RuntimeConfig::default()
        };
        let state = runtime.path().join("0123456789abcdef");
        std::fs::create_dir(&state).unwrap();
        let mut plan = SandboxPlan::preinstalled("t");
        record(&state, &plan).unwrap();
        assert!(
            !state.join(ROOTS_FILE).exists(),
            "the host's root is nobody's image"
        );
        plan.rootfs = RootfsSource::Directory {
            path: "/cache/sha256/ab/rootfs".into(),
        };
        plan.root_layers = vec!["/cache/env-layers/cd".into()];
        record(&state, &plan).unwrap();
        let in_use = roots_in_use(&config).unwrap();
        let paths: Vec<_> = in_use.iter().map(|r| r.path.clone()).collect();
        assert_eq!(
            paths,
            [
                PathBuf::from("/cache/sha256/ab/rootfs"),
                PathBuf::from("/cache/env-layers/cd")
            ]
        );
        assert!(in_use.iter().all(|r| r.sandbox == "0123456789abcdef"));
        std::fs::remove_dir_all(&state).unwrap();
        assert!(roots_in_use(&config).unwrap().is_empty());
    }
}
