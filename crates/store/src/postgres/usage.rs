//! The usage ledger over PostgreSQL: `usage_record` rows, unique per `(kind, provider,
//! runtime_id)` and with at most one of the two sandbox kinds per runtime (the first record
//! wins), read back in the order they were recorded.

use super::{PostgresStore, scope_at, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{PortError, UsageKind, UsageLedgerPort, UsageRecord};
use tokio_postgres::types::ToSql;

impl PostgresStore {
    async fn read_usage(
        &self,
        filter: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<UsageRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT kind, workspace_id, environment_id, session_id, work_id, provider,
                            runtime_id, seconds, started_at, stopped_at, stop_estimated
                       FROM usage_record
                      {filter}"
                ),
                params,
            )
            .await?;
        rows.iter()
            .map(|row| {
                let kind: String = row.try_get(0)?;
                let kind = UsageKind::parse(&kind)
                    .ok_or_else(|| StoreError::Corrupt(format!("unknown usage kind {kind:?}")))?;
                Ok(UsageRecord {
                    kind,
                    scope: scope_at(row, 1)?,
                    provider: row.try_get(5)?,
                    runtime_id: row.try_get(6)?,
                    seconds: to_u64(row.try_get(7)?, "usage seconds")?,
                    started_at: row.try_get(8)?,
                    stopped_at: row.try_get(9)?,
                    stop_estimated: row.try_get(10)?,
                })
            })
            .collect()
    }

    async fn insert_usage(&self, record: UsageRecord) -> Result<(), StoreError> {
        let record = record.clamped();
        self.execute(
            "INSERT INTO usage_record (kind, workspace_id, environment_id, session_id, work_id,
                                       provider, runtime_id, seconds, started_at, stopped_at,
                                       stop_estimated)
                  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
             ON CONFLICT DO NOTHING",
            &[
                &record.kind.as_str(),
                &record.scope.workspace_id,
                &record.scope.environment_id,
                &record.scope.session_id,
                &record.scope.work_id,
                &record.provider,
                &record.runtime_id,
                &to_i64(record.seconds, "usage seconds")?,
                &record.started_at,
                &record.stopped_at,
                &record.stop_estimated,
            ],
        )
        .await
        .map(drop)
    }
}

#[async_trait]
impl UsageLedgerPort for PostgresStore {
    async fn record_usage(&self, record: UsageRecord) -> Result<(), PortError> {
        self.insert_usage(record)
            .await
            .map_err(|error| self.port_error("usage record", error))
    }

    async fn usage(&self, session_id: &str) -> Result<Vec<UsageRecord>, PortError> {
        self.read_usage("WHERE session_id = $1 ORDER BY seq", &[&session_id])
            .await
            .map_err(|error| self.port_error("usage read", error))
    }

    async fn list(&self, limit: usize) -> Result<Vec<UsageRecord>, PortError> {
        self.read_usage(
            "ORDER BY seq LIMIT $1",
            &[&i64::try_from(limit).unwrap_or(i64::MAX)],
        )
        .await
        .map_err(|error| self.port_error("usage list", error))
    }
}
