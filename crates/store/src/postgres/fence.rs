//! The fence port over PostgreSQL: lock the work item (transaction-scoped advisory lock),
//! load its row, apply the pure transition with the time read after the lock, write it back,
//! all in one transaction. The publication history row is written in the same transaction.

use super::{IssuedToken, PostgresStore, lock, scope_lock_key, to_i64, to_u64};
use crate::StoreError;
use crate::clock::iso_millis;
use crate::fence_state::{AcquireStep, ActiveFence, FenceRecord};
use crate::token::TokenHash;
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeResourceFence,
    RuntimeResourceFencePort, RuntimeResourcePublication, RuntimeResourceScope, TerminationReason,
};

pub(super) type StoredRecord = FenceRecord<TokenHash>;

/// Reads the record of `scope`, if it was ever acquired.
pub(super) async fn load(
    client: &impl GenericClient,
    scope: &RuntimeResourceScope,
) -> Result<Option<StoredRecord>, StoreError> {
    let row = client
        .query_opt(
            "SELECT generation, next_revision, active_owner_id, active_token_sha256,
                    active_expires_at_ms, publication_json
               FROM runtime_fence
              WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                AND work_id = $4",
            &[
                &scope.workspace_id,
                &scope.environment_id,
                &scope.session_id,
                &scope.work_id,
            ],
        )
        .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let generation = to_u64(row.try_get(0)?, "generation")?;
    let owner_id: Option<String> = row.try_get(2)?;
    let token_hash: Option<Vec<u8>> = row.try_get(3)?;
    let expires_at_ms: Option<i64> = row.try_get(4)?;
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
    let publication = row
        .try_get::<_, Option<String>>(5)?
        .map(|json| serde_json::from_str::<RuntimeResourcePublication>(&json))
        .transpose()
        .map_err(|error| StoreError::Corrupt(format!("publication JSON: {error}")))?;
    Ok(Some(FenceRecord {
        generation,
        active,
        publication,
        next_revision: to_u64(row.try_get(1)?, "next revision")?,
    }))
}

/// Writes the record of `scope`, and its publication's history row.
pub(super) async fn save(
    client: &impl GenericClient,
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
    let owner_id = active.map(|active| active.owner_id.as_str());
    let token_hash = active.map(|active| active.proof.as_bytes().as_slice());
    client
        .execute(
            "INSERT INTO runtime_fence (workspace_id, environment_id, session_id, work_id,
                                        generation, next_revision, active_owner_id,
                                        active_token_sha256, active_expires_at_ms,
                                        publication_json)
                  VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
             ON CONFLICT (workspace_id, environment_id, session_id, work_id) DO UPDATE SET
                  generation = excluded.generation,
                  next_revision = excluded.next_revision,
                  active_owner_id = excluded.active_owner_id,
                  active_token_sha256 = excluded.active_token_sha256,
                  active_expires_at_ms = excluded.active_expires_at_ms,
                  publication_json = excluded.publication_json",
            &[
                &scope.workspace_id,
                &scope.environment_id,
                &scope.session_id,
                &scope.work_id,
                &to_i64(record.generation, "generation")?,
                &to_i64(record.next_revision, "next revision")?,
                &owner_id,
                &token_hash,
                &expires_at_ms,
                &publication,
            ],
        )
        .await?;
    // A revision's publication never changes, so an existing history row is the same one.
    if let (Some(published), Some(json)) = (&record.publication, &publication) {
        client
            .execute(
                "INSERT INTO runtime_publication (workspace_id, environment_id, session_id,
                                                  work_id, revision, generation,
                                                  publication_json)
                      VALUES ($1, $2, $3, $4, $5, $6, $7)
                 ON CONFLICT DO NOTHING",
                &[
                    &scope.workspace_id,
                    &scope.environment_id,
                    &scope.session_id,
                    &scope.work_id,
                    &to_i64(published.revision, "revision")?,
                    &to_i64(published.generation, "generation")?,
                    json,
                ],
            )
            .await?;
    }
    Ok(())
}

