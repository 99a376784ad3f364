//! Entries a checkpoint or an outputs collection leaves out, and why.
//!
//! A sandbox can leave things in `/workspace` or `/mnt/session/outputs` that cannot be carried
//! to the host as data: FIFOs, sockets and device nodes, names that are not UTF-8, directories
//! nested deeper than [`crate::safe_fs::MAX_DEPTH`], and (in outputs, which hold regular files
//! only) symlinks. Failing the whole checkpoint for one of them would discard the run's work,
//! so they are skipped and reported: in the checkpoint report, in the candidate's metadata
//! (`skippedEntries`, a count), and as one warning per entry in the log (the first
//! [`SKIPPED_KEPT`] of them, then a summary).
//!
//! Paths are sandbox-chosen: the report keeps at most [`SKIPPED_KEPT`] of them, each at most
//! [`PATH_CHARS`] characters, so a hostile tree cannot grow host memory or the log.

use std::fmt;

/// Skipped entries kept (and logged) by name; the rest are counted.
pub const SKIPPED_KEPT: usize = 32;
/// Characters of a skipped path kept.
const PATH_CHARS: usize = 512;

/// Why an entry was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// A FIFO.
    Fifo,
    /// A Unix socket.
    Socket,
    /// A character or block device node.
    Device,
    /// A symlink where only regular files are collected (outputs).
    Symlink,
    /// The name (or a symlink's target) is not UTF-8; the path shown is lossy.
    NotUtf8,
    /// A directory whose contents nest deeper than the walk follows.
    TooDeep,
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::Fifo => "a FIFO",
            SkipReason::Socket => "a socket",
            SkipReason::Device => "a device node",
            SkipReason::Symlink => "a symlink (outputs must be regular files)",
            SkipReason::NotUtf8 => "its name or target is not UTF-8",
            SkipReason::TooDeep => "its contents are nested more than 1024 directories deep",
        })
    }
}

/// One skipped entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEntry {
    /// The entry's path relative to the walked root (possibly shortened).
    pub path: String,
    /// Why it was skipped.
    pub reason: SkipReason,
}

/// The skipped entries of one walk: the first [`SKIPPED_KEPT`] by name, all counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SkippedEntries {
    /// The first entries skipped, in walk order.
    pub kept: Vec<SkippedEntry>,
    /// How many were skipped in all.
    pub total: u64,
}

impl SkippedEntries {
    pub(crate) fn push(&mut self, path: &str, reason: SkipReason) {
        self.total += 1;
        if self.kept.len() < SKIPPED_KEPT {
            let path = match path.char_indices().nth(PATH_CHARS) {
                Some((end, _)) => format!("{}…", &path[..end]),
                None => path.to_owned(),
            };
            self.kept.push(SkippedEntry { path, reason });
        }
    }

    /// True when nothing was skipped.
    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// Logs one warning per kept entry and one for the rest. `what` names the tree
    /// ("/workspace", "/mnt/session/outputs").
    pub(crate) fn warn(&self, what: &str) {
        for entry in &self.kept {
            tracing::warn!("{what}: skipped {}: {}", entry.path, entry.reason);
        }
        let rest = self.total - self.kept.len() as u64;
        if rest > 0 {
            tracing::warn!("{what}: skipped {rest} more entries that cannot be stored");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_a_bounded_number_of_shortened_paths_and_counts_all() {
        let mut skipped = SkippedEntries::default();
        let long = "x".repeat(10_000);
        for _ in 0..1000 {
            skipped.push(&long, SkipReason::Fifo);
        }
        assert_eq!(skipped.total, 1000);
        assert_eq!(skipped.kept.len(), SKIPPED_KEPT);
        assert!(skipped.kept[0].path.chars().count() <= PATH_CHARS + 1);
    }
}
