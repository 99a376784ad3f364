//! Capturing a directory tree into the blob store (the blocking half of `checkpoint`).
//!
//! 1. Walk the tree with directory fds, never following a symlink, names sorted by bytes:
//!    directories, regular files and symlinks become entries; FIFOs, sockets, devices,
//!    non-UTF-8 names and the contents of directories nested deeper than `MAX_DEPTH` are
//!    skipped and reported (`skipped`), never fatal.
//! 2. Resolve each file's hash: from the stat cache when its stat is unchanged and its blob is
//!    still stored (no read at all), else by reading it on a small thread pool. A file is
//!    read through an fd, with `fstat` before and after: if the stat moved while we read, the
//!    read is retried, and after three attempts the checkpoint fails rather than record a torn
//!    file. A file that no longer exists when it is opened (deleted after the walk saw it, by
//!    a process still running in the sandbox) is left out and counted (`vanished`), as if
//!    the walk had come after the deletion; a hard link to it fails the checkpoint instead.
//! 3. Store the manifest blob. Nothing is published here: a failure anywhere leaves the
//!    previously published candidate (and every blob it names) untouched.
//!
//! The blob store's shared lock is held from the first stat-cache reuse to the stored
//! manifest, so a concurrent `gc` cannot delete a reused blob in between.

use crate::blob::{BlobStore, COPY_BUFFER, DirSync};
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::BlobHash;
use crate::limits::CheckpointLimits;
use crate::manifest::{ManifestEntry, WorkspaceManifest};
use crate::progress::{ProgressObserver, ProgressPhase, ProgressTracker};
use crate::safe_fs::{self, EntryStat, ParentCursor, StatKey};
use crate::skipped::{SkipReason, SkippedEntries};
use crate::sparse::{self, ExtentReader};
use crate::stat_cache::StatCache;
use crate::walk::{Descend, WalkLimits};
use omabox_contract::AbortSignal;
use rustix::fs::FileType;
use rustix::io::Errno;
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Files up to this size are read into memory, hashed, and written only if their blob is new.
/// Larger files are hashed in a first pass and, only when new, copied while hashed again.
const IN_MEMORY_LIMIT: u64 = 8 << 20;
/// Attempts at reading a file that keeps changing under us.
const READ_ATTEMPTS: usize = 3;

/// Counters of one checkpoint, for logs, tests and the benchmark.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckpointReport {
    /// Manifest entries.
    pub entries: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub directories: u64,
    /// Symlinks.
    pub symlinks: u64,
    /// Hard links to a file listed earlier (stored once).
    pub hardlinks: u64,
    /// Files stored as their data regions only.
    pub sparse_files: u64,
    /// Total size of all file blobs (the data regions of sparse files).
    pub bytes: u64,
    /// Files whose hash came from the stat cache (not read).
    pub cache_hits: u64,
    /// Files read and hashed.
    pub files_hashed: u64,
    /// Bytes read and hashed.
    pub bytes_hashed: u64,
    /// File-content blobs newly written to the store.
    pub blobs_stored: u64,
    /// Bytes of those blobs.
    pub bytes_stored: u64,
    /// True when the manifest blob was new.
    pub manifest_stored: bool,
    /// True when the candidate was returned from an earlier call with the same key.
    pub reused_candidate: bool,
    /// Entries left out (special files, non-UTF-8 names, too deep); see `skipped`.
    pub skipped: SkippedEntries,
    /// Files deleted between the walk and their read (by a process still running in the
    /// sandbox, say): left out, as if the walk had come after the deletion.
    pub vanished: u64,
    /// Wall time.
    pub duration: Duration,
}

/// Inputs of [`snapshot`].
pub(crate) struct SnapshotInput<'a> {
    pub store: &'a BlobStore,
    pub limits: CheckpointLimits,
    pub root: &'a Path,
    pub cache: Option<&'a StatCache>,
    pub racy_margin: Duration,
    pub threads: usize,
    pub observer: Option<&'a dyn ProgressObserver>,
    pub phase: ProgressPhase,
    pub signal: &'a AbortSignal,
}

/// A captured tree.
pub(crate) struct Snapshot {
    pub manifest_hash: BlobHash,
    pub cache: StatCache,
    pub report: CheckpointReport,
}

enum Walked {
    Directory { path: String, mode: u32 },
    File { path: String, stat: EntryStat },
    Symlink { path: String, target: String },
    Hardlink { path: String, target: String },
}

struct Hashed {
    hash: BlobHash,
    /// Logical size.
    size: u64,
    /// Data regions of a sparse file (the blob holds only them).
    extents: Option<Vec<[u64; 2]>>,
    /// Bytes of the blob.
    stored_size: u64,
    mode: u32,
    stat: StatKey,
    observed_ns: i64,
    stored: bool,
}

