//! `FilesystemWorkspacePort`: `/workspace` as a host directory, persisted by checkpoint and
//! restore through the blob store.
//!
//! Strategies: `checkpoint_restore` and `ephemeral` (configurable subset). The binding is a
//! fresh host directory per (scope, generation, idempotency key) that a host-directory backend
//! bind-mounts at `/workspace` (metadata `hostPath`); `attach` is therefore a no-op.
//!
//! Invariants:
//! - **Never lose a workspace.** A checkpoint only adds blobs and a manifest; it publishes
//!   nothing (the host's fence does). A failed checkpoint leaves the last published candidate
//!   and every blob it names intact.
//! - **Restore never writes outside the binding root** (see `restore`), and restores only what
//!   the manifest lists, after checking the manifest hashes to the candidate's id and content
//!   hash.
//! - **Nothing secret in metadata.** Binding and candidate metadata hold paths and hashes only.
//!
//! Seeding (`omabox run --workspace DIR`): [`FilesystemWorkspacePort::seed_new_session`]
//! registers a host directory for a scope; `materialize` uses it only when there is no active
//! checkpoint (a new session). It lists the directory with a checkpoint's walk (its rules and
//! limits: regular files, directories and symlinks; symlinks copied, never followed) and
//! copies that listing into the binding as a restore would, every path opened without
//! following a symlink. Nothing is hashed or stored then: the session has no checkpoint until
//! its first turn ends, and that turn's checkpoint (a full one) captures the workspace.

use crate::blob::BlobStore;
use crate::blocking;
use crate::error::{IoContext, PersistenceError, Result};
use crate::hash::{BlobHash, CandidateHashError, candidate_manifest_hash, short_hash};
use crate::layout::{self, binding_metadata, check_host_path, prune_empty_parents};
use crate::limits::CheckpointLimits;
use crate::lost::record_losses;
use crate::manifest::{EntryKind, WorkspaceManifest};
use crate::progress::{ProgressObserver, ProgressPhase};
use crate::restore::{Content, RestoreInput, RestoreReport, restore};
use crate::safe_fs::remove_tree;
use crate::snapshot::{CheckpointReport, SnapshotInput, list_tree, snapshot};
use crate::stat_cache::StatCache;
use crate::verify::Damage;
use async_trait::async_trait;
use omabox_contract::json::stable_json;
use omabox_contract::{
    AbortSignal, AttachWorkspaceInput, CheckpointWorkspaceInput, MaterializeWorkspaceInput, Meta,
    MetaValue, PortError, RuntimePublicationCandidate, RuntimeResourceFence, RuntimeResourceScope,
    WORKSPACE_MOUNT_PATH, WorkspaceBinding, WorkspaceCheckpointCandidate,
    WorkspacePersistenceCapabilities, WorkspacePersistencePort, WorkspaceStrategy,
};
use std::collections::{HashMap, HashSet};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

const AREA: &str = "runtime";
const BINDING_PREFIX: &str = "wsb_";
const CANDIDATE_PREFIX: &str = "wcp_";
const STAT_CACHE_FILE: &str = "stat-cache.json";
/// The cache a restore recorded, trusted only once `attach` waited out the racy margin.
const PENDING_CACHE_FILE: &str = "stat-cache.pending.json";
const EPHEMERAL_METADATA_KEY: &str = "openma.workspace.ephemeral.v1";

/// Tunables of a [`FilesystemWorkspacePort`].
#[derive(Debug, Clone)]
pub struct WorkspaceOptions {
    /// A file whose `ctime` is this close to the moment it was hashed is re-hashed at the next
    /// checkpoint (see `stat_cache`). Must exceed the filesystem's timestamp granularity.
    /// Default 100 ms.
    pub racy_margin: Duration,
    /// Threads hashing and storing files during a checkpoint; more than the cores, because
    /// much of a new blob's time is an fsync. Default: twice the cores, at most 8.
    pub hash_threads: usize,
    /// Hash every restored byte against the manifest (else check sizes only). Default true.
    pub verify_restore: bool,
    /// Limits of each checkpoint (and of a seed's capture).
    pub limits: CheckpointLimits,
}

