//! Session inputs of `omabox run` (`--resource`): the resource specs users type, the access
//! port that reads omabox's file store (the proxy crate's promoted store), and the host
//! side of memory stores (`<data-dir>/memory/<NAME>/`). The materializer itself is the
//! sandbox crate's generic one (`omabox_sandbox::session_inputs`).
//!
//! ```text
//!   --resource file:ID:/abs/path             {type:file, file_id, mount_path}
//!   --resource git:URL[@REF]:/workspace/dir  {type:github_repository, url, mount_path,
//!                                             checkout: branch REF | commit REF (hex)}
//!   --resource memory:NAME[:ro|:rw]          {type:memory_store, memory_store_id: NAME,
//!                                             mount_path: /mnt/memory/NAME, access}
//! ```
//!
//! Memory stores: the store is a directory of regular files. `load` walks it without
//! following a symlink (anything but a regular file or a directory is ignored);
//! `replace` writes a new directory beside it (`.tmp-<NAME>-<random>`, files created
//! `O_EXCL`, synced) and swaps it in with one `renameat2(RENAME_EXCHANGE)`, so a reader sees
//! the old store or the new one, never a mix. Two runs writing one store: the last to
//! synchronize wins.

use anyhow::Context as _;
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, DownloadedSessionFile, PortError, RuntimeSessionResourceSnapshot,
    SessionInputAccessPort,
};
use omabox_proxy::promoted::PromotedStore;
use omabox_sandbox::session_inputs::memory::{valid_relative_path, valid_store_id};
use omabox_sandbox::session_inputs::{
    FILE, GITHUB_REPOSITORY, MEMORY_ROOT, MEMORY_STORE, MemoryFile, MemoryStoreHost,
    valid_mount_path,
};
use serde_json::json;
use std::io::Read as _;
use std::path::{Path, PathBuf};

/// A run's Session resources and metadata (`--session-json`, then `--resource`).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct SessionInputs {
    /// In materialization order.
    #[serde(default)]
    pub resources: Vec<RuntimeSessionResourceSnapshot>,
    /// Application-owned metadata, preserved exactly.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl SessionInputs {
    /// `session_json`'s resources and metadata (unknown keys such as `id` are ignored),
    /// then `flags`.
    pub fn load(
        session_json: Option<&Path>,
        flags: &[RuntimeSessionResourceSnapshot],
    ) -> anyhow::Result<Self> {
        let mut inputs = match session_json {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("--session-json {}", path.display()))?;
                Self::parse(&text).with_context(|| format!("--session-json {}", path.display()))?
            }
            None => Self::default(),
        };
        inputs.resources.extend(flags.iter().cloned());
        Ok(inputs)
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        Ok(serde_json::from_str(text)?)
    }
}

/// The largest file a `file` resource may carry.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// Parses one `--resource` spec (module doc).
pub fn parse_resource(spec: &str) -> Result<RuntimeSessionResourceSnapshot, String> {
    let (kind, rest) = spec
        .split_once(':')
        .ok_or_else(|| format!("{spec:?}: expected file:…, git:… or memory:…"))?;
    let value = match kind {
        "file" => {
            let (id, path) = rest
                .split_once(':')
                .ok_or("file:ID:/abs/path (the id `omabox files add` printed)")?;
            if id.is_empty() {
                return Err("file:ID:/abs/path needs an id".into());
            }
            check_mount(path)?;
            json!({"type": FILE, "file_id": id, "mount_path": path})
        }
        "git" => {
            let at = rest
                .rfind(":/")
                .ok_or("git:URL[@REF]:/workspace/dir needs a mount path")?;
            let (url, path) = (&rest[..at], &rest[at + 1..]);
            if !url.contains("://") {
                return Err("git:URL[@REF]:/workspace/dir needs a URL".into());
            }
            check_mount(path)?;
            let (url, reference) = split_ref(url);
            let mut value = json!({"type": GITHUB_REPOSITORY, "url": url, "mount_path": path});
            if let Some(reference) = reference {
                value["checkout"] = if is_commit(reference) {
                    json!({"type": "commit", "sha": reference})
                } else {
                    json!({"type": "branch", "name": reference})
                };
            }
            value
        }
        "memory" => {
            let (name, access) = match rest.split_once(':') {
                None => (rest, "read_write"),
                Some((name, "ro")) => (name, "read_only"),
                Some((name, "rw")) => (name, "read_write"),
                Some(_) => return Err("memory:NAME[:ro|:rw]".into()),
            };
            if !valid_store_id(name) {
                return Err(format!(
                    "memory store name {name:?}: use 1–64 characters of A–Z, a–z, 0–9, '.', \
                     '_' and '-', not starting with '.'"
                ));
            }
            json!({"type": MEMORY_STORE, "memory_store_id": name,
                   "mount_path": format!("{MEMORY_ROOT}/{name}"), "access": access})
        }
        other => {
            return Err(format!(
                "unknown resource type {other:?}: use file, git or memory"
            ));
        }
    };
    serde_json::from_value(value).map_err(|e| e.to_string())
}