/// Walks `input.root` and stores its content and manifest.
pub(crate) fn snapshot(input: SnapshotInput<'_>) -> Result<Snapshot> {
    let started = Instant::now();
    let root_fd =
        safe_fs::open_root(input.root).ctx(|| format!("Cannot open {}", input.root.display()))?;
    let mut walk = Walk {
        out: Vec::new(),
        skipped: SkippedEntries::default(),
        signal: input.signal,
        limits: input.limits,
        inodes: HashMap::new(),
        estimated_bytes: 0,
    };
    walk_tree(
        root_fd
            .try_clone()
            .ctx(|| format!("Cannot open {}", input.root.display()))?,
        &mut walk,
    )?;
    let Walk {
        out: walked,
        skipped,
        ..
    } = walk;

    let _lock = input.store.lock_shared()?;
    let mut report = CheckpointReport {
        skipped,
        ..CheckpointReport::default()
    };
    let (files_total, bytes_total) =
        walked
            .iter()
            .fold((0, 0), |(files, bytes), entry| match entry {
                Walked::File { stat, .. } => (files + 1, bytes + stat.key.size),
                _ => (files, bytes),
            });
    let progress = ProgressTracker::new(input.observer, input.phase, files_total, bytes_total);
    let mut new_cache = StatCache::new();
    let mut resolved: Vec<Option<Hashed>> = Vec::with_capacity(walked.len());
    let mut todo = Vec::new();
    for (index, entry) in walked.iter().enumerate() {
        let mut hit = None;
        if let (Walked::File { path, stat }, Some(cache)) = (entry, input.cache)
            && let Some(hash) = cache.lookup(path, &stat.key)
            && input.store.refresh_existing(&hash, stat.key.size)?
        {
            new_cache.insert(path.clone(), stat.key, hash);
            report.cache_hits += 1;
            progress.advance(1, stat.key.size);
            hit = Some(Hashed {
                hash,
                size: stat.key.size,
                extents: None,
                stored_size: stat.key.size,
                mode: stat.mode,
                stat: stat.key,
                observed_ns: 0,
                stored: false,
            });
        } else if matches!(entry, Walked::File { .. }) {
            todo.push(index);
        }
        resolved.push(hit);
    }

    let margin = i64::try_from(input.racy_margin.as_nanos()).unwrap_or(i64::MAX);
    let dirs = DirSync::default();
    let reused: u64 = resolved.iter().flatten().map(|hit| hit.stored_size).sum();
    let budget = ByteBudget {
        used: AtomicU64::new(reused),
        limits: input.limits,
    };
    let hashed_files = hash_files(
        &input,
        root_fd.as_fd(),
        &walked,
        &todo,
        &progress,
        &dirs,
        &budget,
    )?;
    input.store.sync_dirs(&dirs)?;
    let mut vanished = HashSet::new();
    for (index, hashed) in hashed_files {
        let Some(hashed) = hashed else {
            if let Walked::File { path, .. } = &walked[index] {
                vanished.insert(path.clone());
            }
            continue;
        };
        report.files_hashed += 1;
        report.bytes_hashed += hashed.stored_size;
        if hashed.stored {
            report.blobs_stored += 1;
            report.bytes_stored += hashed.stored_size;
        }
        // The cache holds hashes only, so a sparse file (whose blob also needs its regions)
        // is re-read at every checkpoint; reading it costs only its data.
        if let Walked::File { path, .. } = &walked[index]
            && hashed.extents.is_none()
            && hashed.stat.ctime_ns.saturating_add(margin) < hashed.observed_ns
        {
            new_cache.insert(path.clone(), hashed.stat, hashed.hash);
        }
        resolved[index] = Some(hashed);
    }

    let mut entries = Vec::with_capacity(walked.len());
    for (entry, hashed) in walked.into_iter().zip(resolved) {
        entries.push(match (entry, hashed) {
            (Walked::Directory { path, mode }, _) => {
                report.directories += 1;
                ManifestEntry::directory(path, mode)
            }
            (Walked::Symlink { path, target }, _) => {
                report.symlinks += 1;
                ManifestEntry::symlink(path, target)
            }
            // A link to a file that vanished would point at no entry: the tree changed.
            (Walked::Hardlink { path, target }, _) if vanished.contains(&target) => {
                return Err(PersistenceError::EntryChanged(path));
            }
            (Walked::Hardlink { path, target }, _) => {
                report.hardlinks += 1;
                ManifestEntry::hardlink(path, target)
            }
            (Walked::File { path, .. }, Some(hashed)) => {
                report.files += 1;
                report.bytes += hashed.stored_size;
                let mut entry = ManifestEntry::file(path, hashed.mode, hashed.size, hashed.hash);
                if hashed.extents.is_some() {
                    report.sparse_files += 1;
                }
                entry.extents = hashed.extents;
                entry
            }
            (Walked::File { path, .. }, None) => {
                debug_assert!(vanished.contains(&path));
                report.vanished += 1;
                continue;
            }
        });
    }
    report.entries = entries.len() as u64;
    input.limits.check_bytes(report.bytes)?;
    input
        .signal
        .throw_if_aborted()
        .map_err(PersistenceError::Aborted)?;
    let manifest = WorkspaceManifest {
        version: WorkspaceManifest::version_for(&entries),
        entries,
    };
    let stored = input.store.put_bytes_locked(&manifest.to_bytes(), None)?;
    report.manifest_stored = stored.stored;
    report.duration = started.elapsed();
    Ok(Snapshot {
        manifest_hash: stored.hash,
        cache: new_cache,
        report,
    })
}

