//! Kill `omabox run` at every step and show that `omabox reap` then leaves nothing: no
//! process, cgroup, state dir, binding dir, temp blob or journaled lease.
//!
//! The kills are fault points, not sleeps: `OMABOX_FAULT_POINT=<name>` (with
//! `OMABOX_TEST_MODE=1`) makes the binary `SIGKILL` itself at that step — in the middle of a
//! linux sandbox's start (state dir made, init cloned, cgroup made, plan sent, identity
//! written) and while a checkpoint writes a temp blob — plus a plain `kill -9` while the
//! harness runs (after the harness said so through a file). Each kill uses its own session;
//! the reaps run after all of them, while the killed runs' fences expire.
//!
//! Linux sandboxes need root and cgroups: without them this skips with a printed reason (and
//! fails under `CI=true`). The test has its own runtime dir, cgroup parent and copy of
//! `omabox-sandbox-init`, so any init process of ours is recognisable by its executable.

mod common;

use common::init_bin;
use omabox_backend_linux::factory::INIT_ENV;
use serde_json::Value;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The fault points of a run, in the order a run reaches them.
const FAULT_POINTS: &[&str] = &[
    "linux-start-state-dir",
    "linux-start-cloned",
    "linux-start-cgroup",
    "linux-start-userns",
    "linux-start-plan-sent",
    "linux-start-identity",
    "blob-temp-created",
    // Published, before the sandbox is terminated and the fence released.
    "run-published",
];

/// The harness: a workspace worth checkpointing.
const HARNESS: &str = "head -c 300000 /dev/urandom > /workspace/data; echo x > /workspace/small";
/// The harness killed while it runs: a sign of life, then a long wait.
const HOLDING_HARNESS: &str = "echo x > /workspace/small; touch /workspace/started; sleep 120";

struct Setup {
    data: tempfile::TempDir,
    runtime_dir: tempfile::TempDir,
    /// Holds this test's copy of the init binary.
    bin_dir: tempfile::TempDir,
    cgroup_parent: String,
}

impl Setup {
    fn new() -> Self {
        let runtime_dir = tempfile::tempdir().unwrap();
        let bin_dir = tempfile::tempdir().unwrap();
        std::fs::copy(init_bin(), bin_dir.path().join("omabox-sandbox-init")).unwrap();
        Self {
            cgroup_parent: format!(
                "omabox-crash-test-{}",
                runtime_dir.path().file_name().unwrap().to_string_lossy()
            ),
            data: tempfile::tempdir().unwrap(),
            runtime_dir,
            bin_dir,
        }
    }

    fn init(&self) -> PathBuf {
        self.bin_dir.path().join("omabox-sandbox-init")
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = common::omabox_command(
            self.data.path(),
            self.runtime_dir.path(),
            &self.cgroup_parent,
            args,
        );
        command
            // This test's copy of the binaries, which a fault point may kill.
            .env(INIT_ENV, self.init())
            .env("OMABOX_TEST_MODE", "1")
            .env("OMABOX_LEASE_TTL_MS", "1000")
            .env_remove("OMABOX_FAULT_POINT");
        command
    }

    fn run(&self, session: &str, harness: &str) -> Command {
        let mut command = self.command(&[
            "run",
            "--json",
            "--backend",
            "linux",
            "--session",
            session,
            "--",
            "sh",
            "-c",
            harness,
        ]);
        command.stdout(Stdio::null()).stderr(Stdio::null());
        command
    }

    fn reap(&self) -> Value {
        let output = self.command(&["reap", "--json"]).output().unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap()
    }

    fn cgroup_parents(&self) -> Vec<PathBuf> {
        common::cgroup_parent_dirs(&self.cgroup_parent)
    }

