//! Data safety through the `omabox` binary: what many dead hosts, concurrent collections and
//! killed writers leave must be found and handled by one `omabox reap`, and nothing a live
//! or published run needs may be lost.

mod common;

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, EnqueueRuntimeOrphanInput,
    LeaseJournalEntry, ManagedSandboxLease, Meta, MetaValue, PortError, RuntimeLeaseJournalPort,
    RuntimeOrphanPort, RuntimeResourceFencePort, RuntimeResourceScope, TerminationReason,
};
use omabox_store::SqliteStore;
use serde_json::Value;
use std::path::Path;

/// A linux lease of a sandbox that is long gone: its PID 1 cannot match (start time 1 of a
/// pid that is not running), no cgroup, a state dir that no longer exists.
fn dead_linux_lease(runtime_dir: &Path, id: &str) -> ManagedSandboxLease {
    let identity = serde_json::json!({
        "id": id,
        "pid": i32::MAX,
        "startTime": 1,
        "bootId": "gone",
        "cgroup": {"dirs": [], "unified": false},
        "stateDir": runtime_dir.join(id),
    });
    let mut metadata = Meta::new();
    metadata.insert(
        omabox_backend_linux::managed::IDENTITY_METADATA_KEY.into(),
        MetaValue::String(identity.to_string()),
    );
    ManagedSandboxLease {
        provider: "linux".into(),
        runtime_id: id.into(),
        metadata: Some(metadata),
    }
}

/// A store holding `hosts` dead hosts' journaled leases (each fence claimed, then expired)
/// and `orphans` orphans whose terminate failed.
async fn dead_hosts(data: &Path, runtime_dir: &Path, hosts: usize, orphans: usize) {
    let store = SqliteStore::open(data.join("omabox.db")).unwrap();
    for index in 0..hosts {
        let scope = RuntimeResourceScope::new("local", "default", format!("dead{index}"), "main");
        let AcquireRuntimeFenceResult::Acquired { fence, .. } = store
            .acquire(AcquireRuntimeFenceInput {
                scope: scope.clone(),
                owner_id: format!("host{index}"),
                ttl_ms: 1,
            })
            .await
            .unwrap()
        else {
            panic!("claim");
        };
        store
            .record(LeaseJournalEntry {
                scope,
                generation: fence.generation,
                owner_id: fence.owner_id.clone(),
                lease: dead_linux_lease(runtime_dir, &format!("{index:016x}")),
                acquired_at: "2026-01-01T00:00:00.000Z".into(),
            })
            .await
            .unwrap();
    }
    for index in 0..orphans {
        store
            .enqueue(EnqueueRuntimeOrphanInput {
                scope: RuntimeResourceScope::new("local", "default", format!("o{index}"), "main"),
                generation: 1,
                owner_id: "gone".into(),
                sandbox: dead_linux_lease(runtime_dir, &format!("{:016x}", 1_000_000 + index)),
                reason: TerminationReason::Failed,
                error: PortError::new("terminate failed"),
            })
            .await
            .unwrap();
    }
    // Every fence expired (ttl 1 ms).
    std::thread::sleep(std::time::Duration::from_millis(5));
}

#[test]
fn one_reap_reaps_every_dead_host_and_counts_what_is_left() {
    let dirs = common::TestDirs::new("reap");
    let (hosts, orphans) = (230, 140);
    tokio::runtime::Runtime::new().unwrap().block_on(dead_hosts(
        dirs.data.path(),
        dirs.runtime_dir.path(),
        hosts,
        orphans,
    ));
    let output = dirs.command(&["reap", "--json"]).output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let abandoned = &report["abandoned"];
    assert_eq!(abandoned["inspected"], hosts, "{abandoned}");
    assert_eq!(abandoned["reaped"], hosts, "{abandoned}");
    assert_eq!(abandoned["remaining"], 0, "{abandoned}");
    assert_eq!(report["inspected"], orphans, "{report}");
    assert_eq!(report["resolved"], orphans, "{report}");
    assert_eq!(report["remaining"], 0, "{report}");
    assert_eq!(report["queued"], serde_json::json!([]));

    // The journal and the queue are empty: a second reap finds nothing.
    let output = dirs.command(&["reap", "--json"]).output().unwrap();
    let again: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(again["abandoned"]["inspected"], 0, "{again}");
    assert_eq!(again["inspected"], 0, "{again}");
}