/// Lists the tree under `root` as a manifest of unhashed files, for a seed to copy (`restore`
/// with `Content::Tree`, from the returned fd of `root`): the same walk, rules and limits as a
/// checkpoint's, nothing read or stored.
pub(crate) fn list_tree(
    root: &Path,
    limits: CheckpointLimits,
    signal: &AbortSignal,
) -> Result<(OwnedFd, WorkspaceManifest, SkippedEntries)> {
    let open = || safe_fs::open_root(root).ctx(|| format!("Cannot open {}", root.display()));
    let mut walk = Walk {
        out: Vec::new(),
        skipped: SkippedEntries::default(),
        signal,
        limits,
        inodes: HashMap::new(),
        estimated_bytes: 0,
    };
    walk_tree(open()?, &mut walk)?;
    let entries: Vec<ManifestEntry> = walk
        .out
        .into_iter()
        .map(|entry| match entry {
            Walked::Directory { path, mode } => ManifestEntry::directory(path, mode),
            Walked::File { path, stat } => {
                ManifestEntry::listed_file(path, stat.mode, stat.key.size)
            }
            Walked::Symlink { path, target } => ManifestEntry::symlink(path, target),
            Walked::Hardlink { path, target } => ManifestEntry::hardlink(path, target),
        })
        .collect();
    let manifest = WorkspaceManifest {
        version: WorkspaceManifest::version_for(&entries),
        entries,
    };
    Ok((open()?, manifest, walk.skipped))
}

/// Walks the tree into `walk`: see the module doc for what is kept and what is skipped.
fn walk_tree(root: OwnedFd, walk: &mut Walk<'_>) -> Result<()> {
    let limits = WalkLimits {
        max_entries: walk.limits.max_entries,
        too_many: |limit| PersistenceError::CheckpointEntryLimit { limit },
    };
    crate::walk::walk(root, "workspace", limits, |visit| {
        walk.signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        let (Some(name), Some(stat)) = (visit.name, visit.stat) else {
            walk.skipped.push(&visit.path, SkipReason::NotUtf8);
            return Ok(Descend::No);
        };
        let path = visit.path;
        match stat.file_type {
            FileType::Directory => {
                walk.push(Walked::Directory {
                    path: path.clone(),
                    mode: stat.mode,
                })?;
                // Entries below this directory would be more than MAX_DEPTH segments deep.
                if visit.depth >= safe_fs::MAX_DEPTH {
                    walk.skipped.push(&path, SkipReason::TooDeep);
                    return Ok(Descend::No);
                }
                return Ok(Descend::Yes);
            }
            FileType::RegularFile => {
                // Another name of an inode already listed is a link, stored once.
                if stat.nlink > 1 {
                    let inode = (stat.key.dev, stat.key.ino);
                    if let Some(target) = walk.inodes.get(&inode) {
                        let target = target.clone();
                        walk.push(Walked::Hardlink { path, target })?;
                        return Ok(Descend::No);
                    }
                    walk.inodes.insert(inode, path.clone());
                }
                // What the blob store will hold: the allocated bytes of a sparse file.
                walk.estimated_bytes = walk
                    .estimated_bytes
                    .saturating_add(stat.key.size.min(stat.allocated.max(1)));
                walk.limits.check_bytes(walk.estimated_bytes)?;
                walk.push(Walked::File { path, stat })?;
            }
            FileType::Symlink => {
                let target = rustix::fs::readlinkat(visit.dir, name, Vec::new())
                    .map_err(|error| changed_or_io(&path, error.into()))?;
                match target.into_string() {
                    Ok(target) => walk.push(Walked::Symlink { path, target })?,
                    Err(_) => walk.skipped.push(&path, SkipReason::NotUtf8),
                }
            }
            other => walk.skipped.push(&path, special_reason(other)),
        }
        Ok(Descend::No)
    })
}

