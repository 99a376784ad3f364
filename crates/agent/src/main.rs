//! `omabox-agent`: the sandbox's init.
//!
//! Serves the agent protocol on an inherited descriptor (`--fd N`, or `OMABOX_AGENT_FD`)
//! or on stdin/stdout (`--stdio`). Reaps every child (as PID 1, or as a child subreaper
//! when started as an ordinary process), forwards SIGTERM/SIGINT to the process groups it
//! started, and when the connection ends kills all of them and exits: a sandbox dies with
//! its host connection. It is non-dumpable from its start, so no process it starts can open
//! its connection through `/proc/<pid>/fd`.

use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use omabox_agent::agent::{Agent, AgentConfig, AgentError, ReapMode};
use omabox_agent::sys;
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: omabox-agent (--fd N | --stdio) [--workdir DIR] [--grace-ms MS]\n\
                     Serves the omabox agent protocol on fd N (or OMABOX_AGENT_FD) or stdin/stdout.";

enum Transport {
    Fd(RawFd),
    Stdio,
}

struct Options {
    transport: Transport,
    workdir: Option<PathBuf>,
    grace: Duration,
}

fn parse() -> Result<Options, String> {
    let mut transport = std::env::var("OMABOX_AGENT_FD")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Transport::Fd);
    let mut workdir = None;
    let mut grace = Duration::from_secs(5);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--fd" => {
                let v = args.next().ok_or("--fd needs a number")?;
                transport = Some(Transport::Fd(
                    v.parse().map_err(|_| format!("bad fd {v:?}"))?,
                ));
            }
            "--stdio" => transport = Some(Transport::Stdio),
            "--workdir" => {
                workdir = Some(PathBuf::from(args.next().ok_or("--workdir needs a path")?))
            }
            "--grace-ms" => {
                let v = args.next().ok_or("--grace-ms needs a number")?;
                grace =
                    Duration::from_millis(v.parse().map_err(|_| format!("bad --grace-ms {v:?}"))?);
            }
            "--version" => {
                println!("{}", omabox_agent::SOFTWARE);
                std::process::exit(0);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Options {
        transport: transport.ok_or("no transport: pass --fd N or --stdio")?,
        workdir,
        grace,
    })
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("omabox-agent: {e}\n{USAGE}");
            return ExitCode::from(64);
        }
    };
    // Before anything is served: no process we start may reach our connection's fds.
    if let Err(e) = sys::set_non_dumpable() {
        eprintln!("omabox-agent: cannot make itself non-dumpable: {e}");
        return ExitCode::from(1);
    }
    if sys::getpid() != 1 {
        // Not init: adopt orphaned descendants anyway, so nothing escapes reaping.
        if let Err(e) = sys::set_child_subreaper() {
            eprintln!("omabox-agent: cannot become a child subreaper: {e}");
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("omabox-agent: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(run(opts));
    // A blocking stdin read (stdio transport) must not hold the exit hostage.
    rt.shutdown_timeout(Duration::from_millis(200));
    code
}

async fn run(opts: Options) -> ExitCode {
    let mut config = AgentConfig {
        reap: ReapMode::AllChildren,
        ..AgentConfig::default()
    };
    if let Some(w) = opts.workdir {
        config.workdir = w;
    }
    let agent = match Agent::new(config) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("omabox-agent: {e}: {}", source_text(&e));
            return ExitCode::from(1);
        }
    };
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("omabox-agent: cannot install signal handlers: {e}");
            return ExitCode::from(1);
        }
    };
    let serve = async {
        match opts.transport {
            Transport::Fd(fd) => {
                // An inherited fd is not close-on-exec; without this every process we
                // start would hold the connection open after we die.
                sys::set_cloexec(fd).map_err(AgentError::Setup)?;
                // SAFETY: the fd was handed to us at exec for exactly this purpose and
                // nothing else in this process owns or closes it.
                let std_stream = unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) };
                std_stream
                    .set_nonblocking(true)
                    .map_err(AgentError::Setup)?;
                let stream =
                    tokio::net::UnixStream::from_std(std_stream).map_err(AgentError::Setup)?;
                agent.serve(stream).await
            }
            Transport::Stdio => {
                agent
                    .serve(tokio::io::join(tokio::io::stdin(), tokio::io::stdout()))
                    .await
            }
        }
    };
    tokio::pin!(serve);
    let mut grace_deadline: Option<tokio::time::Instant> = None;
    let result = loop {
        tokio::select! {
            r = &mut serve => break r,
            _ = term.recv() => {
                agent.signal_all(libc::SIGTERM);
                grace_deadline.get_or_insert(tokio::time::Instant::now() + opts.grace);
            }
            _ = int.recv() => {
                agent.signal_all(libc::SIGINT);
                grace_deadline.get_or_insert(tokio::time::Instant::now() + opts.grace);
            }
            () = sleep_until(grace_deadline) => break Ok(()),
        }
    };
    agent.kill_all();
    sys::kill_all_in_namespace();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("omabox-agent: {e}: {}", source_text(&e));
            ExitCode::from(2)
        }
    }
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn source_text(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut src = e.source();
    while let Some(s) = src {
        parts.push(s.to_string());
        src = s.source();
    }
    parts.join(": ")
}
