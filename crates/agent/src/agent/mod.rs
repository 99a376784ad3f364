//! The agent side: serves the protocol on one byte stream at a time.
//!
//! Ownership: an [`Agent`] owns the reaper (the one place that calls `waitpid`) and the
//! registry of process groups it started. Each connection owns its streams and
//! background processes; when the connection ends every group it started is killed.

mod background;
mod conn;
mod files;
mod process;
mod pty;
mod reaper;
mod tarball;
mod tree;
mod users;
mod watch;

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};

pub use reaper::ReapMode;
use reaper::Reaper;

use crate::frame::{MAX_FRAME_BODY, ProtocolError};
use crate::sys;

/// Errors that end a connection (or stop the agent from starting).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The peer broke the protocol or the transport failed; a goaway was sent if possible.
    #[error("connection ended")]
    Protocol(#[from] ProtocolError),
    /// The agent could not set itself up (signal handlers, reaper).
    #[error("agent setup failed")]
    Setup(#[source] io::Error),
}

/// How a connection ended without a protocol fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// The peer closed it (or sent a goaway); its processes were killed.
    Closed,
    /// The peer detached; its processes run on.
    Detached,
}

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// Who reaps what; see [`ReapMode`].
    pub reap: ReapMode,
    /// Directory relative paths and default process cwd resolve against.
    pub workdir: PathBuf,
    /// Window granted per input channel of every stream.
    pub window: u32,
    /// Largest frame body accepted.
    pub max_frame: u32,
    /// After a process exits, how long its stdout/stderr may stay silent-but-open (held
    /// by a grandchild) before the agent stops reading and reports `output_truncated`.
    pub drain_idle: Duration,
    /// Retained bytes per stream of each background process.
    pub background_log_limit: usize,
    /// Directory whose `passwd` and `group` name the sandbox's accounts (`/etc`; tests
    /// point it elsewhere).
    pub etc_dir: PathBuf,
}

impl Default for AgentConfig {
    fn default() -> Self {
        Self {
            reap: ReapMode::OwnChildren,
            workdir: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            window: crate::flow::DEFAULT_WINDOW,
            max_frame: MAX_FRAME_BODY,
            drain_idle: Duration::from_millis(1000),
            background_log_limit: 256 * 1024,
            etc_dir: PathBuf::from("/etc"),
        }
    }
}

/// The in-sandbox agent.
#[derive(Debug, Clone)]
pub struct Agent {
    shared: Arc<AgentShared>,
}

#[derive(Debug)]
pub(crate) struct AgentShared {
    pub(crate) config: AgentConfig,
    reaper: Reaper,
    started: Instant,
    /// Session env changes (`None` = remove), merged into every later process.
    env: Mutex<BTreeMap<String, Option<String>>>,
    /// Process group id → connection that started it.
    groups: Mutex<HashMap<i32, u64>>,
    next_conn: AtomicU64,
    /// Background processes of detached connections (they run on; nobody can ask for
    /// their output again). Ended ones are dropped as others are added.
    detached_background: Mutex<Vec<Arc<background::Background>>>,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Plain maps behind these locks stay consistent even if a holder panicked.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Agent {
    /// Starts the reaper. Must be called inside a tokio runtime.
    pub fn new(config: AgentConfig) -> Result<Self, AgentError> {
        let reaper = Reaper::start(config.reap).map_err(AgentError::Setup)?;
        Ok(Self {
            shared: Arc::new(AgentShared {
                config,
                reaper,
                started: Instant::now(),
                env: Mutex::new(BTreeMap::new()),
                groups: Mutex::new(HashMap::new()),
                detached_background: Mutex::new(Vec::new()),
                next_conn: AtomicU64::new(1),
            }),
        })
    }

    /// Serves one connection until the peer closes it or breaks the protocol. Every
    /// process group started on it is killed before this returns. Can be called again
    /// (sequentially or concurrently) for further connections.
    pub async fn serve<T>(&self, io: T) -> Result<(), AgentError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        self.serve_detachable(io).await.map(|_| ())
    }

    /// [`Agent::serve`], saying how the connection ended: on [`Served::Detached`] (the
    /// host sent [`Request::Detach`](crate::message::Request::Detach)) nothing the
    /// connection started was killed, and no goaway was sent.
    pub async fn serve_detachable<T>(&self, io: T) -> Result<Served, AgentError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let id = self.shared.next_conn.fetch_add(1, Ordering::Relaxed);
        conn::serve(self.shared.clone(), id, io).await
    }

    /// Sends `signal` to every live process group the agent started (SIGTERM/SIGINT
    /// forwarding when the agent is init).
    pub fn signal_all(&self, signal: i32) {
        let groups: Vec<i32> = lock(&self.shared.groups).keys().copied().collect();
        for pgid in groups {
            let _ = sys::kill_group(pgid, signal);
        }
    }

    /// SIGKILLs every process group the agent started and forgets them.
    pub fn kill_all(&self) {
        let groups: Vec<i32> = lock(&self.shared.groups).drain().map(|(g, _)| g).collect();
        for pgid in groups {
            let _ = sys::kill_group(pgid, libc::SIGKILL);
        }
    }

    /// Process groups the agent still tracks.
    pub fn tracked_groups(&self) -> usize {
        lock(&self.shared.groups).len()
    }
}

