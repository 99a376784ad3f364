//! The relay on loopback: upstream TLS and HTTP servers on 127.0.0.0/8, the relay in front
//! of them with the original destination given directly.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use omabox_contract::networking::NetworkPolicy;
use omabox_egress::{
    AddressRange, AddressRules, FixedDestination, NoName, Refusal, Relay, RelayConfig, Verdict,
};
use support::{CountingResolver, limited, loopback_rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn local(s: &str) -> SocketAddr {
    s.parse().unwrap()
}

fn config() -> RelayConfig {
    RelayConfig {
        sniff: omabox_egress::SniffLimits {
            timeout: Duration::from_secs(2),
            ..Default::default()
        },
        connect_timeout: Duration::from_secs(2),
        ..RelayConfig::default()
    }
}

/// A relay serving on its own loopback port; every connection's original destination is
/// `original`.
async fn serve(relay: Relay, original: SocketAddr) -> (Arc<Relay>, SocketAddr) {
    let relay = Arc::new(relay);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&relay).serve(listener, Arc::new(FixedDestination(original))));
    (relay, addr)
}

/// One connection through `relay.handle`, returning the client side and the verdict.
async fn one(
    relay: Arc<Relay>,
    original: SocketAddr,
) -> (TcpStream, tokio::task::JoinHandle<Verdict>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let verdict = tokio::spawn(async move { relay.handle(accepted, original).await });
    (client, verdict)
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[tokio::test]
async fn an_allowed_tls_name_is_relayed_with_bytes_intact_both_ways() {
    let (upstream, connector) =
        support::tls_echo_server(local("127.0.0.1:0"), &["allowed.test"]).await;
    let resolver = CountingResolver::new(&[("allowed.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("allowed.test:{}", upstream.addr.port())]);
    let (_relay, addr) = serve(
        Relay::new(policy, resolver.clone(), loopback_rules(), config()),
        upstream.addr,
    )
    .await;

    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("allowed.test").unwrap();
    let tls = connector
        .connect(name, tcp)
        .await
        .expect("handshake through the relay");
    let (mut r, mut w) = tokio::io::split(tls);
    let sent = pattern(1 << 20);
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        w.write_all(&to_send).await.unwrap();
        w.flush().await.unwrap();
        w
    });
    let mut echoed = vec![0u8; sent.len()];
    r.read_exact(&mut echoed).await.unwrap();
    assert!(echoed == sent, "the echo came back intact");
    drop(writer.await.unwrap());
    assert_eq!(upstream.accepts(), 1);
    assert_eq!(resolver.calls(), 1);
}

#[tokio::test]
async fn an_allowed_http_host_is_relayed_and_the_upstream_sees_the_exact_request() {
    let (upstream, heads) = support::http_server(local("127.0.0.1:0")).await;
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("web.test:{}", upstream.addr.port())]);
    let (_relay, addr) = serve(
        Relay::new(policy, resolver, loopback_rules(), config()),
        upstream.addr,
    )
    .await;

    let request = format!(
        "GET /a?b=c HTTP/1.1\r\nHost: Web.Test:{}\r\nX-Odd:  spaced \r\n\r\n",
        upstream.addr.port()
    );
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(request.as_bytes()).await.unwrap();
    let response = support::read_to_end(&mut client, 1 << 16).await;
    assert!(response.starts_with(b"HTTP/1.1 200 OK\r\n"));
    assert!(response.ends_with(b"hello"));
    assert_eq!(heads.lock().unwrap().as_slice(), [request.into_bytes()]);
}