impl Default for WorkspaceOptions {
    fn default() -> Self {
        Self {
            racy_margin: Duration::from_millis(100),
            hash_threads: std::thread::available_parallelism()
                .map(|cores| (cores.get() * 2).min(8))
                .unwrap_or(4),
            verify_restore: true,
            limits: CheckpointLimits::default(),
        }
    }
}

/// The workspace port for backends that bind-mount a host directory at `/workspace`.
#[derive(Debug)]
pub struct FilesystemWorkspacePort {
    data_dir: PathBuf,
    store: Arc<BlobStore>,
    strategies: Vec<WorkspaceStrategy>,
    options: WorkspaceOptions,
    observer: Option<Arc<dyn ProgressObserver>>,
    seeds: Mutex<HashMap<RuntimeResourceScope, PathBuf>>,
    revisions: Mutex<HashMap<RuntimeResourceScope, RevisionChoice>>,
}

/// A published revision `materialize` knows about for a scope (see
/// [`FilesystemWorkspacePort::restore_revision`] and [`FilesystemWorkspacePort::name_revision`]).
#[derive(Debug, Clone)]
struct RevisionChoice {
    revision: u64,
    candidate: RuntimePublicationCandidate,
    /// Restore this instead of the scope's active checkpoint.
    replace_active: bool,
}

impl FilesystemWorkspacePort {
    /// A port over `<data_dir>` with its own blob store, offering both strategies.
    pub fn new(data_dir: impl Into<PathBuf>) -> Result<Self> {
        let data_dir = data_dir.into();
        let store = Arc::new(BlobStore::new(&data_dir)?);
        Ok(Self::with_store(data_dir, store))
    }

    /// A port sharing `store` (normally with the outputs port of the same data directory).
    pub fn with_store(data_dir: impl Into<PathBuf>, store: Arc<BlobStore>) -> Self {
        Self {
            data_dir: data_dir.into(),
            store,
            strategies: vec![
                WorkspaceStrategy::CheckpointRestore,
                WorkspaceStrategy::Ephemeral,
            ],
            options: WorkspaceOptions::default(),
            observer: None,
            seeds: Mutex::new(HashMap::new()),
            revisions: Mutex::new(HashMap::new()),
        }
    }

    /// Restricts the advertised strategies; only `checkpoint_restore` and `ephemeral` exist.
    pub fn with_strategies(mut self, strategies: &[WorkspaceStrategy]) -> Result<Self> {
        for strategy in strategies {
            if !matches!(
                strategy,
                WorkspaceStrategy::CheckpointRestore | WorkspaceStrategy::Ephemeral
            ) {
                return Err(PersistenceError::UnsupportedWorkspaceStrategy(
                    strategy.to_string(),
                ));
            }
        }
        self.strategies = strategies.to_vec();
        Ok(self)
    }

    /// The strategies this port offers.
    pub fn strategies(&self) -> &[WorkspaceStrategy] {
        &self.strategies
    }

    /// Replaces the tunables.
    pub fn with_options(mut self, options: WorkspaceOptions) -> Self {
        self.options = options;
        self
    }

