//! Connect latency and bulk throughput through the relay vs direct to the same loopback
//! echo server, in one run. Prints; asserts nothing. Issue 12's goal: ≤ 1 ms added connect
//! time, ≥ 50% of direct throughput.
//!
//! `cargo bench -p omabox-egress --bench relay`

#[path = "../tests/support/mod.rs"]
mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use omabox_egress::{FixedDestination, Relay, RelayConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CONNECTS: usize = 300;
const BULK_BYTES: usize = 256 << 20;
/// Throughput runs alternate direct and relayed this many times; the best of each counts
/// (the machine is shared: the best run is the least disturbed one).
const ROUNDS: usize = 5;
const HEAD: &[u8] = b"GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n";

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Connect, send the request head, read its echo: the time to a first answered byte.
async fn first_round_trip(addr: SocketAddr) -> Duration {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    stream.write_all(HEAD).await.unwrap();
    let mut echoed = [0u8; HEAD.len()];
    stream.read_exact(&mut echoed).await.unwrap();
    started.elapsed()
}

async fn connect_latency(addr: SocketAddr) -> (Duration, Duration) {
    for _ in 0..20 {
        first_round_trip(addr).await;
    }
    let mut samples = Vec::with_capacity(CONNECTS);
    for _ in 0..CONNECTS {
        samples.push(first_round_trip(addr).await);
    }
    samples.sort();
    (samples[CONNECTS / 2], samples[CONNECTS * 99 / 100])
}

/// Bytes per second echoed through one connection (sent and received concurrently).
async fn throughput(addr: SocketAddr) -> f64 {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut r, mut w) = stream.into_split();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        w.write_all(HEAD).await.unwrap();
        let chunk = vec![0x5au8; 256 * 1024];
        let mut left = BULK_BYTES - HEAD.len();
        while left > 0 {
            let n = left.min(chunk.len());
            w.write_all(&chunk[..n]).await.unwrap();
            left -= n;
        }
        w
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < BULK_BYTES {
        let n = r.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        got += n;
    }
    drop(writer.await.unwrap());
    BULK_BYTES as f64 / started.elapsed().as_secs_f64()
}

/// Bytes per second of a one-way download (the server sends after the request head).
async fn download(addr: SocketAddr) -> f64 {
    let started = Instant::now();
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream.write_all(HEAD).await.unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got = 0;
    loop {
        let n = stream.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, BULK_BYTES);
    BULK_BYTES as f64 / started.elapsed().as_secs_f64()
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!("load average before: {}", load());
        let upstream = support::tcp_echo_server("127.0.0.1:0".parse().unwrap()).await;
        let resolver = support::CountingResolver::new(&[("bench.test", &["127.0.0.1"])]);
        let policy = support::limited(&[format!("bench.test:{}", upstream.addr.port())]);
        let relay = Arc::new(Relay::new(policy, resolver, support::loopback_rules(), RelayConfig::default()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let relay_addr = listener.local_addr().unwrap();
        tokio::spawn(relay.serve(listener, Arc::new(FixedDestination(upstream.addr))));

        let (direct_p50, direct_p99) = connect_latency(upstream.addr).await;
        let (relay_p50, relay_p99) = connect_latency(relay_addr).await;
        println!(
            "connect + first round trip ({CONNECTS} connections, median / p99): direct {:.3} / {:.3} ms, relay {:.3} / {:.3} ms, added {:.3} ms (median)",
            ms(direct_p50),
            ms(direct_p99),
            ms(relay_p50),
            ms(relay_p99),
            ms(relay_p50.saturating_sub(direct_p50)),
        );

        let (mut direct, mut relayed) = (0f64, 0f64);
        for _ in 0..ROUNDS {
            direct = direct.max(throughput(upstream.addr).await);
            relayed = relayed.max(throughput(relay_addr).await);
        }
        println!(
            "bulk echo throughput ({} MiB each way, one connection, best of {ROUNDS} alternated runs): direct {:.0} MiB/s, relay {:.0} MiB/s ({:.0}% of direct)",
            BULK_BYTES >> 20,
            direct / f64::from(1 << 20),
            relayed / f64::from(1 << 20),
            100.0 * relayed / direct,
        );
        let source = support::source_server("127.0.0.1:0".parse().unwrap(), BULK_BYTES).await;
        let resolver = support::CountingResolver::new(&[("bench.test", &["127.0.0.1"])]);
        let policy = support::limited(&[format!("bench.test:{}", source.addr.port())]);
        let relay = Arc::new(Relay::new(policy, resolver, support::loopback_rules(), RelayConfig::default()));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let source_relay = listener.local_addr().unwrap();
        tokio::spawn(relay.serve(listener, Arc::new(FixedDestination(source.addr))));
        let (mut direct, mut relayed) = (0f64, 0f64);
        for _ in 0..ROUNDS {
            direct = direct.max(download(source.addr).await);
            relayed = relayed.max(download(source_relay).await);
        }
        println!(
            "bulk download throughput ({} MiB, one connection, best of {ROUNDS} alternated runs): direct {:.0} MiB/s, relay {:.0} MiB/s ({:.0}% of direct)",
            BULK_BYTES >> 20,
            direct / f64::from(1 << 20),
            relayed / f64::from(1 << 20),
            100.0 * relayed / direct,
        );
        println!("load average after: {}", load());
    });
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The `omabox` binary's allocator (`crates/cli/src/main.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
