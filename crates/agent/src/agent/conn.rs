//! One connection: handshake, frame dispatch, stream table, teardown.
//!
//! The reader loop never blocks on a stream: inbound data is bounded by the window we
//! granted and queued to the stream's task; outbound frames go through one ordered queue
//! whose data share is bounded by the windows the host granted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::{mpsc, watch};

use super::background::Background;
use super::{AgentError, AgentShared, Served, lock};
use crate::flow::{RecvWindow, SendWindow};
use crate::frame::{
    CONNECTION_STREAM, DATA_CHUNK, Frame, FrameKind, FrameReader, ProtocolError, channel,
    write_loop,
};
use crate::message::{
    ErrorKind, Event, HELLO_MAGIC, Hello, PROTOCOL_MAX, PROTOCOL_MIN, RemoteError, Request, Role,
    StreamControl,
};

/// What the reader hands a stream task.
#[derive(Debug)]
pub(crate) enum Inbound {
    Data(Bytes),
    Eof,
    Control(StreamControl),
}

#[derive(Debug)]
struct StreamEntry {
    inbound: mpsc::UnboundedSender<Inbound>,
    send: [Arc<SendWindow>; channel::COUNT],
    recv: Arc<RecvWindow>,
    task: Option<tokio::task::AbortHandle>,
}

impl StreamEntry {
    fn shut(self) {
        if let Some(t) = &self.task {
            t.abort();
        }
        for w in &self.send {
            w.close();
        }
    }
}

#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) id: u64,
    pub(crate) agent: Arc<AgentShared>,
    out: mpsc::UnboundedSender<Frame>,
    streams: Mutex<HashMap<u32, StreamEntry>>,
    peer_window: u32,
    peer_chunk: usize,
    pub(crate) peer_max_frame: u32,
    pub(crate) background: Mutex<HashMap<String, Arc<Background>>>,
    pub(crate) next_background: AtomicU64,
    /// Set once a detach reply is queued: the read loop ends at its next wait.
    detach: tokio::sync::Notify,
}

pub(crate) async fn serve<T>(agent: Arc<AgentShared>, id: u64, io: T) -> Result<Served, AgentError>
where
    T: AsyncRead + AsyncWrite + Send + 'static,
{
    let (rd, wr) = tokio::io::split(io);
    let (out, out_rx) = mpsc::unbounded_channel();
    let writer = tokio::spawn(write_loop(wr, out_rx));
    let hello = Hello {
        magic: HELLO_MAGIC.into(),
        role: Role::Agent,
        min_version: PROTOCOL_MIN,
        max_version: PROTOCOL_MAX,
        software: crate::SOFTWARE.into(),
        max_frame: agent.config.max_frame,
        initial_window: agent.config.window,
        ops: Request::OPS
            .iter()
            .chain(Request::FEATURES)
            .map(|s| (*s).to_owned())
            .collect(),
        pid: Some(crate::sys::getpid()),
    };
    // Sent before reading anything: the hello is the readiness signal.
    let _ = out.send(Frame::json(CONNECTION_STREAM, FrameKind::Hello, &hello));

    let mut reader = FrameReader::new(rd, agent.config.max_frame);
    let result = match handshake(&mut reader, &hello).await {
        Ok(peer) => {
            let conn = Arc::new(Conn {
                id,
                agent: agent.clone(),
                out: out.clone(),
                streams: Mutex::new(HashMap::new()),
                peer_window: peer.initial_window,
                peer_chunk: DATA_CHUNK.min(peer.max_frame as usize).max(1),
                peer_max_frame: peer.max_frame,
                background: Mutex::new(HashMap::new()),
                next_background: AtomicU64::new(1),
                detach: tokio::sync::Notify::new(),
            });
            let r = read_loop(&conn, &mut reader).await;
            conn.teardown(r.as_ref().is_ok_and(|s| *s == Served::Detached));
            r
        }
        Err(e) => Err(e),
    };
    if result.as_ref().is_ok_and(|s| *s == Served::Detached) {
        // The queued replies (the detach's `ok` last) are flushed and nothing after them
        // (`run_stream` queued the end of writes right behind the `ok`).
        drop(out);
        let _ = tokio::time::timeout(Duration::from_secs(2), writer).await;
        return Ok(Served::Detached);
    }
    agent.kill_conn_groups(id);

    let reason = match &result {
        Ok(_) => RemoteError::new(ErrorKind::Io, "connection closed by peer"),
        Err(e) => goaway_for(e),
    };
    if let Err(e) = &result {
        tracing::warn!(error = %e, "agent connection failed");
    }
    let _ = out.send(Frame::json(CONNECTION_STREAM, FrameKind::Goaway, &reason));
    drop(out);
    // The peer may have stopped reading; do not wait for it forever.
    if tokio::time::timeout(Duration::from_secs(2), writer)
        .await
        .is_err()
    {
        tracing::debug!("writer did not finish flushing the goaway");
    }
    result.map_err(AgentError::from)
}

