//! `omabox-gvisor-init`: the process of a gvisor sandbox's container. It is the omabox
//! agent, serving the protocol on its stdin/stdout (a pipe each way, handed by the host to
//! `runsc run` or `runsc restore`), connection after connection: after the host detaches
//! (before a checkpoint) it waits for the wake token ([`omabox_backend_gvisor::WAKE`]),
//! which the host writes on the new pipe after a restore; then the agent serves again.
//! Everything the earlier connections started runs on.
//!
//! fd 0 and fd 1 are read and written only with plain blocking calls on two threads,
//! bridged to the agent through an in-process pipe: a restore gives both descriptors a
//! new host file, and a blocked `read(2)` is restarted on it (shown with a shell). A
//! first design with a tokio stream on fd 0 never answered after a restore; whether its
//! epoll registration was lost or the restore crash SECURITY.md describes hit it was not
//! settled.
//!
//! On the host, `--subreaper` makes it the parent of a foreground runsc instead
//! (`subreaper.rs`).
//!
//! Never: read fd 0 anywhere but the one reader thread (a second reader would steal the
//! next connection's bytes); exit while detached unless fd 0 ended.

mod stale_epoll;
mod subreaper;

use std::io::{Read, Write};
use std::os::fd::FromRawFd;
use std::process::ExitCode;
use std::time::Duration;

use omabox_agent::agent::{Agent, AgentConfig, ReapMode, Served};
use omabox_agent::sys;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use omabox_backend_gvisor::WAKE;
/// Bytes per read of fd 0 and per chunk handed to the writer thread.
const CHUNK: usize = 64 * 1024;
/// Chunks queued each way between the threads and the agent (bounded: backpressure).
const QUEUE: usize = 16;

fn main() -> ExitCode {
    let mut args = std::env::args_os().skip(1);
    if args.next().is_some_and(|first| first == "--subreaper") {
        return subreaper::run(args.collect());
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("omabox-gvisor-init: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let code = rt.block_on(run());
    // The reader thread may be blocked in read(2): do not wait for it.
    rt.shutdown_timeout(Duration::from_millis(200));
    code
}

async fn run() -> ExitCode {
    if sys::getpid() != 1 {
        let _ = sys::set_child_subreaper();
    }
    let config = AgentConfig {
        reap: ReapMode::AllChildren,
        workdir: omabox_backend_gvisor::WORKSPACE.into(),
        ..AgentConfig::default()
    };
    let agent = match Agent::new(config) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("omabox-gvisor-init: {e}");
            return ExitCode::from(1);
        }
    };
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        eprintln!("omabox-gvisor-init: cannot install a SIGTERM handler");
        return ExitCode::from(1);
    };
    let (mut inbound, outbound) = start_threads();
    // Bytes read after the wake byte belong to the next connection.
    let mut carry: Vec<u8> = Vec::new();
    let code = loop {
        let (agent_io, bridge) = tokio::io::duplex(CHUNK * 4);
        let (mut from_agent, mut to_agent) = tokio::io::split(bridge);
        // fd 0 → agent, until the connection ends (then aborted; a detached host sends
        // nothing more, so no byte is lost).
        let first = std::mem::take(&mut carry);
        let pump_in = async {
            if !first.is_empty() && to_agent.write_all(&first).await.is_err() {
                return;
            }
            while let Some(chunk) = inbound.recv().await {
                if to_agent.write_all(&chunk).await.is_err() {
                    return;
                }
            }
            // fd 0 ended: the agent sees EOF.
            let _ = to_agent.shutdown().await;
        };
        // agent → fd 1, until the agent's side closes (everything it wrote is forwarded).
        let out = outbound.clone();
        let pump_out = tokio::spawn(async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                match from_agent.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => {
                        if out.send(buf[..n].to_vec()).await.is_err() {
                            return;
                        }
                    }
                }
            }
        });
        let served = tokio::select! {
            r = agent.serve_detachable(agent_io) => r,
            () = pump_in => {
                // Unreachable in practice: serve ends on the EOF pump_in delivered.
                Ok(Served::Closed)
            }
            _ = term.recv() => break ExitCode::SUCCESS,
        };
        match served {
            // The agent's end is dropped: the out pump forwards what is left and ends.
            Ok(Served::Detached) => {
                let _ = pump_out.await;
            }
            Ok(Served::Closed) => {
                eprintln!("omabox-gvisor-init: the host closed the connection");
                break ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("omabox-gvisor-init: {e}");
                break ExitCode::from(2);
            }
        }
        // Detached: the sandbox may be checkpointed while we wait here, and restored
        // with a new pipe on fd 0 that starts with the wake token.
        match wait_for_wake(&mut inbound).await {
            Some(rest) => carry = rest,
            None => {
                eprintln!("omabox-gvisor-init: fd 0 ended while detached");
                break ExitCode::SUCCESS;
            }
        }
    };
    // The host is gone (or told us to stop): nothing can read what is left, and a process
    // still writing would keep the out pump waiting for ever (a kill -9 of the host left
    // the sandbox running). Everything started here dies with it.
    agent.kill_all();
    sys::kill_all_in_namespace();
    code
}

/// Discards what arrives until the wake token (frames the old client still sent after
/// the detach reply, window credit for instance, may come first); returns the bytes after
/// it, or `None` when fd 0 ended.
async fn wait_for_wake(inbound: &mut mpsc::Receiver<Vec<u8>>) -> Option<Vec<u8>> {
    let mut seen: Vec<u8> = Vec::new();
    loop {
        seen.extend_from_slice(&inbound.recv().await?);
        if let Some(at) = seen.windows(WAKE.len()).position(|w| w == WAKE) {
            return Some(seen.split_off(at + WAKE.len()));
        }
        // Keep only what could be the start of a token split across reads.
        let keep = seen.len().min(WAKE.len() - 1);
        seen.drain(..seen.len() - keep);
    }
}

/// The reader thread (fd 0 → the returned receiver; it closes at EOF or error) and the
/// writer thread (the returned sender → fd 1).
fn start_threads() -> (mpsc::Receiver<Vec<u8>>, mpsc::Sender<Vec<u8>>) {
    // The descriptors must block: these threads wait in read(2)/write(2).
    for fd in [0, 1] {
        // SAFETY: fcntl on fd 0/1 with integer arguments only.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK);
            }
        }
    }
    let (in_tx, in_rx) = mpsc::channel::<Vec<u8>>(QUEUE);
    let (out_tx, mut out_rx) = mpsc::channel::<Vec<u8>>(QUEUE);
    std::thread::spawn(move || {
        // SAFETY: fd 0 stays open for the process's life and only this thread uses it;
        // ManuallyDrop never closes it.
        let mut stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
        let mut buf = vec![0u8; CHUNK];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if in_tx.blocking_send(buf[..n].to_vec()).is_err() {
                        return;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
    });
    std::thread::spawn(move || {
        // SAFETY: as above, for fd 1 and this thread.
        let mut stdout = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
        while let Some(chunk) = out_rx.blocking_recv() {
            if stdout.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    (in_rx, out_tx)
}
