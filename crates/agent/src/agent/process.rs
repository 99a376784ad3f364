//! Starting processes, and attached (streamed) processes, with pipes or in a terminal
//! (`pty.rs`).
//!
//! Each process leads its own process group (a terminal's process its own session too),
//! so signals, timeouts and teardown reach everything it started that stayed in the
//! group. Exit is reported only after stdout and stderr both reached eof (or were
//! abandoned after the bounded drain, which is reported).

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::{Inbound, InputCredit, PumpEnd, StreamIo};
use super::{AgentShared, GroupGuard, TaskGuard, pty, users};
use crate::frame::channel;
use crate::message::{
    CommandSpec, ErrorKind, Event, ProcessExit, PtySize, RemoteError, SpawnSpec, StreamControl,
};
use crate::sys::{self, RawExit};

/// A started process.
#[derive(Debug)]
pub(crate) struct Spawned {
    pub(crate) pid: u32,
    pub(crate) guard: GroupGuard,
    pub(crate) exit: oneshot::Receiver<RawExit>,
    pub(crate) stdin: Option<pipe::Sender>,
    pub(crate) stdout: pipe::Receiver,
    pub(crate) stderr: pipe::Receiver,
}

pub(crate) fn describe(cmd: &CommandSpec) -> String {
    match cmd {
        CommandSpec::Shell { script } => format!("/bin/sh -c {script:?}"),
        CommandSpec::Argv { argv } => format!("{argv:?}"),
    }
}

/// The command of `spec` with its env and working directory, not yet started.
fn command(agent: &AgentShared, spec: &SpawnSpec) -> Result<Command, RemoteError> {
    let mut cmd = match &spec.command {
        CommandSpec::Shell { script } => {
            let mut c = Command::new("/bin/sh");
            c.arg("-c").arg(script);
            c
        }
        CommandSpec::Argv { argv } => {
            let Some((program, args)) = argv.split_first() else {
                return Err(RemoteError::new(ErrorKind::InvalidRequest, "empty argv"));
            };
            let mut c = Command::new(program);
            c.args(args);
            c
        }
    };
    if spec.pty.is_some() {
        // First, so the session env and the request's env can change or remove it.
        cmd.env("TERM", pty::DEFAULT_TERM);
    }
    let account = match &spec.user {
        Some(name) => Some(users::lookup(&agent.config.etc_dir, name)?),
        None => None,
    };
    // The account's variables sit between the session env and the request's: a request
    // naming HOME, USER or LOGNAME keeps its value.
    let identity = account.iter().flat_map(|a| {
        let home = a.home.to_string_lossy().into_owned();
        [
            ("HOME".to_owned(), Some(home)),
            ("USER".to_owned(), Some(a.name.clone())),
            ("LOGNAME".to_owned(), Some(a.name.clone())),
        ]
    });
    let env = agent
        .session_env()
        .into_iter()
        .chain(identity)
        .chain(spec.env.clone());
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    if let Some(a) = &account {
        // std drops the supplementary groups (setgroups(0)) when it sets a uid, so the
        // process's groups are exactly the account's gid: setgroups([]), setgid, setuid.
        cmd.uid(a.uid).gid(a.gid);
    }
    let cwd = match (&spec.cwd, &account) {
        (Some(c), _) => agent.resolve(c),
        (None, Some(a)) if a.home.is_absolute() && a.home.is_dir() => a.home.clone(),
        (None, Some(_)) => PathBuf::from("/"),
        (None, None) => agent.config.workdir.clone(),
    };
    // Named here: a missing cwd would otherwise read as the program being missing
    // ("cannot start …: No such file or directory").
    if let Err(e) = std::fs::metadata(&cwd).and_then(|m| {
        if m.is_dir() {
            Ok(())
        } else {
            Err(std::io::Error::from(std::io::ErrorKind::NotADirectory))
        }
    }) {
        let given = spec.cwd.as_deref().unwrap_or("");
        let shown = if Path::new(given).is_relative() && !given.is_empty() {
            format!("{given:?} (relative to {:?})", agent.config.workdir)
        } else {
            format!("{cwd:?}")
        };
        let mut err = RemoteError::io(
            format!(
                "cannot start {}: working directory {shown} is not usable",
                describe(&spec.command)
            ),
            &e,
        );
        err.kind = ErrorKind::SpawnFailed;
        return Err(err);
    }
    cmd.current_dir(&cwd);
    Ok(cmd)
}

