//! Framing: the one binary layout every byte on the wire has.
//!
//! ```text
//! preamble (once per direction): b"OMABOX\r\n"
//! frame: [u32 BE body length][u32 BE stream id][u8 kind][u8 flags][body ...]
//! ```
//!
//! The length is checked against the receiver's maximum *before* anything is
//! allocated; a reader never grows a buffer to a size the peer declared.

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Written once by each side before its first frame. Never changes: the
/// version lives in the hello, so a peer that is not an omabox agent (or a
/// byte stream that is not a protocol stream at all) is recognised at once.
pub const PREAMBLE: &[u8; 8] = b"OMABOX\r\n";

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 10;

/// Largest body either side accepts by default (1 MiB).
pub const MAX_FRAME_BODY: u32 = 1 << 20;

/// Largest data chunk a sender puts in one data frame.
pub const DATA_CHUNK: usize = 64 * 1024;

/// Stream id 0 is the connection itself (hello, goaway).
pub const CONNECTION_STREAM: u32 = 0;

/// What a frame carries. Append-only: a value, once assigned, never changes meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// JSON [`crate::message::Hello`] on stream 0; first frame each way.
    Hello = 1,
    /// JSON [`crate::message::Request`], host → agent: opens a new stream.
    Open = 2,
    /// JSON control message on an open stream: an [`crate::message::Event`]
    /// (agent → host) or a [`crate::message::StreamControl`] (host → agent).
    Control = 3,
    /// Raw bytes for the channel in `flags`. Consumes send window.
    Data = 4,
    /// End of the channel in `flags` (half-close). Consumes no window.
    Eof = 5,
    /// Body is a u32 BE window increment for the channel in `flags`.
    Window = 6,
    /// JSON [`crate::message::RemoteError`] on stream 0: the sender is about to
    /// close the connection, and says why.
    Goaway = 7,
}

impl FrameKind {
    /// The kind for a raw byte, or `None` if it is not one we know.
    pub fn from_u8(raw: u8) -> Option<Self> {
        Some(match raw {
            1 => Self::Hello,
            2 => Self::Open,
            3 => Self::Control,
            4 => Self::Data,
            5 => Self::Eof,
            6 => Self::Window,
            7 => Self::Goaway,
            _ => return None,
        })
    }
}

/// Channel numbers carried in `flags` of data, eof and window frames.
pub mod channel {
    /// Host → agent bytes: process stdin, file content, tar archive in.
    pub const INPUT: u8 = 0;
    /// Agent → host bytes: process stdout, file content, tar archive out.
    pub const STDOUT: u8 = 1;
    /// Agent → host: process stderr.
    pub const STDERR: u8 = 2;
    /// Number of channels per stream.
    pub const COUNT: usize = 3;
}

/// Framing errors: the stream of bytes is not (or no longer) a valid protocol stream.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// reading or writing the transport failed
    #[error("transport i/o failed")]
    Io(#[from] std::io::Error),
    /// The peer did not start with the omabox preamble.
    #[error("peer is not speaking the omabox agent protocol (bad preamble {got:02x?})")]
    BadPreamble {
        /// The bytes that arrived instead.
        got: [u8; 8],
    },
    /// The connection ended in the middle of a frame.
    #[error("connection closed in the middle of a frame")]
    Truncated,
    /// A frame declared a body larger than the receiver accepts.
    #[error("frame of {len} bytes on stream {stream} exceeds the maximum of {max}")]
    FrameTooLarge {
        /// Declared body length.
        len: u32,
        /// Receiver's maximum.
        max: u32,
        /// Stream the frame was for.
        stream: u32,
    },
    /// A frame kind this side does not know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A frame that is valid on its own arrived where it makes no sense.
    #[error("unexpected frame: {0}")]
    Unexpected(String),
    /// A JSON body did not decode.
    #[error("malformed {what} body")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The hello exchange found no protocol version both sides speak.
    #[error(
        "protocol version mismatch: we speak {ours_min}..={ours_max}, peer speaks {theirs_min}..={theirs_max}"
    )]
    VersionMismatch {
        /// Our lowest version.
        ours_min: u16,
        /// Our highest version.
        ours_max: u16,
        /// Peer's lowest version.
        theirs_min: u16,
        /// Peer's highest version.
        theirs_max: u16,
    },
    /// The peer sent more data than the window it was granted.
    #[error("flow control violated on stream {stream} channel {channel}")]
    FlowControl {
        /// Stream id.
        stream: u32,
        /// Channel.
        channel: u8,
    },
    /// The peer closed the connection and said why.
    #[error("peer closed the connection: {0}")]
    Goaway(String),
}

