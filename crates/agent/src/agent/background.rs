//! Background processes: started by one request, then addressed by an agent-issued id.
//! Output is kept (bounded, tail retained, drops counted) whether or not anyone asks.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;

use super::conn::{Conn, next_id};
use super::process::{sleep_until, spawn, unknown_exit};
use super::{TaskGuard, lock};
use crate::message::{
    BackgroundInfo, BackgroundLogs, BackgroundStarted, BackgroundStatus, ErrorKind, ProcessExit,
    RemoteError, SpawnSpec,
};
use crate::sys;

#[derive(Debug, Default)]
struct Ring {
    buf: VecDeque<u8>,
    dropped: u64,
}

impl Ring {
    fn push(&mut self, bytes: &[u8], limit: usize) {
        self.buf.extend(bytes);
        if self.buf.len() > limit {
            let excess = self.buf.len() - limit;
            self.buf.drain(..excess);
            self.dropped += excess as u64;
        }
    }

    fn tail(&self, max: usize) -> (String, u64) {
        let skip = self.buf.len().saturating_sub(max);
        let bytes: Vec<u8> = self.buf.iter().skip(skip).copied().collect();
        (
            String::from_utf8_lossy(&bytes).into_owned(),
            self.dropped + skip as u64,
        )
    }
}

#[derive(Debug, Default)]
struct State {
    exit: Option<ProcessExit>,
    kill_requested: bool,
}

#[derive(Debug)]
pub(crate) struct Background {
    pid: u32,
    stdout: Mutex<Ring>,
    stderr: Mutex<Ring>,
    state: Mutex<State>,
    task: Mutex<Option<TaskGuard<()>>>,
}

impl Background {
    /// Whether its process has ended (its exit recorded).
    pub(crate) fn ended(&self) -> bool {
        lock(&self.state).exit.is_some()
    }
}

pub(crate) fn start(
    conn: &Arc<Conn>,
    mut spec: SpawnSpec,
) -> Result<BackgroundStarted, RemoteError> {
    spec.stdin = false;
    let agent = conn.agent.clone();
    let mut sp = spawn(&agent, conn.id, &spec)?;
    let id = format!("bg-{}", next_id(&conn.next_background));
    let bg = Arc::new(Background {
        pid: sp.pid,
        stdout: Mutex::new(Ring::default()),
        stderr: Mutex::new(Ring::default()),
        state: Mutex::new(State::default()),
        task: Mutex::new(None),
    });
    let limit = agent.config.background_log_limit;
    let weak = Arc::downgrade(&bg);
    let deadline = spec
        .timeout_ms
        .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
    let task = tokio::spawn(async move {
        let pgid = sp.pid as i32;
        let collect = |mut pipe: tokio::net::unix::pipe::Receiver, which: u8| {
            let weak = weak.clone();
            async move {
                let mut buf = vec![0u8; 16 * 1024];
                while let Ok(n) = pipe.read(&mut buf).await {
                    let Some(bg) = weak.upgrade() else { return };
                    if n == 0 {
                        return;
                    }
                    let ring = if which == 1 { &bg.stdout } else { &bg.stderr };
                    lock(ring).push(&buf[..n], limit);
                }
            }
        };
        let out = collect(sp.stdout, 1);
        let err = collect(sp.stderr, 2);
        let wait = async {
            let mut timed_out = false;
            let status = tokio::select! {
                st = &mut sp.exit => st,
                () = sleep_until(deadline) => {
                    timed_out = true;
                    let _ = sys::kill_group(pgid, libc::SIGKILL);
                    (&mut sp.exit).await
                }
            };
            agent.leader_exited(pgid);
            let mut exit = status.unwrap_or_else(|_| unknown_exit()).to_exit();
            exit.timed_out = timed_out;
            exit
        };
        let ((), (), exit) = tokio::join!(out, err, wait);
        sp.guard.disarm();
        if let Some(bg) = weak.upgrade() {
            lock(&bg.state).exit = Some(exit);
        }
    });
    *lock(&bg.task) = Some(TaskGuard(task));
    lock(&conn.background).insert(id.clone(), bg.clone());
    Ok(BackgroundStarted { id, pid: bg.pid })
}

fn find(conn: &Conn, id: &str) -> Result<Arc<Background>, RemoteError> {
    lock(&conn.background).get(id).cloned().ok_or_else(|| {
        RemoteError::new(ErrorKind::NotFound, format!("no background process `{id}`"))
    })
}

/// Idempotent: signalling a process that already ended succeeds and does nothing.
pub(crate) fn kill(conn: &Conn, id: &str, signal: &str) -> Result<(), RemoteError> {
    let bg = find(conn, id)?;
    let sig = sys::signal_number(signal).ok_or_else(|| {
        RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("unknown signal `{signal}`"),
        )
    })?;
    let mut state = lock(&bg.state);
    if state.exit.is_none() {
        state.kill_requested = true;
        let _ = sys::kill_group(bg.pid as i32, sig);
    }
    Ok(())
}

pub(crate) fn status(conn: &Conn, id: &str) -> Result<BackgroundInfo, RemoteError> {
    let bg = find(conn, id)?;
    let state = lock(&bg.state);
    let status = match &state.exit {
        None => BackgroundStatus::Running,
        Some(_) if state.kill_requested => BackgroundStatus::Killed,
        Some(e) if e.success() => BackgroundStatus::Completed,
        Some(_) => BackgroundStatus::Error,
    };
    Ok(BackgroundInfo {
        status,
        exit: state.exit.clone(),
        pid: bg.pid,
    })
}

/// Logs fit one control frame: the retained tails are shortened until they do.
pub(crate) fn logs(conn: &Conn, id: &str, max_body: usize) -> Result<BackgroundLogs, RemoteError> {
    let bg = find(conn, id)?;
    let mut max = usize::MAX;
    loop {
        let (stdout, stdout_dropped) = lock(&bg.stdout).tail(max);
        let (stderr, stderr_dropped) = lock(&bg.stderr).tail(max);
        let logs = BackgroundLogs {
            stdout,
            stderr,
            stdout_dropped,
            stderr_dropped,
        };
        let size = serde_json::to_vec(&logs)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size + 256 <= max_body || max == 0 {
            return Ok(logs);
        }
        max = if max == usize::MAX {
            max_body / 8
        } else {
            max / 2
        };
    }
}