    /// Reports restore and checkpoint progress to `observer`.
    pub fn with_progress(mut self, observer: Arc<dyn ProgressObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The blob store.
    pub fn store(&self) -> &Arc<BlobStore> {
        &self.store
    }

    /// Seeds the workspace of `scope` from the host directory `dir` when `materialize` finds
    /// no active checkpoint (a new session). Ignored once the session has published.
    pub fn seed_new_session(&self, scope: RuntimeResourceScope, dir: impl Into<PathBuf>) {
        if let Ok(mut seeds) = self.seeds.lock() {
            seeds.insert(scope, dir.into());
        }
    }

    /// Makes `materialize` for `scope` restore `candidate`, published as `revision`, instead of
    /// the scope's active checkpoint: continuing a session from an earlier revision
    /// (`omabox run --from-revision N`). The run then publishes a new revision on top.
    pub fn restore_revision(
        &self,
        scope: RuntimeResourceScope,
        revision: u64,
        candidate: RuntimePublicationCandidate,
    ) {
        self.remember_revision(scope, revision, candidate, true);
    }

    /// Tells the port that `candidate` of `scope` is its published `revision`, so that a failed
    /// restore names the revision (not only the checkpoint id).
    pub fn name_revision(
        &self,
        scope: RuntimeResourceScope,
        revision: u64,
        candidate: RuntimePublicationCandidate,
    ) {
        self.remember_revision(scope, revision, candidate, false);
    }

    fn remember_revision(
        &self,
        scope: RuntimeResourceScope,
        revision: u64,
        candidate: RuntimePublicationCandidate,
        replace_active: bool,
    ) {
        if let Ok(mut revisions) = self.revisions.lock() {
            revisions.insert(
                scope,
                RevisionChoice {
                    revision,
                    candidate,
                    replace_active,
                },
            );
        }
    }

    /// `materialize`, also returning what a restore did (`None` when nothing was restored).
    pub async fn materialize_with_report(
        &self,
        input: &MaterializeWorkspaceInput,
    ) -> Result<(WorkspaceBinding, Option<RestoreReport>)> {
        input
            .signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        self.check_strategy(input.strategy)?;
        let binding_id = layout::binding_id(BINDING_PREFIX, &input.idempotency_key);
        let root = self.binding_root(&input.scope, input.fence.generation, &binding_id)?;
        let host_path = root.join("workspace");
        let restoring = input.strategy == WorkspaceStrategy::CheckpointRestore;
        let choice = self
            .revisions
            .lock()
            .ok()
            .and_then(|revisions| revisions.get(&input.scope).cloned());
        let candidate = match &choice {
            Some(choice) if choice.replace_active => Some(choice.candidate.clone()),
            _ => input.active_checkpoint.clone(),
        };
        let label = candidate.as_ref().map(|candidate| match &choice {
            Some(choice) if choice.candidate.id == candidate.id => {
                format!("revision {} ({})", choice.revision, candidate.id)
            }
            _ => candidate.id.clone(),
        });
        let active = match (&candidate, restoring) {
            (Some(candidate), true) => Some(checkpoint_hash(candidate)?),
            _ => None,
        };
        let seed = if active.is_none() {
            self.seeds
                .lock()
                .ok()
                .and_then(|seeds| seeds.get(&input.scope).cloned())
        } else {
            None
        };
        let job = MaterializeJob {
            store: Arc::clone(&self.store),
            root: root.clone(),
            host_path: host_path.clone(),
            active,
            seed,
            options: self.options.clone(),
            observer: self.observer.clone(),
            signal: input.signal.clone(),
        };
        let restoring_active = job.active.is_some();
        let report = blocking(move || {
            let result = job.run();
            if result.is_err() {
                let _ = remove_tree(&job.root);
            }
            result
        })
        .await
        .map_err(|error| match (error, label.clone()) {
            // Missing or damaged storage is named with session and revision; every other
            // failure keeps its exact (contract) text.
            (
                error @ (PersistenceError::MissingContent { .. }
                | PersistenceError::CorruptContent { .. }
                | PersistenceError::CheckpointMissing(_)
                | PersistenceError::Io { .. }),
                Some(what),
            ) if restoring_active => PersistenceError::Restore {
                session: input.scope.session_id.clone(),
                what,
                detail: PortError::from(error).message().to_owned(),
            },
            (error, _) => error,
        })?;
        let mut metadata = binding_metadata(&host_path, &root);
        if let Some(lost) = report.as_ref().map(|report| &report.lost)
            && !lost.is_empty()
        {
            let session = &input.scope.session_id;
            let what = label.as_deref().unwrap_or("its last checkpoint");
            for damage in lost.iter().take(20) {
                tracing::warn!(
                    %session, revision = %what, path = damage.path.as_deref().unwrap_or("(all)"),
                    problem = %damage.problem, "workspace entry lost"
                );
            }
            record_losses(&mut metadata, lost);
        }
        Ok((
            WorkspaceBinding {
                binding_id,
                mount_path: WORKSPACE_MOUNT_PATH.to_owned(),
                metadata: Some(metadata),
            },
            report,
        ))
    }

    /// `checkpoint`, also returning its counters.
    pub async fn checkpoint_with_report(
        &self,
        input: &CheckpointWorkspaceInput,
    ) -> Result<(WorkspaceCheckpointCandidate, CheckpointReport)> {
        input
            .signal
            .throw_if_aborted()
            .map_err(PersistenceError::Aborted)?;
        self.check_strategy(input.strategy)?;
        let root = self.resolve_binding(&input.scope, &input.fence, &input.binding)?;
        if input.strategy == WorkspaceStrategy::Ephemeral {
            let marker = serde_json::json!({
                "provider": input.sandbox.provider,
                "runtimeId": input.sandbox.runtime_id,
                "generation": input.fence.generation,
            });
            let marker = stable_json(&marker);
            let hash = BlobHash::of(marker.as_bytes());
            let mut metadata = Meta::new();
            metadata.insert(EPHEMERAL_METADATA_KEY.into(), MetaValue::String(marker));
            return Ok((
                WorkspaceCheckpointCandidate {
                    id: format!("wrc_{hash}"),
                    content_hash: hash.content_hash(),
                    revision: input.fence.generation,
                    metadata: Some(metadata),
                },
                CheckpointReport::default(),
            ));
        }
        let store = Arc::clone(&self.store);
        let options = self.options.clone();
        let observer = self.observer.clone();
        let signal = input.signal.clone();
        let generation = input.fence.generation;
        let record = root
            .join("checkpoints")
            .join(format!("{}.json", short_hash(&input.idempotency_key)));
        blocking(move || {
            let started = Instant::now();
            if let Some(candidate) = load_record(&record, &store) {
                let report = CheckpointReport {
                    reused_candidate: true,
                    duration: started.elapsed(),
                    ..CheckpointReport::default()
                };
                return Ok((candidate, report));
            }
            // A restore's cache that `attach` never activated is not trusted.
            let _ = std::fs::remove_file(root.join(PENDING_CACHE_FILE));
            let cache_path = root.join(STAT_CACHE_FILE);
            let cache = StatCache::load(&cache_path);
            let captured = snapshot(SnapshotInput {
                store: &store,
                limits: options.limits,
                root: &root.join("workspace"),
                cache: Some(&cache),
                racy_margin: options.racy_margin,
                threads: options.hash_threads,
                observer: observer.as_deref(),
                phase: ProgressPhase::Checkpoint,
                signal: &signal,
            })?;
            if let Err(error) = captured.cache.save(&cache_path) {
                tracing::warn!(%error, "cannot save the workspace stat cache; the next checkpoint re-hashes");
            }
            let hash = captured.manifest_hash;
            let mut metadata = Meta::new();
            metadata.insert("manifestBlob".into(), hash.to_hex().into());
            metadata.insert("entries".into(), captured.report.entries.into());
            metadata.insert("bytes".into(), captured.report.bytes.into());
            if !captured.report.skipped.is_empty() {
                metadata.insert("skippedEntries".into(), captured.report.skipped.total.into());
                captured.report.skipped.warn("/workspace");
            }
            let candidate = WorkspaceCheckpointCandidate {
                id: format!("{CANDIDATE_PREFIX}{hash}"),
                content_hash: hash.content_hash(),
                revision: generation,
                metadata: Some(metadata),
            };
            save_record(&record, &candidate)?;
            let mut report = captured.report;
            report.duration = started.elapsed();
            Ok((candidate, report))
        })
        .await
    }

    /// Writes the checkpoint `candidate` into `dest` (created if missing; must be empty).
    pub async fn export_candidate(
        &self,
        candidate: &RuntimePublicationCandidate,
        dest: &Path,
    ) -> Result<RestoreReport> {
        let hash = checkpoint_hash(candidate)?;
        let store = Arc::clone(&self.store);
        let dest = dest.to_path_buf();
        let observer = self.observer.clone();
        blocking(move || {
            let manifest = load_manifest(&store, &hash)?;
            std::fs::create_dir_all(&dest).ctx(|| format!("Cannot create {}", dest.display()))?;
            let (report, _) = restore(RestoreInput {
                content: Content::Blobs {
                    store: &store,
                    verify: true,
                    tolerate_lost: false,
                },
                manifest: &manifest,
                dest: &dest,
                record_cache: false,
                observer: observer.as_deref(),
                phase: ProgressPhase::Export,
                signal: &AbortSignal::never(),
            })?;
            Ok(report)
        })
        .await
    }

    /// The manifest of a checkpoint candidate, verified against its id and content hash.
    pub async fn read_manifest(
        &self,
        candidate: &RuntimePublicationCandidate,
    ) -> Result<WorkspaceManifest> {
        let hash = checkpoint_hash(candidate)?;
        let store = Arc::clone(&self.store);
        blocking(move || load_manifest(&store, &hash)).await
    }

    /// The logical bytes of the file `path` of a checkpoint candidate (a hard link read as its
    /// target, a sparse file with its holes as zeros), verified against the manifest; `None`
    /// when the manifest has no such file. Refuses a file larger than `max_bytes` (the caller's
    /// memory cap) with [`PersistenceError::FileTooLarge`].
    pub async fn read_file(
        &self,
        candidate: &RuntimePublicationCandidate,
        path: &str,
        max_bytes: u64,
    ) -> Result<Option<Vec<u8>>> {
        let manifest = self.read_manifest(candidate).await?;
        let mut entry = manifest.entries.iter().find(|entry| entry.path == path);
        if let Some(link) = entry.filter(|entry| entry.kind == EntryKind::Hardlink) {
            let target = link.target.as_deref();
            entry = manifest
                .entries
                .iter()
                .find(|entry| Some(entry.path.as_str()) == target);
        }
        let Some(entry) = entry.filter(|entry| entry.kind == EntryKind::File).cloned() else {
            return Ok(None);
        };
        let (Some(hash), Some(size)) = (entry.hash, entry.size) else {
            return Ok(None);
        };
        if size > max_bytes {
            return Err(PersistenceError::FileTooLarge {
                path: path.to_owned(),
                size,
                limit: max_bytes,
            });
        }
        let store = Arc::clone(&self.store);
        let path = path.to_owned();
        blocking(move || {
            let missing = || PersistenceError::MissingContent {
                path: path.clone(),
                blob: hash.to_hex(),
            };
            let stored = store.get(&hash)?.ok_or_else(missing)?;
            if stored.len() as u64 != entry.stored_size() {
                return Err(PersistenceError::CorruptContent {
                    path,
                    blob: hash.to_hex(),
                });
            }
            let Some(extents) = &entry.extents else {
                return Ok(Some(stored));
            };
            let mut bytes = vec![0u8; usize::try_from(size).unwrap_or(usize::MAX)];
            let mut from = 0usize;
            for [offset, length] in extents {
                let (offset, length) = (*offset as usize, *length as usize);
                bytes[offset..offset + length].copy_from_slice(&stored[from..from + length]);
                from += length;
            }
            Ok(Some(bytes))
        })
        .await
    }

    /// Every blob a checkpoint candidate needs (its manifest and its files), for `gc`.
    pub async fn referenced_blobs(
        &self,
        candidate: &RuntimePublicationCandidate,
    ) -> Result<HashSet<BlobHash>> {
        let hash = checkpoint_hash(candidate)?;
        let manifest = self.read_manifest(candidate).await?;
        let mut blobs = manifest.file_hashes();
        blobs.insert(hash);
        Ok(blobs)
    }

    /// Activates the stat cache a restore recorded. The sandbox can first write to the binding
    /// after `attach`, so once the racy margin has passed since the cache was written (the
    /// cache file's mtime is after every restored file's ctime), any later write lands in a
    /// later timestamp tick than the recorded stats. Usually acquiring the sandbox took longer
    /// than the margin and nothing waits. Without `attach`, the cache is never trusted.
    async fn settle_restored_cache(&self, root: &Path) {
        let pending = root.join(PENDING_CACHE_FILE);
        let Ok(meta) = tokio::fs::symlink_metadata(&pending).await else {
            return;
        };
        if let Some(wait) = meta
            .modified()
            .ok()
            .map(|written| written + self.options.racy_margin)
            .and_then(|settled| settled.duration_since(SystemTime::now()).ok())
        {
            tokio::time::sleep(wait + Duration::from_millis(1)).await;
        }
        if let Err(error) = tokio::fs::rename(&pending, root.join(STAT_CACHE_FILE)).await {
            tracing::warn!(%error, "cannot activate the restored stat cache; the next checkpoint re-hashes");
        }
    }

    fn check_strategy(&self, strategy: WorkspaceStrategy) -> Result<()> {
        if self.strategies.contains(&strategy) {
            Ok(())
        } else {
            Err(PersistenceError::UnsupportedWorkspaceStrategy(
                strategy.to_string(),
            ))
        }
    }

    fn binding_root(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        binding_id: &str,
    ) -> Result<PathBuf> {
        layout::binding_root(
            &self.data_dir,
            AREA,
            BINDING_PREFIX,
            scope,
            generation,
            binding_id,
        )
    }

    fn resolve_binding(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<PathBuf> {
        let root = self.binding_root(scope, fence.generation, &binding.binding_id)?;
        check_host_path(
            binding.metadata.as_ref(),
            &root.join("workspace"),
            &binding.binding_id,
        )?;
        Ok(root)
    }
}

/// The manifest hash a workspace candidate names, after the id and content-hash checks.
fn checkpoint_hash(candidate: &RuntimePublicationCandidate) -> Result<BlobHash> {
    candidate_manifest_hash(candidate, CANDIDATE_PREFIX).map_err(|error| match error {
        CandidateHashError::InvalidId => PersistenceError::InvalidCheckpointId,
        CandidateHashError::Mismatch => PersistenceError::CheckpointHashMismatch,
    })
}

/// Loads and parses the manifest blob `hash`, verifying its bytes hash to it.
fn load_manifest(store: &BlobStore, hash: &BlobHash) -> Result<WorkspaceManifest> {
    let bytes = match store.get(hash) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            return Err(PersistenceError::CheckpointMissing(format!(
                "{CANDIDATE_PREFIX}{hash}"
            )));
        }
        Err(PersistenceError::CorruptBlob(_)) => {
            return Err(PersistenceError::CheckpointHashMismatch);
        }
        Err(error) => return Err(error),
    };
    WorkspaceManifest::parse(&bytes)
}

