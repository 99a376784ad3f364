//! `omabox sandbox run --backend linux`: the one-shot path. No async runtime, no agent:
//! the sandbox's PID 1 is a fork of this (single-threaded) process, made first thing so its
//! start-up overlaps our working out of the plan, that builds the sandbox and starts the
//! command with our pipes as its stdio ([`LinuxRuntime::start_forked`]); this loop relays stdio and signals with `poll`
//! until the command's exit is reported and its output drained, then destroys the
//! sandbox. The behaviour is the module doc's of `sandbox.rs`, point by point: output
//! copied as it arrives, stdin until EOF (not waited for once the command ended),
//! SIGINT/SIGTERM/SIGHUP forwarded as SIGTERM to the command's process group
//! (SIGKILL two seconds later if it is still running, or at once for a second signal),
//! a closed stdout or stderr of ours treated like a signal, and the same exit codes.
//!
//! [`LinuxRuntime::start_forked`]: omabox_backend_linux::LinuxRuntime::start_forked

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use omabox_backend_linux::StartError;
use omabox_backend_linux::factory::LinuxSandboxFactory;
use omabox_backend_linux::leftovers::OWNER_HEARTBEAT;
use omabox_backend_linux::oneshot::{OneShotCommand, OneShotEvent, OneShotFork, OneShotSandbox};
use omabox_contract::signals::{shell_exit_code, signal_name};
use omabox_sandbox::SandboxFactoryContext;

use super::{
    CHUNK, DRAIN_WAIT, EXIT_NOT_STARTED, EXIT_OMABOX_FAILED, Failure, NOT_ROOT_HINT, RunArgs,
    linux_failure, prepare_linux, report,
};
use crate::terminal_safe::ControlFilter;

/// After the command's exit, output that stays silent this long is abandoned (the
/// agent's drain rule: a background process may hold the pipes open).
const DRAIN_IDLE: Duration = Duration::from_secs(1);
/// How long a SIGTERM may go unheeded before SIGKILL follows.
const KILL_WAIT: Duration = Duration::from_secs(2);
/// How long the sandbox may take to become ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// `omabox: CMD: killed: out of memory (limit N MiB)` when the command itself was killed
/// (exit 137), else that one of its processes was.
fn report_out_of_memory(args: &RunArgs, code: u8, oom: omabox_sandbox::OutOfMemory) {
    let program = crate::terminal_safe::one_line(args.command.first().map_or("", String::as_str));
    if code == 128 + libc::SIGKILL as u8 {
        errln!("omabox: {program}: {oom}");
    } else {
        errln!("omabox: a process in the sandbox was {oom}");
    }
}

