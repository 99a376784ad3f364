//! `omabox-sandbox-init`: the first and only program a linux sandbox execs. It starts as
//! PID 1 of fresh namespaces, enters a fresh network namespace of its own, reads its plan
//! from an inherited pipe, builds and locks down the sandbox (single-threaded, before any runtime exists), reports ready, then
//! becomes the omabox agent in-process and serves the protocol on the inherited socket.
//! When that connection ends, it exits, and the kernel kills the rest of the sandbox.
//!
//! Not meant to be run by hand; the host side (`LinuxRuntime::start`) passes
//! `--plan-fd N --status-fd N --agent-fd N`.

#![no_main]

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

use omabox_agent::agent::{Agent, AgentConfig, ReapMode};
use omabox_linux_sandbox::handoff::{self, InitSpec};
use omabox_linux_sandbox::setup;

struct Fds {
    plan: OwnedFd,
    status: OwnedFd,
    agent: OwnedFd,
}

fn parse_fds(args: &[String]) -> Result<Fds, String> {
    let get = |flag: &str| -> Result<RawFd, String> {
        let i = args
            .iter()
            .position(|a| a == flag)
            .ok_or_else(|| format!("missing {flag}"))?;
        args.get(i + 1)
            .and_then(|v| v.parse::<RawFd>().ok())
            .filter(|fd| *fd > 2)
            .ok_or_else(|| format!("bad value for {flag}"))
    };
    let (plan, status, agent) = (get("--plan-fd")?, get("--status-fd")?, get("--agent-fd")?);
    if plan == status || plan == agent || status == agent {
        return Err("fd numbers must differ".into());
    }
    // Make sure each fd is open before taking ownership of it.
    for fd in [plan, status, agent] {
        // SAFETY: F_GETFD on an integer fd has no memory effects.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(format!("fd {fd} is not open"));
        }
    }
    // SAFETY: the three fds are open (checked above), distinct, and were passed to this
    // process for it to own; nothing else in this process refers to them.
    Ok(unsafe {
        Fds {
            plan: OwnedFd::from_raw_fd(plan),
            status: OwnedFd::from_raw_fd(status),
            agent: OwnedFd::from_raw_fd(agent),
        }
    })
}

/// `--zygote-fd N`: run as the runtime's zygote on the socket `N` (see
/// `omabox_linux_sandbox::zygote`).
fn zygote_fd(args: &[String]) -> Option<Result<OwnedFd, String>> {
    let i = args.iter().position(|a| a == "--zygote-fd")?;
    let fd = args
        .get(i + 1)
        .and_then(|v| v.parse::<RawFd>().ok())
        .filter(|fd| *fd > 2);
    Some(match fd {
        // SAFETY: F_GETFD on an integer fd has no memory effects.
        Some(fd) if unsafe { libc::fcntl(fd, libc::F_GETFD) } >= 0 => {
            // SAFETY: the fd is open and was passed to this process for it to own.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        }
        _ => Err("bad value for --zygote-fd".into()),
    })
}

/// A child forked by the zygote starts with the zygote's (empty) environment: the
/// plan's is what an exec'd init would have had.
fn take_plan_env(env: &std::collections::BTreeMap<String, String>) {
    let valid = |k: &str, v: &str| !k.is_empty() && !k.contains(['=', '\0']) && !v.contains('\0');
    for (k, v) in env.iter().filter(|(k, v)| valid(k, v)) {
        // SAFETY: this process is single-threaded (the setup stage; no runtime yet).
        unsafe { std::env::set_var(k, v) };
    }
}

// No `std` runtime start-up (`#![no_main]`): it costs this binary, which every sandbox
// start execs, a parse of `/proc/self/maps` (glibc's `pthread_getattr_np` on the main
// thread, for std's stack guard) and signal handler set-up before `main`. What of it
// matters here is done by hand in `main`: SIGPIPE ignored (so a write to a closed pipe
// is an EPIPE error, as under the std runtime; processes the agent starts get the
// default back, std's spawn resets it), and a panic ends the process with code 101
// after the panic hook printed it. The arguments come from `argv`: `std::env::args` is
// empty without the std runtime on musl (only glibc hands argc/argv to std's init_array
// hook).
#[unsafe(no_mangle)]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: setting a signal's disposition to ignore has no memory effects.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let count = usize::try_from(argc).unwrap_or(0);
    // SAFETY: the C runtime passes `argc` valid, NUL-terminated strings in `argv`.
    let args: Vec<String> = (1..count)
        .map(|i| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) })
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    match std::panic::catch_unwind(|| run(&args)) {
        Ok(code) => libc::c_int::from(code),
        Err(_) => 101,
    }
}

