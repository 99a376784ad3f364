//! SQLite-only properties: what reaches the disk, persistence across reopen, the schema
//! version, and what a second handle on the same file sees.

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, EnqueueRuntimeOrphanInput,
    ManagedSandboxLease, Nullable, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeOrphanPort,
    RuntimePublicationCandidate, RuntimeResourceFence, RuntimeResourceFencePort,
    RuntimeResourceScope, TerminationReason,
};
use omabox_store::{
    APPLICATION_ID, ManualClock, SCHEMA_VERSION, SqliteStore, StoreError, TokenHash,
};
use std::path::Path;

const T0: u64 = 1_796_222_352_000;
const TTL: u64 = 60_000;

fn scope(work: &str) -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", work)
}

async fn acquire(store: &SqliteStore, work: &str, owner: &str) -> AcquireRuntimeFenceResult {
    store
        .acquire(AcquireRuntimeFenceInput {
            scope: scope(work),
            owner_id: owner.into(),
            ttl_ms: TTL,
        })
        .await
        .unwrap()
}

async fn acquired(store: &SqliteStore, work: &str, owner: &str) -> RuntimeResourceFence {
    match acquire(store, work, owner).await {
        AcquireRuntimeFenceResult::Acquired { fence, .. } => fence,
        other => panic!("expected to acquire: {other:?}"),
    }
}

fn candidate(id: &str) -> RuntimePublicationCandidate {
    RuntimePublicationCandidate {
        id: id.into(),
        content_hash: format!("sha256:{id}"),
        metadata: None,
    }
}

async fn publish(
    store: &SqliteStore,
    fence: &RuntimeResourceFence,
    id: &str,
) -> PublishRuntimeResourcesResult {
    store
        .publish(PublishRuntimeResourcesInput {
            fence: fence.clone(),
            workspace_candidate: candidate(id),
            output_candidate: Some(candidate(&format!("{id}-outputs"))),
            runtime_checkpoint: Nullable::Null,
        })
        .await
        .unwrap()
}

fn orphan_with_error(work: &str, error: &str) -> EnqueueRuntimeOrphanInput {
    EnqueueRuntimeOrphanInput {
        scope: scope(work),
        generation: 1,
        owner_id: "owner-a".into(),
        sandbox: ManagedSandboxLease {
            provider: "linux".into(),
            runtime_id: "runtime-1".into(),
            metadata: None,
        },
        reason: TerminationReason::Failed,
        error: PortError::new(error),
    }
}

/// Every byte of every file in `dir` (the database, its -wal and -shm).
fn all_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.display().to_string(), std::fs::read(&path).unwrap())
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn assert_absent(dir: &Path, secret: &str) {
    let random_part = secret.split_once(':').map_or(secret, |(_, random)| random);
    for (file, bytes) in all_bytes(dir) {
        assert!(!contains(&bytes, secret.as_bytes()), "{file} holds a token");
        assert!(
            !contains(&bytes, random_part.as_bytes()),
            "{file} holds a token's random part"
        );
    }
}

#[tokio::test]
async fn tokens_never_reach_the_database_files() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(T0);
    let store = SqliteStore::open(dir.path().join("omabox.db"))
        .unwrap()
        .with_clock(clock.clone());

    let first = acquired(&store, "k1", "owner-a").await;
    let second = acquired(&store, "k2", "owner-a").await;
    clock.advance(10);
    let RenewRuntimeFenceResult::Renewed { fence: renewed } =
        store.renew(&first, TTL).await.unwrap()
    else {
        panic!("renew");
    };
    assert_eq!(
        publish(&store, &renewed, "ws-1").await,
        PublishRuntimeResourcesResult::Published { revision: 1 }
    );
    // An unredacted token in an orphan error (the host redacts first; the store does too).
    let leaked = format!("terminate failed for fence {}", first.token.expose());
    store
        .enqueue(orphan_with_error("k1", &leaked))
        .await
        .unwrap();
    let listed = store.list(10).await.unwrap();
    assert_eq!(
        listed[0].last_error,
        "terminate failed for fence [redacted]"
    );
    store
        .failed(
            &listed[0].id,
            &PortError::new(format!("reap saw {}", second.token.expose())),
        )
        .await
        .unwrap();
    assert_eq!(
        store.list(1).await.unwrap()[0].last_error,
        "reap saw [redacted]"
    );

    // Sanity: we are looking at the right files — the hash of the active token is there.
    let hash = TokenHash::of(&first.token);
    assert!(
        all_bytes(dir.path())
            .iter()
            .any(|(_, bytes)| contains(bytes, hash.as_bytes())),
        "the token hash should be stored"
    );
    for token in [&first.token, &second.token] {
        assert_absent(dir.path(), token.expose());
    }

    // After close (which checkpoints the WAL into the main file) too.
    drop(store);
    for token in [&first.token, &second.token] {
        assert_absent(dir.path(), token.expose());
    }
}

#[tokio::test]
async fn store_errors_name_the_operation_and_never_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let store = SqliteStore::open(&path).unwrap();
    let fence = acquired(&store, "k", "owner-a").await;
    // Break the database under the store.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("DROP TABLE runtime_fence").unwrap();
    drop(raw);

    let error = store
        .publish(PublishRuntimeResourcesInput {
            fence: fence.clone(),
            workspace_candidate: candidate("ws"),
            output_candidate: None,
            runtime_checkpoint: Nullable::Absent,
        })
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .starts_with("SQLite store publish failed: store query failed:"),
        "{error}"
    );
    assert!(error.message().contains("runtime_fence"), "{error}");
    assert!(!error.message().contains(fence.token.expose()));
    for error in [
        store.renew(&fence, TTL).await.unwrap_err(),
        store.is_current(&fence).await.unwrap_err(),
        store
            .release(&fence, TerminationReason::Failed)
            .await
            .unwrap_err(),
    ] {
        assert!(!error.message().contains(fence.token.expose()), "{error}");
        assert!(
            !format!("{error:?}").contains(fence.token.expose()),
            "{error:?}"
        );
    }
}

