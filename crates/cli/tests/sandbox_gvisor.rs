//! `omabox sandbox run --backend gvisor` driven as a user would: the real binary, Debian's
//! runsc, the `omabox-gvisor-init` binary beside `omabox` (built with the workspace). Needs
//! root and runsc (scripts/setup installs it); a missing one skips with its reason, and
//! fails under `CI=true`.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::omabox_bin;
use omabox_test_support::require_capability;

fn missing() -> Option<String> {
    let init = omabox_bin().with_file_name("omabox-gvisor-init");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("runsc needs root".into());
    }
    if omabox_backend_gvisor::locate_runsc().is_none() {
        return Some("runsc is not installed (scripts/setup installs it)".into());
    }
    (!init.is_file()).then(|| {
        format!(
            "{} is not built (cargo build -p omabox-backend-gvisor --bins)",
            init.display()
        )
    })
}

fn omabox(data: &Path) -> Command {
    let mut cmd = Command::new(omabox_bin());
    cmd.arg("--data-dir").arg(data);
    cmd
}

#[test]
fn runs_a_command_with_its_output_stdin_and_exit_code_and_refuses_what_it_does_not_serve() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let out = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "sh", "-c"])
        .arg("echo out; pwd; uname -r; echo err >&2; exit 3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("out"));
    assert_eq!(lines.next(), Some("/workspace"));
    // gVisor's kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(lines.next(), Some(host.trim()));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    let mut cat = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cat.stdin
        .take()
        .unwrap()
        .write_all(b"through the sandbox\n")
        .unwrap();
    let out = cat.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"through the sandbox\n");

    for refused in [
        &["--pids", "100"][..],
        &["--network", "limited", "--allow-host", "example.com"],
    ] {
        let out = omabox(data.path())
            .args(["sandbox", "run", "--backend", "gvisor"])
            .args(refused)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the gvisor backend"),
            "{out:?}"
        );
    }
    // Nothing of the runs is left.
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

#[test]
fn a_killed_omabox_leaves_nothing_running_and_reap_removes_the_rest() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let mut run = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "sh", "-c"])
        .arg("echo started; exec sleep 300")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(run.stdout.as_mut().unwrap(), &mut first).unwrap();
    assert_eq!(&first, b"started\n");
    run.kill().unwrap();
    run.wait().unwrap();

    // The sandbox's init reads the end of its stdin and stops everything in it.
    let marker = data.path().to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_mentioning(&marker) > 0 {
        assert!(
            Instant::now() < deadline,
            "runsc processes of the killed run still live"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 1);

    let out = omabox(data.path()).args(["reap"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("gvisor sandboxes of dead omabox processes removed: 1"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 0);
    let listed = Command::new(omabox_backend_gvisor::locate_runsc().unwrap())
        .arg("--root")
        .arg(data.path().join("gvisor/runsc"))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    assert!(listed.stdout.is_empty(), "{listed:?}");
}

#[test]
fn the_memory_limit_stops_the_sandbox_and_says_so() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let allocate = |mib: u32| format!("x = bytearray({mib} << 20); print('allocated')");
    let out = omabox(data.path())
        .args([
            "sandbox",
            "run",
            "--backend",
            "gvisor",
            "--memory",
            "400M",
            "--cpus",
            "0.5",
        ])
        .args(["--", "python3", "-c"])
        .arg(allocate(20))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"allocated\n");

    let out = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--memory", "100M"])
        .args(["--", "python3", "-c"])
        .arg(allocate(300))
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory limit of 100 MiB"),
        "{out:?}"
    );
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

/// Processes whose command line names `marker` (runsc's are given the data dir's paths).
fn processes_mentioning(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}
