//! The `/workspace` directory of one `omabox sandbox run`: the caller's (`--workspace`), a
//! tmpfs inside the sandbox (the linux backend: nothing on the host at all), or a temporary
//! host directory (other backends), removed after the sandbox is gone — or, when this
//! process was killed, by the next `omabox reap` ([`sweep_abandoned`]).
//!
//! A temporary workspace is `$TMPDIR/omabox-run-XXXXXX/workspace`. The outer directory is
//! 0700 (other host users stay out of what the sandbox writes; `/workspace` itself is an
//! ordinary 0755 directory inside) and carries its owner's liveness as a lock: it is made
//! as `.omabox-run-new-XXXXXX`, locked (`flock`, held through an fd for the life of the
//! process and released by the kernel when it dies) and only then renamed to its final
//! name. So a final-named directory whose lock can be taken has no owner any more, and a
//! `.omabox-run-new-*` one older than [`NEW_GRACE`] is the trace of a kill between the two
//! steps.

use std::fs::File;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The final name's prefix.
const PREFIX: &str = "omabox-run-";
/// The name's prefix until the directory is locked.
const NEW_PREFIX: &str = ".omabox-run-new-";
/// How old an unlocked `.omabox-run-new-*` directory must be before a sweep takes it for
/// abandoned (it exists for microseconds in a live run).
const NEW_GRACE: Duration = Duration::from_secs(60);

/// The `/workspace` directory of the run.
#[derive(Debug)]
pub enum Workspace {
    /// The caller's directory (`--workspace`), kept afterwards.
    Given(PathBuf),
    /// A tmpfs of the sandbox's own (`OMABOX_LINUX_WORKSPACE_TMPFS`): no host directory.
    InSandbox,
    /// `workspace` in `dir` (see the module doc), which `lock` keeps marked as in use.
    Temporary {
        dir: PathBuf,
        workspace: PathBuf,
        lock: File,
    },
}

impl Workspace {
    /// A fresh temporary workspace in `parent` (`$TMPDIR`, the `tmpdir` setting; see the
    /// module doc).
    pub fn temporary_in(parent: &Path) -> std::io::Result<Self> {
        let new = tempfile::Builder::new()
            .prefix(NEW_PREFIX)
            .permissions(std::fs::Permissions::from_mode(0o700))
            .tempdir_in(parent)?;
        let lock = File::open(new.path())?;
        lock_now(&lock)?;
        let workspace_in_new = new.path().join("workspace");
        std::fs::create_dir(&workspace_in_new)?;
        let name = new
            .path()
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        let dir = new
            .path()
            .with_file_name(format!("{PREFIX}{}", name.trim_start_matches(NEW_PREFIX)));
        std::fs::rename(new.path(), &dir)?;
        // Renamed: ours to remove from here on, not the `TempDir`'s.
        let _ = new.keep();
        let workspace = dir.join("workspace");
        Ok(Self::Temporary {
            dir,
            workspace,
            lock,
        })
    }

    /// The factory context's workdir: the host directory, or (in the sandbox) none — an
    /// empty path the factory does not read then.
    pub fn workdir(&self) -> PathBuf {
        match self {
            Self::Given(p) => p.clone(),
            Self::InSandbox => PathBuf::new(),
            Self::Temporary { workspace, .. } => workspace.clone(),
        }
    }

    /// Removes a temporary workspace (after the sandbox is gone).
    pub fn finish(self) -> Result<(), String> {
        match self {
            Self::Given(_) | Self::InSandbox => Ok(()),
            Self::Temporary { dir, lock, .. } => {
                let removed = std::fs::remove_dir_all(&dir);
                drop(lock);
                removed.map_err(|e| {
                    format!(
                        "removing the temporary workspace {} failed: {e}",
                        dir.display()
                    )
                })
            }
        }
    }
}

/// Takes `file`'s exclusive lock without waiting.
fn lock_now(file: &File) -> std::io::Result<()> {
    rustix::fs::flock(file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
        .map_err(std::io::Error::from)
}

/// Removes the temporary workspaces in `tmp` whose `omabox sandbox run` is gone (module
/// doc): only real directories (no symlink is followed) owned by the caller and closed to
/// others. Returns what went and what could not be looked at or removed.
pub fn sweep_abandoned(tmp: &Path) -> (Vec<PathBuf>, Vec<String>) {
    let (mut removed, mut errors) = (Vec::new(), Vec::new());
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return (removed, errors);
    };
    let me = rustix::process::geteuid().as_raw();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let fresh = name.starts_with(NEW_PREFIX);
        if !fresh && !name.starts_with(PREFIX) {
            continue;
        }
        let path = entry.path();
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        if !meta.is_dir() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            continue;
        }
        if fresh {
            let age = meta
                .modified()
                .ok()
                .and_then(|m| SystemTime::now().duration_since(m).ok());
            if age.is_none_or(|age| age < NEW_GRACE) {
                continue;
            }
        }
        // Held (without blocking) while removing: a live owner holds it.
        let lock = match File::open(&path) {
            Ok(lock) => lock,
            Err(_) => continue,
        };
        if lock_now(&lock).is_err() {
            continue;
        }
        match std::fs::remove_dir_all(&path) {
            Ok(()) => removed.push(path),
            Err(e) => errors.push(format!("{}: {e}", path.display())),
        }
    }
    (removed, errors)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_live_workspace_is_kept_and_an_abandoned_one_swept() {
        let tmp = tempfile::tempdir().unwrap();
        let live = Workspace::temporary_in(tmp.path()).unwrap();
        let Workspace::Temporary { dir, .. } = &live else {
            unreachable!()
        };
        assert!(
            dir.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(PREFIX)
        );
        assert_eq!(
            std::fs::metadata(dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        std::fs::write(live.workdir().join("f"), "x").unwrap();
        // A dead run's: the lock is free.
        let dead = tmp.path().join(format!("{PREFIX}dead"));
        std::fs::create_dir(&dead).unwrap();
        std::fs::set_permissions(&dead, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::create_dir(dead.join("workspace")).unwrap();
        // Not ours to judge: open to others, or a symlink.
        let open = tmp.path().join(format!("{PREFIX}open"));
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::symlink(&dead, tmp.path().join(format!("{PREFIX}link"))).unwrap();
        // A fresh unlocked one is given its grace period.
        let fresh = tmp.path().join(format!("{NEW_PREFIX}x"));
        std::fs::create_dir(&fresh).unwrap();
        std::fs::set_permissions(&fresh, std::fs::Permissions::from_mode(0o700)).unwrap();

        let (removed, errors) = sweep_abandoned(tmp.path());
        assert_eq!(removed, vec![dead.clone()]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(live.workdir().join("f").exists() && open.exists() && fresh.exists());
        live.finish().unwrap();
        assert!(!dir_exists(tmp.path(), PREFIX, "open"));
    }

    /// Whether a temporary workspace other than `except` is left in `dir`.
    fn dir_exists(dir: &Path, prefix: &str, except: &str) -> bool {
        std::fs::read_dir(dir).unwrap().flatten().any(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with(prefix) && !n.ends_with(except) && !n.ends_with("link")
        })
    }
}
