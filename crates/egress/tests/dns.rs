//! The DNS stub over real UDP on loopback, with a counting resolver behind it.

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use omabox_contract::networking::NetworkPolicy;
use omabox_egress::AddressRules;
use omabox_egress::dns::{DnsStub, MAX_RESPONSE};
use proptest::prelude::*;
use support::{CountingResolver, limited};
use tokio::net::UdpSocket;

fn query(id: u16, name: &str, qtype: RecordType) -> Vec<u8> {
    let mut m = Message::query();
    m.metadata.id = id;
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    m.to_vec().unwrap()
}

struct Stub {
    client: UdpSocket,
    stub: Arc<DnsStub>,
}

impl Stub {
    async fn start(policy: NetworkPolicy, resolver: Arc<CountingResolver>) -> Self {
        let stub = Arc::new(DnsStub::new(policy, resolver, AddressRules::default()));
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        client.connect(socket.local_addr().unwrap()).await.unwrap();
        tokio::spawn(Arc::clone(&stub).serve(socket));
        Self { client, stub }
    }

    /// Sends `packet`; the response, or `None` when nothing came back within 300 ms.
    async fn ask(&self, packet: &[u8]) -> Option<Message> {
        self.client.send(packet).await.unwrap();
        let mut buf = vec![0u8; 4096];
        let n = tokio::time::timeout(Duration::from_millis(300), self.client.recv(&mut buf))
            .await
            .ok()?
            .unwrap();
        assert!(n <= MAX_RESPONSE, "response of {n} bytes");
        Some(Message::from_vec(&buf[..n]).unwrap())
    }
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    m.answers
        .iter()
        .map(|r| match &r.data {
            RData::A(a) => IpAddr::V4(a.0),
            RData::AAAA(a) => IpAddr::V6(a.0),
            other => panic!("unexpected answer {other:?}"),
        })
        .collect()
}

fn ips(list: &[&str]) -> Vec<IpAddr> {
    list.iter().map(|a| a.parse().unwrap()).collect()
}

#[tokio::test]
async fn an_answered_name_gets_its_reachable_addresses_of_the_asked_family() {
    let resolver = CountingResolver::new(&[(
        "api.allowed.test",
        &[
            "192.0.2.10",
            "2001:db8::1",
            "169.254.169.254",
            "127.0.0.1",
            "::1",
            "192.0.2.11",
        ],
    )]);
    let stub = Stub::start(limited(&["api.allowed.test".into()]), resolver.clone()).await;

    let a = stub
        .ask(&query(7, "API.allowed.test.", RecordType::A))
        .await
        .unwrap();
    assert_eq!(a.metadata.id, 7);
    assert_eq!(a.metadata.message_type, MessageType::Response);
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        a.queries,
        [Query::query(
            Name::from_ascii("API.allowed.test.").unwrap(),
            RecordType::A
        )]
    );
    assert_eq!(addresses(&a), ips(&["192.0.2.10", "192.0.2.11"]));
    assert!(
        a.answers
            .iter()
            .all(|r| r.ttl == omabox_egress::dns::ANSWER_TTL)
    );

    let aaaa = stub
        .ask(&query(8, "api.allowed.test", RecordType::AAAA))
        .await
        .unwrap();
    assert_eq!(addresses(&aaaa), ips(&["2001:db8::1"]));

    // Other types of an answered name: no data, and no lookup.
    let before = resolver.calls();
    for qtype in [RecordType::TXT, RecordType::MX, RecordType::HTTPS] {
        let m = stub
            .ask(&query(9, "api.allowed.test", qtype))
            .await
            .unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty());
    }
    assert_eq!(resolver.calls(), before);
}

#[tokio::test]
async fn refused_names_are_refused_and_never_reach_the_resolver() {
    let resolver = CountingResolver::new(&[("api.allowed.test", &["192.0.2.10"])]);
    let stub = Stub::start(
        limited(&["api.allowed.test".into(), "*.cdn.allowed.test".into()]),
        resolver.clone(),
    )
    .await;
    // Exfiltration: random subdomains of a denied zone, every record type a tunnel uses.
    let mut rng = rand::rng();
    for i in 0..300u16 {
        let label: String = (0..rand::RngExt::random_range(&mut rng, 1..60))
            .map(|_| {
                char::from(
                    b"abcdefghijklmnopqrstuvwxyz0123456789"
                        [rand::RngExt::random_range(&mut rng, 0..36)],
                )
            })
            .collect();
        let qtype = [
            RecordType::A,
            RecordType::AAAA,
            RecordType::TXT,
            RecordType::CNAME,
            RecordType::NULL,
        ][usize::from(i) % 5];
        let name = format!("{label}.exfil.attacker.test");
        let m = stub.ask(&query(i, &name, qtype)).await.expect("an answer");
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
        assert_eq!(m.metadata.id, i);
        assert!(m.answers.is_empty());
    }
    // Near misses of allowed names are refused too.
    for name in [
        "allowed.test",
        "xapi.allowed.test",
        "api.allowed.test.attacker.test",
        "cdn.allowed.test",
    ] {
        let m = stub.ask(&query(1, name, RecordType::A)).await.unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
    }
    assert_eq!(resolver.calls(), 0, "no refused name was looked up");
}

