//! The lease journal over PostgreSQL: one `runtime_lease` row per journaled compute, and
//! `abandoned` as one query joining the work item's `runtime_fence` row, "now" read from the
//! store's clock.

use super::{PostgresStore, scope_at, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{
    LeaseJournalEntry, ManagedSandboxLease, PortError, RuntimeLeaseJournalPort,
    RuntimeResourceScope,
};
use tokio_postgres::types::ToSql;

/// Columns of an entry, in the order [`PostgresStore::read_entries`] expects.
const ENTRY_COLUMNS: &str = "l.id, l.workspace_id, l.environment_id, l.session_id, l.work_id, \
                             l.generation, l.owner_id, l.lease_json, l.acquired_at";

fn limit_param(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

impl PostgresStore {
    async fn read_entries(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<LeaseJournalEntry>, StoreError> {
        let client = self.client().await?;
        let rows = client.query(sql, params).await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let lease: ManagedSandboxLease =
                    serde_json::from_str(&row.try_get::<_, String>(7)?).map_err(|error| {
                        StoreError::Corrupt(format!("lease JSON of {id}: {error}"))
                    })?;
                Ok(LeaseJournalEntry {
                    scope: scope_at(row, 1)?,
                    generation: to_u64(row.try_get(5)?, "generation")?,
                    owner_id: row.try_get(6)?,
                    lease,
                    acquired_at: row.try_get(8)?,
                })
            })
            .collect()
    }

    async fn record_lease(&self, entry: LeaseJournalEntry) -> Result<(), StoreError> {
        let lease = serde_json::to_string(&entry.lease)
            .map_err(|error| StoreError::Corrupt(format!("lease JSON: {error}")))?;
        self.execute(
            "INSERT INTO runtime_lease (id, workspace_id, environment_id, session_id, work_id,
                                        generation, owner_id, provider, runtime_id,
                                        lease_json, acquired_at)
                  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT (id) DO UPDATE SET
                  owner_id = excluded.owner_id,
                  lease_json = excluded.lease_json",
            &[
                &entry.id(),
                &entry.scope.workspace_id,
                &entry.scope.environment_id,
                &entry.scope.session_id,
                &entry.scope.work_id,
                &to_i64(entry.generation, "generation")?,
                &entry.owner_id,
                &entry.lease.provider,
                &entry.lease.runtime_id,
                &lease,
                &entry.acquired_at,
            ],
        )
        .await
        .map(drop)
    }
}

#[async_trait]
impl RuntimeLeaseJournalPort for PostgresStore {
    async fn record(&self, entry: LeaseJournalEntry) -> Result<(), PortError> {
        self.record_lease(entry)
            .await
            .map_err(|error| self.port_error("lease record", error))
    }

    async fn forget(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError> {
        self.execute(
            "DELETE FROM runtime_lease
              WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                AND work_id = $4 AND provider = $5 AND runtime_id = $6",
            &[
                &scope.workspace_id,
                &scope.environment_id,
                &scope.session_id,
                &scope.work_id,
                &lease.provider,
                &lease.runtime_id,
            ],
        )
        .await
        .map(drop)
        .map_err(|error| self.port_error("lease forget", error))
    }

    async fn list(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        self.read_entries(
            &format!(
                "SELECT {ENTRY_COLUMNS} FROM runtime_lease l ORDER BY l.id COLLATE \"C\" LIMIT $1"
            ),
            &[&limit_param(limit)],
        )
        .await
        .map_err(|error| self.port_error("lease list", error))
    }

    async fn abandoned(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        let abandoned = async {
            let now_ms = to_i64(self.clock.now_ms(), "clock")?;
            // Held = the work item's latest generation is the entry's, it has an active
            // owner, and that fence has not expired. Everything else is abandoned.
            self.read_entries(
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
                                 AND f.active_expires_at_ms > $1)
                      ORDER BY l.id COLLATE \"C\"
                      LIMIT $2"
                ),
                &[&now_ms, &limit_param(limit)],
            )
            .await
        };
        abandoned
            .await
            .map_err(|error| self.port_error("lease abandoned", error))
    }
}
