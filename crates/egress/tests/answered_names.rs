//! The DNS stub and the relay sharing `ResolvedNames`: a connection that names nothing is
//! admitted only to an address the stub recently answered for a name the policy admits.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use omabox_egress::dns::DnsStub;
use omabox_egress::{
    NoName, Refusal, Relay, RelayConfig, ResolvedNames, SniffLimits, SyntheticAddresses, Verdict,
};
use support::{CountingResolver, limited, loopback_rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn query(name: &str) -> Vec<u8> {
    let mut m = Message::new(1, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    m.to_vec().unwrap()
}

/// Raw bytes (no name) to `original` through `relay`: the verdict and what came back.
async fn raw(relay: Arc<Relay>, original: SocketAddr) -> (Verdict, Vec<u8>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let verdict = tokio::spawn(async move { relay.handle(accepted, original).await });
    client.write_all(b"\x00SSH-ish raw bytes").await.unwrap();
    let mut back = vec![0u8; 18];
    let got = match tokio::time::timeout(Duration::from_secs(2), client.read_exact(&mut back)).await
    {
        Ok(Ok(_)) => back,
        _ => Vec::new(),
    };
    drop(client);
    (verdict.await.unwrap(), got)
}

#[tokio::test]
async fn a_nameless_connection_is_admitted_only_to_a_freshly_answered_allowed_address() {
    let upstream = support::tcp_echo_server("127.0.0.1:0".parse().unwrap()).await;
    let port = upstream.addr.port();
    let resolver = CountingResolver::new(&[("git.test", &["127.0.0.1"])]);
    let names = Arc::new(ResolvedNames::new(Duration::from_millis(1500), 64));
    let policy = || limited(&[format!("git.test:{port}")]);
    let stub = DnsStub::new(policy(), resolver.clone(), loopback_rules())
        .with_resolved_names(Arc::clone(&names));
    let config = RelayConfig {
        sniff: SniffLimits {
            timeout: Duration::from_millis(300),
            ..SniffLimits::default()
        },
        ..RelayConfig::default()
    };
    let relay = Arc::new(
        Relay::new(policy(), resolver, loopback_rules(), config)
            .with_resolved_names(Arc::clone(&names)),
    );
    let peer = "127.0.0.1:5353".parse().unwrap();

    // Before any answer: no name, refused.
    let (verdict, _) = raw(Arc::clone(&relay), upstream.addr).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: None,
            reason: Refusal::NoName(NoName::Unrecognized)
        }
    );

    // After the stub answered git.test with 127.0.0.1: admitted, bytes intact.
    assert!(stub.answer(&query("git.test"), peer).await.is_some());
    let (verdict, echoed) = raw(Arc::clone(&relay), upstream.addr).await;
    assert_eq!(echoed, b"\x00SSH-ish raw bytes");
    assert_eq!(
        verdict,
        Verdict::Relayed {
            name: "git.test".into(),
            upstream: upstream.addr
        }
    );

    // Another port of the same address is not admitted for that name.
    let other_port = SocketAddr::new(upstream.addr.ip(), port.wrapping_add(1).max(1));
    let (verdict, _) = raw(Arc::clone(&relay), other_port).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: Some("git.test".into()),
            reason: Refusal::NotAdmitted
        }
    );

    // A narrowed policy applies to recorded answers too.
    relay.set_policy(limited(&[]));
    let (verdict, _) = raw(Arc::clone(&relay), upstream.addr).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: Some("git.test".into()),
            reason: Refusal::NotAdmitted
        }
    );
    relay.set_policy(policy());

    // Once the answer is stale: refused again.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let (verdict, _) = raw(Arc::clone(&relay), upstream.addr).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: None,
            reason: Refusal::NoName(NoName::Unrecognized)
        }
    );
    assert_eq!(upstream.accepts(), 1);
}

