//! Credential injection through the relay, on loopback: an HTTPS upstream that demands a
//! bearer token, a relay with a binding for its name, and a client that holds no secret
//! and trusts only the binding's CA (plus, where said, the upstream's own).

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::header::{AUTHORIZATION, HeaderName};
use omabox_contract::SecretString;
use omabox_egress::intercept::{Credentials, InjectionRule, InterceptCa};
use omabox_egress::{FixedDestination, Relay, RelayConfig};
use support::{CountingResolver, limited, loopback_rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const SECRET: &str = "s3cret-token-value";

/// An HTTPS server for `api.test` answering `200 ok` to `Authorization: Bearer <SECRET>`,
/// else `401 <what it got>`; keep-alive. Returns its address and its certificate (PEM).
async fn upstream() -> (SocketAddr, String) {
    let certified = rcgen::generate_simple_self_signed(vec!["api.test".to_owned()]).unwrap();
    let pem = certified.cert.pem();
    let key = rustls::pki_types::PrivatePkcs8KeyDer::from(certified.key_pair.serialize_der());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![certified.cert.der().clone()], key.into())
    .unwrap();
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    |req: hyper::Request<hyper::body::Incoming>| async move {
                        let got = req
                            .headers()
                            .get_all(AUTHORIZATION)
                            .iter()
                            .map(|v| v.to_str().unwrap_or("?").to_owned())
                            .collect::<Vec<_>>()
                            .join(",");
                        let (code, body) = if got == format!("Bearer {SECRET}") {
                            (200, format!("ok {}", req.uri().path()))
                        } else {
                            (401, format!("got [{got}]"))
                        };
                        let mut response = hyper::Response::new(http_body_util::Full::new(
                            bytes::Bytes::from(body),
                        ));
                        *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
                        Ok::<_, std::convert::Infallible>(response)
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, pem)
}

/// A TLS client trusting exactly `pems`.
fn client(pems: &[&str]) -> TlsConnector {
    let roots = omabox_egress::intercept::roots_from_pem(pems.join("\n").as_bytes());
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

struct Setup {
    relay_addr: SocketAddr,
    credentials: Arc<Credentials>,
    ca_pem: String,
    upstream_pem: String,
}

async fn setup(prefix: &str) -> Setup {
    let (upstream_addr, upstream_pem) = upstream().await;
    let ca = InterceptCa::generate("test-binding").unwrap();
    let ca_pem = ca.certificate_pem();
    let rules = vec![InjectionRule {
        host: "API.test".into(),
        path_prefix: prefix.into(),
        header: HeaderName::from_static("authorization"),
        value: SecretString::new(format!("Bearer {SECRET}")),
    }];
    let credentials = Arc::new(
        Credentials::new(
            ca,
            rules,
            omabox_egress::intercept::roots_from_pem(upstream_pem.as_bytes()),
        )
        .unwrap(),
    );
    let resolver = CountingResolver::new(&[("api.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("api.test:{}", upstream_addr.port())]);
    let relay = Arc::new(Relay::new(
        policy,
        resolver,
        loopback_rules(),
        RelayConfig::default(),
    ));
    relay.set_credentials(Some(Arc::clone(&credentials)));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let relay_addr = listener.local_addr().unwrap();
    tokio::spawn(relay.serve(listener, Arc::new(FixedDestination(upstream_addr))));
    Setup {
        relay_addr,
        credentials,
        ca_pem,
        upstream_pem,
    }
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn connect(setup: &Setup, trust: &[&str]) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(setup.relay_addr).await?;
    let name = rustls::pki_types::ServerName::try_from("api.test").unwrap();
    client(trust).connect(name, tcp).await
}

/// One request on `tls` (keep-alive); returns the status line and the body.
async fn request(tls: &mut Tls, path: &str, extra: &str) -> (String, String) {
    let head = format!("GET {path} HTTP/1.1\r\nHost: api.test\r\n{extra}\r\n");
    tls.write_all(head.as_bytes()).await.unwrap();
    read_response(tls).await
}

async fn read_response(tls: &mut Tls) -> (String, String) {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        tls.read_exact(&mut byte).await.unwrap();
        buf.push(byte[0]);
    }
    let head = String::from_utf8(buf).unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    tls.read_exact(&mut body).await.unwrap();
    (
        head.lines().next().unwrap().to_owned(),
        String::from_utf8(body).unwrap(),
    )
}

#[tokio::test]
async fn the_secret_is_injected_for_the_bound_host_and_replaces_a_forged_one() {
    let setup = setup("/").await;
    // The client trusts only the binding's CA: the certificate it sees is the relay's.
    let mut tls = connect(&setup, &[&setup.ca_pem])
        .await
        .expect("TLS with the binding CA");
    let (status, body) = request(&mut tls, "/repo.git/info/refs", "").await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("HTTP/1.1 200 OK", "ok /repo.git/info/refs")
    );
    // A header of its own is dropped, never forwarded next to the secret.
    let (status, _) = request(&mut tls, "/x", "Authorization: Bearer forged\r\n").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    // Another Host through the intercepted connection is refused.
    tls.write_all(b"GET / HTTP/1.1\r\nHost: other.test\r\n\r\n")
        .await
        .unwrap();
    let (status, _) = read_response(&mut tls).await;
    assert_eq!(status, "HTTP/1.1 421 Misdirected Request");
}

#[tokio::test]
async fn only_paths_under_the_prefix_get_the_secret() {
    let setup = setup("/org/").await;
    let mut tls = connect(&setup, &[&setup.ca_pem]).await.unwrap();
    let (status, _) = request(&mut tls, "/org/repo", "").await;
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (status, body) = request(&mut tls, "/other/repo", "Authorization: Bearer mine\r\n").await;
    assert_eq!(status, "HTTP/1.1 401 Unauthorized");
    assert_eq!(
        body, "got []",
        "outside the prefix the sandbox's own header is dropped too"
    );
}

#[tokio::test]
async fn revoke_cuts_open_and_new_connections_at_once() {
    let setup = setup("/").await;
    let mut open = connect(&setup, &[&setup.ca_pem]).await.unwrap();
    assert_eq!(request(&mut open, "/a", "").await.0, "HTTP/1.1 200 OK");
    setup.credentials.revoke();
    // The open connection's next request goes out without the secret.
    let (status, body) = request(&mut open, "/a", "").await;
    assert_eq!(
        (status.as_str(), body.as_str()),
        ("HTTP/1.1 401 Unauthorized", "got []")
    );
    // A new connection is no longer intercepted: the client sees the real server.
    assert!(
        tokio::time::timeout(Duration::from_secs(5), connect(&setup, &[&setup.ca_pem]))
            .await
            .unwrap()
            .is_err(),
        "the binding CA no longer answers for the host"
    );
    let mut direct = connect(&setup, &[&setup.upstream_pem]).await.unwrap();
    assert_eq!(
        request(&mut direct, "/a", "").await.0,
        "HTTP/1.1 401 Unauthorized"
    );
}
