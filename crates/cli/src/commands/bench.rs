//! `omabox bench run [--iterations N] [--backend B]`: the demo's wall time with a per-step
//! breakdown. Runs `omabox run --json` (this same binary, as a child process) N times in one
//! session of a fresh temporary data directory — so every run after the first restores the
//! previous run's workspace, as a user's second run would — and prints, per step, the p50,
//! p90 and max of the step timings the runs report, plus the process wall time. Print only:
//! nothing is compared against a threshold.

use anyhow::Context as _;
use clap::{Args, Subcommand};
use omabox_node::wiring::Backend;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, ExitCode, Stdio};
use std::time::Instant;

/// `omabox bench ...`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    command: BenchCommand,
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Run the demo N times and print the per-step timings (p50, p90, max).
    Run(BenchRunArgs),
}

/// Options of `omabox bench run`.
#[derive(Debug, Args)]
struct BenchRunArgs {
    /// How many demo runs.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    iterations: u32,
    /// The backend (`local` needs OMABOX_TEST_MODE=1).
    #[arg(long, value_parser = super::backend_parser(), default_value = "linux")]
    backend: Backend,
}

/// Runs `omabox bench <command>`.
pub fn run(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    match &args.command {
        BenchCommand::Run(run) => bench_run(run),
    }
}

fn bench_run(args: &BenchRunArgs) -> anyhow::Result<ExitCode> {
    let exe = std::env::current_exe().context("cannot find the omabox binary")?;
    let data = tempfile::tempdir().context("cannot create a temporary data directory")?;
    let mut samples: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for iteration in 1..=args.iterations {
        let began = Instant::now();
        let output = Command::new(&exe)
            .arg("--data-dir")
            .arg(data.path())
            .args(["run", "--json", "--backend", args.backend.provider()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .context("cannot start omabox run")?;
        let wall = began.elapsed().as_secs_f64() * 1000.0;
        let report: Value = serde_json::from_slice(&output.stdout)
            .with_context(|| format!("run {iteration} printed no JSON report"))?;
        if report["result"]["type"] != "completed" {
            anyhow::bail!(
                "run {iteration} did not complete: {}",
                serde_json::to_string(&report["result"]).unwrap_or_default()
            );
        }
        samples.entry("process wall".into()).or_default().push(wall);
        if let Some(timings) = report["timings"].as_object() {
            for (step, ms) in timings {
                if let Some(ms) = ms.as_f64() {
                    samples.entry(step.clone()).or_default().push(ms);
                }
            }
        }
    }
    outln!(
        "omabox run (demo), backend {}, {} runs; milliseconds per step (p50 / p90 / max):",
        args.backend.provider(),
        args.iterations
    );
    let mut rows: Vec<(String, Vec<f64>)> = samples.into_iter().collect();
    rows.sort_by(|a, b| percentile(&b.1, 50.0).total_cmp(&percentile(&a.1, 50.0)));
    for (step, values) in rows {
        outln!(
            "  {step:<24} {:>9.1} {:>9.1} {:>9.1}   (n={})",
            percentile(&values, 50.0),
            percentile(&values, 90.0),
            percentile(&values, 100.0),
            values.len()
        );
    }
    outln!(
        "steps not listed took no measurable time; `total` is the in-process transaction, \
         `process wall` adds process start, store open and exit"
    );
    Ok(ExitCode::SUCCESS)
}

/// The nearest-rank percentile of `values` (empty: 0).
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn nearest_rank_percentiles() {
        let values = [5.0, 1.0, 3.0, 2.0, 4.0];
        assert_eq!(percentile(&values, 50.0), 3.0);
        assert_eq!(percentile(&values, 90.0), 5.0);
        assert_eq!(percentile(&values, 100.0), 5.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
