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
//! step. Planned: the usage ledger, the sandbox lease table, the blob index.

use crate::StoreError;
use rusqlite::{Connection, TransactionBehavior};

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
pub(crate) const MIGRATIONS: &[Migration] = &[Migration {
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
}];

/// The schema version this build writes and understands.
pub const SCHEMA_VERSION: u32 = MIGRATIONS[MIGRATIONS.len() - 1].version;

/// Brings the database to [`SCHEMA_VERSION`]; returns the version it found.
pub(crate) fn migrate(conn: &mut Connection) -> Result<u32, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let found: u32 = tx.pragma_query_value(None, "user_version", |row| row.get(0))?;
    let application_id: i32 = tx.pragma_query_value(None, "application_id", |row| row.get(0))?;
    if application_id != 0 && application_id != APPLICATION_ID {
        return Err(StoreError::Corrupt(format!(
            "the database has application_id {application_id:#x}; it is not an omabox store"
        )));
    }
    if found > SCHEMA_VERSION {
        return Err(StoreError::SchemaTooNew {
            found,
            supported: SCHEMA_VERSION,
        });
    }
    if found == SCHEMA_VERSION {
        return Ok(found);
    }
    tx.pragma_update(None, "application_id", APPLICATION_ID)?;
    for migration in MIGRATIONS.iter().filter(|step| step.version > found) {
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
        assert_eq!(migrate(&mut conn).unwrap(), 0);
        assert_eq!(migrate(&mut conn).unwrap(), SCHEMA_VERSION);
        let version: u32 = conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .unwrap();
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn a_foreign_database_is_refused() {
        let mut conn = Connection::open_in_memory().unwrap();
        conn.pragma_update(None, "application_id", 7).unwrap();
        let error = migrate(&mut conn).unwrap_err();
        assert!(error.to_string().contains("not an omabox store"), "{error}");
    }
}