/// Starts `cmd` under the reaper and registers its group with the connection.
fn start(
    agent: &AgentShared,
    conn: u64,
    spec: &SpawnSpec,
    cmd: &mut Command,
) -> Result<(Child, oneshot::Receiver<RawExit>, GroupGuard), RemoteError> {
    let (child, exit) = agent.reaper.spawn(cmd).map_err(|e| {
        let mut err = RemoteError::io(format!("cannot start {}", describe(&spec.command)), &e);
        err.kind = ErrorKind::SpawnFailed;
        err
    })?;
    let pid = child.id();
    agent.register_group(pid as i32, conn);
    Ok((child, exit, GroupGuard::new(pid as i32)))
}

/// Starts a process with pipes (stdin a pipe or `/dev/null`); refuses a `pty` spec.
pub(crate) fn spawn(
    agent: &AgentShared,
    conn: u64,
    spec: &SpawnSpec,
) -> Result<Spawned, RemoteError> {
    if spec.pty.is_some() {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            "only an attached process (`spawn`) can have a terminal",
        ));
    }
    let mut cmd = command(agent, spec)?;
    cmd.stdin(if spec.stdin {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .process_group(0);
    let (mut child, exit, guard) = start(agent, conn, spec, &mut cmd)?;
    let pid = child.id();
    let convert = |e: std::io::Error| RemoteError::io("cannot set up process pipes", &e);
    let stdin = match child.stdin.take() {
        Some(s) => Some(pipe::Sender::from_owned_fd(OwnedFd::from(s)).map_err(convert)?),
        None => None,
    };
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| RemoteError::new(ErrorKind::Io, "stdout pipe missing"))?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| RemoteError::new(ErrorKind::Io, "stderr pipe missing"))?;
    // `child` is dropped without waiting: the reaper owns its exit status.
    Ok(Spawned {
        pid,
        guard,
        exit,
        stdin,
        stdout: pipe::Receiver::from_owned_fd(OwnedFd::from(stdout)).map_err(convert)?,
        stderr: pipe::Receiver::from_owned_fd(OwnedFd::from(stderr)).map_err(convert)?,
    })
}

/// A process started in a new terminal.
#[derive(Debug)]
struct PtySpawned {
    pid: u32,
    guard: GroupGuard,
    exit: oneshot::Receiver<RawExit>,
    master: pty::Master,
}

fn spawn_pty(
    agent: &AgentShared,
    conn: u64,
    spec: &SpawnSpec,
    size: PtySize,
) -> Result<PtySpawned, RemoteError> {
    size.check()?;
    let mut cmd = command(agent, spec)?;
    let failed = |e: std::io::Error| {
        let what = format!("cannot open a terminal for {}", describe(&spec.command));
        // ENOSPC from /dev/ptmx, which rustix reports as EAGAIN: the devpts instance
        // (128 terminals in a sandbox) or the host's pool is used up.
        let mut err = if e.raw_os_error() == Some(libc::EAGAIN) {
            let mut err = RemoteError::new(
                ErrorKind::Io,
                format!("{what}: every pseudo-terminal is in use"),
            );
            err.errno = Some(libc::ENOSPC);
            err
        } else {
            RemoteError::io(what, &e)
        };
        err.kind = ErrorKind::SpawnFailed;
        err
    };
    let (master, peer) = pty::open(size).map_err(failed)?;
    if let Some(name) = &spec.user {
        // The terminal belongs to whoever runs in it, as a login's does: programs that
        // reopen it by name (sudo, ssh, pinentry) need to.
        let account = users::lookup(&agent.config.etc_dir, name)?;
        rustix::fs::fchown(
            &peer,
            Some(rustix::fs::Uid::from_raw(account.uid)),
            Some(rustix::fs::Gid::from_raw(account.gid)),
        )
        .map_err(|e| failed(e.into()))?;
    }
    pty::attach(&mut cmd, peer).map_err(failed)?;
    let (child, exit, guard) = start(agent, conn, spec, &mut cmd)?;
    // The command holds the agent's copies of the terminal's peer: only once they are
    // closed does reading the master end when the process (and whatever it left holding
    // the terminal) closed it.
    drop(cmd);
    Ok(PtySpawned {
        pid: child.id(),
        guard,
        exit,
        master,
    })
}

