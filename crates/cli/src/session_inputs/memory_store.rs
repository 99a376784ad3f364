//! [`DirMemoryStores`]: the host side of memory stores, `<data-dir>/memory/<NAME>/`.
//!
//! The store is a directory of regular files. `load` walks it without
//! following a symlink (anything but a regular file or a directory is ignored);
//! `replace` writes a new directory beside it (`.tmp-<NAME>-<random>`, files created
//! `O_EXCL`, synced) and swaps it in with one `renameat2(RENAME_EXCHANGE)`, so a reader sees
//! the old store or the new one, never a mix. Two runs writing one store: the last to
//! synchronize wins.

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::session_inputs::memory::{valid_relative_path, valid_store_id};
use omabox_sandbox::session_inputs::{MemoryFile, MemoryStoreHost};
use std::io::Read as _;
use std::path::{Path, PathBuf};

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

/// Swaps two paths atomically (`renameat2` with `RENAME_EXCHANGE`).
fn exchange(a: &Path, b: &Path) -> Result<(), PortError> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(|e| io(b, std::io::Error::from(e)))
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