fn check_mount(path: &str) -> Result<(), String> {
    if valid_mount_path(path) {
        Ok(())
    } else {
        Err(format!(
            "mount path {path:?} must be absolute and may not traverse parents"
        ))
    }
}

/// `URL@REF` → (URL, REF) when the `@` is in the path (an `@` before the host is user info,
/// which the materializer refuses).
fn split_ref(url: &str) -> (&str, Option<&str>) {
    let path_start = url
        .find("://")
        .map(|i| i + 3)
        .and_then(|host| url[host..].find('/').map(|p| host + p));
    match (path_start, url.rfind('@')) {
        (Some(path), Some(at)) if at > path && at + 1 < url.len() => {
            (&url[..at], Some(&url[at + 1..]))
        }
        _ => (url, None),
    }
}

/// A hexadecimal REF of 7–64 digits is a commit (the reference's sha rule); else a branch.
fn is_commit(reference: &str) -> bool {
    (7..=64).contains(&reference.len()) && reference.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Whether any resource needs the network (a repository).
pub fn clones_repositories(resources: &[RuntimeSessionResourceSnapshot]) -> bool {
    resources
        .iter()
        .any(|r| r.resource_type == GITHUB_REPOSITORY)
}

/// Whether any resource is a memory store.
pub fn uses_memory_stores(resources: &[RuntimeSessionResourceSnapshot]) -> bool {
    resources.iter().any(|r| r.resource_type == MEMORY_STORE)
}

/// `file` resources from omabox's file store (`<data-dir>/promoted`).
#[derive(Debug, Clone)]
pub struct PromotedFileAccess {
    store: PromotedStore,
}

impl PromotedFileAccess {
    /// Reads `store`.
    pub fn new(store: PromotedStore) -> Self {
        Self { store }
    }
}

#[async_trait]
impl SessionInputAccessPort for PromotedFileAccess {
    async fn download_file(
        &self,
        file_id: &str,
        signal: AbortSignal,
    ) -> Result<DownloadedSessionFile, PortError> {
        signal.throw_if_aborted()?;
        let store = self.store.clone();
        let id = file_id.to_owned();
        tokio::task::spawn_blocking(move || {
            let Some((record, file)) = store
                .open_file(&id)
                .map_err(|e| PortError::new(format!("cannot read file {id}: {e}")))?
            else {
                return Err(PortError::new(format!(
                    "no such file in omabox's file store: {id}"
                )));
            };
            if record.size > MAX_FILE_BYTES {
                return Err(PortError::new(format!(
                    "file {id} is larger than {} MiB",
                    MAX_FILE_BYTES >> 20
                )));
            }
            let mut content = Vec::with_capacity(record.size as usize);
            file.take(MAX_FILE_BYTES + 1)
                .read_to_end(&mut content)
                .map_err(|e| PortError::new(format!("cannot read file {id}: {e}")))?;
            if content.len() as u64 != record.size {
                return Err(PortError::new(format!(
                    "file {id} changed size in the store"
                )));
            }
            Ok(DownloadedSessionFile {
                content,
                filename: None,
                mime_type: Some(record.media_type),
            })
        })
        .await
        .map_err(|e| PortError::new(format!("the file store task failed: {e}")))?
    }
}

/// Memory stores in `<data-dir>/memory/<NAME>/` (module doc).
#[derive(Debug, Clone)]
pub struct DirMemoryStores {
    root: PathBuf,
}

/// How many entries `load` reads before it gives up (the store is the host's, but it is
/// written from sandboxes).
const MAX_LOAD_ENTRIES: usize = 10_000;

impl DirMemoryStores {
    /// Stores under `<data_dir>/memory` (created 0700 when first written).
    pub fn new(data_dir: &Path) -> Self {
        Self {
            root: data_dir.join("memory"),
        }
    }

    fn store_dir(&self, id: &str) -> Result<PathBuf, PortError> {
        if !valid_store_id(id) {
            return Err(PortError::new(format!("invalid memory store name {id:?}")));
        }
        Ok(self.root.join(id))
    }

    fn load_blocking(dir: &Path) -> Result<Vec<MemoryFile>, PortError> {
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => {
                return Err(PortError::new(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io(dir, e)),
        }
        let mut files = Vec::new();
        let mut pending = vec![(dir.to_path_buf(), String::new())];
        let mut seen = 0_usize;
        while let Some((path, prefix)) = pending.pop() {
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && prefix.is_empty() => {
                    return Ok(Vec::new());
                }
                Err(e) => return Err(io(&path, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io(&path, e))?;
                seen += 1;
                if seen > MAX_LOAD_ENTRIES {
                    return Err(PortError::new(format!(
                        "memory store {} has more than {MAX_LOAD_ENTRIES} entries",
                        dir.display()
                    )));
                }
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let relative = if prefix.is_empty() {
                    name
                } else {
                    format!("{prefix}/{name}")
                };
                if !valid_relative_path(&relative) {
                    continue;
                }
                // `file_type` is lstat's: a symlink is neither a file nor a directory here.
                let kind = entry.file_type().map_err(|e| io(&entry.path(), e))?;
                if kind.is_dir() {
                    pending.push((entry.path(), relative));
                } else if kind.is_file() {
                    let bytes = read_nofollow(&entry.path())?;
                    files.push(MemoryFile {
                        path: relative,
                        bytes,
                    });
                }
            }
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    fn replace_blocking(root: &Path, dir: &Path, files: Vec<MemoryFile>) -> Result<(), PortError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(root)
            .map_err(|e| io(root, e))?;
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or("store");
        remove_stale_temps(root, name);
        let temp = root.join(format!(".tmp-{name}-{:016x}", rand::random::<u64>()));
        let write = || -> Result<(), PortError> {
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&temp)
                .map_err(|e| io(&temp, e))?;
            for file in &files {
                if !valid_relative_path(&file.path) {
                    return Err(PortError::new("unsafe path"));
                }
                let target = temp.join(&file.path);
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
            Ok(())
        };
        if let Err(error) = write() {
            let _ = std::fs::remove_dir_all(&temp);
            return Err(error);
        }
        let swapped = match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => exchange(&temp, dir).map(|()| true),
            Ok(_) => Err(PortError::new(format!(
                "{} is not a directory",
                dir.display()
            ))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::rename(&temp, dir)
                .map(|()| false)
                .map_err(|e| io(dir, e)),
            Err(e) => Err(io(dir, e)),
        };
        match swapped {
            // `temp` now holds the old store (remove_dir_all never follows a symlink).
            Ok(true) => {
                let _ = std::fs::remove_dir_all(&temp);
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(error) => {
                let _ = std::fs::remove_dir_all(&temp);
                Err(error)
            }
        }
    }
}

/// Leftovers of `store`'s replacements interrupted over an hour ago (a crash between writing
/// and swapping).
fn remove_stale_temps(root: &Path, store: &str) {
    let prefix = format!(".tmp-{store}-");
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > std::time::Duration::from_secs(3600));
        if old && entry.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Swaps two paths atomically.
fn exchange(a: &Path, b: &Path) -> Result<(), PortError> {
    use std::os::unix::ffi::OsStrExt as _;
    let c = |p: &Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| PortError::new(format!("{} has a NUL byte", p.display())))
    };
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two NUL-terminated paths that outlive the call; no memory is shared.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io(b, std::io::Error::last_os_error()))
    }
}

