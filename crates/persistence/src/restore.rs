//! Materializing a manifest into an empty directory (the blocking half of `materialize` and
//! `export`), its files' content read from the blob store ([`Content::Blobs`]) or, for a
//! seed, copied from the tree the manifest was walked from ([`Content::Tree`]).
//!
//! Restore never writes outside its destination:
//! - the manifest was validated by [`WorkspaceManifest::parse`]: no `..`, absolute, empty or
//!   NUL-bearing path, no duplicate, and every entry's parent is a directory listed before it;
//! - every parent directory is opened from the destination's fd, one component at a time,
//!   with `O_NOFOLLOW | O_DIRECTORY`, so even a symlink that appeared behind our back is never
//!   traversed;
//! - entries are created with `mkdirat`, `symlinkat`, or `O_CREAT | O_EXCL | O_NOFOLLOW`, all of
//!   which fail on anything already there;
//! - only entries the manifest lists are created, and the destination must start empty.
//!
//! Directories are created `0700` and get their recorded mode after everything inside them
//! was written (deepest first), so a read-only directory can still be restored.

use crate::blob::{BlobStore, COPY_BUFFER};
use crate::direct::DirectWriter;
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::BlobHash;
use crate::manifest::{EntryKind, ManifestEntry, WorkspaceManifest};
use crate::progress::{ProgressObserver, ProgressPhase, ProgressTracker};
use crate::safe_fs::{self, ParentCursor};
use crate::snapshot::changed_or_io;
use crate::sparse;
use crate::stat_cache::StatCache;
use crate::verify::Damage;
use omabox_contract::AbortSignal;
use rustix::fs::{AtFlags, FileType, Mode};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Counters of one restore or export.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// Manifest entries created.
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub directories: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Hard links made to files restored earlier.
    pub hardlinks: u64,
    /// Bytes written.
    pub bytes: u64,
    /// What could not be restored because its stored content is missing or damaged (only
    /// with `tolerate_lost`; the rest of the tree is restored without it).
    pub lost: Vec<Damage>,
    /// Wall time.
    pub duration: Duration,
}

/// Where a restore's file content comes from.
pub(crate) enum Content<'a> {
    /// The blobs the manifest's hashes name (a checkpoint).
    Blobs {
        store: &'a BlobStore,
        /// Hash every byte copied and compare with the manifest (else sizes only).
        verify: bool,
        /// A file whose blob is missing or damaged (and a hard link to it) is left out and
        /// listed in [`RestoreReport::lost`] instead of failing the restore: never written
        /// with wrong bytes, never silently.
        tolerate_lost: bool,
    },
    /// The same paths under the directory the manifest (of unhashed files) was walked from: a
    /// seed. Each file is opened from this fd one component at a time without following a
    /// symlink, must still be the regular file of the size the walk saw (else
    /// [`PersistenceError::EntryChanged`]), and is read no further than one byte past that
    /// size (which shows it grew).
    Tree(BorrowedFd<'a>),
}

/// Inputs of [`restore`].
pub(crate) struct RestoreInput<'a> {
    pub content: Content<'a>,
    pub manifest: &'a WorkspaceManifest,
    pub dest: &'a Path,
    /// Record a stat cache for the restored files (only files with a hash have one).
    pub record_cache: bool,
    pub observer: Option<&'a dyn ProgressObserver>,
    pub phase: ProgressPhase,
    pub signal: &'a AbortSignal,
}

/// Files whose content is being written at once (threads of their own; the walk, which
/// creates directories, symlinks and empty files, is the caller's thread). A writer mostly
/// waits for the disk (its read, its write), so more writers than cores keep the device busy
/// while the cores hash: 4 restored 1 GiB in 0.70–0.86× the time of 2 in alternating runs
/// of the workspace bench; 6 and 8 were no faster than 4.
const WRITERS: usize = 4;

/// Blobs at least this large are read with `O_DIRECT`, straight into the write buffer: a
/// restore reads each blob once, so filling the page cache with it only costs (allocating
/// and copying 1 GiB of pages) and evicts what the host does use.
const DIRECT_READ: u64 = 1 << 20;

