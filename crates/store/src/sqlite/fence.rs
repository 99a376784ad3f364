//! The fence port over SQLite: load the work item's row, apply the pure transition, write it
//! back, all inside one `BEGIN IMMEDIATE` transaction.

use super::{Inner, IssuedToken, SqliteStore, to_i64, to_u64};
use crate::StoreError;
use crate::clock::iso_millis;
use crate::fence_state::{AcquireStep, ActiveFence, FenceRecord, TokenProof};
use crate::token::TokenHash;
use async_trait::async_trait;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeResourceFence,
    RuntimeResourceFencePort, RuntimeResourcePublication, RuntimeResourceScope, TerminationReason,
};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

pub(super) type StoredRecord = FenceRecord<TokenHash>;

/// Reads the record of `scope`, if it was ever acquired.
pub(super) fn load(
    conn: &Connection,
    scope: &RuntimeResourceScope,
) -> Result<Option<StoredRecord>, StoreError> {
    let row = conn
        .query_row(
            "SELECT generation, next_revision, active_owner_id, active_token_sha256,
                    active_expires_at_ms, publication_json
               FROM runtime_fence
              WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3 AND work_id = ?4",
            params![
                scope.workspace_id,
                scope.environment_id,
                scope.session_id,
                scope.work_id
            ],
            |row| {
                Ok((
                    row.get::<_, i64>(0)?,
                    row.get::<_, i64>(1)?,
                    row.get::<_, Option<String>>(2)?,
                    row.get::<_, Option<Vec<u8>>>(3)?,
                    row.get::<_, Option<i64>>(4)?,
                    row.get::<_, Option<String>>(5)?,
                ))
            },
        )
        .optional()?;
    let Some((generation, next_revision, owner_id, token_hash, expires_at_ms, publication)) = row
    else {
        return Ok(None);
    };
    let generation = to_u64(generation, "generation")?;
    let active = match (owner_id, token_hash, expires_at_ms) {
        (Some(owner_id), Some(token_hash), Some(expires_at_ms)) => Some(ActiveFence {
            owner_id,
            generation,
            proof: TokenHash(token_hash.try_into().map_err(|_| {
                StoreError::Corrupt("active token hash is not 32 bytes".to_owned())
            })?),
            expires_at_ms: to_u64(expires_at_ms, "expiry")?,
        }),
        (None, None, None) => None,
        _ => {
            return Err(StoreError::Corrupt(
                "active fence columns are partly null".to_owned(),
            ));
        }
    };
    let publication = publication
        .map(|json| serde_json::from_str::<RuntimeResourcePublication>(&json))
        .transpose()
        .map_err(|error| StoreError::Corrupt(format!("publication JSON: {error}")))?;
    Ok(Some(FenceRecord {
        generation,
        active,
        publication,
        next_revision: to_u64(next_revision, "next revision")?,
    }))
}

/// Writes the record of `scope`.
pub(super) fn save(
    conn: &Connection,
    scope: &RuntimeResourceScope,
    record: &StoredRecord,
) -> Result<(), StoreError> {
    let publication = record
        .publication
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|error| StoreError::Corrupt(format!("publication JSON: {error}")))?;
    let active = record.active.as_ref();
    let expires_at_ms = active
        .map(|active| to_i64(active.expires_at_ms, "expiry"))
        .transpose()?;
    conn.execute(
        "INSERT INTO runtime_fence (workspace_id, environment_id, session_id, work_id,
                                    generation, next_revision, active_owner_id,
                                    active_token_sha256, active_expires_at_ms, publication_json)
              VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)
         ON CONFLICT (workspace_id, environment_id, session_id, work_id) DO UPDATE SET
              generation = excluded.generation,
              next_revision = excluded.next_revision,
              active_owner_id = excluded.active_owner_id,
              active_token_sha256 = excluded.active_token_sha256,
              active_expires_at_ms = excluded.active_expires_at_ms,
              publication_json = excluded.publication_json",
        params![
            scope.workspace_id,
            scope.environment_id,
            scope.session_id,
            scope.work_id,
            to_i64(record.generation, "generation")?,
            to_i64(record.next_revision, "next revision")?,
            active.map(|active| active.owner_id.as_str()),
            active.map(|active| active.proof.as_bytes().as_slice()),
            expires_at_ms,
            publication,
        ],
    )?;
    // The history row of the publication, in the same transaction; a revision's publication
    // never changes, so an existing row is the same one.
    if let (Some(published), Some(json)) = (&record.publication, &publication) {
        conn.execute(
            "INSERT OR IGNORE INTO runtime_publication (workspace_id, environment_id, session_id,
                                                        work_id, revision, generation,
                                                        publication_json)
                  VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![
                scope.workspace_id,
                scope.environment_id,
                scope.session_id,
                scope.work_id,
                to_i64(published.revision, "revision")?,
                to_i64(published.generation, "generation")?,
                json,
            ],
        )?;
    }
    Ok(())
}

