//! The HTTP/1.1 server loop: bounded in connections, in time and in buffered bytes, so that
//! idle, half-open or slow clients cannot lock out a new one.
//!
//! ```text
//!   acquire a connection permit (at the cap: stop accepting; the kernel backlog waits)
//!     ─► accept ─► hyper http1 connection, its stream timed by the phase it is in:
//!          awaiting a head   header_read_timeout from accept, or from the first byte of a
//!                            next request (a slow or silent client)
//!          serving           idle_timeout: no byte read or written for this long (slow
//!                            bodies both ways, streamed proxy bodies, stalled readers)
//!          kept alive        keepalive_timeout after the last response; only
//!                            header_read_timeout while fewer than 1/8 of the permits are
//!                            free, so idle clients make room for new ones
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
//! Keep-alive outlives the clients' own pools on purpose: a server that closes an idle
//! connection just as a client sends its next request on it fails that request ("connection
//! closed before message completed"), and clients retry only idempotent ones. The E2B SDKs
//! keep idle connections 300 s; the default `keepalive_timeout_ms` is 610 s (the common load
//! balancers' figure), so under no pressure it is always the client that closes first.
//!
//! Must never: accept without a permit, keep a connection that made no progress for
//! `idle_timeout` while serving, or one kept alive past `keepalive_timeout`, buffer a request body beyond `max_body_bytes`, or let connections take
//! the descriptors the process needs to serve them.

use crate::config::Limits;
use axum::Router;
use futures::task::AtomicWaker;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
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
    let timeouts = Timeouts::new(limits, Arc::clone(&permits), cap);
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
        let phase = Arc::new(Phase::default());
        let io = TokioIo::new(TimedStream::new(
            stream,
            timeouts.clone(),
            Arc::clone(&phase),
        ));
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            // The stream times the head itself (from its first byte, not from the end of
            // the last response): hyper's own timer would also cut keep-alive idleness.
            .header_read_timeout(None)
            .serve_connection(io, phased_service(router.clone(), phase));
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

/// Where a connection is in its request cycle: set by its stream (a byte of a next head
/// read) and by its service (a request started, a response ended). A response ends after
/// hyper last polled the stream, so its end wakes the stream's task to re-time it.
#[derive(Debug, Default)]
struct Phase {
    now: AtomicU8,
    stream_task: AtomicWaker,
}

const AWAITING_HEAD: u8 = 0;
const SERVING: u8 = 1;
const KEPT_ALIVE: u8 = 2;

/// The server's timeouts, shared by its connections' streams.
#[derive(Debug, Clone)]
struct Timeouts {
    head: Duration,
    idle: Duration,
    keepalive: Duration,
    /// The connection permits: while fewer than `crowded_below` are free, kept-alive
    /// connections are kept only `head`.
    permits: Arc<Semaphore>,
    crowded_below: usize,
}

impl Timeouts {
    fn new(limits: &Limits, permits: Arc<Semaphore>, cap: usize) -> Self {
        let ms = |ms: u64| Duration::from_millis(ms.max(1));
        Self {
            head: ms(limits.header_read_timeout_ms),
            idle: ms(limits.idle_timeout_ms),
            keepalive: ms(limits.keepalive_timeout_ms),
            permits,
            crowded_below: (cap / 8).max(1),
        }
    }

    fn crowded(&self) -> bool {
        self.permits.available_permits() < self.crowded_below
    }
}

/// The router as hyper's service, marking `phase`: serving from a request's head to the end
/// (drop) of its response body, then kept alive.
fn phased_service(
    router: Router,
    phase: Arc<Phase>,
) -> impl hyper::service::Service<
    hyper::Request<hyper::body::Incoming>,
    Response = axum::response::Response,
    Error = std::convert::Infallible,
    Future = impl Future<Output = Result<axum::response::Response, std::convert::Infallible>> + Send,
