//! A scripted HTTP/1.1 server on loopback for tests of hostile servers (a malicious
//! registry, a host-only service that must never be contacted): every request is answered
//! by a closure, recorded with its headers, and may get a body that is huge (streamed,
//! never allocated), trickles a byte at a time, or never ends. One request per connection
//! (`Connection: close`). Plain std threads: usable from sync and async tests alike.
//!
//! [`image`] makes the manifest, config and layer blobs of a tiny OCI image such a server
//! serves.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

/// One request as the server read it.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    /// `GET`, `HEAD`, ...
    pub method: String,
    /// The request target (`/v2/x/manifests/1?…`).
    pub target: String,
    /// Header names (lowercase) and values.
    pub headers: Vec<(String, String)>,
}

impl Recorded {
    /// The value of header `name` (lowercase), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The path of the target, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or_default()
    }
}

/// How a reply's body is sent.
#[derive(Debug, Clone)]
pub enum Body {
    /// These bytes.
    Bytes(Vec<u8>),
    /// `len` copies of `byte`, written in 64 KiB pieces (nothing that large is allocated).
    Repeat {
        /// The byte.
        byte: u8,
        /// How many.
        len: u64,
    },
    /// `bytes`, one byte every `every`; after them, if `forever`, one more byte every
    /// `every` until the client goes away.
    Trickle {
        /// What is sent first.
        bytes: Vec<u8>,
        /// The pause before each byte.
        every: Duration,
        /// Whether to keep trickling after `bytes`.
        forever: bool,
    },
    /// `bytes` at once, then nothing more and the connection held open until the
    /// client goes away (a download that stalls mid-way).
    Stall(Vec<u8>),
    /// `chunk` spaces every `every`, until the client goes away (steady progress that
    /// never ends).
    Drip {
        /// Bytes per write.
        chunk: usize,
        /// The pause before each write.
        every: Duration,
    },
}

/// A reply: status, headers, body.
#[derive(Debug, Clone)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Headers besides `Content-Length` and `Connection`.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Body,
    /// The `Content-Length` sent (`None`: the body's true length; for an endless body,
    /// none is sent unless given here).
    pub content_length: Option<u64>,
    /// Send no `Content-Length` at all (the body ends when the connection closes).
    pub omit_length: bool,
}

impl Reply {
    /// `status` with a body.
    pub fn new(status: u16, body: impl Into<Vec<u8>>) -> Self {
        Self {
            status,
            headers: Vec::new(),
            body: Body::Bytes(body.into()),
            content_length: None,
            omit_length: false,
        }
    }

    /// 200 with `body` and `Content-Type: content_type`.
    pub fn ok(content_type: &str, body: impl Into<Vec<u8>>) -> Self {
        Self::new(200, body).header("Content-Type", content_type)
    }

    /// The same reply with one more header.
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// The same reply with another body.
    pub fn body(mut self, body: Body) -> Self {
        self.body = body;
        self
    }

    /// The same reply announcing `len` as its `Content-Length`.
    pub fn content_length(mut self, len: u64) -> Self {
        self.content_length = Some(len);
        self
    }

    /// The same reply without a `Content-Length` (ended by closing the connection).
    pub fn without_length(mut self) -> Self {
        self.omit_length = true;
        self
    }
}

type Handler = dyn Fn(&Recorded) -> Reply + Send + Sync;

/// The server; stops (and ends every trickling reply) when dropped.
pub struct HostileServer {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Recorded>>>,
    connections: Arc<AtomicUsize>,
    body_bytes_sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
}

impl std::fmt::Debug for HostileServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostileServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl HostileServer {
    /// Listens on `127.0.0.1:<free port>`, answering with `handler`.
    pub fn start(handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_on("127.0.0.1:0", handler)
    }

