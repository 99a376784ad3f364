//! Host-owned sockets inside a sandbox's network namespace: the way out of a sandbox that
//! the host controls (issue 12's enforced path).
//!
//! A sandbox's network namespace has loopback only and no route anywhere: a packet to any
//! other address has nowhere to go. Every connection that leaves is one the sandbox makes
//! to a socket the *host* bound inside that namespace — a listener on a loopback address
//! the sandbox dials (named by a DNS stub whose socket is bound the same way). The host
//! accepts it in its own process, decides, and connects out from the host's namespace.
//! Nothing inside the sandbox (no route, no firewall rule, no process) takes part, so the
//! sandbox cannot change or bypass it: it has no CAP_NET_ADMIN over its namespace (owned by
//! the host's user namespace), and it cannot bind ports below
//! `net.ipv4.ip_unprivileged_port_start` (1024) there, so it cannot squat the host's
//! privileged-port listeners either.
//!
//! How a host socket lands in the namespace: a short-lived thread enters the namespace
//! through the sandbox init's pidfd (`setns(pidfd, CLONE_NEWNET)`, so a recycled pid can
//! never be entered), creates and binds the socket, and exits. A socket stays in the
//! namespace it was created in for its whole life, whichever thread uses it later.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use crate::identity::SandboxIdentity;
use crate::sys;

pub use crate::sys::loopback_alias;

/// Binds a TCP listener at `addr` inside the network namespace of the sandbox whose init
/// `pidfd` refers to.
pub fn listen_tcp(pidfd: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<TcpListener> {
    in_netns(pidfd, move || TcpListener::bind(addr))
}

/// Binds a UDP socket at `addr` inside the sandbox's network namespace (the DNS stub's).
pub fn bind_udp(pidfd: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<UdpSocket> {
    in_netns(pidfd, move || UdpSocket::bind(addr))
}

/// Runs `make` on a fresh thread that first enters the network namespace of the process
/// `pidfd` refers to. The thread ends right after, so no other work of this process ever
/// runs in the sandbox's namespace. (One thread for many sockets: each spawn costs.)
pub fn in_netns<T: Send + 'static>(
    pidfd: BorrowedFd<'_>,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let fd = pidfd.try_clone_to_owned()?;
    std::thread::Builder::new()
        .name("omabox-netns".into())
        .spawn(move || {
            // SAFETY: setns takes an fd we own for the duration of the call and a flag; on
            // success it changes only this thread's network namespace.
            let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            make()
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

impl SandboxIdentity {
    /// A pidfd for this sandbox's init, verified to be this identity's process (boot id and
    /// start time re-checked after opening it, so it cannot refer to a recycled pid).
    pub fn pidfd(&self) -> io::Result<OwnedFd> {
        let pidfd = sys::pidfd_open(self.pid)?;
        if !self.is_alive() {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("sandbox {} is not running", self.id),
            ));
        }
        Ok(pidfd)
    }
}
