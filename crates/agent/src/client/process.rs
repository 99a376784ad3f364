//! Processes from the host's point of view: exec (collected output), duplex processes
//! (streamed stdin/stdout/stderr), background processes (agent-kept logs and status).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::Duration;

use tokio::sync::mpsc;

use super::stream::{DataReader, DataWriter, StreamGuard};
use super::{AgentClient, ClientError, Opened};
use crate::frame::{Frame, FrameKind, channel};
use crate::message::{
    BackgroundInfo, BackgroundLogs, BackgroundStarted, BackgroundStatus, CommandSpec, ErrorKind,
    Event, ProcessExit, PtySize, Request, SpawnSpec, StreamControl,
};

/// The hello feature that says the agent runs processes in terminals.
const PTY_FEATURE: &str = "pty";

/// The most output [`AgentClient::exec`] keeps by default: stdout and stderr together.
/// Whatever the process writes beyond it is read and dropped (the process never blocks on
/// a full pipe) and the result says [`ExecOutput::truncated`].
pub const DEFAULT_MAX_EXEC_OUTPUT: usize = 16 * 1024 * 1024;

/// What to run, and how.
#[derive(Debug, Clone)]
pub struct ExecRequest {
    spec: SpawnSpec,
    /// Host-side only: the output cap of [`AgentClient::exec`].
    max_output: usize,
}

impl ExecRequest {
    /// `/bin/sh -c <script>`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::from_command(CommandSpec::Shell {
            script: script.into(),
        })
    }

    /// A program (looked up on PATH when it has no `/`) with no arguments yet.
    pub fn program(program: impl Into<String>) -> Self {
        Self::from_command(CommandSpec::Argv {
            argv: vec![program.into()],
        })
    }

    /// A full argv, program first.
    pub fn argv<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::from_command(CommandSpec::Argv {
            argv: argv.into_iter().map(Into::into).collect(),
        })
    }

    fn from_command(command: CommandSpec) -> Self {
        Self {
            spec: SpawnSpec {
                command,
                env: BTreeMap::new(),
                cwd: None,
                user: None,
                stdin: false,
                timeout_ms: None,
                pty: None,
            },
            max_output: DEFAULT_MAX_EXEC_OUTPUT,
        }
    }

    /// Caps what [`AgentClient::exec`] keeps of stdout and stderr together (default
    /// [`DEFAULT_MAX_EXEC_OUTPUT`]); duplex and background processes ignore it.
    #[must_use]
    pub fn max_output(mut self, bytes: usize) -> Self {
        self.max_output = bytes;
        self
    }

    /// Appends arguments (argv commands only; ignored for shell scripts).
    #[must_use]
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        if let CommandSpec::Argv { argv } = &mut self.spec.command {
            argv.extend(args.into_iter().map(Into::into));
        }
        self
    }

    /// Sets a variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.spec.env.insert(key.into(), Some(value.into()));
        self
    }

    /// Removes a variable from the process's environment.
    #[must_use]
    pub fn env_remove(mut self, key: impl Into<String>) -> Self {
        self.spec.env.insert(key.into(), None);
        self
    }

    /// Applies a map where `None` removes (the duplex spec's `undefined`).
    #[must_use]
    pub fn envs(mut self, vars: BTreeMap<String, Option<String>>) -> Self {
        self.spec.env.extend(vars);
        self
    }

    /// Working directory.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.spec.cwd = Some(cwd.into());
        self
    }

    /// Runs as the account `name` of the sandbox's `/etc/passwd` (`root` always works):
    /// its uid and gid, `HOME`, `USER` and `LOGNAME` (unless set here), and its home as
    /// the cwd when none is given. An unknown name fails with [`ErrorKind::NotFound`].
    #[must_use]
    pub fn user(mut self, name: impl Into<String>) -> Self {
        self.spec.user = Some(name.into());
        self
    }

    /// Kill the process group after this long; the exit reports `timed_out`.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.spec.timeout_ms = Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// Runs the process in a new pseudo-terminal of `cols` x `rows` (see
    /// [`SpawnSpec::pty`]): everything it shows arrives on stdout, stderr stays empty,
    /// stdin is typed into the terminal, and closing stdin sends nothing (write `\x04`
    /// for an end of file). Each dimension must be 1..=1000; the agent refuses others.
    #[must_use]
    pub fn pty(mut self, cols: u16, rows: u16) -> Self {
        self.spec.pty = Some(PtySize { cols, rows });
        self
    }

    /// The wire spec.
    pub fn spec(&self) -> &SpawnSpec {
        &self.spec
    }
}

impl From<&str> for ExecRequest {
    fn from(script: &str) -> Self {
        Self::shell(script)
    }
}

impl From<String> for ExecRequest {
    fn from(script: String) -> Self {
        Self::shell(script)
    }
}

