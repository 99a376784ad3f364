//! Memory-store write-backs held back until the run's publication: the memory stores and the
//! workspace change together or not at all.
//!
//! A run's write-backs (`MemoryStoreHost::replace`: periodic and final syncs) go into its
//! *stage*, a directory locked (flock) for the run's life:
//!
//! ```text
//! <data-dir>/memory/.pending/<pid>-<16 hex>/
//!     stage.json                 {claim: {scope, generation}, stores: {NAME: {base, staged}}}
//!     <NAME>/                    the store as last synchronized (replaced whole per sync)
//!     .tmp-<NAME>-<16 hex>/      a sync being written
//! ```
//!
//! Once the claim's generation published, the stage is committed: each `<NAME>` is swapped
//! into `memory/<NAME>` with one `renameat2(RENAME_EXCHANGE)` (a reader sees the old store or
//! the new one) and the old copy removed; otherwise it is discarded. Between two runs of one
//! store the last to commit wins, as before.
//!
//! A run killed anywhere leaves its stage with its lock free. [`recover`] (`omabox reap`, and
//! every `omabox run` before it starts) then asks the publication history: the claim's
//! generation published → commit, else → discard. In recovery a store is rolled forward only
//! while it is still the one the stage started from (`base`: its inode and ctime at the first
//! sync); one changed since — another run committed later, a user edited it — is left alone
//! and reported `superseded`. `staged` (the staged directory's inode, which lives on in
//! `memory/<NAME>` after the swap) recognizes a commit that a kill cut short after the swap.
//!
//! Must never: commit a stage whose generation did not publish, touch a stage whose owner is
//! alive (its lock is held), follow a symlink, or read a `stage.json` over 1 MiB.

use omabox_contract::{PortError, RuntimeResourceScope};
use omabox_sandbox::session_inputs::MemoryFile;
use omabox_sandbox::session_inputs::memory::valid_relative_path;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read as _;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

/// The stages' directory under the memory root (`.`: never a store name).
pub const PENDING_DIR: &str = crate::data_dir::MEMORY_STAGES;
const STAGE_FILE: &str = "stage.json";
const STAGE_FILE_MAX: u64 = 1 << 20;
/// Legacy temp dirs of direct replacements (omabox before stages) older than this are
/// abandoned.
const LEGACY_TEMP_AGE: std::time::Duration = std::time::Duration::from_secs(3600);

/// The fence claim a stage belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Claim {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence generation whose publication commits the stage.
    pub generation: u64,
}