fn load_record(path: &Path, store: &BlobStore) -> Option<WorkspaceCheckpointCandidate> {
    let bytes = std::fs::read(path).ok()?;
    let candidate: WorkspaceCheckpointCandidate = serde_json::from_slice(&bytes).ok()?;
    let hash = checkpoint_hash(&candidate.to_publication_candidate()).ok()?;
    // Refreshes the manifest's mtime too, so gc keeps it until the candidate is published.
    let size = std::fs::metadata(store.path_of(&hash)).ok()?.len();
    store
        .refresh_existing(&hash, size)
        .ok()?
        .then_some(candidate)
}

fn save_record(path: &Path, candidate: &WorkspaceCheckpointCandidate) -> Result<()> {
    let dir = path.parent().unwrap_or(path);
    std::fs::create_dir_all(dir).ctx(|| format!("Cannot create {}", dir.display()))?;
    let temp = path.with_extension("json.partial");
    let bytes = serde_json::to_vec(candidate).unwrap_or_default();
    std::fs::write(&temp, bytes).ctx(|| format!("Cannot write {}", temp.display()))?;
    std::fs::rename(&temp, path).ctx(|| format!("Cannot rename {}", temp.display()))
}

/// Everything `materialize` does off the async runtime.
struct MaterializeJob {
    store: Arc<BlobStore>,
    root: PathBuf,
    host_path: PathBuf,
    active: Option<BlobHash>,
    seed: Option<PathBuf>,
    options: WorkspaceOptions,
    observer: Option<Arc<dyn ProgressObserver>>,
    signal: AbortSignal,
}

