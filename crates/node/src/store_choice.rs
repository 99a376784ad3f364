//! Which store a command uses: the embedded SQLite file of the data directory (the default),
//! or the PostgreSQL database the `database_url` setting names (`--database-url`,
//! `OMABOX_DATABASE_URL`; issue 30).
//!
//! So far only the vault is opened from PostgreSQL; every other command that keeps state
//! refuses to run while `database_url` is set ([`refuse_database_url`]) rather than quietly
//! using the local SQLite file, which other hosts would not see.
//!
//! What this must never do: put the URL (it carries a password) in an error or a log line;
//! the store's errors name `user@host:port/database` only.

use crate::config::{Key, NodeConfig};
use crate::data_dir::DataDir;
use omabox_contract::VaultSecretPort;
use omabox_store::PostgresStore;
use std::sync::Arc;

/// The vault for a command: PostgreSQL when `database_url` is set, else the data directory's
/// SQLite store (created when `create`; `None` when it does not exist and `create` is false).
pub async fn open_vault(
    config: &NodeConfig,
    data_dir: &DataDir,
    create: bool,
) -> anyhow::Result<Option<Arc<dyn VaultSecretPort>>> {
    if let Some(url) = config.secret(Key::DatabaseUrl) {
        let store = PostgresStore::connect(url.expose()).await?;
        return Ok(Some(Arc::new(store)));
    }
    let store = if create {
        Some(data_dir.open_store().await?)
    } else {
        data_dir.open_existing_store().await?
    };
    Ok(store.map(|store| Arc::new(store) as Arc<dyn VaultSecretPort>))
}

/// An error when `database_url` is set: `command` keeps its state in the SQLite store only.
pub fn refuse_database_url(config: &NodeConfig, command: &str) -> anyhow::Result<()> {
    if config.is_set(Key::DatabaseUrl) {
        anyhow::bail!(
            "`omabox {command}` does not use the PostgreSQL store yet: unset --database-url / \
             OMABOX_DATABASE_URL to use the data directory's SQLite store (so far only \
             `omabox vault` uses PostgreSQL)"
        );
    }
    Ok(())
}
