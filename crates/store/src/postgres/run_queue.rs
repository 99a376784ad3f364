//! The run queue over PostgreSQL (omabox extension, schema versions 2 and 3).
//!
//! A claim is one transaction: a transaction-scoped advisory lock on the claiming host (its
//! capacity count cannot race itself), then `SELECT … ORDER BY seq LIMIT 1 FOR UPDATE SKIP
//! LOCKED` over the claimable runs (each session's oldest unended run, queued or with an
//! expired claim): hosts claiming at once lock different rows, and a run another host is
//! claiming is skipped, never waited for. A session's later run is not claimable while an
//! earlier one is unended, and the earlier one's row stays unended in every snapshot until
//! its end commits, so two hosts never run one session at once.
//!
//! "Now" for a claim's expiry is the database's clock ([`ClaimClock::Database`]: read with
//! `clock_timestamp()` inside the transaction, after its locks), so hosts whose clocks
//! disagree still agree on which claims are live. A change that can make a run claimable
//! (enqueue, an end) notifies [`super::RUNS_CHANNEL`] in its transaction
//! ([`super::listen`]).
//!
//! Every call that needs a live claim locks the run's row (`FOR UPDATE`) before checking
//! it, so a re-claim and a publish of the old claim are ordered: `publish_for_run` then
//! takes the work item's advisory lock (as the fence port does), publishes, and records the
//! revision on the run and the run id on the history row before it commits.

