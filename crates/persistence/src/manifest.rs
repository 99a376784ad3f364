//! The workspace manifest: what a checkpoint contains, stored as a blob.
//!
//! ```json
//! {"version":1,"entries":[
//!   {"path":"src","type":"directory","mode":493},
//!   {"path":"src/main.rs","type":"file","mode":420,"size":12,"hash":"<64 hex>"},
//!   {"path":"link","type":"symlink","target":"src/main.rs"}]}
//! ```
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

/// The only manifest version this crate writes and reads.
pub const MANIFEST_VERSION: u32 = 1;

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
    /// Link target, verbatim (symlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
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
        }
    }

    pub(crate) fn file(path: String, mode: u32, size: u64, hash: BlobHash) -> Self {
        Self {
            path,
            kind: EntryKind::File,
            mode: Some(mode),
            size: Some(size),
            hash: Some(hash),
            target: None,
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
        }
    }
}

/// A workspace checkpoint's table of contents.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkspaceManifest {
    /// Always [`MANIFEST_VERSION`].
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
        if self.version != MANIFEST_VERSION {
            return Err(PersistenceError::InvalidManifest(format!(
                "unsupported version {}",
                self.version
            )));
        }
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
            if kinds.insert(&entry.path, entry.kind).is_some() {
                return Err(unsafe_entry());
            }
            let shape_ok = match entry.kind {
                EntryKind::Directory => {
                    entry.mode.is_some_and(|mode| mode <= 0o777)
                        && entry.size.is_none()
                        && entry.hash.is_none()
                        && entry.target.is_none()
                }
                EntryKind::File => {
                    entry.mode.is_some_and(|mode| mode <= 0o777)
                        && entry.size.is_some()
                        && entry.hash.is_some()
                        && entry.target.is_none()
                }
                EntryKind::Symlink => {
                    entry.mode.is_none()
                        && entry.size.is_none()
                        && entry.hash.is_none()
                        && entry
                            .target
                            .as_deref()
                            .is_some_and(|target| !target.is_empty() && !target.contains('\0'))
                }
            };
            if !shape_ok {
                return Err(PersistenceError::InvalidManifest(format!(
                    "entry {} has fields that do not fit its type",
                    entry.path
                )));
            }
        }
        Ok(())
    }

    /// Every content blob the manifest names.
    pub fn file_hashes(&self) -> HashSet<BlobHash> {
        self.entries.iter().filter_map(|entry| entry.hash).collect()
    }

    /// Number of file entries and their total size.
    pub fn file_totals(&self) -> (u64, u64) {
        self.entries
            .iter()
            .filter(|entry| entry.kind == EntryKind::File)
            .fold((0, 0), |(files, bytes), entry| {
                (files + 1, bytes + entry.size.unwrap_or(0))
            })
    }
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
