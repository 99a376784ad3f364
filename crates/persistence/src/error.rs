//! The error of every persistence operation.
//!
//! Where the contract (reference §1.15, §9) fixes a message, the variant's Display is that
//! exact text; [`PortError`] conversion keeps it verbatim. I/O failures keep their source and
//! the conversion appends the source's text, because a `PortError` has no source chain.

use omabox_contract::PortError;
use std::io;

/// Why a blob-store, workspace or outputs operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PersistenceError {
    /// The workspace port was asked for a strategy it does not implement.
    #[error("Filesystem workspace does not support {0}")]
    UnsupportedWorkspaceStrategy(String),
    /// The outputs port was asked for a strategy it does not implement.
    #[error("Filesystem outputs do not support {0}")]
    UnsupportedOutputStrategy(String),
    /// A workspace candidate id is not `wcp_<64 hex>`.
    #[error("Invalid workspace checkpoint id")]
    InvalidCheckpointId,
    /// The manifest's hash is not the candidate's id / content hash.
    #[error("Workspace checkpoint content hash mismatch")]
    CheckpointHashMismatch,
    /// The manifest blob a candidate names is not in the blob store.
    #[error("Workspace checkpoint manifest is missing: {0}")]
    CheckpointMissing(String),
    /// The manifest does not parse or breaks a structural rule.
    #[error("Workspace checkpoint manifest is invalid: {0}")]
    InvalidManifest(String),
    /// A manifest entry would write outside its parent, through a symlink, or twice.
    #[error("Workspace checkpoint entry is unsafe: {0}")]
    UnsafeEntry(String),
    /// A file's content blob is not in the blob store.
    #[error(
        "Workspace checkpoint content is missing: {path} needs blob {blob}, which is not in the blob store"
    )]
    MissingContent {
        /// The file's manifest path.
        path: String,
        /// The blob's hash (hex).
        blob: String,
    },
    /// A file's content blob does not match the manifest (size or hash).
    #[error(
        "Workspace checkpoint content is corrupt: blob {blob} of {path} does not match its hash or size"
    )]
    CorruptContent {
        /// The file's manifest path.
        path: String,
        /// The blob's hash (hex).
        blob: String,
    },
    /// Restoring the published workspace of a session failed; says which session, revision
    /// and checkpoint, and what to do.
    #[error(
        "Cannot restore the workspace of session {session} from {what}: {detail}. `omabox fsck` \
         shows which revisions are intact; `omabox run --from-revision N` continues from one"
    )]
    Restore {
        /// The session.
        session: String,
        /// "revision N (wcp_…)" or the checkpoint id.
        what: String,
        /// Why (the underlying error's full text).
        detail: String,
    },
    /// A file asked for in memory is larger than the caller's cap.
    #[error("{path} has {size} bytes, more than the {limit} that can be read into memory")]
    FileTooLarge {
        /// The file's manifest path.
        path: String,
        /// Its size.
        size: u64,
        /// The cap.
        limit: u64,
    },
    /// A Session output's content blob is missing or does not match the manifest.
    #[error("Session output {path} is missing or corrupt: blob {blob} {problem}")]
    OutputContent {
        /// The output's logical path.
        path: String,
        /// The blob's hash (hex).
        blob: String,
        /// "is not in the blob store" or "does not match its size".
        problem: &'static str,
    },
    /// A workspace entry is not a regular file, directory or symlink (or has a non-UTF-8 name).
    #[error("Unsupported workspace entry: {0}")]
    UnsupportedEntry(String),
    /// A checkpoint has more entries than its limit allows.
    #[error(
        "Workspace checkpoint exceeds its limit of {limit} entries (found more than {limit} files, \
         directories and links in /workspace); nothing was published and the last publication stays: remove entries \
         from /workspace or raise the limit (omabox: OMABOX_CHECKPOINT_MAX_ENTRIES)"
    )]
    CheckpointEntryLimit {
        /// The limit.
        limit: u64,
    },
    /// A checkpoint would store more bytes than its limit allows.
    #[error(
        "Workspace checkpoint exceeds its limit of {limit} bytes (at least {found} bytes of file \
         content in /workspace); nothing was published and the last publication stays: remove \
         files from /workspace or raise the limit (omabox: OMABOX_CHECKPOINT_MAX_BYTES)"
    )]
    CheckpointByteLimit {
        /// The limit.
        limit: u64,
        /// The bytes counted when the limit was passed.
        found: u64,
    },
    /// A workspace entry kept changing while it was read.
    #[error("Workspace entry changed during checkpoint: {0}")]
    EntryChanged(String),
    /// A directory tree nests deeper than the walker allows.
    #[error("Workspace is nested too deeply: {0}")]
    TooDeep(String),
    /// A computed storage path left its root.
    #[error("Resolved path escaped its storage root")]
    EscapedRoot,
    /// A binding handed back to the port is not one this port made for the scope.
    #[error("Unknown binding for this work item: {0}")]
    UnknownBinding(String),
    /// An export destination exists and is not an empty directory.
    #[error("Export destination is not an empty directory: {0}")]
    DestinationNotEmpty(String),
    /// A Session output is a symlink, FIFO, socket or device.
    #[error("Session output must be a regular file: {0}")]
    OutputNotRegular(String),
    /// A Session output name is not UTF-8.
    #[error("Provider output path is not valid UTF-8")]
    OutputPathNotUtf8,
    /// A Session output logical path is empty, absolute, or has `""`, `.` or `..` segments.
    #[error("Provider output has an unsafe logical path: /mnt/session/outputs/{0}")]
    UnsafeOutputPath(String),
    /// More files than `maxFiles`.
    #[error("Provider output file limit exceeded ({0})")]
    OutputFileLimit(u64),
    /// Far more entries (directories, skipped entries) than files allowed.
    #[error("Provider outputs hold too many entries (directories and non-files) to collect")]
    OutputEntryLimit,
    /// More bytes than `maxBytes`.
    #[error("Provider output byte limit exceeded ({0})")]
    OutputByteLimit(u64),
    /// A file changed (or vanished) between collect and finalize.
    #[error("Session output changed during collection: {0}")]
    OutputChanged(String),
    /// An outputs candidate id is not `out_<64 hex>`.
    #[error("Invalid Session output manifest id")]
    InvalidOutputManifestId,
    /// The outputs manifest's hash is not the candidate's id / content hash.
    #[error("Session output manifest content hash mismatch")]
    OutputManifestHashMismatch,
    /// The outputs manifest blob is missing or does not parse.
    #[error("Session output manifest is invalid: {0}")]
    InvalidOutputManifest(String),
    /// No entry with that logical path in the manifest.
    #[error("Session output not found: {0}")]
    OutputNotFound(String),
    /// A blob's bytes do not hash to its name.
    #[error("Blob is corrupt: {0}")]
    CorruptBlob(String),
    /// The operation's abort signal fired; carries the signal's reason unchanged.
    #[error("{0}")]
    Aborted(PortError),
    /// A filesystem call failed.
    #[error("{context}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The underlying failure.
        #[source]
        source: io::Error,
    },
    /// A blocking task panicked or was cancelled by the runtime.
    #[error("Persistence task failed")]
    Task(#[source] tokio::task::JoinError),
}

impl PersistenceError {
    /// An I/O failure while doing `context`.
    pub(crate) fn io(context: impl Into<String>, source: impl Into<io::Error>) -> Self {
        PersistenceError::Io {
            context: context.into(),
            source: source.into(),
        }
    }
}

/// Shorthand used across the crate.
pub(crate) type Result<T, E = PersistenceError> = std::result::Result<T, E>;

/// Attaches a context to an I/O result.
pub(crate) trait IoContext<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T, E: Into<io::Error>> IoContext<T> for std::result::Result<T, E> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| PersistenceError::io(context(), source))
    }
}

impl From<PersistenceError> for PortError {
    fn from(error: PersistenceError) -> Self {
        match error {
            PersistenceError::Aborted(reason) => reason,
            PersistenceError::Io { context, source } => {
                PortError::new(format!("{context}: {source}"))
            }
            PersistenceError::Task(source) => {
                PortError::new(format!("Persistence task failed: {source}"))
            }
            other => PortError::new(other.to_string()),
        }
    }
}
