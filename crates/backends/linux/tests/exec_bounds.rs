//! A sandbox cannot make the host buffer its output without bound: `SandboxPort::exec` of a
//! command printing 128 MiB, and the readiness probe in a sandbox whose `/bin/sh` prints
//! 128 MiB before it does anything, keep the host's peak RSS within about the exec cap
//! (16 MiB), and say that the output was truncated. One test in its own binary, so the
//! process's peak RSS (`VmHWM`) is this test's.

mod common;

use common::{Isolated, assert_gone, can_run, test_plan};
use omabox_backend_linux::BindMount;
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_sandbox::{SandboxPort, verify_runtime_environment};
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;

/// The peak resident set of this process, in KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Resets the peak RSS to the current RSS.
fn reset_peak_rss() {
    std::fs::write("/proc/self/clear_refs", "5").unwrap();
}

const MARKER: &str = "[output truncated: more than 16777216 bytes]";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_and_the_readiness_probe_keep_host_memory_bounded() {
    if !can_run() {
        return;
    }
    let iso = Isolated::new();
    // `/bin/sh` (dash) replaced by a script that prints 128 MiB, then runs the real shell.
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("noisy-sh");
    std::fs::write(
        &script,
        "#!/bin/bash\nhead -c 134217728 /dev/zero\nexec /bin/bash \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut plan = test_plan();
    plan.binds.push(BindMount {
        source: script,
        target: PathBuf::from("/usr/bin/dash"),
        writable: false,
    });
    let port = LinuxSandboxPort::start(&iso.runtime(), &plan)
        .await
        .expect("sandbox start");

    reset_peak_rss();
    let before = peak_rss_kib();
    let output = port.exec("echo done", Some(120_000)).await.unwrap();
    let exec_kib = peak_rss_kib().saturating_sub(before);
    assert!(
        output.ends_with(MARKER),
        "{}",
        &output[output.len() - 200..]
    );
    assert!(output.len() <= 16 * 1024 * 1024 + 100);

    reset_peak_rss();
    let before = peak_rss_kib();
    let error =
        verify_runtime_environment(&port, "true", Some(std::time::Duration::from_secs(120)))
            .await
            .unwrap_err();
    let probe_kib = peak_rss_kib().saturating_sub(before);
    // The marker line comes after 128 MiB of noise, so it is cut off: not ready, clearly.
    assert!(
        error
            .message()
            .starts_with("Runtime environment is not ready"),
        "{}",
        error.message()
    );
    assert!(
        error.message().len() < 2_000,
        "the error quotes a bounded tail"
    );

    println!(
        "128 MiB of sandbox output: host peak RSS +{} MiB (exec), +{} MiB (readiness probe)",
        exec_kib / 1024,
        probe_kib / 1024
    );
    assert!(exec_kib < 80 * 1024, "exec grew host RSS by {exec_kib} KiB");
    assert!(
        probe_kib < 80 * 1024,
        "the probe grew host RSS by {probe_kib} KiB"
    );

    let identity = port.identity().clone();
    port.terminate().await.expect("destroy");
    assert_gone(&identity);
    iso.assert_empty();
}
