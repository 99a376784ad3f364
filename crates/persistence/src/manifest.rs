//! The workspace manifest: what a checkpoint contains, stored as a blob.
//!
//! ```json
//! {"version":2,"entries":[
//!   {"path":"src","type":"directory","mode":493},
//!   {"path":"src/main.rs","type":"file","mode":420,"size":12,"hash":"<64 hex>"},
//!   {"path":"disk.img","type":"file","mode":420,"size":536870912,"hash":"<64 hex>",
//!    "extents":[[0,4096],[268435456,4096]]},
//!   {"path":"src/alias.rs","type":"hardlink","target":"src/main.rs"},
//!   {"path":"link","type":"symlink","target":"src/main.rs"}]}
//! ```
//!
//! Versions. **1**: directories, files and symlinks. **2** adds, for what a sandbox can make
//! cheaply but a naive copy would amplify on the host:
//! - `extents` on a sparse file: its data regions `[offset, length]` (sorted, disjoint, inside
//!   `size`, at most [`MAX_EXTENTS`]); the blob holds only those regions' bytes, concatenated,
//!   and restore writes them at their offsets and leaves the rest a hole;
//! - `hardlink` entries: another name for the inode of an earlier `file` entry (`target`, a
//!   manifest path), stored and hashed once and restored with `linkat`.
//!
//! A checkpoint is written as version 1 when it needs neither (so an older omabox reads it),
//! else as version 2. Both versions are read; version-2 fields in a version-1 manifest are
//! refused.
//!
//! Entries are in walk order: depth first, names sorted by bytes, a directory before its
//! children. `mode` is the permission bits only (`& 0o777`): set-id and sticky bits are never
//! carried from a sandbox into host files. The stored blob is the JSON plus `"\n"`; its SHA-256
//! is the checkpoint id (`wcp_<hex>`) and content hash (`sha256:<hex>`).
//!
//! [`WorkspaceManifest::parse`] is the only way restore obtains a manifest, and it rejects
//! anything a restore could not apply safely: traversal, duplicates, and an entry whose parent
//! is not a directory listed before it (so no entry can be written through a symlink).

use crate::error::{PersistenceError, Result};
use crate::hash::BlobHash;
use crate::safe_fs::split_relative;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// The newest manifest version this crate writes and reads (see the module doc).
pub const MANIFEST_VERSION: u32 = 2;
/// The oldest manifest version this crate reads.
pub const MANIFEST_VERSION_MIN: u32 = 1;
/// Most data regions a sparse file entry may list; a file with more is stored dense.
pub const MAX_EXTENTS: usize = 4096;

/// The kind of a workspace entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link (never followed).
    Symlink,
    /// Another name of an earlier `file` entry's inode (version 2).
    Hardlink,
}

/// One entry of a [`WorkspaceManifest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestEntry {
    /// Relative path, `/`-separated, no `.`/`..`/empty segments.
    pub path: String,
    /// The entry's kind.
    #[serde(rename = "type")]
    pub kind: EntryKind,
    /// Permission bits (files and directories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// Content size (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Content hash, the blob's name (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<BlobHash>,
    /// Link target: verbatim (symlinks), or the manifest path of the linked file (hardlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Data regions `[offset, length]` of a sparse file (version 2); the blob holds their
    /// bytes, concatenated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extents: Option<Vec<[u64; 2]>>,
}

impl ManifestEntry {
    pub(crate) fn directory(path: String, mode: u32) -> Self {
        Self {
            path,
            kind: EntryKind::Directory,
            mode: Some(mode),
            size: None,
            hash: None,
            target: None,
            extents: None,
        }
    }

    pub(crate) fn file(path: String, mode: u32, size: u64, hash: BlobHash) -> Self {
        Self {
            hash: Some(hash),
            ..Self::listed_file(path, mode, size)
        }
    }