    /// Everything a crashed run could have left, described; empty when nothing is left.
    fn leftovers(&self) -> Vec<String> {
        let mut left = Vec::new();
        for entry in std::fs::read_dir(self.runtime_dir.path())
            .unwrap()
            .flatten()
        {
            left.push(format!("state dir {}", entry.path().display()));
        }
        for parent in self.cgroup_parents() {
            for entry in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                if entry.path().is_dir() {
                    left.push(format!("cgroup {}", entry.path().display()));
                }
            }
        }
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let ours = std::fs::read_link(entry.path().join("exe"))
                .is_ok_and(|exe| exe == self.init())
                || std::fs::read_to_string(entry.path().join("cgroup"))
                    .is_ok_and(|cgroup| cgroup.contains(&self.cgroup_parent));
            if ours {
                left.push(format!("process {}", entry.file_name().to_string_lossy()));
            }
        }
        for area in ["runtime", "runtime-outputs"] {
            for binding in bindings(&self.data.path().join(area)) {
                left.push(format!("binding {}", binding.display()));
            }
        }
        // Id-range slots are host-wide (other tests hold some): ours name a state dir
        // under this test's runtime dir.
        for entry in std::fs::read_dir(omabox_backend_linux::idmap::SLOTS_DIR)
            .into_iter()
            .flatten()
            .flatten()
        {
            let holder = std::fs::read(entry.path()).unwrap_or_default();
            if Path::new(std::ffi::OsStr::from_bytes(&holder)).starts_with(self.runtime_dir.path())
            {
                left.push(format!("id-range slot {}", entry.path().display()));
            }
        }
        for entry in std::fs::read_dir(self.data.path().join("blobs/tmp"))
            .into_iter()
            .flatten()
            .flatten()
        {
            left.push(format!("temp blob {}", entry.path().display()));
        }
        left
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for parent in self.cgroup_parents() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Binding dirs (`wsb_…`/`outb_…`) under an area: `<scope>/<generation>/<binding>`.
fn bindings(area: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let children = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path())
            .collect()
    };
    for scope in children(area) {
        for generation in children(&scope) {
            found.extend(children(&generation));
        }
    }
    found
}

fn find(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if entry.file_name() == name {
            return Some(path);
        }
        if entry.file_type().ok()?.is_dir()
            && let Some(found) = find(&path, name)
        {
            return Some(found);
        }
    }
    None
}

