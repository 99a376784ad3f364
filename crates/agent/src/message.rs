//! Control messages: the JSON bodies of hello, open, control and goaway frames.
//!
//! Message types are append-only. A request whose `op` the agent does not know gets a
//! typed `unsupported` error on its own stream; the connection survives.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Protocol versions this build speaks.
pub const PROTOCOL_MIN: u16 = 1;
/// Highest protocol version this build speaks.
pub const PROTOCOL_MAX: u16 = 1;
/// The `magic` field of every hello.
pub const HELLO_MAGIC: &str = "omabox-agent-protocol";

/// Which side sent a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The in-sandbox agent.
    Agent,
    /// The host-side client.
    Client,
}

/// First frame each way. Both sides send theirs without waiting for the other's; the
/// agent's hello doubles as its readiness signal (the host never polls for readiness).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// Always [`HELLO_MAGIC`].
    pub magic: String,
    /// Sender's role.
    pub role: Role,
    /// Lowest protocol version the sender speaks.
    pub min_version: u16,
    /// Highest protocol version the sender speaks.
    pub max_version: u16,
    /// Sender's software name and version, e.g. `omabox-agent/0.1.0`.
    pub software: String,
    /// Largest frame body the sender accepts.
    pub max_frame: u32,
    /// Window the sender grants per channel of every stream it receives data on.
    pub initial_window: u32,
    /// Operations the sender implements (agent only).
    #[serde(default)]
    pub ops: Vec<String>,
    /// Sender's process id (agent only; informational).
    #[serde(default)]
    pub pid: Option<u32>,
}

impl Hello {
    /// Picks the highest version both hellos speak.
    pub fn negotiate(&self, theirs: &Hello) -> Option<u16> {
        let hi = self.max_version.min(theirs.max_version);
        let lo = self.min_version.max(theirs.min_version);
        (hi >= lo).then_some(hi)
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum CommandSpec {
    /// `/bin/sh -c <script>`.
    Shell {
        /// The script.
        script: String,
    },
    /// A program and its arguments; the program is looked up on PATH when it has no `/`.
    Argv {
        /// Program first.
        argv: Vec<String>,
    },
}

/// A process to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SpawnSpec {
    /// The command.
    pub command: CommandSpec,
    /// Environment changes on top of the agent's environment and the session env;
    /// `null` removes a variable.
    #[serde(default)]
    pub env: BTreeMap<String, Option<String>>,
    /// Working directory (relative paths resolve against the agent's workdir).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Account to run as, named in the sandbox's `/etc/passwd` (`root` always works):
    /// its uid, gid, `HOME`/`USER`/`LOGNAME`, and its home as the default cwd. `None`:
    /// the agent's own identity and workdir.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Whether stdin is a pipe fed by the host (else `/dev/null`). Ignored with `pty`: the
    /// terminal is stdin, and host input always goes to it.
    #[serde(default)]
    pub stdin: bool,
    /// Kill the whole process group after this long and report `timed_out`.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Run in a new pseudo-terminal of this size (`spawn` only; `start_background` refuses
    /// it). The process leads a new session with the terminal as its controlling terminal
    /// and stdin/stdout/stderr; `TERM` is `xterm-256color` unless the env sets it. All
    /// output comes on channel 1 (channel 2 only gets its eof); host input on channel 0 is
    /// typed into the terminal, and host eof writes nothing (a terminal has no eof: send
    /// `\x04`, `^D`, for one). Each dimension is 1..=[`MAX_PTY_DIMENSION`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// The largest number of columns or rows a terminal may have.
pub const MAX_PTY_DIMENSION: u16 = 1000;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl PtySize {
    /// Whether both dimensions are within 1..=[`MAX_PTY_DIMENSION`].
    pub fn is_valid(self) -> bool {
        let ok = |n: u16| (1..=MAX_PTY_DIMENSION).contains(&n);
        ok(self.cols) && ok(self.rows)
    }

    /// An `invalid_request` error unless [`PtySize::is_valid`].
    pub fn check(self) -> Result<Self, RemoteError> {
        if self.is_valid() {
            Ok(self)
        } else {
            Err(RemoteError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "terminal size {}x{} (columns x rows) is out of range: each must be 1..={MAX_PTY_DIMENSION}",
                    self.cols, self.rows
                ),
            ))
        }
    }
}

