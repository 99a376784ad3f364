//! `sniff` against real ClientHellos, HTTP heads and hostile input.

use std::sync::Arc;
use std::time::{Duration, Instant};

use omabox_egress::{NoName, Protocol, SniffLimits, sniff};
use proptest::prelude::*;
use tokio::io::AsyncWriteExt;

/// The first flight of a rustls client for `server_name` (a name or an IP literal).
fn client_hello(server_name: &str) -> Vec<u8> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(server_name.to_owned()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

fn limits() -> SniffLimits {
    SniffLimits {
        max_bytes: 16 * 1024,
        timeout: Duration::from_millis(300),
    }
}

async fn sniff_bytes(input: &[u8]) -> omabox_egress::Sniffed {
    let mut reader = input;
    sniff(&mut reader, limits()).await
}

#[tokio::test]
async fn a_client_hello_names_its_sni_and_every_byte_is_kept() {
    let hello = client_hello("API.Example.com");
    let sniffed = sniff_bytes(&hello).await;
    let name = sniffed.outcome.unwrap();
    assert_eq!(name.name, "api.example.com");
    assert_eq!(name.protocol, Protocol::Tls);
    assert_eq!(sniffed.bytes, hello);
}

#[tokio::test]
async fn a_client_hello_trickled_byte_by_byte_still_names_its_sni() {
    let hello = client_hello("example.com");
    let (mut client, mut server) = tokio::io::duplex(64);
    let sent = hello.clone();
    tokio::spawn(async move {
        for b in sent {
            client.write_all(&[b]).await.unwrap();
        }
        // Keep the stream open: the name must come from the bytes, not from EOF.
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    let sniffed = sniff(
        &mut server,
        SniffLimits {
            timeout: Duration::from_secs(5),
            ..limits()
        },
    )
    .await;
    assert_eq!(sniffed.outcome.unwrap().name, "example.com");
    assert_eq!(sniffed.bytes, hello);
}

#[tokio::test]
async fn tls_to_an_address_has_no_sni() {
    let sniffed = sniff_bytes(&client_hello("192.0.2.1")).await;
    assert_eq!(sniffed.outcome, Err(NoName::TlsWithoutSni));
}

#[tokio::test]
async fn an_http_request_names_its_host_without_the_port() {
    let head = b"GET /x HTTP/1.1\r\nHost: Files.Example.org:8080\r\nAccept: */*\r\n\r\nbody";
    let sniffed = sniff_bytes(head).await;
    let name = sniffed.outcome.unwrap();
    assert_eq!(name.name, "files.example.org");
    assert_eq!(name.protocol, Protocol::Http);
    assert_eq!(sniffed.bytes, head);
}

#[tokio::test]
async fn http_without_one_host_or_with_an_address_has_no_name() {
    for (head, expected) in [
        (&b"GET / HTTP/1.1\r\n\r\n"[..], NoName::HttpWithoutHost),
        (
            b"GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n",
            NoName::HttpWithoutHost,
        ),
        (
            b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
            NoName::InvalidName,
        ),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", NoName::InvalidName),
        (b"GET / HTTP/1.0\r\nHost\r\n\r\n", NoName::Unrecognized),
    ] {
        assert_eq!(sniff_bytes(head).await.outcome, Err(expected), "{head:?}");
    }
}

#[tokio::test]
async fn garbage_is_refused_at_once_and_truncation_at_eof() {
    let started = Instant::now();
    assert_eq!(
        sniff_bytes(b"\x00\x01binary").await.outcome,
        Err(NoName::Unrecognized)
    );
    assert_eq!(
        sniff_bytes(b"SSH-2.0-OpenSSH_9.6\r\n").await.outcome,
        Err(NoName::Unrecognized)
    );
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "decided without waiting"
    );
    let hello = client_hello("example.com");
    assert_eq!(
        sniff_bytes(&hello[..hello.len() / 2]).await.outcome,
        Err(NoName::Closed)
    );
    assert_eq!(
        sniff_bytes(b"GET / HTTP/1.1\r\nHo").await.outcome,
        Err(NoName::Closed)
    );
    assert_eq!(sniff_bytes(b"").await.outcome, Err(NoName::Closed));
}

#[tokio::test]
async fn an_oversized_head_stops_at_the_byte_cap() {
    let mut head = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
    head.extend(std::iter::repeat_n(b'a', 64 * 1024));
    let sniffed = sniff_bytes(&head).await;
    assert_eq!(sniffed.outcome, Err(NoName::TooLarge));
    assert_eq!(sniffed.bytes.len(), 16 * 1024);
    // A TLS record claiming more than the cap is not waited for beyond it either.
    let mut record = vec![
        0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0x00, 0xff, 0xfb, 0x03, 0x03,
    ];
    record.extend(std::iter::repeat_n(0u8, 40 * 1024));
    let sniffed = sniff_bytes(&record).await;
    assert!(sniffed.outcome.is_err());
    assert!(sniffed.bytes.len() <= 16 * 1024);
}

#[tokio::test]
async fn a_slowloris_client_is_cut_off_at_the_timeout() {
    let (mut client, mut server) = tokio::io::duplex(64);
    tokio::spawn(async move {
        for b in b"GET / HTTP/1.1\r\nHost: slow.example" {
            if client.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let started = Instant::now();
    let sniffed = sniff(&mut server, limits()).await;
    assert_eq!(sniffed.outcome, Err(NoName::Timeout));
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(!sniffed.bytes.is_empty());
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn check_bounded(input: &[u8]) {
    let sniffed = runtime().block_on(sniff_bytes(input));
    assert!(sniffed.bytes.len() <= 16 * 1024);
    assert!(
        input.starts_with(&sniffed.bytes),
        "kept bytes are a prefix of the input"
    );
    if let Ok(name) = sniffed.outcome {
        assert!(
            omabox_contract::networking::normalize_name(&name.name).as_deref() == Some(&*name.name)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic_and_stay_bounded(input in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        check_bounded(&input);
    }

    #[test]
    fn damaged_client_hellos_never_panic(cut in 0usize..600, flips in proptest::collection::vec((0usize..600, any::<u8>()), 0..8)) {
        let mut hello = client_hello("damaged.example.com");
        for (at, byte) in flips {
            let at = at % hello.len();
            hello[at] = byte;
        }
        hello.truncate(cut.min(hello.len()));
        check_bounded(&hello);
    }

    #[test]
    fn damaged_http_heads_never_panic(head in "[A-Z]{1,8} [ -~]{0,40} HTTP/1\\.[01]\r\n([A-Za-z-]{1,12}: [ -~]{0,60}\r\n){0,6}(\r\n)?") {
        check_bounded(head.as_bytes());
    }
}
