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
        let scope = RuntimeResourceScope::new("local", "default", &format!("dead{index}"), "main");
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
                scope: RuntimeResourceScope::new("local", "default", &format!("o{index}"), "main"),
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
