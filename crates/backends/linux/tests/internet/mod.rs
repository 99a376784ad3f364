//! A fake "internet" for egress tests: a network namespace the test creates, joined to the
//! host by a veth pair on a /30 of 198.18.0.0/15 (the benchmarking range: never routed
//! anywhere real), with servers inside it and a resolver that names them. Packets go only
//! between the host and that namespace.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use omabox_egress::Resolver;

pub mod https;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespace and the host's end of the link. Dropping it deletes both.
pub struct Internet {
    /// The namespace's name (`ip netns exec NAME ...`).
    pub name: String,
    /// The host's address on the link (one of the host's own addresses).
    pub host: Ipv4Addr,
    /// The far end's address, where the servers listen.
    pub far: Ipv4Addr,
}

impl Internet {
    pub fn new() -> Self {
        // Unique per instance: `cargo test` runs a file's tests as threads of one process,
        // and other test processes (or a crashed one's leftovers) may hold links too. The
        // link's name and its /30 follow from one id; the first id whose veth pair can be
        // made is this instance's (a name taken says "File exists": try the next).
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        const IDS: u32 = 32768; // the /30s of 198.18.0.0/15
        let pid = std::process::id();
        let first = (pid % 4096) * 8;
        let (id, n) = (0..IDS)
            .find_map(|_| {
                let n = NEXT.fetch_add(1, Ordering::SeqCst) as u32;
                let id = (first + n) % IDS;
                let (vh, vf) = (format!("obh{id}"), format!("obf{id}"));
                let made = Command::new("ip")
                    .args(["link", "add", &vh, "type", "veth", "peer", "name", &vf])
                    .output()
                    .expect("run ip");
                let taken = String::from_utf8_lossy(&made.stderr).contains("File exists");
                assert!(
                    made.status.success() || taken,
                    "ip link add {vh}: {}",
                    String::from_utf8_lossy(&made.stderr)
                );
                made.status.success().then_some((id, n))
            })
            .expect("no free veth name for the fake internet");
        let base = u32::from(Ipv4Addr::new(198, 18, 0, 0)) + id * 4;
        let (host, far) = (Ipv4Addr::from(base + 1), Ipv4Addr::from(base + 2));
        let name = format!("omabox-inet-{pid}-{n}");
        let (vh, vf) = (format!("obh{id}"), format!("obf{id}"));
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        ip(&["netns", "add", &name]);
        let net = Self { name, host, far };
        ip(&["link", "set", &vf, "netns", &net.name]);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &vh]);
        ip(&["link", "set", &vh, "up"]);
        ip(&[
            "-n",
            &net.name,
            "addr",
            "add",
            &format!("{far}/30"),
            "dev",
            &vf,
        ]);
        ip(&["-n", &net.name, "link", "set", &vf, "up"]);
        ip(&["-n", &net.name, "link", "set", "lo", "up"]);
        net
    }

    /// Runs `make` on a thread inside the namespace (a socket stays where it was made).
    fn inside<T: Send + 'static>(
        &self,
        make: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> T {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let ns = std::fs::File::open(path)?;
            // SAFETY: setns on an fd we own; changes only this thread's namespace.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            make()
        })
        .join()
        .unwrap()
        .expect("inside the fake internet")
    }

    /// A listener at `far:port`, for a server of the caller's own.
    pub fn listener(&self, port: u16) -> std::net::TcpListener {
        let addr = SocketAddr::from((self.far, port));
        self.inside(move || std::net::TcpListener::bind(addr))
    }

    /// An HTTP server at `far:port` answering every request `200 <name> saw host <Host>`.
    pub fn http(&self, port: u16, name: &'static str) -> Server {
        let addr = SocketAddr::from((self.far, port));
        let listener = self.inside(move || std::net::TcpListener::bind(addr));
        Server::http(listener, name)
    }

    /// A UDP socket at `far:port` counting datagrams.
    pub fn udp(&self, port: u16) -> Arc<AtomicUsize> {
        let addr = SocketAddr::from((self.far, port));
        let socket = self.inside(move || std::net::UdpSocket::bind(addr));
        let count = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&count);
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            while socket.recv_from(&mut buf).is_ok() {
                seen.fetch_add(1, Ordering::SeqCst);
            }
        });
        count
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        // Deleting the namespace deletes the veth pair with it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// A test HTTP server; counts the connections it accepted.
pub struct Server {
    pub addr: SocketAddr,
    accepts: Arc<AtomicUsize>,
}

impl Server {
    /// Serves `listener` (bound anywhere, e.g. on the host) on the current runtime.
    pub fn http(listener: std::net::TcpListener, name: &'static str) -> Self {
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let accepts = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&accepts);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16384 {
                        match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let host = text
                        .lines()
                        .find_map(|l| l.strip_prefix("Host: ").or(l.strip_prefix("host: ")))
                        .unwrap_or("-")
                        .to_owned();
                    let body = format!("{name} saw host {host}");
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = s.write_all(reply.as_bytes()).await;
                    let _ = s.shutdown().await;
                });
            }
        });
        Self { addr, accepts }
    }

    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

/// Names to addresses; records every name it was asked.
#[derive(Default)]
pub struct TestResolver {
    names: HashMap<String, Vec<IpAddr>>,
    asked: Mutex<Vec<String>>,
}

impl TestResolver {
    pub fn new(entries: &[(&str, IpAddr)]) -> Arc<Self> {
        Arc::new(Self {
            names: entries
                .iter()
                .map(|(n, a)| (n.to_string(), vec![*a]))
                .collect(),
            ..Self::default()
        })
    }

    pub fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl Resolver for TestResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        self.asked.lock().unwrap().push(name.to_owned());
        self.names
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
    }
}
