//! The SQLite schema and its migrations.
//!
//! The schema version lives in `PRAGMA user_version`; `PRAGMA application_id` marks the file
//! as an omabox store. Migrations are an explicit, ordered list: each step's SQL runs once,
//! in order, inside one `BEGIN IMMEDIATE` transaction together with the version bump, so
//! concurrent openers (several processes starting at once) migrate exactly once and a failed
//! step leaves the previous version intact. A database newer than [`SCHEMA_VERSION`] is
//! refused, never downgraded.
//!
//! To change the schema, append a [`Migration`] with the next version; never edit a released
//! step. Planned: the blob index.
//! (Version 3, session tokens and the vault, version 4, the publication history,
//! version 6, the estimated sandbox kind, and version 7, the run queue, are described on
//! their steps.)

use crate::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use std::path::Path;

/// `PRAGMA application_id` of an omabox store ("omab").
pub const APPLICATION_ID: i32 = 0x6f6d_6162;

/// One schema step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    /// The `user_version` after this step.
    pub(crate) version: u32,
    /// What the step does (shown when it fails).
    pub(crate) description: &'static str,
    /// The statements.
    pub(crate) sql: &'static str,
}

/// Every schema step, oldest first. Versions are 1, 2, 3, … without gaps.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "fence records and the orphan queue",
        sql: r#"
        -- One row per work item: the reference's {generation, active, publication, nextRevision}.
        -- The active fence's token is kept only as its SHA-256 (32 bytes); the token never
        -- reaches the database. The active fence's generation is always `generation`.
        CREATE TABLE runtime_fence (
            workspace_id          TEXT    NOT NULL,
            environment_id        TEXT    NOT NULL,
            session_id            TEXT    NOT NULL,
            work_id               TEXT    NOT NULL,
            generation            INTEGER NOT NULL CHECK (generation >= 0),
            next_revision         INTEGER NOT NULL CHECK (next_revision >= 1),
            active_owner_id       TEXT,
            active_token_sha256   BLOB    CHECK (active_token_sha256 IS NULL
                                                 OR length(active_token_sha256) = 32),
            active_expires_at_ms  INTEGER,
            -- RuntimeResourcePublication as its wire JSON (absent vs null checkpoint kept).
            publication_json      TEXT,
            PRIMARY KEY (workspace_id, environment_id, session_id, work_id),
            CHECK ((active_owner_id IS NULL) = (active_token_sha256 IS NULL)
                   AND (active_owner_id IS NULL) = (active_expires_at_ms IS NULL))
        ) STRICT;

        -- RuntimeOrphanRecord, one row per runtimeOrphanId. No token column, by design.
        CREATE TABLE runtime_orphan (
            id              TEXT    NOT NULL PRIMARY KEY,
            workspace_id    TEXT    NOT NULL,
            environment_id  TEXT    NOT NULL,
            session_id      TEXT    NOT NULL,
            work_id         TEXT    NOT NULL,
            generation      INTEGER NOT NULL CHECK (generation >= 0),
            owner_id        TEXT    NOT NULL,
            sandbox_json    TEXT    NOT NULL,
            reason          TEXT    NOT NULL
                            CHECK (reason IN ('completed', 'failed', 'lease_lost')),
            attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            last_error      TEXT    NOT NULL
        ) STRICT;
    "#,
    },
    Migration {
        version: 2,
        description: "the lease journal and the usage ledger",
        sql: r#"
        -- LeaseJournalEntry, one row per runtimeOrphanId of (scope, generation, lease): compute
        -- that acquire returned and nobody has destroyed yet. No token column, by design.
        CREATE TABLE runtime_lease (
            id              TEXT    NOT NULL PRIMARY KEY,
            workspace_id    TEXT    NOT NULL,
            environment_id  TEXT    NOT NULL,
            session_id      TEXT    NOT NULL,
            work_id         TEXT    NOT NULL,
            generation      INTEGER NOT NULL CHECK (generation >= 0),
            owner_id        TEXT    NOT NULL,
            provider        TEXT    NOT NULL,
            runtime_id      TEXT    NOT NULL,
            lease_json      TEXT    NOT NULL,
            acquired_at     TEXT    NOT NULL
        ) STRICT;
        CREATE INDEX runtime_lease_runtime
            ON runtime_lease (workspace_id, environment_id, session_id, work_id,
                              provider, runtime_id);

        -- UsageRecord, at most one per (kind, provider, runtime_id); seq is the order of
        -- recording. Seconds are whole and clamped to 24 h per record.
        CREATE TABLE usage_record (
            seq             INTEGER NOT NULL PRIMARY KEY,
            kind            TEXT    NOT NULL
                            CHECK (kind IN ('session_alive_seconds', 'sandbox_active_seconds',
                                            'browser_active_seconds')),
            workspace_id    TEXT    NOT NULL,
            environment_id  TEXT    NOT NULL,
            session_id      TEXT    NOT NULL,
            work_id         TEXT    NOT NULL,
            provider        TEXT    NOT NULL,
            runtime_id      TEXT    NOT NULL,
            seconds         INTEGER NOT NULL CHECK (seconds BETWEEN 0 AND 86400),
            started_at      TEXT    NOT NULL,
            stopped_at      TEXT    NOT NULL,
            UNIQUE (kind, provider, runtime_id)
        ) STRICT;
        CREATE INDEX usage_record_session ON usage_record (session_id, seq);
    "#,
    },
    Migration {
        version: 3,
        description: "session tokens and the vault",
        sql: r#"
        -- One row per issued session token, keyed by its SHA-256 (32 bytes); the token itself
        -- never reaches the database. Rows of older generations are revoked when a newer one
        -- is issued (rotation on reclaim); expired rows are pruned on issue.
        CREATE TABLE session_token (
            token_sha256    BLOB    NOT NULL PRIMARY KEY CHECK (length(token_sha256) = 32),
            workspace_id    TEXT    NOT NULL,
            environment_id  TEXT    NOT NULL,
            session_id      TEXT    NOT NULL,
            work_id         TEXT    NOT NULL,
            generation      INTEGER NOT NULL CHECK (generation >= 0),
            expires_at_ms   INTEGER NOT NULL,
            revoked         INTEGER NOT NULL DEFAULT 0 CHECK (revoked IN (0, 1))
        ) STRICT;
        CREATE INDEX session_token_claim
            ON session_token (workspace_id, environment_id, session_id, work_id, generation);

        -- Vault secrets by name. The value is stored as given (UTF-8 bytes): this is why the
        -- database file is created 0600. Never selected except by `get`.
        CREATE TABLE vault_secret (
            name            TEXT    NOT NULL PRIMARY KEY CHECK (length(name) > 0),
            value           BLOB    NOT NULL,
            created_at_ms   INTEGER NOT NULL,
            updated_at_ms   INTEGER NOT NULL
        ) STRICT;
    "#,
    },
    Migration {
        version: 4,
        description: "the publication history",
        sql: r#"
        -- Every publication of a work item, one row per revision, written in the publish
        -- transaction that advances runtime_fence.publication_json (so the newest row is always
        -- the active publication). Rows are never updated; `omabox fsck` verifies each one and
        -- `omabox run --from-revision N` restores an earlier one.
        CREATE TABLE runtime_publication (
            workspace_id      TEXT    NOT NULL,
            environment_id    TEXT    NOT NULL,
            session_id        TEXT    NOT NULL,
            work_id           TEXT    NOT NULL,
            revision          INTEGER NOT NULL CHECK (revision >= 1),
            generation        INTEGER NOT NULL CHECK (generation >= 0),
            publication_json  TEXT    NOT NULL,
            PRIMARY KEY (workspace_id, environment_id, session_id, work_id, revision)
        ) STRICT;
        INSERT INTO runtime_publication
            SELECT workspace_id, environment_id, session_id, work_id,
                   json_extract(publication_json, '$.revision'),
                   json_extract(publication_json, '$.generation'),
                   publication_json
              FROM runtime_fence
             WHERE publication_json IS NOT NULL;
    "#,
    },
    Migration {
        version: 5,
        description: "usage records say whether their stop was estimated",
        sql: r#"
        -- 1 when the runtime was found already dead and `stopped_at` is the last moment it was
        -- known alive (or, failing that, when it was found dead): see UsageRecord.
        ALTER TABLE usage_record
            ADD COLUMN stop_estimated INTEGER NOT NULL DEFAULT 0
                CHECK (stop_estimated IN (0, 1));
    "#,
    },
    Migration {
        version: 6,
        description: "an estimated sandbox stop is never the contract's sandbox_active_seconds",
        sql: r#"
        -- The contract: backends without an observed stop "leave the kind absent rather than
        -- writing a guessed duration". An estimated stop (version 5's stop_estimated = 1) is
        -- omabox's own kind, sandbox_active_seconds_estimated; the contract kind is never
        -- estimated (CHECK), and a runtime has at most one of the two (unique index), so a
        -- reap after a terminate adds nothing. SQLite cannot change a CHECK in place: the
        -- table is rebuilt, rows and their order (seq) kept, estimated rows renamed.
        CREATE TABLE usage_record_v6 (
            seq             INTEGER NOT NULL PRIMARY KEY,
            kind            TEXT    NOT NULL
                            CHECK (kind IN ('session_alive_seconds', 'sandbox_active_seconds',
                                            'browser_active_seconds',
                                            'sandbox_active_seconds_estimated')),
            workspace_id    TEXT    NOT NULL,
            environment_id  TEXT    NOT NULL,
            session_id      TEXT    NOT NULL,
            work_id         TEXT    NOT NULL,
            provider        TEXT    NOT NULL,
            runtime_id      TEXT    NOT NULL,
            seconds         INTEGER NOT NULL CHECK (seconds BETWEEN 0 AND 86400),
            started_at      TEXT    NOT NULL,
            stopped_at      TEXT    NOT NULL,
            stop_estimated  INTEGER NOT NULL DEFAULT 0 CHECK (stop_estimated IN (0, 1)),
            UNIQUE (kind, provider, runtime_id),
            CHECK ((kind = 'sandbox_active_seconds_estimated') = (stop_estimated = 1)
                   OR kind NOT IN ('sandbox_active_seconds',
                                   'sandbox_active_seconds_estimated'))
        ) STRICT;
        INSERT INTO usage_record_v6
            SELECT seq,
                   CASE WHEN kind = 'sandbox_active_seconds' AND stop_estimated = 1
                        THEN 'sandbox_active_seconds_estimated' ELSE kind END,
                   workspace_id, environment_id, session_id, work_id, provider, runtime_id,
                   seconds, started_at, stopped_at, stop_estimated
              FROM usage_record;
        DROP TABLE usage_record;
        ALTER TABLE usage_record_v6 RENAME TO usage_record;
        CREATE INDEX usage_record_session ON usage_record (session_id, seq);
        CREATE UNIQUE INDEX usage_record_sandbox_once ON usage_record (provider, runtime_id)
            WHERE kind IN ('sandbox_active_seconds', 'sandbox_active_seconds_estimated');
    "#,
    },
    Migration {
        version: 7,
        description: "the run queue, its events, and the run id of each publication",
        sql: RUN_QUEUE_SQL,
    },
    Migration {
        version: 8,
        description: "runs can be cancelled",
        sql: RUN_CANCEL_SQL,
    },
];