fn goaway_for(e: &ProtocolError) -> RemoteError {
    let kind = match e {
        ProtocolError::VersionMismatch { .. } => ErrorKind::VersionMismatch,
        ProtocolError::FrameTooLarge { .. } => ErrorKind::FrameTooLarge,
        ProtocolError::Io(_) => ErrorKind::Io,
        _ => ErrorKind::Protocol,
    };
    let mut message = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        message.push_str(": ");
        message.push_str(&s.to_string());
        src = s.source();
    }
    RemoteError::new(kind, message)
}

async fn handshake<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
    ours: &Hello,
) -> Result<Hello, ProtocolError> {
    reader.read_preamble().await?;
    let Some(first) = reader.next_frame().await? else {
        return Err(ProtocolError::Truncated);
    };
    if first.kind != FrameKind::Hello || first.stream != CONNECTION_STREAM {
        return Err(ProtocolError::Unexpected(format!(
            "first frame must be a hello on stream 0, got {:?} on stream {}",
            first.kind, first.stream
        )));
    }
    let peer: Hello = first.decode_json("hello")?;
    if peer.magic != HELLO_MAGIC || peer.role != Role::Client {
        return Err(ProtocolError::Unexpected(format!(
            "hello from a {:?} with magic {:?}; expected a client",
            peer.role, peer.magic
        )));
    }
    if ours.negotiate(&peer).is_none() {
        return Err(ProtocolError::VersionMismatch {
            ours_min: ours.min_version,
            ours_max: ours.max_version,
            theirs_min: peer.min_version,
            theirs_max: peer.max_version,
        });
    }
    Ok(peer)
}

async fn read_loop<R: AsyncRead + Unpin>(
    conn: &Arc<Conn>,
    reader: &mut FrameReader<R>,
) -> Result<Served, ProtocolError> {
    loop {
        // A host that detached sends nothing more, so no frame is cut by ending here.
        let header = tokio::select! {
            biased;
            () = conn.detach.notified() => return Ok(Served::Detached),
            h = reader.read_header() => h?,
        };
        let Some(header) = header else {
            return Ok(Served::Closed);
        };
        let kind =
            FrameKind::from_u8(header.kind).ok_or(ProtocolError::UnknownKind(header.kind))?;
        if let Err(e) = reader.check_len(&header) {
            // The header is intact: if it names a stream we can fail just that stream,
            // skip the body without buffering it, and keep the connection.
            let stream_level = header.stream != CONNECTION_STREAM
                && match kind {
                    FrameKind::Open => !conn.has_stream(header.stream),
                    FrameKind::Data | FrameKind::Control => conn.has_stream(header.stream),
                    _ => false,
                };
            if !stream_level {
                return Err(e);
            }
            reader.skip_body(header.len).await?;
            let err = RemoteError::new(ErrorKind::FrameTooLarge, e.to_string());
            if kind == FrameKind::Open {
                conn.send_event(header.stream, &Event::Error(err));
            } else {
                conn.reset(header.stream, err);
            }
            continue;
        }
        let body = reader.read_body(&header).await?;
        conn.dispatch(Frame {
            stream: header.stream,
            kind,
            flags: header.flags,
            body,
        })?;
    }
}

impl Conn {
    fn has_stream(&self, id: u32) -> bool {
        lock(&self.streams).contains_key(&id)
    }

    /// Sends an event; a reply too large for the host's frame limit is replaced by a
    /// terminal `frame_too_large` error rather than breaking the host's framing.
    fn send_event(&self, id: u32, ev: &Event) {
        let mut frame = Frame::json(id, FrameKind::Control, ev);
        if frame.body.len() > self.peer_max_frame as usize {
            let err = RemoteError::new(
                ErrorKind::FrameTooLarge,
                format!(
                    "reply of {} bytes exceeds the client's maximum frame of {} bytes",
                    frame.body.len(),
                    self.peer_max_frame
                ),
            );
            frame = Frame::json(id, FrameKind::Control, &Event::Error(err));
        }
        let _ = self.out.send(frame);
    }