#[test]
fn a_run_killed_at_any_step_leaves_nothing_after_reap() {
    if !common::linux_available() {
        return;
    }
    let setup = Setup::new();

    for (index, point) in FAULT_POINTS.iter().enumerate() {
        let status = setup
            .run(&format!("fault{index}"), HARNESS)
            .env("OMABOX_FAULT_POINT", point)
            .status()
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "omabox run did not reach fault point {point}: {status}"
        );
        let left = setup.leftovers();
        println!("killed at {point}: {} leftovers {left:?}", left.len());
        assert!(
            left.iter().any(|item| item.starts_with("binding")),
            "a kill at {point} leaves its bindings (until its fence expires): {left:?}"
        );
        if point.starts_with("linux-start") {
            assert!(
                left.iter().any(|item| item.starts_with("state dir")),
                "a kill at {point} leaves its state dir: {left:?}"
            );
        }
    }
    // And a plain kill -9 while the harness runs.
    let mut harness = setup.run("midharness", HOLDING_HARNESS).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if find(&setup.data.path().join("runtime"), "started").is_some() {
            break;
        }
        assert!(Instant::now() < deadline, "the harness never started");
        if let Ok(Some(status)) = harness.try_wait() {
            panic!("omabox run ended ({status}) before the harness started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    harness.kill().unwrap(); // SIGKILL
    harness.wait().unwrap();
    let kills = FAULT_POINTS.len() + 1;

    let before = setup.leftovers();
    assert!(!before.is_empty(), "the kills left nothing to reap?");
    println!("after {kills} kills: {} leftovers", before.len());

    // A reap killed half-way (after its lease passes, before its sweep) leaves nothing the
    // next reap cannot finish.
    let killed = setup
        .command(&["reap", "--json"])
        .env("OMABOX_FAULT_POINT", "reap-leases-done")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(libc::SIGKILL), "{killed:?}");

    // The killed runs' fences expire one TTL (1 s) after their last heartbeat; until then
    // their bindings belong to a generation that still holds its fence. Reap until clean.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reaps = 0;
    loop {
        let report = setup.reap();
        reaps += 1;
        let left = setup.leftovers();
        if left.is_empty() && report["abandoned"]["inspected"] == 0 {
            assert!(
                report["leftovers"]["errors"].as_array().unwrap().is_empty(),
                "{report}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still left after {reaps} reaps: {left:?}\nlast report: {report}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    println!("after {kills} kills and {reaps} reaps: nothing left");

    // Every session still runs (nothing half-written blocks it) and publishes.
    let output = setup
        .command(&[
            "run",
            "--json",
            "--backend",
            "linux",
            "--session",
            "fault0",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(setup.leftovers().is_empty(), "{:?}", setup.leftovers());
}

#[test]
fn a_killed_runs_usage_is_an_estimate_never_the_contract_kind() {
    if !common::linux_available() {
        return;
    }
    let setup = Setup::new();
    let mut run = setup.run("billed", HOLDING_HARNESS).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while find(&setup.data.path().join("runtime"), "started").is_none() {
        assert!(Instant::now() < deadline, "the harness never started");
        if let Ok(Some(status)) = run.try_wait() {
            panic!("omabox run ended ({status}) before the harness started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    run.kill().unwrap(); // SIGKILL
    run.wait().unwrap();
    // The host is dead from here on: nothing it could have stamped is later than this.
    let killed_at = omabox_store::iso_millis(
        u64::try_from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap(),
    );

    // Its lease is reaped once its fence expired (polled).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut reaps = 0;
    loop {
        let report = setup.reap();
        reaps += 1;
        if report["abandoned"]["reaped"] == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "never reaped: {report}");
        std::thread::sleep(Duration::from_millis(250));
    }
    let output = setup
        .command(&["usage", "--json", "--session", "billed"])
        .output()
        .unwrap();
    let records: Value = serde_json::from_slice(&output.stdout).unwrap();
    let records = records.as_array().unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    println!(
        "killed run billed {} s ({} → {}), host killed at {killed_at}, reaped after {reaps} reap(s)",
        record["seconds"], record["startedAt"], record["stoppedAt"]
    );
    // The contract forbids a guessed `sandbox_active_seconds`: the estimate is omabox's own
    // kind, and the contract kind stays absent.
    assert_eq!(
        record["kind"], "sandbox_active_seconds_estimated",
        "{record}"
    );
    assert_eq!(record["stopEstimated"], true, "{record}");
    let human = setup
        .command(&["usage", "--session", "billed"])
        .output()
        .unwrap();
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        !human.contains("sandbox_active_seconds ") && !human.contains("sandbox_active_seconds\n"),
        "an estimate shown as the contract kind: {human}"
    );
    assert!(
        human.contains("sandbox_active_seconds_estimated"),
        "{human}"
    );
    let stopped_at = record["stoppedAt"].as_str().unwrap();
    assert!(
        stopped_at <= killed_at.as_str(),
        "billed until {stopped_at}, after its host died ({killed_at}): {record}"
    );
    assert!(
        stopped_at >= record["startedAt"].as_str().unwrap(),
        "{record}"
    );
    assert!(setup.leftovers().is_empty(), "{:?}", setup.leftovers());
}

#[test]
fn a_double_ctrl_c_leaves_nothing_after_reap() {
    if !common::linux_available() {
        return;
    }
    let setup = Setup::new();
    let mut run = setup.run("interrupted", HOLDING_HARNESS).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while find(&setup.data.path().join("runtime"), "started").is_none() {
        assert!(Instant::now() < deadline, "the harness never started");
        if let Ok(Some(status)) = run.try_wait() {
            panic!("omabox run ended ({status}) before the harness started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = i32::try_from(run.id()).unwrap();
    for _ in 0..2 {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(pid, libc::SIGINT);
        }
    }
    let status = run.wait().unwrap();
    assert!(!status.success(), "{status}");

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let report = setup.reap();
        if setup.leftovers().is_empty() && report["abandoned"]["inspected"] == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still left: {:?}\nlast report: {report}",
            setup.leftovers()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[test]
fn reap_during_a_live_run_touches_nothing_of_it() {
    if !common::linux_available() {
        return;
    }
    let setup = Setup::new();
    let mut run = setup.run("live", HOLDING_HARNESS).spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while find(&setup.data.path().join("runtime"), "started").is_none() {
        assert!(Instant::now() < deadline, "the harness never started");
        if let Ok(Some(status)) = run.try_wait() {
            panic!("omabox run ended ({status}) before the harness started");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Processes come and go inside a live sandbox; its files, cgroups and bindings do not.
    let state = || -> Vec<String> {
        setup
            .leftovers()
            .into_iter()
            .filter(|item| !item.starts_with("process"))
            .collect()
    };
    let before = state();
    assert!(
        before.iter().any(|item| item.starts_with("state dir")),
        "{before:?}"
    );
    assert!(
        before.iter().any(|item| item.starts_with("binding")),
        "{before:?}"
    );
    for _ in 0..3 {
        let report = setup.reap();
        let leftovers = &report["leftovers"];
        assert_eq!(
            leftovers["sandboxes"]["removed"],
            serde_json::json!([]),
            "{report}"
        );
        assert_eq!(
            leftovers["bindingsRemoved"],
            serde_json::json!([]),
            "{report}"
        );
        assert_eq!(report["abandoned"]["inspected"], 0, "{report}");
    }
    assert_eq!(state(), before, "reap changed a live run's state");
    assert!(
        setup
            .leftovers()
            .iter()
            .any(|item| item.starts_with("process")),
        "the live sandbox's processes were killed"
    );
    assert!(
        run.try_wait().unwrap().is_none(),
        "the live run was disturbed"
    );

    // Ctrl-C: the run cleans up after itself.
    let pid = i32::try_from(run.id()).unwrap();
    // SAFETY: kill(2) on our own child's pid.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
    assert_eq!(run.wait().unwrap().code(), Some(130));
    assert!(setup.leftovers().is_empty(), "{:?}", setup.leftovers());
}

#[test]
fn reap_removes_old_empty_sandbox_cgroups_that_no_state_dir_names() {
    // A teardown that lost its cgroup's removal leaves a cgroup no state dir names, which
    // the state-dir sweep alone would never find. Old and empty: removed. Young: kept (it
    // may belong to another runtime dir's start sharing this cgroup parent).
    if !common::linux_available() {
        return;
    }
    let setup = Setup::new();
    let (old, young) = ("0123456789abcdef", "fedcba9876543210");
    // The hierarchies every layout has a sandbox cgroup in (v1 memory and pids; v2 one).
    let v2 = matches!(
        omabox_backend_linux::CgroupLayout::detect(),
        Ok(Some(omabox_backend_linux::CgroupLayout::V2 { .. }))
    );
    let parents: Vec<PathBuf> = setup
        .cgroup_parents()
        .into_iter()
        .filter(|p| {
            let hierarchy = p.parent().and_then(|h| h.file_name()).unwrap_or_default();
            v2 || hierarchy == "memory" || hierarchy == "pids"
        })
        .collect();
    assert!(!parents.is_empty(), "no cgroup hierarchy found");
    let backdated = libc::timespec {
        // SAFETY: time(2) with a null pointer only returns the time.
        tv_sec: unsafe { libc::time(std::ptr::null_mut()) } - 300,
        tv_nsec: 0,
    };
    for parent in &parents {
        for id in [old, young] {
            std::fs::create_dir_all(parent.join(id)).unwrap();
        }
        let path = std::ffi::CString::new(parent.join(old).as_os_str().as_bytes()).unwrap();
        // SAFETY: utimensat(2) with a valid path and two valid timespecs.
        let r =
            unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), [backdated; 2].as_ptr(), 0) };
        assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    }
    let report = setup.reap();
    let young_left: Vec<bool> = parents.iter().map(|p| p.join(young).is_dir()).collect();
    let old_left: Vec<PathBuf> = parents
        .iter()
        .map(|p| p.join(old))
        .filter(|d| d.is_dir())
        .collect();
    for parent in &parents {
        let _ = std::fs::remove_dir(parent.join(young));
        let _ = std::fs::remove_dir(parent.join(old));
    }
    assert!(
        old_left.is_empty(),
        "old orphan cgroups left: {old_left:?}; {report}"
    );
    assert!(
        young_left.iter().all(|kept| *kept),
        "a young cgroup was removed; {report}"
    );
    let removed = report.to_string();
    assert!(
        removed.contains(old),
        "the reap reports what it removed: {removed}"
    );
}