impl PostgresStore {
    /// Applies `transition` to the record of `scope` inside one transaction holding the work
    /// item's advisory lock, writing the record back when the transition says it changed.
    /// `transition` is called after the lock is held, so the time it reads is ordered with
    /// every other writer of the work item.
    async fn transact<T>(
        &self,
        scope: &RuntimeResourceScope,
        transition: impl FnOnce(&mut StoredRecord) -> (T, bool),
    ) -> Result<T, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&scope_lock_key(scope)],
        )
        .await?;
        let mut record = load(&tx, scope).await?.unwrap_or_default();
        let (outcome, changed) = transition(&mut record);
        if changed {
            save(&tx, scope, &record).await?;
        }
        tx.commit().await?;
        Ok(outcome)
    }

    async fn acquire_fence(
        &self,
        input: &AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, StoreError> {
        let scope = &input.scope;
        let mut token = None;
        let (step, publication) = self
            .transact(scope, |record| {
                let step = record.acquire(
                    &input.owner_id,
                    input.ttl_ms,
                    self.clock.now_ms(),
                    |generation| {
                        let issued = self.tokens.issue(generation);
                        let hash = TokenHash::of(&issued);
                        token = Some(issued);
                        hash
                    },
                );
                let changed = matches!(step, AcquireStep::Claimed(_));
                ((step, record.publication.clone()), changed)
            })
            .await?;
        let key = scope.key();
        Ok(match step {
            AcquireStep::Conflict { expires_at_ms } => AcquireRuntimeFenceResult::Conflict {
                expires_at: Some(iso_millis(expires_at_ms)),
            },
            AcquireStep::Claimed(active) => {
                let Some(token) = token else {
                    return Err(StoreError::Worker("claimed without a token".to_owned()));
                };
                // Remembered only now that the generation is committed, and never over a
                // newer generation another task of this process committed meanwhile.
                let mut issued = lock(&self.issued);
                if issued
                    .get(&key)
                    .is_none_or(|known| known.generation < active.generation)
                {
                    issued.insert(
                        key,
                        IssuedToken {
                            generation: active.generation,
                            token: token.clone(),
                        },
                    );
                }
                AcquireRuntimeFenceResult::Acquired {
                    fence: active.to_fence(scope, token),
                    publication,
                }
            }
            AcquireStep::Reentrant(active) => {
                let known = lock(&self.issued).get(&key).cloned().filter(|issued| {
                    issued.generation == active.generation && active.proof.proves(&issued.token)
                });
                match known {
                    Some(issued) => AcquireRuntimeFenceResult::Acquired {
                        fence: active.to_fence(scope, issued.token),
                        publication,
                    },
                    // Held by the same owner id through another process or host: this one
                    // cannot know the token and must not replace it. It waits for expiry.
                    None => AcquireRuntimeFenceResult::Conflict {
                        expires_at: Some(iso_millis(active.expires_at_ms)),
                    },
                }
            }
        })
    }

    async fn release_fence(&self, fence: &RuntimeResourceFence) -> Result<(), StoreError> {
        let released = self
            .transact(&fence.scope(), |record| {
                let released = record.release(fence);
                (released, released)
            })
            .await?;
        if released {
            let key = fence.scope().key();
            let mut issued = lock(&self.issued);
            if issued
                .get(&key)
                .is_some_and(|issued| issued.generation == fence.generation)
            {
                issued.remove(&key);
            }
        }
        Ok(())
    }
}

use crate::fence_state::TokenProof as _;

#[async_trait]
impl RuntimeResourceFencePort for PostgresStore {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        self.acquire_fence(&input)
            .await
            .map_err(|error| self.port_error("acquire", error))
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        let current = async {
            let client = self.client().await?;
            let record = load(&client, &fence.scope()).await?;
            let now_ms = self.clock.now_ms();
            Ok::<_, StoreError>(record.is_some_and(|record| record.is_current(fence, now_ms)))
        };
        current
            .await
            .map_err(|error| self.port_error("is_current", error))
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        let scope = fence.scope();
        let renewed = self
            .transact(&scope, |record| {
                let renewed = record.renew(fence, ttl_ms, self.clock.now_ms());
                let changed = renewed.is_some();
                (renewed, changed)
            })
            .await
            .map_err(|error| self.port_error("renew", error))?;
        Ok(match renewed {
            Some(active) => RenewRuntimeFenceResult::Renewed {
                fence: active.to_fence(&scope, fence.token.clone()),
            },
            None => RenewRuntimeFenceResult::Lost,
        })
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        let published = self
            .transact(&input.fence.scope(), |record| {
                let published = record.publish(&input, self.clock.now_ms());
                (
                    published,
                    published.is_some_and(|published| published.changed),
                )
            })
            .await
            .map_err(|error| self.port_error("publish", error))?;
        Ok(match published {
            Some(published) => PublishRuntimeResourcesResult::Published {
                revision: published.revision,
            },
            None => PublishRuntimeResourcesResult::Lost,
        })
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.release_fence(fence)
            .await
            .map_err(|error| self.port_error("release", error))
    }
}