/// Status for an exit the reaper could not deliver (someone else reaped the pid).
pub(crate) fn unknown_exit() -> RawExit {
    RawExit {
        code: None,
        signal: None,
        core_dumped: false,
    }
}

/// Writes host stdin bytes to the pipe (or terminal), returning credit as each chunk is
/// written. After a write error (EPIPE; EIO once a terminal is closed) the bytes are
/// dropped (still credited) so the host never blocks on a dead pipe.
async fn stdin_writer<W: AsyncWrite + Unpin>(
    mut pipe: W,
    mut rx: mpsc::UnboundedReceiver<bytes::Bytes>,
    credit: InputCredit,
) {
    let mut broken = false;
    while let Some(chunk) = rx.recv().await {
        if !broken && pipe.write_all(&chunk).await.is_err() {
            broken = true;
        }
        credit.consumed(chunk.len());
    }
    // Channel closed = host sent eof: dropping the pipe delivers EOF to the process.
}

/// An attached process as started: with pipes, or in a terminal.
enum Attached {
    Pipes(Spawned),
    Pty(PtySpawned),
}

/// Starts the task that writes host input to `w`.
fn writer<W: AsyncWrite + Unpin + Send + 'static>(
    w: W,
    credit: &InputCredit,
) -> (mpsc::UnboundedSender<bytes::Bytes>, TaskGuard<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    (
        tx,
        TaskGuard(tokio::spawn(stdin_writer(w, rx, credit.clone()))),
    )
}

fn abandoned(r: &std::io::Result<(PumpEnd, u64)>) -> bool {
    !matches!(r, Ok((PumpEnd::Eof, _)))
}

