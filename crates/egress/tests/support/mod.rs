//! Loopback fixtures for the relay and DNS tests and the benchmark: a counting resolver,
//! upstream TLS and HTTP servers that count their accepts, and a TLS client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use omabox_contract::networking::{NetworkPolicy, NetworkingConfig, address_is_never_reachable};
use omabox_egress::{AddressRules, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Names to addresses, counting every call (a refused name must never get here).
#[derive(Default)]
pub struct CountingResolver {
    pub names: HashMap<String, Vec<IpAddr>>,
    pub calls: AtomicUsize,
    pub asked: Mutex<Vec<String>>,
}

impl CountingResolver {
    pub fn new(entries: &[(&str, &[&str])]) -> Arc<Self> {
        Arc::new(Self {
            names: entries
                .iter()
                .map(|(n, a)| {
                    (
                        n.to_string(),
                        a.iter().map(|a| a.parse().unwrap()).collect(),
                    )
                })
                .collect(),
            ..Self::default()
        })
    }

    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait::async_trait]
impl Resolver for CountingResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.asked.lock().unwrap().push(name.to_owned());
        self.names
            .get(name)
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such name"))
    }
}

/// Production's address rules, except that loopback is reachable (the upstreams live there).
pub fn loopback_rules() -> AddressRules {
    AddressRules::default()
        .with_never_reachable(|ip| !ip.is_loopback() && address_is_never_reachable(ip))
}

/// `limited` with exactly these `HOST[:PORT]` entries.
pub fn limited(hosts: &[String]) -> NetworkPolicy {
    NetworkPolicy::compile(
        &NetworkingConfig::Limited {
            allowed_hosts: hosts.to_vec(),
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        &[],
    )
    .unwrap()
}

/// A listener that counts accepted connections.
pub struct Upstream {
    pub addr: SocketAddr,
    pub accepts: Arc<AtomicUsize>,
}

impl Upstream {
    pub fn accepts(&self) -> usize {
        self.accepts.load(Ordering::SeqCst)
    }
}

/// A TLS server for `names` (self-signed) echoing every byte back; returns it and a
/// connector that trusts it.
pub async fn tls_echo_server(bind: SocketAddr, names: &[&str]) -> (Upstream, TlsConnector) {
    let (acceptor, connector) = tls_identity(names);
    (tls_echo_server_with(bind, acceptor).await, connector)
}

/// A self-signed identity for `names`: the server side and a client that trusts it.
pub fn tls_identity(names: &[&str]) -> (TlsAcceptor, TlsConnector) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certified =
        rcgen::generate_simple_self_signed(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap();
    let cert = certified.cert.der().clone();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
    let server = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key.into())
        .unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    (
        TlsAcceptor::from(Arc::new(server)),
        TlsConnector::from(Arc::new(client)),
    )
}

/// A TLS echo server with `acceptor`'s identity.
pub async fn tls_echo_server_with(bind: SocketAddr, acceptor: TlsAcceptor) -> Upstream {
    let listener = TcpListener::bind(bind).await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        accepts: Arc::default(),
    };
    let accepts = Arc::clone(&upstream.accepts);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepts.fetch_add(1, Ordering::SeqCst);
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let (mut r, mut w) = tokio::io::split(tls);
                let _ = tokio::io::copy(&mut r, &mut w).await;
                let _ = w.shutdown().await;
            });
        }
    });
    upstream
}

/// A plain TCP server that echoes every byte (the benchmark's upstream).
pub async fn tcp_echo_server(bind: SocketAddr) -> Upstream {
    let listener = TcpListener::bind(bind).await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        accepts: Arc::default(),
    };
    let accepts = Arc::clone(&upstream.accepts);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            accepts.fetch_add(1, Ordering::SeqCst);
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    upstream
}

/// A server that reads a request head, then sends `bytes` bytes and closes (the benchmark's
/// download).
pub async fn source_server(bind: SocketAddr, bytes: usize) -> Upstream {
    let listener = TcpListener::bind(bind).await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        accepts: Arc::default(),
    };
    let accepts = Arc::clone(&upstream.accepts);
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            accepts.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let chunk = vec![0x5au8; 256 * 1024];
                let mut left = bytes;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if stream.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
                let _ = stream.shutdown().await;
            });
        }
    });
    upstream
}

/// An HTTP/1.1 server answering `hello` to one request per connection and recording each
/// request head exactly as received.
pub async fn http_server(bind: SocketAddr) -> (Upstream, Arc<Mutex<Vec<Vec<u8>>>>) {
    let listener = TcpListener::bind(bind).await.unwrap();
    let upstream = Upstream {
        addr: listener.local_addr().unwrap(),
        accepts: Arc::default(),
    };
    let heads: Arc<Mutex<Vec<Vec<u8>>>> = Arc::default();
    let (accepts, seen) = (Arc::clone(&upstream.accepts), Arc::clone(&heads));
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            accepts.fetch_add(1, Ordering::SeqCst);
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.ends_with(b"\r\n\r\n") {
                    match stream.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                seen.lock().unwrap().push(head);
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\nconnection: close\r\n\r\nhello",
                    )
                    .await;
                let _ = stream.shutdown().await;
            });
        }
    });
    (upstream, heads)
}

/// Reads until EOF (or error), at most `limit` bytes.
pub async fn read_to_end(stream: &mut TcpStream, limit: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.len() < limit {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    out
}