/// A server-speaks-first protocol (the client sends nothing) to an answered address is
/// admitted after `answered_wait`, not the whole sniff timeout.
#[tokio::test]
async fn a_server_speaks_first_protocol_waits_only_the_answered_wait() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        stream.write_all(b"220 smtp.test ready\r\n").await.unwrap();
        let _ = stream.shutdown().await;
    });
    let resolver = CountingResolver::new(&[("smtp.test", &["127.0.0.1"])]);
    let names = Arc::new(ResolvedNames::new(Duration::from_secs(60), 64));
    let policy = || limited(&[format!("smtp.test:{}", upstream.port())]);
    let stub = DnsStub::new(policy(), resolver.clone(), loopback_rules())
        .with_resolved_names(Arc::clone(&names));
    assert!(
        stub.answer(&query("smtp.test"), "127.0.0.1:5353".parse().unwrap())
            .await
            .is_some()
    );
    let config = RelayConfig {
        answered_wait: Duration::from_millis(200),
        ..RelayConfig::default()
    };
    let relay = Arc::new(
        Relay::new(policy(), resolver, loopback_rules(), config).with_resolved_names(names),
    );
    let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(front.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = front.accept().await.unwrap();
    let started = std::time::Instant::now();
    let verdict = tokio::spawn(async move { relay.handle(accepted, upstream).await });
    let banner = support::read_to_end(&mut client, 1024).await;
    assert_eq!(banner, b"220 smtp.test ready\r\n");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(150) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    drop(client);
    assert_eq!(
        verdict.await.unwrap(),
        Verdict::Relayed {
            name: "smtp.test".into(),
            upstream
        }
    );
}

/// The answer's addresses, as the client reads them.
fn answered(response: Vec<u8>) -> Vec<std::net::IpAddr> {
    Message::from_vec(&response)
        .unwrap()
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            hickory_proto::rr::RData::A(a) => Some(std::net::IpAddr::V4(a.0)),
            hickory_proto::rr::RData::AAAA(a) => Some(std::net::IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// A namespace with no route out: the stub hands out a synthetic loopback address per
/// admitted name, and the relay takes a connection to it to the host's own resolution of
/// that name (never to the synthetic address, where nothing listens).
#[tokio::test]
async fn a_synthetic_answer_leads_to_the_hosts_resolution_of_its_name() {
    let upstream = support::tcp_echo_server("127.0.0.1:0".parse().unwrap()).await;
    let port = upstream.addr.port();
    let resolver =
        CountingResolver::new(&[("git.test", &["127.0.0.1"]), ("other.test", &["127.0.0.1"])]);
    let names = Arc::new(ResolvedNames::new(Duration::from_secs(60), 64));
    let pool = Arc::new(SyntheticAddresses::new(16));
    let policy = || limited(&[format!("git.test:{port}"), "other.test".to_owned()]);
    let stub = DnsStub::new(policy(), resolver.clone(), loopback_rules())
        .with_resolved_names(Arc::clone(&names))
        .with_synthetic(Arc::clone(&pool));
    let peer: SocketAddr = "127.0.0.1:5353".parse().unwrap();

    let a = answered(stub.answer(&query("git.test"), peer).await.unwrap());
    assert_eq!(a, ["127.64.0.1".parse::<std::net::IpAddr>().unwrap()]);
    // Stable per name, distinct across names, no IPv6 answer.
    assert_eq!(
        answered(stub.answer(&query("git.test"), peer).await.unwrap()),
        a
    );
    let b = answered(stub.answer(&query("other.test"), peer).await.unwrap());
    assert_eq!(b.len(), 1);
    assert_ne!(a, b);
    let mut aaaa = Message::new(2, MessageType::Query, OpCode::Query);
    aaaa.add_query(Query::query(
        Name::from_ascii("git.test").unwrap(),
        RecordType::AAAA,
    ));
    assert!(answered(stub.answer(&aaaa.to_vec().unwrap(), peer).await.unwrap()).is_empty());

    let relay = Arc::new(
        Relay::new(policy(), resolver, loopback_rules(), RelayConfig::default())
            .with_resolved_names(Arc::clone(&names)),
    );
    // A name-less connection to git.test's synthetic address reaches the upstream the host
    // resolved git.test to.
    let dialed = SocketAddr::new(a[0], port);
    let (verdict, echoed) = raw(Arc::clone(&relay), dialed).await;
    assert_eq!(echoed, b"\x00SSH-ish raw bytes");
    assert_eq!(
        verdict,
        Verdict::Relayed {
            name: "git.test".into(),
            upstream: upstream.addr
        }
    );
    // other.test's address on git.test's port: judged as other.test (80/443 only): refused.
    let (verdict, _) = raw(Arc::clone(&relay), SocketAddr::new(b[0], port)).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: Some("other.test".into()),
            reason: Refusal::NotAdmitted
        }
    );
    // A synthetic address the stub never handed out names nothing.
    let (verdict, _) = raw(relay, SocketAddr::new("127.64.9.9".parse().unwrap(), port)).await;
    assert!(
        matches!(verdict, Verdict::Refused { name: None, .. }),
        "{verdict:?}"
    );
    assert_eq!(upstream.accepts(), 1);
}