/// Result of [`AgentClient::exec`].
#[derive(Debug, Clone)]
pub struct ExecOutput {
    /// Everything the process wrote to stdout.
    pub stdout: Vec<u8>,
    /// Everything the process wrote to stderr.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub exit: ProcessExit,
    /// The process wrote more than the request's output cap; `stdout` and `stderr` hold
    /// what arrived first within it, the rest was dropped.
    pub truncated: bool,
}

impl ExecOutput {
    /// The contract's combined output: stdout, then `"\n" + stderr` if stderr is
    /// non-empty, trailing whitespace trimmed (lossy UTF-8).
    pub fn combined(&self) -> String {
        let mut s = String::from_utf8_lossy(&self.stdout).into_owned();
        if !self.stderr.is_empty() {
            s.push('\n');
            s.push_str(&String::from_utf8_lossy(&self.stderr));
        }
        s.truncate(s.trim_end().len());
        s
    }

    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.exit.success()
    }
}

/// Signals a duplex process from anywhere (clonable, usable while another task waits).
#[derive(Debug, Clone)]
pub struct ProcessKiller {
    client: AgentClient,
    id: u32,
    _guard: Arc<StreamGuard>,
}

impl ProcessKiller {
    /// Signals the process group (e.g. `"SIGTERM"`, `"SIGKILL"`). Idempotent: after the
    /// process ended this does nothing and succeeds.
    pub fn kill(&self, signal: &str) -> Result<(), ClientError> {
        if crate::sys::signal_number(signal).is_none() {
            return Err(ClientError::UnknownSignal(signal.to_owned()));
        }
        let _ = self.client.shared().out.send(Frame::json(
            self.id,
            FrameKind::Control,
            &StreamControl::Signal {
                signal: signal.to_owned(),
            },
        ));
        Ok(())
    }

    /// Resizes the process's terminal (the process gets SIGWINCH). Each dimension must be
    /// 1..=1000. The agent ignores a resize of a process started without
    /// [`ExecRequest::pty`], and one after the process ended.
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        let size = PtySize { cols, rows };
        if !size.is_valid() {
            return Err(ClientError::InvalidPtySize { cols, rows });
        }
        self.client.require(PTY_FEATURE)?;
        let _ = self.client.shared().out.send(Frame::json(
            self.id,
            FrameKind::Control,
            &StreamControl::Resize { cols, rows },
        ));
        Ok(())
    }
}

/// A process with streamed stdio. Take the fields you need; a dropped stdout/stderr is
/// discarded (without stalling the process); a dropped stdin is closed (EOF).
/// Dropping every part of an unfinished process kills its process group.
///
/// stdout and stderr are separate pipes: their relative order is not recoverable. In a
/// terminal ([`ExecRequest::pty`]) everything the process shows comes on stdout in order,
/// stderr only ends, and closing stdin leaves the process running (write `\x04` instead).
#[derive(Debug)]
pub struct DuplexProcess {
    /// Process stdin (present when spawned with [`AgentClient::spawn`]).
    pub stdin: Option<DataWriter>,
    /// Process stdout.
    pub stdout: Option<DataReader>,
    /// Process stderr.
    pub stderr: Option<DataReader>,
    pid: u32,
    client: AgentClient,
    events: mpsc::UnboundedReceiver<Event>,
    exit: Option<ProcessExit>,
    killer: ProcessKiller,
}

impl DuplexProcess {
    /// Pid inside the sandbox (informational).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// A handle that can signal the process while another task waits on it.
    pub fn killer(&self) -> ProcessKiller {
        self.killer.clone()
    }

    /// See [`ProcessKiller::kill`].
    pub fn kill(&self, signal: &str) -> Result<(), ClientError> {
        self.killer.kill(signal)
    }

    /// See [`ProcessKiller::resize`].
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), ClientError> {
        self.killer.resize(cols, rows)
    }

    /// Waits for the exit, which the agent reports only after stdout and stderr both
    /// reached eof. Like `std::process::Child::wait`, a stdin still held here is closed
    /// first. Keep reading (or drop) stdout/stderr meanwhile: an unread channel fills its
    /// window and then the process blocks writing, like a pipe.
    pub async fn wait(&mut self) -> Result<ProcessExit, ClientError> {
        if let Some(e) = &self.exit {
            return Ok(e.clone());
        }
        drop(self.stdin.take());
        loop {
            match self.client.next_event(&mut self.events).await? {
                Event::Exited(e) => {
                    self.exit = Some(e.clone());
                    return Ok(e);
                }
                Event::Error(e) => return Err(ClientError::Remote(e)),
                Event::Started { .. } => {}
                other => return Err(ClientError::UnexpectedReply(format!("{other:?}"))),
            }
        }
    }
}