/// A request: the body of an open frame. The stream it opens lives until the agent sends
/// a terminal event (`exited`, `ok` or `error`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Liveness; replies `ok` with a [`Pong`].
    Ping,
    /// An attached process: `started`, stdout/stderr data + eof, then `exited`.
    Spawn(SpawnSpec),
    /// A background process the agent keeps (and keeps logs of); replies `ok` with a
    /// [`BackgroundStarted`].
    StartBackground(SpawnSpec),
    /// Signal a background process group.
    BackgroundKill {
        /// Agent-issued id.
        id: String,
        /// Signal name, e.g. `SIGTERM`.
        signal: String,
    },
    /// Retained output of a background process; replies with [`BackgroundLogs`].
    BackgroundLogs {
        /// Agent-issued id.
        id: String,
    },
    /// Status of a background process; replies with [`BackgroundInfo`].
    BackgroundStatus {
        /// Agent-issued id.
        id: String,
    },
    /// Stream a file out: `file`, data on channel 1, eof, then `ok` with [`WriteDone`].
    ReadFile {
        /// Path.
        path: String,
    },
    /// Stream a file in on channel 0 (data then eof); replies `ok` with [`WriteDone`].
    WriteFile {
        /// Path.
        path: String,
        /// Permission bits; default keeps an existing file's mode, else 0644.
        #[serde(default)]
        mode: Option<u32>,
        /// Create missing parent directories (default true).
        #[serde(default = "yes")]
        create_parents: bool,
        /// Account (from the sandbox's `/etc/passwd`) that owns the file and every parent
        /// directory the write created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// Metadata of one path (not following a final symlink); replies with [`FileStat`].
    Stat {
        /// Path.
        path: String,
    },
    /// Entries of a directory sorted by name; replies with `Vec<DirEntry>`.
    ListDir {
        /// Path.
        path: String,
    },
    /// Stream a tar archive of a directory out on channel 1.
    TarOut {
        /// Directory.
        path: String,
    },
    /// Extract a tar archive streamed in on channel 0 into a directory (created if
    /// missing); replies with [`TarInDone`].
    TarIn {
        /// Directory.
        path: String,
    },
    /// Merge variables into the env of every later process (`null` removes).
    SetEnv {
        /// Variables.
        vars: BTreeMap<String, Option<String>>,
    },
    /// Create a directory and its missing parents (mode 0755); replies with [`MadeDir`].
    /// An existing non-directory is `already_exists`.
    MakeDir {
        /// Path.
        path: String,
        /// Account (from the sandbox's `/etc/passwd`) that owns the directories created.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        owner: Option<String>,
    },
    /// `rename(2)`; replies `ok`.
    Rename {
        /// Existing path.
        from: String,
        /// New path (its parent must exist).
        to: String,
    },
    /// Remove a file, a symlink (never followed) or a directory tree; replies `ok`.
    Remove {
        /// Path.
        path: String,
    },
    /// Watch a directory (and, `recursive`, the directories below it): a stream of JSON
    /// lines on channel 1 (`{"watching":N}` once the watches are set, then one
    /// [`WatchEvent`] per change) until the host cancels it.
    WatchDir {
        /// Directory.
        path: String,
        /// Watch its subdirectories too (those created later included).
        #[serde(default)]
        recursive: bool,
        /// Give each event the [`FileStat`] of its path, read when the event is read (a
        /// final symlink not followed; none when the path is gone by then). Needs the
        /// `watch_entry` feature.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        include_entry: bool,
    },
    /// Ends the connection without ending anything it started: replies `ok`, then the
    /// agent neither reads nor writes this stream again (not even a goaway) and
    /// leaves its processes running (a backend that checkpoints the sandbox reconnects
    /// later over a new stream). Open streams' processes run on with their output dropped
    /// (their stdin stays open); background processes run on with their logs unreachable.
    Detach,
}

