//! A content-addressed blob store on the local filesystem.
//!
//! Layout under `<data-dir>/blobs/` (or the directory [`BlobStore::at`] is given: `--blob-dir`,
//! which several hosts may share):
//!
//! ```text
//! sha256/<first 2 hex>/<64 hex>   one immutable blob; its bytes hash to its name
//! tmp/put-<pid>-<n>-<nanos>-h<host>  a put in progress (same filesystem, so the final step is
//!                                 a link; `<host>` names the machine: `blob_temp`)
//! .lock                           flock: puts hold it shared, gc holds it exclusive
//! collect.lock                    flock: runs hold it shared, a short-grace gc exclusive
//!                                 (see `collection`)
//! ```
//!
//! Invariants:
//! - **A blob's bytes always hash to its name.** Content is hashed while it is copied into a
//!   temp file, the temp file is made durable, and only then hard-linked to its name (a
//!   no-clobber publish); a crash leaves at most a stray temp file. A single put fsyncs its
//!   temp file (`fdatasync`) and then its shard directory. A batch (a checkpoint's or an
//!   output finalization's puts, [`DirSync`]) names nothing until its end: then its temp
//!   files are fdatasynced sixteen at a time (the journal commits concurrent syncs together;
//!   50,000 small files synced one by one as they were written were 50,000 commits), linked
//!   to their names, and the shard directories fsynced — all before the manifest naming the
//!   batch is stored. (Not `syncfs`: it would also write out whatever else is dirty on the
//!   filesystem, a whole workspace the sandbox just wrote.)
//! - **Write-once.** An existing blob is never rewritten unless it is proven corrupt — its
//!   size, or, for content put from memory (files up to 8 MiB, manifests), its bytes compared
//!   with the content in hand — in which case the verified temp file atomically replaces it.
//!   A larger blob altered at its size is found by restore and `omabox fsck` only.
//! - **GC never removes a referenced blob, nor one a concurrent writer relies on.** `gc` takes
//!   the exclusive lock, so it never runs while a put or a checkpoint (which holds the shared
//!   lock for its whole duration) is between "the blob exists" and "the manifest naming it is
//!   stored". Blobs named only by a stored-but-unpublished candidate are protected by the grace
//!   period: every put (and every checkpoint reuse of a blob) refreshes the blob's mtime when
//!   it is older than half the grace period, and `gc` keeps every blob younger than the grace
//!   period. So a candidate must be published within `gc_grace / 2` of its checkpoint — with
//!   the default of one hour, thirty minutes — or be recomputed. A collection with a shorter
//!   grace protects no candidate by age: it must hold the collection lock exclusively, which
//!   no run holds meanwhile (see `collection`).
//!
//! Every method blocks; async callers run them on `spawn_blocking`.

pub(crate) use crate::batch::DirSync;
use crate::batch::PendingPut;
use crate::direct::DirectWriter;
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::BlobHash;
use rustix::fs::{FlockOperation, Timestamps};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

/// While puts are in flight, a temp file whose writer is gone must also be this old before
/// [`BlobStore::remove_abandoned_temps`] removes it (a writer in another pid namespace).
pub const TEMP_GRACE: Duration = Duration::from_secs(600);

/// Copy buffer size for streaming puts and restores.
pub(crate) const COPY_BUFFER: usize = 1 << 20;

/// Tunables of a [`BlobStore`].
#[derive(Debug, Clone)]
pub struct BlobStoreOptions {
    /// Unreferenced blobs younger than this survive `gc` (see the module doc). Default 1 h.
    pub gc_grace: Duration,
    /// fsync blobs and their directories before they are named. Default true; only tests
    /// and benchmarks on throwaway data turn it off.
    pub fsync: bool,
}

impl Default for BlobStoreOptions {
    fn default() -> Self {
        Self {
            gc_grace: Duration::from_secs(3600),
            fsync: true,
        }
    }
}

/// What a put did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutOutcome {
    /// The content's hash (the blob's name).
    pub hash: BlobHash,
    /// The content's size.
    pub size: u64,
    /// True when this put created the blob; false when it was already stored.
    pub stored: bool,
}

