//! The collection lock: who may remove young unreferenced blobs, and when.
//!
//! `<data-dir>/blobs/collect.lock` (flock). A **writer** — a run that stores blobs a
//! publication will name (checkpoints, outputs, a seed) — holds it *shared* from before its
//! first blob until its publication is committed or it gave up ([`BlobStore::hold_as_writer`]:
//! waits for a collection in progress). A **collection** that removes unreferenced blobs
//! younger than a candidate's life (a grace period shorter than the default) holds it
//! *exclusive* from before it reads the publication history until its sweep ended
//! ([`BlobStore::try_hold_for_collection`]: never waits). So such a collection never sees a
//! candidate stored but not yet published, and never marks from a history a run publishes
//! into meanwhile; a writer killed with `kill -9` releases its hold with its process (it can
//! no longer publish). The blob store's own `.lock` stays what it was: puts and checkpoints
//! shared, the sweep exclusive, held for milliseconds to seconds.
//!
//! Without the exclusive hold, a collection relies on its grace period alone (see
//! `BlobStore`), which is what the default one-hour grace does.
//!
//! Must never: wait in a collection for a run (runs last minutes to hours), or be held by a
//! collection while it waits on anything but the blob store's `.lock`.

use crate::blob::BlobStore;
use crate::error::{IoContext, Result};
use rustix::fs::FlockOperation;
use std::fs::File;

const LOCK_FILE: &str = "collect.lock";

/// A writer's shared hold (see the module doc); released when dropped or when the process
/// dies.
#[derive(Debug)]
pub struct WriterHold {
    _file: File,
}

/// A collection's exclusive hold (see the module doc).
#[derive(Debug)]
pub struct CollectionHold {
    _file: File,
}

impl BlobStore {
    fn collection_lock_file(&self) -> Result<File> {
        let path = self.root().join(LOCK_FILE);
        std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx(|| format!("Cannot open {}", path.display()))
    }

    /// Takes the collection lock shared, waiting while a collection holds it (after calling
    /// `on_wait` once, so the caller can say why it waits). Blocking.
    pub fn hold_as_writer(&self, on_wait: impl FnOnce()) -> Result<WriterHold> {
        let file = self.collection_lock_file()?;
        let failed = || format!("Cannot lock {}", self.root().join(LOCK_FILE).display());
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                on_wait();
                rustix::fs::flock(&file, FlockOperation::LockShared).ctx(failed)?;
            }
            Err(error) => return Err(error).ctx(failed),
        }
        Ok(WriterHold { _file: file })
    }

    /// Takes the collection lock exclusive if no writer and no other collection holds it;
    /// `None` when one does. Never waits.
    pub fn try_hold_for_collection(&self) -> Result<Option<CollectionHold>> {
        let file = self.collection_lock_file()?;
        match rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => Ok(Some(CollectionHold { _file: file })),
            Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
            Err(error) => {
                Err(error).ctx(|| format!("Cannot lock {}", self.root().join(LOCK_FILE).display()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_share_and_exclude_a_collection_and_a_collection_excludes_writers() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::new(dir.path()).unwrap();
        let first = store.hold_as_writer(|| panic!("no collection")).unwrap();
        let second = store.hold_as_writer(|| panic!("no collection")).unwrap();
        assert!(store.try_hold_for_collection().unwrap().is_none());
        drop(first);
        assert!(store.try_hold_for_collection().unwrap().is_none());
        drop(second);
        let collection = store.try_hold_for_collection().unwrap().expect("idle");
        assert!(store.try_hold_for_collection().unwrap().is_none());
        // A writer waits for the collection (on another thread), then proceeds.
        let (tx, rx) = std::sync::mpsc::channel();
        let (waits, waited) = std::sync::mpsc::channel();
        let waiting = std::thread::spawn({
            let root = dir.path().to_path_buf();
            move || {
                let store = BlobStore::new(&root).unwrap();
                let _hold = store.hold_as_writer(|| waits.send(()).unwrap()).unwrap();
                tx.send(()).unwrap();
            }
        });
        waited.recv().unwrap();
        assert!(rx.try_recv().is_err(), "a writer passed a collection");
        drop(collection);
        rx.recv().unwrap();
        waiting.join().unwrap();
    }
}
