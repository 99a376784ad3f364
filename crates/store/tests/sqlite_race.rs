//! Several OS processes share one SQLite fence database.
//!
//! The test re-executes its own binary (`current_exe`) with `OMABOX_STORE_RACE_CHILD` set:
//! in that mode the test function plays one child process instead of the coordinator.
//! Children open the database concurrently (so first-open migration races too), report
//! ready, wait for a shared "go" file, then all acquire the same work item at once.

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, Nullable, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RuntimePublicationCandidate, RuntimeResourceFence,
    RuntimeResourceFencePort, RuntimeResourceScope,
};
use omabox_store::{Clock, ManualClock, SqliteStore, SystemClock};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHILD_MODE: &str = "OMABOX_STORE_RACE_CHILD";
const DIR: &str = "OMABOX_STORE_RACE_DIR";
const OWNER: &str = "OMABOX_STORE_RACE_OWNER";
const TEST_NAME: &str = "processes_racing_on_one_database_get_exactly_one_generation";
const CHILDREN: usize = 8;
const TTL: u64 = 600_000;
const DEADLINE: Duration = Duration::from_secs(120);

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", "raced-work")
}

fn candidate(id: &str) -> RuntimePublicationCandidate {
    RuntimePublicationCandidate {
        id: id.into(),
        content_hash: format!("sha256:{id}"),
        metadata: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn wait_for(path: &Path) {
    let started = Instant::now();
    while !path.exists() {
        assert!(
            started.elapsed() < DEADLINE,
            "timed out waiting for {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Writes `contents` so a reader never sees a partial file.
fn write_atomically(path: &Path, contents: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, contents).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

/// One child process: `acquire` (and publish if it won) or `publish-stale`.
fn child(mode: &str) {
    let dir = PathBuf::from(std::env::var(DIR).unwrap());
    let owner = std::env::var(OWNER).unwrap();
    let store = SqliteStore::open(dir.join("fences.db")).unwrap();
    match mode {
        "acquire" => {
            write_atomically(&dir.join(format!("ready-{owner}")), "");
            wait_for(&dir.join("go"));
            let outcome = runtime().block_on(async {
                let outcome = store
                    .acquire(AcquireRuntimeFenceInput {
                        scope: scope(),
                        owner_id: owner.clone(),
                        ttl_ms: TTL,
                    })
                    .await
                    .unwrap();
                if let AcquireRuntimeFenceResult::Acquired { fence, .. } = &outcome {
                    let published = store
                        .publish(PublishRuntimeResourcesInput {
                            fence: fence.clone(),
                            workspace_candidate: candidate(&format!("ws-{owner}")),
                            output_candidate: None,
                            runtime_checkpoint: Nullable::Absent,
                        })
                        .await
                        .unwrap();
                    assert_eq!(
                        published,
                        PublishRuntimeResourcesResult::Published { revision: 1 }
                    );
                }
                outcome
            });
            // The test hands the winner's fence (with its token) to the coordinator through a
            // private temporary directory; a real host never writes a token anywhere.
            write_atomically(
                &dir.join(format!("result-{owner}.json")),
                &serde_json::to_string(&outcome).unwrap(),
            );
        }
        "publish-stale" => {
            let fence: RuntimeResourceFence = serde_json::from_str(
                &std::fs::read_to_string(dir.join("stale-fence.json")).unwrap(),
            )
            .unwrap();
            let outcome = runtime().block_on(store.publish(PublishRuntimeResourcesInput {
                fence,
                workspace_candidate: candidate("ws-stale"),
                output_candidate: None,
                runtime_checkpoint: Nullable::Absent,
            }));
            write_atomically(
                &dir.join("result-stale.json"),
                &serde_json::to_string(&outcome.unwrap()).unwrap(),
            );
        }
        other => panic!("unknown child mode {other}"),
    }
}

fn spawn(dir: &Path, mode: &str, owner: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_MODE, mode)
        .env(DIR, dir)
        .env(OWNER, owner)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for `child`; fails the test with its output if it failed.
fn finish(child: Child, label: &str) {
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "child {label} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn processes_racing_on_one_database_get_exactly_one_generation() {
    if let Ok(mode) = std::env::var(CHILD_MODE) {
        child(&mode);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let owners: Vec<String> = (0..CHILDREN)
        .map(|index| format!("owner-{index}"))
        .collect();

    // 1. Every child opens the (not yet existing) database, then they acquire at one moment.
    let children: Vec<Child> = owners
        .iter()
        .map(|owner| spawn(dir.path(), "acquire", owner))
        .collect();
    let started = Instant::now();
    while !owners
        .iter()
        .all(|owner| dir.path().join(format!("ready-{owner}")).exists())
    {
        assert!(started.elapsed() < DEADLINE, "children did not get ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::fs::write(dir.path().join("go"), b"").unwrap();
    for (child, owner) in children.into_iter().zip(&owners) {
        finish(child, owner);
    }

    let outcomes: Vec<AcquireRuntimeFenceResult> = owners
        .iter()
        .map(|owner| {
            let text =
                std::fs::read_to_string(dir.path().join(format!("result-{owner}.json"))).unwrap();
            serde_json::from_str(&text).unwrap()
        })
        .collect();
    let winners: Vec<&RuntimeResourceFence> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            AcquireRuntimeFenceResult::Acquired { fence, .. } => Some(fence),
            AcquireRuntimeFenceResult::Conflict { .. } => None,
        })
        .collect();
    assert_eq!(
        winners.len(),
        1,
        "exactly one process acquires: {outcomes:?}"
    );
    let winner = winners[0].clone();
    assert_eq!(winner.generation, 1);
    for outcome in &outcomes {
        if let AcquireRuntimeFenceResult::Conflict { expires_at } = outcome {
            assert_eq!(expires_at.as_deref(), Some(winner.expires_at.as_str()));
        }
    }

    // 2. The winner's fence expires; the coordinator takes over as a new owner (its clock
    //    stands past the expiry) and sees the winner's publication.
    let store = SqliteStore::open(dir.path().join("fences.db"))
        .unwrap()
        .with_clock(ManualClock::new(SystemClock.now_ms() + TTL + 1_000));
    let rt = runtime();
    let AcquireRuntimeFenceResult::Acquired {
        fence: taker,
        publication,
    } = rt
        .block_on(store.acquire(AcquireRuntimeFenceInput {
            scope: scope(),
            owner_id: "taker".into(),
            ttl_ms: TTL,
        }))
        .unwrap()
    else {
        panic!("the expired fence should be taken over");
    };
    assert_eq!(taker.generation, 2);
    let publication = publication.unwrap();
    assert_eq!((publication.generation, publication.revision), (1, 1));
    assert_eq!(
        publication.workspace_candidate.id,
        format!("ws-{}", winner.owner_id)
    );

    // 3. Another process publishes with the stale generation-1 fence: lost, pointer unmoved.
    std::fs::write(
        dir.path().join("stale-fence.json"),
        serde_json::to_string(&winner).unwrap(),
    )
    .unwrap();
    finish(
        spawn(dir.path(), "publish-stale", &winner.owner_id),
        "publish-stale",
    );
    let stale: PublishRuntimeResourcesResult = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("result-stale.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stale, PublishRuntimeResourcesResult::Lost);

    let published = rt
        .block_on(store.publish(PublishRuntimeResourcesInput {
            fence: taker.clone(),
            workspace_candidate: candidate("ws-taker"),
            output_candidate: None,
            runtime_checkpoint: Nullable::Absent,
        }))
        .unwrap();
    assert_eq!(
        published,
        PublishRuntimeResourcesResult::Published { revision: 2 }
    );
}
