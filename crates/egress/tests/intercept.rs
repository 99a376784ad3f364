//! Credential injection through the relay, on loopback: an HTTPS upstream that demands a
//! bearer token, a relay with a binding for its name, and a client that holds no secret
//! and trusts only the binding's CA (plus, where said, the upstream's own).

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, HOST, HeaderName, TRANSFER_ENCODING};
use omabox_contract::SecretString;
use omabox_egress::intercept::{Credentials, InjectionRule, InterceptCa};
use omabox_egress::{FixedDestination, Relay, RelayConfig};
use support::{CountingResolver, limited, loopback_rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const SECRET: &str = "s3cret-token-value";

/// What the upstream received, per request.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// The request target as it arrived.
    target: String,
    /// The `Host` header(s), joined.
    host: String,
    /// Whether it carried the secret.
    secret: bool,
    /// `Content-Length` and `Transfer-Encoding`, as they arrived.
    framing: (Option<String>, Option<String>),
}

type SeenLog = Arc<Mutex<Vec<Seen>>>;

/// An HTTPS server for `api.test` answering `200 ok <path>` to `Authorization: Bearer
/// <SECRET>`, else `401 got [<what it got>]`; keep-alive; every request recorded. Returns its
/// address, its certificate (PEM) and the record.
async fn upstream() -> (SocketAddr, String, SeenLog) {
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
    let log = SeenLog::default();
    let seen = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, seen) = (acceptor.clone(), Arc::clone(&seen));
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = Arc::clone(&seen);
                        async move {
                            let all = |name: HeaderName| {
                                let values = req
                                    .headers()
                                    .get_all(name)
                                    .iter()
                                    .map(|v| v.to_str().unwrap_or("?").to_owned())
                                    .collect::<Vec<_>>();
                                (!values.is_empty()).then(|| values.join(","))
                            };
                            let got = all(AUTHORIZATION).unwrap_or_default();
                            let secret = got == format!("Bearer {SECRET}");
                            seen.lock().unwrap().push(Seen {
                                target: req.uri().to_string(),
                                host: all(HOST).unwrap_or_default(),
                                secret,
                                framing: (all(CONTENT_LENGTH), all(TRANSFER_ENCODING)),
                            });
                            let (code, body) = if secret {
                                (200, format!("ok {}", req.uri().path()))
                            } else {
                                (401, format!("got [{got}]"))
                            };
                            let mut response = hyper::Response::new(http_body_util::Full::new(
                                bytes::Bytes::from(body),
                            ));
                            *response.status_mut() = hyper::StatusCode::from_u16(code).unwrap();
                            Ok::<_, std::convert::Infallible>(response)
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (addr, pem, log)
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
    /// The port the connections were admitted on (the upstream's).
    port: u16,
    seen: SeenLog,
}

async fn setup(prefix: &str) -> Setup {
    let (upstream_addr, upstream_pem, seen) = upstream().await;
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
        port: upstream_addr.port(),
        seen,
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
    try_read_response(tls).await.expect("a response")
}

/// The next response's status line and body; `None` at end of stream.
async fn try_read_response(tls: &mut Tls) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if tls.read_exact(&mut byte).await.is_err() {
            assert!(buf.is_empty(), "cut in a head: {buf:?}");
            return None;
        }
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
    Some((
        head.lines().next().unwrap().to_owned(),
        String::from_utf8(body).unwrap(),
    ))
}

/// Writes `raw` (one or more requests, as bytes) on a new intercepted connection in one go
/// and reads `n` responses (fewer if the connection ends); the connection with it.
async fn exchange(setup: &Setup, raw: &str, n: usize) -> (Vec<(String, String)>, Tls) {
    let mut tls = connect(setup, &[&setup.ca_pem]).await.unwrap();
    tls.write_all(raw.as_bytes()).await.unwrap();
    let mut responses = Vec::new();
    while responses.len() < n {
        match try_read_response(&mut tls).await {
            Some(response) => responses.push(response),
            None => break,
        }
    }
    (responses, tls)
}

/// Whether the relay closed `tls` (rather than waiting for another request head; a guard
/// against a hang, not a timing).
async fn closed(tls: &mut Tls) -> bool {
    matches!(
        tokio::time::timeout(Duration::from_secs(10), try_read_response(tls)).await,
        Ok(None)
    )
}

