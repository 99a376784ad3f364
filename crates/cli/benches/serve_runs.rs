//! The run queue's speed on this machine (issue 30). Prints only; nothing is compared
//! against a threshold.
//!
//! 1. Runs per second through `omabox serve` with 1, 2 and 3 hosts on one PostgreSQL store:
//!    `RUNS` no-op runs (`true`, linux backend, one session each) posted round-robin, timed
//!    from the first post to the last run's end as `GET /v1/runs/{id}` reports it.
//! 2. Claim latency (p50, p99) of the PostgreSQL queue with 1, 2 and 3 concurrent claimers,
//!    each claiming and finishing runs until the queue is empty.
//! 3. Pick-up latency (p50, p99): from one store's enqueue to an idle host's claim of the
//!    run, the host woken by `LISTEN omabox_runs` (serve on PostgreSQL), and, for
//!    comparison, polling every 200 ms (serve's poll without a notifying store).
//!
//! Needs root (linux sandboxes) and PostgreSQL binaries (`omabox_test_support::postgres`).
//! Run: `cargo bench -p omabox --bench serve_runs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

#[path = "../tests/common/mod.rs"]
mod common;

use common::serve::Serve;
use omabox_contract::{EnqueueRunInput, RunEnd, RunQueuePort};
use omabox_store::PostgresStore;
use omabox_test_support::postgres::TestPostgres;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Notify;

const KEY: &str = "bench-operator-key";
/// Runs per host count.
const RUNS: usize = 60;
/// Runs per claim-latency measurement.
const CLAIMS: usize = 600;
/// Runs per pick-up measurement.
const PICKUPS: usize = 100;