/// A file the walk created, for a writer to fill: its entry, and its parent directory (a
/// duplicate of the walk's fd, so a lost file can be removed by name).
struct FileJob<'m> {
    entry: &'m ManifestEntry,
    name: &'m str,
    parent: OwnedFd,
    /// `None` for a seed's file.
    hash: Option<BlobHash>,
    size: u64,
}

/// What each writer thread keeps between files.
#[derive(Default)]
struct Writer {
    /// Only a sparse file's extents are copied through it: made on first use.
    buffer: Vec<u8>,
    /// The parents of a seed's files, opened under [`Content::Tree`]'s fd.
    source: ParentCursor,
}

/// What a writer made of a file.
enum FileDone {
    /// Written (and verified); its stat for the cache when asked.
    Written(Option<safe_fs::StatKey>),
    /// Its blob is missing or damaged (only with `tolerate_lost`): removed, not written.
    Lost(String),
}

/// Restores `input.manifest` into the empty directory `input.dest`.
///
/// One thread walks the manifest in order, creating every directory, symlink and (empty)
/// file; [`WRITERS`] threads fill the files, so one file's wait for the disk overlaps
/// another's hashing. Hard links are made once every file is written (a link to a lost file
/// is lost too); directory modes last.
pub(crate) fn restore(input: RestoreInput<'_>) -> Result<(RestoreReport, StatCache)> {
    let started = Instant::now();
    input
        .manifest
        .check(matches!(input.content, Content::Blobs { .. }))?;
    let root =
        safe_fs::open_root(input.dest).ctx(|| format!("Cannot open {}", input.dest.display()))?;
    if !safe_fs::list_names(root.as_fd())
        .ctx(|| format!("Cannot list {}", input.dest.display()))?
        .is_empty()
    {
        return Err(PersistenceError::DestinationNotEmpty(
            input.dest.display().to_string(),
        ));
    }
    let (files_total, bytes_total) = input.manifest.file_totals();
    let progress = ProgressTracker::new(input.observer, input.phase, files_total, bytes_total);
    let mut state = WalkState {
        report: RestoreReport::default(),
        cache: StatCache::new(),
        lost_paths: HashSet::new(),
        record_cache: input.record_cache,
    };
    let content = &input.content;
    let (jobs, queue) = std::sync::mpsc::sync_channel::<FileJob<'_>>(4 * WRITERS);
    let queue = Mutex::new(queue);
    let (done_tx, done) = std::sync::mpsc::channel::<(FileJob<'_>, Result<FileDone>)>();
    let mut hardlinks: Vec<&ManifestEntry> = Vec::new();
    let mut directories: Vec<(&ManifestEntry, u32)> = Vec::new();
    let mut file_hashes: HashMap<&str, Option<BlobHash>> = HashMap::new();

    let walked = std::thread::scope(|scope| {
        for _ in 0..WRITERS {
            let (queue, done_tx) = (&queue, done_tx.clone());
            scope.spawn(move || {
                let mut writer = Writer::default();
                loop {
                    let job = match queue.lock().unwrap_or_else(PoisonError::into_inner).recv() {
                        Ok(job) => job,
                        Err(_) => return,
                    };
                    let result = fill(content, &job, &mut writer);
                    if done_tx.send((job, result)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut cursor = ParentCursor::default();
        let walked = (|| {
            for entry in &input.manifest.entries {
                input
                    .signal
                    .throw_if_aborted()
                    .map_err(PersistenceError::Aborted)?;
                while let Ok((job, result)) = done.try_recv() {
                    state.settle(&job, result, &progress)?;
                }
                let unsafe_entry = || PersistenceError::UnsafeEntry(entry.path.clone());
                let (name, parent) = open_parent(&mut cursor, root.as_fd(), &entry.path)?;
                match entry.kind {
                    EntryKind::Directory => {
                        rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
                            .map_err(|error| create_error(&entry.path, error.into()))?;
                        directories.push((entry, entry.mode.unwrap_or(0o755)));
                        state.report.directories += 1;
                    }
                    EntryKind::Symlink => {
                        let target = entry.target.as_deref().ok_or_else(unsafe_entry)?;
                        rustix::fs::symlinkat(target, parent, name)
                            .map_err(|error| create_error(&entry.path, error.into()))?;
                        state.report.symlinks += 1;
                    }
                    // Validated: the target is a file entry listed before this one. Counted once made.
                    EntryKind::Hardlink => {
                        hardlinks.push(entry);
                        continue;
                    }
                    EntryKind::File => {
                        let (hash, Some(size)) = (entry.hash, entry.size) else {
                            return Err(unsafe_entry());
                        };
                        file_hashes.insert(&entry.path, hash);
                        let parent = parent
                            .try_clone_to_owned()
                            .ctx(|| format!("Cannot open the parent of {}", entry.path))?;
                        let job = FileJob {
                            entry,
                            name,
                            parent,
                            hash,
                            size,
                        };
                        if jobs.send(job).is_err() {
                            break;
                        }
                        // Counted once written (a lost file is no entry of the restore).
                        continue;
                    }
                }
                state.report.entries += 1;
            }
            Ok(())
        })();
        // The writers end once the queue is empty and closed; every file sent is settled.
        drop(jobs);
        let mut settled = walked;
        for (job, result) in done.iter() {
            let outcome = state.settle(&job, result, &progress);
            if settled.is_ok() {
                settled = outcome;
            }
        }
        settled
    });
    walked?;

    let mut cursor = ParentCursor::default();
    let mut link_cursor = ParentCursor::default();
    for entry in hardlinks {
        let unsafe_entry = || PersistenceError::UnsafeEntry(entry.path.clone());
        let (name, parent) = open_parent(&mut cursor, root.as_fd(), &entry.path)?;
        let target = entry.target.as_deref().ok_or_else(unsafe_entry)?;
        let hash = *file_hashes.get(target).ok_or_else(unsafe_entry)?;
        if let (Some(hash), true) = (hash, state.lost_paths.contains(target)) {
            state.report.lost.push(Damage {
                object: format!("blob {hash}"),
                path: Some(entry.path.clone()),
                problem: format!("a hard link to {target}, which is lost"),
            });
            state.lost_paths.insert(entry.path.clone());
            continue;
        }
        let (target_name, target_dir) =
            open_parent(&mut link_cursor, root.as_fd(), target).map_err(|_| unsafe_entry())?;
        rustix::fs::linkat(target_dir, target_name, parent, name, AtFlags::empty())
            .map_err(|error| create_error(&entry.path, error.into()))?;
        if let (Some(hash), true) = (hash, state.record_cache) {
            let stat =
                safe_fs::stat_at(parent, name).ctx(|| format!("Cannot stat {}", entry.path))?;
            state.cache.insert(entry.path.clone(), stat.key, hash);
        }
        state.report.hardlinks += 1;
        state.report.entries += 1;
    }

    // Recorded modes, deepest first, so a read-only parent is closed after its children.
    cursor.reset();
    for (entry, mode) in directories.iter().rev() {
        let parts = safe_fs::split_relative(&entry.path)
            .ok_or_else(|| PersistenceError::UnsafeEntry(entry.path.clone()))?;
        let Some((name, parents)) = parts.split_last() else {
            continue;
        };
        let parent = cursor
            .open(root.as_fd(), parents)
            .ctx(|| format!("Cannot open {}", entry.path))?;
        let dir =
            safe_fs::open_dir_at(parent, name).ctx(|| format!("Cannot open {}", entry.path))?;
        rustix::fs::fchmod(&dir, Mode::from_raw_mode(*mode & 0o777))
            .ctx(|| format!("Cannot chmod {}", entry.path))?;
    }

    let mut report = state.report;
    report.duration = started.elapsed();
    Ok((report, state.cache))
}

/// The name of `path` and its parent directory under `root`, opened through `cursor` one
/// component at a time without following a symlink; an entry whose parent cannot be
/// opened so is unsafe.
fn open_parent<'c, 'p>(
    cursor: &'c mut ParentCursor,
    root: BorrowedFd<'c>,
    path: &'p str,
) -> Result<(&'p str, BorrowedFd<'c>)> {
    let unsafe_entry = || PersistenceError::UnsafeEntry(path.to_owned());
    let parts = safe_fs::split_relative(path).ok_or_else(unsafe_entry)?;
    let Some((name, parents)) = parts.split_last() else {
        return Err(unsafe_entry());
    };
    // A failed open leaves the cursor empty: the next one starts from `root` again.
    let parent = cursor.open(root, parents).map_err(|_| unsafe_entry())?;
    Ok((name, parent))
}

/// What the walk learns from the writers.
struct WalkState {
    report: RestoreReport,
    cache: StatCache,
    lost_paths: HashSet<String>,
    record_cache: bool,
}

impl WalkState {
    /// Records a writer's result for `job`; a fatal error is returned.
    fn settle(
        &mut self,
        job: &FileJob<'_>,
        result: Result<FileDone>,
        progress: &ProgressTracker<'_>,
    ) -> Result<()> {
        let entry = job.entry;
        match result? {
            FileDone::Written(stat) => {
                if let (Some(stat), Some(hash), true) = (stat, job.hash, self.record_cache) {
                    self.cache.insert(entry.path.clone(), stat, hash);
                }
                self.report.entries += 1;
                self.report.files += 1;
                self.report.bytes += entry.stored_size();
            }
            FileDone::Lost(problem) => {
                self.report.lost.push(Damage {
                    object: job
                        .hash
                        .map(|hash| format!("blob {hash}"))
                        .unwrap_or_default(),
                    path: Some(entry.path.clone()),
                    problem,
                });
                self.lost_paths.insert(entry.path.clone());
            }
        }
        progress.advance(1, entry.stored_size());
        Ok(())
    }
}

/// A writer's work on one file: its content (see [`restore_file`] and [`copy_file`]), its
/// mode, its stat for the cache; a missing or damaged blob, with `tolerate_lost`, removes the
/// file instead.
fn fill(content: &Content<'_>, job: &FileJob<'_>, writer: &mut Writer) -> Result<FileDone> {
    let entry = job.entry;
    let parent = job.parent.as_fd();
    let (written, tolerate_lost) = match (content, job.hash) {
        (
            Content::Blobs {
                store,
                verify,
                tolerate_lost,
            },
            Some(hash),
        ) => (
            restore_file(
                store,
                *verify,
                parent,
                job.name,
                entry,
                hash,
                job.size,
                &mut writer.buffer,
            ),
            *tolerate_lost,
        ),
        (Content::Tree(root), _) => (
            copy_file(*root, job, &mut writer.source, &mut writer.buffer),
            false,
        ),
        (Content::Blobs { .. }, None) => {
            return Err(PersistenceError::UnsafeEntry(entry.path.clone()));
        }
    };
    let file = match written {
        Ok(file) => file,
        Err(
            error @ (PersistenceError::MissingContent { .. }
            | PersistenceError::CorruptContent { .. }),
        ) if tolerate_lost => {
            // A partly written file must not stay with wrong bytes.
            match rustix::fs::unlinkat(parent, job.name, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(unlink) => {
                    return Err(PersistenceError::io(
                        format!("Cannot remove the damaged {}", entry.path),
                        io::Error::from(unlink),
                    ));
                }
            }
            return Ok(FileDone::Lost(match error {
                PersistenceError::MissingContent { .. } => {
                    "the blob is not in the blob store".to_owned()
                }
                _ => "the blob's bytes do not match the manifest".to_owned(),
            }));
        }
        Err(error) => return Err(error),
    };
    rustix::fs::fchmod(
        &file,
        Mode::from_raw_mode(entry.mode.unwrap_or(0o644) & 0o777),
    )
    .ctx(|| format!("Cannot chmod {}", entry.path))?;
    // The cache holds hashes only; a sparse file is re-read at each checkpoint.
    let stat = if entry.extents.is_none() && job.hash.is_some() {
        Some(
            safe_fs::stat_fd(&file)
                .ctx(|| format!("Cannot stat {}", entry.path))?
                .key,
        )
    } else {
        None
    };
    Ok(FileDone::Written(stat))
}

fn create_error(path: &str, error: io::Error) -> PersistenceError {
    match error.kind() {
        io::ErrorKind::AlreadyExists | io::ErrorKind::NotFound => {
            PersistenceError::UnsafeEntry(path.to_owned())
        }
        _ if error.raw_os_error() == Some(rustix::io::Errno::LOOP.raw_os_error())
            || error.raw_os_error() == Some(rustix::io::Errno::NOTDIR.raw_os_error()) =>
        {
            PersistenceError::UnsafeEntry(path.to_owned())
        }
        _ => PersistenceError::io(format!("Cannot create {path}"), error),
    }
}

#[allow(clippy::too_many_arguments)]
fn restore_file(
    store: &BlobStore,
    verify: bool,
    parent: BorrowedFd<'_>,
    name: &str,
    entry: &ManifestEntry,
    hash: BlobHash,
    size: u64,
    buffer: &mut Vec<u8>,
) -> Result<std::fs::File> {
    let corrupt = || PersistenceError::CorruptContent {
        path: entry.path.clone(),
        blob: hash.to_hex(),
    };
    let mut blob = store
        .open(&hash)?
        .ok_or_else(|| PersistenceError::MissingContent {
            path: entry.path.clone(),
            blob: hash.to_hex(),
        })?;
    let blob_size = blob
        .metadata()
        .ctx(|| format!("Cannot stat blob {hash}"))?
        .len();
    if blob_size != entry.stored_size() {
        return Err(corrupt());
    }
    let file =
        safe_fs::create_file_at(parent, name).map_err(|error| create_error(&entry.path, error))?;
    if let Some(extents) = &entry.extents {
        let mut digest = verify.then(Sha256::new);
        buffer.resize(COPY_BUFFER, 0);
        let copied = sparse::write_extents(&mut blob, &file, extents, size, buffer, |chunk| {
            if let Some(digest) = digest.as_mut() {
                digest.update(chunk);
            }
        })
        .ctx(|| format!("Cannot write {}", entry.path))?;
        if copied != blob_size || digest.is_some_and(|digest| BlobHash::from_digest(digest) != hash)
        {
            return Err(corrupt());
        }
    } else {
        let mut digest = verify.then(Sha256::new);
        let mut writer = DirectWriter::new(&file, false);
        writer
            .write_from(&blob, blob_size >= DIRECT_READ, |chunk| {
                if let Some(digest) = digest.as_mut() {
                    digest.update(chunk);
                }
            })
            .ctx(|| format!("Cannot restore {} from blob {hash}", entry.path))?;
        let copied = writer
            .finish()
            .ctx(|| format!("Cannot write {}", entry.path))?;
        if copied != size || digest.is_some_and(|digest| BlobHash::from_digest(digest) != hash) {
            return Err(corrupt());
        }
    }
    Ok(file)
}

/// A seed's file: the walk's path under `root`, opened without following a symlink, must
/// still be the regular file of the size the walk saw and unchanged once copied (a sparse
/// one copied as its data regions); never more than one byte past that size is read.
fn copy_file(
    root: BorrowedFd<'_>,
    job: &FileJob<'_>,
    cursor: &mut ParentCursor,
    buffer: &mut Vec<u8>,
) -> Result<std::fs::File> {
    let path = &job.entry.path;
    let changed = || PersistenceError::EntryChanged(path.clone());
    let parts = safe_fs::split_relative(path).ok_or_else(changed)?;
    let Some((source_name, parents)) = parts.split_last() else {
        return Err(changed());
    };
    let source = cursor
        .open(root, parents)
        .and_then(|dir| safe_fs::open_file_at(dir, source_name))
        .map_err(|error| changed_or_io(path, error))?;
    let before = safe_fs::stat_fd(&source).ctx(|| format!("Cannot stat {path}"))?;
    if before.file_type != FileType::RegularFile || before.key.size != job.size {
        return Err(changed());
    }
    let file = safe_fs::create_file_at(job.parent.as_fd(), job.name)
        .map_err(|error| create_error(path, error))?;
    let extents = if before.allocated < job.size {
        sparse::data_extents(&source, job.size).ctx(|| format!("Cannot read {path}"))?
    } else {
        None
    };
    let (copied, expected) = match &extents {
        Some(extents) => {
            buffer.resize(COPY_BUFFER, 0);
            let mut reader = sparse::ExtentReader::new(&source, extents);
            let copied =
                sparse::write_extents(&mut reader, &file, extents, job.size, buffer, |_| {})
                    .ctx(|| format!("Cannot copy {path}"))?;
            (copied, extents.iter().map(|[_, length]| *length).sum())
        }
        None => {
            let copied = std::io::copy(
                &mut std::io::Read::take(&source, job.size.saturating_add(1)),
                &mut &file,
            )
            .ctx(|| format!("Cannot copy {path}"))?;
            (copied, job.size)
        }
    };
    let after = safe_fs::stat_fd(&source).ctx(|| format!("Cannot stat {path}"))?;
    if copied != expected || after.key != before.key {
        return Err(changed());
    }
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::CheckpointLimits;
    use crate::snapshot::list_tree;

    /// Lists `seed`, lets `change` alter it, then copies the listing into a fresh directory.
    fn seed_after(seed: &Path, change: impl FnOnce(&Path)) -> (tempfile::TempDir, Result<()>) {
        let (root, listing, _) =
            list_tree(seed, CheckpointLimits::default(), &AbortSignal::never()).unwrap();
        change(seed);
        let dest = tempfile::tempdir().unwrap();
        let result = restore(RestoreInput {
            content: Content::Tree(root.as_fd()),
            manifest: &listing,
            dest: dest.path(),
            record_cache: true,
            observer: None,
            phase: ProgressPhase::Seed,
            signal: &AbortSignal::never(),
        })
        .map(|_| ());
        (dest, result)
    }

    fn changed(result: Result<()>, path: &str) {
        match result {
            Err(PersistenceError::EntryChanged(changed)) => assert_eq!(changed, path),
            other => panic!("{path}: expected EntryChanged, got {other:?}"),
        }
    }

    #[test]
    fn a_seed_never_reads_through_a_directory_swapped_for_a_symlink_after_its_listing() {
        let seed = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir(seed.path().join("sub")).unwrap();
        std::fs::write(seed.path().join("sub/file"), b"seeded!").unwrap();
        std::fs::write(outside.path().join("file"), b"SECRET!").unwrap();
        let (dest, result) = seed_after(seed.path(), |seed| {
            std::fs::rename(seed.join("sub"), seed.join("moved")).unwrap();
            std::os::unix::fs::symlink(outside.path(), seed.join("sub")).unwrap();
        });
        changed(result, "sub/file");
        let copied = std::fs::read(dest.path().join("sub/file")).unwrap_or_default();
        assert!(!copied.starts_with(b"SECRET"), "read through the symlink");
    }

    #[test]
    fn a_seed_fails_on_a_file_that_changed_type_or_size_after_its_listing_and_never_blocks() {
        let seed = tempfile::tempdir().unwrap();
        std::fs::write(seed.path().join("empty"), b"").unwrap();
        let (_, result) = seed_after(seed.path(), |seed| {
            std::fs::remove_file(seed.join("empty")).unwrap();
            rustix::fs::mknodat(
                rustix::fs::CWD,
                seed.join("empty"),
                FileType::Fifo,
                Mode::from_raw_mode(0o644),
                0,
            )
            .unwrap();
        });
        changed(result, "empty");

        let seed = tempfile::tempdir().unwrap();
        std::fs::write(seed.path().join("grows"), b"short").unwrap();
        let (_, result) = seed_after(seed.path(), |seed| {
            std::fs::write(seed.join("grows"), vec![7u8; 3 << 20]).unwrap();
        });
        changed(result, "grows");

        let seed = tempfile::tempdir().unwrap();
        std::fs::write(seed.path().join("same-size"), b"before").unwrap();
        let (dest, result) = seed_after(seed.path(), |seed| {
            std::fs::write(seed.join("same-size"), b"after!").unwrap();
        });
        result.unwrap();
        assert_eq!(
            std::fs::read(dest.path().join("same-size")).unwrap(),
            b"after!"
        );
    }
}
