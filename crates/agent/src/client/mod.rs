//! The host side: [`AgentClient`] over any byte stream to an agent.
//!
//! One reader task demultiplexes frames into per-stream, per-channel queues (bounded by
//! the windows we granted) and never waits on a consumer; one writer task sends frames
//! in order. Credit is returned as consumers take bytes, so an unread stream stalls only
//! its own process.

pub mod exec_output;
mod files;
mod process;
mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;

pub use files::{DirWatch, FileReader, MAX_WHOLE_READ, WriteOptions};
pub use process::{
    BackgroundProcess, DEFAULT_MAX_EXEC_OUTPUT, DuplexProcess, ExecOutput, ExecRequest,
    ProcessKiller,
};
pub use stream::{DataReader, DataWriter};

use crate::flow::{DEFAULT_WINDOW, RecvWindow, SendWindow};
use crate::frame::{
    CONNECTION_STREAM, DATA_CHUNK, Frame, FrameKind, FrameReader, MAX_FRAME_BODY, ProtocolError,
    channel, write_loop,
};
use crate::message::{
    ErrorKind, Event, HELLO_MAGIC, Hello, PROTOCOL_MAX, PROTOCOL_MIN, Pong, RemoteError, Request,
    Role,
};

/// Errors of host-side calls.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The byte stream did not carry a valid agent handshake.
    #[error("handshake with the agent failed")]
    Handshake(#[source] ProtocolError),
    /// Client and agent share no protocol version.
    #[error(
        "protocol version mismatch: client speaks {ours_min}..={ours_max}, agent {software} speaks {theirs_min}..={theirs_max}"
    )]
    VersionMismatch {
        /// Client's lowest version.
        ours_min: u16,
        /// Client's highest version.
        ours_max: u16,
        /// Agent's lowest version.
        theirs_min: u16,
        /// Agent's highest version.
        theirs_max: u16,
        /// Agent software string.
        software: String,
    },
    /// The agent closed the connection during the handshake, saying why.
    #[error("agent refused the connection: {0}")]
    Rejected(RemoteError),
    /// The connection is gone (agent exited, transport failed, protocol broken).
    #[error("connection to the agent lost: {reason}")]
    ConnectionLost {
        /// Why.
        reason: String,
    },
    /// The agent reported an error for this operation.
    #[error("agent error ({:?}): {}", .0.kind, .0.message)]
    Remote(RemoteError),
    /// No reply within the call deadline.
    #[error("no reply from the agent within {0:?}")]
    Timeout(Duration),
    /// The agent replied with something this operation does not expect.
    #[error("unexpected reply from the agent: {0}")]
    UnexpectedReply(String),
    /// A file read as text was not UTF-8.
    #[error("{path} is not valid UTF-8")]
    NotUtf8 {
        /// Path.
        path: String,
    },
    /// A whole read would hold more than its cap in host memory.
    #[error("{what} is larger than {limit} bytes; stream it instead")]
    TooLarge {
        /// What was read (a sandbox path, or an archive of one).
        what: String,
        /// The cap.
        limit: usize,
    },
    /// A terminal size out of 1..=1000 columns or rows.
    #[error("terminal size {cols}x{rows} (columns x rows) is out of range: each must be 1..=1000")]
    InvalidPtySize {
        /// Columns asked for.
        cols: u16,
        /// Rows asked for.
        rows: u16,
    },
    /// The agent does not announce a feature this call needs (an older agent).
    #[error("the agent ({software}) does not support `{feature}`")]
    Unsupported {
        /// The feature, as the agent's hello would list it.
        feature: String,
        /// Agent software string.
        software: String,
    },
    /// A signal name the agent would not know.
    #[error("unknown signal `{0}`")]
    UnknownSignal(String),
    /// Local I/O (e.g. reading an upload source) failed.
    #[error("local i/o failed")]
    Io(#[from] std::io::Error),
}

impl ClientError {
    /// The agent's error category, when the agent reported the error.
    pub fn remote_kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Remote(e) | Self::Rejected(e) => Some(e.kind),
            _ => None,
        }
    }
}

