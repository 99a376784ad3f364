//! Per-checkpoint limits: how many entries and how many stored bytes one workspace
//! checkpoint may have.
//!
//! A sandbox decides what its `/workspace` holds; the host decides how much of it it keeps.
//! The walk counts entries as it lists them and estimates stored bytes from each file's stat
//! (the allocated size of a sparse file, nothing for another name of a hard-linked inode), so
//! a tree over a limit fails before its content is read or its listing grows further; the
//! exact stored size is checked again before the manifest is written. Over a limit the
//! checkpoint fails with an error naming the limit and the figure: the run fails and the last
//! publication stays (a checkpoint publishes nothing).

use crate::error::{PersistenceError, Result};

/// Limits of one workspace checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointLimits {
    /// Most manifest entries (files, directories, symlinks, hard links). Default 1 000 000.
    pub max_entries: u64,
    /// Most bytes of file content stored (sparse files count their data, hard links once).
    /// Default 64 GiB.
    pub max_bytes: u64,
}

impl Default for CheckpointLimits {
    fn default() -> Self {
        Self {
            max_entries: 1_000_000,
            max_bytes: 64 << 30,
        }
    }
}

impl CheckpointLimits {
    pub(crate) fn check_entries(&self, entries: u64) -> Result<()> {
        if entries > self.max_entries {
            return Err(PersistenceError::CheckpointEntryLimit {
                limit: self.max_entries,
            });
        }
        Ok(())
    }

    pub(crate) fn check_bytes(&self, bytes: u64) -> Result<()> {
        if bytes > self.max_bytes {
            return Err(PersistenceError::CheckpointByteLimit {
                limit: self.max_bytes,
                found: bytes,
            });
        }
        Ok(())
    }
}
