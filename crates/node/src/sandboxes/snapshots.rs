//! serve's snapshots. Under `--backend gvisor` a snapshot is E2B's full one unless the
//! caller asks for the filesystem mode: the sandbox is checkpointed in place (paused with
//! its memory, resumed at once) and the checkpoint kept as a `GvisorImage` (its memory, and
//! its workspace frozen into layers), from which `Sandbox.create(snapshot_id)` restores a
//! sandbox whose processes go on. The rest of this doc is the filesystem mode.
//!
//! Filesystem snapshots (E2B's `create_snapshot(mode="filesystem")`): a running
//! sandbox's saved directories (`/home/user`, `/workspace`, `/tmp`, as a pause saves them,
//! see [`saved`](super::saved)) kept under a snapshot id while the sandbox goes on running;
//! `Sandbox.create(snapshot_id)` starts a sandbox of the snapshot's base template and
//! restores those files into it. Processes and memory are not kept (no backend of serve
//! can capture them), which is what E2B's filesystem mode promises.
//!
//! Snapshots live as long as serve, like built templates: their files are in serve's own
//! directory of saved sandboxes, so a serve that stops removes them and one that died has
//! them removed by `omabox reap` or the next serve. At most [`MAX_SNAPSHOTS`] are kept, each
//! at most `MAX_SAVED_BYTES`. A name taken again replaces its snapshot.
//!
//! Must never: name a host path after the caller's text (a snapshot's files are under a
//! random id of ours); remove files a create is still restoring from (the files go when the
//! last user of a snapshot lets go of it, see [`Stored`]); keep a half-saved snapshot.

use super::saved::SavedFiles;
use super::{SandboxHost, internal, new_sandbox_id};
use omabox_agent::AgentClient;
use omabox_backend_gvisor::GvisorImage;
use omabox_proxy::e2b::{SNAPSHOT_TAG, SandboxServiceError, SnapshotInfo};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

/// Snapshots one serve keeps at once.
pub const MAX_SNAPSHOTS: usize = 64;

/// One snapshot: what it is shown as and where its files are.
pub(super) struct Snapshot {
    pub(super) info: SnapshotInfo,
    /// The template its sandboxes start from before its files are restored (never a
    /// snapshot: a snapshot of a sandbox made from a snapshot has that one's base).
    pub(super) base_template: String,
    /// Its saved files (a filesystem snapshot).
    files: Option<Arc<Stored>>,
    /// Its memory and workspace (a gvisor memory snapshot).
    image: Option<Arc<KeptImage>>,
}

/// A gvisor image, removed when the last [`Snapshot`] holding it is dropped.
struct KeptImage(GvisorImage);

impl Drop for KeptImage {
    fn drop(&mut self) {
        if let Err(error) = self.0.remove() {
            tracing::error!(%error, "cannot remove a snapshot's image");
        }
    }
}

impl Snapshot {
    /// The image a memory snapshot restores sandboxes from.
    pub(super) fn image(&self) -> Option<&GvisorImage> {
        self.image.as_ref().map(|kept| &kept.0)
    }

    /// Restores its files into the sandbox behind `client` (nothing for a memory snapshot:
    /// its sandbox was restored from the image).
    pub(super) async fn restore(&self, client: &AgentClient) -> Result<(), SandboxServiceError> {
        let Some(files) = &self.files else {
            return Ok(());
        };
        files.saved.restore(&files.key, client).await.map_err(|e| {
            internal(format!(
                "cannot restore snapshot {}: {e}",
                self.info.snapshot_id
            ))
        })
    }
}

/// A snapshot's saved files, removed when the last [`Snapshot`] holding them is dropped (a
/// delete while a create restores from them waits for that create, without blocking).
struct Stored {
    saved: SavedFiles,
    key: String,
}

impl Drop for Stored {
    fn drop(&mut self) {
        self.saved.remove(&self.key);
    }
}

/// serve's snapshots, newest last.
#[derive(Default)]
pub(super) struct Snapshots(Mutex<Vec<Arc<Snapshot>>>);

impl Snapshots {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Snapshot>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The snapshot `wanted` names, if any.
    pub(super) fn find(&self, wanted: &str) -> Option<Arc<Snapshot>> {
        self.lock()
            .iter()
            .rev()
            .find(|s| s.info.is_named(wanted))
            .cloned()
    }

