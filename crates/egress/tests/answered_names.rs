//! The DNS stub and the relay sharing `ResolvedNames`: a connection that names nothing is
//! admitted only to an address the stub recently answered for a name the policy admits.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RecordType};
use omabox_egress::dns::DnsStub;
use omabox_egress::{NoName, Refusal, Relay, RelayConfig, ResolvedNames, SniffLimits, Verdict};
use support::{CountingResolver, limited, loopback_rules};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn query(name: &str) -> Vec<u8> {
    let mut m = Message::new();
    m.set_id(1)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
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
