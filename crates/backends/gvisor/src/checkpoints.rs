//! Runtime checkpoints: a sandbox's processes and memory kept under
//! `<dir>/checkpoints/<id>/` after the sandbox is gone, and restored into a new sandbox that
//! binds directories the caller names (the managed provider's `process` runtime checkpoints:
//! the next run's workspace and outputs, `omabox_sandbox::managed`).
//!
//! ```text
//!   capture:  pause (runsc checkpoint into the sandbox's dir) ─► <id>.partial/{checkpoint/
//!             hard links, mounts} ─► rename to <id>        (the sandbox's destroy leaves it)
//!   restore:  <id>/mounts must match the spec ─► a new sandbox restored from <id>/checkpoint
//!   expiry:   reap removes <id> older than CHECKPOINT_RETENTION, <id>.partial after a minute
//! ```
//!
//! A checkpoint holds everything its processes held in memory: it is the host's, under the
//! backend's root-only directory, named by an id that is never a path (`omabox-gvcp-` and
//! 32 hex digits). Never: restore into mounts other than the checkpoint's (gVisor restores
//! mounts by position); keep a half-made checkpoint under a restorable name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::GvisorError;
use crate::sandbox::{GvisorRuntime, GvisorSandbox, SandboxSpec, blocking};

/// How long a checkpoint no run restored is kept: a session idle longer starts cold.
pub const CHECKPOINT_RETENTION: Duration = Duration::from_secs(24 * 60 * 60);
/// How long a half-made checkpoint (a crash while capturing) may stay.
const PARTIAL_GRACE: Duration = Duration::from_secs(60);
const PREFIX: &str = "omabox-gvcp-";
const PARTIAL: &str = ".partial";
/// The file naming a checkpoint's mounts (`outputs`, `user-home`, one per line).
const MOUNTS_FILE: &str = "mounts";
/// The file naming the session a checkpoint is kept for.
const SESSION_FILE: &str = "session";

/// Hard-links the files of the checkpoint directory `from` into a new directory `to` (the
/// same file system; nothing is copied). Anything but a regular file in `from` is refused.
pub(crate) fn link_checkpoint(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for file in std::fs::read_dir(from)? {
        let file = file?;
        if !file.file_type()?.is_file() {
            return Err(std::io::Error::other(format!(
                "the checkpoint holds {:?}, not a file",
                file.file_name()
            )));
        }
        std::fs::hard_link(file.path(), to.join(file.file_name()))?;
    }
    Ok(())
}

/// Whether `id` is a runtime checkpoint id this backend makes.
pub fn is_checkpoint_id(id: &str) -> bool {
    id.strip_prefix(PREFIX)
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn checkpoints(backend_dir: &Path) -> PathBuf {
    backend_dir.join("checkpoints")
}

/// The mounts a sandbox of `outputs`/`user_home`/`image_root` has, as the mounts file
/// says them.
fn mounts(outputs: bool, user_home: bool, image_root: Option<&Path>) -> String {
    let mut text = String::new();
    if let Some(root) = image_root {
        text.push_str(&format!("root {}\n", root.display()));
    }
    if outputs {
        text.push_str("outputs\n");
    }
    if user_home {
        text.push_str("user-home\n");
    }
    text
}

impl GvisorSandbox {
    /// Pauses this running sandbox and keeps its checkpoint as runtime checkpoint `<id>` for
    /// session `session` only, which outlives the sandbox (its destroy removes only its own
    /// links); returns the id.
    pub async fn capture(&self, session: &str) -> Result<String, GvisorError> {
        self.pause().await?;
        let id = format!("{PREFIX}{}", uuid::Uuid::new_v4().simple());
        let root = checkpoints(&self.shared.dir);
        let (from, mounts) = (
            self.checkpoint_dir(),
            mounts(
                self.outputs().is_some(),
                self.user_home,
                self.image_root.as_deref(),
            ),
        );
        let (made, kept) = (root.join(format!("{id}{PARTIAL}")), root.join(&id));
        let session = session.to_owned();
        blocking(move || {
            let keep = || -> std::io::Result<()> {
                std::fs::create_dir_all(&made)?;
                std::fs::write(made.join(MOUNTS_FILE), mounts)?;
                std::fs::write(made.join(SESSION_FILE), session)?;
                link_checkpoint(&from, &made.join("checkpoint"))?;
                std::fs::rename(&made, &kept)
            };
            keep().map_err(|e| {
                let _ = std::fs::remove_dir_all(&made);
                GvisorError::Io {
                    what: "keeping a runtime checkpoint".into(),
                    source: e,
                }
            })
        })
        .await?;
        Ok(id)
    }
}

impl GvisorRuntime {
    /// A new sandbox binding what `spec` names whose processes go on from runtime
    /// checkpoint `id` (kept: [`Self::remove_checkpoint`] removes it). Only for the session
    /// it was captured for, and `spec` must have the checkpoint's mounts (an outputs
    /// directory or not, E2B's home or not).
    pub async fn restore_checkpoint(
        &self,
        id: &str,
        spec: SandboxSpec,
        session: &str,
    ) -> Result<GvisorSandbox, GvisorError> {
        let refuse = |why: String| GvisorError::Checkpoint {
            id: id.to_owned(),
            why,
        };
        if !is_checkpoint_id(id) {
            return Err(refuse("not a gvisor runtime checkpoint id".into()));
        }
        let dir = checkpoints(self.dir()).join(id);
        let kept = match std::fs::read_to_string(dir.join(MOUNTS_FILE)) {
            Ok(kept) => kept,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(refuse(
                    "no such checkpoint (restored already, expired, or another machine's)".into(),
                ));
            }
            Err(e) => return Err(refuse(format!("cannot read its mounts: {e}"))),
        };
        let owner = std::fs::read_to_string(dir.join(SESSION_FILE)).unwrap_or_default();
        if owner != session {
            // Neither session is named: ids are not secrets, but they are not ours to show.
            return Err(refuse("it was taken for another session".into()));
        }
        let wanted = mounts(
            spec.outputs.is_some(),
            spec.user_home,
            spec.image_root.as_deref(),
        );
        if kept != wanted {
            return Err(refuse(format!(
                "it was taken with mounts {:?}, the restore asks for {:?}",
                kept.lines().collect::<Vec<_>>(),
                wanted.lines().collect::<Vec<_>>()
            )));
        }
        self.start(spec, Some(dir.join("checkpoint"))).await
    }

    /// Removes runtime checkpoint `id`; one that is gone is removed.
    pub fn remove_checkpoint(&self, id: &str) -> Result<(), GvisorError> {
        if !is_checkpoint_id(id) {
            return Err(GvisorError::Checkpoint {
                id: id.to_owned(),
                why: "not a gvisor runtime checkpoint id".into(),
            });
        }
        let dir = checkpoints(self.dir()).join(id);
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GvisorError::Io {
                what: format!("removing {}", dir.display()),
                source: e,
            }),
            _ => Ok(()),
        }
    }
}