    /// A file of a tree still to be copied (a seed's listing): no hash yet.
    pub(crate) fn listed_file(path: String, mode: u32, size: u64) -> Self {
        Self {
            path,
            kind: EntryKind::File,
            mode: Some(mode),
            size: Some(size),
            hash: None,
            target: None,
            extents: None,
        }
    }

    pub(crate) fn hardlink(path: String, target: String) -> Self {
        Self {
            path,
            kind: EntryKind::Hardlink,
            mode: None,
            size: None,
            hash: None,
            target: Some(target),
            extents: None,
        }
    }

    /// Bytes of this entry's blob: the data regions of a sparse file, else its size.
    pub fn stored_size(&self) -> u64 {
        match &self.extents {
            Some(extents) => extents.iter().map(|[_, length]| *length).sum(),
            None => self.size.unwrap_or(0),
        }
    }

    pub(crate) fn symlink(path: String, target: String) -> Self {
        Self {
            path,
            kind: EntryKind::Symlink,
            mode: None,
            size: None,
            hash: None,
            target: Some(target),
            extents: None,
        }
    }
}

/// A workspace checkpoint's table of contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceManifest {
    /// 1 or 2 (see the module doc).
    pub version: u32,
    /// The entries, parents first.
    pub entries: Vec<ManifestEntry>,
}

impl WorkspaceManifest {
    /// The stored form: compact JSON plus a newline.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut bytes = serde_json::to_vec(self).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    }

