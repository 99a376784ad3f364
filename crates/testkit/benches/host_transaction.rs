//! Host transaction overhead: the full `ManagedRuntimeHost::run` (pre-flight, claim, monitor,
//! steps 13–36 with a live checkpoint-free happy path, and the complete cleanup) against
//! in-memory fakes that answer immediately, so the figure is the host's own cost.
//!
//! Prints µs per run (mean, p50, p99) and runs per second, without and with a run observer
//! (the fixture's `RecordingObserver`, which keeps every step event); never asserts. Goal:
//! ≤ 200 µs per run. Fixture construction is outside the timed region; the fakes' call
//! recording is inside it (it is part of every port call here), so the figure is an upper
//! bound.
//!
//! `cargo bench -p omabox-testkit --bench host_transaction` (set `OMABOX_BENCH_RUNS` to
//! change the run count).

use omabox_contract::{CredentialEgressProfile, CredentialEgressRequirement};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use omabox_testkit::fakes::Fixture;
use std::time::{Duration, Instant};

const WARM_UP_RUNS: usize = 2_000;
const DEFAULT_RUNS: usize = 20_000;

fn fixture() -> Fixture {
    let mut fixture = Fixture::fault_matrix();
    // Exercise the optional egress lane too: prepare, attach, revoke, release.
    fixture.with_credential_egress();
    fixture.profile.credential_egress = Some(CredentialEgressProfile {
        requirement: CredentialEgressRequirement::BestEffort,
    });
    fixture
}

async fn one_run(observed: bool) -> Duration {
    let fixture = fixture();
    let host = match fixture.host() {
        Ok(host) => host,
        Err(error) => {
            eprintln!("host construction failed: {error}");
            return Duration::ZERO;
        }
    };
    let mut input = fixture.input();
    if !observed {
        input.observer = None;
    }
    let started = Instant::now();
    let result = host.run(input).await;
    let elapsed = started.elapsed();
    if !matches!(result, Ok(ManagedRuntimeRunResult::Completed { .. })) {
        eprintln!("unexpected result: {result:?}");
    }
    elapsed
}

fn percentile(sorted: &[Duration], fraction: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let index = ((sorted.len() as f64 - 1.0) * fraction).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn main() {
    let runs = std::env::var("OMABOX_BENCH_RUNS")
        .ok()
        .and_then(|value| value.parse().ok())
        .filter(|runs: &usize| *runs > 0)
        .unwrap_or(DEFAULT_RUNS);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("cannot build a tokio runtime: {error}");
            return;
        }
    };
    println!(
        "host_transaction: full ManagedRuntimeHost::run with fake ports (current-thread tokio)"
    );
    println!("  runs        {runs} (after {WARM_UP_RUNS} warm-up runs)");
    for observed in [false, true] {
        let samples = runtime.block_on(async {
            for _ in 0..WARM_UP_RUNS {
                one_run(observed).await;
            }
            let mut samples = Vec::with_capacity(runs);
            for _ in 0..runs {
                samples.push(one_run(observed).await);
            }
            samples
        });
        report(
            if observed {
                "with a run observer"
            } else {
                "without an observer"
            },
            samples,
        );
    }
    println!("  goal        ≤ 200 µs/run");
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let runs = samples.len();
    let total: Duration = samples.iter().sum();
    let mean = total / u32::try_from(runs).unwrap_or(u32::MAX).max(1);
    println!("  {label}:");
    println!("    mean        {:.1} µs/run", micros(mean));
    println!(
        "    p50         {:.1} µs/run",
        micros(percentile(&samples, 0.50))
    );
    println!(
        "    p99         {:.1} µs/run",
        micros(percentile(&samples, 0.99))
    );
    println!(
        "    throughput  {:.0} runs/s (sequential)",
        if total.is_zero() {
            0.0
        } else {
            runs as f64 / total.as_secs_f64()
        }
    );
}

/// The `omabox` binary's allocator (`crates/cli/src/main.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