/// Client settings.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Window granted per agent → host channel.
    pub window: u32,
    /// Largest frame body accepted.
    pub max_frame: u32,
    /// Deadline for the agent's hello.
    pub handshake_timeout: Duration,
    /// Deadline for unary calls (ping, stat, list, env, background ops); `None` = none.
    pub call_timeout: Option<Duration>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            max_frame: MAX_FRAME_BODY,
            handshake_timeout: Duration::from_secs(10),
            call_timeout: Some(Duration::from_secs(60)),
        }
    }
}

pub(crate) enum Chunk {
    Data(Bytes),
    Eof,
}

struct Entry {
    events: mpsc::UnboundedSender<Event>,
    channels: [Option<mpsc::UnboundedSender<Chunk>>; channel::COUNT],
    recv: [Arc<RecvWindow>; channel::COUNT],
    send: [Arc<SendWindow>; channel::COUNT],
    state: Arc<StreamState>,
}

impl Entry {
    fn close_send(&self) {
        for w in &self.send {
            w.close();
        }
    }
}

/// What a stream's consumers learn after its queues close.
#[derive(Debug, Default)]
pub(crate) struct StreamState {
    pub(crate) error: Mutex<Option<RemoteError>>,
}

pub(crate) struct Shared {
    pub(crate) out: mpsc::UnboundedSender<Frame>,
    streams: Mutex<HashMap<u32, Entry>>,
    closed: Mutex<Option<String>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    pub(crate) fn lost(&self) -> ClientError {
        ClientError::ConnectionLost {
            reason: lock(&self.closed)
                .clone()
                .unwrap_or_else(|| "connection closed".into()),
        }
    }

    pub(crate) fn return_credit(&self, id: u32, ch: u8, recv: &RecvWindow, n: usize) {
        if let Some(inc) = recv.on_consumed(n) {
            let _ = self.out.send(Frame::window(id, ch, inc));
        }
    }

    /// Tells the agent to stop a stream whose entry is already gone here.
    fn cancel_remote(&self, id: u32) {
        let _ = self.out.send(Frame::json(
            id,
            FrameKind::Control,
            &crate::message::StreamControl::Cancel,
        ));
    }

    /// Abandons a stream the host no longer cares about.
    pub(crate) fn cancel(&self, id: u32) {
        let entry = lock(&self.streams).remove(&id);
        if let Some(entry) = entry {
            entry.close_send();
            let _ = self.out.send(Frame::json(
                id,
                FrameKind::Control,
                &crate::message::StreamControl::Cancel,
            ));
        }
    }
}

struct Handle {
    shared: Arc<Shared>,
    agent: Hello,
    version: u16,
    config: ClientConfig,
    next_id: AtomicU32,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        // Ends the reader; once the last frame sender is gone the writer shuts the
        // transport down, and the agent kills everything this connection started.
        self.reader.abort();
    }
}

/// A connection to one agent. Cheap to clone; the connection closes when the last clone
/// and every stream handle derived from it are dropped.
#[derive(Clone)]
pub struct AgentClient {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for AgentClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentClient")
            .field("agent", &self.handle.agent.software)
            .field("version", &self.handle.version)
            .finish_non_exhaustive()
    }
}

/// A freshly opened stream.
pub(crate) struct Opened {
    pub(crate) id: u32,
    pub(crate) events: mpsc::UnboundedReceiver<Event>,
    pub(crate) stdout: mpsc::UnboundedReceiver<Chunk>,
    pub(crate) stderr: mpsc::UnboundedReceiver<Chunk>,
    pub(crate) recv: [Arc<RecvWindow>; channel::COUNT],
    pub(crate) input: Arc<SendWindow>,
    pub(crate) state: Arc<StreamState>,
    pub(crate) guard: Arc<stream::StreamGuard>,
}