#[test]
fn a_limited_reap_reports_what_it_left_in_the_journal() {
    let dirs = common::TestDirs::new("reap");
    tokio::runtime::Runtime::new().unwrap().block_on(dead_hosts(
        dirs.data.path(),
        dirs.runtime_dir.path(),
        130,
        0,
    ));
    let output = dirs
        .command(&["reap", "--json", "--limit", "50"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["abandoned"]["reaped"], 50, "{report}");
    assert_eq!(report["abandoned"]["remaining"], 80, "{report}");
    let human = dirs.command(&["reap"]).output().unwrap();
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        human.contains("abandoned leases: inspected 80, reaped 80, remaining 0"),
        "{human}"
    );
}

/// `omabox --data-dir DATA ARGS…` on the `local` backend in test mode.
fn local(data: &Path, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(common::omabox_bin());
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_FAULT_POINT")
        .env_remove("OMABOX_GC_KEEP")
        .stdin(std::process::Stdio::null());
    command
}

/// `omabox run --backend local --session SESSION --json -- sh -c SCRIPT`.
fn local_run(data: &Path, session: &str, script: &str) -> std::process::Command {
    local(
        data,
        &[
            "run",
            "--backend",
            "local",
            "--session",
            session,
            "--json",
            "--",
            "sh",
            "-c",
            script,
        ],
    )
}

/// True when process `pid` waits for a flock on `path`: `/proc/locks` lists a waiter as
/// `N: -> FLOCK ADVISORY WRITE <pid> <maj>:<min>:<inode> 0 EOF`.
fn waits_for_lock(pid: u32, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(inode) = std::fs::metadata(path).map(|meta| meta.ino().to_string()) else {
        return false;
    };
    let pid = pid.to_string();
    std::fs::read_to_string("/proc/locks")
        .unwrap_or_default()
        .lines()
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.get(1) == Some(&"->")
                && fields.get(5) == Some(&pid.as_str())
                && fields
                    .get(6)
                    .is_some_and(|device| device.rsplit(':').next() == Some(inode.as_str()))
        })
}

/// Waits (bounded) until `done` holds, failing if `child` exits first.
fn wait_until(
    child: &mut std::process::Child,
    what: &str,
    done: impl Fn(&mut std::process::Child) -> bool,
) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !done(child) {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A flock held by this test on `path` until dropped.
struct Flock {
    _file: std::fs::File,
}

impl Flock {
    fn shared(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path)
            .unwrap();
        // SAFETY: flock(2) on an fd we own.
        let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_SH) };
        assert_eq!(locked, 0, "{}", std::io::Error::last_os_error());
        Self { _file: file }
    }
}

fn json_of(output: &std::process::Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", common::describe(output)))
}