use super::fence::{load, save};
use super::{ClaimClock, PostgresStore, RUNS_CHANNEL, scope_lock_key, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use omabox_contract::{
    CancelOutcome, ClaimedRun, EnqueueRunInput, MAX_RUN_EVENTS, MAX_RUN_PAGE, PortError,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RunClaim, RunEnd, RunEvent,
    RunPage, RunQueuePort, RunRecord, RunStatus, cap_event,
};

/// The claimable runs, oldest first (`$1`: now), the first one not being claimed by
/// another transaction locked.
const CLAIM_SQL: &str = "
    SELECT run_id, session_id, spec_json, attempts, revision, cancel_requested FROM run_queue r
     WHERE (status = 'queued' OR (status = 'running' AND claim_expires_at_ms <= $1))
       AND NOT EXISTS (SELECT 1 FROM run_queue e
                        WHERE e.session_id = r.session_id AND e.seq < r.seq
                          AND e.status IN ('queued', 'running'))
     ORDER BY seq LIMIT 1
       FOR UPDATE SKIP LOCKED";

/// The advisory lock class of a host's claims ("omar"; the two-key form, like migrations).
const HOST_LOCK_CLASS: i32 = 0x6f6d_6172;

/// The database's clock in milliseconds since the epoch (`clock_timestamp()`: the time of
/// this statement, not of the transaction's start, so it is read after the locks).
const DATABASE_NOW_SQL: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

impl PostgresStore {
    /// "Now" for claims: the database's clock, or the store's ([`ClaimClock`]).
    async fn now(&self, client: &impl GenericClient) -> Result<i64, StoreError> {
        match self.claim_clock {
            ClaimClock::Database => {
                Ok(client.query_one(DATABASE_NOW_SQL, &[]).await?.try_get(0)?)
            }
            ClaimClock::Store => to_i64(self.clock.now_ms(), "time"),
        }
    }

    /// `Some(now)` when `claim` is live now: locks the run's row for the transaction first,
    /// then reads the clock (so a wait for the lock never makes an expired claim look live).
    async fn live(
        &self,
        client: &impl GenericClient,
        claim: &RunClaim,
    ) -> Result<Option<i64>, StoreError> {
        let Some(row) = client
            .query_opt(
                "SELECT claim_expires_at_ms FROM run_queue
                  WHERE run_id = $1 AND status = 'running' AND host_id = $2 AND attempts = $3
                    FOR UPDATE",
                &[
                    &claim.run_id,
                    &claim.host_id,
                    &to_i64(claim.attempt, "attempt")?,
                ],
            )
            .await?
        else {
            return Ok(None);
        };
        let expires: Option<i64> = row.try_get(0)?;
        let now = self.now(client).await?;
        Ok(expires.filter(|expires| *expires > now).map(|_| now))
    }

    /// Wakes the hosts listening for runs when `tx` commits.
    async fn notify_runs(tx: &impl GenericClient) -> Result<(), StoreError> {
        tx.execute("SELECT pg_notify($1, '')", &[&RUNS_CHANNEL])
            .await?;
        Ok(())
    }

    async fn enqueue_run(&self, input: &EnqueueRunInput) -> Result<(), StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let now = self.now(&tx).await?;
        let inserted = tx
            .execute(
                "INSERT INTO run_queue (run_id, session_id, spec_json, status, enqueued_at_ms)
                      VALUES ($1, $2, $3, 'queued', $4)
                 ON CONFLICT (run_id) DO NOTHING",
                &[&input.run_id, &input.session_id, &input.spec, &now],
            )
            .await?;
        if inserted == 0 {
            return Err(StoreError::DuplicateRun(input.run_id.clone()));
        }
        Self::notify_runs(&tx).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn claim_run(
        &self,
        host_id: &str,
        capacity: u64,
        ttl_ms: u64,
    ) -> Result<Option<ClaimedRun>, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute(
            "SELECT pg_advisory_xact_lock($1, hashtext($2))",
            &[&HOST_LOCK_CLASS, &host_id],
        )
        .await?;
        let now = self.now(&tx).await?;
        let held: i64 = tx
            .query_one(
                "SELECT count(*) FROM run_queue
                  WHERE host_id = $1 AND status = 'running' AND claim_expires_at_ms > $2",
                &[&host_id, &now],
            )
            .await?
            .try_get(0)?;
        if to_u64(held, "claims")? >= capacity {
            return Ok(None);
        }
        let expires = now.saturating_add(to_i64(ttl_ms, "ttl")?);
        loop {
            let Some(row) = tx.query_opt(CLAIM_SQL, &[&now]).await? else {
                tx.commit().await?;
                return Ok(None);
            };
            let run_id: String = row.try_get(0)?;
            let cancelled: bool = row.try_get(5)?;
            if cancelled || row.try_get::<_, Option<i64>>(4)?.is_some() {
                // Cancelled while its dead host ran it, or published before that host died:
                // it is done either way.
                tx.execute(
                    "UPDATE run_queue SET status = $2, host_id = NULL,
                            claim_expires_at_ms = NULL WHERE run_id = $1",
                    &[&run_id, &if cancelled { "cancelled" } else { "completed" }],
                )
                .await?;
                continue;
            }
            let attempt = row.try_get::<_, i64>(3)? + 1;
            tx.execute(
                "UPDATE run_queue SET status = 'running', attempts = $2, host_id = $3,
                        claim_expires_at_ms = $4 WHERE run_id = $1",
                &[&run_id, &attempt, &host_id, &expires],
            )
            .await?;
            tx.commit().await?;
            return Ok(Some(ClaimedRun {
                claim: RunClaim {
                    run_id,
                    host_id: host_id.to_owned(),
                    attempt: to_u64(attempt, "attempt")?,
                },
                session_id: row.try_get(1)?,
                spec: row.try_get(2)?,
            }));
        }
    }

    async fn renew_run(&self, claim: &RunClaim, ttl_ms: u64) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(now) = self.live(&tx, claim).await? else {
            return Ok(false);
        };
        tx.execute(
            "UPDATE run_queue SET claim_expires_at_ms = $2 WHERE run_id = $1",
            &[&claim.run_id, &now.saturating_add(to_i64(ttl_ms, "ttl")?)],
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn finish_run(&self, claim: &RunClaim, end: &RunEnd) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if self.live(&tx, claim).await?.is_none() {
            return Ok(false);
        }
        match end {
            RunEnd::Completed { revision } => {
                let revision = revision.map(|r| to_i64(r, "revision")).transpose()?;
                tx.execute(
                    "UPDATE run_queue SET status = 'completed', host_id = NULL,
                            claim_expires_at_ms = NULL, revision = coalesce($2, revision)
                      WHERE run_id = $1",
                    &[&claim.run_id, &revision],
                )
                .await?
            }
            RunEnd::Failed { error } => {
                tx.execute(
                    "UPDATE run_queue SET status = 'failed', host_id = NULL,
                            claim_expires_at_ms = NULL, error = $2
                      WHERE run_id = $1",
                    &[&claim.run_id, error],
                )
                .await?
            }
            RunEnd::Cancelled => {
                tx.execute(
                    "UPDATE run_queue SET status = 'cancelled', host_id = NULL,
                            claim_expires_at_ms = NULL WHERE run_id = $1",
                    &[&claim.run_id],
                )
                .await?
            }
        };
        Self::notify_runs(&tx).await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn publish_run(
        &self,
        claim: &RunClaim,
        input: &PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if self.live(&tx, claim).await?.is_none() {
            return Ok(PublishRuntimeResourcesResult::Lost);
        }
        let scope = input.fence.scope();
        tx.execute(
            "SELECT pg_advisory_xact_lock($1)",
            &[&scope_lock_key(&scope)],
        )
        .await?;
        let mut fence = load(&tx, &scope).await?.unwrap_or_default();
        let Some(published) = fence.publish(input, self.clock.now_ms()) else {
            return Ok(PublishRuntimeResourcesResult::Lost);
        };
        if published.changed {
            save(&tx, &scope, &fence).await?;
        }
        let revision = to_i64(published.revision, "revision")?;
        tx.execute(
            "UPDATE runtime_publication SET run_id = $6
              WHERE workspace_id = $1 AND environment_id = $2 AND session_id = $3
                AND work_id = $4 AND revision = $5 AND run_id IS NULL",
            &[
                &scope.workspace_id,
                &scope.environment_id,
                &scope.session_id,
                &scope.work_id,
                &revision,
                &claim.run_id,
            ],
        )
        .await?;
        tx.execute(
            "UPDATE run_queue SET revision = $2 WHERE run_id = $1",
            &[&claim.run_id, &revision],
        )
        .await?;
        tx.commit().await?;
        Ok(PublishRuntimeResourcesResult::Published {
            revision: published.revision,
        })
    }

    async fn cancel_run(&self, run_id: &str) -> Result<CancelOutcome, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(row) = tx
            .query_opt(
                "SELECT status FROM run_queue WHERE run_id = $1 FOR UPDATE",
                &[&run_id],
            )
            .await?
        else {
            return Ok(CancelOutcome::NotFound);
        };
        let status: String = row.try_get(0)?;
        let outcome = match parse_status(&status)? {
            RunStatus::Queued => {
                tx.execute(
                    "UPDATE run_queue SET status = 'cancelled' WHERE run_id = $1",
                    &[&run_id],
                )
                .await?;
                // Its session's next run may be claimable now.
                Self::notify_runs(&tx).await?;
                CancelOutcome::Cancelled
            }
            RunStatus::Running => {
                tx.execute(
                    "UPDATE run_queue SET cancel_requested = true WHERE run_id = $1",
                    &[&run_id],
                )
                .await?;
                CancelOutcome::Requested
            }
            ended => return Ok(CancelOutcome::AlreadyEnded(ended)),
        };
        tx.commit().await?;
        Ok(outcome)
    }

    async fn run_cancel_requested(&self, claim: &RunClaim) -> Result<bool, StoreError> {
        let client = self.client().await?;
        Ok(client
            .query_opt(
                "SELECT cancel_requested FROM run_queue WHERE run_id = $1",
                &[&claim.run_id],
            )
            .await?
            .map(|row| row.try_get::<_, bool>(0))
            .transpose()?
            .unwrap_or(false))
    }

    async fn runs_of_session(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, StoreError> {
        let limit = limit.clamp(1, MAX_RUN_PAGE);
        let before = before.map_or(Ok(i64::MAX), |before| to_i64(before, "cursor"))?;
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT run_id, session_id, status, attempts, revision, error, seq
                   FROM run_queue WHERE session_id = $1 AND seq < $2
                  ORDER BY seq DESC LIMIT $3",
                &[&session_id, &before, &(limit as i64)],
            )
            .await?;
        let next = match rows.last() {
            Some(row) if rows.len() == limit => Some(to_u64(row.try_get(6)?, "cursor")?),
            _ => None,
        };
        Ok(RunPage {
            runs: rows.iter().map(to_record).collect::<Result<_, _>>()?,
            next,
        })
    }

    async fn run_status(&self, run_id: &str) -> Result<Option<RunRecord>, StoreError> {
        let client = self.client().await?;
        client
            .query_opt(
                "SELECT run_id, session_id, status, attempts, revision, error
                   FROM run_queue WHERE run_id = $1",
                &[&run_id],
            )
            .await?
            .as_ref()
            .map(to_record)
            .transpose()
    }

    async fn append_run_event(&self, claim: &RunClaim, text: &str) -> Result<bool, StoreError> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        if self.live(&tx, claim).await?.is_none() {
            return Ok(false);
        }
        let count: i64 = tx
            .query_one(
                "SELECT count(*) FROM run_event WHERE run_id = $1",
                &[&claim.run_id],
            )
            .await?
            .try_get(0)?;
        if to_u64(count, "events")? < MAX_RUN_EVENTS {
            tx.execute(
                "INSERT INTO run_event (run_id, seq, text) VALUES ($1, $2, $3)",
                &[&claim.run_id, &(count + 1), &cap_event(text)],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn run_events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT seq, text FROM run_event WHERE run_id = $1 AND seq > $2
                  ORDER BY seq LIMIT $3",
                &[
                    &run_id,
                    &to_i64(after, "event")?,
                    &i64::try_from(limit).unwrap_or(i64::MAX),
                ],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(RunEvent {
                    seq: to_u64(row.try_get(0)?, "event")?,
                    text: row.try_get(1)?,
                })
            })
            .collect()
    }

    async fn session_published_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(u64, Option<String>)>, StoreError> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT revision, run_id FROM runtime_publication WHERE session_id = $1
                  ORDER BY revision",
                &[&session_id],
            )
            .await?;
        rows.iter()
            .map(|row| Ok((to_u64(row.try_get(0)?, "revision")?, row.try_get(1)?)))
            .collect()
    }
}

