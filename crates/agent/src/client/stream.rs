//! Byte streams of one agent stream: readers for agent → host channels, a writer for the
//! host → agent channel.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::mpsc;

use super::{AgentClient, Chunk, ClientError, Shared, StreamState, lock};
use crate::flow::{RecvWindow, SendWindow};
use crate::frame::{Frame, channel};

/// Cancels the agent-side operation when the last handle of an unfinished stream drops.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    id: u32,
    shared: Arc<Shared>,
}

impl StreamGuard {
    pub(crate) fn new(id: u32, shared: Arc<Shared>) -> Self {
        Self { id, shared }
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        // No-op when the stream already ended (its entry is gone).
        self.shared.cancel(self.id);
    }
}

/// Bytes of one agent → host channel (stdout, stderr, file content, tar archive).
///
/// Implements [`AsyncRead`] and `Stream<Item = Result<Bytes, ClientError>>`. Credit is
/// returned to the agent as chunks are taken, so a reader that stops reading pauses only
/// its own producer. Dropping it discards the rest of the channel without stalling the
/// producer.
pub struct DataReader {
    client: AgentClient,
    id: u32,
    ch: u8,
    rx: mpsc::UnboundedReceiver<Chunk>,
    recv: Arc<RecvWindow>,
    state: Arc<StreamState>,
    cur: Bytes,
    eof: bool,
    _guard: Arc<StreamGuard>,
}

impl std::fmt::Debug for DataReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataReader")
            .field("stream", &self.id)
            .field("channel", &self.ch)
            .field("eof", &self.eof)
            .finish_non_exhaustive()
    }
}

impl DataReader {
    pub(crate) fn new(
        client: AgentClient,
        id: u32,
        ch: u8,
        rx: mpsc::UnboundedReceiver<Chunk>,
        recv: Arc<RecvWindow>,
        state: Arc<StreamState>,
        guard: Arc<StreamGuard>,
    ) -> Self {
        Self {
            client,
            id,
            ch,
            rx,
            recv,
            state,
            cur: Bytes::new(),
            eof: false,
            _guard: guard,
        }
    }

    fn ended_without_eof(&self) -> ClientError {
        if let Some(e) = lock(&self.state.error).clone() {
            return ClientError::Remote(e);
        }
        let shared = self.client.shared();
        if lock(&shared.closed).is_some() {
            return shared.lost();
        }
        ClientError::UnexpectedReply(format!(
            "stream {} channel {} ended without eof",
            self.id, self.ch
        ))
    }

    /// Next chunk; `Ready(Ok(None))` at end of channel.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Bytes>, ClientError>> {
        if !self.cur.is_empty() {
            return Poll::Ready(Ok(Some(std::mem::take(&mut self.cur))));
        }
        if self.eof {
            return Poll::Ready(Ok(None));
        }
        match ready!(self.rx.poll_recv(cx)) {
            Some(Chunk::Data(b)) => {
                self.client
                    .shared()
                    .return_credit(self.id, self.ch, &self.recv, b.len());
                Poll::Ready(Ok(Some(b)))
            }
            Some(Chunk::Eof) => {
                self.eof = true;
                Poll::Ready(Ok(None))
            }
            None => Poll::Ready(Err(self.ended_without_eof())),
        }
    }

    /// Next chunk, `None` at end of channel.
    pub async fn chunk(&mut self) -> Result<Option<Bytes>, ClientError> {
        std::future::poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// Reads everything that is left.
    pub async fn read_to_end(&mut self) -> Result<Vec<u8>, ClientError> {
        let mut out = Vec::new();
        while let Some(b) = self.chunk().await? {
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    /// Reads everything that is left, keeping only as many bytes as `budget` still allows
    /// (a budget several readers may share) and dropping the rest as it arrives, so the
    /// producer never stalls and memory stays bounded. `true` when bytes were dropped.
    pub(crate) async fn read_capped(
        &mut self,
        budget: &AtomicUsize,
    ) -> Result<(Vec<u8>, bool), ClientError> {
        let mut out = Vec::new();
        let mut dropped = false;
        while let Some(b) = self.chunk().await? {
            let wanted = b.len();
            let granted = budget
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                    Some(left - left.min(wanted))
                })
                .map_or(0, |left| left.min(wanted));
            out.extend_from_slice(&b[..granted]);
            dropped |= granted < wanted;
        }
        Ok((out, dropped))
    }

    /// Reads everything that is left if it is at most `limit` bytes; `None` (and the rest
    /// left unread: drop the reader to discard it) as soon as it is more.
    pub(crate) async fn read_to_end_within(
        &mut self,
        limit: usize,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        let mut out = Vec::new();
        while let Some(b) = self.chunk().await? {
            if out.len() + b.len() > limit {
                return Ok(None);
            }
            out.extend_from_slice(&b);
        }
        Ok(Some(out))
    }

    /// Reads and discards everything that is left, returning the byte count.
    pub async fn drain(&mut self) -> Result<u64, ClientError> {
        let mut n = 0u64;
        while let Some(b) = self.chunk().await? {
            n += b.len() as u64;
        }
        Ok(n)
    }

    /// Reads everything as (lossy) UTF-8 text.
    pub async fn read_to_string_lossy(&mut self) -> Result<String, ClientError> {
        let bytes = self.read_to_end().await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }
}