/// One frame.
#[derive(Debug, Clone)]
pub struct Frame {
    /// Stream id (0 = connection).
    pub stream: u32,
    /// Kind.
    pub kind: FrameKind,
    /// Kind-specific flags (the channel for data/eof/window).
    pub flags: u8,
    /// Body.
    pub body: Bytes,
}

impl Frame {
    /// Not a frame for the wire: queued to [`write_loop`], it ends the loop after the
    /// frames queued before it and is not written itself (a detach: nothing may follow the
    /// reply, or a checkpoint could carry it to the next connection). An empty goaway on
    /// the connection stream; a goaway that is sent always has a body.
    pub fn end_of_writes() -> Self {
        Self {
            stream: 0,
            kind: FrameKind::Goaway,
            flags: 0,
            body: Bytes::new(),
        }
    }

    fn is_end_of_writes(&self) -> bool {
        self.stream == 0 && self.kind == FrameKind::Goaway && self.body.is_empty()
    }

    /// A frame with a JSON body.
    pub fn json<T: serde::Serialize>(stream: u32, kind: FrameKind, value: &T) -> Self {
        // Serializing our own message types cannot fail (no maps with non-string keys,
        // no failing Serialize impls); fall back to an empty object rather than panic.
        let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
        Self {
            stream,
            kind,
            flags: 0,
            body: Bytes::from(body),
        }
    }

    /// A data frame.
    pub fn data(stream: u32, channel: u8, body: Bytes) -> Self {
        Self {
            stream,
            kind: FrameKind::Data,
            flags: channel,
            body,
        }
    }

    /// An end-of-channel frame.
    pub fn eof(stream: u32, channel: u8) -> Self {
        Self {
            stream,
            kind: FrameKind::Eof,
            flags: channel,
            body: Bytes::new(),
        }
    }

    /// A window increment.
    pub fn window(stream: u32, channel: u8, increment: u32) -> Self {
        Self {
            stream,
            kind: FrameKind::Window,
            flags: channel,
            body: Bytes::copy_from_slice(&increment.to_be_bytes()),
        }
    }

    /// Decodes a JSON body.
    pub fn decode_json<T: serde::de::DeserializeOwned>(
        &self,
        what: &'static str,
    ) -> Result<T, ProtocolError> {
        serde_json::from_slice(&self.body)
            .map_err(|source| ProtocolError::Malformed { what, source })
    }

    /// Decodes a window frame's increment.
    pub fn window_increment(&self) -> Result<u32, ProtocolError> {
        let raw: [u8; 4] = self.body.as_ref().try_into().map_err(|_| {
            ProtocolError::Unexpected(format!(
                "window frame with a {}-byte body (want 4)",
                self.body.len()
            ))
        })?;
        Ok(u32::from_be_bytes(raw))
    }

    /// Appends the encoded frame to `out`. Bodies larger than u32::MAX cannot be built by
    /// this crate (all senders chunk), so the length cast is checked and clamped.
    pub fn encode(&self, out: &mut BytesMut) {
        let len = u32::try_from(self.body.len()).unwrap_or(u32::MAX);
        out.reserve(HEADER_LEN + self.body.len());
        out.put_u32(len);
        out.put_u32(self.stream);
        out.put_u8(self.kind as u8);
        out.put_u8(self.flags);
        out.extend_from_slice(&self.body);
    }
}

/// A decoded header whose body has not been read yet.
#[derive(Debug, Clone, Copy)]
pub struct Header {
    /// Declared body length.
    pub len: u32,
    /// Stream id.
    pub stream: u32,
    /// Raw kind byte.
    pub kind: u8,
    /// Flags.
    pub flags: u8,
}