/// What a garbage collection did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Blobs looked at.
    pub scanned: u64,
    /// Blobs kept because they are referenced.
    pub kept_referenced: u64,
    /// Unreferenced blobs kept because they are younger than the grace period.
    pub kept_recent: u64,
    /// Blobs removed.
    pub removed: u64,
    /// Bytes of the removed blobs.
    pub removed_bytes: u64,
    /// Abandoned temp files (older than the grace period) removed.
    pub temp_removed: u64,
}

/// The content-addressed store. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct BlobStore {
    root: PathBuf,
    options: BlobStoreOptions,
    temp_counter: AtomicU64,
}

/// Holds the store's lock (shared or exclusive) until dropped.
#[derive(Debug)]
pub(crate) struct BlobLock {
    _file: File,
}

impl BlobStore {
    /// Opens (creating if needed) the store under `<data_dir>/blobs`.
    pub fn new(data_dir: &Path) -> Result<Self> {
        Self::with_options(data_dir, BlobStoreOptions::default())
    }

    /// Opens the store with explicit options.
    pub fn with_options(data_dir: &Path, options: BlobStoreOptions) -> Result<Self> {
        Self::at_with_options(&data_dir.join("blobs"), options)
    }

    /// Opens (creating if needed) the store in the directory `root` itself (`--blob-dir`: a
    /// directory several hosts may share).
    pub fn at(root: &Path) -> Result<Self> {
        Self::at_with_options(root, BlobStoreOptions::default())
    }

    /// [`BlobStore::at`] with explicit options.
    pub fn at_with_options(root: &Path, options: BlobStoreOptions) -> Result<Self> {
        let root = root.to_path_buf();
        for dir in [root.join("sha256"), root.join("tmp")] {
            std::fs::create_dir_all(&dir).ctx(|| format!("Cannot create {}", dir.display()))?;
        }
        Ok(Self {
            root,
            options,
            temp_counter: AtomicU64::new(0),
        })
    }

    /// `<data-dir>/blobs`.
    pub(crate) fn root(&self) -> &Path {
        &self.root
    }

    /// The store's options.
    pub fn options(&self) -> &BlobStoreOptions {
        &self.options
    }

    /// Where the blob `hash` lives (whether or not it exists).
    pub fn path_of(&self, hash: &BlobHash) -> PathBuf {
        let hex = hash.to_hex();
        self.root.join("sha256").join(&hex[..2]).join(hex)
    }

    /// True when the blob is stored.
    pub fn exists(&self, hash: &BlobHash) -> Result<bool> {
        let path = self.path_of(hash);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => Ok(meta.is_file()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(error) => Err(PersistenceError::io(
                format!("Cannot stat {}", path.display()),
                error,
            )),
        }
    }

    /// Opens a blob for reading, or `None` when it is not stored. The bytes are not verified;
    /// use [`BlobStore::get`] for small blobs that must be.
    pub fn open(&self, hash: &BlobHash) -> Result<Option<File>> {
        let path = self.path_of(hash);
        match File::open(&path) {
            Ok(file) => Ok(Some(file)),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(PersistenceError::io(
                format!("Cannot open {}", path.display()),
                error,
            )),
        }
    }

