//! Figures for the agent protocol over a socketpair to a child agent. Prints numbers;
//! never asserts on time.
//!
//! `cargo bench -p omabox-agent` (optionally `OMABOX_BENCH_ITERS=N`).

use std::path::Path;
use std::time::{Duration, Instant};

use omabox_agent::{AgentProcess, ExecRequest, WriteOptions};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn report(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "{name:<34} n={:<5} p50={:>8.1} µs  p99={:>8.1} µs  min={:>8.1} µs",
        samples.len(),
        us(percentile(&samples, 0.50)),
        us(percentile(&samples, 0.99)),
        us(samples[0]),
    );
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let iters: usize = std::env::var("OMABOX_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let bin = Path::new(env!("CARGO_BIN_EXE_omabox-agent"));
    let dir = tempfile::tempdir().expect("tempdir");
    let workdir = dir.path().to_string_lossy().into_owned();

    let t = Instant::now();
    let agent = AgentProcess::spawn(bin, &["--workdir", &workdir])
        .await
        .expect("agent");
    println!(
        "agent spawn + handshake: {:.1} µs",
        t.elapsed().as_secs_f64() * 1e6
    );
    let client = agent.client.clone();

    for _ in 0..20 {
        client
            .exec(ExecRequest::program("true"))
            .await
            .expect("warm-up");
    }

    let mut ping = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        client.ping().await.expect("ping");
        ping.push(t.elapsed());
    }
    report("ping round trip", ping);

    let mut exec_true = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let out = client
            .exec(ExecRequest::program("true"))
            .await
            .expect("exec");
        exec_true.push(t.elapsed());
        debug_assert!(out.success());
    }
    report("exec `true` (argv) round trip", exec_true);

    // Baseline: the same process creation done directly by this (host) process, so the
    // protocol's share of an exec round trip can be read off.
    let mut direct = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        let st = std::process::Command::new("true")
            .status()
            .expect("spawn true");
        direct.push(t.elapsed());
        debug_assert!(st.success());
    }
    report("baseline: host spawn+wait `true`", direct);

    let mut exec_sh = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t = Instant::now();
        client.exec("true").await.expect("exec");
        exec_sh.push(t.elapsed());
    }
    report("exec `sh -c true` round trip", exec_sh);

    let concurrent = 16;
    let t = Instant::now();
    let rounds = iters / concurrent;
    for _ in 0..rounds.max(1) {
        let runs = (0..concurrent).map(|_| client.exec(ExecRequest::program("true")));
        for r in futures::future::join_all(runs).await {
            r.expect("exec");
        }
    }
    let n = rounds.max(1) * concurrent;
    println!(
        "exec `true` x{concurrent} concurrent:       {:.0} execs/s",
        n as f64 / t.elapsed().as_secs_f64()
    );

    let bytes: u64 = 1024 * 1024 * 1024;
    let t = Instant::now();
    let mut p = client
        .spawn(ExecRequest::shell(format!("head -c {bytes} /dev/zero")))
        .await
        .expect("spawn");
    let got = p
        .stdout
        .take()
        .expect("stdout")
        .drain()
        .await
        .expect("drain");
    p.wait().await.expect("wait");
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(got, bytes);
    println!(
        "streamed stdout (1 GiB):           {:.0} MiB/s",
        bytes as f64 / (1024.0 * 1024.0) / secs
    );

    // A whole-file read is capped at MAX_WHOLE_READ (64 MiB): the file is that large.
    let size = omabox_agent::MAX_WHOLE_READ;
    let data = vec![0x5au8; size];
    let path = dir.path().join("bench.bin").to_string_lossy().into_owned();
    let t = Instant::now();
    client
        .write_file_bytes(&path, data, WriteOptions::default())
        .await
        .expect("write");
    let w = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let back = client.read_file_bytes(&path).await.expect("read");
    let r = t.elapsed().as_secs_f64();
    let mib = size as f64 / (1024.0 * 1024.0);
    println!(
        "file write / read ({mib:.0} MiB):        {:.0} / {:.0} MiB/s",
        mib / w,
        back.len() as f64 / (1024.0 * 1024.0) / r
    );
}
