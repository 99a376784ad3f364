//! How much memory one relayed connection may hold on the host, and how many connections a
//! sandbox's budget buys.
//!
//! The relay's sockets are the host's, not the sandbox's: the kernel charges their buffers to
//! no sandbox limit (the one accepted in the sandbox's namespace and the one to the upstream
//! are both made by the host process), nor its pipes. Left to autotuning, a connection whose
//! far side does not drain parks several MiB in them (a 64 MiB sandbox held 1.3 GiB through
//! 96 connections). So every host-side socket gets fixed buffers (`SO_RCVBUF`/`SO_SNDBUF`,
//! which also stops autotuning), every splice pipe a fixed size, and the relay admits only as
//! many connections as its budget covers at [`SocketBuffers::worst_case`] each. A side whose
//! peer does not drain is not read further once its pipe is full (see `splice`), so nothing
//! beyond these buffers accumulates.

use std::io;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::time::Duration;

use tokio::net::{TcpSocket, TcpStream};

/// Bytes the relay allows per connection outside the kernel's socket buffers: the sniffed
/// head (16 KiB), or an intercepted connection's TLS and HTTP buffers (rustls and hyper, each
/// way; hyper's capped at 64 KiB, see `intercept::MAX_HEAD`).
pub const USERLAND_PER_CONNECTION: u64 = 512 * 1024;

/// The host-side buffers of one relayed connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketBuffers {
    /// `SO_RCVBUF` and `SO_SNDBUF` asked for the socket accepted from the sandbox (loopback:
    /// small buffers cost no throughput).
    pub sandbox_side: u32,
    /// `SO_RCVBUF` and `SO_SNDBUF` asked for the socket to the upstream (its window: the
    /// throughput of one connection over a long path).
    pub upstream_side: u32,
    /// The size of each of the two splice pipes.
    pub pipe: u32,
}

impl Default for SocketBuffers {
    /// 64 KiB towards the sandbox, 512 KiB towards the upstream (1 MiB of window as the
    /// kernel doubles it: ~20 MB/s over a 50 ms path), 64 KiB pipes: at most 2.9 MiB per
    /// connection.
    fn default() -> Self {
        Self {
            sandbox_side: 64 * 1024,
            upstream_side: 512 * 1024,
            pipe: 64 * 1024,
        }
    }
}

impl SocketBuffers {
    /// The most one connection may hold on the host: both sockets' receive and send
    /// buffers as the kernel sizes them (twice the asked value, for its bookkeeping, which
    /// the queued data's accounting includes), both pipes, and
    /// [`USERLAND_PER_CONNECTION`].
    pub fn worst_case(&self) -> u64 {
        let socket = |asked: u32| 2 * 2 * u64::from(asked);
        socket(self.sandbox_side)
            + socket(self.upstream_side)
            + 2 * u64::from(self.pipe)
            + USERLAND_PER_CONNECTION
    }

    /// How many connections `budget` bytes cover at [`worst_case`](Self::worst_case) each
    /// (at least one: a sandbox always gets a way out).
    pub fn connections_within(&self, budget: u64) -> usize {
        usize::try_from(budget / self.worst_case())
            .unwrap_or(usize::MAX)
            .max(1)
    }

    /// Fixes the buffers of a socket towards the sandbox (a listener: every socket it
    /// accepts inherits them, the window it offers included).
    pub fn apply_sandbox_side(&self, socket: &impl AsFd) -> io::Result<()> {
        set_buffers(socket, self.sandbox_side)
    }

    /// Connects to `target` from a socket with the upstream side's buffers (fixed before
    /// the handshake, so the window it offers is sized by them), within `timeout`.
    pub async fn connect(&self, target: SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
        let socket = match target {
            SocketAddr::V4(_) => TcpSocket::new_v4()?,
            SocketAddr::V6(_) => TcpSocket::new_v6()?,
        };
        socket.set_recv_buffer_size(self.upstream_side)?;
        socket.set_send_buffer_size(self.upstream_side)?;
        tokio::time::timeout(timeout, socket.connect(target))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))?
    }
}

fn set_buffers(socket: &impl AsFd, bytes: u32) -> io::Result<()> {
    use rustix::net::sockopt::{set_socket_recv_buffer_size, set_socket_send_buffer_size};
    let value = usize::try_from(bytes.min(i32::MAX as u32)).unwrap_or(usize::MAX);
    set_socket_recv_buffer_size(socket, value)?;
    set_socket_send_buffer_size(socket, value)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_buys_connections_at_the_worst_case_each() {
        let buffers = SocketBuffers::default();
        assert_eq!(buffers.worst_case(), 2944 * 1024);
        assert_eq!(buffers.connections_within(64 << 20), 22);
        assert_eq!(buffers.connections_within(512 << 20), 178);
        assert_eq!(buffers.connections_within(1 << 20), 1);
    }

    #[test]
    fn the_kernel_keeps_the_asked_buffers() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        SocketBuffers::default()
            .apply_sandbox_side(&listener)
            .unwrap();
        let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        use rustix::net::sockopt::{socket_recv_buffer_size, socket_send_buffer_size};
        // Inherited from the listener, doubled by the kernel.
        assert_eq!(socket_recv_buffer_size(&accepted).unwrap(), 128 * 1024);
        assert_eq!(socket_send_buffer_size(&accepted).unwrap(), 128 * 1024);
        drop(client);
    }
}