#[tokio::test]
async fn fences_and_publications_survive_close_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested").join("dirs").join("omabox.db");
    let clock = ManualClock::new(T0);
    {
        let store = SqliteStore::open(&path).unwrap().with_clock(clock.clone());
        assert_eq!(store.path(), Some(path.as_path()));
        let fence = acquired(&store, "k", "owner-a").await;
        assert_eq!(fence.generation, 1);
        assert_eq!(
            publish(&store, &fence, "ws-1").await,
            PublishRuntimeResourcesResult::Published { revision: 1 }
        );
        store
            .enqueue(orphan_with_error("k", "terminate failed"))
            .await
            .unwrap();
    }

    let store = SqliteStore::open(&path).unwrap().with_clock(clock.clone());
    // Still held by owner-a until it expires.
    assert!(matches!(
        acquire(&store, "k", "owner-b").await,
        AcquireRuntimeFenceResult::Conflict { .. }
    ));
    clock.advance(TTL);
    let AcquireRuntimeFenceResult::Acquired { fence, publication } =
        acquire(&store, "k", "owner-b").await
    else {
        panic!("expired fence should be taken over");
    };
    assert_eq!(fence.generation, 2);
    let publication = publication.expect("the publication survives reopen");
    assert_eq!((publication.generation, publication.revision), (1, 1));
    assert_eq!(publication.workspace_candidate, candidate("ws-1"));
    assert_eq!(
        publication.output_candidate,
        Some(candidate("ws-1-outputs"))
    );
    assert_eq!(publication.runtime_checkpoint, Nullable::Null);
    assert_eq!(
        publish(&store, &fence, "ws-2").await,
        PublishRuntimeResourcesResult::Published { revision: 2 }
    );
    assert_eq!(store.list(10).await.unwrap().len(), 1);
}

#[test]
fn schema_version_and_application_id_are_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    drop(store);
    let raw = rusqlite::Connection::open(&path).unwrap();
    let version: u32 = raw
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    let application_id: i32 = raw
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .unwrap();
    let journal: String = raw
        .pragma_query_value(None, "journal_mode", |row| row.get(0))
        .unwrap();
    assert_eq!(
        (version, application_id, journal.as_str()),
        (SCHEMA_VERSION, APPLICATION_ID, "wal")
    );
    drop(raw);
    // Reopening an up-to-date database changes nothing.
    assert_eq!(
        SqliteStore::open(&path).unwrap().schema_version().unwrap(),
        SCHEMA_VERSION
    );
}

#[test]
fn a_database_from_a_newer_omabox_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.pragma_update(None, "application_id", APPLICATION_ID)
        .unwrap();
    raw.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(raw);
    let error = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::SchemaTooNew { found, supported, .. } if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{error:?}"
    );
    assert!(error.to_string().contains("newer"), "{error}");
}

#[test]
fn an_unopenable_path_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let error = SqliteStore::open(blocker.join("omabox.db")).unwrap_err();
    assert!(matches!(error, StoreError::CreateDir { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("cannot create the store directory"),
        "{error}"
    );
}

#[tokio::test]
async fn in_memory_database_works_and_has_no_path() {
    let store = SqliteStore::open_in_memory().unwrap();
    assert_eq!(store.path(), None);
    assert_eq!(acquired(&store, "k", "owner-a").await.generation, 1);
}

/// Two handles on one file stand for two processes: each knows only the tokens it issued.
#[tokio::test]
async fn same_owner_in_another_process_waits_for_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let clock = ManualClock::new(T0);
    let here = SqliteStore::open(&path).unwrap().with_clock(clock.clone());
    let there = SqliteStore::open(&path).unwrap().with_clock(clock.clone());

    let fence = acquired(&here, "k", "owner-a").await;
    // Re-entrant in the process that acquired it.
    assert_eq!(acquired(&here, "k", "owner-a").await, fence);
    // Elsewhere the token is unknown: conflict rather than a token it cannot have.
    assert_eq!(
        acquire(&there, "k", "owner-a").await,
        AcquireRuntimeFenceResult::Conflict {
            expires_at: Some(fence.expires_at.clone())
        }
    );
    // The holder's fence is valid in every process.
    assert!(there.is_current(&fence).await.unwrap());
    assert!(matches!(
        publish(&there, &fence, "ws").await,
        PublishRuntimeResourcesResult::Published { revision: 1 }
    ));
    clock.advance(TTL);
    let next = acquired(&there, "k", "owner-a").await;
    assert_eq!(next.generation, 2);
    assert!(!here.is_current(&fence).await.unwrap());
    assert_eq!(
        publish(&here, &fence, "ws-stale").await,
        PublishRuntimeResourcesResult::Lost
    );
}

#[test]
fn a_new_data_dir_is_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data/omabox");
    drop(SqliteStore::open(data.join("omabox.db")).unwrap());
    for d in [dir.path().join("data"), data] {
        let mode = std::fs::metadata(&d).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{} has mode {mode:o}", d.display());
    }
}
