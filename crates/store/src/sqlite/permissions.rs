//! Owner-only permissions for the database file: since migration 3 it holds vault secrets.
//!
//! Before SQLite opens a path, the file is created with mode `0600` if it does not exist; an
//! existing database and its `-wal`/`-shm` companions are narrowed to `0600` after the open
//! (SQLite's unix VFS creates `-wal` and `-shm` with the mode of the database file, so a
//! `0600` database gets `0600` companions). Narrowing an existing file can fail when this
//! process does not own it; that is logged (path only) and the open goes on, because the
//! owner may have chosen the mode on purpose (for example a group shared by several host
//! processes). On non-unix platforms nothing is changed.

use std::path::Path;

/// Creates `path` with mode `0600` if it is missing (never truncates).
pub(super) fn create_private(path: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map(drop)
    }
    #[cfg(not(unix))]
    {
        let _ = path;
        Ok(())
    }
}

/// Narrows the database file and its `-wal`/`-shm` (where present) to `0600`.
pub(super) fn restrict(path: &Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mut files = vec![path.to_owned()];
        for suffix in ["-wal", "-shm"] {
            let mut companion = path.as_os_str().to_owned();
            companion.push(suffix);
            files.push(companion.into());
        }
        for file in files {
            let Ok(metadata) = std::fs::metadata(&file) else {
                continue;
            };
            if metadata.permissions().mode() & 0o077 == 0 {
                continue;
            }
            if let Err(error) =
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600))
            {
                tracing::warn!(
                    path = %file.display(),
                    %error,
                    "cannot restrict the store database file to its owner (mode 0600)"
                );
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = path;
    }
}
