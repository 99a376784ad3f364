//! `FilesystemSessionOutputPort`: `/mnt/session/outputs` as a host directory, collected once
//! the harness finished (`final_collect`, durability `durable`) into the blob store.
//!
//! - `prepare` makes a fresh binding directory (metadata `hostPath`) that a host-directory
//!   backend bind-mounts; `attach` is a no-op.
//! - `collect` walks it without following links: regular files only; symlinks, FIFOs,
//!   sockets, devices, non-UTF-8 names and directories nested too deeply are skipped and
//!   logged as warnings (see `skipped`; the TypeScript adapter fails the collection instead),
//!   at most `max_files` files and `max_bytes` bytes (reference
//!   §1.15 texts), entries sorted by logical path (byte order).
//! - `finalize` re-reads every entry while copying it into the blob store and fails with
//!   `"Session output changed during collection: <path>"` when hash or size moved; then stores
//!   the manifest `{version:1, sessionId, workId, generation, entries}` plus `"\n"` as a blob.
//!   The candidate (`out_<hash>`) is inert until the host publishes it.
//! - `release` and `abort` delete the binding directory; stored blobs stay for `gc`.
//!
//! Published outputs are read back with [`FilesystemSessionOutputPort::read_manifest`] and
//! [`FilesystemSessionOutputPort::open_entry`].

use crate::blob::{BlobStore, COPY_BUFFER, DirSync};
use crate::blocking;
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::{BlobHash, CandidateHashError, candidate_manifest_hash};
use crate::layout::{self, binding_metadata, check_host_path, prune_empty_parents};
use crate::media_type::guess_media_type;
use crate::safe_fs::{self, MAX_DEPTH, ParentCursor, remove_tree};
use crate::skipped::{SkipReason, SkippedEntries};
use crate::snapshot::special_reason;
use crate::walk::{Descend, WalkLimits};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AttachOutputsInput, CollectOutputsInput, FinalizeOutputsInput, Meta,
    OUTPUTS_MOUNT_PATH, OutputAbortReason, OutputDurability, OutputStrategy, PortError,
    PrepareOutputsInput, RuntimePublicationCandidate, RuntimeResourceFence, RuntimeResourceScope,
    SessionOutputBinding, SessionOutputCapabilities, SessionOutputCapability,
    SessionOutputEntryCandidate, SessionOutputManifestCandidate, SessionOutputPort,
};
use rustix::fs::FileType;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashSet;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const AREA: &str = "runtime-outputs";
const BINDING_PREFIX: &str = "outb_";
const CANDIDATE_PREFIX: &str = "out_";

/// Collection limits (reference §1.15 defaults: 10 000 files, 10 GiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLimits {
    /// Most files a collection accepts.
    pub max_files: u64,
    /// Most bytes a collection accepts.
    pub max_bytes: u64,
}

impl Default for OutputLimits {
    fn default() -> Self {
        Self {
            max_files: 10_000,
            max_bytes: 10 * 1024 * 1024 * 1024,
        }
    }
}

/// The stored outputs manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOutputManifest {
    /// Always 1.
    pub version: u32,
    /// The session.
    pub session_id: String,
    /// The work item.
    pub work_id: String,
    /// The fence generation that finalized it.
    pub generation: u64,
    /// The files, sorted by logical path.
    pub entries: Vec<SessionOutputEntryCandidate>,
}

/// The outputs port for backends that bind-mount a host directory at `/mnt/session/outputs`.
#[derive(Debug)]
pub struct FilesystemSessionOutputPort {
    data_dir: PathBuf,
    store: Arc<BlobStore>,
    limits: OutputLimits,
}

impl FilesystemSessionOutputPort {
    /// A port over `<data_dir>` with its own blob store.
    pub fn new(data_dir: impl Into<PathBuf>) -> Result<Self> {
        let data_dir = data_dir.into();
        let store = Arc::new(BlobStore::new(&data_dir)?);
        Ok(Self::with_store(data_dir, store))
    }

    /// A port sharing `store` with the workspace port of the same data directory.
    pub fn with_store(data_dir: impl Into<PathBuf>, store: Arc<BlobStore>) -> Self {
        Self {
            data_dir: data_dir.into(),
            store,
            limits: OutputLimits::default(),
        }
    }

