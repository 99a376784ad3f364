//! The lease journal over SQLite: one `runtime_lease` row per journaled compute, and
//! `abandoned` as one query joining the work item's `runtime_fence` row, with "now" read from
//! the store's clock inside the same statement's connection lock.

use super::scope_at;
use super::{SqliteStore, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{
    LeaseJournalEntry, ManagedSandboxLease, PortError, RuntimeLeaseJournalPort,
    RuntimeResourceScope,
};
use rusqlite::{Connection, params};

/// Columns of an entry, in the order [`read_entries`] expects.
const ENTRY_COLUMNS: &str = "l.id, l.workspace_id, l.environment_id, l.session_id, l.work_id, \
                             l.generation, l.owner_id, l.lease_json, l.acquired_at";

fn read_entries(
    conn: &Connection,
    sql: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<LeaseJournalEntry>, StoreError> {
    let mut statement = conn.prepare_cached(sql)?;
    let rows = statement.query_map(params, |row| {
        Ok((
            row.get::<_, String>(0)?,
            scope_at(row, 1)?,
            row.get::<_, i64>(5)?,
            row.get::<_, String>(6)?,
            row.get::<_, String>(7)?,
            row.get::<_, String>(8)?,
        ))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (id, scope, generation, owner_id, lease, acquired_at) = row?;
        let lease: ManagedSandboxLease = serde_json::from_str(&lease)
            .map_err(|error| StoreError::Corrupt(format!("lease JSON of {id}: {error}")))?;
        entries.push(LeaseJournalEntry {
            scope,
            generation: to_u64(generation, "generation")?,
            owner_id,
            lease,
            acquired_at,
        });
    }
    Ok(entries)
}

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

#[async_trait]
impl RuntimeLeaseJournalPort for SqliteStore {
    async fn record(&self, entry: LeaseJournalEntry) -> Result<(), PortError> {
        self.run("lease record", move |inner, _env| {
            let lease = serde_json::to_string(&entry.lease)
                .map_err(|error| StoreError::Corrupt(format!("lease JSON: {error}")))?;
            inner.conn.execute(
                "INSERT INTO runtime_lease (id, workspace_id, environment_id, session_id, work_id,
                                            generation, owner_id, provider, runtime_id,
                                            lease_json, acquired_at)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT (id) DO UPDATE SET
                      owner_id = excluded.owner_id,
                      lease_json = excluded.lease_json",
                params![
                    entry.id(),
                    entry.scope.workspace_id,
                    entry.scope.environment_id,
                    entry.scope.session_id,
                    entry.scope.work_id,
                    to_i64(entry.generation, "generation")?,
                    entry.owner_id,
                    entry.lease.provider,
                    entry.lease.runtime_id,
                    lease,
                    entry.acquired_at,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn forget(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError> {
        let scope = scope.clone();
        let provider = lease.provider.clone();
        let runtime_id = lease.runtime_id.clone();
        self.run("lease forget", move |inner, _env| {
            inner.conn.execute(
                "DELETE FROM runtime_lease
                  WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                    AND work_id = ?4 AND provider = ?5 AND runtime_id = ?6",
                params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id,
                    provider,
                    runtime_id,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        self.run("lease list", move |inner, _env| {
            read_entries(
                &inner.conn,
                &format!("SELECT {ENTRY_COLUMNS} FROM runtime_lease l ORDER BY l.id LIMIT ?1"),
                [limit_param(limit)],
            )
        })
        .await
    }

    async fn abandoned(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        self.run("lease abandoned", move |inner, env| {
            // Read under the connection lock, like every fence operation's expiry decision.
            let now_ms = to_i64(env.clock.now_ms(), "clock")?;
            // Held = the work item's latest generation is the entry's, it has an active
            // owner, and that fence has not expired. Everything else is abandoned.
            read_entries(
                &inner.conn,
                &format!(
                    "SELECT {ENTRY_COLUMNS}
                       FROM runtime_lease l
                       LEFT JOIN runtime_fence f
                              ON f.workspace_id = l.workspace_id
                             AND f.environment_id = l.environment_id
                             AND f.session_id = l.session_id
                             AND f.work_id = l.work_id
                      WHERE NOT (f.generation IS NOT NULL
                                 AND f.generation = l.generation
                                 AND f.active_owner_id IS NOT NULL
                                 AND f.active_expires_at_ms > ?1)
                      ORDER BY l.id
                      LIMIT ?2"
                ),
                params![now_ms, limit_param(limit)],
            )
        })
        .await
    }
}
