//! Read-only queries over the fence table for the CLI's `sessions`, `workspace export` and
//! `outputs` commands: which work items have published, and what.
//!
//! These are not part of the fence port (the contract has no "list"); they never write, never
//! touch a token (the table has none, only its hash, which is not read here) and take no lock
//! beyond SQLite's own read snapshot. They block: call them from `spawn_blocking` or at
//! startup, like [`SqliteStore::open`].

use super::scope_at;
use super::{SqliteStore, lock};
use crate::StoreError;
use omabox_contract::{RuntimeResourcePublication, RuntimeResourceScope};
use rusqlite::{OptionalExtension, params};

fn parse_publication(json: &str) -> Result<RuntimeResourcePublication, StoreError> {
    serde_json::from_str(json)
        .map_err(|error| StoreError::Corrupt(format!("publication JSON: {error}")))
}

impl SqliteStore {
    /// Every work item that has published, with its last (active) publication, ordered by
    /// workspace, environment, session and work id.
    pub fn list_publications(
        &self,
    ) -> Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>, StoreError> {
        let inner = lock(&self.inner);
        let mut statement = inner.conn.prepare(
            "SELECT workspace_id, environment_id, session_id, work_id, publication_json
               FROM runtime_fence
              WHERE publication_json IS NOT NULL
              ORDER BY workspace_id, environment_id, session_id, work_id",
        )?;
        let rows =
            statement.query_map([], |row| Ok((scope_at(row, 0)?, row.get::<_, String>(4)?)))?;
        let mut publications = Vec::new();
        for row in rows {
            let (scope, json) = row?;
            publications.push((scope, parse_publication(&json)?));
        }
        Ok(publications)
    }

    /// The last (active) publication of `scope`, or `None` when it never published.
    pub fn publication(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<Option<RuntimeResourcePublication>, StoreError> {
        let inner = lock(&self.inner);
        let json: Option<Option<String>> = inner
            .conn
            .query_row(
                "SELECT publication_json FROM runtime_fence
                  WHERE workspace_id = ?1 AND environment_id = ?2
                    AND session_id = ?3 AND work_id = ?4",
                params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id
                ],
                |row| row.get(0),
            )
            .optional()?;
        json.flatten().as_deref().map(parse_publication).transpose()
    }
}

impl SqliteStore {
    /// Every published revision of every work item (the publication history, migration 4),
    /// ordered by scope and then newest revision first.
    pub fn publication_history(
        &self,
    ) -> Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>, StoreError> {
        self.history_where("1 = 1", &[])
    }

    /// The published revisions of `scope`, newest first.
    pub fn publications_of(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<Vec<RuntimeResourcePublication>, StoreError> {
        Ok(self
            .history_where(
                "workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3 AND work_id = ?4",
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                ],
            )?
            .into_iter()
            .map(|(_, publication)| publication)
            .collect())
    }

    /// How many work items hold an unexpired fence right now (runs in progress, or killed
    /// runs whose fence has not expired yet).
    pub fn active_fence_count(&self) -> Result<u64, StoreError> {
        let now = super::to_i64(self.clock.now_ms(), "now")?;
        let inner = lock(&self.inner);
        let count: i64 = inner.conn.query_row(
            "SELECT count(*) FROM runtime_fence
              WHERE active_owner_id IS NOT NULL AND active_expires_at_ms > ?1",
            [now],
            |row| row.get(0),
        )?;
        super::to_u64(count, "count")
    }