    /// Ends a stream with an error: its task is aborted (guards kill its processes and
    /// remove partial files) and the host gets one terminal error event.
    fn reset(&self, id: u32, err: RemoteError) {
        let entry = lock(&self.streams).remove(&id);
        if let Some(entry) = entry {
            entry.shut();
            self.send_event(id, &Event::Error(err));
        }
    }

    /// Routes one frame to the handler of its kind. Only connection-level faults are
    /// errors (they end the connection); a stream's faults reset that stream.
    fn dispatch(self: &Arc<Self>, frame: Frame) -> Result<(), ProtocolError> {
        match frame.kind {
            FrameKind::Hello => Err(ProtocolError::Unexpected("second hello".into())),
            FrameKind::Goaway => Err(on_goaway(&frame)),
            _ if frame.stream == CONNECTION_STREAM => Err(ProtocolError::Unexpected(format!(
                "{:?} frame on stream 0",
                frame.kind
            ))),
            FrameKind::Open => self.on_open(frame),
            FrameKind::Control => {
                self.on_control(frame);
                Ok(())
            }
            FrameKind::Data => {
                self.on_data(frame);
                Ok(())
            }
            FrameKind::Eof => {
                if frame.flags == channel::INPUT {
                    self.to_stream(frame.stream, Inbound::Eof);
                }
                Ok(())
            }
            FrameKind::Window => {
                self.on_window(&frame);
                Ok(())
            }
        }
    }

    /// A request on a new stream; reopening a live stream ends the connection.
    fn on_open(self: &Arc<Self>, frame: Frame) -> Result<(), ProtocolError> {
        let id = frame.stream;
        if self.has_stream(id) {
            return Err(ProtocolError::Unexpected(format!(
                "stream {id} is already open"
            )));
        }
        match parse_request(&frame) {
            Ok(req) => self.open(id, req),
            Err(err) => self.send_event(id, &Event::Error(err)),
        }
        Ok(())
    }

    /// A control message for a stream: cancel ends it here, the rest go to its task.
    fn on_control(&self, frame: Frame) {
        let id = frame.stream;
        if !self.has_stream(id) {
            return; // raced with the stream's end
        }
        match frame.decode_json::<StreamControl>("stream control") {
            Ok(StreamControl::Cancel) => {
                if let Some(entry) = lock(&self.streams).remove(&id) {
                    entry.shut();
                }
            }
            Ok(ctl) => self.to_stream(id, Inbound::Control(ctl)),
            Err(e) => self.reset(
                id,
                RemoteError::new(ErrorKind::InvalidRequest, e.to_string()),
            ),
        }
    }

    /// Input bytes for a stream, within its receive window and on channel 0 only.
    fn on_data(&self, frame: Frame) {
        let id = frame.stream;
        let verdict = {
            let streams = lock(&self.streams);
            match streams.get(&id) {
                None => return,
                Some(_) if frame.flags != channel::INPUT => Err(format!(
                    "data on channel {} of stream {id}; the host may only send on channel 0",
                    frame.flags
                )),
                Some(e) if !e.recv.on_data(frame.body.len()) => Err(ProtocolError::FlowControl {
                    stream: id,
                    channel: frame.flags,
                }
                .to_string()),
                Some(e) => {
                    let _ = e.inbound.send(Inbound::Data(frame.body));
                    Ok(())
                }
            }
        };
        if let Err(msg) = verdict {
            self.reset(id, RemoteError::new(ErrorKind::Protocol, msg));
        }
    }