/// Runs `omabox sandbox run` for the linux backend.
pub(super) fn run(args: &RunArgs, config: &omabox_node::NodeConfig) -> ExitCode {
    // Caught from here on (as a signalfd): a Ctrl-C can no longer kill omabox before
    // it has destroyed what it made.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            return report(&Failure::omabox(format!(
                "cannot install signal handlers: {e}"
            )));
        }
    };
    stdio_open();
    // The sandbox's PID 1 is forked first: it makes its network namespace while this
    // process works out the plan. A failed fork is reported only where the start would
    // have failed, after the plan's own errors.
    let fork = OneShotFork::fork(&config.linux_runtime_dir());
    // Logging from here on (PID 1 never logs: its stderr is /dev/null): set up while PID 1
    // makes its namespaces, not before its fork.
    crate::init_tracing(Some(config));
    // The image is prepared (pulled, unpacked) and held by `linux` until the start returned.
    let (linux, workspace) = match prepare_linux(args, config) {
        Ok(p) => p,
        Err(f) => return report(&f),
    };
    let ctx = SandboxFactoryContext {
        session_id: format!("omabox-run-{}", std::process::id()),
        workdir: workspace.workdir(),
        memory_root: None,
        outputs_root: None,
    };
    let (runtime, plan) = match LinuxSandboxFactory::new().prepare_one_shot(&ctx, &linux) {
        Ok(p) => p,
        Err(e) => {
            let _ = workspace.finish();
            return report(&linux_failure(&e));
        }
    };
    let command = OneShotCommand {
        argv: args.command.clone(),
        env: args.env.clone(),
    };
    let mut workspace = Some(workspace);
    let mut removed = Ok(());
    let started = fork.and_then(|fork| runtime.start_forked(fork, &plan, &command));
    // Started (its roots recorded) or failed: the image may be removed from here on.
    drop(linux);
    let outcome = match started {
        Ok(mut sandbox) => {
            let (outcome, empty) = Relay::new(&mut sandbox, args).run(&mut sandbox, &signals);
            // A failure the memory limit caused is named (read before the cgroup goes;
            // a successful run pays nothing for it).
            if let Ok(code) = outcome
                && code != 0
                && let Some(oom) = sandbox.out_of_memory()
            {
                let oom = omabox_sandbox::OutOfMemory {
                    limit_bytes: oom.limit_bytes,
                };
                report_out_of_memory(args, code, oom);
            }
            if empty && let Some(w) = workspace.take() {
                // No process of the sandbox is left to write to the workspace: it goes
                // while the sandbox's PID 1 finishes exiting, not after.
                removed = w.finish();
            }
            // This process exits next: PID 1 may finish exiting after it.
            let teardown = sandbox.destroy_before_exit();
            match (outcome, teardown) {
                (outcome, Ok(())) => outcome,
                (Err(f), Err(_)) => Err(f),
                (Ok(_), Err(e)) => Err(Failure::omabox(format!(
                    "destroying the sandbox failed: {}",
                    chain(&e)
                ))),
            }
        }
        Err(e) => Err(start_failure(&e)),
    };
    if let Some(w) = workspace {
        removed = w.finish();
    }
    let code = match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => return report(&f),
    };
    if let Err(e) = removed {
        return report(&Failure::omabox(e));
    }
    code
}

fn start_failure(e: &StartError) -> Failure {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        Failure::omabox(format!("could not create the sandbox: {}", chain(e)))
    } else {
        Failure::omabox(format!(
            "could not create the sandbox: {}\n{NOT_ROOT_HINT}",
            chain(e)
        ))
    }
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut next = error.source();
    while let Some(e) = next {
        message.push_str(": ");
        message.push_str(&e.to_string());
        next = e.source();
    }
    message
}

/// Opens `/dev/null` (read-only: writes fail as on a closed fd) on any of fds 0–2 that
/// is not open, so no pipe of ours is ever mistaken for our stdio.
fn stdio_open() {
    for fd in 0..3 {
        // SAFETY: F_GETFD on an integer fd has no memory effects.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            // SAFETY: opens a file on the lowest free fd, which is `fd`; it stays open
            // for the life of the process.
            unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
        }
    }
}

/// SIGINT, SIGTERM and SIGHUP, blocked and read from a signalfd.
struct Signals {
    fd: OwnedFd,
}

impl Signals {
    fn block() -> std::io::Result<Self> {
        // SAFETY: sigset_t is plain data initialized by sigemptyset; sigprocmask and
        // signalfd take valid pointers to it.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Self {
                fd: OwnedFd::from_raw_fd(fd),
            })
        }
    }

    /// How many signals were pending (consumed).
    fn take(&self) -> u32 {
        let mut info = [0u8; 128];
        let mut n = 0;
        while read_fd(self.fd.as_fd(), &mut info).is_ok_and(|r| r > 0) {
            n += 1;
        }
        n
    }
}