impl AgentClient {
    /// Connects with default settings.
    pub async fn connect<T>(io: T) -> Result<Self, ClientError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        Self::connect_with(io, ClientConfig::default()).await
    }

    /// Performs the handshake and starts the reader/writer tasks. Fails with a clear
    /// error when the peer is not an agent, refuses us, or shares no protocol version.
    pub async fn connect_with<T>(io: T, config: ClientConfig) -> Result<Self, ClientError>
    where
        T: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (rd, wr) = tokio::io::split(io);
        let (out, out_rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(wr, out_rx));
        let ours = Hello {
            magic: HELLO_MAGIC.into(),
            role: Role::Client,
            min_version: PROTOCOL_MIN,
            max_version: PROTOCOL_MAX,
            software: format!("omabox-agent-client/{}", env!("CARGO_PKG_VERSION")),
            max_frame: config.max_frame,
            initial_window: config.window,
            ops: Vec::new(),
            pid: None,
        };
        let _ = out.send(Frame::json(CONNECTION_STREAM, FrameKind::Hello, &ours));
        let mut reader = FrameReader::new(rd, config.max_frame);
        let agent = tokio::time::timeout(config.handshake_timeout, read_hello(&mut reader))
            .await
            .map_err(|_| ClientError::Timeout(config.handshake_timeout))??;
        let Some(version) = ours.negotiate(&agent) else {
            return Err(ClientError::VersionMismatch {
                ours_min: ours.min_version,
                ours_max: ours.max_version,
                theirs_min: agent.min_version,
                theirs_max: agent.max_version,
                software: agent.software,
            });
        };
        let shared = Arc::new(Shared {
            out,
            streams: Mutex::new(HashMap::new()),
            closed: Mutex::new(None),
        });
        let reader = tokio::spawn(read_loop(shared.clone(), reader));
        Ok(Self {
            handle: Arc::new(Handle {
                shared,
                agent,
                version,
                config,
                next_id: AtomicU32::new(1),
                reader,
            }),
        })
    }

    /// The agent's hello (software, pid, ops, limits).
    pub fn agent_hello(&self) -> &Hello {
        &self.handle.agent
    }

    /// Whether the agent's hello lists `op` (an op or a feature such as `pty`).
    pub fn supports(&self, op: &str) -> bool {
        self.handle.agent.ops.iter().any(|o| o == op)
    }

    /// [`ClientError::Unsupported`] unless [`AgentClient::supports`] `feature`.
    pub(crate) fn require(&self, feature: &str) -> Result<(), ClientError> {
        if self.supports(feature) {
            Ok(())
        } else {
            Err(ClientError::Unsupported {
                feature: feature.to_owned(),
                software: self.handle.agent.software.clone(),
            })
        }
    }

    /// Negotiated protocol version.
    pub fn protocol_version(&self) -> u16 {
        self.handle.version
    }

    /// Why the connection ended, once it has.
    pub fn closed_reason(&self) -> Option<String> {
        lock(&self.handle.shared.closed).clone()
    }

    /// Liveness round trip.
    pub async fn ping(&self) -> Result<Pong, ClientError> {
        self.call(&Request::Ping).await
    }

    /// Ends this connection and nothing it started: once the agent replied, it neither
    /// reads nor writes this stream again and its processes run on (see
    /// [`Request::Detach`]). The client is consumed; reconnect over a new stream to an
    /// agent that serves one (`Agent::serve_detachable` in a loop).
    pub async fn detach(self) -> Result<(), ClientError> {
        self.require("detach")?;
        self.call(&Request::Detach).await
    }

    /// Merges variables into the env of every later exec/spawn (`None` removes).
    pub async fn set_env<I, K, V>(&self, vars: I) -> Result<(), ClientError>
    where
        I: IntoIterator<Item = (K, Option<V>)>,
        K: Into<String>,
        V: Into<String>,
    {
        let vars = vars
            .into_iter()
            .map(|(k, v)| (k.into(), v.map(Into::into)))
            .collect();
        self.call(&Request::SetEnv { vars }).await
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.handle.shared
    }

    pub(crate) fn chunk(&self) -> usize {
        DATA_CHUNK.min(self.handle.agent.max_frame as usize).max(1)
    }

    pub(crate) fn open(&self, req: &Request) -> Result<Opened, ClientError> {
        let shared = &self.handle.shared;
        if lock(&shared.closed).is_some() {
            return Err(shared.lost());
        }
        let id = self.handle.next_id.fetch_add(2, Ordering::Relaxed);
        let (etx, erx) = mpsc::unbounded_channel();
        let (otx, orx) = mpsc::unbounded_channel();
        let (xtx, xrx) = mpsc::unbounded_channel();
        let recv: [Arc<RecvWindow>; channel::COUNT] =
            std::array::from_fn(|_| Arc::new(RecvWindow::new(self.handle.config.window)));
        let send: [Arc<SendWindow>; channel::COUNT] =
            std::array::from_fn(|_| Arc::new(SendWindow::new(self.handle.agent.initial_window)));
        let state = Arc::new(StreamState::default());
        lock(&shared.streams).insert(
            id,
            Entry {
                events: etx,
                channels: [None, Some(otx), Some(xtx)],
                recv: recv.clone(),
                send: send.clone(),
                state: state.clone(),
            },
        );
        if shared
            .out
            .send(Frame::json(id, FrameKind::Open, req))
            .is_err()
        {
            lock(&shared.streams).remove(&id);
            return Err(shared.lost());
        }
        Ok(Opened {
            id,
            events: erx,
            stdout: orx,
            stderr: xrx,
            recv,
            input: send[usize::from(channel::INPUT)].clone(),
            state,
            guard: Arc::new(stream::StreamGuard::new(id, shared.clone())),
        })
    }

    /// Next event of a stream; `ConnectionLost` if the queue closed without one.
    pub(crate) async fn next_event(
        &self,
        events: &mut mpsc::UnboundedReceiver<Event>,
    ) -> Result<Event, ClientError> {
        events.recv().await.ok_or_else(|| self.handle.shared.lost())
    }

    /// Unary request → decoded `ok` result, within the call deadline.
    pub(crate) async fn call<T: DeserializeOwned>(&self, req: &Request) -> Result<T, ClientError> {
        let mut opened = self.open(req)?;
        let wait = self.next_event(&mut opened.events);
        let ev = match self.handle.config.call_timeout {
            Some(d) => tokio::time::timeout(d, wait)
                .await
                .map_err(|_| ClientError::Timeout(d))??,
            None => wait.await?,
        };
        decode_ok(ev)
    }
}