/// Removes the runtime checkpoints of `backend_dir` older than `retention` and the
/// half-made ones; returns what it could not remove. Entries are matched by name; only
/// directories are removed.
pub(crate) fn expire(backend_dir: &Path, retention: Duration) -> Vec<String> {
    let mut errors = Vec::new();
    for entry in std::fs::read_dir(checkpoints(backend_dir))
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let limit = match name.strip_suffix(PARTIAL) {
            Some(id) if is_checkpoint_id(id) => PARTIAL_GRACE,
            None if is_checkpoint_id(&name) => retention,
            _ => continue,
        };
        let old = entry
            .metadata()
            .ok()
            .filter(std::fs::Metadata::is_dir)
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > limit);
        if old && let Err(e) = std::fs::remove_dir_all(entry.path()) {
            errors.push(format!("cannot remove runtime checkpoint {name}: {e}"));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_ids_name_a_checkpoint() {
        assert!(is_checkpoint_id(
            "omabox-gvcp-0123456789abcdef0123456789abcdef"
        ));
        assert!(!is_checkpoint_id(
            "omabox-gvcp-../../etc/0123456789abcdef01234567"
        ));
        assert!(!is_checkpoint_id(
            "omabox-gv-0123456789abcdef0123456789abcdef"
        ));
        assert!(!is_checkpoint_id(""));
    }

    #[test]
    fn expiry_removes_old_and_half_made_checkpoints_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = checkpoints(dir.path());
        let id = "omabox-gvcp-0123456789abcdef0123456789abcdef";
        for name in [id.to_owned(), format!("{id}{PARTIAL}"), "other".into()] {
            std::fs::create_dir_all(root.join(name)).unwrap();
        }
        std::fs::write(
            root.join("omabox-gvcp-ffffffffffffffffffffffffffffffff"),
            "a file",
        )
        .unwrap();
        assert!(expire(dir.path(), Duration::from_secs(3600)).is_empty());
        assert_eq!(
            std::fs::read_dir(&root).unwrap().count(),
            4,
            "nothing is old yet"
        );
        assert!(expire(dir.path(), Duration::ZERO).is_empty());
        let mut left = std::fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect::<Vec<_>>();
        left.sort();
        // The partial one is younger than its grace; the file and the foreign name stay.
        assert_eq!(
            left,
            [
                format!("{id}{PARTIAL}"),
                "omabox-gvcp-ffffffffffffffffffffffffffffffff".into(),
                "other".into()
            ]
        );
    }
}