/// Bytes of a [`FrameReader`]'s buffer. Held for the connection's whole life, idle or not
/// (a host holds one connection per sandbox), so it is small: bodies longer than it are
/// read straight into their own buffer (tokio's `BufReader` bypasses its buffer for them),
/// and a pipe hands over at most 64 KiB a read anyway.
const READ_BUFFER: usize = 16 * 1024;
/// What [`write_loop`]'s buffer starts at; it grows with a burst of frames.
const WRITE_BUFFER: usize = 16 * 1024;
/// A [`write_loop`] buffer grown past [`WRITE_BUFFER`] is given back after this long with
/// nothing to write, so an idle connection holds no burst's buffer.
const WRITE_IDLE: std::time::Duration = std::time::Duration::from_secs(1);

/// Reads frames from a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: BufReader<R>,
    max_body: u32,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// Wraps a reader. `max_body` is the largest body accepted.
    pub fn new(inner: R, max_body: u32) -> Self {
        Self {
            inner: BufReader::with_capacity(READ_BUFFER, inner),
            max_body,
        }
    }

    /// Reads and checks the peer's preamble.
    pub async fn read_preamble(&mut self) -> Result<(), ProtocolError> {
        let mut got = [0u8; 8];
        match self.inner.read_exact(&mut got).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ProtocolError::Truncated);
            }
            Err(e) => return Err(e.into()),
        }
        if &got != PREAMBLE {
            return Err(ProtocolError::BadPreamble { got });
        }
        Ok(())
    }

    /// Reads the next header. `Ok(None)` is a clean end of stream at a frame boundary.
    pub async fn read_header(&mut self) -> Result<Option<Header>, ProtocolError> {
        let mut raw = [0u8; HEADER_LEN];
        let mut filled = 0;
        while filled < HEADER_LEN {
            let n = self.inner.read(&mut raw[filled..]).await?;
            if n == 0 {
                return if filled == 0 {
                    Ok(None)
                } else {
                    Err(ProtocolError::Truncated)
                };
            }
            filled += n;
        }
        Ok(Some(Header {
            len: u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]),
            stream: u32::from_be_bytes([raw[4], raw[5], raw[6], raw[7]]),
            kind: raw[8],
            flags: raw[9],
        }))
    }

    /// Whether a header's declared length is acceptable.
    pub fn check_len(&self, header: &Header) -> Result<(), ProtocolError> {
        if header.len > self.max_body {
            return Err(ProtocolError::FrameTooLarge {
                len: header.len,
                max: self.max_body,
                stream: header.stream,
            });
        }
        Ok(())
    }

    /// Reads a body whose length has been checked.
    pub async fn read_body(&mut self, header: &Header) -> Result<Bytes, ProtocolError> {
        self.check_len(header)?;
        let mut body = BytesMut::zeroed(header.len as usize);
        match self.inner.read_exact(&mut body).await {
            Ok(_) => Ok(body.freeze()),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                Err(ProtocolError::Truncated)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Reads and throws away `len` body bytes without buffering them, so an oversized
    /// frame on a known stream can be dropped while the connection survives.
    pub async fn skip_body(&mut self, len: u32) -> Result<(), ProtocolError> {
        let mut limited = (&mut self.inner).take(u64::from(len));
        let skipped = tokio::io::copy(&mut limited, &mut tokio::io::sink()).await?;
        if skipped != u64::from(len) {
            return Err(ProtocolError::Truncated);
        }
        Ok(())
    }

    /// Reads one whole frame; oversized and unknown-kind frames are errors.
    pub async fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let Some(header) = self.read_header().await? else {
            return Ok(None);
        };
        let kind =
            FrameKind::from_u8(header.kind).ok_or(ProtocolError::UnknownKind(header.kind))?;
        let body = self.read_body(&header).await?;
        Ok(Some(Frame {
            stream: header.stream,
            kind,
            flags: header.flags,
            body,
        }))
    }
}