/// Version 8: `POST /v1/runs/{id}/cancel`. A queued run ends `cancelled`; a running one is
/// marked (`cancel_requested`) for its host. SQLite cannot change a CHECK in place: the
/// table is rebuilt, rows and their order (seq) kept.
const RUN_CANCEL_SQL: &str = r#"
        CREATE TABLE run_queue_v8 (
            seq                  INTEGER NOT NULL PRIMARY KEY,
            run_id               TEXT    NOT NULL UNIQUE,
            session_id           TEXT    NOT NULL,
            spec_json            TEXT    NOT NULL,
            status               TEXT    NOT NULL
                                 CHECK (status IN ('queued', 'running', 'completed', 'failed',
                                                   'cancelled')),
            attempts             INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            host_id              TEXT,
            claim_expires_at_ms  INTEGER,
            revision             INTEGER CHECK (revision IS NULL OR revision >= 1),
            error                TEXT,
            enqueued_at_ms       INTEGER NOT NULL,
            cancel_requested     INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1)),
            CHECK ((status = 'running') = (host_id IS NOT NULL)
                   AND (host_id IS NULL) = (claim_expires_at_ms IS NULL))
        ) STRICT;
        INSERT INTO run_queue_v8 (seq, run_id, session_id, spec_json, status, attempts, host_id,
                                  claim_expires_at_ms, revision, error, enqueued_at_ms)
            SELECT seq, run_id, session_id, spec_json, status, attempts, host_id,
                   claim_expires_at_ms, revision, error, enqueued_at_ms
              FROM run_queue;
        DROP TABLE run_queue;
        ALTER TABLE run_queue_v8 RENAME TO run_queue;
        CREATE INDEX run_queue_unended ON run_queue (session_id, seq)
            WHERE status IN ('queued', 'running');
        CREATE INDEX run_queue_host ON run_queue (host_id) WHERE status = 'running';
        CREATE INDEX run_queue_session ON run_queue (session_id, seq);
