//! The gateway exception and the ownership of connections: a connection to the gateway's
//! in-sandbox address reaches the gateway under every policy but `none`, without a name;
//! aborting a relay's `serve` closes every connection it accepted.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use omabox_contract::networking::NetworkPolicy;
use omabox_egress::AddressRules;
use omabox_egress::{Gateway, LocalAddress, Refusal, Relay, RelayConfig, Verdict};
use support::{CountingResolver, limited};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A TCP echo server on loopback; returns its address.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A relay with `gateway` serving on a fresh loopback listener whose local address is the
/// original destination (as inside a sandbox); returns the relay's address.
async fn serve_local(
    policy: NetworkPolicy,
    upstream: SocketAddr,
) -> (SocketAddr, tokio::task::JoinHandle<std::io::Result<()>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let relay = Relay::new(
        policy,
        CountingResolver::new(&[]),
        AddressRules::default(),
        RelayConfig::default(),
    )
    .with_gateway(Gateway {
        dialed: addr,
        upstream,
    });
    let task = tokio::spawn(Arc::new(relay).serve(listener, Arc::new(LocalAddress)));
    (addr, task)
}

#[tokio::test]
async fn the_gateway_is_reached_without_a_name_under_limited_and_unrestricted() {
    let upstream = echo_server().await;
    for policy in [limited(&[]), NetworkPolicy::Unrestricted] {
        let (addr, _task) = serve_local(policy, upstream).await;
        let mut client = TcpStream::connect(addr).await.unwrap();
        // Bytes no sniffer recognises, and the server would speak first: forwarded as is.
        client.write_all(b"\x00\x01not http nor tls").await.unwrap();
        let mut back = [0u8; 18];
        client.read_exact(&mut back).await.unwrap();
        assert_eq!(&back, b"\x00\x01not http nor tls");
    }
}

#[tokio::test]
async fn the_gateway_is_closed_under_none() {
    let upstream = echo_server().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dialed = listener.local_addr().unwrap();
    let relay = Relay::new(
        NetworkPolicy::None,
        CountingResolver::new(&[]),
        AddressRules::default(),
        RelayConfig::default(),
    )
    .with_gateway(Gateway { dialed, upstream });
    let client = TcpStream::connect(dialed).await.unwrap();
    let (accepted, _) = listener.accept().await.unwrap();
    let verdict = relay.handle(accepted, dialed).await;
    assert_eq!(
        verdict,
        Verdict::Refused {
            name: None,
            reason: Refusal::NotAdmitted
        }
    );
    drop(client);
}

#[tokio::test]
async fn aborting_serve_closes_the_connections_it_accepted() {
    let upstream = echo_server().await;
    let (addr, task) = serve_local(limited(&[]), upstream).await;
    let mut client = TcpStream::connect(addr).await.unwrap();
    client.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    client.read_exact(&mut back).await.unwrap();
    task.abort();
    let _ = task.await;
    // The relayed connection was closed with its owner: EOF (or reset), not a hang.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await;
    assert!(
        read.is_ok(),
        "the connection outlived the relay that accepted it"
    );
    assert!(
        TcpStream::connect(addr).await.is_err(),
        "the listener is closed"
    );
}