/// Writes the preamble and then every frame from `rx` in order, batching frames that are
/// already queued into one write. Ends after a goaway frame, at [`Frame::end_of_writes`]
/// (not written), when every sender is gone, or when the transport fails.
pub async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Frame>,
) -> Result<(), ProtocolError> {
    let mut buf = BytesMut::with_capacity(WRITE_BUFFER);
    buf.extend_from_slice(PREAMBLE);
    let mut done = false;
    while !done {
        if buf.is_empty() {
            let next = if buf.capacity() > WRITE_BUFFER {
                match tokio::time::timeout(WRITE_IDLE, rx.recv()).await {
                    Ok(next) => next,
                    Err(_) => {
                        buf = BytesMut::with_capacity(WRITE_BUFFER);
                        rx.recv().await
                    }
                }
            } else {
                rx.recv().await
            };
            match next {
                Some(frame) if frame.is_end_of_writes() => break,
                Some(frame) => {
                    done = frame.kind == FrameKind::Goaway;
                    frame.encode(&mut buf);
                }
                None => break,
            }
        }
        while !done && buf.len() < 512 * 1024 {
            match rx.try_recv() {
                Ok(frame) if frame.is_end_of_writes() => {
                    done = true;
                }
                Ok(frame) => {
                    done = frame.kind == FrameKind::Goaway;
                    frame.encode(&mut buf);
                }
                Err(_) => break,
            }
        }
        writer.write_all(&buf).await?;
        writer.flush().await?;
        buf.clear();
    }
    let _ = writer.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What follows the end of writes is never written, even when already queued (a
    /// detach's reply is the last thing a checkpointed agent writes).
    #[tokio::test]
    async fn the_end_of_writes_ends_the_loop_and_is_not_written() {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let before = Frame::data(3, channel::STDOUT, Bytes::from_static(b"before"));
        let after = Frame::data(3, channel::STDOUT, Bytes::from_static(b"after"));
        tx.send(before.clone()).unwrap();
        tx.send(Frame::end_of_writes()).unwrap();
        tx.send(after).unwrap();
        let mut written = Vec::new();
        // The loop ends though `tx` is alive.
        write_loop(&mut written, rx).await.unwrap();
        let mut expected = BytesMut::new();
        expected.extend_from_slice(PREAMBLE);
        before.encode(&mut expected);
        assert_eq!(written, expected.to_vec());
    }

    #[tokio::test]
    async fn round_trip_and_limits() {
        let mut buf = BytesMut::new();
        Frame::data(7, channel::STDOUT, Bytes::from_static(b"\x00\xffhi")).encode(&mut buf);
        Frame::window(7, channel::STDOUT, 42).encode(&mut buf);
        let mut r = FrameReader::new(&buf[..], 16);
        let f = r.next_frame().await.unwrap().unwrap();
        assert_eq!((f.stream, f.kind, f.flags), (7, FrameKind::Data, 1));
        assert_eq!(&f.body[..], b"\x00\xffhi");
        let w = r.next_frame().await.unwrap().unwrap();
        assert_eq!(w.window_increment().unwrap(), 42);
        assert!(r.next_frame().await.unwrap().is_none());

        // Oversized length: refused before allocating.
        let mut big = BytesMut::new();
        big.put_u32(u32::MAX);
        big.put_u32(1);
        big.put_u8(4);
        big.put_u8(0);
        let mut r = FrameReader::new(&big[..], 16);
        let e = r.next_frame().await.unwrap_err();
        assert!(
            matches!(e, ProtocolError::FrameTooLarge { len: u32::MAX, .. }),
            "{e}"
        );

        // Truncated header and body.
        let mut r = FrameReader::new(&buf[..5], 16);
        assert!(matches!(
            r.next_frame().await,
            Err(ProtocolError::Truncated)
        ));
        let mut r = FrameReader::new(&buf[..12], 16);
        assert!(matches!(
            r.next_frame().await,
            Err(ProtocolError::Truncated)
        ));

        // Unknown kind.
        let mut bad = BytesMut::new();
        bad.put_u32(0);
        bad.put_u32(1);
        bad.put_u8(200);
        bad.put_u8(0);
        let mut r = FrameReader::new(&bad[..], 16);
        assert!(matches!(
            r.next_frame().await,
            Err(ProtocolError::UnknownKind(200))
        ));
    }
}