    /// Reads a whole blob and verifies it hashes to its name; `None` when it is not stored.
    pub fn get(&self, hash: &BlobHash) -> Result<Option<Vec<u8>>> {
        let Some(mut file) = self.open(hash)? else {
            return Ok(None);
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .ctx(|| format!("Cannot read blob {hash}"))?;
        if BlobHash::of(&bytes) != *hash {
            return Err(PersistenceError::CorruptBlob(hash.to_hex()));
        }
        Ok(Some(bytes))
    }

    /// Stores `bytes`. Content already stored is not written again (its mtime is refreshed).
    pub fn put_bytes(&self, bytes: &[u8]) -> Result<PutOutcome> {
        let _lock = self.lock_shared()?;
        self.put_bytes_locked(bytes, None)
    }

    /// Stores everything `reader` yields, hashing while copying.
    pub fn put_reader(&self, reader: impl Read) -> Result<PutOutcome> {
        let _lock = self.lock_shared()?;
        self.put_reader_locked(reader, None)
    }

    /// Stores the regular file at `path` (a symlink there is refused, not followed).
    pub fn put_file(&self, path: &Path) -> Result<PutOutcome> {
        let file = rustix::fs::openat(
            rustix::fs::CWD,
            path,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::NOFOLLOW
                | rustix::fs::OFlags::NONBLOCK
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .ctx(|| format!("Cannot open {}", path.display()))?;
        let file = File::from(file);
        let meta = file
            .metadata()
            .ctx(|| format!("Cannot stat {}", path.display()))?;
        if !meta.is_file() {
            return Err(PersistenceError::io(
                format!("Cannot store {}", path.display()),
                io::Error::other("not a regular file"),
            ));
        }
        self.put_reader(file)
    }

    /// Removes every blob that is not in `referenced` and is older than the grace period, and
    /// abandoned temp files. Waits for in-flight puts and checkpoints to finish first.
    pub fn gc(&self, referenced: &HashSet<BlobHash>) -> Result<GcReport> {
        let _lock = self.lock(FlockOperation::LockExclusive)?;
        let mut report = GcReport::default();
        let cutoff = SystemTime::now()
            .checked_sub(self.options.gc_grace)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let shards = self.root.join("sha256");
        for shard in read_dir_sorted(&shards)? {
            let Ok(meta) = std::fs::symlink_metadata(&shard) else {
                continue;
            };
            if !meta.is_dir() {
                continue;
            }
            for blob in read_dir_sorted(&shard)? {
                let name = blob
                    .file_name()
                    .and_then(|name| name.to_str())
                    .unwrap_or("");
                let Some(hash) = BlobHash::from_hex(name) else {
                    continue;
                };
                report.scanned += 1;
                if referenced.contains(&hash) {
                    report.kept_referenced += 1;
                    continue;
                }
                let meta = match std::fs::symlink_metadata(&blob) {
                    Ok(meta) => meta,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
                    Err(error) => {
                        return Err(PersistenceError::io(
                            format!("Cannot stat {}", blob.display()),
                            error,
                        ));
                    }
                };
                if meta.modified().map(|time| time > cutoff).unwrap_or(true) {
                    report.kept_recent += 1;
                    continue;
                }
                match std::fs::remove_file(&blob) {
                    Ok(()) => {
                        report.removed += 1;
                        report.removed_bytes += meta.size();
                        crate::fault::point("gc-blob-removed");
                    }
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => {
                        return Err(PersistenceError::io(
                            format!("Cannot remove {}", blob.display()),
                            error,
                        ));
                    }
                }
            }
            // An empty shard directory is harmless; removing it races with nothing because
            // puts hold the shared lock while they create shards.
            let _ = std::fs::remove_dir(&shard);
        }
        for temp in read_dir_sorted(&self.root.join("tmp"))? {
            let stale = std::fs::symlink_metadata(&temp)
                .and_then(|meta| meta.modified())
                .map(|time| time <= cutoff)
                .unwrap_or(false);
            if stale && std::fs::remove_file(&temp).is_ok() {
                report.temp_removed += 1;
            }
        }
        Ok(report)
    }

    /// Removes the temp files of puts that can no longer finish: this machine's all when no
    /// put is in flight (the exclusive lock is free: every put holds the shared lock from its
    /// temp file's creation to its removal), otherwise those whose writer pid (in the name) is
    /// gone and that are older than [`TEMP_GRACE`]; another machine's (a shared `--blob-dir`)
    /// only once older than [`TEMP_GRACE`]. Never waits for the lock, so it is cheap enough to
    /// run before every `omabox run`. Returns how many were removed.
    pub fn remove_abandoned_temps(&self) -> Result<u64> {
        let path = self.root.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx(|| format!("Cannot open {}", path.display()))?;
        let idle = rustix::fs::flock(&file, FlockOperation::NonBlockingLockExclusive).is_ok();
        let cutoff = SystemTime::now()
            .checked_sub(TEMP_GRACE)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let mut removed = 0;
        for temp in read_dir_sorted(&self.root.join("tmp"))? {
            let old = || {
                std::fs::symlink_metadata(&temp)
                    .and_then(|meta| meta.modified())
                    .is_ok_and(|time| time <= cutoff)
            };
            let abandoned = match crate::blob_temp::writer(&temp) {
                crate::blob_temp::Writer::Elsewhere => old(),
                crate::blob_temp::Writer::Here(pid) => {
                    idle || (!Path::new(&format!("/proc/{pid}")).exists() && old())
                }
                crate::blob_temp::Writer::Unknown => idle || old(),
            };
            if abandoned && std::fs::remove_file(&temp).is_ok() {
                removed += 1;
            }
        }
        Ok(removed)
    }

    pub(crate) fn lock_shared(&self) -> Result<BlobLock> {
        self.lock(FlockOperation::LockShared)
    }

    fn lock(&self, operation: FlockOperation) -> Result<BlobLock> {
        let path = self.root.join(".lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .ctx(|| format!("Cannot open {}", path.display()))?;
        rustix::fs::flock(&file, operation).ctx(|| format!("Cannot lock {}", path.display()))?;
        Ok(BlobLock { _file: file })
    }

    /// `put_bytes` for a caller that holds the shared lock; with a batch (`dirs`), the blob is
    /// made durable and named only by [`BlobStore::sync_dirs`].
    pub(crate) fn put_bytes_locked(
        &self,
        bytes: &[u8],
        dirs: Option<&DirSync>,
    ) -> Result<PutOutcome> {
        let hash = BlobHash::of(bytes);
        let size = bytes.len() as u64;
        // The content is in hand: an existing blob is reused only if its bytes are these (an
        // altered one of the right size is replaced, never named by a new candidate).
        let altered = if self.refresh_existing(&hash, size)? {
            if self.holds(&hash, bytes)? {
                return Ok(PutOutcome {
                    hash,
                    size,
                    stored: false,
                });
            }
            tracing::warn!(blob = %hash, "stored blob's bytes were altered; replacing them");
            true
        } else {
            false
        };
        let (temp_path, temp) = self.create_temp()?;
        let mut writer = DirectWriter::new(&temp, false);
        let result = writer
            .write(bytes)
            .and_then(|()| writer.finish())
            .ctx(|| format!("Cannot write {}", temp_path.display()))
            .and_then(|_| {
                if altered {
                    self.replace(temp, &temp_path, hash, size)
                        .map(Committed::Named)
                } else {
                    self.commit(temp, &temp_path, hash, size, dirs)
                }
            });
        settle(&temp_path, result)
    }

    /// True when blob `hash` holds exactly `bytes` (a missing blob holds nothing).
    fn holds(&self, hash: &BlobHash, bytes: &[u8]) -> Result<bool> {
        let Some(mut file) = self.open(hash)? else {
            return Ok(false);
        };
        let mut buffer = vec![0u8; COPY_BUFFER.min(bytes.len().max(1))];
        let mut at = 0;
        loop {
            let read = match file.read(&mut buffer) {
                Ok(0) => return Ok(at == bytes.len()),
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    return Err(PersistenceError::io(
                        format!("Cannot read blob {hash}"),
                        error,
                    ));
                }
            };
            if bytes.get(at..at + read) != Some(&buffer[..read]) {
                return Ok(false);
            }
            at += read;
        }
    }

    /// Names the temp file `hash` over an existing blob whose bytes were altered (one atomic
    /// rename; a reader sees the old file or the true one).
    fn replace(
        &self,
        temp: File,
        temp_path: &Path,
        hash: BlobHash,
        size: u64,
    ) -> Result<PutOutcome> {
        if self.options.fsync {
            temp.sync_data()
                .ctx(|| format!("Cannot fsync {}", temp_path.display()))?;
        }
        drop(temp);
        let target = self.path_of(&hash);
        std::fs::rename(temp_path, &target)
            .ctx(|| format!("Cannot replace {}", target.display()))?;
        if self.options.fsync {
            let shard = target.parent().unwrap_or(&self.root);
            File::open(shard)
                .and_then(|dir| dir.sync_all())
                .ctx(|| format!("Cannot fsync {}", shard.display()))?;
        }
        Ok(PutOutcome {
            hash,
            size,
            stored: true,
        })
    }

    /// Streams `reader` into the store while hashing it, for a caller that holds the shared
    /// lock; with a batch (`dirs`), the blob is made durable and named only by
    /// [`BlobStore::sync_dirs`].
    pub(crate) fn put_reader_locked(
        &self,
        mut reader: impl Read,
        dirs: Option<&DirSync>,
    ) -> Result<PutOutcome> {
        let (temp_path, temp) = self.create_temp()?;
        let result = (|| {
            let mut digest = Sha256::new();
            let mut buffer = vec![0u8; COPY_BUFFER];
            // Zero blocks are left as holes: a sandbox's 1 GiB sparse output, which costs it
            // nothing, must not cost the host 1 GiB of disk.
            let mut writer = DirectWriter::new(&temp, true);
            loop {
                let read = match reader.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(read) => read,
                    Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                    Err(error) => {
                        return Err(PersistenceError::io("Cannot read blob source", error));
                    }
                };
                digest.update(&buffer[..read]);
                writer
                    .write(&buffer[..read])
                    .ctx(|| format!("Cannot write {}", temp_path.display()))?;
            }
            let size = writer
                .finish()
                .ctx(|| format!("Cannot write {}", temp_path.display()))?;
            let hash = BlobHash::from_digest(digest);
            if self.refresh_existing(&hash, size)? {
                return Ok(Committed::Named(PutOutcome {
                    hash,
                    size,
                    stored: false,
                }));
            }
            self.commit(temp, &temp_path, hash, size, dirs)
        })();
        settle(&temp_path, result)
    }

    /// True when `hash` is stored with `size` bytes; refreshes its mtime when it is older than
    /// half the grace period so `gc` keeps it while a candidate naming it awaits publication.
    /// A stored blob of the wrong size is corrupt and reported as absent (the caller's commit
    /// replaces it).
    pub(crate) fn refresh_existing(&self, hash: &BlobHash, size: u64) -> Result<bool> {
        let path = self.path_of(hash);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
            Err(error) => {
                return Err(PersistenceError::io(
                    format!("Cannot stat {}", path.display()),
                    error,
                ));
            }
        };
        if !meta.is_file() || meta.len() != size {
            tracing::warn!(blob = %hash, "stored blob has the wrong size; replacing it");
            return Ok(false);
        }
        let fresh_after = SystemTime::now()
            .checked_sub(self.options.gc_grace / 2)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        if meta
            .modified()
            .map(|time| time < fresh_after)
            .unwrap_or(true)
        {
            let now = Timestamps {
                last_access: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_OMIT,
                },
                last_modification: rustix::fs::Timespec {
                    tv_sec: 0,
                    tv_nsec: rustix::fs::UTIME_NOW,
                },
            };
            match rustix::fs::utimensat(rustix::fs::CWD, &path, &now, rustix::fs::AtFlags::empty())
            {
                Ok(()) => {}
                Err(rustix::io::Errno::NOENT) => return Ok(false),
                Err(error) => {
                    return Err(PersistenceError::io(
                        format!("Cannot touch {}", path.display()),
                        error,
                    ));
                }
            }
        }
        Ok(true)
    }

    fn create_temp(&self) -> Result<(PathBuf, File)> {
        loop {
            let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
            let nanos = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map(|elapsed| elapsed.subsec_nanos())
                .unwrap_or(0);
            let path = self
                .root
                .join("tmp")
                .join(crate::blob_temp::temp_name(n, nanos));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    crate::fault::point("blob-temp-created");
                    return Ok((path, file));
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(error) => {
                    return Err(PersistenceError::io(
                        format!("Cannot create {}", path.display()),
                        error,
                    ));
                }
            }
        }
    }

    /// fsyncs the temp file and names it `hash`: a hard link, so an existing blob is never
    /// clobbered; a wrong-size existing blob is replaced atomically by rename.
    ///
    /// In a batch (with fsync on), only recorded: the temp file is the batch's now (the
    /// caller must leave it), named by [`BlobStore::sync_dirs`]; the outcome says stored (a
    /// twin put of the batch is then found existing when named).
    fn commit(
        &self,
        temp: File,
        temp_path: &Path,
        hash: BlobHash,
        size: u64,
        dirs: Option<&DirSync>,
    ) -> Result<Committed> {
        if let (Some(batch), true) = (dirs, self.options.fsync) {
            drop(temp);
            batch.defer(PendingPut {
                temp: temp_path.to_path_buf(),
                hash,
                size,
            });
            return Ok(Committed::Deferred(PutOutcome {
                hash,
                size,
                stored: true,
            }));
        }
        if self.options.fsync {
            temp.sync_data()
                .ctx(|| format!("Cannot fsync {}", temp_path.display()))?;
        }
        drop(temp);
        let stored = self.name(temp_path, hash, size)?;
        if stored && self.options.fsync {
            let target = self.path_of(&hash);
            let shard = target.parent().unwrap_or(&self.root);
            File::open(shard)
                .and_then(|dir| dir.sync_all())
                .ctx(|| format!("Cannot fsync {}", shard.display()))?;
        }
        Ok(Committed::Named(PutOutcome { hash, size, stored }))
    }

    /// Links the durable temp file to the name `hash` (true), or finds it stored already
    /// (false); a wrong-size existing blob is replaced atomically by rename.
    pub(crate) fn name(&self, temp_path: &Path, hash: BlobHash, size: u64) -> Result<bool> {
        let target = self.path_of(&hash);
        let shard = target.parent().unwrap_or(&self.root);
        std::fs::create_dir_all(shard).ctx(|| format!("Cannot create {}", shard.display()))?;
        match std::fs::hard_link(temp_path, &target) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                if self.refresh_existing(&hash, size)? {
                    Ok(false)
                } else {
                    std::fs::rename(temp_path, &target)
                        .ctx(|| format!("Cannot replace {}", target.display()))?;
                    Ok(true)
                }
            }
            Err(error) => Err(PersistenceError::io(
                format!("Cannot link {}", target.display()),
                error,
            )),
        }
    }
}