fn request(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nhost: {addr}\r\nauthorization: Bearer {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default()
}

fn runs_per_second(server: &TestPostgres, hosts: usize) -> f64 {
    let url = server.create_database(&format!("bench_{hosts}")).unwrap();
    let shared = tempfile::tempdir().unwrap();
    let blob_flag = shared.path().join("blobs").to_str().unwrap().to_owned();
    let dirs: Vec<common::TestDirs> = (0..hosts)
        .map(|_| common::TestDirs::new("bench-runs"))
        .collect();
    let serves: Vec<Serve> = dirs
        .iter()
        .map(|dirs| {
            let mut command = dirs.command(&[
                "--blob-dir",
                &blob_flag,
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--max-runs",
                "4",
            ]);
            command
                .env("OMABOX_DATABASE_URL", &url)
                .env("OMABOX_API_KEY", KEY);
            Serve::start(command)
        })
        .collect();
    let start = Instant::now();
    let ids: Vec<String> = (0..RUNS)
        .map(|index| {
            let addr = &serves[index % hosts].addr;
            let answer = request(
                addr,
                "POST",
                &format!("/v1/sessions/bench-{index}/runs"),
                r#"{"command": ["true"]}"#,
            );
            let value: serde_json::Value = serde_json::from_str(&answer).unwrap();
            value["run_id"].as_str().unwrap().to_owned()
        })
        .collect();
    for id in &ids {
        loop {
            let answer = request(&serves[0].addr, "GET", &format!("/v1/runs/{id}"), "");
            let value: serde_json::Value = serde_json::from_str(&answer).unwrap();
            match value["status"].as_str() {
                Some("completed") => break,
                Some("failed") => panic!("run failed: {value}"),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }
    let elapsed = start.elapsed();
    for serve in serves {
        serve.stop();
    }
    RUNS as f64 / elapsed.as_secs_f64()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

async fn claim_latency(server: &TestPostgres, claimers: usize) -> (Duration, Duration) {
    let url = server
        .create_database(&format!("claims_{claimers}"))
        .unwrap();
    let store = Arc::new(PostgresStore::connect(&url).await.unwrap());
    for index in 0..CLAIMS {
        store
            .enqueue(EnqueueRunInput {
                run_id: format!("run_{index}"),
                session_id: format!("session_{index}"),
                spec: "{}".into(),
            })
            .await
            .unwrap();
    }
    let mut tasks = tokio::task::JoinSet::new();
    for host in 0..claimers {
        let store = Arc::clone(&store);
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            loop {
                let start = Instant::now();
                let claimed = store
                    .claim(&format!("host-{host}"), 4, 30_000)
                    .await
                    .unwrap();
                latencies.push(start.elapsed());
                let Some(run) = claimed else { break };
                let end = RunEnd::Completed { revision: None };
                assert!(store.finish(&run.claim, end).await.unwrap());
            }
            latencies
        });
    }
    let mut all: Vec<Duration> = tasks.join_all().await.into_iter().flatten().collect();
    all.sort();
    (percentile(&all, 0.5), percentile(&all, 0.99))
}

/// Enqueue on one store → claimed by an idle host on another, `PICKUPS` times, one run at a
/// time: the host waits on `LISTEN` (`listen`) or polls every 200 ms.
async fn pickup_latency(server: &TestPostgres, listen: bool) -> (Duration, Duration) {
    let url = server.create_database(&format!("pickup_{listen}")).unwrap();
    let poster = PostgresStore::connect(&url).await.unwrap();
    let host = Arc::new(PostgresStore::connect(&url).await.unwrap());
    let wake = Arc::new(Notify::new());
    let _listener = if listen {
        Some(host.listen_for_runs(Arc::clone(&wake)).await.unwrap())
    } else {
        None
    };
    let mut latencies = Vec::new();
    for index in 0..PICKUPS {
        let claimer = {
            let (host, wake) = (Arc::clone(&host), Arc::clone(&wake));
            tokio::spawn(async move {
                loop {
                    if let Some(run) = host.claim("idle-host", 4, 30_000).await.unwrap() {
                        return (run, Instant::now());
                    }
                    tokio::select! {
                        () = wake.notified(), if listen => {}
                        () = tokio::time::sleep(Duration::from_millis(200)), if !listen => {}
                    }
                }
            })
        };
        // Let the host go idle (it found nothing and waits), then post at a point spread
        // over the poll's 200 ms (the same points for both ways of waiting).
        let spread = 20 + (index as u64 * 37) % 200;
        tokio::time::sleep(Duration::from_millis(spread)).await;
        let posted = Instant::now();
        poster
            .enqueue(EnqueueRunInput {
                run_id: format!("run_{index}"),
                session_id: format!("session_{index}"),
                spec: "{}".into(),
            })
            .await
            .unwrap();
        let (run, claimed) = claimer.await.unwrap();
        latencies.push(claimed - posted);
        let end = RunEnd::Completed { revision: None };
        assert!(host.finish(&run.claim, end).await.unwrap());
        // The finish's own notification is not a pick-up.
        tokio::time::sleep(Duration::from_millis(20)).await;
        while tokio::time::timeout(Duration::ZERO, wake.notified())
            .await
            .is_ok()
        {}
    }
    latencies.sort();
    (percentile(&latencies, 0.5), percentile(&latencies, 0.99))
}

fn main() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    if !common::linux_available() {
        return;
    }
    println!("runs through the queue ({RUNS} no-op linux runs, one session each, --max-runs 4):");
    for hosts in 1..=3 {
        let rate = runs_per_second(&server, hosts);
        println!("  {hosts} host(s): {rate:.1} runs/s");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    println!("PostgreSQL claim latency ({CLAIMS} runs, claim + finish until empty):");
    for claimers in 1..=3 {
        let (p50, p99) = runtime.block_on(claim_latency(&server, claimers));
        println!(
            "  {claimers} claimer(s): p50 {:.2} ms, p99 {:.2} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
    println!("pick-up latency ({PICKUPS} runs, enqueue on one store -> claimed by an idle host):");
    for (listen, how) in [(true, "LISTEN/NOTIFY"), (false, "200 ms poll")] {
        let (p50, p99) = runtime.block_on(pickup_latency(&server, listen));
        println!(
            "  {how}: p50 {:.2} ms, p99 {:.2} ms",
            p50.as_secs_f64() * 1e3,
            p99.as_secs_f64() * 1e3
        );
    }
}
