//! Registry credentials from omabox's vault: a secret named `registry/<host[:port]>`
//! (`registry/index.docker.io` for Docker Hub) holding `user:password`
//! (`printf 'alice:pw' | omabox vault put registry/ghcr.io`). They are asked before docker's
//! `config.json`. Values are never printed; a value that is not `user:password` is skipped
//! with a warning (handed to the caller's `warn`) naming the secret only.

use std::collections::BTreeMap;

use omabox_backend_linux::image::{RegistryCredential, StaticCredentials};
use omabox_contract::VaultSecretPort as _;

use crate::DataDir;

/// The vault's name prefix of registry credentials.
pub const PREFIX: &str = "registry/";

/// The registry credentials in the vault of `data_dir` (none without a store); `warn` gets a
/// line for each secret skipped.
pub async fn from_vault(
    data_dir: &DataDir,
    warn: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<StaticCredentials> {
    let Some(store) = data_dir.open_existing_store().await? else {
        return Ok(StaticCredentials::default());
    };
    let mut found = BTreeMap::new();
    for name in store.names().await? {
        let Some(host) = name.strip_prefix(PREFIX).filter(|h| !h.is_empty()) else {
            continue;
        };
        let Some(secret) = store.get(&name).await? else {
            continue;
        };
        match RegistryCredential::from_user_colon_password(secret.expose()) {
            Some(credential) => {
                found.insert(host.to_owned(), credential);
            }
            None => warn(&format!(
                "warning: vault secret {name} is not user:password; ignored"
            )),
        }
    }
    Ok(StaticCredentials(found))
}

/// [`from_vault`] for a caller without an async runtime.
pub fn from_vault_blocking(
    data_dir: &DataDir,
    warn: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<StaticCredentials> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(from_vault(data_dir, warn))
}
