//! Where omabox keeps its state on this machine, and whether it may trust it.
//!
//! The data directory holds the store (fences, tokens' hashes, vault secrets), the blobs of
//! every published workspace and the live binding dirs a sandbox writes into; omabox (often
//! root) reads, writes and removes trees there. So it is used only when no other user can
//! change it: it is resolved once (a symlink is followed here and never again, so swapping
//! the link later changes nothing), and refused when it belongs to another user or is
//! writable by group or others, or when a directory above it is writable by a user other
//! than root or this one without the sticky bit (whoever can rename entries there can swap
//! the data directory for one of their own).
//!
//! What this must never do: hand a command a data directory another user controls.

use anyhow::Context;
use omabox_store::SqliteStore;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The state directory, checked and with its symlinks resolved ([`trusted`]): `--data-dir`
/// (or `$OMABOX_DATA_DIR`), else `$XDG_DATA_HOME/omabox`, else `~/.local/share/omabox`.
pub fn resolve(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    trusted(&chosen(explicit)?)
}

/// The state directory as the user named it.
fn chosen(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        if dir.as_os_str().is_empty() {
            anyhow::bail!("--data-dir is empty: name a directory");
        }
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

/// `dir` with its symlinks resolved, once it is known no other user can change it (module
/// doc). A directory not made yet is judged by its nearest existing ancestor.
pub fn trusted(dir: &Path) -> anyhow::Result<PathBuf> {
    match std::fs::canonicalize(dir) {
        Ok(real) => {
            check_own_dir(&real, dir)?;
            if let Some(parent) = real.parent() {
                check_ancestors(parent, &real, dir)?;
            }
            Ok(real)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            if std::fs::symlink_metadata(dir).is_ok() {
                anyhow::bail!(
                    "the data directory {} is a symbolic link to a directory that does not exist",
                    dir.display()
                );
            }
            let absolute = std::path::absolute(dir)
                .with_context(|| format!("the data directory {}", dir.display()))?;
            let (existing, missing) = split_existing(&absolute);
            let real = std::fs::canonicalize(&existing).with_context(|| {
                format!(
                    "cannot resolve {} (above the data directory)",
                    existing.display()
                )
            })?;
            if !real.is_dir() {
                anyhow::bail!(
                    "the data directory {} cannot be made: {} is not a directory",
                    dir.display(),
                    existing.display()
                );
            }
            let target = real.join(missing);
            check_ancestors(&real, &target, dir)?;
            Ok(target)
        }
        Err(error) => Err(error).with_context(|| {
            format!(
                "cannot use the data directory {}: cannot resolve it",
                dir.display()
            )
        }),
    }
}

/// `path`'s nearest existing ancestor and the rest of it.
fn split_existing(path: &Path) -> (PathBuf, PathBuf) {
    let mut existing = path.to_path_buf();
    let mut missing = Vec::new();
    while std::fs::symlink_metadata(&existing).is_err() {
        match (
            existing.file_name().map(ToOwned::to_owned),
            existing.parent(),
        ) {
            (Some(name), Some(parent)) => {
                missing.push(name);
                existing = parent.to_path_buf();
            }
            _ => break,
        }
    }
    (existing, missing.iter().rev().collect())
}

/// This process's effective uid.
fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The data directory itself: a directory of this user, writable by nobody else.
fn check_own_dir(real: &Path, named: &Path) -> anyhow::Result<()> {
    let metadata = std::fs::metadata(real)
        .with_context(|| format!("cannot use the data directory {}", named.display()))?;
    if !metadata.is_dir() {
        anyhow::bail!("the data directory {} is not a directory", named.display());
    }
    let shown = shown(real, named);
    if metadata.uid() != euid() {
        anyhow::bail!(
            "the data directory {shown} belongs to uid {}, not to this user (uid {}): its owner \
             could change the state omabox trusts; use a data directory of your own (--data-dir)",
            metadata.uid(),
            euid()
        );
    }
    if metadata.mode() & 0o022 != 0 {
        anyhow::bail!(
            "the data directory {shown} is writable by other users (mode {:o}): they could \
             change the state omabox trusts; `chmod go-w` it, or use another data directory",
            metadata.mode() & 0o7777
        );
    }
    Ok(())
}

/// `first` and every directory above it (all above the data directory `real`, named `named`):
/// root's or this user's, and not writable by others unless sticky.
fn check_ancestors(first: &Path, real: &Path, named: &Path) -> anyhow::Result<()> {
    for ancestor in first.ancestors() {
        let metadata = std::fs::metadata(ancestor).with_context(|| {
            format!(
                "cannot inspect {} (above the data directory)",
                ancestor.display()
            )
        })?;
        let owner_ok = metadata.uid() == 0 || metadata.uid() == euid();
        let writable_by_others = metadata.mode() & 0o022 != 0 && metadata.mode() & 0o1000 == 0;
        if !owner_ok || writable_by_others {
            anyhow::bail!(
                "the data directory {} is inside {}, which {} (uid {}, mode {:o}): whoever can \
                 rename entries there can swap the data directory; use one below directories \
                 only you or root can change",
                shown(real, named),
                ancestor.display(),
                if owner_ok {
                    "other users can change"
                } else {
                    "another user owns"
                },
                metadata.uid(),
                metadata.mode() & 0o7777
            );
        }
    }
    Ok(())
}

/// `named`, and where it really is when that differs.
fn shown(real: &Path, named: &Path) -> String {
    if real == named {
        real.display().to_string()
    } else {
        format!("{} (= {})", named.display(), real.display())
    }
}

/// Refuses `dir` (a directory the user gives a sandbox: `--workspace`) when it is the data
/// directory named by `explicit` (or the default one), inside it, or holds it: its store
/// keeps the vault's secrets and every session's state, and a sandbox must never read or
/// write them (`--workspace ~` would copy or bind the whole store). Nothing is created.
pub fn check_apart(flag: &str, dir: &Path, explicit: Option<&Path>) -> anyhow::Result<()> {
    let Ok(data) = chosen(explicit).and_then(|d| Ok(std::fs::canonicalize(d)?)) else {
        return Ok(()); // no data directory yet: nothing of it to expose
    };
    let Ok(real) = std::fs::canonicalize(dir) else {
        return Ok(()); // the caller says what is wrong with the directory itself
    };
    if data.starts_with(&real) || real.starts_with(&data) {
        let relation = if real == data {
            "is"
        } else if data.starts_with(&real) {
            "holds"
        } else {
            "is inside"
        };
        anyhow::bail!(
            "{flag} {} {relation} omabox's data directory {}: its store holds the vault's \
             secrets and every session's state, which a sandbox must never see; use a \
             directory apart from it",
            dir.display(),
            data.display()
        );
    }
    Ok(())
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
    let store =
        tokio::task::spawn_blocking(move || SqliteStore::open(&path).map_err(anyhow::Error::from))
            .await
            .context("the store task failed")??;
    // Made just now, or by someone else just before: the same rules as for one found.
    check_own_dir(data_dir, data_dir)?;
    Ok(store)
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
