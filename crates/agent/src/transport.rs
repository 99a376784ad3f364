//! How a backend hands the agent its byte stream: a unix socketpair whose agent end is
//! inherited as a numbered fd (`--fd N`). Nothing here passes descriptors over the
//! stream itself, so the same protocol runs over vsock or an attach stream.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;

use crate::client::{AgentClient, ClientError};

/// The fd number the agent end is given in the child by [`AgentProcess::spawn`].
pub const AGENT_FD: RawFd = 3;

/// A fresh socketpair: the host end (ready for [`AgentClient::connect`]) and the agent end
/// (close-on-exec; hand it to the agent with [`pass_fd`]).
pub fn socketpair() -> io::Result<(tokio::net::UnixStream, OwnedFd)> {
    let (host, agent) = std::os::unix::net::UnixStream::pair()?;
    host.set_nonblocking(true)?;
    Ok((tokio::net::UnixStream::from_std(host)?, agent.into()))
}

/// Makes `fd` appear as `target` in the child `cmd` starts, and only there (the parent's
/// copy stays close-on-exec). Keep `fd` alive until the spawn returned, then drop it so
/// the connection closes when the agent dies.
pub fn pass_fd(cmd: &mut std::process::Command, fd: &OwnedFd, target: RawFd) {
    let raw = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls dup2 and
    // fcntl, which are async-signal-safe, on integer descriptors; it allocates nothing
    // and touches no locks. `raw` is valid in the child because the caller keeps `fd`
    // open until spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            if raw == target {
                let flags = libc::fcntl(raw, libc::F_GETFD);
                if flags < 0 || libc::fcntl(raw, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                    return Err(io::Error::last_os_error());
                }
            } else if libc::dup2(raw, target) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// An agent running as a plain child process of the host (no isolation): what tests and
/// benchmarks use, and the shape every isolating backend follows.
#[derive(Debug)]
pub struct AgentProcess {
    /// The agent process.
    pub child: tokio::process::Child,
    /// A connected client.
    pub client: AgentClient,
}

impl AgentProcess {
    /// Starts `program --fd 3 <args>` with the agent end of a socketpair on fd 3 and
    /// connects to it. The child is killed if this handle's `child` is dropped.
    pub async fn spawn(program: &Path, args: &[&str]) -> Result<Self, ClientError> {
        let (host, agent_end) = socketpair()?;
        let mut cmd = std::process::Command::new(program);
        cmd.arg("--fd").arg(AGENT_FD.to_string()).args(args);
        pass_fd(&mut cmd, &agent_end, AGENT_FD);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let child = cmd.spawn()?;
        drop(agent_end);
        let client = AgentClient::connect(host).await?;
        Ok(Self { child, client })
    }
}