#[tokio::test]
async fn a_denied_name_is_refused_before_any_upstream_connection_or_lookup() {
    let (upstream, connector) =
        support::tls_echo_server(local("127.0.0.1:0"), &["allowed.test"]).await;
    let (http, _) = support::http_server(local("127.0.0.1:0")).await;
    let resolver = CountingResolver::new(&[
        ("allowed.test", &["127.0.0.1"]),
        ("denied.test", &["127.0.0.1"]),
    ]);
    let policy = limited(&[format!("allowed.test:{}", upstream.addr.port())]);
    let relay = Arc::new(Relay::new(
        policy,
        resolver.clone(),
        loopback_rules(),
        config(),
    ));

    // TLS with a denied SNI, dialing the allowed upstream's own address.
    let (tcp, verdict) = one(Arc::clone(&relay), upstream.addr).await;
    let name = rustls::pki_types::ServerName::try_from("denied.test").unwrap();
    assert!(connector.connect(name, tcp).await.is_err());
    assert_eq!(
        verdict.await.unwrap(),
        Verdict::Refused {
            name: Some("denied.test".into()),
            reason: Refusal::NotAdmitted
        }
    );

    // HTTP with a denied Host is told 403.
    let (mut tcp, verdict) = one(Arc::clone(&relay), http.addr).await;
    tcp.write_all(b"GET / HTTP/1.1\r\nHost: denied.test\r\n\r\n")
        .await
        .unwrap();
    let response = support::read_to_end(&mut tcp, 1 << 16).await;
    assert!(
        response.starts_with(b"HTTP/1.1 403 Forbidden\r\n"),
        "{response:?}"
    );
    assert!(matches!(
        verdict.await.unwrap(),
        Verdict::Refused {
            reason: Refusal::NotAdmitted,
            ..
        }
    ));

    // No name at all (raw bytes to an allowed address) is refused too.
    let (mut tcp, verdict) = one(Arc::clone(&relay), upstream.addr).await;
    tcp.write_all(b"\x00raw").await.unwrap();
    assert_eq!(
        verdict.await.unwrap(),
        Verdict::Refused {
            name: None,
            reason: Refusal::NoName(NoName::Unrecognized)
        }
    );

    // The allowed name on another port is a different destination.
    let (tcp, verdict) = one(Arc::clone(&relay), local("127.0.0.1:1")).await;
    let name = rustls::pki_types::ServerName::try_from("allowed.test").unwrap();
    assert!(connector.connect(name, tcp).await.is_err());
    assert!(matches!(
        verdict.await.unwrap(),
        Verdict::Refused {
            reason: Refusal::NotAdmitted,
            ..
        }
    ));

    assert_eq!(upstream.accepts(), 0);
    assert_eq!(http.accepts(), 0);
    assert_eq!(resolver.calls(), 0, "a refused name is never looked up");
}

#[tokio::test]
async fn the_production_rules_refuse_an_allowed_name_that_resolves_to_loopback() {
    let (upstream, connector) =
        support::tls_echo_server(local("127.0.0.1:0"), &["allowed.test"]).await;
    let resolver = CountingResolver::new(&[
        ("allowed.test", &["127.0.0.1"]),
        ("metadata.test", &["169.254.169.254", "::ffff:127.0.0.1"]),
    ]);
    let port = upstream.addr.port();
    let policy = || {
        limited(&[
            format!("allowed.test:{port}"),
            format!("metadata.test:{port}"),
        ])
    };
    let cases = [
        ("allowed.test", AddressRules::default()),
        ("metadata.test", loopback_rules()),
        (
            "allowed.test",
            loopback_rules().deny([AddressRange::new("127.0.0.0".parse().unwrap(), 8).unwrap()]),
        ),
    ];
    for (name, rules) in cases {
        let relay = Arc::new(Relay::new(policy(), resolver.clone(), rules, config()));
        let (tcp, verdict) = one(relay, upstream.addr).await;
        let server_name = rustls::pki_types::ServerName::try_from(name).unwrap();
        assert!(connector.connect(server_name, tcp).await.is_err());
        assert_eq!(
            verdict.await.unwrap(),
            Verdict::Refused {
                name: Some(name.into()),
                reason: Refusal::AddressRefused
            },
            "{name}"
        );
    }
    assert_eq!(upstream.accepts(), 0);
}