/// One change seen by a [`Request::WatchDir`] stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchEvent {
    /// Path of what changed, relative to the watched directory.
    pub name: String,
    /// `create`, `write`, `remove`, `rename` (moved away) or `chmod`.
    pub op: String,
    /// The path's metadata when the watch asked for it (`include_entry`) and the path
    /// still existed when the agent read the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<FileStat>,
}

fn yes() -> bool {
    true
}

impl Request {
    /// Every op name, in the order they were introduced.
    pub const OPS: &'static [&'static str] = &[
        "ping",
        "spawn",
        "start_background",
        "background_kill",
        "background_logs",
        "background_status",
        "read_file",
        "write_file",
        "stat",
        "list_dir",
        "tar_out",
        "tar_in",
        "set_env",
        "make_dir",
        "rename",
        "remove",
        "watch_dir",
        "detach",
    ];

    /// Features beyond the ops, announced in the agent's hello `ops` after them:
    /// `pty` = [`SpawnSpec::pty`] and [`StreamControl::Resize`] are understood;
    /// `watch_entry` = [`Request::WatchDir`]'s `include_entry` is.
    pub const FEATURES: &'static [&'static str] = &["pty", "watch_entry"];
}

/// Host → agent on an open stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum StreamControl {
    /// Signal the stream's process group (idempotent; ignored after exit).
    Signal {
        /// Signal name.
        signal: String,
    },
    /// The host abandons the stream: the agent stops the operation (kills a process
    /// group, removes a partial file) and sends nothing more on it.
    Cancel,
    /// Resize the stream's terminal (the kernel sends the process SIGWINCH). Ignored on a
    /// stream without a terminal, after exit, and when a dimension is out of
    /// 1..=[`MAX_PTY_DIMENSION`] (the process lives on either way).
    Resize {
        /// Columns.
        cols: u16,
        /// Rows.
        rows: u16,
    },
}

/// Agent → host on an open stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Event {
    /// A spawned process is running.
    Started {
        /// Its pid (informational; address processes by stream or id).
        pid: u32,
    },
    /// A file read is starting.
    File {
        /// Size at open time.
        size: u64,
        /// Permission bits.
        mode: u32,
    },
    /// Terminal: the process exited and both stdout and stderr reached eof before this.
    Exited(ProcessExit),
    /// Terminal: the operation succeeded; `result` is op-specific.
    Ok {
        /// Op-specific result.
        #[serde(default)]
        result: serde_json::Value,
    },
    /// Terminal: the operation failed.
    Error(RemoteError),
}

impl Event {
    /// Whether the stream ends with this event.
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::Exited(_) | Self::Ok { .. } | Self::Error(_))
    }
}

/// How a process ended. `code` and `signal` are never both set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessExit {
    /// Exit code when it exited normally.
    pub code: Option<i32>,
    /// Signal name (e.g. `SIGKILL`) when a signal ended it.
    pub signal: Option<String>,
    /// Whether the core was dumped.
    #[serde(default)]
    pub core_dumped: bool,
    /// Whether the agent killed it because its timeout expired.
    #[serde(default)]
    pub timed_out: bool,
    /// Whether stdout/stderr were still held open by other processes when the agent
    /// stopped reading them (bounded drain after exit); never a silent truncation.
    #[serde(default)]
    pub output_truncated: bool,
}

impl ProcessExit {
    /// Exit code 0 and no signal.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Machine-readable error categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Path or process id does not exist.
    NotFound,
    /// Permission denied.
    PermissionDenied,
    /// Target exists with an incompatible type.
    AlreadyExists,
    /// The request was well-formed JSON but its arguments are invalid.
    InvalidRequest,
    /// The op is not implemented by this agent.
    Unsupported,
    /// A path (or tar entry) would leave its target directory.
    UnsafePath,
    /// The process could not be started.
    SpawnFailed,
    /// No space left on device.
    NoSpace,
    /// A frame on this stream exceeded the maximum size.
    FrameTooLarge,
    /// The peer broke the framing, the handshake or flow control.
    Protocol,
    /// Protocol versions do not overlap.
    VersionMismatch,
    /// Anything else.
    Io,
}

/// An error as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    /// Category.
    pub kind: ErrorKind,
    /// Human-readable text.
    pub message: String,
    /// The OS error number behind it, when there is one (e.g. 2 = ENOENT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno: Option<i32>,
}