    /// Listens on `addr` (`127.0.0.2:0`, …), answering with `handler`.
    pub fn start_on(
        addr: &str,
        handler: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(addr).expect("bind the hostile server");
        let addr = listener.local_addr().expect("its address");
        let server = Self {
            addr,
            requests: Arc::default(),
            connections: Arc::default(),
            body_bytes_sent: Arc::default(),
            stop: Arc::default(),
        };
        let handler: Arc<Handler> = Arc::new(handler);
        let (requests, connections, sent, stop) = (
            server.requests.clone(),
            server.connections.clone(),
            server.body_bytes_sent.clone(),
            server.stop.clone(),
        );
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                connections.fetch_add(1, Ordering::SeqCst);
                let (handler, requests, sent, stop) = (
                    handler.clone(),
                    requests.clone(),
                    sent.clone(),
                    stop.clone(),
                );
                std::thread::spawn(move || serve(stream, &*handler, &requests, &sent, &stop));
            }
        });
        server
    }

    /// `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        self.addr.to_string()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request read so far.
    pub fn requests(&self) -> Vec<Recorded> {
        self.requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Connections accepted so far (a contacted server has at least one).
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Body bytes the clients accepted so far (written to their sockets).
    pub fn body_bytes_sent(&self) -> u64 {
        self.body_bytes_sent.load(Ordering::SeqCst)
    }
}

impl Drop for HostileServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_millis(200));
    }
}

fn serve(
    stream: TcpStream,
    handler: &Handler,
    requests: &Mutex<Vec<Recorded>>,
    sent: &AtomicU64,
    stop: &AtomicBool,
) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(30)));
    let mut reader = BufReader::new(&stream);
    let mut line = String::new();
    if reader.read_line(&mut line).unwrap_or(0) == 0 {
        return;
    }
    let mut parts = line.split_whitespace();
    let mut request = Recorded {
        method: parts.next().unwrap_or_default().to_owned(),
        target: parts.next().unwrap_or_default().to_owned(),
        headers: Vec::new(),
    };
    let mut length = 0u64;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header).unwrap_or(0) == 0 || header == "\r\n" {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().to_owned());
            if k == "content-length" {
                length = v.parse().unwrap_or(0);
            }
            request.headers.push((k, v));
        }
    }
    let _ = std::io::copy(&mut reader.by_ref().take(length), &mut std::io::sink());
    requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(request.clone());
    let reply = handler(&request);
    let mut stream = &stream;
    let true_length = match &reply.body {
        Body::Bytes(b) => Some(b.len() as u64),
        Body::Repeat { len, .. } => Some(*len),
        Body::Trickle {
            bytes,
            forever: false,
            ..
        } => Some(bytes.len() as u64),
        Body::Trickle { .. } | Body::Stall(_) | Body::Drip { .. } => None,
    };
    let mut head = format!(
        "HTTP/1.1 {} {}\r\nConnection: close\r\n",
        reply.status,
        reason(reply.status)
    );
    if let Some(len) = reply.content_length.or(true_length)
        && !reply.omit_length
    {
        head.push_str(&format!("Content-Length: {len}\r\n"));
    }
    for (k, v) in &reply.headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    if stream.write_all(head.as_bytes()).is_err() || request.method == "HEAD" {
        return;
    }
    let mut write = |bytes: &[u8]| -> bool {
        if stop.load(Ordering::SeqCst) || stream.write_all(bytes).is_err() {
            return false;
        }
        sent.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        true
    };
    match reply.body {
        Body::Bytes(bytes) => {
            write(&bytes);
        }
        Body::Repeat { byte, len } => {
            let piece = vec![byte; 64 << 10];
            let mut left = len;
            while left > 0 {
                let n = left.min(piece.len() as u64) as usize;
                if !write(&piece[..n]) {
                    return;
                }
                left -= n as u64;
            }
        }
        Body::Trickle {
            bytes,
            every,
            forever,
        } => {
            for b in &bytes {
                std::thread::sleep(every);
                if !write(std::slice::from_ref(b)) {
                    return;
                }
            }
            if forever {
                loop {
                    std::thread::sleep(every);
                    if !write(b" ") {
                        return;
                    }
                }
            }
        }
        Body::Drip { chunk, every } => {
            let piece = vec![b' '; chunk];
            loop {
                std::thread::sleep(every);
                if !write(&piece) {
                    return;
                }
            }
        }
        Body::Stall(bytes) => {
            if !write(&bytes) {
                return;
            }
            // Hold the connection until the client closes it (a read returns 0 or fails)
            // or the server stops.
            let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
            let mut byte = [0u8; 1];
            while !stop.load(Ordering::SeqCst) {
                match stream.read(&mut byte) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    Err(_) => return,
                }
            }
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        301 => "Moved Permanently",
        302 => "Found",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        500 => "Internal Server Error",
        _ => "Status",
    }
}

