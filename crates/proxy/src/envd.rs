//! E2B's in-sandbox API (envd: processes and files) as a port: what `omabox serve`'s
//! envd routes (`routes/envd.rs`, shapes from E2B's `spec/envd/*.proto` and
//! `spec/envd/envd.yaml`) ask of one running sandbox. The node implements [`SandboxEnvd`]
//! over the sandbox's agent; the routes speak the Connect protocol (JSON codec, as both
//! official SDKs use) and never name a backend.
//!
//! Paths are the caller's, as given (relative ones are the user's home's); the
//! implementation resolves them inside the sandbox, never on the host. Users are names
//! inside the sandbox (`None`: the default user, [`DEFAULT_USER`]).
//!
//! Must never: follow a sandbox path on the host; buffer a process's output or a file
//! without a bound (streams are bounded channels, a slow reader slows the producer).

use async_trait::async_trait;
use bytes::Bytes;
use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::SystemTime;
use tokio::sync::mpsc;

/// The envd version announced (`envdVersion`): the SDK features it enables are the ones
/// served (stdin, default user, `close_stdin`, octet-stream uploads, entries in watch
/// events) but file metadata (0.6.2, refused by the upload route with a clear error);
/// later ones (watches of network mounts) the SDKs refuse with their own clear error.
pub const ENVD_VERSION: &str = "0.6.3";
/// The user commands and file operations run as when the request names none.
pub const DEFAULT_USER: &str = "user";
/// Processes one sandbox tracks at once (running or ending).
pub const MAX_PROCESSES: usize = 1024;
/// Streams attached to one process at once (its start plus connects).
pub const MAX_SUBSCRIBERS: usize = 16;
/// Bytes one file upload may carry.
pub const MAX_UPLOAD_BYTES: u64 = 1 << 30;

/// What to run (`ProcessConfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessConfig {
    /// The program (E2B's SDKs send `/bin/bash` with `-l -c CMD`).
    pub cmd: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment set for this process (over the sandbox's).
    pub envs: BTreeMap<String, String>,
    /// Working directory (`None`: the user's home).
    pub cwd: Option<String>,
}

/// A terminal size (`PTY.Size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

/// A `Start` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartProcess {
    /// What to run.
    pub config: ProcessConfig,
    /// Run it in a terminal of this size (its output is then [`ProcessEvent::Pty`]).
    pub pty: Option<PtySize>,
    /// A name to select it by later.
    pub tag: Option<String>,
    /// Give it a stdin pipe (else `/dev/null`).
    pub stdin: bool,
    /// Who runs it (`None`: [`DEFAULT_USER`]).
    pub user: Option<String>,
}

/// How a request names a process (`ProcessSelector`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessSelector {
    /// By its pid inside the sandbox.
    Pid(u32),
    /// By the tag it was started with.
    Tag(String),
}

impl std::fmt::Display for ProcessSelector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Pid(pid) => write!(f, "process with pid {pid}"),
            Self::Tag(tag) => {
                let shown: String = tag.chars().take(64).collect();
                write!(f, "process with tag {shown:?}")
            }
        }
    }
}

/// One event of a process stream (`ProcessEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// The process runs (always the first event of a stream).
    Start {
        /// Its pid inside the sandbox.
        pid: u32,
    },
    /// Bytes it wrote to stdout.
    Stdout(Bytes),
    /// Bytes it wrote to stderr.
    Stderr(Bytes),
    /// Bytes its terminal showed.
    Pty(Bytes),
    /// It ended (always the last event).
    End(ProcessEnd),
}

/// How a process ended (`EndEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessEnd {
    /// Its exit code (-1 when a signal ended it).
    pub exit_code: i32,
    /// Whether it exited (rather than being killed by a signal).
    pub exited: bool,
    /// `exit status N` or `signal: NAME`.
    pub status: String,
    /// What went wrong around it (its output cut short, …).
    pub error: Option<String>,
}

/// A process's events, as a bounded channel (the stream ends after [`ProcessEvent::End`],
/// or early when the sandbox goes away).
pub type ProcessEvents = mpsc::Receiver<ProcessEvent>;

/// One running process (`ProcessInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessListing {
    /// What it runs.
    pub config: ProcessConfig,
    /// Its pid inside the sandbox.
    pub pid: u32,
    /// Its tag.
    pub tag: Option<String>,
}

/// A file's kind (`FileType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Directory,
    /// A symbolic link.
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// A file's metadata (`EntryInfo`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryInfo {
    /// Its last path component.
    pub name: String,
    /// Its kind.
    pub kind: FileType,
    /// Its absolute path inside the sandbox.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    /// Owner's name (or uid).
    pub owner: String,
    /// Group's name (or gid).
    pub group: String,
    /// Last modification.
    pub modified: SystemTime,
    /// A symlink's target.
    pub symlink_target: Option<String>,
}

/// One change below a watched directory (`FilesystemEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEvent {
    /// Path of what changed, relative to the watched directory.
    pub name: String,
    /// What happened.
    pub kind: FsEventKind,
    /// Its metadata, when the watch asked for it ([`WatchOptions::include_entry`]) and
    /// the path still existed when the sandbox read the event.
    pub entry: Option<EntryInfo>,
}

/// How a directory is watched (`WatchDirRequest`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatchOptions {
    /// Everything below it too.
    pub recursive: bool,
    /// Each event carries its path's [`EntryInfo`], read inside the sandbox.
    pub include_entry: bool,
}

