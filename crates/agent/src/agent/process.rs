//! Starting processes, and attached (streamed) processes.
//!
//! Each process leads its own process group, so signals, timeouts and teardown reach
//! everything it started. Exit is reported only after stdout and stderr both reached
//! eof (or were abandoned after the bounded drain, which is reported).

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::unix::pipe;
use tokio::sync::{mpsc, oneshot, watch};

use super::conn::{Inbound, InputCredit, PumpEnd, StreamIo};
use super::{AgentShared, GroupGuard, TaskGuard, users};
use crate::frame::channel;
use crate::message::{
    CommandSpec, ErrorKind, Event, ProcessExit, RemoteError, SpawnSpec, StreamControl,
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

pub(crate) fn spawn(
    agent: &AgentShared,
    conn: u64,
    spec: &SpawnSpec,
) -> Result<Spawned, RemoteError> {
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
    cmd.current_dir(&cwd)
        .stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let (mut child, exit) = agent.reaper.spawn(&mut cmd).map_err(|e| {
        let mut err = RemoteError::io(format!("cannot start {}", describe(&spec.command)), &e);
        err.kind = ErrorKind::SpawnFailed;
        err
    })?;
    let pid = child.id();
    agent.register_group(pid as i32, conn);
    let guard = GroupGuard::new(pid as i32);
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

/// Status for an exit the reaper could not deliver (someone else reaped the pid).
pub(crate) fn unknown_exit() -> RawExit {
    RawExit {
        code: None,
        signal: None,
        core_dumped: false,
    }
}

/// Writes host stdin bytes to the pipe, returning credit as each chunk is written. After
/// EPIPE the bytes are dropped (still credited) so the host never blocks on a dead pipe.
async fn stdin_writer(
    mut pipe: pipe::Sender,
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

pub(crate) async fn run_attached(io: &mut StreamIo, spec: SpawnSpec) -> Result<Event, RemoteError> {
    let agent: Arc<AgentShared> = io.conn.agent.clone();
    let mut sp = spawn(&agent, io.conn.id, &spec)?;
    io.event(&Event::Started { pid: sp.pid });
    let pgid = sp.pid as i32;
    let drain_idle = agent.config.drain_idle;

    let (exited_tx, exited_rx) = watch::channel(false);
    let out_sender = io.sender(channel::STDOUT);
    let err_sender = io.sender(channel::STDERR);
    let (mut stdout, mut stderr) = (sp.stdout, sp.stderr);
    let (rx1, rx2) = (exited_rx.clone(), exited_rx);
    let mut drain = TaskGuard(tokio::spawn(async move {
        let (a, b) = tokio::join!(
            out_sender.pump(&mut stdout, Some(rx1), drain_idle),
            err_sender.pump(&mut stderr, Some(rx2), drain_idle),
        );
        let abandoned = |r: &std::io::Result<(PumpEnd, u64)>| !matches!(r, Ok((PumpEnd::Eof, _)));
        abandoned(&a) || abandoned(&b)
    }));

    let credit = io.input_credit();
    // The writer task lives (guarded) until this function returns; dropping `stdin_tx`
    // on the host's eof lets it finish the queued bytes and then close the pipe.
    let (mut stdin_tx, _stdin_task) = match sp.stdin.take() {
        Some(pipe) => {
            let (tx, rx) = mpsc::unbounded_channel();
            let task = TaskGuard(tokio::spawn(stdin_writer(pipe, rx, credit.clone())));
            (Some(tx), Some(task))
        }
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
            st = &mut sp.exit, if status.is_none() => {
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
                Some(Inbound::Control(_)) => {}
                None => inbound_open = false,
            },
        }
    }
    sp.guard.disarm();
    let mut exit: ProcessExit = status.unwrap_or_else(unknown_exit).to_exit();
    exit.timed_out = timed_out;
    exit.output_truncated = drained.unwrap_or(true);
    Ok(Event::Exited(exit))
}

pub(crate) async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
