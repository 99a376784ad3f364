//! The run queue over SQLite (omabox extension, schema versions 7 and 8): every call is one
//! `BEGIN IMMEDIATE` transaction with the time read inside it, so SQLite's single writer
//! lock orders the claims of every process sharing the file. `publish_for_run` publishes
//! through the fence table in the same transaction that checks the run's claim and records
//! the revision (module doc of `omabox_contract::run_queue`).

use super::fence::{load, save};
use super::{SqliteStore, to_i64, to_u64};
use crate::StoreError;
use async_trait::async_trait;
use omabox_contract::{
    CancelOutcome, ClaimedRun, EnqueueRunInput, MAX_RUN_EVENTS, MAX_RUN_PAGE, PortError,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RunClaim, RunEnd, RunEvent,
    RunPage, RunQueuePort, RunRecord, RunStatus, cap_event,
};
use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};

/// The claimable runs, oldest first: each session's oldest unended run, when queued or its
/// claim expired (`?1`: now).
pub(crate) const CLAIMABLE_SQL: &str = "
    SELECT seq, run_id, session_id, spec_json, attempts, revision, cancel_requested
      FROM run_queue r
     WHERE (status = 'queued' OR (status = 'running' AND claim_expires_at_ms <= ?1))
       AND NOT EXISTS (SELECT 1 FROM run_queue e
                        WHERE e.session_id = r.session_id AND e.seq < r.seq
                          AND e.status IN ('queued', 'running'))
     ORDER BY seq LIMIT 1";

