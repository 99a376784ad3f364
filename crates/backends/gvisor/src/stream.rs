//! The host's side of the agent's pipes as the agent client sees it.

use std::sync::Arc;

/// The host's ends of the agent's pipes: it reads the agent's fd 1, writes its fd 0.
pub(crate) type AgentPipes =
    tokio::io::Join<tokio::net::unix::pipe::Receiver, tokio::net::unix::pipe::Sender>;

/// The client's copies of the agent's pipes, with no write shutdown (the client shuts its
/// side down when it ends, a detach too; the detached init must not see it) and with a
/// gate that makes it read EOF, without reading, once the client detached.
pub(crate) struct ClientStream {
    pub(crate) inner: AgentPipes,
    pub(crate) gate: Arc<std::sync::atomic::AtomicBool>,
}

impl tokio::io::AsyncRead for ClientStream {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if self.gate.load(std::sync::atomic::Ordering::SeqCst) {
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for ClientStream {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}
