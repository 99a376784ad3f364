//! `memory_store` resources owned by the materializer: a host-side store ([`MemoryStoreHost`])
//! copied into the sandbox at materialize, and scanned back at synchronize.
//!
//! Everything read back is hostile: the scan is one `find` whose output is parsed with caps
//! on entries and bytes before any file is read; only regular files are taken (directories
//! are implied by paths, symlinks and other types are ignored, since `find` does not follow
//! them); every path must be relative, of plain segments, valid UTF-8 without control
//! characters, and not too deep or long ("unsafe path"). The host store checks paths again
//! when it writes: this module is not its only caller.
//!
//! `read_only` stores are copied in with every write bit removed (advisory: a process in
//! the sandbox may chmod them back) and are never scanned back, so a change never reaches
//! the host store.

use super::{MEMORY_ROOT, shell_quote, valid_mount_path};
use crate::port::SandboxPort;
use async_trait::async_trait;
use omabox_contract::{AbortSignal, PortError, RuntimeSessionResourceSnapshot};

/// One file of a memory store: a checked relative path and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryFile {
    /// `a/b.md`: plain segments joined by `/` (see [`valid_relative_path`]).
    pub path: String,
    /// The content.
    pub bytes: Vec<u8>,
}

/// The host side of memory stores.
#[async_trait]
pub trait MemoryStoreHost: Send + Sync {
    /// Every file of store `id` (empty for a store that does not exist yet).
    async fn load(&self, id: &str) -> Result<Vec<MemoryFile>, PortError>;
    /// Replaces store `id` with exactly `files`, atomically: a reader sees the old store
    /// or the new one.
    async fn replace(&self, id: &str, files: Vec<MemoryFile>) -> Result<(), PortError>;
}

/// Caps on one store read back from a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryStoreLimits {
    /// Entries (files and directories).
    pub max_entries: usize,
    /// Bytes of all files together.
    pub max_bytes: u64,
}

impl Default for MemoryStoreLimits {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}

/// A checked `memory_store` resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MemoryResource {
    pub id: String,
    pub mount: String,
    pub read_only: bool,
}

impl MemoryResource {
    pub fn parse(resource: &RuntimeSessionResourceSnapshot) -> Result<Self, PortError> {
        let id = resource
            .str_field("memory_store_id")
            .filter(|id| valid_store_id(id))
            .ok_or_else(|| {
                PortError::new(
                    "Session memory_store resource requires a memory_store_id of 1–64 \
                     characters of A–Z, a–z, 0–9, '.', '_' and '-' (not starting with '.')",
                )
            })?;
        let mount = match resource.str_field("mount_path") {
            Some(path) => path.trim_end_matches('/').to_owned(),
            None => format!("{MEMORY_ROOT}/{id}"),
        };
        if !valid_mount_path(&mount) || mount.is_empty() {
            return Err(PortError::new(
                "Session resource mount_path must be absolute and may not traverse parents",
            ));
        }
        let read_only = match resource.str_field("access") {
            None | Some("read_write") => false,
            Some("read_only") => true,
            Some(_) => {
                return Err(PortError::new(
                    "Session memory_store access must be read_only or read_write",
                ));
            }
        };
        Ok(Self {
            id: id.to_owned(),
            mount,
            read_only,
        })
    }
}

/// 1–64 characters of `[A-Za-z0-9._-]`, not starting with `.`.
pub fn valid_store_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// Plain segments (no empty, `.`, `..`), valid UTF-8 without control characters or U+FFFD,
/// at most 32 deep, 255 bytes a segment and 1024 in all.
pub fn valid_relative_path(path: &str) -> bool {
    !path.is_empty()
        && path.len() <= 1024
        && path.split('/').count() <= 32
        && path.split('/').all(|segment| {
            !segment.is_empty()
                && segment != "."
                && segment != ".."
                && segment.len() <= 255
                && !segment
                    .chars()
                    .any(|c| c.is_control() || c == char::REPLACEMENT_CHARACTER)
        })
}

fn bytes_port(sandbox: &dyn SandboxPort) -> Result<&dyn crate::SandboxFileBytesPort, PortError> {
    sandbox.as_file_bytes().ok_or_else(|| {
        PortError::capability(
            "this sandbox cannot carry memory store files (no binary file access)",
        )
    })
}