pub(crate) fn decode_ok<T: DeserializeOwned>(ev: Event) -> Result<T, ClientError> {
    match ev {
        Event::Ok { result } => serde_json::from_value(result)
            .map_err(|e| ClientError::UnexpectedReply(format!("undecodable result: {e}"))),
        Event::Error(e) => Err(ClientError::Remote(e)),
        other => Err(ClientError::UnexpectedReply(format!("{other:?}"))),
    }
}

async fn read_hello<R: AsyncRead + Unpin>(
    reader: &mut FrameReader<R>,
) -> Result<Hello, ClientError> {
    reader
        .read_preamble()
        .await
        .map_err(ClientError::Handshake)?;
    let frame = reader
        .next_frame()
        .await
        .map_err(ClientError::Handshake)?
        .ok_or(ClientError::Handshake(ProtocolError::Truncated))?;
    match frame.kind {
        FrameKind::Hello => {}
        FrameKind::Goaway => {
            let why: RemoteError = frame
                .decode_json("goaway")
                .map_err(ClientError::Handshake)?;
            return Err(ClientError::Rejected(why));
        }
        other => {
            return Err(ClientError::Handshake(ProtocolError::Unexpected(format!(
                "expected the agent's hello, got a {other:?} frame"
            ))));
        }
    }
    let hello: Hello = frame.decode_json("hello").map_err(ClientError::Handshake)?;
    if hello.magic != HELLO_MAGIC || hello.role != Role::Agent {
        return Err(ClientError::Handshake(ProtocolError::Unexpected(format!(
            "hello from a {:?} with magic {:?}; expected an agent",
            hello.role, hello.magic
        ))));
    }
    Ok(hello)
}

async fn read_loop<R: AsyncRead + Unpin>(shared: Arc<Shared>, mut reader: FrameReader<R>) {
    let reason = loop {
        let frame = match next_frame(&shared, &mut reader).await {
            Ok(Some(f)) => f,
            Ok(None) => break "agent closed the connection".to_owned(),
            Err(e) => break e.to_string(),
        };
        if let Err(reason) = dispatch(&shared, frame) {
            break reason;
        }
    };
    tracing::debug!(%reason, "agent connection ended");
    *lock(&shared.closed) = Some(reason);
    let entries: Vec<Entry> = lock(&shared.streams).drain().map(|(_, e)| e).collect();
    for e in entries {
        e.close_send();
    }
}