/// Why a file type that is not a directory, regular file or symlink is skipped.
pub(crate) fn special_reason(file_type: FileType) -> SkipReason {
    match file_type {
        FileType::Fifo => SkipReason::Fifo,
        FileType::Socket => SkipReason::Socket,
        _ => SkipReason::Device,
    }
}

/// The state of one walk.
struct Walk<'a> {
    out: Vec<Walked>,
    skipped: SkippedEntries,
    signal: &'a AbortSignal,
    limits: CheckpointLimits,
    /// The first path of every multiply-linked inode.
    inodes: HashMap<(u64, u64), String>,
    /// Blob bytes the files so far need, from their stat.
    estimated_bytes: u64,
}

impl Walk<'_> {
    /// Adds an entry, failing once the entry limit is passed (before memory grows further).
    fn push(&mut self, walked: Walked) -> Result<()> {
        self.limits.check_entries(self.out.len() as u64 + 1)?;
        self.out.push(walked);
        Ok(())
    }
}

/// An error from opening an entry the walk just saw: a vanished or retyped entry means the
/// tree changed under us.
pub(crate) fn changed_or_io(path: &str, error: io::Error) -> PersistenceError {
    match error.raw_os_error().map(Errno::from_raw_os_error) {
        Some(Errno::NOENT | Errno::LOOP | Errno::NOTDIR) => {
            PersistenceError::EntryChanged(path.to_owned())
        }
        _ => PersistenceError::io(format!("Cannot open {path}"), error),
    }
}

/// Each file read, by its index in the walk; `None`: it vanished before it could be read.
type HashedFiles = Vec<(usize, Option<Hashed>)>;

/// Bytes the checkpoint's files need in the blob store, reserved before each file is read so
/// that no file (however its stat lied to the walk's estimate) is stored past the byte limit.
struct ByteBudget {
    used: AtomicU64,
    limits: CheckpointLimits,
}

impl ByteBudget {
    fn reserve(&self, bytes: u64) -> Result<()> {
        let total = self
            .used
            .fetch_add(bytes, Ordering::Relaxed)
            .saturating_add(bytes);
        if let Err(error) = self.limits.check_bytes(total) {
            self.release(bytes);
            return Err(error);
        }
        Ok(())
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

fn hash_files(
    input: &SnapshotInput<'_>,
    root: BorrowedFd<'_>,
    walked: &[Walked],
    todo: &[usize],
    progress: &ProgressTracker<'_>,
    dirs: &DirSync,
    budget: &ByteBudget,
) -> Result<HashedFiles> {
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let worker = || -> Result<HashedFiles> {
        let mut cursor = ParentCursor::default();
        let mut done = Vec::new();
        loop {
            let slot = next.fetch_add(1, Ordering::Relaxed);
            if slot >= todo.len() || failed.load(Ordering::Relaxed) {
                return Ok(done);
            }
            let index = todo[slot];
            let Walked::File { path, .. } = &walked[index] else {
                continue;
            };
            let result = input
                .signal
                .throw_if_aborted()
                .map_err(PersistenceError::Aborted)
                .and_then(|()| hash_file(input.store, root, &mut cursor, path, dirs, budget));
            match result {
                Ok(hashed) => {
                    progress.advance(1, hashed.as_ref().map_or(0, |hashed| hashed.size));
                    done.push((index, hashed));
                }
                Err(error) => {
                    failed.store(true, Ordering::Relaxed);
                    return Err(error);
                }
            }
        }
    };
    let threads = input.threads.clamp(1, 16).min(todo.len().max(1));
    if threads == 1 {
        return worker();
    }
    let results: Vec<Result<HashedFiles>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads).map(|_| scope.spawn(worker)).collect();
        handles
            .into_iter()
            .map(|handle| {
                handle.join().unwrap_or_else(|_| {
                    Err(PersistenceError::io(
                        "Checkpoint worker failed",
                        io::Error::other("panicked"),
                    ))
                })
            })
            .collect()
    });
    let mut all = Vec::with_capacity(todo.len());
    for result in results {
        all.extend(result?);
    }
    Ok(all)
}

