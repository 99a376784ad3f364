//! Where omabox keeps its state on this machine.

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
