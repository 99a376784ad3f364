//! The orphan queue over SQLite: one row per `runtimeOrphanId`, listed in id order (byte
//! order of the UTF-8 id, like the in-memory twin).

use super::scope_at;
use super::{SqliteStore, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{
    EnqueueRuntimeOrphanInput, ManagedSandboxLease, PortError, RuntimeOrphanPort,
    RuntimeOrphanRecord, TerminationReason, runtime_orphan_id,
};
use rusqlite::params;

fn reason_from(text: &str) -> Result<TerminationReason, StoreError> {
    match text {
        "completed" => Ok(TerminationReason::Completed),
        "failed" => Ok(TerminationReason::Failed),
        "lease_lost" => Ok(TerminationReason::LeaseLost),
        other => Err(StoreError::Corrupt(format!(
            "unknown orphan reason {other:?}"
        ))),
    }
}

#[async_trait]
impl RuntimeOrphanPort for SqliteStore {
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
        self.run("orphan enqueue", move |inner, _env| {
            let id = runtime_orphan_id(&input.scope, input.generation, &input.sandbox);
            let sandbox = serde_json::to_string(&input.sandbox)
                .map_err(|error| StoreError::Corrupt(format!("lease JSON: {error}")))?;
            // The host redacts the fence token before enqueueing; redact once more with every
            // token this process holds, so a missed redaction still never reaches the disk.
            let last_error = inner.redact(input.error.message());
            inner.conn.execute(
                "INSERT INTO runtime_orphan (id, workspace_id, environment_id, session_id,
                                             work_id, generation, owner_id, sandbox_json,
                                             reason, attempts, last_error)
                      VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 0, ?10)
                 ON CONFLICT (id) DO UPDATE SET
                      workspace_id = excluded.workspace_id,
                      environment_id = excluded.environment_id,
                      session_id = excluded.session_id,
                      work_id = excluded.work_id,
                      generation = excluded.generation,
                      owner_id = excluded.owner_id,
                      sandbox_json = excluded.sandbox_json,
                      reason = excluded.reason,
                      last_error = excluded.last_error",
                params![
                    id,
                    input.scope.workspace_id,
                    input.scope.environment_id,
                    input.scope.session_id,
                    input.scope.work_id,
                    to_i64(input.generation, "generation")?,
                    input.owner_id,
                    sandbox,
                    input.reason.as_str(),
                    last_error,
                ],
            )?;
            Ok(())
        })
        .await
    }

    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError> {
        self.run("orphan list", move |inner, _env| {
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let mut statement = inner.conn.prepare_cached(
                "SELECT id, workspace_id, environment_id, session_id, work_id, generation,
                        owner_id, sandbox_json, reason, attempts, last_error
                   FROM runtime_orphan
                  ORDER BY id
                  LIMIT ?1",
            )?;
            let rows = statement.query_map([limit], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    scope_at(row, 1)?,
                    row.get::<_, i64>(5)?,
                    row.get::<_, String>(6)?,
                    row.get::<_, String>(7)?,
                    row.get::<_, String>(8)?,
                    row.get::<_, i64>(9)?,
                    row.get::<_, String>(10)?,
                ))
            })?;
            let mut records = Vec::new();
            for row in rows {
                let (id, scope, generation, owner_id, sandbox, reason, attempts, last_error) = row?;
                let sandbox: ManagedSandboxLease = serde_json::from_str(&sandbox)
                    .map_err(|error| StoreError::Corrupt(format!("lease JSON of {id}: {error}")))?;
                records.push(RuntimeOrphanRecord {
                    scope,
                    generation: to_u64(generation, "generation")?,
                    owner_id,
                    sandbox,
                    reason: reason_from(&reason)?,
                    attempts: to_u64(attempts, "attempts")?,
                    last_error,
                    id,
                });
            }
            Ok(records)
        })
        .await
    }

    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
        let id = id.to_owned();
        let message = error.message().to_owned();
        self.run("orphan failed", move |inner, _env| {
            let last_error = inner.redact(&message);
            inner.conn.execute(
                "UPDATE runtime_orphan SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1",
                params![id, last_error],
            )?;
            Ok(())
        })
        .await
    }

    async fn resolve(&self, id: &str) -> Result<(), PortError> {
        let id = id.to_owned();
        self.run("orphan resolve", move |inner, _env| {
            inner
                .conn
                .execute("DELETE FROM runtime_orphan WHERE id = ?1", [id])?;
            Ok(())
        })
        .await
    }
}