impl MaterializeJob {
    fn run(&self) -> Result<Option<RestoreReport>> {
        // Load (and verify) the manifest before touching the binding. A manifest that is gone
        // or damaged loses the whole tree: the run starts from an empty workspace and says so
        // (what is lost was lost before this run; nothing more is).
        let mut lost_whole = None;
        let mut seed_root = None;
        let manifest = match (&self.active, &self.seed) {
            (Some(hash), _) => match load_manifest(&self.store, hash) {
                Ok(manifest) => Some(manifest),
                Err(
                    error @ (PersistenceError::CheckpointMissing(_)
                    | PersistenceError::CheckpointHashMismatch),
                ) => {
                    tracing::warn!(%error, "the workspace manifest is lost; starting empty");
                    lost_whole = Some(Damage {
                        object: format!("{CANDIDATE_PREFIX}{hash}"),
                        path: None,
                        problem: match error {
                            PersistenceError::CheckpointMissing(_) => {
                                "the checkpoint manifest is not in the blob store: every path of \
                                 this revision is lost; /workspace starts empty"
                            }
                            _ => {
                                "the checkpoint manifest is damaged: every path of this revision \
                                 is lost; /workspace starts empty"
                            }
                        }
                        .to_owned(),
                    });
                    None
                }
                Err(error) => return Err(error),
            },
            (None, Some(seed)) => {
                let (root, listing, skipped) = list_tree(seed, self.options.limits, &self.signal)?;
                skipped.warn("--workspace seed");
                seed_root = Some(root);
                Some(listing)
            }
            (None, None) => None,
        };
        remove_tree(&self.root).ctx(|| format!("Cannot clear {}", self.root.display()))?;
        std::fs::create_dir_all(&self.host_path)
            .ctx(|| format!("Cannot create {}", self.host_path.display()))?;
        let Some(manifest) = manifest else {
            return Ok(lost_whole.map(|lost| RestoreReport {
                lost: vec![lost],
                ..RestoreReport::default()
            }));
        };
        let (content, phase) = match &seed_root {
            // Nothing is hashed or stored: the turn's first checkpoint captures the copy.
            Some(root) => (Content::Tree(root.as_fd()), ProgressPhase::Seed),
            None => (
                Content::Blobs {
                    store: &self.store,
                    verify: self.options.verify_restore,
                    tolerate_lost: true,
                },
                ProgressPhase::Restore,
            ),
        };
        let (report, cache) = restore(RestoreInput {
            content,
            manifest: &manifest,
            dest: &self.host_path,
            record_cache: seed_root.is_none(),
            observer: self.observer.as_deref(),
            phase,
            signal: &self.signal,
        })?;
        if seed_root.is_none()
            && let Err(error) = cache.save(&self.root.join(PENDING_CACHE_FILE))
        {
            tracing::warn!(%error, "cannot save the workspace stat cache; the next checkpoint re-hashes");
        }
        Ok(Some(report))
    }
}