/// A directory as found: inode and ctime (a swap makes a new inode current; a change inside
/// moves the ctime).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DirIdentity {
    ino: u64,
    ctime_ns: i128,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StagedStore {
    /// `memory/<NAME>` when the stage first synchronized it (`None`: it did not exist).
    base: Option<DirIdentity>,
    /// The inode of the staged directory.
    staged_ino: u64,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StageFile {
    claim: Option<Claim>,
    stores: BTreeMap<String, StagedStore>,
}

struct OpenStage {
    dir: PathBuf,
    /// The stage's flock, held while this process lives.
    _lock: File,
    file: StageFile,
}

#[derive(Default)]
struct State {
    claim: Option<Claim>,
    open: Option<OpenStage>,
}

/// One run's stage of memory-store write-backs (module doc). Blocking methods.
pub struct MemoryStage {
    root: PathBuf,
    state: Mutex<State>,
}

impl std::fmt::Debug for MemoryStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStage")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl MemoryStage {
    /// The stage of a run whose stores live under `root` (`<data-dir>/memory`). Nothing is
    /// created before the first write-back.
    pub fn new(root: PathBuf) -> Self {
        Self {
            root,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The run claimed `scope` as `generation`: the stage commits when that publishes.
    pub fn set_claim(&self, scope: RuntimeResourceScope, generation: u64) {
        let claim = Claim { scope, generation };
        let mut state = self.state();
        if let Some(open) = &mut state.open {
            open.file.claim = Some(claim.clone());
            if let Err(error) = write_stage_file(&open.dir, &open.file) {
                tracing::warn!(%error, "cannot record the memory stage's claim");
            }
        }
        state.claim = Some(claim);
    }

    /// The claim this stage commits on, if any.
    pub fn claim(&self) -> Option<Claim> {
        self.state().claim.clone()
    }

    /// True while write-backs wait for the publication.
    pub fn is_pending(&self) -> bool {
        self.state().open.is_some()
    }

    /// Stages `files` as store `id` (replacing what this run staged for it before).
    pub fn stage(&self, id: &str, files: &[MemoryFile]) -> Result<(), PortError> {
        let mut state = self.state();
        if state.open.is_none() {
            let claim = state.claim.clone();
            state.open = Some(self.open_stage(claim)?);
        }
        let Some(open) = state.open.as_mut() else {
            return Err(PortError::new("the memory stage is not open"));
        };
        let temp = open
            .dir
            .join(format!(".tmp-{id}-{:016x}", rand::random::<u64>()));
        if let Err(error) = write_tree(&temp, files) {
            let _ = std::fs::remove_dir_all(&temp);
            return Err(error);
        }
        omabox_sandbox::fault::point("memory-store-temp-written");
        let staged = open.dir.join(id);
        let swapped = match std::fs::symlink_metadata(&staged) {
            Ok(_) => exchange(&temp, &staged).map(|()| true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::rename(&temp, &staged)
                .map(|()| false)
                .map_err(|e| io(&staged, e)),
            Err(e) => Err(io(&staged, e)),
        };
        match swapped {
            Ok(true) => {
                let _ = std::fs::remove_dir_all(&temp);
            }
            Ok(false) => {}
            Err(error) => {
                let _ = std::fs::remove_dir_all(&temp);
                return Err(error);
            }
        }
        let staged_ino = std::fs::symlink_metadata(&staged)
            .map_err(|e| io(&staged, e))?
            .ino();
        let base = match open.file.stores.get(id) {
            Some(known) => known.base,
            None => identity(&self.root.join(id))?,
        };
        open.file
            .stores
            .insert(id.to_owned(), StagedStore { base, staged_ino });
        write_stage_file(&open.dir, &open.file)?;
        omabox_sandbox::fault::point("memory-store-staged");
        Ok(())
    }

    fn open_stage(&self, claim: Option<Claim>) -> Result<OpenStage, PortError> {
        use std::os::unix::fs::DirBuilderExt as _;
        let pending = self.root.join(PENDING_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&pending)
            .map_err(|e| io(&pending, e))?;
        let dir = pending.join(format!(
            "{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io(&dir, e))?;
        let lock = File::open(&dir).map_err(|e| io(&dir, e))?;
        rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| io(&dir, e.into()))?;
        let file = StageFile {
            claim,
            stores: BTreeMap::new(),
        };
        write_stage_file(&dir, &file)?;
        Ok(OpenStage {
            dir,
            _lock: lock,
            file,
        })
    }

    /// Ends the stage: with `published`, every staged store is swapped into place; then the
    /// stage is removed. A failed commit keeps the stage (on disk, and open here) for a retry
    /// or for [`recover`]. Nothing staged: nothing to do.
    pub fn finish(&self, published: bool) -> Result<Vec<String>, PortError> {
        let mut state = self.state();
        let Some(open) = state.open.as_ref() else {
            return Ok(Vec::new());
        };
        let mut committed = Vec::new();
        if published {
            for (id, staged) in &open.file.stores {
                if commit_store(&self.root, &open.dir, id, staged, false)? == Commit::Done {
                    committed.push(id.clone());
                }
                omabox_sandbox::fault::point("memory-store-committing");
            }
        }
        let dir = open.dir.clone();
        state.open = None;
        remove_stage(&dir);
        Ok(committed)
    }
}

/// What [`recover`] did.
#[derive(Debug, Default, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryRecovery {
    /// Stores of dead runs' stages committed (their generation published): `NAME`.
    pub committed: Vec<String>,
    /// Stages of dead runs discarded (their generation never published).
    pub discarded: u64,
    /// Stores not rolled forward because they changed after the stage started.
    pub superseded: Vec<String>,
    /// Stages of live runs (kept).
    pub live: u64,
    /// Abandoned temp dirs of older omabox versions removed.
    pub legacy_temps_removed: u64,
    /// What could not be done.
    pub errors: Vec<String>,
}

/// Commits or discards the stages of dead runs under `<data_dir>/memory` (module doc);
/// `published(claim)` says whether the claim's generation published.
pub fn recover(
    data_dir: &crate::DataDir,
    published: &dyn Fn(&Claim) -> Result<bool, String>,
) -> MemoryRecovery {
    let root = data_dir.memory();
    let mut report = MemoryRecovery::default();
    remove_legacy_temps(&root, &mut report);
    let Ok(entries) = std::fs::read_dir(root.join(PENDING_DIR)) else {
        return report;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            continue;
        }
        let Ok(lock) = File::open(&dir) else { continue };
        match rustix::fs::flock(&lock, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                report.live += 1;
                continue;
            }
            Err(error) => {
                report
                    .errors
                    .push(format!("cannot lock {}: {error}", dir.display()));
                continue;
            }
        }
        let file = read_stage_file(&dir);
        let commit = match file.as_ref().and_then(|file| file.claim.as_ref()) {
            Some(claim) => match published(claim) {
                Ok(published) => published,
                Err(error) => {
                    report.errors.push(format!(
                        "memory stage {}: cannot read the publication history: {error}",
                        dir.display()
                    ));
                    continue;
                }
            },
            None => false,
        };
        if let (true, Some(file)) = (commit, &file) {
            let mut failed = false;
            for (id, staged) in &file.stores {
                match commit_store(&root, &dir, id, staged, true) {
                    Ok(Commit::Done) => report.committed.push(id.clone()),
                    Ok(Commit::Superseded) => report.superseded.push(id.clone()),
                    Ok(Commit::Nothing) => {}
                    Err(error) => {
                        failed = true;
                        report.errors.push(format!("memory store {id}: {error}"));
                    }
                }
            }
            if failed {
                continue;
            }
        } else {
            report.discarded += 1;
        }
        remove_stage(&dir);
    }
    report
}

#[derive(Debug, PartialEq, Eq)]
enum Commit {
    Done,
    Nothing,
    Superseded,
}

/// Swaps the staged `id` into `root/<id>` (module doc). `check_base`: only while the live
/// store is still the stage's base.
fn commit_store(
    root: &Path,
    stage: &Path,
    id: &str,
    staged: &StagedStore,
    check_base: bool,
) -> Result<Commit, PortError> {
    let live = root.join(id);
    let source = stage.join(id);
    let live_identity = identity(&live)?;
    if live_identity.is_some_and(|found| found.ino == staged.staged_ino) {
        // A kill cut the commit short after the swap: `source` holds the old copy.
        let _ = std::fs::remove_dir_all(&source);
        return Ok(Commit::Done);
    }
    match std::fs::symlink_metadata(&source) {
        Ok(meta) if meta.is_dir() && meta.ino() == staged.staged_ino => {}
        Ok(_) => return Ok(Commit::Nothing),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Commit::Nothing),
        Err(e) => return Err(io(&source, e)),
    }
    if check_base && live_identity != staged.base {
        return Ok(Commit::Superseded);
    }
    match live_identity {
        Some(_) => {
            exchange(&source, &live)?;
            // `source` now holds the old store.
            let _ = std::fs::remove_dir_all(&source);
        }
        None => std::fs::rename(&source, &live).map_err(|e| io(&live, e))?,
    }
    sync_dir(root)?;
    Ok(Commit::Done)
}