/// The relay's state.
struct Relay {
    program: String,
    /// Our stdin, until EOF (or the command's stdin closed, or it exited).
    stdin_open: bool,
    to_command: Option<OwnedFd>,
    stdin_buf: Vec<u8>,
    stdin_at: usize,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    /// What the command's stdout or stderr gave last (up to [`CHUNK`] bytes, reused).
    output: Vec<u8>,
    /// Whether our stdout / stderr still take bytes.
    ours_open: [bool; 2],
    /// For ours that are terminals: what the command writes reaches them only as text.
    filters: [Option<ControlFilter>; 2],
    ready: bool,
    exit: Option<u8>,
    kills: u32,
    escalate_at: Option<Instant>,
    started: Instant,
    exited_at: Option<Instant>,
    last_output: Instant,
    /// When the owner record was last refreshed (this process has no heartbeat thread).
    heartbeat_at: Instant,
    /// The sandbox said no process of it is left ([`OneShotEvent::Empty`]).
    empty: bool,
}

impl Relay {
    fn new(sandbox: &mut OneShotSandbox, args: &RunArgs) -> Self {
        let to_command = sandbox.take_stdin();
        if let Some(fd) = &to_command {
            set_nonblocking(fd.as_fd());
        }
        Self {
            program: args.command.first().cloned().unwrap_or_default(),
            stdin_open: true,
            to_command,
            stdin_buf: Vec::new(),
            stdin_at: 0,
            stdout: sandbox.take_stdout(),
            stderr: sandbox.take_stderr(),
            output: Vec::with_capacity(CHUNK),
            ours_open: [true, true],
            filters: [
                ControlFilter::for_terminal(1),
                ControlFilter::for_terminal(2),
            ],
            ready: false,
            exit: None,
            kills: 0,
            escalate_at: None,
            started: Instant::now(),
            exited_at: None,
            last_output: Instant::now(),
            heartbeat_at: Instant::now(),
            empty: false,
        }
    }

    /// Until the command's exit is reported and its output drained: the exit code, and
    /// whether the sandbox said no process of it is left.
    fn run(
        mut self,
        sandbox: &mut OneShotSandbox,
        signals: &Signals,
    ) -> (Result<u8, Failure>, bool) {
        let outcome = self.relay(sandbox, signals);
        (outcome, self.empty)
    }

