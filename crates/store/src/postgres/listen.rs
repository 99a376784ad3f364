//! Wake-ups of idle hosts: every change that can make a run claimable (a run queued, a run
//! ended, so its session's next one and its host's slot are free) sends `NOTIFY
//! omabox_runs` in its transaction, delivered when it commits; [`PostgresStore::listen_for_runs`]
//! holds one connection of its own in `LISTEN omabox_runs` and wakes the host's worker on
//! each notification. A worker keeps polling, slower, for what sends none: a claim that
//! expired because its host died.
//!
//! The connection is outside the pool (a pooled one would be recycled, and its `LISTEN`
//! lost) and is re-made when it drops, waking the worker once each time, so a notification
//! missed meanwhile costs at most one look at the queue. What this must never do: stop the
//! host on a lost connection (the poll still finds the runs), or log the URL.

use super::PostgresStore;
use crate::StoreError;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

/// The channel of run-queue changes.
pub const RUNS_CHANNEL: &str = "omabox_runs";

/// How long a lost listening connection waits before it is made again.
const RECONNECT: Duration = Duration::from_secs(1);

/// The listening task; stopped when dropped.
#[derive(Debug)]
pub struct RunListener {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for RunListener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl PostgresStore {
    /// Listens for [`RUNS_CHANNEL`] and calls `wake.notify_one()` on each notification (and
    /// after each reconnection). The first connection's failure is returned; later ones are
    /// logged and retried every second.
    pub async fn listen_for_runs(&self, wake: Arc<Notify>) -> Result<RunListener, StoreError> {
        let first = self.listen_once(Arc::clone(&wake)).await?;
        let store = self.clone();
        let task = tokio::spawn(async move {
            let mut listening = first;
            loop {
                if let Err(error) = (&mut listening.driver).await.unwrap_or(Ok(())) {
                    tracing::warn!(target = %store.target, %error, "the run listener's connection was lost");
                }
                loop {
                    tokio::time::sleep(RECONNECT).await;
                    match store.listen_once(Arc::clone(&wake)).await {
                        Ok(next) => {
                            listening = next;
                            break;
                        }
                        Err(error) => {
                            tracing::warn!(%error, "cannot listen for queued runs");
                        }
                    }
                }
                // What was notified while no connection listened is found by this look.
                wake.notify_one();
            }
        });
        Ok(RunListener { task })
    }

    /// One listening connection: its driver task ends when the connection does.
    async fn listen_once(&self, wake: Arc<Notify>) -> Result<Listening, StoreError> {
        let failed = |detail: String| StoreError::Connect {
            target: self.target.clone(),
            detail,
        };
        let (client, mut connection) = self
            .config
            .connect(self.tls.clone())
            .await
            .map_err(|error| failed(super::describe(&error)))?;
        let driver = tokio::spawn(async move {
            loop {
                match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                    Some(Ok(AsyncMessage::Notification(_))) => wake.notify_one(),
                    Some(Ok(_)) => {}
                    Some(Err(error)) => return Err(super::describe(&error)),
                    None => return Ok(()),
                }
            }
        });
        if let Err(error) = client
            .batch_execute(&format!("LISTEN {RUNS_CHANNEL}"))
            .await
        {
            driver.abort();
            return Err(failed(super::describe(&error)));
        }
        Ok(Listening {
            _client: client,
            driver,
        })
    }
}

/// A connection in `LISTEN`: the client keeps it open (dropping it closes it), the driver
/// task reads its notifications.
struct Listening {
    _client: tokio_postgres::Client,
    driver: tokio::task::JoinHandle<Result<(), String>>,
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.driver.abort();
    }
}
