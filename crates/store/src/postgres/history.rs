//! The read-side queries of the CLI's `sessions`, `workspace`, `outputs`, `gc` and `reap` over
//! PostgreSQL, with the semantics of SQLite's (`sqlite/sessions.rs`, `sqlite/claims.rs`):
//! which work items published and what, the publication history, which generation holds each
//! fence, which runtimes the lease journal names. Async; never read a token hash. Ordered
//! byte-wise (`COLLATE "C"`), as SQLite orders.

use super::{PostgresStore, scope_at, to_i64, to_u64};
use crate::StoreError;
use crate::sqlite::WorkItemClaim;
use omabox_contract::{RuntimeResourcePublication, RuntimeResourceScope};
use std::collections::HashSet;
use tokio_postgres::types::ToSql;

const SCOPE_ORDER: &str = "workspace_id COLLATE \"C\", environment_id COLLATE \"C\", \
                           session_id COLLATE \"C\", work_id COLLATE \"C\"";
const SCOPE_IS: &str = "workspace_id = $1 AND environment_id = $2 AND session_id = $3 \
                        AND work_id = $4";

fn parse_publication(json: &str) -> Result<RuntimeResourcePublication, StoreError> {
    serde_json::from_str(json)
        .map_err(|error| StoreError::Corrupt(format!("publication JSON: {error}")))
}

type Publications = Vec<(RuntimeResourceScope, RuntimeResourcePublication)>;

impl PostgresStore {
    /// Every work item that has published, with its last (active) publication, ordered by
    /// workspace, environment, session and work id.
    pub async fn list_publications(&self) -> Result<Publications, StoreError> {
        self.scoped_publications(
            &format!(
                "SELECT workspace_id, environment_id, session_id, work_id, publication_json
                   FROM runtime_fence WHERE publication_json IS NOT NULL ORDER BY {SCOPE_ORDER}"
            ),
            &[],
        )
        .await
    }

    /// The last (active) publication of `scope`, or `None` when it never published.
    pub async fn publication(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<Option<RuntimeResourcePublication>, StoreError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                &format!("SELECT publication_json FROM runtime_fence WHERE {SCOPE_IS}"),
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                ],
            )
            .await?;
        let json: Option<String> = match row {
            Some(row) => row.try_get(0)?,
            None => None,
        };
        json.as_deref().map(parse_publication).transpose()
    }

    /// Every published revision of every work item, ordered by scope and then newest
    /// revision first.
    pub async fn publication_history(&self) -> Result<Publications, StoreError> {
        self.scoped_publications(
            &format!(
                "SELECT workspace_id, environment_id, session_id, work_id, publication_json
                   FROM runtime_publication ORDER BY {SCOPE_ORDER}, revision DESC"
            ),
            &[],
        )
        .await
    }

    /// The published revisions of `scope`, newest first.
    pub async fn publications_of(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<Vec<RuntimeResourcePublication>, StoreError> {
        Ok(self
            .scoped_publications(
                &format!(
                    "SELECT workspace_id, environment_id, session_id, work_id, publication_json
                       FROM runtime_publication WHERE {SCOPE_IS} ORDER BY revision DESC"
                ),
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                ],
            )
            .await?
            .into_iter()
            .map(|(_, publication)| publication)
            .collect())
    }

    /// How many work items hold an unexpired fence right now.
    pub async fn active_fence_count(&self) -> Result<u64, StoreError> {
        let now = to_i64(self.clock.now_ms(), "now")?;
        let client = self.client().await?;
        let row = client
            .query_one(
                "SELECT count(*) FROM runtime_fence
                  WHERE active_owner_id IS NOT NULL AND active_expires_at_ms > $1",
                &[&now],
            )
            .await?;
        to_u64(row.try_get(0)?, "count")
    }

    /// Removes the given `(scope, revision)` rows from the publication history, never the
    /// newest revision of a work item. Returns how many rows went. One transaction.
    pub async fn forget_revisions(
        &self,
        revisions: &[(RuntimeResourceScope, u64)],
    ) -> Result<u64, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let mut removed = 0u64;
        for (scope, revision) in revisions {
            removed += tx
                .execute(
                    &format!(
                        "DELETE FROM runtime_publication
                          WHERE {SCOPE_IS} AND revision = $5
                            AND revision < (SELECT coalesce(max(revision), 0)
                                              FROM runtime_publication WHERE {SCOPE_IS})"
                    ),
                    &[
                        &scope.workspace_id,
                        &scope.environment_id,
                        &scope.session_id,
                        &scope.work_id,
                        &to_i64(*revision, "revision")?,
                    ],
                )
                .await?;
        }
        tx.commit().await?;
        Ok(removed)
    }

    /// Every work item's latest generation and whether it holds its fence (active owner,
    /// not expired by the store's clock).
    pub async fn work_item_claims(&self) -> Result<Vec<WorkItemClaim>, StoreError> {
        let now_ms = to_i64(self.clock.now_ms(), "clock")?;
        let client = self.client().await?;
        let rows = client
            .query(
                &format!(
                    "SELECT workspace_id, environment_id, session_id, work_id, generation,
                            active_owner_id IS NOT NULL AND active_expires_at_ms > $1
                       FROM runtime_fence ORDER BY {SCOPE_ORDER}"
                ),
                &[&now_ms],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(WorkItemClaim {
                    scope: scope_at(row, 0)?,
                    generation: to_u64(row.try_get(4)?, "generation")?,
                    held: row.try_get(5)?,
                })
            })
            .collect()
    }

    /// The runtime ids of `provider` that the lease journal still names.
    pub async fn journaled_runtime_ids(
        &self,
        provider: &str,
    ) -> Result<HashSet<String>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT runtime_id FROM runtime_lease WHERE provider = $1",
                &[&provider],
            )
            .await?;
        rows.iter()
            .map(|row| Ok(row.try_get::<_, String>(0)?))
            .collect()
    }

    async fn scoped_publications(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Publications, StoreError> {
        let client = self.client().await?;
        let rows = client.query(sql, params).await?;
        rows.iter()
            .map(|row| {
                Ok((
                    scope_at(row, 0)?,
                    parse_publication(&row.try_get::<_, String>(4)?)?,
                ))
            })
            .collect()
    }
}
