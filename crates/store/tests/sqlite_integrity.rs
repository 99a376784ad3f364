//! An existing database that is not a healthy omabox store is refused with an error naming the
//! file and what to do, and is never modified; a missing one is created whole.

use omabox_store::{APPLICATION_ID, SCHEMA_VERSION, SqliteStore, StoreError};
use std::path::{Path, PathBuf};

fn db_in(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("omabox.db")
}

/// Refuses `path` and checks the file is byte-for-byte unchanged.
fn refused(path: &Path) -> StoreError {
    let before = std::fs::read(path).unwrap();
    let error = SqliteStore::open(path).unwrap_err();
    assert_eq!(
        std::fs::read(path).unwrap(),
        before,
        "the file was modified"
    );
    let text = error.to_string();
    assert!(text.contains(&path.display().to_string()), "{text}");
    error
}

#[test]
fn an_empty_file_is_refused_not_recreated() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    std::fs::write(&path, b"").unwrap();
    let error = refused(&path);
    assert!(matches!(error, StoreError::NotAStore { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("empty (0 bytes)"), "{text}");
    assert!(text.contains("never overwrites"), "{text}");
    assert!(SqliteStore::open_if_exists(&path).is_err());
}

#[test]
fn a_garbage_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    std::fs::write(&path, vec![0x5a; 8192]).unwrap();
    let error = refused(&path);
    assert!(
        error.to_string().contains("not a SQLite database"),
        "{error}"
    );
}

#[test]
fn another_applications_database_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    // Without an application_id but with tables (most SQLite applications).
    let path = db_in(&dir);
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('mine');")
        .unwrap();
    drop(conn);
    let error = refused(&path);
    assert!(matches!(error, StoreError::NotAStore { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("without omabox's application_id"),
        "{error}"
    );

    // With its own application_id.
    let other = dir.path().join("other.db");
    let conn = rusqlite::Connection::open(&other).unwrap();
    conn.pragma_update(None, "application_id", 0x1234).unwrap();
    conn.execute_batch("CREATE TABLE t (x)").unwrap();
    drop(conn);
    let error = refused(&other);
    assert!(error.to_string().contains("another application"), "{error}");
}

#[test]
fn a_newer_schema_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    drop(SqliteStore::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let error = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(error, StoreError::SchemaTooNew { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains(&path.display().to_string()),
        "{error}"
    );
}

#[test]
fn a_database_failing_quick_check_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    {
        let store = SqliteStore::open(&path).unwrap();
        drop(store);
        // Enough rows for several b-tree pages.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch(
            "CREATE TABLE filler (n INTEGER PRIMARY KEY, body TEXT);
             WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000)
             INSERT INTO filler SELECT n, printf('%0200d', n) FROM c;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    }
    // Overwrite the middle pages (not page 1: the header stays valid).
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 16 * 4096, "{}", bytes.len());
    for byte in &mut bytes[8 * 4096..12 * 4096] {
        *byte = 0xa5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let error = refused(&path);
    assert!(matches!(error, StoreError::Damaged { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains("damaged"), "{text}");
    assert!(text.contains("restore it from a backup"), "{text}");
}

#[test]
fn a_missing_database_is_created_whole_and_open_if_exists_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("a/b");
    let path = nested.join("omabox.db");
    assert!(SqliteStore::open_if_exists(&path).unwrap().is_none());
    assert!(!nested.exists(), "open_if_exists created the directory");

    let store = SqliteStore::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    let conn = rusqlite::Connection::open(&path).unwrap();
    let id: i32 = conn
        .pragma_query_value(None, "application_id", |row| row.get(0))
        .unwrap();
    assert_eq!(id, APPLICATION_ID);
    // No temp file is left next to it.
    let names: Vec<String> = std::fs::read_dir(&nested)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(".omabox.db.new-"))
        .collect();
    assert!(names.is_empty(), "{names:?}");
    assert!(SqliteStore::open_if_exists(&path).unwrap().is_some());
}

#[test]
fn concurrent_creators_share_one_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || SqliteStore::open(&path).map(|store| store.schema_version()))
        })
        .collect();
    for handle in handles {
        assert_eq!(handle.join().unwrap().unwrap().unwrap(), SCHEMA_VERSION);
    }
}

