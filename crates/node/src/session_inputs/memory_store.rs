//! [`DirMemoryStores`]: the host side of memory stores, `<data-dir>/memory/<NAME>/`.
//!
//! The store is a directory of regular files. `load` walks it without
//! following a symlink (anything but a regular file or a directory is ignored);
//! `replace` does not touch the store: it stages the write-back in the run's
//! [`MemoryStage`], which swaps it in with one `renameat2(RENAME_EXCHANGE)` (a reader sees the
//! old store or the new one, never a mix) once the run's generation published, and discards
//! it otherwise (`memory_stage.rs`). Two runs writing one store: the last to commit wins.

use super::memory_stage::{MemoryStage, io};
use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::session_inputs::memory::{valid_relative_path, valid_store_id};
use omabox_sandbox::session_inputs::{MemoryFile, MemoryStoreHost};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Memory stores in `<data-dir>/memory/<NAME>/` (module doc), with one run's stage.
#[derive(Debug, Clone)]
pub struct DirMemoryStores {
    root: PathBuf,
    stage: Arc<MemoryStage>,
}

/// How many entries `load` reads before it gives up (the store is the host's, but it is
/// written from sandboxes).
const MAX_LOAD_ENTRIES: usize = 10_000;

impl DirMemoryStores {
    /// Stores under `<data_dir>/memory` (created 0700 when first written).
    pub fn new(data_dir: &crate::DataDir) -> Self {
        let root = data_dir.memory();
        Self {
            stage: Arc::new(MemoryStage::new(root.clone())),
            root,
        }
    }

    /// This run's stage: the fence decorator commits or discards it.
    pub fn stage(&self) -> Arc<MemoryStage> {
        Arc::clone(&self.stage)
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
        if std::fs::symlink_metadata(&dir).is_ok_and(|meta| !meta.is_dir()) {
            return Err(PortError::new(format!(
                "{} is not a directory",
                dir.display()
            )));
        }
        let (stage, id) = (Arc::clone(&self.stage), id.to_owned());
        tokio::task::spawn_blocking(move || stage.stage(&id, &files))
            .await
            .map_err(|e| PortError::new(format!("the memory store task failed: {e}")))?
    }
}