#[async_trait]
impl WorkspacePersistencePort for FilesystemWorkspacePort {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError> {
        Ok(WorkspacePersistenceCapabilities {
            strategies: self.strategies.clone(),
        })
    }

    async fn materialize(
        &self,
        input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError> {
        let (binding, report) = self.materialize_with_report(&input).await?;
        if let Some(report) = report {
            tracing::debug!(
                files = report.files,
                bytes = report.bytes,
                ms = report.duration.as_millis() as u64,
                "workspace restored"
            );
        }
        Ok(binding)
    }

    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError> {
        // The backend bind-mounts `hostPath`; there is nothing to copy in.
        input.signal.throw_if_aborted()?;
        self.check_strategy(input.strategy)?;
        let root = self.resolve_binding(&input.scope, &input.fence, &input.binding)?;
        self.settle_restored_cache(&root).await;
        Ok(())
    }

    async fn checkpoint(
        &self,
        input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        let (candidate, report) = self.checkpoint_with_report(&input).await?;
        tracing::debug!(
            id = %candidate.id,
            files = report.files,
            hashed = report.files_hashed,
            stored = report.blobs_stored,
            ms = report.duration.as_millis() as u64,
            "workspace checkpoint"
        );
        Ok(candidate)
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        let root = self.resolve_binding(scope, fence, binding)?;
        blocking(move || {
            remove_tree(&root).ctx(|| format!("Cannot remove {}", root.display()))?;
            prune_empty_parents(&root);
            Ok(())
        })
        .await?;
        Ok(())
    }
}