/// What became of a put's temp file.
enum Committed {
    /// Named, or found stored already: the temp file is the caller's to remove.
    Named(PutOutcome),
    /// Left to its batch, which names it at its end (or removes it).
    Deferred(PutOutcome),
}

/// Removes the temp file of a put unless its batch took it; the put's outcome.
fn settle(temp_path: &Path, result: Result<Committed>) -> Result<PutOutcome> {
    match result {
        Ok(Committed::Deferred(outcome)) => Ok(outcome),
        Ok(Committed::Named(outcome)) => {
            let _ = std::fs::remove_file(temp_path);
            Ok(outcome)
        }
        Err(error) => {
            let _ = std::fs::remove_file(temp_path);
            Err(error)
        }
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(PersistenceError::io(
                format!("Cannot list {}", dir.display()),
                error,
            ));
        }
    };
    let mut paths = Vec::new();
    for entry in entries {
        paths.push(
            entry
                .ctx(|| format!("Cannot list {}", dir.display()))?
                .path(),
        );
    }
    paths.sort();
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, grace: Duration) -> BlobStore {
        BlobStore::with_options(
            dir,
            BlobStoreOptions {
                gc_grace: grace,
                fsync: false,
            },
        )
        .unwrap()
    }

    #[test]
    fn zero_runs_are_stored_as_holes_and_read_back_as_zeros() {
        let temp = tempfile::tempdir().unwrap();
        let store = store(temp.path(), Duration::from_secs(3600));
        // 16 MiB of zeros with a byte of data in the middle and at the very end, streamed
        // in reads of odd sizes, then a blob that ends in zeros.
        let mut content = vec![0u8; 16 << 20];
        content[(8 << 20) + 5] = b'x';
        let last = content.len() - 1;
        content[last] = b'y';
        struct Odd<'a>(&'a [u8]);
        impl Read for Odd<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(buf.len()).min(777_777);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        for content in [content.clone(), content[..12 << 20].to_vec()] {
            let put = store.put_reader(Odd(&content)).unwrap();
            assert_eq!(put.hash, BlobHash::of(&content));
            assert_eq!(put.size, content.len() as u64);
            let meta = std::fs::metadata(store.path_of(&put.hash)).unwrap();
            assert_eq!(meta.len(), content.len() as u64);
            assert!(
                meta.blocks() * 512 < 1 << 20,
                "{} bytes allocated for a blob of two data bytes",
                meta.blocks() * 512
            );
            assert_eq!(store.get(&put.hash).unwrap().unwrap(), content);
        }
    }

    #[test]
    fn a_batch_names_nothing_until_its_end_and_leaves_no_temp_file() {
        let temp = tempfile::tempdir().unwrap();
        let store = BlobStore::new(temp.path()).unwrap();
        let temps = || {
            std::fs::read_dir(temp.path().join("blobs/tmp"))
                .unwrap()
                .count()
        };
        let batch = DirSync::default();
        let a = store.put_bytes_locked(b"alpha", Some(&batch)).unwrap();
        let twin = store
            .put_reader_locked(&b"alpha"[..], Some(&batch))
            .unwrap();
        let b = store.put_reader_locked(&b"beta"[..], Some(&batch)).unwrap();
        assert_eq!(
            (a.hash, twin.hash),
            (BlobHash::of(b"alpha"), BlobHash::of(b"alpha"))
        );
        // Not durable yet, so not named: a crash now leaves temp files only.
        assert!(store.get(&a.hash).unwrap().is_none());
        assert!(store.get(&b.hash).unwrap().is_none());
        assert_eq!(temps(), 3);
        store.sync_dirs(&batch).unwrap();
        assert_eq!(store.get(&a.hash).unwrap().unwrap(), b"alpha");
        assert_eq!(store.get(&b.hash).unwrap().unwrap(), b"beta");
        assert_eq!(temps(), 0);

        // A batch abandoned (an error before its end) takes its temp files with it.
        let abandoned = DirSync::default();
        let c = store.put_bytes_locked(b"gamma", Some(&abandoned)).unwrap();
        assert_eq!(temps(), 1);
        drop(abandoned);
        assert_eq!(temps(), 0);
        assert!(store.get(&c.hash).unwrap().is_none());
    }

    #[test]
    fn put_is_write_once_and_content_addressed() {
        let temp = tempfile::tempdir().unwrap();
        let store = store(temp.path(), Duration::from_secs(3600));
        let first = store.put_bytes(b"hello").unwrap();
        assert!(first.stored);
        assert_eq!(first.hash, BlobHash::of(b"hello"));
        let again = store.put_reader(&b"hello"[..]).unwrap();
        assert_eq!(
            again,
            PutOutcome {
                stored: false,
                ..first
            }
        );
        assert_eq!(store.get(&first.hash).unwrap().unwrap(), b"hello");
        assert!(store.exists(&first.hash).unwrap());
        let path = store.path_of(&first.hash);
        assert!(path.starts_with(temp.path().join("blobs/sha256")));
        assert_eq!(
            path.parent().unwrap().file_name().unwrap(),
            &first.hash.to_hex()[..2]
        );
        assert_eq!(
            std::fs::read_dir(temp.path().join("blobs/tmp"))
                .unwrap()
                .count(),
            0
        );
    }

    #[test]
    fn a_wrong_size_blob_is_replaced_and_a_tampered_one_is_detected() {
        let temp = tempfile::tempdir().unwrap();
        let store = store(temp.path(), Duration::from_secs(3600));
        let hash = store.put_bytes(b"content").unwrap().hash;
        std::fs::write(store.path_of(&hash), b"short").unwrap();
        assert!(store.put_bytes(b"content").unwrap().stored);
        assert_eq!(store.get(&hash).unwrap().unwrap(), b"content");
        std::fs::write(store.path_of(&hash), b"CONTENT").unwrap();
        assert!(matches!(
            store.get(&hash),
            Err(PersistenceError::CorruptBlob(_))
        ));
        // The next put of that content (in hand) replaces the altered bytes.
        assert!(store.put_bytes(b"content").unwrap().stored);
        assert_eq!(store.get(&hash).unwrap().unwrap(), b"content");
        assert!(
            !store.put_bytes(b"content").unwrap().stored,
            "intact: reused"
        );
    }

    #[test]
    fn gc_removes_only_old_unreferenced_blobs() {
        let temp = tempfile::tempdir().unwrap();
        let store = store(temp.path(), Duration::ZERO);
        let kept = store.put_bytes(b"kept").unwrap().hash;
        let dropped = store.put_bytes(b"dropped").unwrap().hash;
        std::thread::sleep(Duration::from_millis(20));
        let report = store.gc(&HashSet::from([kept])).unwrap();
        assert_eq!(report.scanned, 2);
        assert_eq!(report.kept_referenced, 1);
        assert_eq!(report.removed, 1);
        assert_eq!(report.removed_bytes, 7);
        assert!(store.exists(&kept).unwrap());
        assert!(!store.exists(&dropped).unwrap());

        let graceful = self::store(temp.path(), Duration::from_secs(3600));
        let young = graceful.put_bytes(b"young").unwrap().hash;
        let report = graceful.gc(&HashSet::new()).unwrap();
        assert_eq!(report.kept_recent, 2);
        assert!(graceful.exists(&young).unwrap());
    }
}