/// An HTTP request whose absolute-form target names another host than its `Host`, or whose
/// `Host` is no name (`web.test@evil.test`), is refused with 403, even on an address the
/// stub answered for an admitted name (before: it had no name, so the answered name admitted
/// it and the upstream got a request naming the other host).
#[tokio::test]
async fn a_request_naming_two_hosts_is_refused_even_to_an_answered_address() {
    let (upstream, heads) = support::http_server("127.0.0.1:0".parse().unwrap()).await;
    let port = upstream.addr.port();
    let resolver = CountingResolver::new(&[("web.test", &["127.0.0.1"])]);
    let names = Arc::new(ResolvedNames::new(Duration::from_secs(60), 64));
    let policy = || limited(&[format!("web.test:{port}")]);
    let stub = DnsStub::new(policy(), resolver.clone(), loopback_rules())
        .with_resolved_names(Arc::clone(&names))
        .with_synthetic(Arc::new(SyntheticAddresses::new(16)));
    let peer: SocketAddr = "127.0.0.1:5353".parse().unwrap();
    let synthetic = answered(stub.answer(&query("web.test"), peer).await.unwrap())[0];
    let relay = Arc::new(
        Relay::new(policy(), resolver, loopback_rules(), RelayConfig::default())
            .with_resolved_names(names),
    );
    for request in [
        format!("GET http://evil.test/x HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n"),
        format!("GET http://web.test@evil.test/ HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n"),
        format!("CONNECT evil.test:443 HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nHost: web.test@evil.test:{port}\r\n\r\n"),
        format!("GET / HTTP/1.1\r\nHost: web.test:{port}:{port}\r\n\r\n"),
    ] {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (accepted, _) = listener.accept().await.unwrap();
        let relay = Arc::clone(&relay);
        let dialed = SocketAddr::new(synthetic, port);
        let verdict = tokio::spawn(async move { relay.handle(accepted, dialed).await });
        client.write_all(request.as_bytes()).await.unwrap();
        let response = support::read_to_end(&mut client, 4096).await;
        assert!(
            response.starts_with(b"HTTP/1.1 403 Forbidden\r\n"),
            "{request:?}: {}",
            String::from_utf8_lossy(&response)
        );
        assert!(
            matches!(
                verdict.await.unwrap(),
                Verdict::Refused {
                    name: None,
                    reason: Refusal::NoName(NoName::ConflictingAuthority | NoName::InvalidName)
                }
            ),
            "{request:?}"
        );
    }
    // The same target naming web.test itself goes through.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut client = TcpStream::connect(listener.local_addr().unwrap())
        .await
        .unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let dialed = SocketAddr::new(synthetic, port);
    let verdict = tokio::spawn(async move { relay.handle(accepted, dialed).await });
    let request = format!("GET http://web.test:{port}/x HTTP/1.1\r\nHost: web.test:{port}\r\n\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    assert!(
        support::read_to_end(&mut client, 4096)
            .await
            .ends_with(b"hello")
    );
    drop(client);
    assert!(matches!(verdict.await.unwrap(), Verdict::Relayed { .. }));
    assert_eq!(heads.lock().unwrap().as_slice(), [request.into_bytes()]);
    assert_eq!(upstream.accepts(), 1);
}