/// The race of `omabox gc --grace 0` with a run that starts while it collects: the
/// collection read the history (no run in progress, nothing to keep of the new session) and
/// waits for the blob store's lock, which an in-flight checkpoint holds (here: this test);
/// meanwhile a run checkpoints and publishes. When the collection sweeps, the run's blobs are
/// young and unreferenced in the history it read. They must not be removed: every published
/// revision verifies afterwards.
#[test]
fn gc_with_a_short_grace_never_removes_what_a_run_started_during_it_publishes() {
    let data = tempfile::tempdir().unwrap();
    let output = local_run(data.path(), "old", "echo old > f")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));

    // Another run's checkpoint in flight: the blob store's lock held shared.
    let checkpoint = Flock::shared(&data.path().join("blobs/.lock"));
    let mut gc = local(
        data.path(),
        &["gc", "--keep", "1", "--grace", "0", "--json"],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let gc_pid = gc.id();
    wait_until(&mut gc, "gc waits for the checkpoint to finish", |gc| {
        assert!(gc.try_wait().unwrap().is_none(), "gc ended early");
        waits_for_lock(gc_pid, &data.path().join("blobs/.lock"))
    });
    let mut run = local_run(
        data.path(),
        "new",
        "head -c 300000 /dev/urandom > data; echo new > small",
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    let run_pid = run.id();
    // The run publishes (the race) or waits for the collection (no race); either way, then
    // the checkpoint finishes.
    wait_until(&mut run, "the run publishes or waits for the gc", |run| {
        run.try_wait().unwrap().is_some()
            || waits_for_lock(run_pid, &data.path().join("blobs/collect.lock"))
    });
    drop(checkpoint);
    let gc = gc.wait_with_output().unwrap();
    assert!(gc.status.success(), "{}", common::describe(&gc));
    let run = run.wait_with_output().unwrap();
    assert!(run.status.success(), "{}", common::describe(&run));
    assert_eq!(json_of(&run)["result"]["type"], "completed");

    let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
    let report = json_of(&fsck);
    assert_eq!(
        report["damagedRevisions"], 0,
        "the gc removed a published revision's blobs: {report}"
    );
    assert!(fsck.status.success(), "{}", common::describe(&fsck));
    let next = local_run(data.path(), "new", "cat small").output().unwrap();
    assert!(next.status.success(), "{}", common::describe(&next));
}

/// The same race unscripted: `omabox gc --grace 0` in a loop while runs publish, then every
/// published revision verifies. A collection may refuse (a run is in progress) but must never
/// remove what a publication names.
#[test]
fn gc_in_a_loop_while_runs_publish_loses_nothing() {
    let data = tempfile::tempdir().unwrap();
    let output = local_run(data.path(), "s0", "echo 0 > f").output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let collector = std::thread::spawn({
        let (data, stop) = (data.path().to_path_buf(), std::sync::Arc::clone(&stop));
        move || {
            let mut collected = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let output = local(&data, &["gc", "--keep", "1", "--grace", "0"])
                    .output()
                    .unwrap();
                if output.status.success() {
                    collected += 1;
                } else {
                    let stderr = String::from_utf8_lossy(&output.stderr);
                    assert!(stderr.contains("in progress"), "{stderr}");
                }
            }
            collected
        }
    });
    for round in 1..=12 {
        for session in ["a", "b"] {
            let output = local_run(
                data.path(),
                session,
                &format!("head -c 20000 /dev/urandom > r{round}; echo {round} > round"),
            )
            .output()
            .unwrap();
            assert!(output.status.success(), "{}", common::describe(&output));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let collected = collector.join().unwrap();
    println!("{collected} collections ran between the runs");
    let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
    let report = json_of(&fsck);
    assert_eq!(report["damagedRevisions"], 0, "{report}");
}

/// `omabox fsck` while `omabox gc` forgets revisions and removes their blobs: fsck read the
/// history (three revisions), then gc forgot two and removed what only they needed. Those two
/// are no longer published revisions; fsck must not report them as damaged.
#[test]
fn fsck_during_gc_reports_no_damage_that_is_only_a_collection() {
    let data = tempfile::tempdir().unwrap();
    for round in 1..=3 {
        let output = local_run(
            data.path(),
            "s",
            &format!("head -c 50000 /dev/urandom > r; echo {round} > round"),
        )
        .output()
        .unwrap();
        assert!(output.status.success(), "{}", common::describe(&output));
    }
    let sync = tempfile::tempdir().unwrap();
    let go = sync.path().join("go");
    let fsck = local(data.path(), &["fsck", "--json"])
        .env("OMABOX_PAUSE_POINT", "fsck-history-read")
        .env("OMABOX_PAUSE_FILE", &go)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let paused = sync.path().join("go.paused");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !paused.exists() {
        assert!(std::time::Instant::now() < deadline, "fsck never paused");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let gc = local(
        data.path(),
        &["gc", "--keep", "1", "--grace", "0", "--json"],
    )
    .output()
    .unwrap();
    assert!(gc.status.success(), "{}", common::describe(&gc));
    assert_eq!(json_of(&gc)["revisionsForgotten"], 2);
    std::fs::write(&go, b"").unwrap();
    let fsck = fsck.wait_with_output().unwrap();
    let report = json_of(&fsck);
    assert_eq!(report["damagedRevisions"], 0, "{report}");
    assert!(fsck.status.success(), "{}", common::describe(&fsck));
}

/// Starts `omabox ARGS` paused at `point`; returns it once it is there, with its go file.
fn paused_at(
    data: &Path,
    args: &[&str],
    point: &str,
    sync: &Path,
) -> (std::process::Child, std::path::PathBuf) {
    let go = sync.join(point);
    let child = local(data, args)
        .env("OMABOX_PAUSE_POINT", point)
        .env("OMABOX_PAUSE_FILE", &go)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let paused = sync.join(format!("{point}.paused"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !paused.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "never paused at {point}"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    (child, go)
}

/// Two collections at once: a second short-grace collection refuses while the first holds
/// the collection lock (it marked from the history and will sweep); a default-grace one runs
/// beside it (it removes nothing young). Every retained revision verifies afterwards.
#[test]
fn two_collections_at_once_remove_nothing_a_retained_revision_needs() {
    let data = tempfile::tempdir().unwrap();
    for round in 1..=4 {
        let output = local_run(
            data.path(),
            "s",
            &format!("head -c 50000 /dev/urandom > r; echo {round} > round"),
        )
        .output()
        .unwrap();
        assert!(output.status.success(), "{}", common::describe(&output));
    }
    let sync = tempfile::tempdir().unwrap();
    let (first, go) = paused_at(
        data.path(),
        &["gc", "--keep", "3", "--grace", "0", "--json"],
        "gc-marked",
        sync.path(),
    );
    let second = local(data.path(), &["gc", "--keep", "1", "--grace", "0"])
        .output()
        .unwrap();
    assert!(!second.status.success(), "{}", common::describe(&second));
    assert!(
        String::from_utf8_lossy(&second.stderr).contains("another `omabox gc`"),
        "{}",
        common::describe(&second)
    );
    let default = local(data.path(), &["gc", "--keep", "2", "--json"])
        .output()
        .unwrap();
    assert!(default.status.success(), "{}", common::describe(&default));
    assert_eq!(json_of(&default)["blobsRemoved"], 0, "nothing is old");
    std::fs::write(&go, b"").unwrap();
    let first = first.wait_with_output().unwrap();
    assert!(first.status.success(), "{}", common::describe(&first));
    let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
    let report = json_of(&fsck);
    assert_eq!(report["damagedRevisions"], 0, "{report}");
    assert_eq!(report["revisions"].as_array().unwrap().len(), 2, "{report}");
}

/// `omabox gc --grace 0` killed with SIGKILL after it forgot revisions and after it removed
/// its first blob: every revision still published verifies, the next collection finishes the
/// work, and the session continues.
#[test]
fn a_gc_killed_at_any_step_loses_nothing_retained() {
    use std::os::unix::process::ExitStatusExt as _;
    let data = tempfile::tempdir().unwrap();
    let mut round = 0;
    for point in ["gc-forgotten", "gc-blob-removed"] {
        for _ in 0..3 {
            round += 1;
            let output = local_run(
                data.path(),
                "s",
                &format!("head -c 50000 /dev/urandom > r{round}; echo {round} > round"),
            )
            .output()
            .unwrap();
            assert!(output.status.success(), "{}", common::describe(&output));
        }
        let killed = local(data.path(), &["gc", "--keep", "1", "--grace", "0"])
            .env("OMABOX_FAULT_POINT", point)
            .output()
            .unwrap();
        assert_eq!(
            killed.status.signal(),
            Some(libc::SIGKILL),
            "gc never reached {point}: {}",
            common::describe(&killed)
        );
        let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
        let report = json_of(&fsck);
        assert_eq!(
            report["damagedRevisions"], 0,
            "after a kill at {point}: {report}"
        );
    }
    let gc = local(
        data.path(),
        &["gc", "--keep", "1", "--grace", "0", "--json"],
    )
    .output()
    .unwrap();
    assert!(gc.status.success(), "{}", common::describe(&gc));
    let output = local_run(data.path(), "s", &format!("cat round r{round} > /dev/null"))
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    assert_eq!(json_of(&output)["result"]["type"], "completed");
}

/// A promotion into the file store (`omabox files add`, the path `omabox serve`'s promotion
/// takes) killed with SIGKILL while it wrote its temp file, and after it named the content
/// but before its record: `omabox reap` removes both leftovers; recorded files stay.
#[test]
fn reap_removes_what_killed_promotions_left() {
    use std::os::unix::process::ExitStatusExt as _;
    let data = tempfile::tempdir().unwrap();
    let source = data.path().join("source.txt");
    std::fs::write(&source, b"promoted bytes").unwrap();
    let kept = local(data.path(), &["files", "add", "--json"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(kept.status.success(), "{}", common::describe(&kept));
    let kept = json_of(&kept)["id"].as_str().unwrap().to_owned();
    let store = data.path().join("promoted");
    let names = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    for point in ["promote-temp-written", "promote-content-committed"] {
        let killed = local(data.path(), &["files", "add"])
            .arg(&source)
            .env("OMABOX_FAULT_POINT", point)
            .output()
            .unwrap();
        assert_eq!(
            killed.status.signal(),
            Some(libc::SIGKILL),
            "never reached {point}: {}",
            common::describe(&killed)
        );
        assert_eq!(
            names().len(),
            3,
            "a kill at {point} leaves one file: {:?}",
            names()
        );
        let output = local(data.path(), &["reap", "--json"]).output().unwrap();
        assert!(output.status.success(), "{}", common::describe(&output));
        assert_eq!(
            json_of(&output)["leftovers"]["promotedRemoved"],
            1,
            "{point}"
        );
        assert_eq!(names(), [kept.clone(), format!("{kept}.json")], "{point}");
    }
}

/// A small tmpfs mounted for one test (root), unmounted when dropped.
struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    fn mount(size: &str) -> Option<Self> {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        if !omabox_test_support::require_capability(
            (!root).then(|| "mounting a small tmpfs needs root".to_owned()),
        ) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success(), "mount tmpfs: {status}");
        Some(Self { dir })
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.dir.path())
            .status();
    }
}

/// A checkpoint that runs out of disk (the data dir is a full filesystem): the run fails and
/// publishes nothing, the last publication stays intact, no temp blob stays, and once the space
/// is back the session continues from its last revision.
#[test]
fn a_full_disk_during_a_checkpoint_fails_the_run_and_loses_nothing() {
    let Some(disk) = SmallDisk::mount("12m") else {
        return;
    };
    let data = disk.dir.path().join("data");
    let output = local_run(&data, "s", "echo kept > kept").output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    // 7 MiB in /workspace (the binding is on the same disk) fits; its blob does not.
    let output = local_run(&data, "s", "head -c 7340032 /dev/urandom > big")
        .output()
        .unwrap();
    assert!(!output.status.success(), "{}", common::describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "failed", "{report}");
    let failed: Vec<&str> = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["ok"] == false)
        .map(|event| event["step"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["workspace.checkpoint"], "{report}");
    let temps: Vec<_> = std::fs::read_dir(data.join("blobs/tmp"))
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .collect();
    assert!(temps.is_empty(), "temp blobs left: {temps:?}");
    let fsck = local(&data, &["fsck", "--json"]).output().unwrap();
    let fsck_report = json_of(&fsck);
    assert_eq!(fsck_report["damagedRevisions"], 0, "{fsck_report}");
    assert_eq!(fsck_report["revisions"].as_array().unwrap().len(), 1);
    let output = local_run(&data, "s", "cat kept; test ! -e big")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    assert_eq!(json_of(&output)["result"]["revision"], 2);
}

/// A stored blob whose bytes were altered (same size: bit rot, a stray write) must not be
/// reused for content a run has in hand: the next checkpoint storing that content replaces
/// the blob with the true bytes, so the new revision is intact (and the old one is again).
#[test]
fn an_altered_blob_is_replaced_by_the_next_checkpoint_of_its_content() {
    let data = tempfile::tempdir().unwrap();
    let output = local_run(data.path(), "first", "printf 'the content' > f")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let hex = omabox_persistence::BlobHash::of(b"the content").to_hex();
    let blob = data.path().join("blobs/sha256").join(&hex[..2]).join(&hex);
    std::fs::write(&blob, b"THE CONTENT").unwrap();
    let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
    assert_eq!(json_of(&fsck)["damagedRevisions"], 1);

    let output = local_run(data.path(), "second", "printf 'the content' > g")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    let fsck = local(data.path(), &["fsck", "--json"]).output().unwrap();
    let report = json_of(&fsck);
    assert_eq!(report["damagedRevisions"], 0, "{report}");
    assert_eq!(std::fs::read(&blob).unwrap(), b"the content");
}
