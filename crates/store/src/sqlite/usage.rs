//! The usage ledger over SQLite: `usage_record` rows, unique per `(kind, provider,
//! runtime_id)` and with at most one of the two sandbox kinds per runtime (the first record
//! wins), read back in the order they were recorded. An estimated stop is stored under
//! `sandbox_active_seconds_estimated`, never the contract's kind (`UsageRecord::clamped`;
//! the schema's CHECK refuses the other way).

use super::scope_at;
use super::{SqliteStore, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{PortError, UsageKind, UsageLedgerPort, UsageRecord};
use rusqlite::{Connection, params};

fn read_records(
    conn: &Connection,
    filter: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<UsageRecord>, StoreError> {
    let mut statement = conn.prepare_cached(&format!(
        "SELECT kind, workspace_id, environment_id, session_id, work_id, provider, runtime_id,
                seconds, started_at, stopped_at, stop_estimated
           FROM usage_record
          {filter}"
    ))?;
    let rows = statement.query_map(params, |row| {
        Ok((
            row.get::<_, String>(0)?,
            scope_at(row, 1)?,
            row.get::<_, String>(5)?,
            row.get::<_, String>(6)?,
            row.get::<_, i64>(7)?,
            row.get::<_, String>(8)?,
            row.get::<_, String>(9)?,
            row.get::<_, bool>(10)?,
        ))
    })?;
    let mut records = Vec::new();
    for row in rows {
        let (kind, scope, provider, runtime_id, seconds, started_at, stopped_at, stop_estimated) =
            row?;
        let kind = UsageKind::parse(&kind)
            .ok_or_else(|| StoreError::Corrupt(format!("unknown usage kind {kind:?}")))?;
        records.push(UsageRecord {
            kind,
            scope,
            provider,
            runtime_id,
            seconds: to_u64(seconds, "usage seconds")?,
            started_at,
            stopped_at,
            stop_estimated,
        });
    }
    Ok(records)
}

#[async_trait]
impl UsageLedgerPort for SqliteStore {
    async fn record_usage(&self, record: UsageRecord) -> Result<(), PortError> {
        self.run("usage record", move |inner, _env| {
            let record = record.clamped();
            inner.conn.execute(
                "INSERT INTO usage_record (kind, workspace_id, environment_id, session_id, work_id,
                                           provider, runtime_id, seconds, started_at, stopped_at,
                                           stop_estimated)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)
                 ON CONFLICT DO NOTHING",
                params![
                    record.kind.as_str(),
                    record.scope.workspace_id,
                    record.scope.environment_id,
                    record.scope.session_id,
                    record.scope.work_id,
                    record.provider,
                    record.runtime_id,
                    to_i64(record.seconds, "usage seconds")?,
                    record.started_at,
                    record.stopped_at,
                    record.stop_estimated,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn usage(&self, session_id: &str) -> Result<Vec<UsageRecord>, PortError> {
        let session_id = session_id.to_owned();
        self.run("usage read", move |inner, _env| {
            read_records(
                &inner.conn,
                "WHERE session_id = ?1 ORDER BY seq",
                [session_id],
            )
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<UsageRecord>, PortError> {
        self.run("usage list", move |inner, _env| {
            read_records(
                &inner.conn,
                "ORDER BY seq LIMIT ?1",
                [i64::try_from(limit).unwrap_or(i64::MAX)],
            )
        })
        .await
    }
}
