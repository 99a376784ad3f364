//! The PostgreSQL schema and its migrations.
//!
//! Versions are rows of `omabox_schema_migration`. Migrating is one transaction that first
//! takes a transaction-scoped advisory lock (the two-key form, so it never meets a work
//! item's one-key lock), creates the version table if missing, and applies the steps the
//! database lacks with their version rows: two hosts starting at once migrate exactly once,
//! and a failed step leaves the previous version intact (PostgreSQL's DDL is transactional).
//! A database newer than [`POSTGRES_SCHEMA_VERSION`] is refused, never downgraded.
//!
//! Version 1 is the SQLite schema at its version 6, in PostgreSQL types. To change the
//! schema, append a step; never edit a released one.

use crate::StoreError;
use deadpool_postgres::Object;

/// The advisory lock of migrations: "omab", 1.
const MIGRATION_LOCK: (i32, i32) = (0x6f6d_6162, 1);

/// One schema step.
struct Migration {
    version: u32,
    description: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        description: "fences, publications, orphans, lease journal, usage, session tokens, vault",
        sql: r#"
    -- One row per work item. The active fence's token is kept only as its SHA-256.
    CREATE TABLE runtime_fence (
        workspace_id          text    NOT NULL,
        environment_id        text    NOT NULL,
        session_id            text    NOT NULL,
        work_id               text    NOT NULL,
        generation            bigint  NOT NULL CHECK (generation >= 0),
        next_revision         bigint  NOT NULL CHECK (next_revision >= 1),
        active_owner_id       text,
        active_token_sha256   bytea   CHECK (active_token_sha256 IS NULL
                                             OR length(active_token_sha256) = 32),
        active_expires_at_ms  bigint,
        -- RuntimeResourcePublication as its wire JSON (absent vs null checkpoint kept).
        publication_json      text,
        PRIMARY KEY (workspace_id, environment_id, session_id, work_id),
        CHECK ((active_owner_id IS NULL) = (active_token_sha256 IS NULL)
               AND (active_owner_id IS NULL) = (active_expires_at_ms IS NULL))
    );

    -- Every publication, one row per revision, written in the publish transaction.
    CREATE TABLE runtime_publication (
        workspace_id      text    NOT NULL,
        environment_id    text    NOT NULL,
        session_id        text    NOT NULL,
        work_id           text    NOT NULL,
        revision          bigint  NOT NULL CHECK (revision >= 1),
        generation        bigint  NOT NULL CHECK (generation >= 0),
        publication_json  text    NOT NULL,
        PRIMARY KEY (workspace_id, environment_id, session_id, work_id, revision)
    );

    -- RuntimeOrphanRecord, one row per runtimeOrphanId. No token column, by design.
    CREATE TABLE runtime_orphan (
        id              text    NOT NULL PRIMARY KEY,
        workspace_id    text    NOT NULL,
        environment_id  text    NOT NULL,
        session_id      text    NOT NULL,
        work_id         text    NOT NULL,
        generation      bigint  NOT NULL CHECK (generation >= 0),
        owner_id        text    NOT NULL,
        sandbox_json    text    NOT NULL,
        reason          text    NOT NULL
                        CHECK (reason IN ('completed', 'failed', 'lease_lost')),
        attempts        bigint  NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        last_error      text    NOT NULL
    );

    -- LeaseJournalEntry, one row per runtimeOrphanId of (scope, generation, lease).
    CREATE TABLE runtime_lease (
        id              text    NOT NULL PRIMARY KEY,
        workspace_id    text    NOT NULL,
        environment_id  text    NOT NULL,
        session_id      text    NOT NULL,
        work_id         text    NOT NULL,
        generation      bigint  NOT NULL CHECK (generation >= 0),
        owner_id        text    NOT NULL,
        provider        text    NOT NULL,
        runtime_id      text    NOT NULL,
        lease_json      text    NOT NULL,
        acquired_at     text    NOT NULL
    );
    CREATE INDEX runtime_lease_runtime
        ON runtime_lease (workspace_id, environment_id, session_id, work_id,
                          provider, runtime_id);

    -- UsageRecord, at most one per (kind, provider, runtime_id) and one sandbox kind per
    -- runtime; seq is the order of recording.
    CREATE TABLE usage_record (
        seq             bigint  GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        kind            text    NOT NULL
                        CHECK (kind IN ('session_alive_seconds', 'sandbox_active_seconds',
                                        'browser_active_seconds',
                                        'sandbox_active_seconds_estimated')),
        workspace_id    text    NOT NULL,
        environment_id  text    NOT NULL,
        session_id      text    NOT NULL,
        work_id         text    NOT NULL,
        provider        text    NOT NULL,
        runtime_id      text    NOT NULL,
        seconds         bigint  NOT NULL CHECK (seconds BETWEEN 0 AND 86400),
        started_at      text    NOT NULL,
        stopped_at      text    NOT NULL,
        stop_estimated  boolean NOT NULL DEFAULT false,
        UNIQUE (kind, provider, runtime_id),
        CHECK ((kind = 'sandbox_active_seconds_estimated') = stop_estimated
               OR kind NOT IN ('sandbox_active_seconds', 'sandbox_active_seconds_estimated'))
    );
    CREATE INDEX usage_record_session ON usage_record (session_id, seq);
    CREATE UNIQUE INDEX usage_record_sandbox_once ON usage_record (provider, runtime_id)
        WHERE kind IN ('sandbox_active_seconds', 'sandbox_active_seconds_estimated');