    /// Replaces the collection limits.
    pub fn with_limits(mut self, limits: OutputLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The manifest of a published (or finalized) outputs candidate, verified against its id
    /// and content hash.
    pub async fn read_manifest(
        &self,
        candidate: &RuntimePublicationCandidate,
    ) -> Result<SessionOutputManifest> {
        let hash = manifest_hash(candidate)?;
        let store = Arc::clone(&self.store);
        blocking(move || load_manifest(&store, &hash)).await
    }

    /// The entry `logical_path` of an outputs candidate and its bytes, for promotion.
    pub async fn open_entry(
        &self,
        candidate: &RuntimePublicationCandidate,
        logical_path: &str,
    ) -> Result<(SessionOutputEntryCandidate, std::fs::File)> {
        let manifest = self.read_manifest(candidate).await?;
        let entry = manifest
            .entries
            .into_iter()
            .find(|entry| entry.logical_path == logical_path)
            .ok_or_else(|| PersistenceError::OutputNotFound(logical_path.to_owned()))?;
        let hash = BlobHash::from_content_hash(&entry.content_hash)
            .ok_or_else(|| PersistenceError::InvalidOutputManifest(entry.logical_path.clone()))?;
        let store = Arc::clone(&self.store);
        let size = entry.size;
        let logical_path = entry.logical_path.clone();
        let file = blocking(move || {
            let damaged = |problem| PersistenceError::OutputContent {
                path: logical_path.clone(),
                blob: hash.to_hex(),
                problem,
            };
            let file = store
                .open(&hash)?
                .ok_or_else(|| damaged("is not in the blob store"))?;
            let stored = file
                .metadata()
                .ctx(|| format!("Cannot stat blob {hash}"))?
                .len();
            if stored != size {
                return Err(damaged("does not match its size"));
            }
            Ok(file)
        })
        .await?;
        Ok((entry, file))
    }

    /// Every blob an outputs candidate needs (its manifest and its files), for `gc`.
    pub async fn referenced_blobs(
        &self,
        candidate: &RuntimePublicationCandidate,
    ) -> Result<HashSet<BlobHash>> {
        let hash = manifest_hash(candidate)?;
        let manifest = self.read_manifest(candidate).await?;
        let mut blobs: HashSet<BlobHash> = manifest
            .entries
            .iter()
            .filter_map(|entry| BlobHash::from_content_hash(&entry.content_hash))
            .collect();
        blobs.insert(hash);
        Ok(blobs)
    }

    fn check_strategy(strategy: OutputStrategy) -> Result<()> {
        if strategy == OutputStrategy::FinalCollect {
            Ok(())
        } else {
            Err(PersistenceError::UnsupportedOutputStrategy(
                strategy.to_string(),
            ))
        }
    }

    fn resolve_binding(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<PathBuf> {
        let root = layout::binding_root(
            &self.data_dir,
            AREA,
            BINDING_PREFIX,
            scope,
            fence.generation,
            &binding.binding_id,
        )?;
        check_host_path(
            binding.metadata.as_ref(),
            &root.join("outputs"),
            &binding.binding_id,
        )?;
        Ok(root)
    }

    /// Empties the outputs of `binding` and keeps the binding (its directory stays
    /// mounted in the sandbox): a warm session's next turn starts with no outputs, as a
    /// fresh binding would.
    pub async fn empty(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> std::result::Result<(), PortError> {
        let outputs = self.resolve_binding(scope, fence, binding)?.join("outputs");
        Ok(blocking(move || {
            crate::safe_fs::empty_dir(&outputs)
                .ctx(|| format!("Cannot empty {}", outputs.display()))
        })
        .await?)
    }

    async fn discard(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<()> {
        let root = self.resolve_binding(scope, fence, binding)?;
        blocking(move || {
            remove_tree(&root).ctx(|| format!("Cannot remove {}", root.display()))?;
            prune_empty_parents(&root);
            Ok(())
        })
        .await
    }
}

fn manifest_hash(candidate: &RuntimePublicationCandidate) -> Result<BlobHash> {
    candidate_manifest_hash(candidate, CANDIDATE_PREFIX).map_err(|error| match error {
        CandidateHashError::InvalidId => PersistenceError::InvalidOutputManifestId,
        CandidateHashError::Mismatch => PersistenceError::OutputManifestHashMismatch,
    })
}

fn load_manifest(store: &BlobStore, hash: &BlobHash) -> Result<SessionOutputManifest> {
    let bytes = match store.get(hash) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Err(PersistenceError::InvalidOutputManifest(format!(
                "{CANDIDATE_PREFIX}{hash} is missing"
            )));
        }
        Err(PersistenceError::CorruptBlob(_)) => {
            return Err(PersistenceError::OutputManifestHashMismatch);
        }
        Err(error) => return Err(error),
    };
    serde_json::from_slice(&bytes)
        .map_err(|error| PersistenceError::InvalidOutputManifest(error.to_string()))
}

/// The §1.15 logical-path rule: not empty, not absolute, no empty, `.` or `..` segment.
fn check_logical_path(path: &str) -> Result<Vec<&str>> {
    safe_fs::split_relative(path).ok_or_else(|| PersistenceError::UnsafeOutputPath(path.to_owned()))
}

/// Lists the regular files under `root`, enforcing the file limit as it goes; anything else
/// (symlinks, special files, non-UTF-8 names, too deep) is skipped into `skipped`.
fn list_outputs(
    root: OwnedFd,
    limits: &OutputLimits,
    out: &mut Vec<(String, u64)>,
    skipped: &mut SkippedEntries,
    signal: &AbortSignal,
) -> Result<()> {
    // Directories and skipped entries are not files; they are bounded at ten per file allowed.
    let bounds = WalkLimits {
        max_entries: limits.max_files.saturating_mul(10).max(100_000),
        too_many: |_| PersistenceError::OutputEntryLimit,
    };
    crate::walk::walk(root, "outputs", bounds, |visit| {
        signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        let Some(stat) = visit.stat else {
            skipped.push(&visit.path, SkipReason::NotUtf8);
            return Ok(Descend::No);
        };
        match stat.file_type {
            FileType::Directory if visit.depth >= MAX_DEPTH => {
                skipped.push(&visit.path, SkipReason::TooDeep);
            }
            FileType::Directory => return Ok(Descend::Yes),
            FileType::RegularFile => {
                if out.len() as u64 >= limits.max_files {
                    return Err(PersistenceError::OutputFileLimit(limits.max_files));
                }
                out.push((visit.path, stat.key.size));
            }
            FileType::Symlink => skipped.push(&visit.path, SkipReason::Symlink),
            other => skipped.push(&visit.path, special_reason(other)),
        }
        Ok(Descend::No)
    })
}

/// Opens the output `parts` under `root` without following links; must be a regular file.
fn open_output(
    root: BorrowedFd<'_>,
    cursor: &mut ParentCursor,
    path: &str,
    parts: &[&str],
) -> Result<std::fs::File> {
    let changed = || PersistenceError::OutputChanged(path.to_owned());
    let Some((name, parents)) = parts.split_last() else {
        return Err(changed());
    };
    let dir = match cursor.open(root, parents) {
        Ok(dir) => dir,
        Err(_) => {
            cursor.reset();
            return Err(changed());
        }
    };
    let file = safe_fs::open_file_at(dir, name).map_err(|_| changed())?;
    let stat = safe_fs::stat_fd(&file).ctx(|| format!("Cannot stat {path}"))?;
    if stat.file_type != FileType::RegularFile {
        return Err(PersistenceError::OutputNotRegular(path.to_owned()));
    }
    Ok(file)
}

fn collect_blocking(
    outputs: &Path,
    limits: OutputLimits,
    signal: &AbortSignal,
) -> Result<Vec<SessionOutputEntryCandidate>> {
    let root = safe_fs::open_root(outputs).ctx(|| format!("Cannot open {}", outputs.display()))?;
    let mut files = Vec::new();
    let mut skipped = SkippedEntries::default();
    let walk_root = root
        .try_clone()
        .ctx(|| format!("Cannot open {}", outputs.display()))?;
    list_outputs(walk_root, &limits, &mut files, &mut skipped, signal)?;
    skipped.warn("/mnt/session/outputs");
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let listed: u64 = files.iter().map(|(_, size)| *size).sum();
    if listed > limits.max_bytes {
        return Err(PersistenceError::OutputByteLimit(limits.max_bytes));
    }
    let mut cursor = ParentCursor::default();
    let mut buffer = vec![0u8; COPY_BUFFER];
    let mut total = 0u64;
    let mut entries = Vec::with_capacity(files.len());
    for (path, _) in files {
        signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        let parts = check_logical_path(&path)?;
        let mut file = open_output(root.as_fd(), &mut cursor, &path, &parts)?;
        let mut digest = Sha256::new();
        let mut size = 0u64;
        loop {
            let read = match file.read(&mut buffer) {
                Ok(0) => break,
                Ok(read) => read,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    return Err(PersistenceError::io(format!("Cannot read {path}"), error));
                }
            };
            digest.update(&buffer[..read]);
            size += read as u64;
            if total + size > limits.max_bytes {
                return Err(PersistenceError::OutputByteLimit(limits.max_bytes));
            }
        }
        total += size;
        entries.push(SessionOutputEntryCandidate {
            media_type: Some(guess_media_type(&path).to_owned()),
            logical_path: path,
            content_hash: BlobHash::from_digest(digest).content_hash(),
            size,
        });
    }
    Ok(entries)
}

struct FinalizeJob {
    store: Arc<BlobStore>,
    outputs: PathBuf,
    entries: Vec<SessionOutputEntryCandidate>,
    session_id: String,
    work_id: String,
    generation: u64,
    signal: AbortSignal,
}

impl FinalizeJob {
    fn run(mut self) -> Result<SessionOutputManifestCandidate> {
        self.entries
            .sort_by(|a, b| a.logical_path.as_bytes().cmp(b.logical_path.as_bytes()));
        let root = safe_fs::open_root(&self.outputs)
            .ctx(|| format!("Cannot open {}", self.outputs.display()))?;
        let _lock = self.store.lock_shared()?;
        let mut cursor = ParentCursor::default();
        let mut seen = HashSet::new();
        let dirs = DirSync::default();
        for entry in &self.entries {
            self.signal
                .throw_if_aborted()
                .map_err(PersistenceError::Aborted)?;
            let path = &entry.logical_path;
            let parts = check_logical_path(path)?;
            if !seen.insert(path.as_str()) {
                return Err(PersistenceError::OutputChanged(path.clone()));
            }
            let file = open_output(root.as_fd(), &mut cursor, path, &parts)?;
            let stored = self.store.put_reader_locked(file, Some(&dirs))?;
            if stored.hash.content_hash() != entry.content_hash || stored.size != entry.size {
                return Err(PersistenceError::OutputChanged(path.clone()));
            }
        }
        self.store.sync_dirs(&dirs)?;
        let manifest = SessionOutputManifest {
            version: 1,
            session_id: self.session_id,
            work_id: self.work_id,
            generation: self.generation,
            entries: self.entries,
        };
        let mut bytes = serde_json::to_vec(&manifest).unwrap_or_default();
        bytes.push(b'\n');
        let stored = self.store.put_bytes_locked(&bytes, None)?;
        self.signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        let mut metadata = Meta::new();
        metadata.insert("manifestBlob".into(), stored.hash.to_hex().into());
        Ok(SessionOutputManifestCandidate {
            id: format!("{CANDIDATE_PREFIX}{}", stored.hash),
            content_hash: stored.hash.content_hash(),
            entries: manifest.entries.len() as u64,
            metadata: Some(metadata),
        })
    }
}

#[async_trait]
impl SessionOutputPort for FilesystemSessionOutputPort {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        Ok(SessionOutputCapabilities {
            strategies: vec![SessionOutputCapability {
                strategy: OutputStrategy::FinalCollect,
                durability: OutputDurability::Durable,
            }],
        })
    }

    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError> {
        input.signal.throw_if_aborted()?;
        Self::check_strategy(input.strategy)?;
        let binding_id = layout::binding_id(BINDING_PREFIX, &input.idempotency_key);
        let root = layout::binding_root(
            &self.data_dir,
            AREA,
            BINDING_PREFIX,
            &input.scope,
            input.fence.generation,
            &binding_id,
        )?;
        let outputs = root.join("outputs");
        let metadata = binding_metadata(&outputs, &root);
        blocking(move || {
            remove_tree(&root).ctx(|| format!("Cannot clear {}", root.display()))?;
            std::fs::create_dir_all(&outputs).ctx(|| format!("Cannot create {}", outputs.display()))
        })
        .await?;
        Ok(SessionOutputBinding {
            binding_id,
            mount_path: OUTPUTS_MOUNT_PATH.to_owned(),
            metadata: Some(metadata),
        })
    }

    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError> {
        // The backend bind-mounts `hostPath`; nothing to do.
        input.signal.throw_if_aborted()?;
        Self::check_strategy(input.strategy)?;
        self.resolve_binding(&input.scope, &input.fence, &input.binding)?;
        Ok(())
    }

    async fn collect(
        &self,
        input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError> {
        input.signal.throw_if_aborted()?;
        Self::check_strategy(input.strategy)?;
        let outputs = self
            .resolve_binding(&input.scope, &input.fence, &input.binding)?
            .join("outputs");
        let limits = self.limits;
        let signal = input.signal.clone();
        Ok(blocking(move || collect_blocking(&outputs, limits, &signal)).await?)
    }

    async fn finalize(
        &self,
        input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError> {
        input.signal.throw_if_aborted()?;
        Self::check_strategy(input.strategy)?;
        let outputs = self
            .resolve_binding(&input.scope, &input.fence, &input.binding)?
            .join("outputs");
        let job = FinalizeJob {
            store: Arc::clone(&self.store),
            outputs,
            entries: input.entries,
            session_id: input.scope.session_id.clone(),
            work_id: input.scope.work_id.clone(),
            generation: input.fence.generation,
            signal: input.signal.clone(),
        };
        Ok(blocking(move || job.run()).await?)
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<(), PortError> {
        Ok(self.discard(scope, fence, binding).await?)
    }

    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        _reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        Ok(self.discard(scope, fence, binding).await?)
    }
}