/// Under `unrestricted`, a name resolving to any cloud metadata address, in any IPv6 form
/// that reaches it, is refused before a connection is tried (before: Alibaba's, Azure's
/// wireserver, Oracle's and the NAT64 forms were connected to).
#[tokio::test]
async fn every_cloud_metadata_address_is_refused_under_unrestricted() {
    let addresses = [
        "169.254.169.254",
        "169.254.170.2",
        "100.100.100.200",
        "168.63.129.16",
        "192.0.0.192",
        "fd00:ec2::254",
        "fd00:ec2::253",
        "::ffff:100.100.100.200",
        "::168.63.129.16",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::6464:64c8",
        "64:ff9b::a83f:8110",
        "64:ff9b::c000:c0",
        "64:ff9b:1:a9fe:a9:fe00::",
    ];
    let entries: Vec<(String, [&str; 1])> = addresses
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("meta{i}.test"), [*a]))
        .collect();
    let entries: Vec<(&str, &[&str])> = entries.iter().map(|(n, a)| (n.as_str(), &a[..])).collect();
    let resolver = CountingResolver::new(&entries);
    let relay = Arc::new(Relay::new(
        NetworkPolicy::Unrestricted,
        resolver,
        AddressRules::default(),
        config(),
    ));
    for (i, address) in addresses.iter().enumerate() {
        let name = format!("meta{i}.test");
        let (mut tcp, verdict) = one(Arc::clone(&relay), local("198.18.0.1:80")).await;
        tcp.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(
            verdict.await.unwrap(),
            Verdict::Refused {
                name: Some(name),
                reason: Refusal::AddressRefused
            },
            "{address}"
        );
    }
}

/// The name decides and the host's resolution picks the address: dialing a decoy address
/// with an allowed name's SNI reaches the allowed name's server, never the decoy.
#[tokio::test]
async fn the_name_not_the_dialed_address_decides_where_the_connection_goes() {
    let (acceptor, connector) = support::tls_identity(&["allowed.test", "both.test"]);
    // Find a port free on both 127.0.0.1 and 127.0.0.2 (retried, never skipped).
    let mut attempts = 0;
    let real = loop {
        let real = support::tls_echo_server_with(local("127.0.0.1:0"), acceptor.clone()).await;
        let decoy_addr = SocketAddr::from(([127, 0, 0, 2], real.addr.port()));
        if TcpListener::bind(decoy_addr).await.is_ok() {
            break real;
        }
        attempts += 1;
        assert!(
            attempts < 20,
            "no port free on both 127.0.0.1 and 127.0.0.2"
        );
    };
    let port = real.addr.port();
    let decoy =
        support::tls_echo_server_with(SocketAddr::from(([127, 0, 0, 2], port)), acceptor).await;
    let resolver = CountingResolver::new(&[
        ("allowed.test", &["127.0.0.1"]),
        ("both.test", &["127.0.0.2", "127.0.0.1"]),
    ]);
    let policy = limited(&[format!("allowed.test:{port}"), format!("both.test:{port}")]);
    let relay = Arc::new(Relay::new(policy, resolver, loopback_rules(), config()));

    let cases = [
        // Dialed the decoy with the allowed name: goes to the allowed name's address.
        ("allowed.test", decoy.addr, real.addr),
        // Dialed one of the name's own addresses: that one is kept.
        ("both.test", real.addr, real.addr),
        // Dialed an address the name does not have: the host's first address.
        (
            "both.test",
            SocketAddr::from(([127, 0, 0, 3], port)),
            decoy.addr,
        ),
    ];
    for (name, dialed, expected) in cases {
        let (tcp, verdict) = one(Arc::clone(&relay), dialed).await;
        let mut tls = connector
            .connect(rustls::pki_types::ServerName::try_from(name).unwrap(), tcp)
            .await
            .unwrap();
        tls.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        tls.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"ping");
        drop(tls);
        assert_eq!(
            verdict.await.unwrap(),
            Verdict::Relayed {
                name: name.into(),
                upstream: expected
            },
            "{name} dialed at {dialed}"
        );
    }
    assert_eq!((real.accepts(), decoy.accepts()), (2, 1));
}

