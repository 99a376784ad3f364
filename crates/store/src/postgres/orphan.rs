//! The orphan queue over PostgreSQL: one row per `runtimeOrphanId`, listed in byte order of
//! the id (`COLLATE "C"`, like SQLite and the in-memory twin).

use super::{PostgresStore, scope_at, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{
    EnqueueRuntimeOrphanInput, ManagedSandboxLease, PortError, RuntimeOrphanPort,
    RuntimeOrphanRecord, TerminationReason, runtime_orphan_id,
};

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

impl PostgresStore {
    async fn enqueue_orphan(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), StoreError> {
        let id = runtime_orphan_id(&input.scope, input.generation, &input.sandbox);
        let sandbox = serde_json::to_string(&input.sandbox)
            .map_err(|error| StoreError::Corrupt(format!("lease JSON: {error}")))?;
        // The host redacts the fence token before enqueueing; redact once more with every
        // token this process holds, so a missed redaction still never reaches the database.
        let last_error = self.redact(input.error.message());
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO runtime_orphan (id, workspace_id, environment_id, session_id,
                                             work_id, generation, owner_id, sandbox_json,
                                             reason, attempts, last_error)
                      VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, 0, $10)
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
                &[
                    &id,
                    &input.scope.workspace_id,
                    &input.scope.environment_id,
                    &input.scope.session_id,
                    &input.scope.work_id,
                    &to_i64(input.generation, "generation")?,
                    &input.owner_id,
                    &sandbox,
                    &input.reason.as_str(),
                    &last_error,
                ],
            )
            .await?;
        Ok(())
    }

    async fn list_orphans(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT id, workspace_id, environment_id, session_id, work_id, generation,
                        owner_id, sandbox_json, reason, attempts, last_error
                   FROM runtime_orphan
                  ORDER BY id COLLATE \"C\"
                  LIMIT $1",
                &[&i64::try_from(limit).unwrap_or(i64::MAX)],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let id: String = row.try_get(0)?;
                let sandbox: ManagedSandboxLease =
                    serde_json::from_str(&row.try_get::<_, String>(7)?).map_err(|error| {
                        StoreError::Corrupt(format!("lease JSON of {id}: {error}"))
                    })?;
                Ok(RuntimeOrphanRecord {
                    scope: scope_at(row, 1)?,
                    generation: to_u64(row.try_get(5)?, "generation")?,
                    owner_id: row.try_get(6)?,
                    sandbox,
                    reason: reason_from(&row.try_get::<_, String>(8)?)?,
                    attempts: to_u64(row.try_get(9)?, "attempts")?,
                    last_error: row.try_get(10)?,
                    id,
                })
            })
            .collect()
    }

    pub(super) async fn execute(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, StoreError> {
        let client = self.client().await?;
        Ok(client.execute(sql, params).await?)
    }
}

#[async_trait]
impl RuntimeOrphanPort for PostgresStore {
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
        self.enqueue_orphan(input)
            .await
            .map_err(|error| self.port_error("orphan enqueue", error))
    }

    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError> {
        self.list_orphans(limit)
            .await
            .map_err(|error| self.port_error("orphan list", error))
    }

    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
        let last_error = self.redact(error.message());
        self.execute(
            "UPDATE runtime_orphan SET attempts = attempts + 1, last_error = $2 WHERE id = $1",
            &[&id, &last_error],
        )
        .await
        .map(drop)
        .map_err(|error| self.port_error("orphan failed", error))
    }

    async fn resolve(&self, id: &str) -> Result<(), PortError> {
        self.execute("DELETE FROM runtime_orphan WHERE id = $1", &[&id])
            .await
            .map(drop)
            .map_err(|error| self.port_error("orphan resolve", error))
    }
}