/// True when `claim` is live at `now_ms`.
fn live(conn: &Connection, claim: &RunClaim, now_ms: i64) -> Result<bool, StoreError> {
    Ok(conn
        .query_row(
            "SELECT 1 FROM run_queue
              WHERE run_id = ?1 AND status = 'running' AND host_id = ?2 AND attempts = ?3
                AND claim_expires_at_ms > ?4",
            params![
                claim.run_id,
                claim.host_id,
                to_i64(claim.attempt, "attempt")?,
                now_ms
            ],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// A `run_queue` row: run id, session, status, attempts, revision, error.
type RunRow = (String, String, String, i64, Option<i64>, Option<String>);

fn record(row: &rusqlite::Row<'_>) -> rusqlite::Result<RunRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
    ))
}

#[async_trait]
impl RunQueuePort for SqliteStore {
    async fn enqueue(&self, input: EnqueueRunInput) -> Result<(), PortError> {
        self.run("enqueue run", move |inner, env| {
            let now = to_i64(env.clock.now_ms(), "time")?;
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let exists = tx
                .query_row(
                    "SELECT 1 FROM run_queue WHERE run_id = ?1",
                    [&input.run_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
            if exists {
                return Err(StoreError::DuplicateRun(input.run_id));
            }
            tx.execute(
                "INSERT INTO run_queue (run_id, session_id, spec_json, status, enqueued_at_ms)
                      VALUES (?1, ?2, ?3, 'queued', ?4)",
                params![input.run_id, input.session_id, input.spec, now],
            )?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn claim(
        &self,
        host_id: &str,
        capacity: u64,
        ttl_ms: u64,
    ) -> Result<Option<ClaimedRun>, PortError> {
        let host_id = host_id.to_owned();
        self.run("claim run", move |inner, env| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = to_i64(env.clock.now_ms(), "time")?;
            let held: i64 = tx.query_row(
                "SELECT count(*) FROM run_queue
                  WHERE host_id = ?1 AND status = 'running' AND claim_expires_at_ms > ?2",
                params![host_id, now],
                |row| row.get(0),
            )?;
            if to_u64(held, "claims")? >= capacity {
                return Ok(None);
            }
            let expires = now.saturating_add(to_i64(ttl_ms, "ttl")?);
            loop {
                let Some((run_id, session_id, spec, attempts, revision, cancelled)) = tx
                    .query_row(CLAIMABLE_SQL, [now], |row| {
                        Ok((
                            row.get::<_, String>(1)?,
                            row.get::<_, String>(2)?,
                            row.get::<_, String>(3)?,
                            row.get::<_, i64>(4)?,
                            row.get::<_, Option<i64>>(5)?,
                            row.get::<_, i64>(6)? != 0,
                        ))
                    })
                    .optional()?
                else {
                    tx.commit()?;
                    return Ok(None);
                };
                if cancelled || revision.is_some() {
                    // Cancelled while its dead host ran it, or published before that host
                    // died: it is done either way.
                    tx.execute(
                        "UPDATE run_queue SET status = ?2, host_id = NULL,
                                claim_expires_at_ms = NULL WHERE run_id = ?1",
                        params![run_id, if cancelled { "cancelled" } else { "completed" }],
                    )?;
                    continue;
                }
                let attempt = attempts + 1;
                tx.execute(
                    "UPDATE run_queue SET status = 'running', attempts = ?2, host_id = ?3,
                            claim_expires_at_ms = ?4 WHERE run_id = ?1",
                    params![run_id, attempt, host_id, expires],
                )?;
                tx.commit()?;
                return Ok(Some(ClaimedRun {
                    claim: RunClaim {
                        run_id,
                        host_id: host_id.clone(),
                        attempt: to_u64(attempt, "attempt")?,
                    },
                    session_id,
                    spec,
                }));
            }
        })
        .await
    }

    async fn renew(&self, claim: &RunClaim, ttl_ms: u64) -> Result<bool, PortError> {
        let claim = claim.clone();
        self.run("renew run claim", move |inner, env| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = to_i64(env.clock.now_ms(), "time")?;
            if !live(&tx, &claim, now)? {
                return Ok(false);
            }
            tx.execute(
                "UPDATE run_queue SET claim_expires_at_ms = ?2 WHERE run_id = ?1",
                params![claim.run_id, now.saturating_add(to_i64(ttl_ms, "ttl")?)],
            )?;
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    async fn finish(&self, claim: &RunClaim, end: RunEnd) -> Result<bool, PortError> {
        let claim = claim.clone();
        self.run("finish run", move |inner, env| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = to_i64(env.clock.now_ms(), "time")?;
            if !live(&tx, &claim, now)? {
                return Ok(false);
            }
            match end {
                RunEnd::Completed { revision } => tx.execute(
                    "UPDATE run_queue SET status = 'completed', host_id = NULL,
                            claim_expires_at_ms = NULL, revision = coalesce(?2, revision)
                      WHERE run_id = ?1",
                    params![
                        claim.run_id,
                        revision.map(|r| to_i64(r, "revision")).transpose()?
                    ],
                )?,
                RunEnd::Failed { error } => tx.execute(
                    "UPDATE run_queue SET status = 'failed', host_id = NULL,
                            claim_expires_at_ms = NULL, error = ?2
                      WHERE run_id = ?1",
                    params![claim.run_id, error],
                )?,
                RunEnd::Cancelled => tx.execute(
                    "UPDATE run_queue SET status = 'cancelled', host_id = NULL,
                            claim_expires_at_ms = NULL WHERE run_id = ?1",
                    [&claim.run_id],
                )?,
            };
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    async fn publish_for_run(
        &self,
        claim: &RunClaim,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        let claim = claim.clone();
        self.run("publish run", move |inner, env| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now_ms = env.clock.now_ms();
            if !live(&tx, &claim, to_i64(now_ms, "time")?)? {
                return Ok(PublishRuntimeResourcesResult::Lost);
            }
            let scope = input.fence.scope();
            let mut fence = load(&tx, &scope)?.unwrap_or_default();
            let Some(published) = fence.publish(&input, now_ms) else {
                return Ok(PublishRuntimeResourcesResult::Lost);
            };
            if published.changed {
                save(&tx, &scope, &fence)?;
            }
            let revision = to_i64(published.revision, "revision")?;
            tx.execute(
                "UPDATE runtime_publication SET run_id = ?6
                  WHERE workspace_id = ?1 AND environment_id = ?2 AND session_id = ?3
                    AND work_id = ?4 AND revision = ?5 AND run_id IS NULL",
                params![
                    scope.workspace_id,
                    scope.environment_id,
                    scope.session_id,
                    scope.work_id,
                    revision,
                    claim.run_id
                ],
            )?;
            tx.execute(
                "UPDATE run_queue SET revision = ?2 WHERE run_id = ?1",
                params![claim.run_id, revision],
            )?;
            tx.commit()?;
            Ok(PublishRuntimeResourcesResult::Published {
                revision: published.revision,
            })
        })
        .await
    }

    async fn status(&self, run_id: &str) -> Result<Option<RunRecord>, PortError> {
        let run_id = run_id.to_owned();
        self.run("run status", move |inner, _| {
            let row = inner
                .conn
                .query_row(
                    "SELECT run_id, session_id, status, attempts, revision, error
                       FROM run_queue WHERE run_id = ?1",
                    [&run_id],
                    record,
                )
                .optional()?;
            row.map(to_record).transpose()
        })
        .await
    }

    async fn cancel(&self, run_id: &str) -> Result<CancelOutcome, PortError> {
        let run_id = run_id.to_owned();
        self.run("cancel run", move |inner, _| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(status) = tx
                .query_row(
                    "SELECT status FROM run_queue WHERE run_id = ?1",
                    [&run_id],
                    |row| row.get::<_, String>(0),
                )
                .optional()?
            else {
                return Ok(CancelOutcome::NotFound);
            };
            let outcome = match parse_status(&status)? {
                RunStatus::Queued => {
                    tx.execute(
                        "UPDATE run_queue SET status = 'cancelled' WHERE run_id = ?1",
                        [&run_id],
                    )?;
                    CancelOutcome::Cancelled
                }
                RunStatus::Running => {
                    tx.execute(
                        "UPDATE run_queue SET cancel_requested = 1 WHERE run_id = ?1",
                        [&run_id],
                    )?;
                    CancelOutcome::Requested
                }
                ended => return Ok(CancelOutcome::AlreadyEnded(ended)),
            };
            tx.commit()?;
            Ok(outcome)
        })
        .await
    }

    async fn cancel_requested(&self, claim: &RunClaim) -> Result<bool, PortError> {
        let run_id = claim.run_id.clone();
        self.run("run cancel request", move |inner, _| {
            Ok(inner
                .conn
                .query_row(
                    "SELECT cancel_requested FROM run_queue WHERE run_id = ?1",
                    [&run_id],
                    |row| row.get::<_, i64>(0),
                )
                .optional()?
                .is_some_and(|requested| requested != 0))
        })
        .await
    }

    async fn session_runs(
        &self,
        session_id: &str,
        before: Option<u64>,
        limit: usize,
    ) -> Result<RunPage, PortError> {
        let session_id = session_id.to_owned();
        let limit = limit.clamp(1, MAX_RUN_PAGE);
        self.run("session runs", move |inner, _| {
            let before = before.map_or(Ok(i64::MAX), |before| to_i64(before, "cursor"))?;
            let mut statement = inner.conn.prepare(
                "SELECT run_id, session_id, status, attempts, revision, error, seq
                   FROM run_queue WHERE session_id = ?1 AND seq < ?2
                  ORDER BY seq DESC LIMIT ?3",
            )?;
            let rows = statement
                .query_map(params![session_id, before, limit as i64], |row| {
                    Ok((record(row)?, row.get::<_, i64>(6)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            let next = match rows.last() {
                Some((_, seq)) if rows.len() == limit => Some(to_u64(*seq, "cursor")?),
                _ => None,
            };
            Ok(RunPage {
                runs: rows
                    .into_iter()
                    .map(|(row, _)| to_record(row))
                    .collect::<Result<_, _>>()?,
                next,
            })
        })
        .await
    }

    async fn append_event(&self, claim: &RunClaim, text: &str) -> Result<bool, PortError> {
        let (claim, text) = (claim.clone(), cap_event(text).to_owned());
        self.run("append run event", move |inner, env| {
            let tx = inner
                .conn
                .transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = to_i64(env.clock.now_ms(), "time")?;
            if !live(&tx, &claim, now)? {
                return Ok(false);
            }
            let count: i64 = tx.query_row(
                "SELECT count(*) FROM run_event WHERE run_id = ?1",
                [&claim.run_id],
                |row| row.get(0),
            )?;
            if to_u64(count, "events")? < MAX_RUN_EVENTS {
                tx.execute(
                    "INSERT INTO run_event (run_id, seq, text) VALUES (?1, ?2, ?3)",
                    params![claim.run_id, count + 1, text],
                )?;
            }
            tx.commit()?;
            Ok(true)
        })
        .await
    }

    async fn events(
        &self,
        run_id: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<RunEvent>, PortError> {
        let run_id = run_id.to_owned();
        self.run("run events", move |inner, _| {
            let mut statement = inner.conn.prepare(
                "SELECT seq, text FROM run_event WHERE run_id = ?1 AND seq > ?2
                  ORDER BY seq LIMIT ?3",
            )?;
            let rows = statement.query_map(
                params![
                    run_id,
                    to_i64(after, "event")?,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                |row| Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?)),
            )?;
            rows.map(|row| {
                let (seq, text) = row?;
                Ok(RunEvent {
                    seq: to_u64(seq, "event")?,
                    text,
                })
            })
            .collect()
        })
        .await
    }

    async fn published_runs(
        &self,
        session_id: &str,
    ) -> Result<Vec<(u64, Option<String>)>, PortError> {
        let session_id = session_id.to_owned();
        self.run("published runs", move |inner, _| {
            let mut statement = inner.conn.prepare(
                "SELECT revision, run_id FROM runtime_publication WHERE session_id = ?1
                  ORDER BY revision",
            )?;
            let rows = statement.query_map([&session_id], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, Option<String>>(1)?))
            })?;
            rows.map(|row| {
                let (revision, run_id) = row?;
                Ok((to_u64(revision, "revision")?, run_id))
            })
            .collect()
        })
        .await
    }
}

/// A stored row as a [`RunRecord`].
fn to_record(
    (run_id, session_id, status, attempts, revision, error): RunRow,
) -> Result<RunRecord, StoreError> {
    Ok(RunRecord {
        run_id,
        session_id,
        status: parse_status(&status)?,
        revision: revision.map(|r| to_u64(r, "revision")).transpose()?,
        error,
        attempts: to_u64(attempts, "attempts")?,
    })
}

fn parse_status(status: &str) -> Result<RunStatus, StoreError> {
    RunStatus::parse(status).ok_or_else(|| StoreError::Corrupt(format!("run status {status:?}")))
}
