//! `omabox-agent`: the one in-sandbox agent and its wire protocol, both sides.
//!
//! Every isolating backend (linux namespaces now; gVisor, Docker and microVMs later) runs
//! this agent as PID 1 of its isolation boundary and hands the host a byte stream to it: a
//! unix socketpair today, vsock or an attach stream later. The linux backend boots its own
//! init binary, `omabox-sandbox-init`, which sets the sandbox up and then serves this
//! protocol in-process with [`agent::Agent`]; the standalone `omabox-agent` binary
//! (`src/main.rs`) is the same agent for a boundary that only needs a PID 1 started with the
//! agent end of a socketpair (see [`transport`]). Exec, duplex stdin/stdout/stderr,
//! background processes, file bytes, tar in/out, stat/list, env and readiness are
//! implemented once, here. The host side is [`client::AgentClient`].
//!
//! # Frame format
//!
//! Each direction starts with the 8-byte preamble `OMABOX\r\n`, then frames:
//!
//! ```text
//! [u32 BE body length][u32 BE stream id][u8 kind][u8 flags][body]
//! ```
//!
//! * stream 0 is the connection: `hello` (JSON, first frame each way) and `goaway`
//!   (JSON reason, last frame before a close).
//! * `open` (JSON request, host → agent) starts a stream; the host picks odd ids.
//! * `control` (JSON) carries events agent → host (`started`, `file`, and exactly one
//!   terminal `exited` / `ok` / `error`) and stream controls host → agent (`signal`,
//!   `cancel`, `resize`).
//! * `data` carries raw bytes for the channel in `flags` (0 = host → agent input:
//!   stdin, file or tar upload; 1 = stdout / file / tar download; 2 = stderr);
//!   `eof` half-closes one channel; `window` (u32 BE increment) returns credit.
//!
//! Bodies are capped (1 MiB by default, announced in the hello) and the cap is checked
//! before anything is allocated. A malformed or oversized frame whose header names a
//! known stream fails only that stream (the body is skipped, the stream gets an `error`,
//! its process is killed); anything that breaks the framing itself (bad preamble,
//! unknown kind, truncation, oversized frame for no stream) ends the connection with a
//! `goaway` saying why. Neither is ever a panic. Unknown ops get an `unsupported` error
//! on their own stream.
//!
//! # Handshake
//!
//! Both sides send a hello at once (magic, role, version range, max frame, initial
//! window; the agent adds its ops and pid). The agent's hello is its readiness signal.
//! Each side checks the other's; no common version is a clear `VersionMismatch` error
//! on the client and a `goaway` from the agent.
//!
//! # Flow control
//!
//! Every data channel in both directions has a credit window (SSH style), initially the
//! receiver's announced window. A sender never has more unacknowledged bytes in flight
//! than its credit; a receiver grants credit back only once its consumer has *taken*
//! the bytes. So every queue is bounded by a window, an unread stdout blocks only the
//! process writing it (its pipe fills), and a chatty process cannot starve the others:
//! control frames (signals, exits, replies) never wait for credit.
//!
//! # EOF and exit ordering
//!
//! For a process stream the agent sends, in order: stdout data then stdout `eof`,
//! stderr data then stderr `eof` (the two interleave with each other), and only after
//! both eofs the single `exited` event. Pipes are read to EOF, not to `waitpid`. If a
//! grandchild keeps a pipe open, the agent stops reading after a bounded silence
//! following the exit and says so (`output_truncated`); it never truncates silently.
//! Host stdin eof is an explicit `eof` frame on channel 0, ordered after queued bytes.
//!
//! # Terminals
//!
//! A `spawn` with `pty: {cols, rows}` runs the process in a new pseudo-terminal from the
//! agent's `/dev/ptmx` (inside a sandbox: the sandbox's own devpts): it leads a new
//! session with the terminal as controlling terminal and stdin/stdout/stderr, and
//! `TERM=xterm-256color` unless the env sets it. The terminal is one stream: everything
//! it shows comes on channel 1, read until every holder closed it (or the bounded drain
//! after exit); channel 2 stays empty and gets its eof with channel 1's. Host input on
//! channel 0 is typed into it; host eof writes nothing (send `\x04` for the terminal's
//! eof). The `resize` stream control sets its size (the kernel sends SIGWINCH); a resize
//! of a stream without a terminal, or out of 1..=1000 columns or rows, is ignored. The
//! agent's hello lists `pty` among its ops. The master is close-on-exec in the agent
//! only and never reaches a process.
//!
//! # What the agent must never do
//!
//! * lose an exit status: one reaper owns `waitpid`, spawn and registration happen under
//!   the reaper's lock, orphans are reaped and discarded;
//! * hold a lock across an `await` or a blocking syscall on the connection path, or let
//!   one stream's consumer block the reader;
//! * outlive its connection's processes: when the connection ends every process group it
//!   started is SIGKILLed (and, as PID 1, everything else in the namespace);
//! * rely on fd passing (vsock cannot carry it) or grow a buffer to a size the peer
//!   declared;
//! * write outside a tar target directory (`..`, absolute paths, writes through
//!   symlinks and escaping hard links are errors, not skips);
//! * follow a symlink while removing a tree (the walk is on directory fds, `O_NOFOLLOW`),
//!   or read the sandbox's account files without a size cap.

pub mod account;
pub mod agent;
pub mod client;
pub mod flow;
pub mod frame;
pub mod message;
pub mod sys;
pub mod transport;

/// `omabox-agent/<version>`: the agent's software string in hellos and pongs.
pub const SOFTWARE: &str = concat!("omabox-agent/", env!("CARGO_PKG_VERSION"));

pub use agent::{Agent, AgentConfig, AgentError, ReapMode, Served};
pub use client::{
    AgentClient, BackgroundProcess, ClientConfig, ClientError, DEFAULT_MAX_EXEC_OUTPUT, DataReader,
    DataWriter, DirWatch, DuplexProcess, ExecOutput, ExecRequest, FileReader, MAX_WHOLE_READ,
    ProcessKiller, WriteOptions,
};
pub use frame::ProtocolError;
pub use message::{
    BackgroundLogs, BackgroundStatus, DirEntry, ErrorKind, FileKind, FileStat, ProcessExit,
    PtySize, RemoteError, WatchEvent,
};
pub use transport::AgentProcess;
