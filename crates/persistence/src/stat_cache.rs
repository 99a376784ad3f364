//! The per-binding stat cache that makes checkpoints incremental.
//!
//! Maps a workspace path to the `(dev, ino, size, mtime, ctime)` it had when its content was
//! last hashed, and that hash. A later checkpoint that finds the same stat reuses the hash
//! without reading the file. It lives in the binding root, next to (not inside) the mounted
//! `workspace/` directory, so the sandbox cannot edit it.
//!
//! Why a stat match proves the content is unchanged: the sandbox can set `mtime` but not
//! `ctime`, and every write or `utimes` moves `ctime` to the current time. The one hole is a
//! write in the same timestamp tick as the stat we recorded; so an entry is only recorded
//! when its `ctime` is at least the racy margin older than the moment it was observed
//! (git's "racily clean" rule). A restore records every file it wrote in a pending cache that
//! `attach` activates once the margin has passed (nothing writes to a binding before it is
//! attached).
//!
//! The cache is only an accelerator: a missing, unreadable or foreign file is an empty cache,
//! and saving it is not fsynced.

use crate::error::{IoContext, Result};
use crate::hash::BlobHash;
use crate::safe_fs::StatKey;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::Path;

const STAT_CACHE_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct CachedFile {
    stat: StatKey,
    hash: BlobHash,
}

/// Path → last hashed stat and content hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct StatCache {
    version: u32,
    entries: HashMap<String, CachedFile>,
}

impl Default for StatCache {
    fn default() -> Self {
        Self {
            version: STAT_CACHE_VERSION,
            entries: HashMap::new(),
        }
    }
}

impl StatCache {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Loads the cache at `path`; anything unreadable is an empty cache.
    pub(crate) fn load(path: &Path) -> Self {
        std::fs::read(path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<StatCache>(&bytes).ok())
            .filter(|cache| cache.version == STAT_CACHE_VERSION)
            .unwrap_or_default()
    }

    /// Writes the cache next to `path` and renames it into place.
    pub(crate) fn save(&self, path: &Path) -> Result<()> {
        let temp = path.with_extension("json.partial");
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        std::fs::write(&temp, bytes).ctx(|| format!("Cannot write {}", temp.display()))?;
        std::fs::rename(&temp, path).ctx(|| format!("Cannot rename {}", temp.display()))
    }

    /// The hash recorded for `path` if its stat is unchanged.
    pub(crate) fn lookup(&self, path: &str, stat: &StatKey) -> Option<BlobHash> {
        self.entries
            .get(path)
            .filter(|cached| cached.stat == *stat)
            .map(|cached| cached.hash)
    }

    pub(crate) fn insert(&mut self, path: String, stat: StatKey, hash: BlobHash) {
        self.entries.insert(path, CachedFile { stat, hash });
    }
}
