//! Duplex and background processes of the local sandbox.

use crate::error::LocalSandboxError;
use crate::group::{GroupRegistry, signal_group, signal_name, signal_number};
use crate::sandbox::LocalSubprocessSandbox;
use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::{
    DuplexKillSignal, ProcessHandle, ProcessLogs, ProcessSignal, ProcessStatus,
    SandboxDuplexProcess, SandboxDuplexProcessControl, SandboxDuplexProcessSpec,
    SandboxProcessControl, SandboxProcessExit,
};
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::pin::Pin;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::process::{Child, ChildStdin};
use tokio::sync::watch;

/// How long a duplex kill waits for the exit before escalating (and after `SIGKILL`).
const KILL_WAIT: Duration = Duration::from_secs(2);

type ExitWatch = watch::Receiver<Option<SandboxProcessExit>>;

fn exit_of(status: io::Result<ExitStatus>) -> SandboxProcessExit {
    match status {
        Ok(status) => SandboxProcessExit {
            code: status.code(),
            signal: status.signal().map(signal_name),
            out_of_memory: None,
        },
        Err(_) => SandboxProcessExit::default(),
    }
}

fn pgid_of(child: &Child) -> i32 {
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .unwrap_or(0)
}

async fn wait_exited(mut exit: ExitWatch) -> Result<SandboxProcessExit, PortError> {
    let exited = exit
        .wait_for(Option::is_some)
        .await
        .map_err(|_| PortError::new("the local sandbox stopped watching this process"))?;
    exited
        .clone()
        .ok_or_else(|| PortError::new("the local sandbox stopped watching this process"))
}

/// Stdin whose `shutdown()` closes the pipe, so the child sees EOF (tokio's `ChildStdin`
/// only closes on drop).
struct ClosingStdin {
    inner: Option<ChildStdin>,
}

impl AsyncWrite for ClosingStdin {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_write(cx, buf),
            None => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::BrokenPipe,
                "stdin was closed",
            ))),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(stdin) => Pin::new(stdin).poll_flush(cx),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(stdin) = self.inner.as_mut() {
            ready!(Pin::new(stdin).poll_flush(cx))?;
        }
        self.inner = None;
        Poll::Ready(Ok(()))
    }
}

/// An empty reader for a stream the child did not expose.
struct Empty;

impl AsyncRead for Empty {
    fn poll_read(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        _buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

struct DuplexControl {
    pgid: i32,
    exit: ExitWatch,
}

impl DuplexControl {
    async fn exited_within(&self, limit: Duration) -> bool {
        let mut exit = self.exit.clone();
        tokio::time::timeout(limit, exit.wait_for(Option::is_some))
            .await
            .is_ok()
    }
}

#[async_trait]
impl SandboxDuplexProcessControl for DuplexControl {
    async fn kill(&self, signal: DuplexKillSignal) -> Result<(), PortError> {
        if self.exit.borrow().is_some() {
            return Ok(());
        }
        signal_group(self.pgid, signal_number(signal.into()));
        if self.exited_within(KILL_WAIT).await {
            return Ok(());
        }
        if signal != DuplexKillSignal::Kill {
            signal_group(self.pgid, libc::SIGKILL);
            self.exited_within(KILL_WAIT).await;
        }
        Ok(())
    }
}

/// Reaps `child` in the background and publishes its exit. `before_exit` runs first (log
/// pumps finish before the status turns final).
fn watch_exit<F>(
    mut child: Child,
    pgid: i32,
    groups: Arc<GroupRegistry>,
    before_exit: F,
) -> ExitWatch
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = watch::channel(None);
    tokio::spawn(async move {
        let (status, ()) = tokio::join!(child.wait(), before_exit);
        let _ = sender.send(Some(exit_of(status)));
        groups.leader_exited(pgid);
    });
    receiver
}

pub(crate) fn spawn_duplex(
    sandbox: &LocalSubprocessSandbox,
    spec: SandboxDuplexProcessSpec,
) -> Result<SandboxDuplexProcess, LocalSandboxError> {
    sandbox.groups.check_open()?;
    let mut command = sandbox.command(&spec.command, &spec.command);
    command.args(&spec.args);
    for (name, value) in &spec.env {
        match value {
            Some(value) => {
                command.env(name, sandbox.paths().translate_env_value(value));
            }
            None => {
                command.env_remove(name);
            }
        }
    }
    if let Some(cwd) = &spec.cwd {
        command.current_dir(sandbox.paths().resolve(cwd)?);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| LocalSandboxError::Spawn {
            command: spec.command.clone(),
            source,
        })?;
    let pgid = pgid_of(&child);
    sandbox.groups.register(pgid)?;

    let stdin = ClosingStdin {
        inner: child.stdin.take(),
    };
    let stdout: Box<dyn AsyncRead + Send + Unpin> = match child.stdout.take() {
        Some(stdout) => Box::new(stdout),
        None => Box::new(Empty),
    };
    let stderr: Box<dyn AsyncRead + Send + Unpin> = match child.stderr.take() {
        Some(stderr) => Box::new(stderr),
        None => Box::new(Empty),
    };
    let exit = watch_exit(child, pgid, Arc::clone(&sandbox.groups), async {});
    let control = Arc::new(DuplexControl {
        pgid,
        exit: exit.clone(),
    });
    Ok(SandboxDuplexProcess::new(
        Box::new(stdin),
        stdout,
        stderr,
        control,
        wait_exited(exit),
    ))
}

#[derive(Default)]
struct Logs {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

struct BackgroundControl {
    pgid: i32,
    logs: Arc<Mutex<Logs>>,
    exit: ExitWatch,
}

#[async_trait]
impl SandboxProcessControl for BackgroundControl {
    async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError> {
        if self.exit.borrow().is_none() {
            signal_group(self.pgid, signal_number(signal));
        }
        Ok(())
    }

