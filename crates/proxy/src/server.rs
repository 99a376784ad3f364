//! The HTTP/1.1 server loop: bounded in connections, in time and in buffered bytes, so that
//! idle, half-open or slow clients cannot lock out a new one.
//!
//! ```text
//!   acquire a connection permit (at the cap: stop accepting; the kernel backlog waits)
//!     ─► accept ─► hyper http1 connection:
//!          header_read_timeout  from waiting for a request head to having it (so it also
//!                               bounds the idle time between keep-alive requests)
//!          idle_timeout         no byte read or written for this long, at any point (slow
//!                               bodies both ways, streamed proxy bodies, stalled readers)
//!     ─► the connection ends ─► the permit returns
//!   request bodies: `max_body_bytes` for the routes that buffer one (the router's
//!   `DefaultBodyLimit`); the streamed proxy bodies are excepted and bounded by idle_timeout.
//! ```
//!
//! The cap is `max_connections`, lowered to what the process's file descriptors allow
//! ([`connection_cap`]): each connection may hold its socket and one more descriptor (an
//! upstream connection, a file it serves), and [`FD_RESERVE`] stay for the process's own
//! work. A cap above the descriptors left would let idle clients take them all: `accept`
//! then fails with `EMFILE`, and so does every request's own `open` or `connect` (a 500 for
//! everyone) until the idle ones time out.
//!
//! Must never: accept without a permit, keep a connection that made no progress for
//! `idle_timeout`, buffer a request body beyond `max_body_bytes`, or let connections take
//! the descriptors the process needs to serve them.

use crate::config::Limits;
use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::{Instant, Sleep};

/// Serves `router` on `listener` within `limits` until `shutdown` resolves, then lets
/// in-flight connections finish (graceful shutdown).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let cap = connection_cap(limits.max_connections);
    if cap < limits.max_connections {
        tracing::warn!(
            configured = limits.max_connections,
            cap,
            "serving fewer connections at once than configured: the file descriptor limit \
             (RLIMIT_NOFILE) leaves room for no more"
        );
    }
    let permits = Arc::new(Semaphore::new(cap));
    let graceful = GracefulShutdown::new();
    let header_read_timeout = Duration::from_millis(limits.header_read_timeout_ms.max(1));
    let idle_timeout = Duration::from_millis(limits.idle_timeout_ms.max(1));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
            () = &mut shutdown => break,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    accept_failed(&error).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let io = TokioIo::new(IdleTimeout::new(stream, idle_timeout));
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(header_read_timeout)
            .serve_connection(io, TowerToHyperService::new(router.clone()));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            after_s = DRAIN_TIMEOUT.as_secs(),
            "stopping with requests still in flight"
        );
    }
    Ok(())
}

/// How long a stopping server waits for in-flight requests before it returns anyway (their
/// connections are dropped with the runtime): a request whose body never completes, or a
/// stream that never ends, must not keep serve (and its sandboxes) alive.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Descriptors kept for the process's own work beyond its connections' (the store's files,
/// name lookups, a blob read, the runtime's own).
pub const FD_RESERVE: u64 = 32;

/// Descriptors one connection may hold: its socket, and one upstream socket or open file.
const FDS_PER_CONNECTION: u64 = 2;

/// The most connections to serve at once: `configured`, lowered to what this process's
/// soft `RLIMIT_NOFILE` leaves once the descriptors open now and [`FD_RESERVE`] are set
/// aside, two per connection; at least 1.
pub fn connection_cap(configured: usize) -> usize {
    let Some(limit) = nofile_soft_limit() else {
        return configured.max(1);
    };
    let open = open_descriptors().unwrap_or(0);
    fds_allow(configured, limit, open)
}

/// [`connection_cap`]'s arithmetic (pure).
fn fds_allow(configured: usize, limit: u64, open: u64) -> usize {
    let spare = limit.saturating_sub(open).saturating_sub(FD_RESERVE) / FDS_PER_CONNECTION;
    usize::try_from(spare)
        .unwrap_or(usize::MAX)
        .min(configured)
        .max(1)
}

/// The soft `RLIMIT_NOFILE`, `None` when unlimited or unknown.
fn nofile_soft_limit() -> Option<u64> {
    // `None` for RLIM_INFINITY.
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// How many descriptors this process has open (`/proc/self/fd`, less the one reading it).
fn open_descriptors() -> Option<u64> {
    let count = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(count.saturating_sub(1))
}

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (allowed without privilege)
/// and returns the new soft limit; for a server, before it derives its connection cap.
pub fn raise_nofile_limit() -> io::Result<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        limit.current = limit.maximum;
        setrlimit(Resource::Nofile, limit)?;
    }
    Ok(limit.current.unwrap_or(u64::MAX))
}

/// A failed accept: per-connection errors are skipped; resource exhaustion (EMFILE, ENFILE,
/// ENOMEM) backs off briefly instead of spinning.
async fn accept_failed(error: &io::Error) {
    let per_connection = matches!(
        error.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::Interrupted
    );
    if !per_connection {
        tracing::warn!(%error, "accept failed; backing off");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A stream that fails with `TimedOut` once no byte has moved either way for `timeout`.
///
/// Progress only stamps `last_progress` (no timer operation per read or write); the timer is
/// re-armed lazily, when it fires early because bytes moved since it was set.
#[derive(Debug)]
struct IdleTimeout {
    stream: TcpStream,
    timeout: Duration,
    last_progress: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl IdleTimeout {
    fn new(stream: TcpStream, timeout: Duration) -> Self {
        Self {
            stream,
            timeout,
            last_progress: Instant::now(),
            deadline: Box::pin(tokio::time::sleep(timeout)),
        }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Called when the stream would block: an error once `timeout` passed without progress.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        loop {
            ready!(self.deadline.as_mut().poll(cx));
            let due = self.last_progress + self.timeout;
            if Instant::now() >= due {
                return Poll::Ready(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "connection idle timeout",
                ));
            }
            self.deadline.as_mut().reset(due);
        }
    }
}

impl AsyncRead for IdleTimeout {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    this.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for IdleTimeout {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buf) {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    this.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx).map(Err),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_flush(cx) {
            Poll::Ready(result) => Poll::Ready(result),
            Poll::Pending => this.check_idle(cx).map(Err),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write_vectored(cx, bufs) {
            Poll::Ready(result) => {
                if matches!(result, Ok(written) if written > 0) {
                    this.progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx).map(Err),
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_leaves_descriptors_for_the_process_and_never_exceeds_the_configured_one() {
        // 64 descriptors, 16 open: (64 - 16 - 32) / 2 = 8 connections.
        assert_eq!(fds_allow(1024, 64, 16), 8);
        assert_eq!(fds_allow(4, 64, 16), 4, "never above the configured cap");
        assert_eq!(fds_allow(1024, 20, 16), 1, "at least one");
        assert_eq!(fds_allow(1024, 1 << 20, 10), 1024);
    }
}