impl RemoteError {
    /// Builds one.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            errno: None,
        }
    }

    /// Maps an I/O error, with context.
    pub fn io(context: impl std::fmt::Display, err: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        let kind = match err.kind() {
            K::NotFound => ErrorKind::NotFound,
            K::PermissionDenied => ErrorKind::PermissionDenied,
            K::AlreadyExists => ErrorKind::AlreadyExists,
            K::StorageFull => ErrorKind::NoSpace,
            K::InvalidInput | K::NotADirectory | K::IsADirectory => ErrorKind::InvalidRequest,
            _ => ErrorKind::Io,
        };
        let mut e = Self::new(kind, format!("{context}: {err}"));
        e.errno = err.raw_os_error();
        e
    }
}

/// Reply to `ping`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pong {
    /// Agent software/version.
    pub software: String,
    /// Agent pid.
    pub pid: u32,
    /// Milliseconds since the agent started.
    pub uptime_ms: u64,
}

/// Reply to `start_background`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackgroundStarted {
    /// Agent-issued id.
    pub id: String,
    /// Pid (informational).
    pub pid: u32,
}

/// Status of a background process, as the contract spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackgroundStatus {
    /// Still running.
    Running,
    /// Exited with code 0.
    Completed,
    /// Exited non-zero or died of a signal nobody asked for.
    Error,
    /// Ended after a kill request.
    Killed,
}

impl BackgroundStatus {
    /// The contract's string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Completed => "completed",
            Self::Error => "error",
            Self::Killed => "killed",
        }
    }
}

/// Reply to `background_status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BackgroundInfo {
    /// Status.
    pub status: BackgroundStatus,
    /// Exit details once ended.
    pub exit: Option<ProcessExit>,
    /// Pid.
    pub pid: u32,
}

/// Reply to `background_logs`: the retained tail of each stream (lossy UTF-8).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct BackgroundLogs {
    /// Retained stdout.
    pub stdout: String,
    /// Retained stderr.
    pub stderr: String,
    /// Bytes of stdout dropped from the front because of the retention bound.
    pub stdout_dropped: u64,
    /// Bytes of stderr dropped from the front.
    pub stderr_dropped: u64,
}

/// Reply to `write_file` and `read_file`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WriteDone {
    /// Absolute path.
    pub path: String,
    /// Bytes moved.
    pub bytes: u64,
}

/// Reply to `tar_in`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TarInDone {
    /// Absolute target directory.
    pub path: String,
    /// Entries extracted.
    pub entries: u64,
}

/// Reply to `make_dir`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MadeDir {
    /// Absolute path.
    pub path: String,
    /// Whether the directory was created (`false`: it already existed).
    pub created: bool,
}

/// What a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// Regular file.
    File,
    /// Directory.
    Dir,
    /// Symbolic link (not followed).
    Symlink,
    /// Anything else (fifo, socket, device).
    Other,
}

/// Reply to `stat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// Absolute path.
    pub path: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits (`& 0o7777`).
    pub mode: u32,
    /// Modification time, ms since the epoch.
    pub mtime_ms: i64,
    /// Target of a symlink.
    pub link_target: Option<String>,
    /// Owner's uid.
    #[serde(default)]
    pub uid: u32,
    /// Owner's gid.
    #[serde(default)]
    pub gid: u32,
    /// Owner's name in the sandbox's `/etc/passwd`, when listed.
    #[serde(default)]
    pub owner: Option<String>,
    /// Group's name in the sandbox's `/etc/group`, when listed.
    #[serde(default)]
    pub group: Option<String>,
}