/// What happened to a watched path (`EventType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsEventKind {
    /// Created (or moved in).
    Create,
    /// Written.
    Write,
    /// Removed.
    Remove,
    /// Moved away.
    Rename,
    /// Its mode or owner changed.
    Chmod,
}

/// A watch's events, as a bounded channel (it ends when the watch failed or the sandbox
/// went away; dropping it ends the watch).
pub type FsEvents = mpsc::Receiver<Result<FsEvent, EnvdError>>;

/// Watchers (`CreateWatcher`) one sandbox keeps at once.
pub const MAX_WATCHERS: usize = 64;
/// Events a watcher holds until `GetWatcherEvents` takes them; beyond it the watcher fails.
pub const MAX_WATCHER_EVENTS: usize = 10_000;

/// A file's content being read (`GET /files`).
pub struct FileDownload {
    /// Its size when opened.
    pub size: u64,
    /// The bytes, in order; an `Err` item ends the download early.
    pub content: Pin<Box<dyn futures::Stream<Item = Result<Bytes, EnvdError>> + Send>>,
}

impl std::fmt::Debug for FileDownload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDownload")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

/// Bytes of an upload, as they arrive (an error item ends it: the write fails and leaves
/// no partial file).
pub type UploadBody<'a> = &'a mut (dyn tokio::io::AsyncRead + Unpin + Send);

/// Why an envd call failed; each maps onto one Connect code and HTTP status. No variant
/// carries a token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvdError {
    /// The process, file or directory does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request cannot be served as asked.
    #[error("{0}")]
    InvalidArgument(String),
    /// What should be created exists.
    #[error("{0}")]
    AlreadyExists(String),
    /// The user may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// The sandbox's disk is full.
    #[error("{0}")]
    NoSpace(String),
    /// Too many processes or streams.
    #[error("{0}")]
    ResourceExhausted(String),
    /// This server does not implement it.
    #[error("{0}")]
    Unimplemented(String),
    /// The sandbox is gone or not answering.
    #[error("{0}")]
    Unavailable(String),
    /// Anything else (the text says what).
    #[error("{0}")]
    Internal(String),
}

/// One running sandbox's processes and files.
#[async_trait]
pub trait SandboxEnvd: Send + Sync + 'static {
    /// Starts a process; its events begin with [`ProcessEvent::Start`]. The process keeps
    /// running when the returned stream is dropped.
    async fn start(&self, request: StartProcess) -> Result<ProcessEvents, EnvdError>;
    /// Attaches to a running process: a [`ProcessEvent::Start`], then its output from now
    /// on and its end.
    async fn connect(&self, process: ProcessSelector) -> Result<ProcessEvents, EnvdError>;
    /// The processes started through this API that still run.
    fn list(&self) -> Vec<ProcessListing>;
    /// Writes to a process's stdin (or its terminal, `pty`).
    async fn send_input(
        &self,
        process: ProcessSelector,
        data: Bytes,
        pty: bool,
    ) -> Result<(), EnvdError>;
    /// Closes a process's stdin.
    async fn close_stdin(&self, process: ProcessSelector) -> Result<(), EnvdError>;
    /// Sends `SIGTERM` (`kill == false`) or `SIGKILL` to a process's group.
    fn send_signal(&self, process: ProcessSelector, kill: bool) -> Result<(), EnvdError>;
    /// Resizes a process's terminal.
    fn resize(&self, process: ProcessSelector, size: PtySize) -> Result<(), EnvdError>;

    /// A path's metadata (a final symlink not followed).
    async fn stat(&self, path: &str, user: Option<&str>) -> Result<EntryInfo, EnvdError>;
    /// Creates a directory and its missing parents; `None` when it existed.
    async fn make_dir(
        &self,
        path: &str,
        user: Option<&str>,
    ) -> Result<Option<EntryInfo>, EnvdError>;
    /// Renames a path; the metadata of its new name.
    async fn rename(
        &self,
        from: &str,
        to: &str,
        user: Option<&str>,
    ) -> Result<EntryInfo, EnvdError>;
    /// A directory's entries, `depth` levels deep (1: its own).
    async fn list_dir(
        &self,
        path: &str,
        depth: u32,
        user: Option<&str>,
    ) -> Result<Vec<EntryInfo>, EnvdError>;
    /// Removes a file, a symlink or a directory tree.
    async fn remove(&self, path: &str, user: Option<&str>) -> Result<(), EnvdError>;
    /// Watches a directory (as `options` say) from now on.
    async fn watch_dir(
        &self,
        path: &str,
        options: WatchOptions,
        user: Option<&str>,
    ) -> Result<FsEvents, EnvdError>;
    /// Starts a watch whose events are kept until fetched; its id.
    async fn create_watcher(
        &self,
        path: &str,
        options: WatchOptions,
        user: Option<&str>,
    ) -> Result<String, EnvdError>;
    /// The events a watcher kept since the last call (its failure, once, as an error).
    fn watcher_events(&self, watcher_id: &str) -> Result<Vec<FsEvent>, EnvdError>;
    /// Stops a watcher.
    fn remove_watcher(&self, watcher_id: &str) -> Result<(), EnvdError>;
    /// Opens a file for download.
    async fn read_file(&self, path: &str, user: Option<&str>) -> Result<FileDownload, EnvdError>;
    /// Writes a file (missing parents created), replacing it; its metadata afterwards.
    async fn write_file(
        &self,
        path: &str,
        user: Option<&str>,
        body: UploadBody<'_>,
    ) -> Result<EntryInfo, EnvdError>;
}