    /// Send credit for one of a stream's output channels.
    fn on_window(&self, frame: &Frame) {
        let id = frame.stream;
        let verdict = match frame.window_increment() {
            Ok(inc) => {
                let streams = lock(&self.streams);
                match streams.get(&id) {
                    None => Ok(()),
                    Some(e) => match e.send.get(usize::from(frame.flags)) {
                        Some(w) if w.grant(inc) => Ok(()),
                        Some(_) => Err("window grown past 2^32-1".to_owned()),
                        None => Err(format!("window for unknown channel {}", frame.flags)),
                    },
                }
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(msg) = verdict {
            self.reset(id, RemoteError::new(ErrorKind::Protocol, msg));
        }
    }

    fn to_stream(&self, id: u32, msg: Inbound) {
        if let Some(e) = lock(&self.streams).get(&id) {
            let _ = e.inbound.send(msg);
        }
    }

    fn open(self: &Arc<Self>, id: u32, req: Request) {
        let (tx, rx) = mpsc::unbounded_channel();
        let send = std::array::from_fn(|_| Arc::new(SendWindow::new(self.peer_window)));
        let recv = Arc::new(RecvWindow::new(self.agent.config.window));
        let io = StreamIo {
            id,
            conn: self.clone(),
            inbound: rx,
            send: send.clone(),
            recv: recv.clone(),
        };
        // Insert and spawn under the lock so the task cannot finish (and remove itself)
        // before its entry exists.
        let mut streams = lock(&self.streams);
        let task = tokio::spawn(run_stream(io, req));
        streams.insert(
            id,
            StreamEntry {
                inbound: tx,
                send,
                recv,
                task: Some(task.abort_handle()),
            },
        );
    }

    /// Every open stream's windows discard what its process writes (a detach).
    fn discard_streams(&self) {
        for e in lock(&self.streams).values() {
            for w in &e.send {
                w.discard();
            }
        }
    }

    /// Ends the connection's streams. After a detach their processes run on: each stream
    /// task goes on (draining its process's output into windows that discard it) until the
    /// process ends; the background processes are kept by the agent (ended ones dropped as
    /// others come).
    fn teardown(&self, detached: bool) {
        if detached {
            self.discard_streams();
        }
        let entries: Vec<StreamEntry> = lock(&self.streams).drain().map(|(_, e)| e).collect();
        for e in entries {
            if !detached {
                e.shut();
            }
        }
        let background: Vec<_> = lock(&self.background).drain().map(|(_, b)| b).collect();
        if detached {
            let mut kept = lock(&self.agent.detached_background);
            kept.retain(|b| !b.ended());
            kept.extend(background);
        }
    }
}

/// The host ends the connection, saying why.
fn on_goaway(frame: &Frame) -> ProtocolError {
    let why: RemoteError = frame
        .decode_json("goaway")
        .unwrap_or_else(|_| RemoteError::new(ErrorKind::Protocol, "(unreadable)"));
    ProtocolError::Goaway(why.message)
}

fn parse_request(frame: &Frame) -> Result<Request, RemoteError> {
    let value: serde_json::Value = serde_json::from_slice(&frame.body).map_err(|e| {
        RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("malformed request body: {e}"),
        )
    })?;
    let op = value
        .get("op")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_owned();
    serde_json::from_value(value).map_err(|e| {
        if Request::OPS.contains(&op.as_str()) {
            RemoteError::new(
                ErrorKind::InvalidRequest,
                format!("invalid `{op}` request: {e}"),
            )
        } else {
            RemoteError::new(
                ErrorKind::Unsupported,
                format!("unsupported operation `{op}`"),
            )
        }
    })
}

async fn run_stream(mut io: StreamIo, req: Request) {
    let detach = matches!(req, Request::Detach);
    let result = super::dispatch_request(&mut io, req).await;
    let ev = match result {
        Ok(ev) => ev,
        Err(err) => Event::Error(err),
    };
    io.finish(ev);
    if detach {
        // Right behind the reply, with no await between (nothing else is queued in between
        // on the gvisor init's one-thread runtime): the writer writes the `ok` and nothing
        // more. A byte written after it could be caught by a checkpoint and reach the next
        // connection (a restored init's first bytes were once a stale frame).
        // The processes of the connection's streams run on, their output dropped from now
        // on (never queued behind the end, where a failed send would cut their pipes).
        io.conn.discard_streams();
        let _ = io.conn.out.send(Frame::end_of_writes());
        io.conn.detach.notify_one();
    }
}

/// A stream task's view of its stream.
#[derive(Debug)]
pub(crate) struct StreamIo {
    pub(crate) id: u32,
    pub(crate) conn: Arc<Conn>,
    pub(crate) inbound: mpsc::UnboundedReceiver<Inbound>,
    send: [Arc<SendWindow>; channel::COUNT],
    recv: Arc<RecvWindow>,
}

impl StreamIo {
    /// A non-terminal event.
    pub(crate) fn event(&self, ev: &Event) {
        self.conn.send_event(self.id, ev);
    }

    /// The terminal event; sent only if the stream was not reset meanwhile.
    fn finish(&self, ev: Event) {
        let entry = lock(&self.conn.streams).remove(&self.id);
        if let Some(entry) = entry {
            for w in &entry.send {
                w.close();
            }
            self.conn.send_event(self.id, &ev);
        }
    }

