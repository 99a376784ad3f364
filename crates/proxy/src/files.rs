//! Session file promotion: the bytes of a sandbox path in a session's last publication,
//! copied into the blob store as a file with an id.
//!
//! The managed runtime publishes `/workspace` as a checkpoint manifest and
//! `/mnt/session/outputs` as an outputs manifest, both in the blob store; a sandbox path is
//! resolved through the matching manifest of the session's last publication. Nothing here
//! reads a live sandbox.

use async_trait::async_trait;
use omabox_contract::{PortError, RuntimeResourcePublication};
use omabox_persistence::{
    BlobHash, BlobStore, EntryKind, FilesystemSessionOutputPort, FilesystemWorkspacePort,
    guess_media_type,
};
use std::sync::Arc;

/// Sandbox path prefix of the session outputs.
pub const OUTPUTS_ROOT: &str = "/mnt/session/outputs/";
/// Sandbox path prefix of the workspace.
pub const WORKSPACE_ROOT: &str = "/workspace/";

/// Why a promotion or a read failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FileError {
    /// The path is not under `/workspace/` or `/mnt/session/outputs/`, or is malformed.
    #[error("path must be a file under /workspace/ or /mnt/session/outputs/")]
    UnsupportedPath,
    /// The session has no publication (or none with outputs).
    #[error("session has no published {0}")]
    NothingPublished(&'static str),
    /// The path is not a regular file of the publication.
    #[error("no such file in the session's last publication: {0}")]
    NotFound(String),
    /// The stored bytes could not be read or stored.
    #[error("file storage failed")]
    Storage(#[source] Box<dyn std::error::Error + Send + Sync>),
}

/// A promoted file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotedFile {
    /// `file_<sha256 hex>`.
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// Media type guessed from the path.
    pub media_type: String,
}

/// File promotion as the HTTP edge needs it.
#[async_trait]
pub trait SessionFilesPort: Send + Sync {
    /// Copies the bytes of `path` from the session's last publication into the blob store.
    async fn promote(&self, session_id: &str, path: &str) -> Result<PromotedFile, FileError>;
    /// The bytes of a promoted file; `None` when unknown.
    async fn content(&self, file_id: &str) -> Result<Option<Vec<u8>>, FileError>;
}

/// Where the session's last publication comes from (the fence store).
#[async_trait]
pub trait PublicationLookup: Send + Sync {
    /// The active publication of the session's work item, if any.
    async fn publication(
        &self,
        session_id: &str,
    ) -> Result<Option<RuntimeResourcePublication>, PortError>;
}

/// [`SessionFilesPort`] over the filesystem persistence ports and the blob store.
#[derive(Clone)]
pub struct PublishedSessionFiles {
    lookup: Arc<dyn PublicationLookup>,
    blobs: Arc<BlobStore>,
    workspace: Arc<FilesystemWorkspacePort>,
    outputs: Arc<FilesystemSessionOutputPort>,
}

impl std::fmt::Debug for PublishedSessionFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishedSessionFiles")
            .finish_non_exhaustive()
    }
}

impl PublishedSessionFiles {
    /// Promotion over the persistence of `data_dir` (one blob store shared by all three).
    pub fn new(
        lookup: Arc<dyn PublicationLookup>,
        blobs: Arc<BlobStore>,
        workspace: Arc<FilesystemWorkspacePort>,
        outputs: Arc<FilesystemSessionOutputPort>,
    ) -> Self {
        Self {
            lookup,
            blobs,
            workspace,
            outputs,
        }
    }