/// One request, alone on its connection: its status code; a refusal must close the
/// connection.
async fn status_of(setup: &Setup, raw: &str) -> u16 {
    let (responses, mut tls) = exchange(setup, raw, 1).await;
    let (status, _) = responses.first().expect("a response");
    let code: u16 = status.split(' ').nth(1).unwrap().parse().unwrap();
    if code >= 400 && code != 401 {
        assert!(
            closed(&mut tls).await,
            "the connection stays open after {code}"
        );
    }
    code
}

fn targets(setup: &Setup) -> Vec<String> {
    setup
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.target.clone())
        .collect()
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

/// An absolute-form target must name the bound host on the admitted port, like `Host`; it
/// reaches the upstream in origin-form, with the canonical `Host` (before: the secret was
/// injected whatever authority the target named, and the target went upstream as sent).
#[tokio::test]
async fn an_absolute_form_target_is_judged_by_its_authority_and_sent_in_origin_form() {
    let setup = setup("/").await;
    let port = setup.port;
    for (target, code) in [
        ("https://evil.example/x".to_owned(), 421),
        (format!("https://api.test:{}/x", port.wrapping_add(1)), 421),
        ("https://api.test.evil.example/x".to_owned(), 421),
        ("https://user@api.test/x".to_owned(), 400),
        ("https://api.test@evil.example/x".to_owned(), 400),
        ("http://api.test/x".to_owned(), 400),
        ("ftp://api.test/x".to_owned(), 400),
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: api.test\r\n\r\n");
        assert_eq!(status_of(&setup, &raw).await, code, "{target}");
    }
    assert!(targets(&setup).is_empty(), "{:?}", targets(&setup));

    for target in [
        "https://API.test./x?q=1",
        &format!("https://api.test:{port}/x?q=1"),
    ] {
        let raw = format!("GET {target} HTTP/1.1\r\nHost: api.test\r\n\r\n");
        assert_eq!(status_of(&setup, &raw).await, 200, "{target}");
    }
    let seen = setup.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    for s in seen {
        assert_eq!(
            (s.target.as_str(), s.host.as_str(), s.secret),
            ("/x?q=1", "api.test", true)
        );
    }
}

/// The secret goes only to paths whose decoded segments start with the prefix's; a path
/// that could be read another way under a scoped binding is refused (400) and never sent
/// (before: a string prefix test on the raw path, so `/org/app-evil`, `/org/app/../other`,
/// `/org/app%2f..%2fother` all got the secret).
#[tokio::test]
async fn paths_are_judged_segment_wise_against_the_prefix() {
    for prefix in ["/org/app", "/org/app/"] {
        let setup = setup(prefix).await;
        for path in [
            "/org/app",
            "/org/app/",
            "/org/app/x",
            "/org/app/x/",
            "/org/app/x?y=1",
            "/org/app?next=/../../other",
            "/org/app/a%20b",
            "/org/app/...",
        ] {
            let raw = format!("GET {path} HTTP/1.1\r\nHost: api.test\r\n\r\n");
            assert_eq!(status_of(&setup, &raw).await, 200, "{prefix}: {path}");
        }
        for path in [
            "/org/app-evil",
            "/org/apps/x",
            "/org",
            "/org/",
            "/",
            "/other/org/app",
            "/ORG/app",
            "/org/%61pp/x",
            "/org/app;x=1/y",
        ] {
            let raw = format!(
                "GET {path} HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer mine\r\n\r\n"
            );
            assert_eq!(status_of(&setup, &raw).await, 401, "{prefix}: {path}");
        }
        let before = targets(&setup).len();
        for path in [
            "/org/app/../other",
            "/org/app/./x",
            "/org/app/%2e%2e/other",
            "/org/app/%2E%2E/other",
            "/org/app/.%2e/other",
            "/org/app%2f..%2fother",
            "/org/app%2F..%2Fother",
            "/org/app/%2fx",
            "/org/app/..;/other",
            "/org/app/..;x=1/other",
            "/org/app\\..\\other",
            "/org/app%5c..%5cother",
            "/org//app/x",
            "/org/app//x",
            "//org/app/x",
            "/org/app/%252e%252e/other",
            "/org/app/%00",
            "/org/app/%0d%0ax",
            "/org/app/%3f/x",
            "/org/app/%23/x",
            "/org/app/%ff",
            "/other/../org/app/x",
            "/org/app/%EF%BC%8E%EF%BC%8E/other",
            "/org/app/%E2%80%A5/other",
            "/org/app%EF%BC%8F..%EF%BC%8Fother",
        ] {
            let raw = format!("GET {path} HTTP/1.1\r\nHost: api.test\r\n\r\n");
            assert_eq!(status_of(&setup, &raw).await, 400, "{prefix}: {path}");
        }
        assert_eq!(
            targets(&setup).len(),
            before,
            "a refused path reached the upstream"
        );
        // A fragment never reaches a server: what is judged is what is sent.
        let raw = "GET /org/app#/../../other HTTP/1.1\r\nHost: api.test\r\n\r\n";
        assert_eq!(status_of(&setup, raw).await, 200);
        assert_eq!(targets(&setup).last().unwrap(), "/org/app");
    }
}