    async fn logs(&self) -> Result<ProcessLogs, PortError> {
        let logs = self.logs.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(ProcessLogs {
            stdout: String::from_utf8_lossy(&logs.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&logs.stderr).into_owned(),
        })
    }

    async fn status(&self) -> Result<ProcessStatus, PortError> {
        Ok(match &*self.exit.borrow() {
            None => ProcessStatus::Running,
            Some(SandboxProcessExit {
                signal: Some(_), ..
            }) => ProcessStatus::Killed,
            Some(SandboxProcessExit { code: Some(0), .. }) => ProcessStatus::Completed,
            Some(_) => ProcessStatus::Error,
        })
    }
}

async fn pump<R: AsyncRead + Unpin>(
    reader: Option<R>,
    logs: Arc<Mutex<Logs>>,
    select: fn(&mut Logs) -> &mut Vec<u8>,
) {
    let Some(mut reader) = reader else {
        return;
    };
    let mut chunk = vec![0u8; 8192];
    loop {
        match reader.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                let mut logs = logs.lock().unwrap_or_else(PoisonError::into_inner);
                select(&mut logs).extend_from_slice(&chunk[..read]);
            }
        }
    }
}

pub(crate) fn spawn_background(
    sandbox: &LocalSubprocessSandbox,
    command_text: &str,
) -> Result<ProcessHandle, LocalSandboxError> {
    sandbox.groups.check_open()?;
    let mut child = sandbox
        .command("/bin/sh", command_text)
        .arg("-c")
        .arg(command_text)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| LocalSandboxError::Spawn {
            command: command_text.to_owned(),
            source,
        })?;
    let pgid = pgid_of(&child);
    sandbox.groups.register(pgid)?;

    let logs = Arc::new(Mutex::new(Logs::default()));
    let pumps = {
        let stdout = pump(child.stdout.take(), Arc::clone(&logs), |logs| {
            &mut logs.stdout
        });
        let stderr = pump(child.stderr.take(), Arc::clone(&logs), |logs| {
            &mut logs.stderr
        });
        async move {
            tokio::join!(stdout, stderr);
        }
    };
    let exit = watch_exit(child, pgid, Arc::clone(&sandbox.groups), pumps);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis())
        .unwrap_or_default();
    let pid = u32::try_from(pgid).unwrap_or_default();
    Ok(ProcessHandle::new(
        format!("proc_{pid}_{millis}"),
        pid,
        Arc::new(BackgroundControl { pgid, logs, exit }),
    ))
}