> + Clone {
    hyper::service::service_fn(move |request| {
        phase.now.store(SERVING, Ordering::Release);
        let phase = Arc::clone(&phase);
        let response = tower::ServiceExt::oneshot(router.clone(), request);
        async move {
            let response = response.await?;
            Ok(response.map(|body| {
                axum::body::Body::new(CycleEnd {
                    body,
                    phase: Some(phase),
                })
            }))
        }
    })
}

/// A response body that marks its connection kept alive when hyper is done with it.
struct CycleEnd {
    body: axum::body::Body,
    phase: Option<Arc<Phase>>,
}

impl Drop for CycleEnd {
    fn drop(&mut self) {
        if let Some(phase) = self.phase.take() {
            let ended = phase.now.compare_exchange(
                SERVING,
                KEPT_ALIVE,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
            if ended.is_ok() {
                phase.stream_task.wake();
            }
        }
    }
}

impl http_body::Body for CycleEnd {
    type Data = axum::body::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

/// A connection's stream: fails with `TimedOut` once its phase's timeout passed (see the
/// module's diagram).
///
/// Progress only stamps `last_progress` (no timer operation per read or write); the timer is
/// re-armed lazily, when it fires early because bytes moved or the phase changed since it
/// was set.
#[derive(Debug)]
struct TimedStream {
    stream: TcpStream,
    timeouts: Timeouts,
    phase: Arc<Phase>,
    last_progress: Instant,
    /// When the head being awaited began: accept, or the first byte after a response.
    head_since: Instant,
    deadline: Pin<Box<Sleep>>,
}

impl TimedStream {
    fn new(stream: TcpStream, timeouts: Timeouts, phase: Arc<Phase>) -> Self {
        let now = Instant::now();
        Self {
            deadline: Box::pin(tokio::time::sleep(timeouts.head)),
            stream,
            timeouts,
            phase,
            last_progress: now,
            head_since: now,
        }
    }

    fn progressed(&mut self) {
        self.last_progress = Instant::now();
    }

    /// Bytes were read: on a kept-alive connection, they begin the next request's head.
    fn read_progressed(&mut self) {
        self.progressed();
        let next_head = self.phase.now.compare_exchange(
            KEPT_ALIVE,
            AWAITING_HEAD,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
        if next_head.is_ok() {
            self.head_since = self.last_progress;
        }
    }

    /// When this connection times out in its phase now, and why; and when to look again
    /// (a kept-alive connection's allowance shrinks once the server is crowded).
    fn due(&self, now: Instant) -> (Instant, Instant, &'static str) {
        let idle = self.last_progress + self.timeouts.idle;
        match self.phase.now.load(Ordering::Acquire) {
            AWAITING_HEAD => {
                let head = self.head_since + self.timeouts.head;
                let due = head.min(idle);
                (due, due, "request head timeout")
            }
            KEPT_ALIVE => {
                let allowance = if self.timeouts.crowded() {
                    self.timeouts.head
                } else {
                    self.timeouts.keepalive
                };
                let due = self.last_progress + allowance;
                (due, due.min(now + self.timeouts.head), "keep-alive timeout")
            }
            _ => (idle, idle, "connection idle timeout"),
        }
    }

    /// Called when the stream would block: an error once the phase's timeout passed. The
    /// timer moves earlier at once when the phase shortened the allowance; later only when
    /// it fires.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        self.phase.stream_task.register(cx.waker());
        loop {
            let now = Instant::now();
            let (due, look_again, what) = self.due(now);
            if now >= due {
                return Poll::Ready(io::Error::new(io::ErrorKind::TimedOut, what));
            }
            if look_again < self.deadline.deadline() {
                self.deadline.as_mut().reset(look_again);
            }
            ready!(self.deadline.as_mut().poll(cx));
            let (_, look_again, _) = self.due(Instant::now());
            self.deadline.as_mut().reset(look_again);
        }
    }
}

impl AsyncRead for TimedStream {
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
                    this.read_progressed();
                }
                Poll::Ready(result)
            }
            Poll::Pending => this.check_idle(cx).map(Err),
        }
    }
}

impl AsyncWrite for TimedStream {
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