/// Under a scoped binding, a header some servers route by instead of the path would move a
/// request judged under the prefix elsewhere: refused (before: forwarded with the secret).
#[tokio::test]
async fn a_path_override_header_is_refused_under_a_scoped_binding() {
    let scoped = setup("/org/app").await;
    for header in ["X-Original-URL", "X-Rewrite-URL", "x-override-url"] {
        let raw = format!("GET /org/app/x HTTP/1.1\r\nHost: api.test\r\n{header}: /admin\r\n\r\n");
        assert_eq!(status_of(&scoped, &raw).await, 400, "{header}");
    }
    assert!(targets(&scoped).is_empty(), "{:?}", targets(&scoped));
    // A whole-host binding has no prefix to leave.
    let whole = setup("/").await;
    let raw = "GET /x HTTP/1.1\r\nHost: api.test\r\nX-Original-URL: /admin\r\n\r\n";
    assert_eq!(status_of(&whole, raw).await, 200);
}

/// A binding for a whole host has no prefix to escape: any path goes with the secret
/// (npm's scoped packages are `/@scope%2fname`).
#[tokio::test]
async fn a_whole_host_binding_forwards_encoded_slashes() {
    let setup = setup("/").await;
    for path in ["/@scope%2fpkg", "/a/../b"] {
        let raw = format!("GET {path} HTTP/1.1\r\nHost: api.test\r\n\r\n");
        assert_eq!(status_of(&setup, &raw).await, 200, "{path}");
    }
    assert_eq!(targets(&setup), ["/@scope%2fpkg", "/a/../b"]);
}

/// `Host` must be exactly one header naming the bound host, on the admitted port at most.
#[tokio::test]
async fn host_must_be_one_header_naming_the_bound_host() {
    let setup = setup("/").await;
    let port = setup.port;
    for (head, code) in [
        (
            "GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test".to_owned(),
            400,
        ),
        (
            "GET / HTTP/1.1\r\nHost: api.test\r\nhost: evil.example".to_owned(),
            400,
        ),
        ("GET / HTTP/1.1\r\nX: y".to_owned(), 400),
        ("GET / HTTP/1.0\r\nX: y".to_owned(), 400),
        ("GET / HTTP/1.1\r\nHost: a@api.test".to_owned(), 400),
        ("GET / HTTP/1.1\r\nHost: api.test:".to_owned(), 400),
        ("GET / HTTP/1.1\r\nHost: [::1]".to_owned(), 400),
        ("GET / HTTP/1.1\r\nHost: \u{e4}pi.test".to_owned(), 400),
        ("GET / HTTP/1.1\r\nHost: xn--pi-via.test".to_owned(), 421),
        ("GET / HTTP/1.1\r\nHost: evil.example".to_owned(), 421),
        (
            "GET / HTTP/1.1\r\nHost: api.test.evil.example".to_owned(),
            421,
        ),
        (
            format!("GET / HTTP/1.1\r\nHost: api.test:{}", port.wrapping_add(1)),
            421,
        ),
        ("GET / HTTP/1.1\r\nHost: API.TEST.".to_owned(), 200),
        (format!("GET / HTTP/1.1\r\nHost: api.test:{port}"), 200),
        ("GET / HTTP/1.0\r\nHost: api.test".to_owned(), 200),
    ] {
        let raw = format!("{head}\r\n\r\n");
        assert_eq!(status_of(&setup, &raw).await, code, "{head:?}");
    }
    let hosts: Vec<String> = setup
        .seen
        .lock()
        .unwrap()
        .iter()
        .map(|s| s.host.clone())
        .collect();
    assert_eq!(
        hosts,
        [
            "api.test".to_owned(),
            format!("api.test:{port}"),
            "api.test".into()
        ]
    );
}