impl AgentShared {
    pub(crate) fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.config.workdir.join(p)
        }
    }

    pub(crate) fn uptime(&self) -> Duration {
        self.started.elapsed()
    }

    pub(crate) fn session_env(&self) -> BTreeMap<String, Option<String>> {
        lock(&self.env).clone()
    }

    pub(crate) fn merge_env(&self, vars: BTreeMap<String, Option<String>>) {
        lock(&self.env).extend(vars);
    }

    fn register_group(&self, pgid: i32, conn: u64) {
        lock(&self.groups).insert(pgid, conn);
    }

    /// The group leader was reaped: forget the group once no member is left, so a
    /// recycled id is never signalled later.
    fn leader_exited(&self, pgid: i32) {
        if !sys::group_alive(pgid) {
            lock(&self.groups).remove(&pgid);
        }
    }

    fn kill_conn_groups(&self, conn: u64) {
        let mine: Vec<i32> = {
            let mut groups = lock(&self.groups);
            let mine: Vec<i32> = groups
                .iter()
                .filter(|(_, c)| **c == conn)
                .map(|(g, _)| *g)
                .collect();
            for g in &mine {
                groups.remove(g);
            }
            mine
        };
        for pgid in mine {
            let _ = sys::kill_group(pgid, libc::SIGKILL);
        }
    }
}

/// SIGKILLs a process group when dropped while armed: an aborted operation (cancel,
/// stream reset, connection loss) never leaves its process running.
#[derive(Debug)]
pub(crate) struct GroupGuard {
    pgid: i32,
    armed: bool,
}

impl GroupGuard {
    fn new(pgid: i32) -> Self {
        Self { pgid, armed: true }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = sys::kill_group(self.pgid, libc::SIGKILL);
        }
    }
}

/// Aborts a task when dropped.
#[derive(Debug)]
pub(crate) struct TaskGuard<T>(pub(crate) tokio::task::JoinHandle<T>);

impl<T> Drop for TaskGuard<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs one request to its terminal event.
pub(crate) async fn dispatch_request(
    io: &mut conn::StreamIo,
    req: crate::message::Request,
) -> Result<crate::message::Event, crate::message::RemoteError> {
    use crate::message::{Pong, Request};
    match req {
        Request::Ping => files::ok(&Pong {
            software: crate::SOFTWARE.into(),
            pid: sys::getpid(),
            uptime_ms: io.conn.agent.uptime().as_millis() as u64,
        }),
        Request::Spawn(spec) => process::run_attached(io, spec).await,
        Request::StartBackground(spec) => files::ok(&background::start(&io.conn, spec)?),
        Request::BackgroundKill { id, signal } => {
            background::kill(&io.conn, &id, &signal)?;
            files::ok(&())
        }
        Request::BackgroundLogs { id } => files::ok(&background::logs(
            &io.conn,
            &id,
            io.conn.peer_max_frame as usize,
        )?),
        Request::BackgroundStatus { id } => files::ok(&background::status(&io.conn, &id)?),
        Request::ReadFile { path } => files::read_file(io, &path).await,
        Request::WriteFile {
            path,
            mode,
            create_parents,
            owner,
        } => files::write_file(io, &path, mode, create_parents, owner.as_deref()).await,
        Request::Stat { path } => files::ok(&files::stat(io, &path).await?),
        Request::ListDir { path } => files::ok(&files::list_dir(io, &path).await?),
        Request::TarOut { path } => tarball::tar_out(io, &path).await,
        Request::TarIn { path } => tarball::tar_in(io, &path).await,
        Request::SetEnv { vars } => {
            io.conn.agent.merge_env(vars);
            files::ok(&())
        }
        Request::MakeDir { path, owner } => files::ok(&tree::make_dir(io, &path, owner).await?),
        Request::Rename { from, to } => {
            tree::rename(io, &from, &to).await?;
            files::ok(&())
        }
        Request::WatchDir {
            path,
            recursive,
            include_entry,
        } => watch::watch_dir(io, &path, recursive, include_entry).await,
        Request::Remove { path } => {
            tree::remove(io, &path).await?;
            files::ok(&())
        }
        // The connection ends once this reply is queued (`conn::run_stream`).
        Request::Detach => files::ok(&()),
    }
}