/// One entry of `list_dir`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DirEntry {
    /// File name (lossy UTF-8).
    pub name: String,
    /// Kind.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Owner's uid.
    #[serde(default)]
    pub uid: u32,
    /// Owner's gid.
    #[serde(default)]
    pub gid: u32,
    /// Owner's name in the sandbox's `/etc/passwd`, when listed.
    #[serde(default)]
    pub owner: Option<String>,
    /// Group's name in the sandbox's `/etc/group`, when listed.
    #[serde(default)]
    pub group: Option<String>,
    /// Modification time, ms since the epoch.
    #[serde(default)]
    pub mtime_ms: i64,
    /// Target of a symlink.
    #[serde(default)]
    pub link_target: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_shapes() {
        let r = Request::Spawn(SpawnSpec {
            command: CommandSpec::Shell {
                script: "true".into(),
            },
            env: BTreeMap::from([("A".into(), None)]),
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: Some(5),
            pty: None,
        });
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["op"], "spawn");
        assert!(v.get("user").is_none());
        assert_eq!(v["command"]["kind"], "shell");
        assert!(v["env"]["A"].is_null());
        let e = Event::Exited(ProcessExit {
            signal: Some("SIGKILL".into()),
            ..Default::default()
        });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "exited");
        assert_eq!(v["signal"], "SIGKILL");
        let p: Request = serde_json::from_str(r#"{"op":"write_file","path":"x"}"#).unwrap();
        assert!(matches!(
            p,
            Request::WriteFile {
                create_parents: true,
                mode: None,
                ..
            }
        ));
    }

    #[test]
    fn new_requests_are_in_the_ops_list_and_old_stats_still_parse() {
        let reqs = [
            Request::MakeDir {
                path: "d".into(),
                owner: None,
            },
            Request::Rename {
                from: "a".into(),
                to: "b".into(),
            },
            Request::Remove { path: "p".into() },
        ];
        for r in reqs {
            let v = serde_json::to_value(&r).unwrap();
            let op = v["op"].as_str().unwrap().to_owned();
            assert!(Request::OPS.contains(&op.as_str()), "{op}");
        }
        // No `user`/`owner` key unless set: an older agent sees the request it knew.
        let spec = serde_json::to_value(Request::WriteFile {
            path: "f".into(),
            mode: None,
            create_parents: true,
            owner: None,
        })
        .unwrap();
        assert!(spec.get("owner").is_none());
        let st: FileStat = serde_json::from_str(
            r#"{"path":"/x","kind":"file","size":1,"mode":420,"mtime_ms":0,"link_target":null}"#,
        )
        .unwrap();
        assert_eq!((st.uid, st.owner), (0, None));
    }

    #[test]
    fn terminal_wire_shapes() {
        let plain = serde_json::to_value(SpawnSpec {
            command: CommandSpec::Shell {
                script: "true".into(),
            },
            env: BTreeMap::new(),
            cwd: None,
            user: None,
            stdin: false,
            timeout_ms: None,
            pty: None,
        })
        .unwrap();
        assert!(plain.get("pty").is_none(), "{plain}");
        let spec: SpawnSpec = serde_json::from_str(
            r#"{"command":{"kind":"shell","script":"sh"},"pty":{"cols":80,"rows":24}}"#,
        )
        .unwrap();
        assert_eq!(spec.pty, Some(PtySize { cols: 80, rows: 24 }));
        let v = serde_json::to_value(StreamControl::Resize {
            cols: 132,
            rows: 43,
        })
        .unwrap();
        assert_eq!(v, serde_json::json!({"type":"resize","cols":132,"rows":43}));
        for (cols, rows, ok) in [
            (1, 1, true),
            (1000, 1000, true),
            (0, 5, false),
            (5, 1001, false),
        ] {
            assert_eq!(PtySize { cols, rows }.is_valid(), ok, "{cols}x{rows}");
            assert_eq!(PtySize { cols, rows }.check().is_ok(), ok);
        }
        assert_eq!(
            PtySize { cols: 0, rows: 1 }.check().unwrap_err().kind,
            ErrorKind::InvalidRequest
        );
    }

    #[test]
    fn negotiation() {
        let mk = |lo, hi| Hello {
            magic: HELLO_MAGIC.into(),
            role: Role::Client,
            min_version: lo,
            max_version: hi,
            software: String::new(),
            max_frame: 1,
            initial_window: 1,
            ops: vec![],
            pid: None,
        };
        assert_eq!(mk(1, 3).negotiate(&mk(2, 5)), Some(3));
        assert_eq!(mk(1, 1).negotiate(&mk(2, 2)), None);
    }
}
