//! Progress of long restores and checkpoints, for a caller that draws it (the CLI's bar).
//!
//! This crate never touches a terminal; it calls a [`ProgressObserver`] from the worker
//! threads doing the work, after every file. Observers must be cheap and must not block.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Which long operation is reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressPhase {
    /// Materializing the published workspace into a binding.
    Restore,
    /// Capturing a binding into a checkpoint.
    Checkpoint,
    /// Capturing a seed directory before it is restored into a new session's binding.
    Seed,
    /// Writing a checkpoint to a user directory.
    Export,
}

/// A snapshot of one operation's progress. Totals are known before the first update.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// The operation.
    pub phase: ProgressPhase,
    /// Files finished (reused files count immediately).
    pub files_done: u64,
    /// Files in the operation.
    pub files_total: u64,
    /// Bytes finished.
    pub bytes_done: u64,
    /// Bytes in the operation.
    pub bytes_total: u64,
}

/// Receives [`Progress`] updates; called from several threads.
pub trait ProgressObserver: Send + Sync + fmt::Debug {
    /// One update. `files_done == files_total` marks the end of the phase.
    fn update(&self, progress: Progress);
}

/// Counts progress and forwards it to an optional observer.
#[derive(Debug)]
pub(crate) struct ProgressTracker<'a> {
    observer: Option<&'a dyn ProgressObserver>,
    phase: ProgressPhase,
    files_total: u64,
    bytes_total: u64,
    files_done: AtomicU64,
    bytes_done: AtomicU64,
}

impl<'a> ProgressTracker<'a> {
    pub(crate) fn new(
        observer: Option<&'a dyn ProgressObserver>,
        phase: ProgressPhase,
        files_total: u64,
        bytes_total: u64,
    ) -> Self {
        let tracker = Self {
            observer,
            phase,
            files_total,
            bytes_total,
            files_done: AtomicU64::new(0),
            bytes_done: AtomicU64::new(0),
        };
        tracker.advance(0, 0);
        tracker
    }

    pub(crate) fn advance(&self, files: u64, bytes: u64) {
        let files_done = self.files_done.fetch_add(files, Ordering::Relaxed) + files;
        let bytes_done = self.bytes_done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if let Some(observer) = self.observer {
            observer.update(Progress {
                phase: self.phase,
                files_done,
                files_total: self.files_total,
                bytes_done,
                bytes_total: self.bytes_total,
            });
        }
    }
}