fn read_nofollow(path: &Path) -> Result<Vec<u8>, PortError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io(path, e))?;
    let mut bytes = Vec::new();
    file.take(64 << 20)
        .read_to_end(&mut bytes)
        .map_err(|e| io(path, e))?;
    Ok(bytes)
}

fn io(path: &Path, error: std::io::Error) -> PortError {
    PortError::new(format!("memory store {}: {error}", path.display()))
}

#[async_trait]
impl MemoryStoreHost for DirMemoryStores {
    async fn load(&self, id: &str) -> Result<Vec<MemoryFile>, PortError> {
        let dir = self.store_dir(id)?;
        tokio::task::spawn_blocking(move || Self::load_blocking(&dir))
            .await
            .map_err(|e| PortError::new(format!("the memory store task failed: {e}")))?
    }

    async fn replace(&self, id: &str, files: Vec<MemoryFile>) -> Result<(), PortError> {
        let dir = self.store_dir(id)?;
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || Self::replace_blocking(&root, &dir, files))
            .await
            .map_err(|e| PortError::new(format!("the memory store task failed: {e}")))?
    }
}

/// `omabox files add PATH`: copies PATH into the file store; returns the new id.
pub fn add_file(data_dir: &Path, path: &Path) -> anyhow::Result<omabox_proxy::files::PromotedFile> {
    use sha2::{Digest as _, Sha256};
    let store = PromotedStore::open(data_dir).context("cannot open the file store")?;
    let open =
        || std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()));
    let mut hasher = Sha256::new();
    std::io::copy(&mut open()?, &mut hasher)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let hash: [u8; 32] = hasher.finalize().into();
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let media_type = omabox_persistence::guess_media_type(&name);
    let record = store
        .promote(open()?, &hash, media_type, "", &name)
        .with_context(|| format!("cannot store {}", path.display()))?;
    Ok(omabox_proxy::files::PromotedFile::from(&record))
}

#[cfg(test)]
mod tests;
