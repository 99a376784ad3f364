//! Where omabox keeps its state on this machine.

use anyhow::Context;
use omabox_store::SqliteStore;
use std::path::{Path, PathBuf};

/// The state directory: `--data-dir` (or `$OMABOX_DATA_DIR`), else `$XDG_DATA_HOME/omabox`,
/// else `~/.local/share/omabox`.
pub fn resolve(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        return Ok(dir.to_path_buf());
    }
    if let Some(xdg) = std::env::var_os("XDG_DATA_HOME").filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(xdg).join("omabox"));
    }
    match std::env::var_os("HOME").filter(|value| !value.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/omabox")),
        None => anyhow::bail!(
            "cannot choose a data directory: neither XDG_DATA_HOME nor HOME is set; pass --data-dir DIR"
        ),
    }
}

/// The SQLite database inside the data directory.
pub fn database_path(data_dir: &Path) -> PathBuf {
    data_dir.join("omabox.db")
}

/// Opens the store for a command that writes (`run`, `vault put`, `serve`, `gc`, …): creates
/// the data directory and the database when they are missing. An existing database that is not
/// a healthy omabox store, or a read-only data directory, is an error naming the file or
/// directory and what to do (the store's errors say it; they are not wrapped again).
pub async fn open_store(data_dir: &Path) -> anyhow::Result<SqliteStore> {
    let path = database_path(data_dir);
    tokio::task::spawn_blocking(move || SqliteStore::open(&path).map_err(anyhow::Error::from))
        .await
        .context("the store task failed")?
}

/// Opens the store for a command that only reads: `None` when the data directory has no
/// database yet (nothing is created then).
pub async fn open_existing_store(data_dir: &Path) -> anyhow::Result<Option<SqliteStore>> {
    let path = database_path(data_dir);
    tokio::task::spawn_blocking(move || {
        SqliteStore::open_if_exists(&path).map_err(anyhow::Error::from)
    })
    .await
    .context("the store task failed")?
}

/// What a read-only command says when the data directory has no database.
pub fn no_data_yet(data_dir: &Path) -> String {
    format!(
        "no data yet in {}: nothing has run with this data directory (`omabox run` creates it)",
        data_dir.display()
    )
}