    pub(crate) fn sender(&self, ch: u8) -> ChannelSender {
        ChannelSender {
            id: self.id,
            channel: ch,
            window: self.send[usize::from(ch)].clone(),
            out: self.conn.out.clone(),
            chunk: self.conn.peer_chunk,
        }
    }

    pub(crate) fn input_credit(&self) -> InputCredit {
        InputCredit {
            id: self.id,
            recv: self.recv.clone(),
            out: self.conn.out.clone(),
        }
    }
}

/// Returns input-channel credit once bytes were consumed (written to a pipe or file).
#[derive(Debug, Clone)]
pub(crate) struct InputCredit {
    id: u32,
    recv: Arc<RecvWindow>,
    out: mpsc::UnboundedSender<Frame>,
}

impl InputCredit {
    pub(crate) fn consumed(&self, n: usize) {
        if let Some(inc) = self.recv.on_consumed(n) {
            let _ = self.out.send(Frame::window(self.id, channel::INPUT, inc));
        }
    }
}

/// Sends one outbound channel's bytes under its window.
#[derive(Debug)]
pub(crate) struct ChannelSender {
    id: u32,
    channel: u8,
    window: Arc<SendWindow>,
    out: mpsc::UnboundedSender<Frame>,
    chunk: usize,
}

/// Why a pump stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PumpEnd {
    /// The source reached EOF; an eof frame was sent.
    Eof,
    /// The process had exited and the source stayed open but silent for the drain
    /// period (a grandchild holds it); an eof frame was sent.
    Abandoned,
    /// The window closed (stream ended); nothing more may be sent.
    Closed,
}

impl ChannelSender {
    pub(crate) fn eof(&self) {
        let _ = self.out.send(Frame::eof(self.id, self.channel));
    }

    /// Sends `bytes` in window-sized chunks. `false` if the window closed.
    pub(crate) async fn send_all(&self, mut bytes: Bytes) -> bool {
        if self.window.discarding() {
            return true;
        }
        while !bytes.is_empty() {
            let Some(n) = self.window.reserve(bytes.len().min(self.chunk)).await else {
                return false;
            };
            let part = bytes.split_to(n);
            if self
                .out
                .send(Frame::data(self.id, self.channel, part))
                .is_err()
            {
                return false;
            }
        }
        true
    }

    /// Copies `src` to this channel until EOF, never reading more than the window
    /// allows (so an unread channel makes the writer block, not the agent buffer).
    /// With `exited`, stops after `drain_idle` of silence once it turns true.
    pub(crate) async fn pump<R: AsyncRead + Unpin>(
        &self,
        src: &mut R,
        mut exited: Option<watch::Receiver<bool>>,
        drain_idle: Duration,
    ) -> std::io::Result<(PumpEnd, u64)> {
        let mut total = 0u64;
        loop {
            let Some(want) = self.window.reserve(self.chunk).await else {
                return Ok((PumpEnd::Closed, total));
            };
            let mut buf = BytesMut::zeroed(want);
            let read = async {
                match exited.as_mut() {
                    None => src.read(&mut buf).await.map(Some),
                    Some(rx) => {
                        tokio::select! {
                            r = src.read(&mut buf) => r.map(Some),
                            () = idle_after_exit(rx, drain_idle) => Ok(None),
                        }
                    }
                }
            };
            let n = match read.await {
                Ok(Some(n)) => n,
                Ok(None) => {
                    self.window.refund(want);
                    self.eof();
                    return Ok((PumpEnd::Abandoned, total));
                }
                Err(e) => {
                    self.window.refund(want);
                    return Err(e);
                }
            };
            self.window.refund(want - n);
            if n == 0 {
                self.eof();
                return Ok((PumpEnd::Eof, total));
            }
            buf.truncate(n);
            total += n as u64;
            if self.window.discarding() {
                continue;
            }
            if self
                .out
                .send(Frame::data(self.id, self.channel, buf.freeze()))
                .is_err()
            {
                return Ok((PumpEnd::Closed, total));
            }
        }
    }
}

async fn idle_after_exit(rx: &mut watch::Receiver<bool>, idle: Duration) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
    tokio::time::sleep(idle).await;
}

pub(crate) fn next_id(counter: &AtomicU64) -> u64 {
    counter.fetch_add(1, Ordering::Relaxed)
}
