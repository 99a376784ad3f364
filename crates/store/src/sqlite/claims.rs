//! Which generation of each work item holds its fence right now, and which runtimes the lease
//! journal names: the reads `omabox reap` needs to tell a dead generation's leftovers
//! (binding directories) from a live run's, and a crashed start's sandbox from a leased one.
//!
//! "Held" is the lease journal's definition (`abandoned()`): the work item's latest
//! generation with an active owner whose fence has not expired. A generation that does not
//! hold its fence can never publish again, so nothing of it is worth keeping. Read-only; never
//! reads a token hash.

use super::scope_at;
use super::{SqliteStore, lock, to_i64, to_u64};
use crate::StoreError;
use omabox_contract::RuntimeResourceScope;

/// The fence state of one work item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItemClaim {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// Its latest generation.
    pub generation: u64,
    /// Whether that generation holds the fence now (active owner, not expired).
    pub held: bool,
}

impl SqliteStore {
    /// The runtime ids of `provider` that the lease journal still names (leases acquired and
    /// not yet terminated or reaped). Blocks.
    pub fn journaled_runtime_ids(
        &self,
        provider: &str,
    ) -> Result<std::collections::HashSet<String>, StoreError> {
        let inner = lock(&self.inner);
        let mut statement = inner
            .conn
            .prepare("SELECT runtime_id FROM runtime_lease WHERE provider = ?1")?;
        let ids = statement
            .query_map([provider], |row| row.get::<_, String>(0))?
            .collect::<Result<_, _>>()?;
        Ok(ids)
    }

    /// Every work item's latest generation and whether it holds its fence (module doc).
    /// Blocks; call it from `spawn_blocking` or at startup.
    pub fn work_item_claims(&self) -> Result<Vec<WorkItemClaim>, StoreError> {
        let now_ms = to_i64(self.clock.now_ms(), "clock")?;
        let inner = lock(&self.inner);
        let mut statement = inner.conn.prepare(
            "SELECT workspace_id, environment_id, session_id, work_id, generation,
                    active_owner_id IS NOT NULL AND active_expires_at_ms > ?1
               FROM runtime_fence
              ORDER BY workspace_id, environment_id, session_id, work_id",
        )?;
        let rows = statement.query_map([now_ms], |row| {
            Ok((
                scope_at(row, 0)?,
                row.get::<_, i64>(4)?,
                row.get::<_, bool>(5)?,
            ))
        })?;
        let mut claims = Vec::new();
        for row in rows {
            let (scope, generation, held) = row?;
            claims.push(WorkItemClaim {
                scope,
                generation: to_u64(generation, "generation")?,
                held,
            });
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ManualClock;
    use omabox_contract::{
        AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, RuntimeResourceFencePort,
        TerminationReason,
    };

    #[tokio::test]
    async fn held_until_released_or_expired() {
        let clock = ManualClock::new(1_000);
        let store = SqliteStore::open_in_memory()
            .unwrap()
            .with_clock(clock.clone());
        let scope = |s: &str| RuntimeResourceScope::new("w", "e", s, "main");
        let mut tokens = Vec::new();
        for session in ["a", "b"] {
            let acquired = store
                .acquire(AcquireRuntimeFenceInput {
                    scope: scope(session),
                    owner_id: "host".into(),
                    ttl_ms: 1_000,
                })
                .await
                .unwrap();
            let AcquireRuntimeFenceResult::Acquired { fence, .. } = acquired else {
                panic!("{acquired:?}");
            };
            tokens.push(fence);
        }
        let claims = store.work_item_claims().unwrap();
        assert_eq!(claims.len(), 2);
        assert!(
            claims
                .iter()
                .all(|claim| claim.held && claim.generation == 1)
        );

        let fence = tokens.remove(0);
        store
            .release(&fence, TerminationReason::Completed)
            .await
            .unwrap();
        let claims = store.work_item_claims().unwrap();
        assert_eq!(
            claims.iter().map(|c| c.held).collect::<Vec<_>>(),
            vec![false, true],
            "a released fence is not held"
        );
        clock.advance(1_000);
        assert!(
            store.work_item_claims().unwrap().iter().all(|c| !c.held),
            "an expired fence is not held"
        );
    }
}
