//! Which store a command uses: the embedded SQLite file of the data directory (the default),
//! or the PostgreSQL database the `database_url` setting names (`--database-url`,
//! `OMABOX_DATABASE_URL`; issue 30).
//!
//! Every command that keeps state opens it through here (`run`, `serve`, `fsck`, `reap`,
//! `gc`, `vault`, `usage`, `sessions`, `workspace`, `outputs`); `files` keeps its files in
//! the file store next to the blobs (`DataDir::files_home`), which hosts share with
//! `--blob-dir`.
//!
//! The `*_blocking` queries are for code on tokio's blocking pool (the leftovers sweep, the
//! blob collection): SQLite's run there as they are, PostgreSQL's are driven by the
//! runtime's handle.
//!
//! What this must never do: put the URL (it carries a password) in an error or a log line;
//! the store's errors name `user@host:port/database` only.

use crate::config::{Key, NodeConfig};
use crate::data_dir::DataDir;
use anyhow::Context as _;
use omabox_contract::{
    RunQueuePort, RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeResourceFencePort,
    RuntimeResourcePublication, RuntimeResourceScope, SessionTokenPort, UsageLedgerPort,
    VaultSecretPort,
};
use omabox_store::{PostgresStore, RunListener, SqliteStore, StoreError, WorkItemClaim};
use std::collections::HashSet;
use std::sync::Arc;

/// `Arc<dyn $port>` of whichever store this is.
macro_rules! port {
    ($self:ident, $port:path) => {
        match $self {
            ChosenStore::Sqlite(store) => Arc::new(store.clone()) as Arc<dyn $port>,
            ChosenStore::Postgres(store) => Arc::new(store.clone()) as Arc<dyn $port>,
        }
    };
}

/// The store a command opened.
#[derive(Debug, Clone)]
pub enum ChosenStore {
    /// The data directory's SQLite file.
    Sqlite(SqliteStore),
    /// The shared PostgreSQL database.
    Postgres(PostgresStore),
}

/// The store for a command that writes: PostgreSQL when `database_url` is set, else the data
/// directory's SQLite store (created when missing).
pub async fn open(config: &NodeConfig, data_dir: &DataDir) -> anyhow::Result<ChosenStore> {
    match open_postgres(config).await? {
        Some(store) => Ok(store),
        None => Ok(ChosenStore::Sqlite(data_dir.open_store().await?)),
    }
}

/// The store for a command that only reads: PostgreSQL when `database_url` is set, else the
/// data directory's SQLite store, `None` when it does not exist (nothing is created).
pub async fn open_existing(
    config: &NodeConfig,
    data_dir: &DataDir,
) -> anyhow::Result<Option<ChosenStore>> {
    match open_postgres(config).await? {
        Some(store) => Ok(Some(store)),
        None => Ok(data_dir
            .open_existing_store()
            .await?
            .map(ChosenStore::Sqlite)),
    }
}

async fn open_postgres(config: &NodeConfig) -> anyhow::Result<Option<ChosenStore>> {
    let Some(url) = config.checked_secret(Key::DatabaseUrl)? else {
        return Ok(None);
    };
    let store = PostgresStore::connect(url.expose()).await?;
    Ok(Some(ChosenStore::Postgres(store)))
}

impl ChosenStore {
    /// The fence port.
    pub fn fences(&self) -> Arc<dyn RuntimeResourceFencePort> {
        port!(self, RuntimeResourceFencePort)
    }

    /// The orphan queue port.
    pub fn orphans(&self) -> Arc<dyn RuntimeOrphanPort> {
        port!(self, RuntimeOrphanPort)
    }

    /// The lease journal port.
    pub fn journal(&self) -> Arc<dyn RuntimeLeaseJournalPort> {
        port!(self, RuntimeLeaseJournalPort)
    }

    /// The session token port.
    pub fn tokens(&self) -> Arc<dyn SessionTokenPort> {
        port!(self, SessionTokenPort)
    }

    /// The vault port.
    pub fn vault(&self) -> Arc<dyn VaultSecretPort> {
        port!(self, VaultSecretPort)
    }

    /// The run queue port.
    pub fn runs(&self) -> Arc<dyn RunQueuePort> {
        port!(self, RunQueuePort)
    }

    /// On PostgreSQL, wakes `wake` whenever any host queues or ends a run (`LISTEN`; the
    /// listener stops when dropped); `None` on SQLite, whose runs are queued by this process
    /// only, which wakes its worker itself.
    pub async fn listen_for_runs(
        &self,
        wake: Arc<tokio::sync::Notify>,
    ) -> anyhow::Result<Option<RunListener>> {
        match self {
            Self::Sqlite(_) => Ok(None),
            Self::Postgres(store) => Ok(Some(store.listen_for_runs(wake).await?)),
        }
    }

