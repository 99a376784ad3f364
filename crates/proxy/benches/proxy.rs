//! Proxy overhead on loopback: added latency (p50/p99) against going direct to the same
//! upstream, requests per second through the proxy at concurrency 64, and time to the first
//! streamed byte. Client, proxy and upstream share this process (and this machine's cores),
//! so the figures are an upper bound on the proxy's cost. Prints only.
//!
//! Run: `cargo bench -p omabox-proxy --bench proxy` (release).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::routing::{get, post};
use omabox_contract::{
    IssueSessionTokenInput, PortError, RuntimeResourceScope, SecretString, SessionTokenClaims,
    SessionTokenPort, VaultSecretPort,
};
use omabox_proxy::{ProxyDeps, ProxyState, ServeConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const TOKEN: &str = "bench-session-token";

struct OneToken;

#[async_trait]
impl SessionTokenPort for OneToken {
    async fn issue(&self, _: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        Err(PortError::new("not in the benchmark"))
    }
    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        Ok((token == TOKEN).then(|| SessionTokenClaims {
            scope: RuntimeResourceScope::new("local", "default", "bench", "main"),
            generation: 1,
            expires_at: "2999-01-01T00:00:00.000Z".into(),
        }))
    }
    async fn revoke(&self, _: &RuntimeResourceScope, _: u64) -> Result<(), PortError> {
        Ok(())
    }
    async fn extend(&self, _: &RuntimeResourceScope, _: u64, _: u64) -> Result<(), PortError> {
        Ok(())
    }
}

struct NoVault;

#[async_trait]
impl VaultSecretPort for NoVault {
    async fn get(&self, _: &str) -> Result<Option<SecretString>, PortError> {
        Ok(None)
    }
    async fn put(&self, _: &str, _: SecretString) -> Result<(), PortError> {
        Ok(())
    }
    async fn delete(&self, _: &str) -> Result<(), PortError> {
        Ok(())
    }
    async fn names(&self) -> Result<Vec<String>, PortError> {
        Ok(Vec::new())
    }
}

/// Serves `app` through omabox's own server loop (limits at their defaults).
async fn start_proxy(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        omabox_proxy::serve(
            listener,
            app,
            &omabox_proxy::Limits::default(),
            std::future::pending(),
        )
        .await
    });
    format!("http://{addr}")
}

async fn start(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

fn sse() -> Body {
    let events = futures::stream::unfold(0_u32, |n| async move {
        if n == 3 {
            return None;
        }
        if n > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some((
            Ok::<_, std::io::Error>(format!("event: e\ndata: {{\"n\":{n}}}\n\n")),
            n + 1,
        ))
    });
    Body::from_stream(events)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

async fn latencies(client: &reqwest::Client, url: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let response = client
            .post(url)
            .header("x-api-key", TOKEN)
            .body("{}")
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.bytes().await.unwrap();
        out.push(start.elapsed());
    }
    out.sort();
    out
}

async fn throughput(
    client: &reqwest::Client,
    url: &str,
    concurrency: usize,
    for_: Duration,
) -> f64 {
    let done = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + for_;
    let start = Instant::now();
    let tasks: Vec<_> = (0..concurrency)
        .map(|_| {
            let (client, url, done) = (client.clone(), url.to_owned(), Arc::clone(&done));
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    let response = client
                        .post(&url)
                        .header("x-api-key", TOKEN)
                        .body("{}")
                        .send()
                        .await
                        .unwrap();
                    response.bytes().await.unwrap();
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

async fn first_byte(client: &reqwest::Client, url: &str, n: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        let mut response = client
            .post(url)
            .header("x-api-key", TOKEN)
            .body("{}")
            .send()
            .await
            .unwrap();
        response.chunk().await.unwrap().expect("a first chunk");
        out.push(start.elapsed());
        while response.chunk().await.unwrap().is_some() {}
    }
    out.sort();
    out
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let upstream = start(
            Router::new()
                .route("/fast", post(|| async { ([("content-type", "application/json")], "{\"ok\":true}") }))
                .route("/sse", post(|| async { ([("content-type", "text/event-stream")], sse()) }))
                .route("/healthz", get(|| async { "ok" })),
        )
        .await;
        let config = ServeConfig::from_json(&format!(
            r#"{{"models":{{"default":{{"provider":"anthropic","base_url":"{upstream}","api_key_env":"BENCH_KEY"}}}}}}"#
        ))
        .unwrap();
        let state = ProxyState::new(ProxyDeps {
            config,
            tokens: Arc::new(OneToken),
            vault: Arc::new(NoVault),
            files: None,
            env: [("BENCH_KEY".to_owned(), SecretString::new("upstream-key"))].into(),
            operator_key: SecretString::new("bench-operator-key"),
            sandboxes: None,
            runs: None,
        })
        .unwrap();
        let proxy = start_proxy(omabox_proxy::router(state)).await;
        let client = reqwest::Client::builder().pool_max_idle_per_host(256).tcp_nodelay(true).build().unwrap();
        let direct_fast = format!("{upstream}/fast");
        let proxied_fast = format!("{proxy}/v1/oma/inference-proxy/bench/fast");

        // Warm up both paths (connections, allocators).
        latencies(&client, &direct_fast, 500).await;
        latencies(&client, &proxied_fast, 500).await;

        let n = 5_000;
        let direct = latencies(&client, &direct_fast, n).await;
        let proxied = latencies(&client, &proxied_fast, n).await;
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!("sequential latency, {n} requests (small JSON, keep-alive):");
        println!("  direct   p50 {:>8.1} µs  p99 {:>8.1} µs", us(percentile(&direct, 0.5)), us(percentile(&direct, 0.99)));
        println!("  proxied  p50 {:>8.1} µs  p99 {:>8.1} µs", us(percentile(&proxied, 0.5)), us(percentile(&proxied, 0.99)));
        println!(
            "  added    p50 {:>8.1} µs  p99 {:>8.1} µs   (goal: ≤ 200 µs at p50)",
            us(percentile(&proxied, 0.5)) - us(percentile(&direct, 0.5)),
            us(percentile(&proxied, 0.99)) - us(percentile(&direct, 0.99))
        );

        let concurrency = 64;
        let window = Duration::from_secs(5);
        let direct_rps = throughput(&client, &direct_fast, concurrency, window).await;
        let proxied_rps = throughput(&client, &proxied_fast, concurrency, window).await;
        println!("throughput, concurrency {concurrency}, {} s each:", window.as_secs());
        println!("  direct   {direct_rps:>9.0} req/s");
        println!("  proxied  {proxied_rps:>9.0} req/s   (goal: ≥ 10000 req/s)");

        let streams = 50;
        let direct_ttfb = first_byte(&client, &format!("{upstream}/sse"), streams).await;
        let proxied_ttfb = first_byte(&client, &format!("{proxy}/v1/oma/inference-proxy/bench/sse"), streams).await;
        println!("time to first streamed byte (SSE, next events 20 ms apart), {streams} streams:");
        println!("  direct   p50 {:>8.1} µs  p99 {:>8.1} µs", us(percentile(&direct_ttfb, 0.5)), us(percentile(&direct_ttfb, 0.99)));
        println!("  proxied  p50 {:>8.1} µs  p99 {:>8.1} µs", us(percentile(&proxied_ttfb, 0.5)), us(percentile(&proxied_ttfb, 0.99)));
        println!("cores: {}", std::thread::available_parallelism().map_or(0, |n| n.get()));
    });
}

/// The `omabox` binary's allocator (`crates/cli/src/main.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
