//! Which store a command uses: the embedded SQLite file of the data directory (the default),
//! or the PostgreSQL database the `database_url` setting names (`--database-url`,
//! `OMABOX_DATABASE_URL`; issue 30).
//!
//! So far `omabox run`, `serve`, `fsck`, `reap` (without its blob collection), `vault`, `usage`, `sessions`, `workspace` and `outputs` open it; every other command that
//! keeps state refuses to run while `database_url` is set ([`refuse_database_url`]) rather
//! than quietly using the local SQLite file, which other hosts would not see.
//!
//! The `*_blocking` queries are for code on tokio's blocking pool (the leftovers sweep):
//! SQLite's run there as they are, PostgreSQL's are driven by the runtime's handle.
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
use omabox_store::{PostgresStore, SqliteStore, StoreError, WorkItemClaim};
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

/// An error when `blob_dir` is set: `command` collects (or serves) the data directory's own
/// blob store, and a collection of a directory other hosts share would remove blobs their
/// publications name.
pub fn refuse_blob_dir(config: &NodeConfig, command: &str) -> anyhow::Result<()> {
    if config.is_set(Key::BlobDir) {
        anyhow::bail!(
            "`omabox {command}` does not support a shared blob directory yet: unset --blob-dir / \
             OMABOX_BLOB_DIR to use the data directory's own blob store (a collection there \
             would remove blobs other hosts' publications name)"
        );
    }
    Ok(())
}

/// An error when `database_url` is set: `command` keeps its state in the SQLite store only.
pub fn refuse_database_url(config: &NodeConfig, command: &str) -> anyhow::Result<()> {
    if config.is_set(Key::DatabaseUrl) {
        anyhow::bail!(
            "`omabox {command}` does not use the PostgreSQL store yet: unset --database-url / \
             OMABOX_DATABASE_URL to use the data directory's SQLite store (so far only \
             `omabox run`, `serve`, `fsck`, `reap`, `vault`, `usage`, `sessions`, `workspace` \
             and `outputs` use PostgreSQL)"
        );
    }
    Ok(())
}
