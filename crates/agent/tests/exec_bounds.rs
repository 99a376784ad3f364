//! `AgentClient::exec` keeps a bounded amount of a command's output on the host: a command
//! that prints far more than the cap runs to completion (its pipe is drained, never left
//! full), the result says `truncated`, and the host's peak RSS grows by about the cap, not
//! by the output. One test binary of its own, so the process's peak RSS is this test's.

mod common;

use common::{Mode, start};
use omabox_agent::{DEFAULT_MAX_EXEC_OUTPUT, ExecRequest};

/// The peak resident set of this process (`VmHWM`), in KiB.
fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM in /proc/self/status")
}

/// Resets the peak RSS to the current RSS (Linux ≥ 4.0: `echo 5 > /proc/self/clear_refs`).
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_output_past_the_cap_is_drained_and_dropped() {
    let h = start(Mode::Child).await;

    // A small cap shared by both streams: what is kept fits in it, the process still ends.
    let small = h
        .client
        .exec(
            ExecRequest::shell("head -c 1048576 /dev/zero; echo tail >&2; echo done")
                .max_output(1000),
        )
        .await
        .unwrap();
    assert!(small.success(), "{:?}", small.exit);
    assert!(small.truncated);
    assert_eq!(small.stdout.len() + small.stderr.len(), 1000);

    // Under the cap nothing is flagged.
    let fits = h.client.exec("printf 12345").await.unwrap();
    assert!(!fits.truncated);
    assert_eq!(fits.stdout, b"12345");

    // 128 MiB on stdout and 8 MiB on stderr with the default cap: the host keeps 16 MiB.
    reset_peak_rss();
    let before = peak_rss_kib();
    let big = h
        .client
        .exec("head -c 134217728 /dev/zero; head -c 8388608 /dev/zero >&2")
        .await
        .unwrap();
    let grown_kib = peak_rss_kib().saturating_sub(before);
    assert!(big.success(), "{:?}", big.exit);
    assert!(big.truncated);
    assert_eq!(
        big.stdout.len() + big.stderr.len(),
        DEFAULT_MAX_EXEC_OUTPUT,
        "the cap is filled, not exceeded"
    );
    println!(
        "exec of 136 MiB output: host peak RSS +{} MiB (cap {} MiB)",
        grown_kib / 1024,
        DEFAULT_MAX_EXEC_OUTPUT / (1024 * 1024)
    );
    assert!(
        grown_kib < 64 * 1024,
        "host peak RSS grew by {grown_kib} KiB for a capped exec"
    );
}