    /// Parses a stored manifest and checks every structural rule (see the module doc).
    pub fn parse(bytes: &[u8]) -> Result<Self> {
        let manifest: WorkspaceManifest = serde_json::from_slice(bytes)
            .map_err(|error| PersistenceError::InvalidManifest(error.to_string()))?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// Checks the rules [`WorkspaceManifest::parse`] enforces.
    pub fn validate(&self) -> Result<()> {
        self.check(true)
    }

    /// [`WorkspaceManifest::validate`]; with `hashed` false, for the listing of a tree still to
    /// be copied (a seed), files must have no hash instead.
    pub(crate) fn check(&self, hashed: bool) -> Result<()> {
        if !(MANIFEST_VERSION_MIN..=MANIFEST_VERSION).contains(&self.version) {
            return Err(PersistenceError::InvalidManifest(format!(
                "unsupported version {}",
                self.version
            )));
        }
        let v2 = self.version >= 2;
        let mut kinds: HashMap<&str, EntryKind> = HashMap::with_capacity(self.entries.len());
        for entry in &self.entries {
            let unsafe_entry = || PersistenceError::UnsafeEntry(entry.path.clone());
            let parts = split_relative(&entry.path).ok_or_else(unsafe_entry)?;
            if parts.len() > crate::safe_fs::MAX_DEPTH {
                return Err(unsafe_entry());
            }
            if parts.len() > 1 {
                let parent = &entry.path[..entry.path.len() - parts[parts.len() - 1].len() - 1];
                if kinds.get(parent) != Some(&EntryKind::Directory) {
                    return Err(unsafe_entry());
                }
            }
            let shape_ok = match entry.kind {
                EntryKind::Directory => {
                    entry.mode.is_some_and(|mode| mode <= 0o777)
                        && entry.size.is_none()
                        && entry.hash.is_none()
                        && entry.target.is_none()
                        && entry.extents.is_none()
                }
                EntryKind::File => {
                    entry.mode.is_some_and(|mode| mode <= 0o777)
                        && entry.hash.is_some() == hashed
                        && entry.target.is_none()
                        && entry.size.is_some_and(|size| match &entry.extents {
                            None => true,
                            Some(extents) => v2 && extents_fit(extents, size),
                        })
                }
                EntryKind::Symlink => {
                    entry.mode.is_none()
                        && entry.size.is_none()
                        && entry.hash.is_none()
                        && entry.extents.is_none()
                        && entry
                            .target
                            .as_deref()
                            .is_some_and(|target| !target.is_empty() && !target.contains('\0'))
                }
                EntryKind::Hardlink => {
                    // The target is a file listed before (so restore links to what it wrote).
                    v2 && entry.mode.is_none()
                        && entry.size.is_none()
                        && entry.hash.is_none()
                        && entry.extents.is_none()
                        && entry
                            .target
                            .as_deref()
                            .is_some_and(|target| kinds.get(target) == Some(&EntryKind::File))
                }
            };
            if !shape_ok {
                return Err(PersistenceError::InvalidManifest(format!(
                    "entry {} has fields that do not fit its type",
                    entry.path
                )));
            }
            if kinds.insert(&entry.path, entry.kind).is_some() {
                return Err(unsafe_entry());
            }
        }
        Ok(())
    }

    /// The lowest version that can hold `entries`.
    pub(crate) fn version_for(entries: &[ManifestEntry]) -> u32 {
        let needs_v2 = entries
            .iter()
            .any(|entry| entry.kind == EntryKind::Hardlink || entry.extents.is_some());
        if needs_v2 { 2 } else { 1 }
    }

    /// Every content blob the manifest names.
    pub fn file_hashes(&self) -> HashSet<BlobHash> {
        self.entries.iter().filter_map(|entry| entry.hash).collect()
    }

    /// Number of file entries and the total size of their blobs.
    pub fn file_totals(&self) -> (u64, u64) {
        self.entries
            .iter()
            .filter(|entry| entry.kind == EntryKind::File)
            .fold((0, 0), |(files, bytes), entry| {
                (files + 1, bytes + entry.stored_size())
            })
    }
}

/// Sorted, disjoint, non-empty regions inside `size`, at most [`MAX_EXTENTS`].
fn extents_fit(extents: &[[u64; 2]], size: u64) -> bool {
    let mut end = 0u64;
    extents.len() <= MAX_EXTENTS
        && extents.iter().all(|[offset, length]| {
            let fits = *length > 0
                && *offset >= end
                && offset.checked_add(*length).is_some_and(|stop| stop <= size);
            end = offset.saturating_add(*length);
            fits
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(entries: Vec<ManifestEntry>) -> WorkspaceManifest {
        WorkspaceManifest {
            version: MANIFEST_VERSION,
            entries,
        }
    }

    #[test]
    fn round_trips_and_rejects_unsafe_shapes() {
        let hash = BlobHash::of(b"x");
        let good = manifest(vec![
            ManifestEntry::directory("d".into(), 0o755),
            ManifestEntry::file("d/f".into(), 0o644, 1, hash),
            ManifestEntry::symlink("l".into(), "../../etc".into()),
        ]);
        assert_eq!(WorkspaceManifest::parse(&good.to_bytes()).unwrap(), good);
        assert!(good.to_bytes().ends_with(b"}\n"));

        let through_link = manifest(vec![
            ManifestEntry::symlink("l".into(), "/etc".into()),
            ManifestEntry::file("l/passwd".into(), 0o644, 1, hash),
        ]);
        let orphan = manifest(vec![ManifestEntry::file("a/b".into(), 0o644, 1, hash)]);
        let duplicate = manifest(vec![
            ManifestEntry::directory("a".into(), 0o755),
            ManifestEntry::directory("a".into(), 0o755),
        ]);
        for bad in [through_link, orphan, duplicate] {
            assert!(
                matches!(bad.validate(), Err(PersistenceError::UnsafeEntry(_))),
                "{bad:?}"
            );
        }
        let setuid = manifest(vec![ManifestEntry::file("f".into(), 0o4755, 1, hash)]);
        assert!(matches!(
            setuid.validate(),
            Err(PersistenceError::InvalidManifest(_))
        ));
        assert!(matches!(
            WorkspaceManifest::parse(br#"{"version":1,"entries":[],"extra":1}"#),
            Err(PersistenceError::InvalidManifest(_))
        ));
    }
}