"#;

/// Version 7 (issue 30): runs accepted over HTTP, claimed by any host (`run_queue.rs`). A run
/// is claimed by `(host_id, attempts)` until `claim_expires_at_ms`; `revision` is set in the
/// publish transaction, like `runtime_publication.run_id`.
const RUN_QUEUE_SQL: &str = r#"
        CREATE TABLE run_queue (
            seq                  INTEGER NOT NULL PRIMARY KEY,
            run_id               TEXT    NOT NULL UNIQUE,
            session_id           TEXT    NOT NULL,
            spec_json            TEXT    NOT NULL,
            status               TEXT    NOT NULL
                                 CHECK (status IN ('queued', 'running', 'completed', 'failed')),
            attempts             INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
            host_id              TEXT,
            claim_expires_at_ms  INTEGER,
            revision             INTEGER CHECK (revision IS NULL OR revision >= 1),
            error                TEXT,
            enqueued_at_ms       INTEGER NOT NULL,
            CHECK ((status = 'running') = (host_id IS NOT NULL)
                   AND (host_id IS NULL) = (claim_expires_at_ms IS NULL))
        ) STRICT;
        CREATE INDEX run_queue_unended ON run_queue (session_id, seq)
            WHERE status IN ('queued', 'running');
        CREATE INDEX run_queue_host ON run_queue (host_id) WHERE status = 'running';
        CREATE TABLE run_event (
            run_id  TEXT    NOT NULL,
            seq     INTEGER NOT NULL CHECK (seq >= 1),
            text    TEXT    NOT NULL,
            PRIMARY KEY (run_id, seq)
        ) STRICT;
        ALTER TABLE runtime_publication ADD COLUMN run_id TEXT;