/// `sha256:<hex>` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    crate::registry::sha256(bytes)
}

/// The blobs of a tiny OCI image: its manifest (bytes and digest) and a map digest →
/// bytes of its config and layers.
#[derive(Debug, Clone)]
pub struct FakeImage {
    /// The image manifest.
    pub manifest: Vec<u8>,
    /// `sha256:<hex>` of the manifest.
    pub digest: String,
    /// Config and layer blobs by digest.
    pub blobs: Vec<(String, Vec<u8>)>,
}

impl FakeImage {
    /// The blob with `digest`, if the image has it.
    pub fn blob(&self, digest: &str) -> Option<&[u8]> {
        self.blobs
            .iter()
            .find(|(d, _)| d == digest)
            .map(|(_, b)| b.as_slice())
    }

    /// The layer digests, in order.
    pub fn layers(&self) -> Vec<String> {
        self.blobs.iter().skip(1).map(|(d, _)| d.clone()).collect()
    }
}

/// An OCI image of uncompressed tar `layers` for linux on this host's architecture.
pub fn image(layers: &[Vec<u8>]) -> FakeImage {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let layer_digests: Vec<String> = layers.iter().map(|l| digest(l)).collect();
    let config = format!(
        r#"{{"architecture":"{arch}","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
        layer_digests
            .iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(",")
    )
    .into_bytes();
    let config_digest = digest(&config);
    let layer_descs: Vec<String> = layers
        .iter()
        .zip(&layer_digests)
        .map(|(l, d)| {
            format!(
                r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{d}","size":{}}}"#,
                l.len()
            )
        })
        .collect();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{}]}}"#,
        config.len(),
        layer_descs.join(",")
    )
    .into_bytes();
    let mut blobs = vec![(config_digest, config)];
    blobs.extend(layer_digests.into_iter().zip(layers.iter().cloned()));
    FakeImage {
        digest: digest(&manifest),
        manifest,
        blobs,
    }
}

/// The reply a plain registry gives for `request` from `image` (any repository, any
/// tag): `/v2/` 200, the manifest by tag or digest, the blobs; 404 otherwise.
pub fn serve_image(image: &FakeImage, request: &Recorded) -> Reply {
    let path = request.path();
    if path == "/v2/" {
        return Reply::ok("application/json", "{}");
    }
    if path.contains("/manifests/") {
        return Reply::ok(
            "application/vnd.oci.image.manifest.v1+json",
            image.manifest.clone(),
        )
        .header("Docker-Content-Digest", &image.digest);
    }
    if let Some((_, digest)) = path.split_once("/blobs/")
        && let Some(blob) = image.blob(digest)
    {
        return Reply::ok("application/octet-stream", blob.to_vec());
    }
    Reply::new(
        404,
        r#"{"errors":[{"code":"BLOB_UNKNOWN","message":"blob unknown to registry"}]}"#,
    )
    .header("Content-Type", "application/json")
}

/// A hex digest of `bytes` (no prefix).
pub fn hex_of(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