fn parse_status(status: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(status).ok_or_else(|| StoreError::Corrupt(format!("run status {status:?}")))
}

/// A row of `run_id, session_id, status, attempts, revision, error` as a [`RunRecord`].
fn to_record(row: &tokio_postgres::Row) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        run_id: row.try_get(0)?,
        session_id: row.try_get(1)?,
        status: parse_status(row.try_get(2)?)?,
        attempts: to_u64(row.try_get(3)?, "attempts")?,
        revision: row
            .try_get::<_, Option<i64>>(4)?
            .map(|r| to_u64(r, "revision"))
            .transpose()?,
        error: row.try_get(5)?,
    })
}

#[async_trait]
impl RunQueuePort for PostgresStore {
    async fn enqueue(&self, input: EnqueueRunInput) -> Result<(), PortError> {
        self.enqueue_run(&input)
            .await
            .map_err(|error| self.port_error("enqueue run", error))
    }

    async fn claim(
        &self,
        host_id: &str,
        capacity: u64,
        ttl_ms: u64,
    ) -> Result<Option<ClaimedRun>, PortError> {
        self.claim_run(host_id, capacity, ttl_ms)
            .await
            .map_err(|error| self.port_error("claim run", error))
    }

    async fn renew(&self, claim: &RunClaim, ttl_ms: u64) -> Result<bool, PortError> {
        self.renew_run(claim, ttl_ms)
            .await
            .map_err(|error| self.port_error("renew run claim", error))
    }