/// Next frame; an oversized frame for a live stream fails that stream only (its body is
/// skipped unbuffered) and reading goes on.
async fn next_frame<R: AsyncRead + Unpin>(
    shared: &Shared,
    reader: &mut FrameReader<R>,
) -> Result<Option<Frame>, ProtocolError> {
    loop {
        let Some(header) = reader.read_header().await? else {
            return Ok(None);
        };
        let kind =
            FrameKind::from_u8(header.kind).ok_or(ProtocolError::UnknownKind(header.kind))?;
        if let Err(e) = reader.check_len(&header) {
            let live = header.stream != CONNECTION_STREAM
                && matches!(kind, FrameKind::Data | FrameKind::Control)
                && lock(&shared.streams).contains_key(&header.stream);
            if !live {
                return Err(e);
            }
            reader.skip_body(header.len).await?;
            let entry = lock(&shared.streams).remove(&header.stream);
            if let Some(entry) = entry {
                entry.close_send();
                let err = RemoteError::new(ErrorKind::FrameTooLarge, e.to_string());
                *lock(&entry.state.error) = Some(err.clone());
                let _ = entry.events.send(Event::Error(err));
                drop(entry);
                shared.cancel_remote(header.stream);
            }
            continue;
        }
        let body = reader.read_body(&header).await?;
        return Ok(Some(Frame {
            stream: header.stream,
            kind,
            flags: header.flags,
            body,
        }));
    }
}

fn dispatch(shared: &Shared, frame: Frame) -> Result<(), String> {
    let id = frame.stream;
    match frame.kind {
        FrameKind::Goaway => {
            let why: RemoteError = frame
                .decode_json("goaway")
                .unwrap_or_else(|_| RemoteError::new(ErrorKind::Protocol, "(unreadable goaway)"));
            Err(format!("agent closed the connection: {}", why.message))
        }
        FrameKind::Hello | FrameKind::Open => {
            Err(format!("unexpected {:?} frame from the agent", frame.kind))
        }
        FrameKind::Control => {
            let ev: Event = frame.decode_json("event").map_err(|e| e.to_string())?;
            let mut streams = lock(&shared.streams);
            if ev.is_terminal() {
                if let Some(entry) = streams.remove(&id) {
                    entry.close_send();
                    if let Event::Error(e) = &ev {
                        *lock(&entry.state.error) = Some(e.clone());
                    }
                    let _ = entry.events.send(ev);
                }
            } else if let Some(entry) = streams.get(&id) {
                let _ = entry.events.send(ev);
            }
            Ok(())
        }
        FrameKind::Data => {
            let ch = frame.flags;
            let mut streams = lock(&shared.streams);
            let Some(entry) = streams.get_mut(&id) else {
                return Ok(()); // cancelled by us; late bytes are dropped
            };
            if ch == channel::INPUT || usize::from(ch) >= channel::COUNT {
                return Err(format!("agent sent data on channel {ch}"));
            }
            let recv = entry.recv[usize::from(ch)].clone();
            let len = frame.body.len();
            if !recv.on_data(len) {
                return Err(ProtocolError::FlowControl {
                    stream: id,
                    channel: ch,
                }
                .to_string());
            }
            let delivered = entry.channels[usize::from(ch)]
                .as_ref()
                .is_some_and(|tx| tx.send(Chunk::Data(frame.body)).is_ok());
            if !delivered {
                // Nobody reads this channel any more: keep the agent flowing.
                drop(streams);
                shared.return_credit(id, ch, &recv, len);
            }
            Ok(())
        }
        FrameKind::Eof => {
            let mut streams = lock(&shared.streams);
            if let Some(entry) = streams.get_mut(&id)
                && let Some(tx) = entry
                    .channels
                    .get_mut(usize::from(frame.flags))
                    .and_then(Option::take)
            {
                let _ = tx.send(Chunk::Eof);
            }
            Ok(())
        }
        FrameKind::Window => {
            let inc = frame.window_increment().map_err(|e| e.to_string())?;
            let streams = lock(&shared.streams);
            if let Some(entry) = streams.get(&id)
                && let Some(w) = entry.send.get(usize::from(frame.flags))
                && !w.grant(inc)
            {
                return Err("agent grew a window past 2^32-1".into());
            }
            Ok(())
        }
    }
}