/// Runs `f` with `dir` immutable (`chattr +i`: even root cannot create files in it).
fn with_immutable_dir(dir: &Path, f: impl FnOnce()) {
    let set = std::process::Command::new("chattr")
        .arg("+i")
        .arg(dir)
        .status();
    if !set.is_ok_and(|status| status.success()) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chattr +i is needed for the read-only data directory test"
        );
        eprintln!("skipped: chattr +i does not work here");
        return;
    }
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let _ = std::process::Command::new("chattr")
        .arg("-i")
        .arg(dir)
        .status();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

#[test]
fn a_read_only_data_directory_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    with_immutable_dir(&data, || {
        let error = SqliteStore::open(data.join("omabox.db")).unwrap_err();
        assert!(matches!(error, StoreError::NotWritable { .. }), "{error:?}");
        let text = error.to_string();
        assert!(text.contains("is not writable"), "{text}");
        assert!(text.contains(&data.display().to_string()), "{text}");
    });
}

#[test]
fn a_crashed_creations_temp_file_is_removed_by_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    drop(SqliteStore::open(&path).unwrap());
    let stale = dir.path().join(".omabox.db.new-999999-0000000000000000");
    std::fs::write(&stale, b"half a database").unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .unwrap()
        .set_modified(old)
        .unwrap();
    drop(SqliteStore::open(&path).unwrap());
    assert!(!stale.exists());
}

/// A crash (power loss) can leave the write-ahead log cut anywhere. A copy of a live store
/// whose WAL is truncated in the middle of its last frame opens: SQLite replays the complete,
/// checksummed frames (the committed publications) and drops the torn tail; the store passes
/// its integrity check and keeps working. Cut at every length of the last transaction, it
/// never opens with half a publication.
#[tokio::test]
async fn a_truncated_wal_opens_with_every_transaction_it_fully_holds() {
    use omabox_contract::{
        AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PublishRuntimeResourcesInput,
        PublishRuntimeResourcesResult, RuntimePublicationCandidate, RuntimeResourceFencePort,
        RuntimeResourceScope,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = db_in(&dir);
    let store = SqliteStore::open(&path).unwrap();
    let scope = RuntimeResourceScope::new("w", "e", "s", "main");
    let AcquireRuntimeFenceResult::Acquired { fence, .. } = store
        .acquire(AcquireRuntimeFenceInput {
            scope: scope.clone(),
            owner_id: "owner".into(),
            ttl_ms: 600_000,
        })
        .await
        .unwrap()
    else {
        panic!("claim");
    };
    let mut wal_after = Vec::new();
    for revision in 1..=3u64 {
        let candidate = |id: String| RuntimePublicationCandidate {
            content_hash: format!("sha256:{id}"),
            id,
            metadata: None,
        };
        let published = store
            .publish(PublishRuntimeResourcesInput {
                fence: fence.clone(),
                workspace_candidate: candidate(format!("ws-{revision}")),
                output_candidate: None,
                runtime_checkpoint: Default::default(),
            })
            .await
            .unwrap();
        assert_eq!(
            published,
            PublishRuntimeResourcesResult::Published { revision }
        );
        wal_after.push(
            std::fs::metadata(path.with_extension("db-wal"))
                .unwrap()
                .len(),
        );
    }
    // The store is still open: its last transactions live in the WAL only.
    let wal = std::fs::read(path.with_extension("db-wal")).unwrap();
    let main = std::fs::read(&path).unwrap();
    let (second, third) = (wal_after[1], wal_after[2]);
    assert!(third > second, "the third publish added WAL frames");
    for cut in [second, second + 1, (second + third) / 2, third - 1, third] {
        let copy = tempfile::tempdir().unwrap();
        let copied = db_in(&copy);
        std::fs::write(&copied, &main).unwrap();
        std::fs::write(copied.with_extension("db-wal"), &wal[..cut as usize]).unwrap();
        let reopened = SqliteStore::open(&copied)
            .unwrap_or_else(|error| panic!("WAL cut at {cut} of {third}: {error}"));
        let revisions: Vec<u64> = reopened
            .publications_of(&scope)
            .unwrap()
            .iter()
            .map(|p| p.revision)
            .collect();
        let expected: &[u64] = if cut == third { &[3, 2, 1] } else { &[2, 1] };
        assert_eq!(revisions, expected, "WAL cut at {cut} of {third}");
    }
    drop(store);
}
