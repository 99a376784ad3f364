//! Workspace persistence and Session outputs for backends whose `/workspace` and
//! `/mnt/session/outputs` are host directories bind-mounted into the sandbox (linux
//! namespaces, local subprocess).
//!
//! - [`BlobStore`]: content-addressed blobs under `<data-dir>/blobs/sha256/<2 hex>/<hex>`,
//!   write-once, with a garbage collector that never removes a referenced blob.
//! - [`FilesystemWorkspacePort`]: `WorkspacePersistencePort` with `checkpoint_restore` (a
//!   checkpoint is a manifest of paths, types, modes, sizes, content hashes and symlink
//!   targets, plus deduplicated content; incremental through a per-binding stat cache;
//!   sparse files stored as their data extents and hard links as links, so neither is
//!   amplified on the host; bounded by [`CheckpointLimits`]; special files, non-UTF-8 names
//!   and too-deep contents skipped and reported, see [`SkippedEntries`]) and `ephemeral`.
//! - [`verify_workspace`] / [`verify_outputs`]: re-hash a published revision (`omabox fsck`);
//!   [`referenced_blobs`] and [`BlobStore::scan`] for retention-based `gc`.
//! - [`FilesystemSessionOutputPort`]: `SessionOutputPort` with `final_collect`.
//!
//! What this crate must never do:
//! - **lose a workspace**: a checkpoint only adds immutable blobs; a failed checkpoint leaves
//!   the previously published candidate and its blobs intact, and `gc` keeps every blob a
//!   given candidate references plus everything younger than its grace period;
//! - **write outside a binding root on restore**, or follow a symlink while reading or writing
//!   a sandbox-writable tree: every walk and restore goes through directory fds with
//!   `O_NOFOLLOW` (see `safe_fs`);
//! - **store a blob whose bytes do not hash to its name**;
//! - **panic on bad input**: malformed manifests, ids and trees are errors with the contract's
//!   texts where it fixes them.
//!
//! Everything blocking runs on `spawn_blocking`; file hashing during a checkpoint uses a small
//! scoped thread pool ([`WorkspaceOptions::hash_threads`]).
//!
//! Layout on disk: see the `layout` module (binding roots) and [`BlobStore`] (blobs).

#![forbid(unsafe_code)]

mod batch;
mod blob;
mod blob_scan;
mod blob_temp;
mod collection;
mod direct;
mod error;
mod fault;
mod hash;
mod layout;
mod limits;
mod lost;
mod manifest;
mod media_type;
mod outputs;
mod progress;
mod restore;
mod safe_fs;
mod skipped;
mod snapshot;
mod sparse;
mod stat_cache;
mod verify;
mod walk;
mod workspace;

pub use blob::{BlobStore, BlobStoreOptions, GcReport, PutOutcome, TEMP_GRACE};
pub use blob_scan::StoredBlob;
pub use collection::{CollectionHold, WriterHold};
pub use error::PersistenceError;
pub use fault::point as fault_point;
pub use hash::BlobHash;
pub use layout::{binding_host_path, prune_empty_parents};
pub use limits::CheckpointLimits;
pub use lost::{LOST_COUNT_METADATA_KEY, LOST_LISTED, LOST_METADATA_KEY, binding_losses};
pub use manifest::{
    EntryKind, MANIFEST_VERSION, MANIFEST_VERSION_MIN, MAX_EXTENTS, ManifestEntry,
    WorkspaceManifest,
};
pub use media_type::guess_media_type;
pub use outputs::{FilesystemSessionOutputPort, OutputLimits, SessionOutputManifest};
pub use progress::{Progress, ProgressObserver, ProgressPhase};
pub use restore::RestoreReport;
pub use skipped::{SKIPPED_KEPT, SkipReason, SkippedEntries, SkippedEntry};
pub use snapshot::CheckpointReport;
pub use verify::{
    BlobState, BlobVerifier, Damage, referenced_blobs, verify_outputs, verify_workspace,
};
pub use workspace::{FilesystemWorkspacePort, WorkspaceOptions};

/// Runs blocking filesystem work off the async runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> error::Result<T> + Send + 'static,
) -> error::Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(PersistenceError::Task)?
}