#[tokio::test]
async fn a_policy_change_applies_to_the_next_connection() {
    let (upstream, _) = support::http_server(local("127.0.0.1:0")).await;
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("web.test:{}", upstream.addr.port())]);
    let (relay, addr) = serve(
        Relay::new(policy, resolver, loopback_rules(), config()),
        upstream.addr,
    )
    .await;
    let get = |mut client: TcpStream| async move {
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
            .await
            .unwrap();
        support::read_to_end(&mut client, 1 << 16).await
    };
    assert!(
        get(TcpStream::connect(addr).await.unwrap())
            .await
            .ends_with(b"hello")
    );
    relay.set_policy(NetworkPolicy::None);
    assert!(
        get(TcpStream::connect(addr).await.unwrap())
            .await
            .starts_with(b"HTTP/1.1 403")
    );
    assert_eq!(upstream.accepts(), 1);
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let (upstream, _) = support::http_server(local("127.0.0.1:0")).await;
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("web.test:{}", upstream.addr.port())]);
    let capped = RelayConfig {
        max_connections: 1,
        ..config()
    };
    let (_relay, addr) = serve(
        Relay::new(policy, resolver, loopback_rules(), capped),
        upstream.addr,
    )
    .await;
    // The first connection holds the only slot while it sends nothing.
    let _holder = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let mut second = TcpStream::connect(addr).await.unwrap();
    second
        .write_all(b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n")
        .await
        .ok();
    let response = support::read_to_end(&mut second, 1 << 16).await;
    assert!(response.is_empty());
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "closed without waiting for the slot"
    );
    assert_eq!(upstream.accepts(), 0);
}

#[tokio::test]
async fn an_idle_relayed_connection_is_closed() {
    let upstream = support::tcp_echo_server(local("127.0.0.1:0")).await;
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("web.test:{}", upstream.addr.port())]);
    let idle = RelayConfig {
        idle_timeout: Duration::from_millis(300),
        ..config()
    };
    let relay = Arc::new(Relay::new(policy, resolver, loopback_rules(), idle));
    let (mut client, verdict) = one(relay, upstream.addr).await;
    let head = b"GET / HTTP/1.1\r\nHost: web.test\r\n\r\n";
    client.write_all(head).await.unwrap();
    let mut echoed = vec![0u8; head.len()];
    client.read_exact(&mut echoed).await.unwrap();
    let started = Instant::now();
    let rest = support::read_to_end(&mut client, 16).await;
    assert!(rest.is_empty());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(250) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(matches!(verdict.await.unwrap(), Verdict::Relayed { .. }));
}

/// The client half-closes after its request; the upstream answers only after reading to
/// EOF, and the client still gets the whole answer and then EOF.
#[tokio::test]
async fn a_half_close_is_passed_on_and_the_answer_still_arrives() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        stream.read_to_end(&mut request).await.unwrap();
        let answer: Vec<u8> = request
            .iter()
            .rev()
            .copied()
            .cycle()
            .take(3 << 20)
            .collect();
        stream.write_all(&answer).await.unwrap();
        stream.shutdown().await.unwrap();
    });
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let policy = limited(&[format!("web.test:{}", upstream.port())]);
    let relay = Arc::new(Relay::new(policy, resolver, loopback_rules(), config()));
    let (mut client, verdict) = one(relay, upstream).await;
    let mut request = b"PUT / HTTP/1.1\r\nHost: web.test\r\n\r\n".to_vec();
    request.extend(pattern(200_000));
    client.write_all(&request).await.unwrap();
    client.shutdown().await.unwrap();
    let answer = support::read_to_end(&mut client, 4 << 20).await;
    let expected: Vec<u8> = request
        .iter()
        .rev()
        .copied()
        .cycle()
        .take(3 << 20)
        .collect();
    assert!(answer == expected, "{} bytes back", answer.len());
    assert!(matches!(verdict.await.unwrap(), Verdict::Relayed { .. }));
}