/// Applies `transition` to the record of `scope` inside one immediate transaction, writing
/// the record back when the transition says it changed.
fn transact<T>(
    conn: &mut Connection,
    scope: &RuntimeResourceScope,
    transition: impl FnOnce(&mut StoredRecord) -> (T, bool),
) -> Result<T, StoreError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut record = load(&tx, scope)?.unwrap_or_default();
    let (outcome, changed) = transition(&mut record);
    if changed {
        save(&tx, scope, &record)?;
    }
    tx.commit()?;
    Ok(outcome)
}

impl Inner {
    fn acquire(
        &mut self,
        input: &AcquireRuntimeFenceInput,
        now: impl FnOnce() -> u64,
        issue: impl FnOnce(u64) -> omabox_contract::SecretString,
    ) -> Result<AcquireRuntimeFenceResult, StoreError> {
        let scope = &input.scope;
        let mut token = None;
        let (step, publication) = transact(&mut self.conn, scope, |record| {
            let step = record.acquire(&input.owner_id, input.ttl_ms, now(), |generation| {
                let issued = issue(generation);
                let hash = TokenHash::of(&issued);
                token = Some(issued);
                hash
            });
            let changed = matches!(step, AcquireStep::Claimed(_));
            ((step, record.publication.clone()), changed)
        })?;
        let key = scope.key();
        Ok(match step {
            AcquireStep::Conflict { expires_at_ms } => AcquireRuntimeFenceResult::Conflict {
                expires_at: Some(iso_millis(expires_at_ms)),
            },
            AcquireStep::Claimed(active) => {
                let Some(token) = token else {
                    return Err(StoreError::Worker("claimed without a token".to_owned()));
                };
                // Remembered only now that the generation is committed.
                self.issued.insert(
                    key,
                    IssuedToken {
                        generation: active.generation,
                        token: token.clone(),
                    },
                );
                AcquireRuntimeFenceResult::Acquired {
                    fence: active.to_fence(scope, token),
                    publication,
                }
            }
            AcquireStep::Reentrant(active) => match self.issued.get(&key).filter(|issued| {
                issued.generation == active.generation && active.proof.proves(&issued.token)
            }) {
                Some(issued) => AcquireRuntimeFenceResult::Acquired {
                    fence: active.to_fence(scope, issued.token.clone()),
                    publication,
                },
                // The same owner id holds the fence, but through another process (or before a
                // restart): this process cannot know the token, and must not invalidate the
                // holder's by issuing a new one. It waits for expiry like any other owner.
                None => AcquireRuntimeFenceResult::Conflict {
                    expires_at: Some(iso_millis(active.expires_at_ms)),
                },
            },
        })
    }

    fn release(&mut self, fence: &RuntimeResourceFence) -> Result<(), StoreError> {
        let released = transact(&mut self.conn, &fence.scope(), |record| {
            let released = record.release(fence);
            (released, released)
        })?;
        if released {
            let key = fence.scope().key();
            if self
                .issued
                .get(&key)
                .is_some_and(|issued| issued.generation == fence.generation)
            {
                self.issued.remove(&key);
            }
        }
        Ok(())
    }
}

#[async_trait]
impl RuntimeResourceFencePort for SqliteStore {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        self.run("acquire", move |inner, env| {
            inner.acquire(
                &input,
                || env.clock.now_ms(),
                |generation| env.tokens.issue(generation),
            )
        })
        .await
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        let fence = fence.clone();
        self.run("is_current", move |inner, env| {
            let record = load(&inner.conn, &fence.scope())?;
            let now_ms = env.clock.now_ms();
            Ok(record.is_some_and(|record| record.is_current(&fence, now_ms)))
        })
        .await
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        let fence = fence.clone();
        self.run("renew", move |inner, env| {
            let scope = fence.scope();
            let renewed = transact(&mut inner.conn, &scope, |record| {
                let renewed = record.renew(&fence, ttl_ms, env.clock.now_ms());
                let changed = renewed.is_some();
                (renewed, changed)
            })?;
            Ok(match renewed {
                Some(active) => RenewRuntimeFenceResult::Renewed {
                    fence: active.to_fence(&scope, fence.token.clone()),
                },
                None => RenewRuntimeFenceResult::Lost,
            })
        })
        .await
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        self.run("publish", move |inner, env| {
            let published = transact(&mut inner.conn, &input.fence.scope(), |record| {
                let published = record.publish(&input, env.clock.now_ms());
                (
                    published,
                    published.is_some_and(|published| published.changed),
                )
            })?;
            Ok(match published {
                Some(published) => PublishRuntimeResourcesResult::Published {
                    revision: published.revision,
                },
                None => PublishRuntimeResourcesResult::Lost,
            })
        })
        .await
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        let fence = fence.clone();
        self.run("release", move |inner, _env| inner.release(&fence))
            .await
    }
}