    -- One row per issued session token, keyed by its SHA-256; the token never gets here.
    CREATE TABLE session_token (
        token_sha256    bytea   NOT NULL PRIMARY KEY CHECK (length(token_sha256) = 32),
        workspace_id    text    NOT NULL,
        environment_id  text    NOT NULL,
        session_id      text    NOT NULL,
        work_id         text    NOT NULL,
        generation      bigint  NOT NULL CHECK (generation >= 0),
        expires_at_ms   bigint  NOT NULL,
        revoked         boolean NOT NULL DEFAULT false
    );
    CREATE INDEX session_token_claim
        ON session_token (workspace_id, environment_id, session_id, work_id, generation);

    -- Vault secrets by name, values as given. No CHECK on the value: a failing CHECK's
    -- DETAIL quotes the row. Never selected except by `get`.
    CREATE TABLE vault_secret (
        name            text    NOT NULL PRIMARY KEY,
        value           bytea   NOT NULL,
        created_at_ms   bigint  NOT NULL,
        updated_at_ms   bigint  NOT NULL
    );
"#,
    },
    Migration {
        version: 2,
        description: "the run queue, its events, and the run id of each publication",
        sql: RUN_QUEUE_SQL,
    },
    Migration {
        version: 3,
        description: "runs can be cancelled",
        sql: r#"
    -- POST /v1/runs/{id}/cancel (SQLite's version 8): a queued run ends 'cancelled', a
    -- running one is marked for its host.
    ALTER TABLE run_queue DROP CONSTRAINT run_queue_status_check;
    ALTER TABLE run_queue ADD CONSTRAINT run_queue_status_check
        CHECK (status IN ('queued', 'running', 'completed', 'failed', 'cancelled'));
    ALTER TABLE run_queue ADD COLUMN cancel_requested boolean NOT NULL DEFAULT false;
    CREATE INDEX run_queue_session ON run_queue (session_id, seq);
"#,
    },
];

/// Version 2 (issue 30; SQLite's version 7): runs accepted over HTTP, claimed by any host
/// (`run_queue.rs`). A run is claimed by `(host_id, attempts)` until `claim_expires_at_ms`;
/// `revision` is set in the publish transaction, like `runtime_publication.run_id`.
const RUN_QUEUE_SQL: &str = r#"
    CREATE TABLE run_queue (
        seq                  bigserial PRIMARY KEY,
        run_id               text    NOT NULL UNIQUE,
        session_id           text    NOT NULL,
        spec_json            text    NOT NULL,
        status               text    NOT NULL
                             CHECK (status IN ('queued', 'running', 'completed', 'failed')),
        attempts             bigint  NOT NULL DEFAULT 0 CHECK (attempts >= 0),
        host_id              text,
        claim_expires_at_ms  bigint,
        revision             bigint  CHECK (revision IS NULL OR revision >= 1),
        error                text,
        enqueued_at_ms       bigint  NOT NULL,
        CHECK ((status = 'running') = (host_id IS NOT NULL)
               AND (host_id IS NULL) = (claim_expires_at_ms IS NULL))
    );
    CREATE INDEX run_queue_unended ON run_queue (session_id, seq)
        WHERE status IN ('queued', 'running');
    CREATE INDEX run_queue_host ON run_queue (host_id) WHERE status = 'running';
    CREATE TABLE run_event (
        run_id  text    NOT NULL,
        seq     bigint  NOT NULL CHECK (seq >= 1),
        text    text    NOT NULL,
        PRIMARY KEY (run_id, seq)
    );
    ALTER TABLE runtime_publication ADD COLUMN run_id text;
"#;

/// The schema version this build writes and understands.
pub const POSTGRES_SCHEMA_VERSION: u32 = 3;

/// Brings the database to [`POSTGRES_SCHEMA_VERSION`]; returns the version it found.
/// `target` names the database in errors.
pub(super) async fn migrate(client: &mut Object, target: &str) -> Result<u32, StoreError> {
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1, $2)",
        &[&MIGRATION_LOCK.0, &MIGRATION_LOCK.1],
    )
    .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS omabox_schema_migration (
             version      integer     NOT NULL PRIMARY KEY,
             description  text        NOT NULL,
             applied_at   timestamptz NOT NULL DEFAULT now()
         )",
    )
    .await?;
    let found = read_version(&tx).await?;
    if found > POSTGRES_SCHEMA_VERSION {
        return Err(StoreError::DatabaseSchemaTooNew {
            target: target.to_owned(),
            found,
            supported: POSTGRES_SCHEMA_VERSION,
        });
    }
    for migration in MIGRATIONS.iter().filter(|step| step.version > found) {
        let failed = |error: tokio_postgres::Error| StoreError::MigrateDatabase {
            version: migration.version,
            description: migration.description,
            detail: super::describe(&error),
        };
        tx.batch_execute(migration.sql).await.map_err(failed)?;
        tx.execute(
            "INSERT INTO omabox_schema_migration (version, description) VALUES ($1, $2)",
            &[
                &i32::try_from(migration.version).unwrap_or(i32::MAX),
                &migration.description,
            ],
        )
        .await
        .map_err(failed)?;
        tracing::info!(
            version = migration.version,
            description = migration.description,
            "store schema migrated"
        );
    }
    tx.commit().await?;
    Ok(found)
}

/// The version recorded in the database (0 before the first migration).
pub(super) async fn version(client: &Object) -> Result<u32, StoreError> {
    read_version(client).await
}

async fn read_version(client: &impl deadpool_postgres::GenericClient) -> Result<u32, StoreError> {
    let row = client
        .query_one(
            "SELECT coalesce(max(version), 0) FROM omabox_schema_migration",
            &[],
        )
        .await?;
    let version: i32 = row.try_get(0)?;
    u32::try_from(version)
        .map_err(|_| StoreError::Corrupt(format!("negative schema version {version}")))
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
        assert_eq!(
            MIGRATIONS.last().map(|step| step.version),
            Some(POSTGRES_SCHEMA_VERSION)
        );
    }
}