    async fn read_bytes(&self, session_id: &str, path: &str) -> Result<Vec<u8>, FileError> {
        let (root, relative) = split_sandbox_path(path)?;
        let publication = self
            .lookup
            .publication(session_id)
            .await
            .map_err(|e| FileError::Storage(Box::new(e)))?
            .ok_or(FileError::NothingPublished("workspace"))?;
        let not_found = || FileError::NotFound(path.to_owned());
        if root == OUTPUTS_ROOT {
            let candidate = publication
                .output_candidate
                .ok_or(FileError::NothingPublished("outputs"))?;
            let (_, file) = self
                .outputs
                .open_entry(&candidate, relative)
                .await
                .map_err(|_| not_found())?;
            return read_file(file).await;
        }
        let manifest = self
            .workspace
            .read_manifest(&publication.workspace_candidate)
            .await
            .map_err(|e| FileError::Storage(Box::new(e)))?;
        let entry = manifest
            .entries
            .into_iter()
            // A sparse file's blob holds only its data regions (manifest v2 `extents`): not
            // promotable as bytes here yet, so it is not found rather than returned wrong.
            .find(|entry| {
                entry.path == relative && entry.kind == EntryKind::File && entry.extents.is_none()
            })
            .ok_or_else(not_found)?;
        let hash = entry.hash.ok_or_else(not_found)?;
        self.get_blob(hash).await?.ok_or_else(not_found)
    }

    async fn get_blob(&self, hash: BlobHash) -> Result<Option<Vec<u8>>, FileError> {
        let blobs = Arc::clone(&self.blobs);
        tokio::task::spawn_blocking(move || blobs.get(&hash))
            .await
            .map_err(|e| FileError::Storage(Box::new(e)))?
            .map_err(|e| FileError::Storage(Box::new(e)))
    }
}

async fn read_file(mut file: std::fs::File) -> Result<Vec<u8>, FileError> {
    tokio::task::spawn_blocking(move || {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut file, &mut bytes).map(|_| bytes)
    })
    .await
    .map_err(|e| FileError::Storage(Box::new(e)))?
    .map_err(|e| FileError::Storage(Box::new(e)))
}

/// Splits a sandbox path into its root and a relative path without empty, `.` or `..`
/// segments.
pub fn split_sandbox_path(path: &str) -> Result<(&'static str, &str), FileError> {
    let (root, relative) = [OUTPUTS_ROOT, WORKSPACE_ROOT]
        .into_iter()
        .find_map(|root| path.strip_prefix(root).map(|rest| (root, rest)))
        .ok_or(FileError::UnsupportedPath)?;
    let valid = !relative.is_empty()
        && relative
            .split('/')
            .all(|segment| !segment.is_empty() && segment != "." && segment != "..");
    if !valid {
        return Err(FileError::UnsupportedPath);
    }
    Ok((root, relative))
}

/// `file_<hex>` → the blob hash.
fn parse_file_id(file_id: &str) -> Option<BlobHash> {
    let hex = file_id.strip_prefix("file_")?;
    BlobHash::from_content_hash(&format!("sha256:{hex}"))
}

#[async_trait]
impl SessionFilesPort for PublishedSessionFiles {
    async fn promote(&self, session_id: &str, path: &str) -> Result<PromotedFile, FileError> {
        let bytes = self.read_bytes(session_id, path).await?;
        let size = bytes.len() as u64;
        let blobs = Arc::clone(&self.blobs);
        let outcome = tokio::task::spawn_blocking(move || blobs.put_bytes(&bytes))
            .await
            .map_err(|e| FileError::Storage(Box::new(e)))?
            .map_err(|e| FileError::Storage(Box::new(e)))?;
        Ok(PromotedFile {
            id: format!("file_{}", outcome.hash.to_hex()),
            size,
            media_type: guess_media_type(path).to_owned(),
        })
    }

    async fn content(&self, file_id: &str) -> Result<Option<Vec<u8>>, FileError> {
        match parse_file_id(file_id) {
            Some(hash) => self.get_blob(hash).await,
            None => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_paths() {
        assert_eq!(
            split_sandbox_path("/workspace/a/b.txt").unwrap(),
            (WORKSPACE_ROOT, "a/b.txt")
        );
        assert_eq!(
            split_sandbox_path("/mnt/session/outputs/r.md").unwrap(),
            (OUTPUTS_ROOT, "r.md")
        );
        for bad in [
            "/etc/passwd",
            "/workspace/",
            "/workspace/../x",
            "/workspace//x",
            "workspace/x",
        ] {
            assert!(split_sandbox_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn file_ids() {
        assert!(parse_file_id("file_zz").is_none());
        assert!(parse_file_id(&format!("file_{}", "a".repeat(64))).is_some());
    }
}