    /// The usage ledger port.
    pub fn usage(&self) -> Arc<dyn UsageLedgerPort> {
        port!(self, UsageLedgerPort)
    }

    /// The last (active) publication of `scope`.
    pub async fn publication(
        &self,
        scope: &RuntimeResourceScope,
    ) -> anyhow::Result<Option<RuntimeResourcePublication>> {
        match self {
            Self::Sqlite(store) => {
                let (store, scope) = (store.clone(), scope.clone());
                Ok(
                    tokio::task::spawn_blocking(move || store.publication(&scope))
                        .await
                        .context("the store task failed")??,
                )
            }
            Self::Postgres(store) => Ok(store.publication(scope).await?),
        }
    }

    /// The published revisions of `scope`, newest first.
    pub async fn publications_of(
        &self,
        scope: &RuntimeResourceScope,
    ) -> anyhow::Result<Vec<RuntimeResourcePublication>> {
        match self {
            Self::Sqlite(store) => {
                let (store, scope) = (store.clone(), scope.clone());
                Ok(
                    tokio::task::spawn_blocking(move || store.publications_of(&scope))
                        .await
                        .context("the store task failed")??,
                )
            }
            Self::Postgres(store) => Ok(store.publications_of(scope).await?),
        }
    }

    /// [`Self::publications_of`] from a blocking thread.
    pub fn publications_of_blocking(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<Vec<RuntimeResourcePublication>, StoreError> {
        match self {
            Self::Sqlite(store) => store.publications_of(scope),
            Self::Postgres(store) => block_on(store.publications_of(scope)),
        }
    }

    /// Every work item's latest generation and whether it holds its fence, from a blocking
    /// thread.
    pub fn work_item_claims_blocking(&self) -> Result<Vec<WorkItemClaim>, StoreError> {
        match self {
            Self::Sqlite(store) => store.work_item_claims(),
            Self::Postgres(store) => block_on(store.work_item_claims()),
        }
    }

    /// The runtime ids of `provider` the lease journal names, from a blocking thread.
    pub fn journaled_runtime_ids_blocking(
        &self,
        provider: &str,
    ) -> Result<HashSet<String>, StoreError> {
        match self {
            Self::Sqlite(store) => store.journaled_runtime_ids(provider),
            Self::Postgres(store) => block_on(store.journaled_runtime_ids(provider)),
        }
    }

    /// How many work items hold an unexpired fence, on every host of the store, from a
    /// blocking thread.
    pub fn active_fence_count_blocking(&self) -> Result<u64, StoreError> {
        match self {
            Self::Sqlite(store) => store.active_fence_count(),
            Self::Postgres(store) => block_on(store.active_fence_count()),
        }
    }

    /// [`Self::publication_history`] from a blocking thread.
    pub fn publication_history_blocking(
        &self,
    ) -> Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>, StoreError> {
        match self {
            Self::Sqlite(store) => store.publication_history(),
            Self::Postgres(store) => block_on(store.publication_history()),
        }
    }

    /// Removes `(scope, revision)` rows from the publication history (never a work item's
    /// newest), from a blocking thread; how many went.
    pub fn forget_revisions_blocking(
        &self,
        revisions: &[(RuntimeResourceScope, u64)],
    ) -> Result<u64, StoreError> {
        match self {
            Self::Sqlite(store) => store.forget_revisions(revisions),
            Self::Postgres(store) => block_on(store.forget_revisions(revisions)),
        }
    }

    /// Every publication of every work item, newest first per work item.
    pub async fn publication_history(
        &self,
    ) -> anyhow::Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>> {
        match self {
            Self::Sqlite(store) => {
                let store = store.clone();
                Ok(
                    tokio::task::spawn_blocking(move || store.publication_history())
                        .await
                        .context("the store task failed")??,
                )
            }
            Self::Postgres(store) => Ok(store.publication_history().await?),
        }
    }

    /// Every work item that has published, with its last publication, in scope order.
    pub async fn list_publications(
        &self,
    ) -> anyhow::Result<Vec<(RuntimeResourceScope, RuntimeResourcePublication)>> {
        match self {
            Self::Sqlite(store) => {
                let store = store.clone();
                Ok(
                    tokio::task::spawn_blocking(move || store.list_publications())
                        .await
                        .context("the store task failed")??,
                )
            }
            Self::Postgres(store) => Ok(store.list_publications().await?),
        }
    }
}

/// Drives `future` on the current runtime from a blocking-pool thread (never from an async
/// task: tokio panics there, as it must).
fn block_on<T>(
    future: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(future),
        Err(_) => Err(StoreError::Worker(
            "a PostgreSQL query outside the tokio runtime".to_owned(),
        )),
    }
}