"#;

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// Brings the database to [`SCHEMA_VERSION`]; returns the version it found. `path` names the
/// file in errors.
pub(crate) fn migrate(conn: &mut Connection, path: &Path) -> Result<u32, StoreError> {
    migrate_through(conn, MIGRATIONS, path)
}

/// Applies the steps of `migrations` (a prefix of [`MIGRATIONS`]) the database lacks. Tests
/// pass a shorter prefix to build a database as an older omabox left it.
fn migrate_through(
    conn: &mut Connection,
    migrations: &[Migration],
    path: &Path,
) -> Result<u32, StoreError> {
    let newest = migrations.last().map_or(0, |step| step.version);
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found = check_identity(&tx, path)?;
    if found > newest {
        return Err(StoreError::SchemaTooNew {
            path: path.to_owned(),
            found,
            supported: newest,
        });
    }
    if found == newest {
        return Ok(found);
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    for migration in migrations.iter().filter(|step| step.version > found) {
        let failed = |source| StoreError::Migrate {
            version: migration.version,
            description: migration.description,
            source,
        };
        tx.execute_batch(migration.sql).map_err(failed)?;
        tx.pragma_update(None, "user_version", migration.version)
            .map_err(failed)?;
        tracing::info!(
            version = migration.version,
            description = migration.description,
            "store schema migrated"
        );
    }
    tx.commit()?;
    Ok(found)
}

/// The schema version of a database that is an omabox store (or still empty); anything else
/// is [`StoreError::NotAStore`]. Only reads.
///
/// An omabox store has our `application_id` (every migration sets it in the transaction that
/// creates the first table). A database with `application_id` 0 is ours only while it is
/// empty: no schema objects and `user_version` 0. Any other `application_id`, or tables or a
/// `user_version` without ours, is another application's database.
pub(crate) fn check_identity(conn: &Connection, path: &Path) -> Result<u32, StoreError> {
    let not_a_store = |reason: String| StoreError::NotAStore {
        path: path.to_owned(),
        reason,
    };
    let read = |conn: &Connection| -> rusqlite::Result<(u32, i32, i64)> {
        let version: u32 = conn.pragma_query_value(None, "user_version", |row| row.get(0))?;
        let application_id: i32 =
            conn.pragma_query_value(None, "application_id", |row| row.get(0))?;
        let objects: i64 =
            conn.query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))?;
        Ok((version, application_id, objects))
    };
    let (version, application_id, objects) = match read(conn) {
        Ok(found) => found,
        Err(rusqlite::Error::SqliteFailure(failure, _))
            if failure.code == rusqlite::ErrorCode::NotADatabase =>
        {
            return Err(not_a_store("the file is not a SQLite database".to_owned()));
        }
        Err(error) => return Err(error.into()),
    };
    if application_id == APPLICATION_ID {
        return Ok(version);
    }
    if application_id != 0 {
        return Err(not_a_store(format!(
            "it is a SQLite database of another application (application_id {application_id:#x})"
        )));
    }
    if objects != 0 || version != 0 {
        return Err(not_a_store(format!(
            "it is a SQLite database without omabox's application_id, with {objects} schema \
             objects and user_version {version}"
        )));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_start_at_one_and_have_no_gaps() {
        for (index, migration) in MIGRATIONS.iter().enumerate() {
            assert_eq!(
                migration.version as usize,
                index + 1,
                "{}",
                migration.description
            );
        }
    }

    #[test]
    fn migrating_twice_is_a_no_op() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn, Path::new(":memory:")).unwrap(), 0);
        assert_eq!(
            migrate(&mut conn, Path::new(":memory:")).unwrap(),
            SCHEMA_VERSION
        );
        let version: u32 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    /// A database file as omabox with only migration 1 left it (an active fence, a
    /// publication and an orphan) opens with this build at the current version, data intact,
    /// and the new tables work against the old fence rows.
    #[tokio::test]
    async fn a_version_1_file_is_migrated_with_its_data_intact() {
        use crate::{ManualClock, SqliteStore};
        use omabox_contract::{
            AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, LeaseJournalEntry,
            ManagedSandboxLease, RuntimeLeaseJournalPort, RuntimeOrphanPort,
            RuntimeResourceFencePort, RuntimeResourceScope, UsageKind, UsageLedgerPort,
            UsageRecord,
        };
        const NOW: i64 = 1_796_222_352_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omabox.db");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert_eq!(
                migrate_through(&mut conn, &MIGRATIONS[..1], Path::new("t")).unwrap(),
                0
            );
            conn.execute_batch(&format!(
                "INSERT INTO runtime_fence VALUES
                     ('w', 'e', 's', 'held', 3, 2, 'owner-a', zeroblob(32), {held_until},
                      '{{\"generation\":3,\"revision\":1,\"workspaceCandidate\":{{\"id\":\"ws-1\",\"contentHash\":\"sha256:1\"}},\"outputCandidate\":null}}'),
                     ('w', 'e', 's', 'expired', 1, 1, 'owner-a', zeroblob(32), {NOW}, NULL);
                 INSERT INTO runtime_orphan VALUES
                     ('o1', 'w', 'e', 's', 'held', 2, 'owner-a',
                      '{{\"provider\":\"linux\",\"runtimeId\":\"r0\"}}', 'failed', 4,
                      'terminate failed');",
                held_until = NOW + 60_000,
            ))
            .unwrap();
            let version: u32 = conn
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .unwrap();
            assert_eq!(version, 1);
        }

        let store = SqliteStore::open(&path)
            .unwrap()
            .with_clock(ManualClock::new(NOW as u64));
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);

        // Old data: the orphan, the held fence (with its publication), the expired one.
        let orphans = RuntimeOrphanPort::list(&store, 10).await.unwrap();
        assert_eq!(orphans.len(), 1);
        assert_eq!((orphans[0].attempts, orphans[0].generation), (4, 2));
        assert_eq!(orphans[0].last_error, "terminate failed");
        let claim = |work: &str| AcquireRuntimeFenceInput {
            scope: RuntimeResourceScope::new("w", "e", "s", work),
            owner_id: "owner-b".into(),
            ttl_ms: 1_000,
        };
        assert_eq!(
            store.acquire(claim("held")).await.unwrap(),
            AcquireRuntimeFenceResult::Conflict {
                expires_at: Some(crate::iso_millis(NOW as u64 + 60_000)),
            }
        );
        let AcquireRuntimeFenceResult::Acquired { fence, publication } =
            store.acquire(claim("expired")).await.unwrap()
        else {
            panic!("the expired fence is taken over");
        };
        assert_eq!(fence.generation, 2);
        assert_eq!(publication, None);

        // New tables, joined with the old fence rows.
        let lease = ManagedSandboxLease {
            provider: "linux".into(),
            runtime_id: "r3".into(),
            metadata: None,
        };
        for (work, generation) in [("held", 3), ("held", 2)] {
            store
                .record(LeaseJournalEntry {
                    scope: RuntimeResourceScope::new("w", "e", "s", work),
                    generation,
                    owner_id: "owner-a".into(),
                    lease: ManagedSandboxLease {
                        runtime_id: format!("r{generation}"),
                        ..lease.clone()
                    },
                    acquired_at: crate::iso_millis(NOW as u64),
                })
                .await
                .unwrap();
        }
        let abandoned = store.abandoned(10).await.unwrap();
        assert_eq!(abandoned.len(), 1);
        assert_eq!(abandoned[0].generation, 2);
        store
            .record_usage(UsageRecord {
                kind: UsageKind::SandboxActiveSeconds,
                scope: RuntimeResourceScope::new("w", "e", "s", "held"),
                provider: "linux".into(),
                runtime_id: "r3".into(),
                seconds: 5,
                started_at: crate::iso_millis(NOW as u64),
                stopped_at: crate::iso_millis(NOW as u64 + 5_000),
                stop_estimated: true,
            })
            .await
            .unwrap();
        let usage = store.usage("s").await.unwrap();
        assert_eq!(usage.len(), 1);
        assert!(usage[0].stop_estimated, "the migrated column round-trips");
        assert_eq!(
            usage[0].kind,
            UsageKind::SandboxActiveSecondsEstimated,
            "an estimate is never stored as the contract kind"
        );
    }

    /// A version-5 ledger holding an estimated `sandbox_active_seconds` row (what omabox
    /// wrote before version 6) reads back under the estimated kind, order kept; a measured row
    /// stays the contract kind; the schema refuses an estimated contract row.
    #[tokio::test]
    async fn a_version_5_estimate_becomes_the_estimated_kind() {
        use crate::SqliteStore;
        use omabox_contract::{UsageKind, UsageLedgerPort};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omabox.db");
        {
            let mut conn = Connection::open(&path).unwrap();
            migrate_through(&mut conn, &MIGRATIONS[..5], Path::new("t")).unwrap();
            conn.execute_batch(
                "INSERT INTO usage_record VALUES
                     (1, 'sandbox_active_seconds', 'w', 'e', 's', 'k', 'linux', 'dead', 30,
                      '2026-12-02T14:39:12.000Z', '2026-12-02T14:39:42.000Z', 1),
                     (2, 'sandbox_active_seconds', 'w', 'e', 's', 'k', 'linux', 'live', 5,
                      '2026-12-02T14:39:12.000Z', '2026-12-02T14:39:17.000Z', 0);",
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        let usage = store.usage("s").await.unwrap();
        let kinds: Vec<(UsageKind, &str, bool)> = usage
            .iter()
            .map(|r| (r.kind, r.runtime_id.as_str(), r.stop_estimated))
            .collect();
        assert_eq!(
            kinds,
            [
                (UsageKind::SandboxActiveSecondsEstimated, "dead", true),
                (UsageKind::SandboxActiveSeconds, "live", false),
            ]
        );
        drop(store);
        let conn = Connection::open(&path).unwrap();
        let refused = conn.execute(
            "INSERT INTO usage_record VALUES
                 (3, 'sandbox_active_seconds', 'w', 'e', 's', 'k', 'linux', 'x', 1,
                  '2026-12-02T14:39:12.000Z', '2026-12-02T14:39:13.000Z', 1)",
            [],
        );
        assert!(refused.is_err(), "an estimated contract row was stored");
    }

    /// A database file as omabox 2 left it (a fence, a lease) opens at the current version
    /// with its data intact, and the session-token and vault tables work.
    #[tokio::test]
    async fn a_version_2_file_is_migrated_and_gains_tokens_and_the_vault() {
        use crate::{ManualClock, SqliteStore};
        use omabox_contract::{
            IssueSessionTokenInput, RuntimeLeaseJournalPort, RuntimeResourceScope, SecretString,
            SessionTokenPort, VaultSecretPort,
        };
        const NOW: i64 = 1_796_222_352_000;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omabox.db");
        {
            let mut conn = Connection::open(&path).unwrap();
            assert_eq!(
                migrate_through(&mut conn, &MIGRATIONS[..2], Path::new("t")).unwrap(),
                0
            );
            conn.execute_batch(&format!(
                "INSERT INTO runtime_fence VALUES
                     ('w', 'e', 's', 'k', 2, 1, 'owner-a', zeroblob(32), {held_until}, NULL);
                 INSERT INTO runtime_lease VALUES
                     ('l1', 'w', 'e', 's', 'k', 1, 'owner-a', 'linux', 'r1',
                      '{{\"provider\":\"linux\",\"runtimeId\":\"r1\"}}',
                      '2026-12-02T14:39:12.000Z');",
                held_until = NOW + 60_000,
            ))
            .unwrap();
            let version: u32 = conn
                .pragma_query_value(None, "user_version", |row| row.get(0))
                .unwrap();
            assert_eq!(version, 2);
        }

        let store = SqliteStore::open(&path)
            .unwrap()
            .with_clock(ManualClock::new(NOW as u64));
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        // Old data: the generation-1 lease is abandoned (the fence is at generation 2).
        let abandoned = store.abandoned(10).await.unwrap();
        assert_eq!(abandoned.len(), 1);
        assert_eq!(abandoned[0].lease.runtime_id, "r1");

        let scope = RuntimeResourceScope::new("w", "e", "s", "k");
        let token = store
            .issue(IssueSessionTokenInput {
                scope: scope.clone(),
                generation: 2,
                ttl_ms: 1_000,
            })
            .await
            .unwrap();
        let claims = store.verify(token.expose()).await.unwrap().unwrap();
        assert_eq!((claims.scope, claims.generation), (scope, 2));
        store
            .put("mcp/github", SecretString::new("v"))
            .await
            .unwrap();
        assert_eq!(store.names().await.unwrap(), ["mcp/github"]);
    }

    /// A database as omabox 3 left it (a published work item) gains its history row.
    #[test]
    fn a_version_3_file_is_migrated_and_its_publication_enters_the_history() {
        use crate::SqliteStore;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("omabox.db");
        {
            let mut conn = Connection::open(&path).unwrap();
            migrate_through(&mut conn, &MIGRATIONS[..3], Path::new("t")).unwrap();
            conn.execute_batch(
                "INSERT INTO runtime_fence VALUES
                     ('w', 'e', 's', 'k', 4, 3, NULL, NULL, NULL,
                      '{\"generation\":4,\"revision\":2,\"workspaceCandidate\":{\"id\":\"wcp_2\",\"contentHash\":\"sha256:2\"},\"outputCandidate\":null}');",
            )
            .unwrap();
        }
        let store = SqliteStore::open(&path).unwrap();
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
        let history = store.publication_history().unwrap();
        assert_eq!(history.len(), 1);
        assert_eq!((history[0].1.revision, history[0].1.generation), (2, 4));
        assert_eq!(history[0].1.workspace_candidate.id, "wcp_2");
    }

    #[test]
    fn a_foreign_database_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "application_id", 7).unwrap();
        let error = migrate(&mut conn, Path::new(":memory:")).unwrap_err();
        assert!(error.to_string().contains("not an omabox store"), "{error}");
    }
}
