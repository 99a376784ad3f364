//! Session file promotion: the bytes of a sandbox path in a session's last publication,
//! streamed (hash-verified) into the [`PromotedStore`] as a file with a random id, and read
//! back only by that id.
//!
//! The managed runtime publishes `/workspace` as a checkpoint manifest and
//! `/mnt/session/outputs` as an outputs manifest, both in the blob store; a sandbox path is
//! resolved through the matching manifest of the session's last publication. Nothing here
//! reads a live sandbox, and no file is held in memory (one 64 KiB copy buffer).

use crate::promoted::{PromotedError, PromotedRecord, PromotedStore};
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

impl From<PromotedError> for FileError {
    fn from(error: PromotedError) -> Self {
        Self::Storage(Box::new(error))
    }
}

/// A promoted file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PromotedFile {
    /// `file_<32 random hex>`.
    pub id: String,
    /// Size in bytes.
    pub size: u64,
    /// Media type guessed from the path at promotion, stored and served with the bytes.
    pub media_type: String,
}

impl From<&PromotedRecord> for PromotedFile {
    fn from(record: &PromotedRecord) -> Self {
        Self {
            id: record.id.clone(),
            size: record.size,
            media_type: record.media_type.clone(),
        }
    }
}

/// The bytes of a promoted file, open for streaming, with what is served alongside.
#[derive(Debug)]
pub struct FileContent {
    /// Id, size and media type.
    pub file: PromotedFile,
    /// The bytes (read from the start).
    pub bytes: std::fs::File,
}

/// File promotion as the HTTP edge needs it.
#[async_trait]
pub trait SessionFilesPort: Send + Sync {
    /// Copies the bytes of `path` from the session's last publication into the promoted
    /// store.
    async fn promote(&self, session_id: &str, path: &str) -> Result<PromotedFile, FileError>;
    /// A promoted file by its id; `None` when no file was promoted under that id.
    async fn content(&self, file_id: &str) -> Result<Option<FileContent>, FileError>;
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

/// [`SessionFilesPort`] over the filesystem persistence ports, the blob store and the
/// promoted store.
#[derive(Clone)]
pub struct PublishedSessionFiles {
    lookup: Arc<dyn PublicationLookup>,
    blobs: Arc<BlobStore>,
    workspace: Arc<FilesystemWorkspacePort>,
    outputs: Arc<FilesystemSessionOutputPort>,
    promoted: PromotedStore,
}

impl std::fmt::Debug for PublishedSessionFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublishedSessionFiles")
            .finish_non_exhaustive()
    }
}

impl PublishedSessionFiles {
    /// Promotion over the persistence of a data dir (one blob store shared by the ports)
    /// into `promoted`.
    pub fn new(
        lookup: Arc<dyn PublicationLookup>,
        blobs: Arc<BlobStore>,
        workspace: Arc<FilesystemWorkspacePort>,
        outputs: Arc<FilesystemSessionOutputPort>,
        promoted: PromotedStore,
    ) -> Self {
        Self {
            lookup,
            blobs,
            workspace,
            outputs,
            promoted,
        }
    }

    /// The open bytes of `path` in the session's last publication and the hash they must
    /// have.
    async fn open_source(
        &self,
        session_id: &str,
        path: &str,
    ) -> Result<(std::fs::File, BlobHash), FileError> {
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
            let (entry, file) = self
                .outputs
                .open_entry(&candidate, relative)
                .await
                .map_err(|_| not_found())?;
            let hash = BlobHash::from_content_hash(&entry.content_hash).ok_or_else(not_found)?;
            return Ok((file, hash));
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
        let blobs = Arc::clone(&self.blobs);
        let file = blocking(move || {
            blobs
                .open(&hash)
                .map_err(|e| FileError::Storage(Box::new(e)))
        })
        .await?
        .ok_or_else(not_found)?;
        Ok((file, hash))
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, FileError> + Send + 'static,
) -> Result<T, FileError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| FileError::Storage(Box::new(e)))?
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

#[async_trait]
impl SessionFilesPort for PublishedSessionFiles {
    async fn promote(&self, session_id: &str, path: &str) -> Result<PromotedFile, FileError> {
        let (source, hash) = self.open_source(session_id, path).await?;
        let promoted = self.promoted.clone();
        let (session_id, path) = (session_id.to_owned(), path.to_owned());
        let record = blocking(move || {
            let media_type = guess_media_type(&path);
            Ok(promoted.promote(source, hash.as_bytes(), media_type, &session_id, &path)?)
        })
        .await?;
        Ok(PromotedFile::from(&record))
    }

    async fn content(&self, file_id: &str) -> Result<Option<FileContent>, FileError> {
        let promoted = self.promoted.clone();
        let file_id = file_id.to_owned();
        let opened = blocking(move || Ok(promoted.open_file(&file_id)?)).await?;
        Ok(opened.map(|(record, bytes)| FileContent {
            file: PromotedFile::from(&record),
            bytes,
        }))
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
}