    async fn finish(&self, claim: &RunClaim, end: RunEnd) -> Result<bool, PortError> {
        self.finish_run(claim, &end)
            .await
            .map_err(|error| self.port_error("finish run", error))
    }

    async fn publish_for_run(
        &self,
        claim: &RunClaim,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        self.publish_run(claim, &input)
            .await
            .map_err(|error| self.port_error("publish run", error))
    }

    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        self.run_status(run_id)
            .await
            .map_err(|error| self.port_error("run status", error))
    }

    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, PortError> {
        self.cancel_run(run_id)
            .await
            .map_err(|error| self.port_error("cancel run", error))
    }

    async fn cancel_requested(&self, claim: &RunClaim) -> Result<bool, PortError> {
        self.run_cancel_requested(claim)
            .await
            .map_err(|error| self.port_error("run cancel request", error))
    }

    async fn session_runs(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        self.runs_of_session(session_id, before, limit)
            .await
            .map_err(|error| self.port_error("session runs", error))
    }

    async fn append_event(&self, claim: &RunClaim, text: &str) -> Result<bool, PortError> {
        self.append_run_event(claim, text)
            .await
            .map_err(|error| self.port_error("append run event", error))
    }

    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, PortError> {
        self.run_events(run_id, after, limit)
            .await
            .map_err(|error| self.port_error("run events", error))
    }

    async fn published_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(u64, Option<String>)>, PortError> {
        self.session_published_runs(session_id)
            .await
            .map_err(|error| self.port_error("published runs", error))
    }
}
