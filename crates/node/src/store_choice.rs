//! Which store a command uses: the embedded SQLite file of the data directory (the default),
//! or the PostgreSQL database the `database_url` setting names (`--database-url`,
//! `OMABOX_DATABASE_URL`; issue 30).
//!
//! So far `omabox vault`, `omabox usage` and `omabox sessions` open it; every other command
//! that keeps state refuses to run while `database_url` is set ([`refuse_database_url`])
//! rather than quietly using the local SQLite file, which other hosts would not see.
//!
//! What this must never do: put the URL (it carries a password) in an error or a log line;
//! the store's errors name `user@host:port/database` only.

use crate::config::{Key, NodeConfig};
use crate::data_dir::DataDir;
use anyhow::Context as _;
use omabox_contract::{
    RuntimeResourcePublication, RuntimeResourceScope, UsageLedgerPort, VaultSecretPort,
};
use omabox_store::{PostgresStore, SqliteStore};
use std::sync::Arc;

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
    let Some(url) = config.secret(Key::DatabaseUrl) else {
        return Ok(None);
    };
    let store = PostgresStore::connect(url.expose()).await?;
    Ok(Some(ChosenStore::Postgres(store)))
}

impl ChosenStore {
    /// The vault port.
    pub fn vault(&self) -> Arc<dyn VaultSecretPort> {
        match self {
            Self::Sqlite(store) => Arc::new(store.clone()),
            Self::Postgres(store) => Arc::new(store.clone()),
        }
    }

    /// The usage ledger port.
    pub fn usage(&self) -> Arc<dyn UsageLedgerPort> {
        match self {
            Self::Sqlite(store) => Arc::new(store.clone()),
            Self::Postgres(store) => Arc::new(store.clone()),
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

/// An error when `database_url` is set: `command` keeps its state in the SQLite store only.
pub fn refuse_database_url(config: &NodeConfig, command: &str) -> anyhow::Result<()> {
    if config.is_set(Key::DatabaseUrl) {
        anyhow::bail!(
            "`omabox {command}` does not use the PostgreSQL store yet: unset --database-url / \
             OMABOX_DATABASE_URL to use the data directory's SQLite store (so far only \
             `omabox vault`, `omabox usage` and `omabox sessions` use PostgreSQL)"
        );
    }
    Ok(())
}
