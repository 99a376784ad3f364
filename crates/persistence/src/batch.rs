//! A batch of blob puts made durable and named together (a checkpoint's, an output
//! finalization's): see the `blob` module doc's first invariant.

use crate::blob::BlobStore;
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::BlobHash;
use std::fs::File;
use std::io;
use std::path::PathBuf;

/// A batch of puts made durable and named together by [`BlobStore::sync_dirs`] (see the
/// module doc): the temp files still to name, and the shard directories whose new entries
/// still need an fsync. Dropped before its end (an error), it removes its temp files.
#[derive(Debug, Default)]
pub(crate) struct DirSync {
    pending: std::sync::Mutex<Vec<PendingPut>>,
    dirs: std::sync::Mutex<std::collections::BTreeSet<PathBuf>>,
}

/// A put of a batch: its temp file, written but not yet durable nor named.
#[derive(Debug)]
pub(crate) struct PendingPut {
    pub(crate) temp: PathBuf,
    pub(crate) hash: BlobHash,
    pub(crate) size: u64,
}

impl DirSync {
    pub(crate) fn add(&self, dir: PathBuf) {
        self.dirs
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(dir);
    }

    pub(crate) fn defer(&self, put: PendingPut) {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(put);
    }

    fn take_pending(&self) -> Vec<PendingPut> {
        std::mem::take(
            &mut *self
                .pending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    fn take(&self) -> Vec<PathBuf> {
        std::mem::take(
            &mut *self
                .dirs
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_iter()
        .collect()
    }
}

impl Drop for DirSync {
    fn drop(&mut self) {
        for put in self.take_pending() {
            let _ = std::fs::remove_file(&put.temp);
        }
    }
}

impl BlobStore {
    /// Ends a batch of puts: its temp files are made durable together, each is named
    /// (linked to its hash), then the shard directories are fsynced several at a time (the
    /// journal commits concurrent fsyncs together). Until this returns, none of the batch's
    /// blobs may be named by a stored manifest.
    pub(crate) fn sync_dirs(&self, batch: &DirSync) -> Result<()> {
        let pending = batch.take_pending();
        if !pending.is_empty() {
            sync_files(&pending)?;
            let mut pending = pending.into_iter();
            let named = pending.try_for_each(|put| {
                let named = self.name(&put.temp, put.hash, put.size);
                let _ = std::fs::remove_file(&put.temp);
                if let (Ok(true), Some(shard)) = (&named, self.path_of(&put.hash).parent()) {
                    batch.add(shard.to_path_buf());
                }
                named.map(drop)
            });
            if let Err(error) = named {
                for put in pending {
                    let _ = std::fs::remove_file(&put.temp);
                }
                return Err(error);
            }
        }
        let dirs: Vec<PathBuf> = batch.take();
        if dirs.is_empty() || !self.options().fsync {
            return Ok(());
        }
        let threads = dirs.len().min(8);
        let chunk = dirs.len().div_ceil(threads);
        std::thread::scope(|scope| {
            let handles: Vec<_> = dirs
                .chunks(chunk)
                .map(|chunk| {
                    scope.spawn(move || {
                        for dir in chunk {
                            File::open(dir)
                                .and_then(|dir| dir.sync_all())
                                .ctx(|| format!("Cannot fsync {}", dir.display()))?;
                        }
                        Ok::<(), PersistenceError>(())
                    })
                })
                .collect();
            for handle in handles {
                handle.join().unwrap_or_else(|_| {
                    Err(PersistenceError::io(
                        "Directory fsync",
                        io::Error::other("panicked"),
                    ))
                })?;
            }
            Ok(())
        })
    }
}

/// fdatasyncs the batch's temp files, several at a time (the journal commits concurrent
/// syncs together).
fn sync_files(pending: &[PendingPut]) -> Result<()> {
    let threads = pending.len().min(16);
    let chunk = pending.len().div_ceil(threads.max(1));
    std::thread::scope(|scope| {
        let handles: Vec<_> = pending
            .chunks(chunk.max(1))
            .map(|chunk| {
                scope.spawn(move || {
                    for put in chunk {
                        File::open(&put.temp)
                            .and_then(|file| file.sync_data())
                            .ctx(|| format!("Cannot fsync {}", put.temp.display()))?;
                    }
                    Ok::<(), PersistenceError>(())
                })
            })
            .collect();
        for handle in handles {
            handle.join().unwrap_or_else(|_| {
                Err(PersistenceError::io(
                    "File fsync",
                    io::Error::other("panicked"),
                ))
            })?;
        }
        Ok(())
    })
}