#[tokio::test]
async fn malformed_datagrams_are_dropped_and_the_stub_keeps_answering() {
    let resolver = CountingResolver::new(&[("api.allowed.test", &["192.0.2.10"])]);
    let stub = Stub::start(limited(&["api.allowed.test".into()]), resolver.clone()).await;
    let good = query(3, "api.allowed.test", RecordType::A);
    let mut two_questions = Message::from_vec(&good).unwrap();
    two_questions.add_query(Query::query(
        Name::from_ascii("b.test").unwrap(),
        RecordType::A,
    ));
    let mut a_response = Message::from_vec(&good).unwrap();
    a_response.metadata.message_type = MessageType::Response;
    for bad in [
        Vec::new(),
        b"garbage".to_vec(),
        good[..good.len() - 3].to_vec(),
        two_questions.to_vec().unwrap(),
        a_response.to_vec().unwrap(),
        vec![0u8; 3000],
    ] {
        assert!(stub.ask(&bad).await.is_none(), "{bad:?}");
    }
    assert_eq!(resolver.calls(), 0);
    let m = stub.ask(&good).await.unwrap();
    assert_eq!(addresses(&m), ips(&["192.0.2.10"]));
}

#[tokio::test]
async fn a_failed_lookup_is_servfail_and_long_answers_are_capped() {
    let many: Vec<String> = (1..=60).map(|i| format!("192.0.2.{i}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let long = format!(
        "{}.{}.{}.allowed.test",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63)
    );
    let resolver = CountingResolver::new(&[(&long, &many)]);
    let stub = Stub::start(
        limited(&[long.clone(), "gone.allowed.test".into()]),
        resolver,
    )
    .await;
    let m = stub.ask(&query(1, &long, RecordType::A)).await.unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(
        !m.answers.is_empty() && m.answers.len() <= 8,
        "{}",
        m.answers.len()
    );
    let m = stub
        .ask(&query(2, "gone.allowed.test", RecordType::A))
        .await
        .unwrap();
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
}

#[tokio::test]
async fn a_policy_change_applies_to_the_next_question() {
    let resolver = CountingResolver::new(&[("api.allowed.test", &["192.0.2.10"])]);
    let stub = Stub::start(NetworkPolicy::None, resolver.clone()).await;
    let q = query(1, "api.allowed.test", RecordType::A);
    assert_eq!(
        stub.ask(&q).await.unwrap().metadata.response_code,
        ResponseCode::Refused
    );
    stub.stub.set_policy(limited(&["api.allowed.test".into()]));
    assert_eq!(
        addresses(&stub.ask(&q).await.unwrap()),
        ips(&["192.0.2.10"])
    );
    assert_eq!(resolver.calls(), 1);
}

#[tokio::test]
async fn the_gateway_name_is_pinned_to_its_loopback_address_but_not_under_none() {
    let resolver = CountingResolver::new(&[]);
    let stub = DnsStub::new(limited(&[]), resolver.clone(), AddressRules::default())
        .with_pinned("Gateway.Example.", "127.0.0.1".parse().unwrap());
    let answer = |qtype| {
        let packet = query(7, "gateway.example", qtype);
        let stub = &stub;
        async move { Message::from_vec(&stub.answer(&packet, peer()).await.unwrap()).unwrap() }
    };
    let a = answer(RecordType::A).await;
    assert_eq!(a.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&a), ips(&["127.0.0.1"]));
    let aaaa = answer(RecordType::AAAA).await;
    assert_eq!(aaaa.metadata.response_code, ResponseCode::NoError);
    assert!(addresses(&aaaa).is_empty());
    stub.set_policy(NetworkPolicy::None);
    assert_eq!(
        answer(RecordType::A).await.metadata.response_code,
        ResponseCode::Refused
    );
    assert_eq!(
        resolver.calls(),
        0,
        "a pinned name never reaches the resolver"
    );
}

#[tokio::test]
async fn dns_over_tcp_answers_like_udp_and_drops_oversized_or_silent_clients() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let resolver = CountingResolver::new(&[("api.allowed.test", &["192.0.2.10"])]);
    let stub = Arc::new(DnsStub::new(
        limited(&["api.allowed.test".into()]),
        resolver,
        AddressRules::default(),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(Arc::clone(&stub).serve_tcp(listener));
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    // Two questions on one connection, each length-prefixed.
    for (id, name, code) in [
        (1, "api.allowed.test", ResponseCode::NoError),
        (2, "exfil.denied.test", ResponseCode::Refused),
    ] {
        let q = query(id, name, RecordType::A);
        tcp.write_u16(q.len() as u16).await.unwrap();
        tcp.write_all(&q).await.unwrap();
        let len = tcp.read_u16().await.unwrap() as usize;
        let mut buf = vec![0u8; len];
        tcp.read_exact(&mut buf).await.unwrap();
        let m = Message::from_vec(&buf).unwrap();
        assert_eq!((m.metadata.id, m.metadata.response_code), (id, code));
    }
    // A length beyond the cap closes the connection without reading the body.
    tcp.write_u16(60000).await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut rest))
        .await
        .expect("closed, not hung")
        .unwrap_or(0);
    assert_eq!(n, 0);
}

fn peer() -> SocketAddr {
    "127.0.0.1:5353".parse().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// Any datagram: no panic, a bounded response, and no lookup of a refused name.
    #[test]
    fn random_datagrams_never_panic(packet in proptest::collection::vec(any::<u8>(), 0..1500), flips in proptest::collection::vec((0usize..64, any::<u8>()), 0..6)) {
        let resolver = CountingResolver::new(&[]);
        let stub = DnsStub::new(NetworkPolicy::None, resolver.clone(), AddressRules::default());
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let mut mutated = query(9, "a.attacker.test", RecordType::A);
        for (at, byte) in flips {
            let at = at % mutated.len();
            mutated[at] = byte;
        }
        for p in [packet, mutated] {
            if let Some(response) = runtime.block_on(stub.answer(&p, peer())) {
                prop_assert!(response.len() <= MAX_RESPONSE);
            }
        }
        prop_assert_eq!(resolver.calls(), 0);
    }
}
