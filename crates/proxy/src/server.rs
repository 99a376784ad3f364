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
//! Must never: accept without a permit, keep a connection that made no progress for
//! `idle_timeout`, or buffer a request body beyond `max_body_bytes`.

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
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
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
    graceful.shutdown().await;
    Ok(())
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
