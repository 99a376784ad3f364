//! The sandboxes of omabox processes that are gone: each sandbox directory names its owner
//! (`owner`, a host id of `omabox_sandbox::host_id`), and [`reap_orphans`] deletes the
//! runsc container and removes the directory of every sandbox whose owner no longer runs.
//! A host that dies (kill -9) takes its sandboxes' processes with it (their init reads the
//! end of its stdin pipe and stops everything), but runsc's state and the directory stay
//! for this. Runtime checkpoints have no owner (they outlive the process that took them):
//! they expire (`checkpoints.rs`).
//!
//! Never: remove a sandbox of a live owner, or of another machine's (`host_is_gone` is
//! false for both); follow a link in the sandboxes directory (entries are matched by name,
//! only directories are removed).

use std::path::Path;
use std::time::Duration;

use omabox_sandbox::host_id::host_is_gone;

use crate::runsc::Runsc;

/// The owner file of a sandbox directory.
pub(crate) const OWNER_FILE: &str = "owner";
/// A directory without an owner file this old is a crash between its creation and the file.
const UNOWNED_GRACE: Duration = Duration::from_secs(60);

/// What one pass removed and what it could not.
#[derive(Debug, Default)]
pub struct Reaped {
    /// Sandbox ids removed.
    pub removed: Vec<String>,
    /// What could not be read or removed.
    pub errors: Vec<String>,
}

/// Removes the sandboxes under `dir` (a gvisor backend's directory, as in
/// `GvisorConfig::dir`) whose owner is gone, with `runsc` as their runsc binary. A missing
/// directory is nothing to do.
pub fn reap_orphans(runsc: &Path, dir: &Path) -> Reaped {
    let mut reaped = Reaped::default();
    let sandboxes = dir.join("sandboxes");
    let entries = match std::fs::read_dir(&sandboxes) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return reaped,
        Err(e) => {
            reaped
                .errors
                .push(format!("cannot list {}: {e}", sandboxes.display()));
            return reaped;
        }
    };
    let runsc = Runsc {
        binary: runsc.to_path_buf(),
        root: dir.join("runsc"),
        platform: "ptrace".into(),
        overlay_root: false,
        subreaper: None,
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if !is_dir || !name.starts_with("omabox-gv-") || !owner_is_gone(&entry.path()) {
            continue;
        }
        // Absent (never started, paused, already deleted) is fine: delete fails then.
        crate::bundle::end_processes_naming(&name);
        let _ = runsc.delete(&name, &entry.path().join("runsc.log"));
        crate::bundle::remove_cgroups(&name);
        match crate::sandbox::remove_sandbox_dir(&entry.path(), dir) {
            Ok(()) => reaped.removed.push(name),
            Err(e) => reaped
                .errors
                .push(format!("cannot remove sandbox {name}: {e}")),
        }
    }
    // The memory snapshots (images) of owners that are gone, and the layers only they
    // stacked.
    for image in std::fs::read_dir(dir.join("images"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let is_dir = image.file_type().is_ok_and(|t| t.is_dir());
        if is_dir
            && owner_is_gone(&image.path())
            && let Err(e) = std::fs::remove_dir_all(image.path())
        {
            reaped.errors.push(format!(
                "cannot remove image {}: {e}",
                image.file_name().to_string_lossy()
            ));
        }
    }
    crate::layers::collect_bases(dir);
    reaped.errors.extend(crate::checkpoints::expire(
        dir,
        crate::checkpoints::CHECKPOINT_RETENTION,
    ));
    reaped
}

/// Removes sandbox `id` of the backend directory `dir` (a lease's reap from any process):
/// its runsc container, cgroups and directory. Absent is done.
pub(crate) fn reap_one(runsc: &Path, dir: &Path, id: &str) -> Result<(), crate::GvisorError> {
    let sandbox = crate::managed::sandbox_dir(dir, id);
    let runsc = Runsc {
        binary: runsc.to_path_buf(),
        root: dir.join("runsc"),
        platform: "ptrace".into(),
        overlay_root: false,
        subreaper: None,
    };
    crate::bundle::end_processes_naming(id);
    if sandbox.is_dir() {
        let _ = runsc.delete(id, &sandbox.join("runsc.log"));
    }
    crate::bundle::remove_cgroups(id);
    crate::sandbox::remove_sandbox_dir(&sandbox, dir)
}

/// Whether sandbox `id` of `dir` exists and its owner still runs.
pub(crate) fn owner_alive(dir: &Path, id: &str) -> bool {
    let sandbox = crate::managed::sandbox_dir(dir, id);
    sandbox.is_dir() && !owner_is_gone(&sandbox)
}

fn owner_is_gone(sandbox: &Path) -> bool {
    match std::fs::read_to_string(sandbox.join(OWNER_FILE)) {
        Ok(owner) => host_is_gone(owner.trim()),
        Err(_) => std::fs::metadata(sandbox)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > UNOWNED_GRACE),
    }
}