fn run(args: &[String]) -> u8 {
    // A zygote forks a child per sandbox, which continues below like an exec'd init
    // (with the plan's environment still to take: see `take_plan_env`). It prepares
    // what needs no plan once, for every child it forks.
    let (fds, forked, mut early, mut network) = match zygote_fd(args) {
        Some(Ok(sock)) => {
            let early = setup::Early::prepare();
            match omabox_linux_sandbox::zygote::serve(sock) {
                Some(child) => (
                    Fds {
                        plan: child.plan,
                        status: child.status,
                        agent: child.agent,
                    },
                    true,
                    Some(early),
                    child.network,
                ),
                None => return 0,
            }
        }
        Some(Err(e)) => {
            eprintln!("{}: {e}", omabox_linux_sandbox::INIT_BINARY);
            return 2;
        }
        None => match parse_fds(args) {
            Ok(f) => (f, false, None, None),
            Err(e) => {
                eprintln!("{}: {e}", omabox_linux_sandbox::INIT_BINARY);
                return 2;
            }
        },
    };
    let entered = handoff::monotonic_us();
    let mut status = std::fs::File::from(fds.status);
    // Our own network namespace first, while the host prepares the cgroup (a zygote's
    // spare made it before it was handed out).
    if let Err(e) = network.take().unwrap_or_else(setup::isolate_network) {
        let _ = write!(status, "{}{e}", handoff::FAILED as char);
        return 1;
    }
    let netns = handoff::monotonic_us();
    // What needs no plan, while the host prepares the cgroup (done already in a zygote).
    let early = early.take().unwrap_or_else(setup::Early::prepare);
    // Blocks until the host has moved us into the sandbox cgroup and written the plan.
    let spec: InitSpec = {
        let mut bytes = Vec::new();
        let mut plan = std::fs::File::from(fds.plan);
        if let Err(e) = plan.read_to_end(&mut bytes) {
            let _ = write!(status, "{}reading plan: {e}", handoff::FAILED as char);
            return 1;
        }
        match serde_json::from_slice(&bytes) {
            Ok(s) => s,
            Err(e) => {
                let _ = write!(status, "{}decoding plan: {e}", handoff::FAILED as char);
                return 1;
            }
        }
    };
    if forked {
        take_plan_env(&spec.plan.env);
    }
    let plan_read = handoff::monotonic_us();
    // The user namespace the host made for us (sent before the plan, so it is there).
    let userns = if spec.userns_sent {
        match handoff::recv_fd(std::os::fd::AsFd::as_fd(&fds.agent)) {
            Ok(fd) => Some(fd),
            Err(e) => {
                let _ = write!(
                    status,
                    "{}receiving the user namespace: {e}",
                    handoff::FAILED as char
                );
                return 1;
            }
        }
    } else {
        None
    };
    let mut report = match setup::run(&spec, userns, early) {
        Ok(r) => r,
        Err(e) => {
            let _ = write!(status, "{}{e}", handoff::FAILED as char);
            return 1;
        }
    };
    report.clock_us = vec![
        ("init main".into(), entered),
        ("init netns".into(), netns),
        ("init plan read".into(), plan_read),
        ("init ready".into(), handoff::monotonic_us()),
    ];
    let mut msg = vec![handoff::READY];
    msg.extend(serde_json::to_vec(&report).unwrap_or_default());
    if status.write_all(&msg).is_err() {
        return 1;
    }
    drop(status);
    serve(fds.agent)
}

/// Runs the agent on the inherited socket until the host closes it.
fn serve(agent_fd: OwnedFd) -> u8 {
    let stream = std::os::unix::net::UnixStream::from(agent_fd);
    // Processes the agent starts must not inherit the control socket.
    // SAFETY: F_SETFD on the fd `stream` owns; no memory effects.
    let _ = unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&stream),
            libc::F_SETFD,
            libc::FD_CLOEXEC,
        )
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(_) => return 1,
    };
    rt.block_on(async move {
        if stream.set_nonblocking(true).is_err() {
            return 1;
        }
        let Ok(stream) = tokio::net::UnixStream::from_std(stream) else {
            return 1;
        };
        let config = AgentConfig {
            reap: ReapMode::AllChildren,
            ..AgentConfig::default()
        };
        let Ok(agent) = Agent::new(config) else {
            return 1;
        };
        let mut term =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let served = agent.serve(stream);
        tokio::pin!(served);
        loop {
            tokio::select! {
                _ = &mut served => break,
                Some(()) = async { match term.as_mut() { Some(t) => t.recv().await, None => std::future::pending().await } } => {
                    agent.signal_all(libc::SIGTERM);
                }
            }
        }
        agent.kill_all();
        0
    })
}