impl Stream for DataReader {
    type Item = Result<Bytes, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_chunk(cx).map(Result::transpose)
    }
}

impl AsyncRead for DataReader {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.cur.is_empty() {
            match ready!(this.poll_chunk(cx)) {
                Ok(Some(b)) => this.cur = b,
                Ok(None) => return Poll::Ready(Ok(())),
                Err(e) => return Poll::Ready(Err(std::io::Error::other(e))),
            }
        }
        let n = buf.remaining().min(this.cur.len());
        buf.put_slice(&this.cur.split_to(n));
        Poll::Ready(Ok(()))
    }
}

/// The host → agent channel of a stream (process stdin, file or tar upload).
///
/// Writes wait for window credit. [`DataWriter::close`] (or dropping the writer, or
/// `poll_shutdown`) sends eof, which the agent turns into end-of-file for the reader
/// (a process sees EOF on stdin).
pub struct DataWriter {
    client: AgentClient,
    id: u32,
    window: Arc<SendWindow>,
    chunk: usize,
    closed: bool,
    _guard: Arc<StreamGuard>,
}

impl std::fmt::Debug for DataWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataWriter")
            .field("stream", &self.id)
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

fn broken() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::BrokenPipe, "agent stream has ended")
}

impl DataWriter {
    pub(crate) fn new(
        client: AgentClient,
        id: u32,
        window: Arc<SendWindow>,
        guard: Arc<StreamGuard>,
    ) -> Self {
        let chunk = client.chunk();
        Self {
            client,
            id,
            window,
            chunk,
            closed: false,
            _guard: guard,
        }
    }

    /// Sends all of `data` (in window-sized chunks).
    pub async fn write_all(&mut self, data: &[u8]) -> Result<(), ClientError> {
        self.send(Bytes::copy_from_slice(data)).await
    }

    /// Sends all of `data` without copying it.
    pub async fn send(&mut self, mut data: Bytes) -> Result<(), ClientError> {
        if self.closed {
            return Err(broken().into());
        }
        while !data.is_empty() {
            let n = self
                .window
                .reserve(data.len().min(self.chunk))
                .await
                .ok_or_else(broken)?;
            let part = data.split_to(n);
            self.client
                .shared()
                .out
                .send(Frame::data(self.id, channel::INPUT, part))
                .map_err(|_| self.client.shared().lost())?;
        }
        Ok(())
    }

    /// Copies `src` to the agent until EOF (does not close).
    pub async fn copy_from<R: AsyncRead + Unpin + ?Sized>(
        &mut self,
        src: &mut R,
    ) -> Result<u64, ClientError> {
        let mut total = 0u64;
        let mut buf = vec![0u8; self.chunk];
        loop {
            let n = src.read(&mut buf).await?;
            if n == 0 {
                return Ok(total);
            }
            total += n as u64;
            self.write_all(&buf[..n]).await?;
        }
    }

    /// Sends eof (idempotent). Bytes written before are delivered first.
    pub fn close(&mut self) {
        if !self.closed {
            self.closed = true;
            let _ = self
                .client
                .shared()
                .out
                .send(Frame::eof(self.id, channel::INPUT));
        }
    }
}

impl Drop for DataWriter {
    fn drop(&mut self) {
        self.close();
    }
}

impl AsyncWrite for DataWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Err(broken()));
        }
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let Some(n) = ready!(this.window.poll_reserve(cx, buf.len().min(this.chunk))) else {
            return Poll::Ready(Err(broken()));
        };
        let frame = Frame::data(this.id, channel::INPUT, Bytes::copy_from_slice(&buf[..n]));
        if this.client.shared().out.send(frame).is_err() {
            return Poll::Ready(Err(broken()));
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        self.get_mut().close();
        Poll::Ready(Ok(()))
    }
}