pub(crate) async fn run_attached(io: &mut StreamIo, spec: SpawnSpec) -> Result<Event, RemoteError> {
    let agent: Arc<AgentShared> = io.conn.agent.clone();
    let attached = match spec.pty {
        None => Attached::Pipes(spawn(&agent, io.conn.id, &spec)?),
        Some(size) => Attached::Pty(spawn_pty(&agent, io.conn.id, &spec, size)?),
    };
    let pid = match &attached {
        Attached::Pipes(sp) => sp.pid,
        Attached::Pty(sp) => sp.pid,
    };
    // Before any output: the drain below starts sending at once.
    io.event(&Event::Started { pid });
    let pgid = pid as i32;
    let drain_idle = agent.config.drain_idle;

    let (exited_tx, exited_rx) = watch::channel(false);
    let out_sender = io.sender(channel::STDOUT);
    let err_sender = io.sender(channel::STDERR);
    let credit = io.input_credit();
    let (mut guard, mut exit, mut drain, input, terminal) = match attached {
        Attached::Pipes(sp) => {
            let (mut stdout, mut stderr) = (sp.stdout, sp.stderr);
            let rx1 = exited_rx.clone();
            let drain = TaskGuard(tokio::spawn(async move {
                let (a, b) = tokio::join!(
                    out_sender.pump(&mut stdout, Some(rx1), drain_idle),
                    err_sender.pump(&mut stderr, Some(exited_rx), drain_idle),
                );
                abandoned(&a) || abandoned(&b)
            }));
            let input = sp.stdin.map(|pipe| writer(pipe, &credit));
            (sp.guard, sp.exit, drain, input, None)
        }
        Attached::Pty(sp) => {
            // A terminal is one stream: everything it shows is stdout; stderr only ends.
            let mut screen = sp.master.clone();
            let drain = TaskGuard(tokio::spawn(async move {
                let a = out_sender
                    .pump(&mut screen, Some(exited_rx), drain_idle)
                    .await;
                if matches!(a, Ok((PumpEnd::Eof | PumpEnd::Abandoned, _))) {
                    err_sender.eof();
                }
                abandoned(&a)
            }));
            let input = Some(writer(sp.master.clone(), &credit));
            (sp.guard, sp.exit, drain, input, Some(sp.master))
        }
    };
    // The writer task lives (guarded) until this function returns; dropping `stdin_tx`
    // on the host's eof lets it finish the queued bytes and then close the pipe.
    let (mut stdin_tx, _stdin_task) = match input {
        Some((tx, task)) => (Some(tx), Some(task)),
        None => (None, None),
    };

    let deadline = spec
        .timeout_ms
        .map(|ms| tokio::time::Instant::now() + std::time::Duration::from_millis(ms));
    let mut status: Option<RawExit> = None;
    let mut drained: Option<bool> = None;
    let mut timed_out = false;
    let mut inbound_open = true;
    while status.is_none() || drained.is_none() {
        tokio::select! {
            st = &mut exit, if status.is_none() => {
                status = Some(st.unwrap_or_else(|_| unknown_exit()));
                agent.leader_exited(pgid);
                let _ = exited_tx.send(true);
            }
            d = &mut drain.0, if drained.is_none() => {
                drained = Some(d.unwrap_or(true));
            }
            () = sleep_until(deadline), if status.is_none() && !timed_out && deadline.is_some() => {
                timed_out = true;
                let _ = sys::kill_group(pgid, libc::SIGKILL);
            }
            msg = io.inbound.recv(), if inbound_open => match msg {
                Some(Inbound::Data(b)) => {
                    let len = b.len();
                    let delivered = stdin_tx.as_ref().is_some_and(|tx| tx.send(b).is_ok());
                    if !delivered {
                        credit.consumed(len);
                    }
                }
                // A terminal has no eof (the host types ^D for one): nothing to write.
                Some(Inbound::Eof) if terminal.is_some() => {}
                // Dropping the sender lets the writer finish queued bytes, then close.
                Some(Inbound::Eof) => stdin_tx = None,
                Some(Inbound::Control(StreamControl::Signal { signal })) => {
                    if status.is_none() {
                        match sys::signal_number(&signal) {
                            Some(sig) => { let _ = sys::kill_group(pgid, sig); }
                            None => tracing::warn!(%signal, "ignoring unknown signal"),
                        }
                    }
                }
                Some(Inbound::Control(StreamControl::Resize { cols, rows })) => {
                    resize(terminal.as_ref(), PtySize { cols, rows });
                }
                Some(Inbound::Control(_)) => {}
                None => inbound_open = false,
            },
        }
    }
    guard.disarm();
    let mut exit: ProcessExit = status.unwrap_or_else(unknown_exit).to_exit();
    exit.timed_out = timed_out;
    exit.output_truncated = drained.unwrap_or(true);
    Ok(Event::Exited(exit))
}

/// A resize is ignored (never an error that would end the process) on a stream without a
/// terminal and when a dimension is out of range.
fn resize(terminal: Option<&pty::Master>, size: PtySize) {
    match terminal {
        Some(master) if size.is_valid() => {
            if let Err(e) = master.resize(size) {
                tracing::debug!(error = %e, "terminal resize failed");
            }
        }
        Some(_) => tracing::warn!(?size, "ignoring an out-of-range terminal size"),
        None => tracing::debug!("ignoring a resize of a process without a terminal"),
    }
}

pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