/// Reads one file through an fd opened without following links, storing its content;
/// `None` when it (or a directory above it) no longer exists.
fn hash_file(
    store: &BlobStore,
    root: BorrowedFd<'_>,
    cursor: &mut ParentCursor,
    path: &str,
    dirs: &DirSync,
    budget: &ByteBudget,
) -> Result<Option<Hashed>> {
    let gone = |error: &io::Error| error.raw_os_error() == Some(Errno::NOENT.raw_os_error());
    let parts: Vec<&str> = path.split('/').collect();
    let Some((name, parents)) = parts.split_last() else {
        return Err(PersistenceError::EntryChanged(path.to_owned()));
    };
    for _ in 0..READ_ATTEMPTS {
        let dir = match cursor.open(root, parents) {
            Ok(dir) => dir,
            Err(error) => {
                cursor.reset();
                return if gone(&error) {
                    Ok(None)
                } else {
                    Err(changed_or_io(path, error))
                };
            }
        };
        let file = match safe_fs::open_file_at(dir, name) {
            Ok(file) => file,
            Err(error) if gone(&error) => return Ok(None),
            Err(error) => return Err(changed_or_io(path, error)),
        };
        let observed_ns = safe_fs::now_ns();
        let before = safe_fs::stat_fd(&file).ctx(|| format!("Cannot stat {path}"))?;
        if before.file_type != FileType::RegularFile {
            return Err(PersistenceError::EntryChanged(path.to_owned()));
        }
        let extents = if before.allocated < before.key.size {
            sparse::data_extents(&file, before.key.size).ctx(|| format!("Cannot read {path}"))?
        } else {
            None
        };
        let needed = extents.as_ref().map_or(before.key.size, |extents| {
            extents.iter().map(|[_, length]| *length).sum()
        });
        budget.reserve(needed)?;
        let stored = match &extents {
            Some(extents) => {
                let outcome =
                    store.put_reader_locked(ExtentReader::new(&file, extents), Some(dirs))?;
                let expected: u64 = extents.iter().map(|[_, length]| *length).sum();
                (outcome.size == expected).then_some((outcome.hash, outcome.size, outcome.stored))
            }
            None => store_content(store, &file, before.key.size, path, dirs)?
                .filter(|(_, size, _)| *size == before.key.size),
        };
        let Some((hash, stored_size, stored)) = stored else {
            budget.release(needed);
            continue;
        };
        let after = safe_fs::stat_fd(&file).ctx(|| format!("Cannot stat {path}"))?;
        if after.key != before.key {
            budget.release(needed);
            continue;
        }
        return Ok(Some(Hashed {
            hash,
            size: before.key.size,
            extents,
            stored_size,
            mode: before.mode,
            stat: before.key,
            observed_ns,
            stored,
        }));
    }
    Err(PersistenceError::EntryChanged(path.to_owned()))
}

/// Stores the content of `file`; `None` when it changed between the two passes of a large file.
fn store_content(
    store: &BlobStore,
    file: &std::fs::File,
    size_hint: u64,
    path: &str,
    dirs: &DirSync,
) -> Result<Option<(BlobHash, u64, bool)>> {
    if size_hint <= IN_MEMORY_LIMIT {
        let mut bytes = Vec::with_capacity(usize::try_from(size_hint).unwrap_or(0) + 1);
        file.take(IN_MEMORY_LIMIT + 1)
            .read_to_end(&mut bytes)
            .ctx(|| format!("Cannot read {path}"))?;
        let outcome = store.put_bytes_locked(&bytes, Some(dirs))?;
        return Ok(Some((outcome.hash, outcome.size, outcome.stored)));
    }
    // Never read past the size the file had when opened (plus one byte, to notice growth): a
    // file a sandbox keeps appending to cannot grow host memory, CPU or the blob store.
    let bound = size_hint.saturating_add(1);
    let mut reader = file.take(bound);
    // First pass: hash only, so content already stored is never copied again.
    let mut digest = Sha256::new();
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut size = 0u64;
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(PersistenceError::io(format!("Cannot read {path}"), error)),
        };
        digest.update(&buffer[..read]);
        size += read as u64;
    }
    let hash = BlobHash::from_digest(digest);
    if store.refresh_existing(&hash, size)? {
        return Ok(Some((hash, size, false)));
    }
    // Second pass: copy while hashing; the blob's name is what was actually copied.
    let mut file = file;
    std::io::Seek::seek(&mut file, std::io::SeekFrom::Start(0))
        .ctx(|| format!("Cannot rewind {path}"))?;
    let outcome = store.put_reader_locked(file.take(bound), Some(dirs))?;
    if outcome.hash != hash || outcome.size != size {
        return Ok(None);
    }
    Ok(Some((outcome.hash, outcome.size, outcome.stored)))
}