async fn run(sandbox: &dyn SandboxPort, what: &str, command: &str) -> Result<String, PortError> {
    let output = sandbox.exec(command, Some(60_000)).await?;
    if output
        .lines()
        .last()
        .is_some_and(|line| line.starts_with("[exit "))
    {
        return Err(PortError::new(format!("{what} failed")));
    }
    Ok(output)
}

/// Copies the host store into the sandbox.
pub(super) async fn hydrate(
    sandbox: &dyn SandboxPort,
    host: &dyn MemoryStoreHost,
    store: &MemoryResource,
    signal: &AbortSignal,
) -> Result<(), PortError> {
    let bytes = bytes_port(sandbox)?;
    let files = host.load(&store.id).await?;
    let mount = shell_quote(&store.mount);
    run(
        sandbox,
        "prepare Session Memory",
        &format!("mkdir -p {mount}"),
    )
    .await?;
    for file in files {
        signal.throw_if_aborted()?;
        if !valid_relative_path(&file.path) {
            return Err(PortError::new("unsafe path"));
        }
        bytes
            .write_file_bytes(&format!("{}/{}", store.mount, file.path), &file.bytes)
            .await?;
    }
    if store.read_only {
        run(
            sandbox,
            "protect Session Memory",
            &format!("chmod -R a-w {mount}"),
        )
        .await?;
    }
    Ok(())
}

/// `f <size> <path>\0` per regular file, `d 0 <path>\0` per directory, `o 0 <path>\0`
/// otherwise; nothing followed.
fn scan_command(mount: &str) -> String {
    let mount = shell_quote(mount);
    format!(
        "[ -d {mount} ] || exit 0; cd {mount} && find . -mindepth 1 \\( -type f -printf 'f %s %P\\0' \\) \
         -o \\( -type d -printf 'd 0 %P\\0' \\) -o -printf 'o 0 %P\\0' 2>/dev/null"
    )
}

/// One scanned regular file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ScannedFile {
    pub path: String,
    pub size: u64,
}

/// Parses the scan's output under `limits`.
pub(super) fn parse_scan(
    output: &str,
    limits: &MemoryStoreLimits,
) -> Result<Vec<ScannedFile>, PortError> {
    let records: Vec<&str> = output.split('\0').filter(|r| !r.is_empty()).collect();
    if records.len() > limits.max_entries {
        return Err(PortError::new(format!(
            "Session Memory has more than {} entries",
            limits.max_entries
        )));
    }
    let mut files = Vec::new();
    let mut total = 0_u64;
    for record in records {
        let mut parts = record.splitn(3, ' ');
        let (Some(kind), Some(size), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(PortError::new("scan Session Memory failed"));
        };
        let size: u64 = size
            .parse()
            .map_err(|_| PortError::new("scan Session Memory failed"))?;
        if !valid_relative_path(path) {
            return Err(PortError::new("unsafe path"));
        }
        match kind {
            "f" => {
                total = total.saturating_add(size);
                if total > limits.max_bytes {
                    return Err(PortError::new(format!(
                        "Session Memory holds more than {} bytes",
                        limits.max_bytes
                    )));
                }
                files.push(ScannedFile {
                    path: path.to_owned(),
                    size,
                });
            }
            "d" | "o" => {}
            _ => return Err(PortError::new("scan Session Memory failed")),
        }
    }
    Ok(files)
}

/// Reads the store back from the sandbox.
pub(super) async fn scan(
    sandbox: &dyn SandboxPort,
    store: &MemoryResource,
    limits: &MemoryStoreLimits,
    signal: &AbortSignal,
) -> Result<Vec<MemoryFile>, PortError> {
    let bytes = bytes_port(sandbox)?;
    let output = run(sandbox, "scan Session Memory", &scan_command(&store.mount)).await?;
    let scanned = parse_scan(&output, limits)?;
    let mut budget = limits.max_bytes;
    let mut files = Vec::with_capacity(scanned.len());
    for file in scanned {
        signal.throw_if_aborted()?;
        let content = bytes
            .read_file_bytes(&format!("{}/{}", store.mount, file.path))
            .await?;
        // The file may have grown since the scan.
        let len = content.len() as u64;
        if len > budget {
            return Err(PortError::new(format!(
                "Session Memory holds more than {} bytes",
                limits.max_bytes
            )));
        }
        budget -= len;
        files.push(MemoryFile {
            path: file.path,
            bytes: content,
        });
    }
    Ok(files)
}
