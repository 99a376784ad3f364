//! Listing the blob store (for `omabox gc --dry-run` and reports): every blob's name, size
//! and age. Only reads; `BlobStore::gc` is what removes.

use crate::blob::BlobStore;
use crate::error::{IoContext, Result};
use crate::hash::BlobHash;
use std::io;
use std::time::SystemTime;

/// One stored blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredBlob {
    /// Its name.
    pub hash: BlobHash,
    /// Its size.
    pub size: u64,
    /// Its mtime (refreshed by puts and checkpoint reuse; `gc` keeps blobs younger than the
    /// grace period).
    pub modified: SystemTime,
}

impl BlobStore {
    /// Every blob in the store, in name order. Entries that are not blobs are ignored; a blob
    /// removed while listing is left out.
    pub fn scan(&self) -> Result<Vec<StoredBlob>> {
        // `<root>/sha256/<2 hex>/<hex>`: the shards' directory is two levels above any blob.
        let probe = self.path_of(&BlobHash::of(b""));
        let Some(shards) = probe.parent().and_then(|shard| shard.parent()) else {
            return Ok(Vec::new());
        };
        let mut blobs = Vec::new();
        let entries = match std::fs::read_dir(shards) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(blobs),
            Err(error) => {
                return Err(crate::error::PersistenceError::io(
                    format!("Cannot list {}", shards.display()),
                    error,
                ));
            }
        };
        for shard in entries {
            let shard = shard.ctx(|| format!("Cannot list {}", shards.display()))?;
            if !shard.file_type().is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let Ok(files) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for file in files.flatten() {
                let Some(hash) = file.file_name().to_str().and_then(BlobHash::from_hex) else {
                    continue;
                };
                let Ok(meta) = std::fs::symlink_metadata(file.path()) else {
                    continue;
                };
                if !meta.is_file() {
                    continue;
                }
                blobs.push(StoredBlob {
                    hash,
                    size: meta.len(),
                    modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                });
            }
        }
        blobs.sort_by_key(|blob| blob.hash);
        Ok(blobs)
    }
}