impl AgentClient {
    async fn start(&self, mut req: ExecRequest, stdin: bool) -> Result<DuplexProcess, ClientError> {
        req.spec.stdin = stdin;
        if req.spec.pty.is_some() {
            // An agent without terminals would ignore the field and run the process
            // without one.
            self.require(PTY_FEATURE)?;
        }
        let Opened {
            id,
            mut events,
            stdout,
            stderr,
            recv,
            input,
            state,
            guard,
        } = self.open(&Request::Spawn(req.spec))?;
        let pid = match self.next_event(&mut events).await? {
            Event::Started { pid } => pid,
            Event::Error(e) => return Err(ClientError::Remote(e)),
            other => return Err(ClientError::UnexpectedReply(format!("{other:?}"))),
        };
        let reader = |ch: u8, rx| {
            DataReader::new(
                self.clone(),
                id,
                ch,
                rx,
                recv[usize::from(ch)].clone(),
                state.clone(),
                guard.clone(),
            )
        };
        Ok(DuplexProcess {
            stdin: stdin.then(|| DataWriter::new(self.clone(), id, input.clone(), guard.clone())),
            stdout: Some(reader(channel::STDOUT, stdout)),
            stderr: Some(reader(channel::STDERR, stderr)),
            pid,
            client: self.clone(),
            events,
            exit: None,
            killer: ProcessKiller {
                client: self.clone(),
                id,
                _guard: guard.clone(),
            },
        })
    }

    /// Starts a duplex process: stdin is a pipe fed by the returned writer.
    pub async fn spawn(&self, req: impl Into<ExecRequest>) -> Result<DuplexProcess, ClientError> {
        self.start(req.into(), true).await
    }

    /// Runs a command to completion with stdin at `/dev/null` and collects its output, at
    /// most the request's `max_output` bytes of it (see [`ExecOutput::truncated`]).
    ///
    /// A program that cannot be started is reported the way a shell would: exit code
    /// 127 (not found) or 126 (anything else) with the reason on stderr.
    pub async fn exec(&self, req: impl Into<ExecRequest>) -> Result<ExecOutput, ClientError> {
        let req = req.into();
        let budget = AtomicUsize::new(req.max_output);
        let mut p = match self.start(req, false).await {
            Ok(p) => p,
            Err(ClientError::Remote(e)) if e.kind == ErrorKind::SpawnFailed => {
                let code = if e.errno == Some(libc::ENOENT) {
                    127
                } else {
                    126
                };
                return Ok(ExecOutput {
                    stdout: Vec::new(),
                    stderr: e.message.into_bytes(),
                    exit: ProcessExit {
                        code: Some(code),
                        ..ProcessExit::default()
                    },
                    truncated: false,
                });
            }
            Err(e) => return Err(e),
        };
        let (mut out, mut err) = match (p.stdout.take(), p.stderr.take()) {
            (Some(o), Some(e)) => (o, e),
            _ => {
                return Err(ClientError::UnexpectedReply(
                    "process without output streams".into(),
                ));
            }
        };
        let ((stdout, out_cut), (stderr, err_cut)) =
            tokio::try_join!(out.read_capped(&budget), err.read_capped(&budget))?;
        let exit = p.wait().await?;
        Ok(ExecOutput {
            stdout,
            stderr,
            exit,
            truncated: out_cut || err_cut,
        })
    }

    /// Starts a background process the agent keeps running (and keeps logs of).
    pub async fn start_background(
        &self,
        req: impl Into<ExecRequest>,
    ) -> Result<BackgroundProcess, ClientError> {
        let started: BackgroundStarted = self
            .call(&Request::StartBackground(req.into().spec))
            .await?;
        Ok(BackgroundProcess {
            client: self.clone(),
            id: started.id,
            pid: started.pid,
        })
    }

    /// A handle for a background process by its id.
    pub fn background(&self, id: impl Into<String>, pid: u32) -> BackgroundProcess {
        BackgroundProcess {
            client: self.clone(),
            id: id.into(),
            pid,
        }
    }
}

/// A background process, addressed by its agent-issued id.
#[derive(Debug, Clone)]
pub struct BackgroundProcess {
    client: AgentClient,
    id: String,
    pid: u32,
}

impl BackgroundProcess {
    /// Agent-issued id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Pid (informational).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Signals the process group; idempotent after exit.
    pub async fn kill(&self, signal: &str) -> Result<(), ClientError> {
        self.client
            .call(&Request::BackgroundKill {
                id: self.id.clone(),
                signal: signal.to_owned(),
            })
            .await
    }

    /// Output retained so far (bounded tail of each stream).
    pub async fn logs(&self) -> Result<BackgroundLogs, ClientError> {
        self.client
            .call(&Request::BackgroundLogs {
                id: self.id.clone(),
            })
            .await
    }

    /// Status with exit details.
    pub async fn info(&self) -> Result<BackgroundInfo, ClientError> {
        self.client
            .call(&Request::BackgroundStatus {
                id: self.id.clone(),
            })
            .await
    }

    /// `running` | `completed` | `error` | `killed`.
    pub async fn status(&self) -> Result<BackgroundStatus, ClientError> {
        Ok(self.info().await?.status)
    }
}