    /// Every snapshot, newest first.
    pub(super) fn list(&self) -> Vec<SnapshotInfo> {
        self.lock().iter().rev().map(|s| s.info.clone()).collect()
    }

    /// Forgets every snapshot (serve is stopping; its directory goes with it).
    pub(super) fn clear(&self) {
        self.lock().clear();
    }
}

impl SandboxHost {
    /// Saves the running sandbox `sandbox_id`'s files as a new snapshot, named `name` or
    /// by a random id (an existing snapshot of that name is replaced once this one is
    /// saved). The sandbox goes on running; on error nothing of the new snapshot is kept.
    pub(super) async fn take_snapshot(
        &self,
        sandbox_id: &str,
        name: Option<String>,
        memory: bool,
    ) -> Result<SnapshotInfo, SandboxServiceError> {
        let Some(saved) = &self.inner.saved else {
            return Err(SandboxServiceError::BadRequest(
                "snapshots are not offered by this server".into(),
            ));
        };
        let entry = self.running_entry(sandbox_id)?;
        let snapshot_id = format!(
            "{}:{SNAPSHOT_TAG}",
            name.as_deref().unwrap_or(&new_sandbox_id())
        );
        let full = || {
            SandboxServiceError::Unavailable(format!(
                "this server already keeps {MAX_SNAPSHOTS} snapshots: delete one first"
            ))
        };
        let room = |list: &[Arc<Snapshot>]| {
            list.len() < MAX_SNAPSHOTS || list.iter().any(|s| s.info.snapshot_id == snapshot_id)
        };
        if !room(&self.inner.snapshots.lock()) {
            return Err(full());
        }
        let base_template = entry.start_with.template.clone();
        let (files, image) = if memory {
            drop(entry);
            let held = self.checkpoint_in_place(sandbox_id).await?;
            let kept = held.port.sandbox().keep_image().await;
            let _ = self.resume_in_place(sandbox_id, held).await;
            let image = kept.map_err(|e| {
                internal(format!(
                    "cannot snapshot sandbox {sandbox_id}: {}",
                    super::backend::chain(&e)
                ))
            })?;
            (None, Some(Arc::new(KeptImage(image))))
        } else {
            let key = format!("snapshot-{}", new_sandbox_id());
            saved
                .save(&key, &entry.client)
                .await
                .map_err(|e| internal(format!("cannot snapshot sandbox {sandbox_id}: {e}")))?;
            let files = Arc::new(Stored {
                saved: saved.clone(),
                key,
            });
            (Some(files), None)
        };
        let info = SnapshotInfo {
            names: vec![snapshot_id.clone()],
            snapshot_id: snapshot_id.clone(),
            sandbox_id: sandbox_id.to_owned(),
            created_at: SystemTime::now(),
        };
        let snapshot = Arc::new(Snapshot {
            info: info.clone(),
            base_template,
            files,
            image,
        });
        {
            let mut list = self.inner.snapshots.lock();
            // Checked again: other snapshots may have been taken while this one saved (its
            // files go with `snapshot` when refused).
            if !room(&list) {
                return Err(full());
            }
            list.retain(|s| s.info.snapshot_id != info.snapshot_id);
            list.push(snapshot);
        }
        tracing::info!(sandbox = %sandbox_id, snapshot = %info.snapshot_id, "snapshot taken");
        let kept = if memory {
            "its processes, memory and files kept"
        } else {
            "its files kept"
        };
        let message = format!("snapshot {} taken ({kept})", info.snapshot_id);
        self.inner.logs.open(sandbox_id).info("snapshot", &message);
        Ok(info)
    }

    /// Forgets the snapshot `wanted` names; its files go once no create restores from it.
    pub(super) fn forget_snapshot(&self, wanted: &str) -> bool {
        let mut list = self.inner.snapshots.lock();
        let before = list.len();
        list.retain(|s| !s.info.is_named(wanted));
        let removed = list.len() < before;
        drop(list);
        if removed {
            tracing::info!(snapshot = %wanted.chars().take(140).collect::<String>(), "snapshot deleted");
        }
        removed
    }
}
