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
//! The host store of memory stores is [`DirMemoryStores`] (`memory_store.rs`); its write-backs
//! wait in the run's stage until the run published (`memory_stage.rs`, committed by the fence
//! decorator [`MemoryCommitFence`], `memory_fence.rs`; a dead run's stage is finished by
//! [`recover_memory_stages`]).

use anyhow::Context as _;
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, DownloadedSessionFile, PortError, RuntimeSessionResourceSnapshot,
    SessionInputAccessPort,
};
use omabox_proxy::promoted::PromotedStore;
use omabox_sandbox::session_inputs::memory::valid_store_id;
use omabox_sandbox::session_inputs::{
    FILE, GITHUB_REPOSITORY, MEMORY_ROOT, MEMORY_STORE, valid_mount_path,
};
use serde_json::json;
use std::io::Read as _;
use std::path::Path;

mod memory_fence;
pub(crate) mod memory_stage;
mod memory_store;
pub use memory_fence::{MemoryCommitFence, generation_published};
pub use memory_stage::{MemoryRecovery, recover as recover_memory_stages};
pub use memory_store::DirMemoryStores;

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
                let text = crate::input_file::read_text(
                    path,
                    "--session-json",
                    crate::input_file::DOCUMENT_MAX,
                )?;
                Self::parse(&text).with_context(|| format!("--session-json {}", path.display()))?
            }
            None => Self::default(),
        };
        inputs.resources.extend(flags.iter().cloned());
        // Everything a resource can be judged by without a sandbox is judged now, before
        // the run claims its fence (a bad one would otherwise fail after it).
        for resource in &inputs.resources {
            omabox_sandbox::session_inputs::validate(resource)
                .map_err(|error| anyhow::anyhow!("{}", error.message()))?;
        }
        Ok(inputs)
    }

    /// Session resources given as the contract's JSON shapes (`omabox serve`'s run body),
    /// judged as [`Self::load`] judges them.
    pub fn from_resources(resources: &[serde_json::Value]) -> anyhow::Result<Self> {
        let mut inputs = Self::default();
        for (index, resource) in resources.iter().enumerate() {
            let resource: RuntimeSessionResourceSnapshot = serde_json::from_value(resource.clone())
                .map_err(|error| {
                    anyhow::anyhow!("`resources[{index}]` is not a session resource: {error}")
                })?;
            omabox_sandbox::session_inputs::validate(&resource)
                .map_err(|error| anyhow::anyhow!("`resources[{index}]`: {}", error.message()))?;
            inputs.resources.push(resource);
        }
        Ok(inputs)
    }

    /// Every `file` resource names a file of the store in `data_dir` no larger than a file
    /// resource may carry (checked before the run claims its fence).
    pub fn check_files(&self, data_dir: &crate::DataDir) -> anyhow::Result<()> {
        let ids: Vec<&str> = self
            .resources
            .iter()
            .filter(|r| r.resource_type == FILE)
            .filter_map(|r| r.str_field("file_id"))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let store =
            PromotedStore::open(&data_dir.files_home()).context("cannot open the file store")?;
        for id in ids {
            let record = store
                .open_file(id)
                .with_context(|| format!("file resource {id}: cannot read it"))?
                .map(|(record, _)| record);
            match record {
                None => anyhow::bail!(
                    "file resource {id}: no such file in omabox's file store (`omabox files \
                     add PATH` prints the id to use)"
                ),
                Some(record) if record.size > MAX_FILE_BYTES => anyhow::bail!(
                    "file resource {id}: too large (max {})",
                    crate::input_file::human(MAX_FILE_BYTES)
                ),
                Some(_) => {}
            }
        }
        Ok(())
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

/// `omabox files add PATH`: copies PATH into the file store; returns the new id.
pub fn add_file(
    data_dir: &crate::DataDir,
    path: &Path,
) -> anyhow::Result<omabox_proxy::files::PromotedFile> {
    use sha2::{Digest as _, Sha256};
    let store =
        PromotedStore::open(&data_dir.files_home()).context("cannot open the file store")?;
    // A file resource carries at most MAX_FILE_BYTES: a larger file (or /dev/zero) is
    // refused here, not stored to fail every run that names it.
    let open = || {
        crate::input_file::open(path, "omabox files add", MAX_FILE_BYTES)
            .map(|file| file.take(MAX_FILE_BYTES + 1))
    };
    let mut hasher = Sha256::new();
    let (mut file, mut copied, mut chunk) = (open()?, 0u64, vec![0u8; 64 * 1024]);
    loop {
        let n = match std::io::Read::read(&mut file, &mut chunk) {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            read => read.with_context(|| format!("cannot read {}", path.display()))?,
        };
        if n == 0 {
            break;
        }
        hasher.update(&chunk[..n]);
        copied += n as u64;
    }
    if copied > MAX_FILE_BYTES {
        anyhow::bail!(
            "omabox files add {}: too large (max {})",
            path.display(),
            crate::input_file::human(MAX_FILE_BYTES)
        );
    }
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
