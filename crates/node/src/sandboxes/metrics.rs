//! A serve sandbox's resource use (E2B's `SandboxMetric`): CPU and memory from the
//! sandbox's own cgroup (see [`omabox_backend_linux::CgroupPaths`]: v1 and v2), the disk
//! from its `/workspace` tmpfs as `stat -f` run inside the sandbox reports it.
//!
//! Must never: read a host path the sandbox controls (the disk figures come from inside,
//! through the agent; the cgroup and `/proc` files are the kernel's); trust what the
//! sandbox printed beyond a few numbers (capped output, parsed or zero).

use omabox_agent::{AgentClient, ExecRequest};
use omabox_backend_linux::CgroupPaths;
use omabox_proxy::e2b::{SandboxMetrics, SandboxServiceError};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// A CPU reading older than this is compared with a new one; a younger (or none) makes the
/// sample wait [`CPU_WINDOW`] for a second reading.
const MIN_CPU_INTERVAL: Duration = Duration::from_millis(50);
/// How long a sample measures CPU use when it has no earlier reading to compare with.
const CPU_WINDOW: Duration = Duration::from_millis(100);
/// Bytes of `stat -f` output read at most.
const MAX_STAT_OUTPUT: usize = 256;
/// How long the in-sandbox `stat -f` may take.
const STAT_TIMEOUT: Duration = Duration::from_secs(5);
/// Where the sandbox's disk is.
const WORKSPACE: &str = "/workspace";

/// The previous CPU reading of one sandbox: (when, nanoseconds used by then).
#[derive(Debug, Default)]
pub(super) struct CpuReadings(Mutex<Option<(Instant, u64)>>);

/// What a sample needs of a running sandbox.
pub(super) struct Sampled<'a> {
    pub cgroup: &'a CgroupPaths,
    pub client: &'a AgentClient,
    pub readings: &'a CpuReadings,
    pub cpu_count: u32,
    /// Its memory limit in bytes (0: none).
    pub memory_limit: u64,
}

/// One sample of the sandbox's use now.
pub(super) async fn sample(sandbox: Sampled<'_>) -> Result<SandboxMetrics, SandboxServiceError> {
    let cpu_used_pct = cpu_percent(&sandbox).await?;
    let cgroup = sandbox.cgroup.clone();
    let (mem_used, mem_cache, cgroup_limit) = tokio::task::spawn_blocking(move || {
        (
            cgroup.memory_usage().unwrap_or(0),
            cgroup.memory_cache().unwrap_or(0),
            cgroup.memory_limit(),
        )
    })
    .await
    .map_err(|e| SandboxServiceError::Internal(format!("the metrics task failed: {e}")))?;
    let mem_total = match (sandbox.memory_limit, cgroup_limit) {
        (0, Some(limit)) => limit,
        (0, None) => machine_memory().unwrap_or(0),
        (limit, _) => limit,
    };
    let (disk_used, disk_total) = disk_use(sandbox.client).await.unwrap_or((0, 0));
    Ok(SandboxMetrics {
        timestamp: SystemTime::now(),
        cpu_count: sandbox.cpu_count,
        cpu_used_pct,
        mem_used,
        mem_total,
        mem_cache: mem_cache.min(mem_used),
        disk_used,
        disk_total,
    })
}

/// The share of its CPUs the sandbox used since the previous reading (or over the next
/// [`CPU_WINDOW`]), 0 to 100.
async fn cpu_percent(sandbox: &Sampled<'_>) -> Result<f64, SandboxServiceError> {
    let read = || {
        let cgroup = sandbox.cgroup.clone();
        async move {
            tokio::task::spawn_blocking(move || (Instant::now(), cgroup.cpu_usage_ns()))
                .await
                .map_err(|e| SandboxServiceError::Internal(format!("the metrics task failed: {e}")))
        }
    };
    let previous = *sandbox
        .readings
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let before = match previous {
        Some((at, used)) if at.elapsed() >= MIN_CPU_INTERVAL => Some((at, used)),
        _ => {
            let (at, used) = read().await?;
            tokio::time::sleep(CPU_WINDOW).await;
            used.map(|used| (at, used))
        }
    };
    let (now, used) = read().await?;
    let Some(used) = used else {
        return Ok(0.0);
    };
    *sandbox
        .readings
        .0
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((now, used));
    Ok(before.map_or(0.0, |(at, earlier)| {
        percent(
            used.saturating_sub(earlier),
            now.duration_since(at),
            sandbox.cpu_count,
        )
    }))
}

/// `used_ns` of CPU time over `elapsed` on `cpus` CPUs, as a percentage from 0 to 100.
fn percent(used_ns: u64, elapsed: Duration, cpus: u32) -> f64 {
    let available = elapsed.as_nanos() as f64 * f64::from(cpus.max(1));
    if available <= 0.0 {
        return 0.0;
    }
    (used_ns as f64 * 100.0 / available).clamp(0.0, 100.0)
}

/// The machine's memory (`/proc/meminfo`'s `MemTotal`), bytes.
fn machine_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// (used, total) bytes of the sandbox's `/workspace`, from `stat -f` inside it.
async fn disk_use(client: &AgentClient) -> Option<(u64, u64)> {
    let request = ExecRequest::argv(["stat", "-f", "-c", "%S %b %f", WORKSPACE])
        .max_output(MAX_STAT_OUTPUT)
        .timeout(STAT_TIMEOUT);
    let output = client.exec(request).await.ok()?;
    if output.exit.code != Some(0) || output.truncated {
        return None;
    }
    parse_statfs(&String::from_utf8_lossy(&output.stdout))
}

/// `"<block size> <blocks> <free blocks>"` → (used, total) bytes.
fn parse_statfs(text: &str) -> Option<(u64, u64)> {
    let numbers: Vec<u64> = text
        .split_whitespace()
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let [size, blocks, free] = numbers[..] else {
        return None;
    };
    let total = size.checked_mul(blocks)?;
    let used = size.checked_mul(blocks.checked_sub(free)?)?;
    Some((used, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statfs_output_is_parsed_or_refused() {
        assert_eq!(parse_statfs("4096 100 75\n"), Some((102_400, 409_600)));
        for bad in [
            "",
            "4096 100",
            "4096 100 200",
            "a b c",
            "1 2 3 4",
            "99999999999999999999 1 0",
        ] {
            assert_eq!(parse_statfs(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn cpu_percent_is_of_every_cpu_and_bounded() {
        let second = Duration::from_secs(1);
        assert_eq!(percent(500_000_000, second, 1), 50.0);
        assert_eq!(percent(500_000_000, second, 2), 25.0);
        assert_eq!(percent(5_000_000_000, second, 2), 100.0);
        assert_eq!(percent(1, Duration::ZERO, 1), 0.0);
    }
}