/// Requests pipelined on one connection are each judged: the secret only where each one's
/// own path and `Host` allow it; a refused one ends the connection, and nothing after it
/// is read.
#[tokio::test]
async fn pipelined_requests_on_one_connection_are_each_judged() {
    let setup = setup("/org/").await;
    let raw = [
        "GET /org/a HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET /other HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer mine\r\n\r\n",
        "GET /org/b HTTP/1.1\r\nHost: api.test\r\n\r\n",
        "GET /org/c HTTP/1.1\r\nHost: evil.example\r\n\r\n",
        "GET /org/d HTTP/1.1\r\nHost: api.test\r\n\r\n",
    ]
    .concat();
    let (responses, mut tls) = exchange(&setup, &raw, 5).await;
    let statuses: Vec<&str> = responses.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        statuses,
        [
            "HTTP/1.1 200 OK",
            "HTTP/1.1 401 Unauthorized",
            "HTTP/1.1 200 OK",
            "HTTP/1.1 421 Misdirected Request"
        ]
    );
    assert!(closed(&mut tls).await);
    assert_eq!(responses[1].1, "got []");
    assert_eq!(targets(&setup), ["/org/a", "/other", "/org/b"]);
}

/// `TRACE` makes a server echo the request it received, injected header included: never
/// forwarded, in any spelling, nor asked for through a method-override header (before:
/// forwarded with the secret, and a server that answers it handed the secret to the
/// sandbox).
#[tokio::test]
async fn a_method_that_reflects_the_request_is_refused() {
    let setup = setup("/").await;
    for method in ["TRACE", "TRACK", "trace", "Trace"] {
        let raw = format!("{method} / HTTP/1.1\r\nHost: api.test\r\n\r\n");
        assert_eq!(status_of(&setup, &raw).await, 405, "{method}");
        for header in [
            "X-HTTP-Method-Override",
            "X-HTTP-Method",
            "X-Method-Override",
        ] {
            let raw = format!("POST / HTTP/1.1\r\nHost: api.test\r\n{header}: {method}\r\n\r\n");
            assert_eq!(status_of(&setup, &raw).await, 405, "{header}: {method}");
        }
    }
    assert!(targets(&setup).is_empty(), "{:?}", targets(&setup));
}

/// Smuggling and tunnelling through an intercepted connection: both `Content-Length` and
/// `Transfer-Encoding` (the body is read as chunked, `Content-Length` never reaches the
/// upstream and the connection ends after the answer, so a request hidden in the body is
/// never read), obs-fold, `CONNECT`, upgrades, `OPTIONS *` (never with the secret) and an
/// oversized head.
#[tokio::test]
async fn smuggling_tunnels_and_oversized_heads_are_refused() {
    let setup = setup("/").await;
    let smuggled = "POST /a HTTP/1.1\r\nHost: api.test\r\nContent-Length: 48\r\n\
                    Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n\
                    GET https://evil.example/ HTTP/1.1\r\nHost: api.test\r\n\r\n";
    let (responses, mut tls) = exchange(&setup, smuggled, 2).await;
    assert_eq!(responses.len(), 1, "{responses:?}");
    assert_eq!(responses[0].0, "HTTP/1.1 200 OK");
    assert!(closed(&mut tls).await);
    {
        let seen = setup.seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        assert_eq!(seen[0].framing, (None, Some("chunked".to_owned())));
    }
    for (raw, code) in [
        (
            "GET /a HTTP/1.1\r\nHost: api.test\r\nX-A: a\r\n folded\r\n\r\n",
            400,
        ),
        (
            "GET /a HTTP/1.0\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n",
            400,
        ),
        (
            "CONNECT api.test:443 HTTP/1.1\r\nHost: api.test\r\n\r\n",
            405,
        ),
        (
            "CONNECT evil.example:443 HTTP/1.1\r\nHost: api.test\r\n\r\n",
            405,
        ),
        (
            "GET /ws HTTP/1.1\r\nHost: api.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            501,
        ),
        (
            "GET /ws HTTP/1.1\r\nHost: api.test\r\nUpgrade: h2c\r\n\r\n",
            501,
        ),
        ("GET * HTTP/1.1\r\nHost: api.test\r\n\r\n", 400),
        ("OPTIONS * HTTP/1.1\r\nHost: api.test\r\n\r\n", 401),
    ] {
        assert_eq!(status_of(&setup, raw).await, code, "{raw:?}");
    }
    let huge = format!(
        "GET /a HTTP/1.1\r\nHost: api.test\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100 << 10)
    );
    assert_eq!(status_of(&setup, &huge).await, 431);
    let seen = setup.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    assert_eq!((seen[1].target.as_str(), seen[1].secret), ("*", false));
}