    fn relay(&mut self, sandbox: &mut OneShotSandbox, signals: &Signals) -> Result<u8, Failure> {
        loop {
            if let Some(code) = self.finished() {
                return Ok(code);
            }
            let now = Instant::now();
            if !self.ready && now.duration_since(self.started) > READY_TIMEOUT {
                return Err(start_failure(&StartError::Timeout(READY_TIMEOUT)));
            }
            if now.duration_since(self.heartbeat_at) >= OWNER_HEARTBEAT {
                self.heartbeat_at = now;
                let _ = sandbox.heartbeat();
            }
            if self.exit.is_none() && self.escalate_at.is_some_and(|t| now >= t) {
                self.escalate_at = None;
                let _ = sandbox.kill(true);
            }
            // The poll set, rebuilt each round: [status, signals, stdout, stderr,
            // our stdin or the command's stdin].
            let mut fds = vec![
                pollfd(Some(sandbox.status_fd().as_raw_fd()), libc::POLLIN),
                pollfd(Some(signals.fd.as_raw_fd()), libc::POLLIN),
                pollfd(self.stdout.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
                pollfd(self.stderr.as_ref().map(|f| f.as_raw_fd()), libc::POLLIN),
            ];
            if sandbox.status_closed() {
                fds[0].fd = -1;
            }
            let feeding = self.exit.is_none() && self.to_command.is_some();
            if feeding && self.stdin_at < self.stdin_buf.len() {
                let fd = self.to_command.as_ref().map(|f| f.as_raw_fd());
                fds.push(pollfd(fd, libc::POLLOUT));
            } else if feeding && self.stdin_open {
                fds.push(pollfd(Some(0), libc::POLLIN));
            }
            // SAFETY: `fds` is a valid array of pollfds of its length.
            let n = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    self.timeout_ms(),
                )
            };
            if n < 0 {
                continue; // EINTR
            }
            if fds[1].revents != 0 && signals.take() > 0 {
                self.request_kill(sandbox);
            }
            if fds[0].revents != 0 {
                self.status(sandbox)?;
            }
            for (i, slot) in [(0usize, 2usize), (1, 3)] {
                if fds[slot].revents != 0 {
                    self.output(i, sandbox);
                }
            }
            if let Some(p) = fds.get(4)
                && p.revents != 0
            {
                if p.events == libc::POLLOUT {
                    self.write_stdin();
                } else {
                    self.read_stdin();
                }
            }
        }
    }

    /// The exit code once the exit is known and the output drained (or abandoned).
    fn finished(&self) -> Option<u8> {
        let code = self.exit?;
        let exited = self.exited_at?;
        let drained = self.stdout.is_none() && self.stderr.is_none();
        let now = Instant::now();
        let abandoned = now.duration_since(self.last_output.max(exited)) >= DRAIN_IDLE
            || now.duration_since(exited) >= DRAIN_WAIT;
        (drained || abandoned).then_some(code)
    }

    fn timeout_ms(&self) -> i32 {
        let now = Instant::now();
        let mut next = self.heartbeat_at + OWNER_HEARTBEAT;
        if !self.ready {
            next = next.min(self.started + READY_TIMEOUT);
        }
        if let Some(t) = self.escalate_at {
            next = next.min(t);
        }
        if let Some(exited) = self.exited_at {
            next = next.min(self.last_output.max(exited) + DRAIN_IDLE);
        }
        next.saturating_duration_since(now)
            .as_millis()
            .min(i32::MAX as u128) as i32
            + 1
    }

    fn status(&mut self, sandbox: &mut OneShotSandbox) -> Result<(), Failure> {
        let events = sandbox.read_events().map_err(|e| start_failure(&e))?;
        for event in events {
            match event {
                OneShotEvent::Ready(_) => self.ready = true,
                OneShotEvent::Exited(code) => self.exited(shell_exit_code(Some(code), None)),
                OneShotEvent::Signaled(n) => {
                    self.exited(shell_exit_code(None, Some(signal_name(n).unwrap_or("?"))))
                }
                OneShotEvent::NotStarted(message) => {
                    errln!("omabox: cannot run {:?}: {message}", self.program);
                    self.exited(Some(EXIT_NOT_STARTED));
                }
                OneShotEvent::Interrupted => self.exited(Some(128 + libc::SIGINT as u8)),
                OneShotEvent::Empty => self.empty = true,
            }
        }
        if sandbox.status_closed() && self.exit.is_none() {
            if !self.ready {
                return Err(start_failure(&sandbox.died()));
            }
            return Err(Failure::omabox(
                "lost track of the command: the sandbox's init exited",
            ));
        }
        Ok(())
    }

    fn exited(&mut self, code: Option<u8>) {
        self.exit = Some(code.unwrap_or(EXIT_OMABOX_FAILED));
        self.exited_at = Some(Instant::now());
        // The command's stdin is not fed any more (nor is ours waited for).
        self.to_command = None;
    }

    /// A signal (or our stdout gone): SIGTERM first, SIGKILL for the next or after
    /// `KILL_WAIT`.
    fn request_kill(&mut self, sandbox: &OneShotSandbox) {
        if self.exit.is_some() {
            return;
        }
        self.kills += 1;
        if self.kills == 1 {
            self.escalate_at = Some(Instant::now() + KILL_WAIT);
            let _ = sandbox.kill(false);
        } else {
            self.escalate_at = None;
            let _ = sandbox.kill(true);
        }
    }

    /// Copies what stream `i` (0 stdout, 1 stderr) holds to ours.
    fn output(&mut self, i: usize, sandbox: &OneShotSandbox) {
        let slot = if i == 0 {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        let Some(fd) = slot else { return };
        match read_into(fd.as_fd(), &mut self.output) {
            Ok(0) => *slot = None,
            Ok(_) => {
                self.last_output = Instant::now();
                let mut filtered = Vec::new();
                let bytes = match &mut self.filters[i] {
                    Some(f) => {
                        f.filter(&self.output, &mut filtered);
                        &filtered[..]
                    }
                    None => &self.output[..],
                };
                if self.ours_open[i] && write_all(i as RawFd + 1, bytes).is_err() {
                    // Ours is gone (a closed pipe): stop the command, as SIGPIPE would.
                    self.ours_open[i] = false;
                    self.request_kill(sandbox);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => *slot = None,
        }
    }

    fn read_stdin(&mut self) {
        let mut buf = Vec::with_capacity(CHUNK);
        // SAFETY: fd 0 is open (see `stdio_open`); borrowed for this read only.
        match read_into(unsafe { BorrowedFd::borrow_raw(0) }, &mut buf) {
            Ok(0) => {
                self.stdin_open = false;
                // EOF: close the command's stdin.
                self.to_command = None;
            }
            Ok(_) => {
                self.stdin_buf = buf;
                self.stdin_at = 0;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // A closed or unreadable stdin is EOF.
            Err(_) => {
                self.stdin_open = false;
                self.to_command = None;
            }
        }
    }

    fn write_stdin(&mut self) {
        let Some(fd) = &self.to_command else { return };
        let rest = &self.stdin_buf[self.stdin_at..];
        // SAFETY: `rest` is a valid buffer of its length.
        let n = unsafe { libc::write(fd.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        if n >= 0 {
            self.stdin_at += n as usize;
            return;
        }
        let e = std::io::Error::last_os_error();
        if !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
        ) {
            // The command closed its stdin; what is left of ours is not wanted.
            self.to_command = None;
            self.stdin_open = false;
        }
    }
}

fn pollfd(fd: Option<RawFd>, events: libc::c_short) -> libc::pollfd {
    libc::pollfd {
        fd: fd.unwrap_or(-1),
        events,
        revents: 0,
    }
}

fn set_nonblocking(fd: BorrowedFd<'_>) {
    // SAFETY: F_GETFL/F_SETFL on an fd we own (the command's stdin pipe).
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
    }
}

fn read_fd(fd: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<usize> {
    // SAFETY: `buf` is valid, writable memory of its length.
    unsafe { read_raw(fd, buf.as_mut_ptr(), buf.len()) }
}

/// Reads into `buf`'s capacity (emptied first) without zeroing it first: only the pages
/// the kernel writes are touched (a zeroed 64 KiB buffer per read was a memset of 16
/// pages; a whole `omabox sandbox run -- true` went from 379 to 367 page faults).
fn read_into(fd: BorrowedFd<'_>, buf: &mut Vec<u8>) -> std::io::Result<usize> {
    buf.clear();
    let spare = buf.spare_capacity_mut();
    // SAFETY: the spare capacity is valid, writable memory of its length.
    let n = unsafe { read_raw(fd, spare.as_mut_ptr().cast(), spare.len()) }?;
    // SAFETY: read(2) initialized the first `n` (≤ capacity) bytes.
    unsafe { buf.set_len(n) };
    Ok(n)
}

/// read(2), retried on EINTR.
///
/// # Safety
/// `at` must be valid, writable memory of `len` bytes.
unsafe fn read_raw(fd: BorrowedFd<'_>, at: *mut u8, len: usize) -> std::io::Result<usize> {
    loop {
        // SAFETY: the caller's guarantee.
        let n = unsafe { libc::read(fd.as_raw_fd(), at.cast(), len) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Writes all of `bytes` to our fd (1 or 2), waiting while it is full if it happens to
/// be non-blocking.
fn write_all(fd: RawFd, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of its length.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n >= 0 {
            bytes = &bytes[n as usize..];
            continue;
        }
        let e = std::io::Error::last_os_error();
        match e.kind() {
            std::io::ErrorKind::Interrupted => {}
            std::io::ErrorKind::WouldBlock => {
                let mut p = pollfd(Some(fd), libc::POLLOUT);
                // SAFETY: one valid pollfd.
                unsafe { libc::poll(&mut p, 1, -1) };
            }
            _ => return Err(e),
        }
    }
    Ok(())
}