    /// Removes the given `(scope, revision)` rows from the publication history (what
    /// `omabox gc` no longer retains), never the active publication of a work item. Returns
    /// how many rows went. One transaction.
    pub fn forget_revisions(
        &self,
        revisions: &[(RuntimeResourceScope, u64)],
    ) -> Result<u64, StoreError> {
        let mut inner = lock(&self.inner);
        let tx = inner
            .conn
            .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        let mut removed = 0u64;
        for (scope, revision) in revisions {
            removed += tx.execute(
                "DELETE FROM runtime_publication
                  WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                    AND work_id = ?4 AND revision = ?5
                    AND revision < (SELECT coalesce(max(revision), 0) FROM runtime_publication
                                     WHERE workspace_id = ?1 AND environment_id = ?2
                                       AND session_id = ?3 AND work_id = ?4)",
                rusqlite::params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id,
                    super::to_i64(*revision, "revision")?
                ],
            )? as u64;
        }
        tx.commit()?;
        Ok(removed)
    }

    fn history_where(
        &self,
        condition: &str,
        values: &[&dyn rusqlite::ToSql],
    ) -> Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>, StoreError> {
        let inner = lock(&self.inner);
        let mut statement = inner.conn.prepare(&format!(
            "SELECT workspace_id, environment_id, session_id, work_id, publication_json
               FROM runtime_publication
              WHERE {condition}
              ORDER BY workspace_id, environment_id, session_id, work_id, revision DESC"
        ))?;
        let rows = statement.query_map(values, |row| {
            Ok((scope_at(row, 0)?, row.get::<_, String>(4)?))
        })?;
        let mut history = Vec::new();
        for row in rows {
            let (scope, json) = row?;
            history.push((scope, parse_publication(&json)?));
        }
        Ok(history)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{
        AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, Nullable,
        PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RuntimePublicationCandidate,
        RuntimeResourceFencePort,
    };

    #[tokio::test]
    async fn lists_published_work_items_only() {
        let store = SqliteStore::open_in_memory().unwrap();
        let scope = |session: &str| RuntimeResourceScope::new("w", "e", session, "main");
        let claim = |session: &str| AcquireRuntimeFenceInput {
            scope: scope(session),
            owner_id: "owner".into(),
            ttl_ms: 60_000,
        };
        // "b" publishes; "a" only acquires.
        store.acquire(claim("a")).await.unwrap();
        let AcquireRuntimeFenceResult::Acquired { fence, .. } =
            store.acquire(claim("b")).await.unwrap()
        else {
            panic!("acquired");
        };
        let published = store
            .publish(PublishRuntimeResourcesInput {
                fence,
                workspace_candidate: RuntimePublicationCandidate {
                    id: "wcp_1".into(),
                    content_hash: "sha256:1".into(),
                    metadata: None,
                },
                output_candidate: None,
                runtime_checkpoint: Nullable::Absent,
            })
            .await
            .unwrap();
        assert_eq!(
            published,
            PublishRuntimeResourcesResult::Published { revision: 1 }
        );

        let listed = store.list_publications().unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].0, scope("b"));
        assert_eq!(listed[0].1.revision, 1);
        assert_eq!(listed[0].1.workspace_candidate.id, "wcp_1");
        assert_eq!(
            store.publication(&scope("b")).unwrap().map(|p| p.revision),
            Some(1)
        );
        assert_eq!(store.publication(&scope("a")).unwrap(), None);
        assert_eq!(store.publication(&scope("never")).unwrap(), None);
    }

    #[tokio::test]
    async fn every_publication_is_kept_in_the_history_and_a_lost_one_is_not() {
        let store = SqliteStore::open_in_memory().unwrap();
        let scope = RuntimeResourceScope::new("w", "e", "s", "main");
        let claim = || AcquireRuntimeFenceInput {
            scope: scope.clone(),
            owner_id: "owner".into(),
            ttl_ms: 60_000,
        };
        let publish = |fence, id: &str| PublishRuntimeResourcesInput {
            fence,
            workspace_candidate: RuntimePublicationCandidate {
                id: id.into(),
                content_hash: format!("sha256:{id}"),
                metadata: None,
            },
            output_candidate: None,
            runtime_checkpoint: Nullable::Absent,
        };
        let mut stale = None;
        for round in 1..=3 {
            let AcquireRuntimeFenceResult::Acquired { fence, .. } =
                store.acquire(claim()).await.unwrap()
            else {
                panic!("acquired");
            };
            store
                .publish(publish(fence.clone(), &format!("wcp_{round}")))
                .await
                .unwrap();
            store
                .release(&fence, omabox_contract::TerminationReason::Completed)
                .await
                .unwrap();
            stale = Some(fence);
        }
        // A publish by a generation that no longer holds the fence is lost: no history row.
        let AcquireRuntimeFenceResult::Acquired { .. } = store.acquire(claim()).await.unwrap()
        else {
            panic!("acquired");
        };
        assert_eq!(
            store
                .publish(publish(stale.unwrap(), "wcp_lost"))
                .await
                .unwrap(),
            PublishRuntimeResourcesResult::Lost
        );

        let history = store.publications_of(&scope).unwrap();
        let summary: Vec<(u64, u64, &str)> = history
            .iter()
            .map(|p| (p.revision, p.generation, p.workspace_candidate.id.as_str()))
            .collect();
        assert_eq!(summary, [(3, 3, "wcp_3"), (2, 2, "wcp_2"), (1, 1, "wcp_1")]);
        assert_eq!(store.publication_history().unwrap().len(), 3);
        assert_eq!(store.publication(&scope).unwrap().unwrap(), history[0]);

        // The fence acquired last is still held.
        assert_eq!(store.active_fence_count().unwrap(), 1);

        // Forgetting never removes the active (newest) revision.
        assert_eq!(
            store
                .forget_revisions(&[(scope.clone(), 1), (scope.clone(), 3)])
                .unwrap(),
            1
        );
        let left: Vec<u64> = store
            .publications_of(&scope)
            .unwrap()
            .iter()
            .map(|p| p.revision)
            .collect();
        assert_eq!(left, [3, 2]);
    }
}