/// `dir`'s identity, `None` when it does not exist; anything but a directory is refused.
fn identity(dir: &Path) -> Result<Option<DirIdentity>, PortError> {
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() => Ok(Some(DirIdentity {
            ino: meta.ino(),
            ctime_ns: i128::from(meta.ctime()) * 1_000_000_000 + i128::from(meta.ctime_nsec()),
        })),
        Ok(_) => Err(PortError::new(format!(
            "{} is not a directory",
            dir.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io(dir, e)),
    }
}

/// Writes `files` into the new directory `dir` (0700; files `O_EXCL|O_NOFOLLOW`, 0600,
/// synced), every path validated again.
pub(super) fn write_tree(dir: &Path, files: &[MemoryFile]) -> Result<(), PortError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(dir)
        .map_err(|e| io(dir, e))?;
    for file in files {
        if !valid_relative_path(&file.path) {
            return Err(PortError::new("unsafe path"));
        }
        let target = dir.join(&file.path);
        if let Some(parent) = target.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|e| io(parent, e))?;
        }
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&target)
            .map_err(|e| io(&target, e))?;
        std::io::Write::write_all(&mut out, &file.bytes)
            .and_then(|()| out.sync_all())
            .map_err(|e| io(&target, e))?;
    }
    sync_dir(dir)
}

fn write_stage_file(dir: &Path, file: &StageFile) -> Result<(), PortError> {
    let temp = dir.join(format!("{STAGE_FILE}.tmp"));
    let bytes = serde_json::to_vec(file)
        .map_err(|e| PortError::new(format!("cannot encode the memory stage: {e}")))?;
    std::fs::write(&temp, bytes)
        .and_then(|()| File::open(&temp)?.sync_all())
        .map_err(|e| io(&temp, e))?;
    std::fs::rename(&temp, dir.join(STAGE_FILE)).map_err(|e| io(dir, e))?;
    sync_dir(dir)
}

fn read_stage_file(dir: &Path) -> Option<StageFile> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dir.join(STAGE_FILE))
        .ok()?;
    let mut bytes = Vec::new();
    file.take(STAGE_FILE_MAX).read_to_end(&mut bytes).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Removes a stage directory (ours: written by omabox, never a symlink followed).
fn remove_stage(dir: &Path) {
    if let Err(error) = std::fs::remove_dir_all(dir) {
        tracing::warn!(%error, dir = %dir.display(), "cannot remove a memory stage");
    }
}

/// `memory/.tmp-<NAME>-<hex>` dirs of direct replacements by omabox before stages, abandoned
/// for over an hour (such a writer never took a lock).
fn remove_legacy_temps(root: &Path, report: &mut MemoryRecovery) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > LEGACY_TEMP_AGE);
        let temp = entry.file_name().to_string_lossy().starts_with(".tmp-");
        if old && temp && std::fs::remove_dir_all(entry.path()).is_ok() {
            report.legacy_temps_removed += 1;
        }
    }
}

fn sync_dir(dir: &Path) -> Result<(), PortError> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io(dir, e))
}

/// Swaps two paths atomically (`renameat2` with `RENAME_EXCHANGE`).
pub(super) fn exchange(a: &Path, b: &Path) -> Result<(), PortError> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(|e| io(b, std::io::Error::from(e)))
}

pub(super) fn io(path: &Path, error: std::io::Error) -> PortError {
    PortError::new(format!("memory store {}: {error}", path.display()))
}
