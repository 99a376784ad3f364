//! Where omabox keeps its state on this machine, and whether it may trust it: [`DataDir`], the
//! one resolver of every path omabox keeps on the host.
//!
//! ```text
//! <data-dir>/omabox.db              the store: fences, orphans, lease journal, usage, session
//!                                   tokens (hashed), publication history, the vault
//! <data-dir>/omabox.toml            the node configuration file (optional; `crate::config`)
//! <data-dir>/blobs/                 content-addressed blobs (`omabox_persistence::BlobStore`),
//!                                   unless `--blob-dir` puts them elsewhere (shared by hosts)
//! <data-dir>/runtime/               /workspace binding dirs of live generations
//! <data-dir>/runtime-outputs/       /mnt/session/outputs binding dirs of live generations
//! <data-dir>/memory/<NAME>/         memory stores; `memory/.pending/<run>/` a run's write-backs
//! <data-dir>/promoted/              the file store (`omabox files add`, file promotion)
//! <data-dir>/serve-api-key          the operator key `omabox serve` generated (0600)
//! <data-dir>/agents/                the ACP agent package cache (unless `agent_cache` is set)
//! <image cache>/                    images (`image_cache`: by default outside the data dir)
//! <image cache>/env-layers/         environment layers built on those images
//! ```
//!
//! The crates that own a layout below the data dir (persistence: `blobs/`, `runtime*/`;
//! proxy: `promoted/`, `serve-api-key`) are handed the data dir's root and keep their own
//! names; this module's tests pin that those names are the ones above.
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
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The state directory of this machine, its symlinks resolved and its trust checked
/// ([`DataDir::resolve`]), and every path below it (module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataDir {
    root: PathBuf,
    blobs: Option<PathBuf>,
}

/// The database file below the data dir.
pub const DATABASE: &str = "omabox.db";
/// The node configuration file below the data dir.
pub const CONFIG_FILE: &str = "omabox.toml";
/// The blob store below the data dir.
pub const BLOBS: &str = "blobs";
/// The `/workspace` binding dirs below the data dir.
pub const WORKSPACE_BINDINGS: &str = "runtime";
/// The `/mnt/session/outputs` binding dirs below the data dir.
pub const OUTPUT_BINDINGS: &str = "runtime-outputs";
/// The memory stores below the data dir.
pub const MEMORY: &str = "memory";
/// The runs' memory-store stages below [`MEMORY`].
pub const MEMORY_STAGES: &str = ".pending";
/// The file store below the data dir.
pub const PROMOTED: &str = "promoted";
/// The operator key file below the data dir.
pub const OPERATOR_KEY: &str = "serve-api-key";
/// The default agent package cache below the data dir.
pub const AGENTS: &str = "agents";
/// The environment layers below the image cache.
pub const ENV_LAYERS: &str = "env-layers";

impl DataDir {
    /// `chosen` (see [`choose`]) with its symlinks resolved, once it is known no other user
    /// can change it (module doc). A directory not made yet is judged by its nearest
    /// existing ancestor; nothing is created.
    pub fn resolve(chosen: &Path) -> anyhow::Result<Self> {
        Ok(Self {
            root: trusted(chosen)?,
            blobs: None,
        })
    }

    /// The data dir at `root`, taken as resolved and checked already (tests, and a caller
    /// that holds a [`DataDir`]'s root).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            blobs: None,
        }
    }

    /// The blob store in `dir` (`--blob-dir`, resolved and checked like the data dir) instead
    /// of `<data-dir>/blobs`.
    #[must_use]
    pub fn with_blob_dir(mut self, dir: PathBuf) -> Self {
        self.blobs = Some(dir);
        self
    }

    /// Whether the blob store is elsewhere than `<data-dir>/blobs` (`--blob-dir`).
    pub fn has_own_blob_dir(&self) -> bool {
        self.blobs.is_some()
    }

    /// The directory itself: what the persistence and proxy crates are handed.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The SQLite database: fences, orphans, lease journal, usage, tokens, vault.
    pub fn database(&self) -> PathBuf {
        self.root.join(DATABASE)
    }

    /// The node configuration file read when present ([`crate::config`]).
    pub fn config_file(&self) -> PathBuf {
        self.root.join(CONFIG_FILE)
    }

    /// The blob store: `--blob-dir`, else `<data-dir>/blobs`.
    pub fn blobs(&self) -> PathBuf {
        self.blobs.clone().unwrap_or_else(|| self.root.join(BLOBS))
    }

    /// The binding areas (`/workspace`, outputs) and the binding id prefix of each.
    pub fn binding_areas(&self) -> [(PathBuf, &'static str); 2] {
        [
            (self.root.join(WORKSPACE_BINDINGS), "wsb_"),
            (self.root.join(OUTPUT_BINDINGS), "outb_"),
        ]
    }

    /// The memory stores (`<NAME>/` each).
    pub fn memory(&self) -> PathBuf {
        self.root.join(MEMORY)
    }

    /// The runs' memory-store stages (`<run>/` each).
    pub fn memory_stages(&self) -> PathBuf {
        self.memory().join(MEMORY_STAGES)
    }

    /// The directory whose `promoted/` is the file store (what `PromotedStore::open` takes):
    /// the blob dir when `--blob-dir` is set, so the files one host adds or promotes are
    /// found by the host that runs the session (a run may be claimed by any), else the data
    /// dir. The blob store's collection never looks there (it walks `sha256/` and `tmp/`).
    pub fn files_home(&self) -> PathBuf {
        self.blobs.clone().unwrap_or_else(|| self.root.clone())
    }

    /// The file store.
    pub fn promoted(&self) -> PathBuf {
        self.files_home().join(PROMOTED)
    }

    /// The operator key `omabox serve` generates when none is configured.
    pub fn operator_key(&self) -> PathBuf {
        self.root.join(OPERATOR_KEY)
    }

    /// The agent package cache: `configured` (the `agent_cache` setting, an absolute path)
    /// or `<data-dir>/agents`.
    pub fn agent_cache(&self, configured: Option<&Path>) -> PathBuf {
        configured.map_or_else(|| self.root.join(AGENTS), Path::to_path_buf)
    }

    /// Opens the store for a command that writes (`run`, `vault put`, `serve`, `gc`, …):
    /// creates the data directory and the database when they are missing. An existing
    /// database that is not a healthy omabox store, or a read-only data directory, is an
    /// error naming the file or directory and what to do (the store's errors say it; they
    /// are not wrapped again).
    pub async fn open_store(&self) -> anyhow::Result<SqliteStore> {
        let path = self.database();
        let store = tokio::task::spawn_blocking(move || {
            SqliteStore::open(&path).map_err(anyhow::Error::from)
        })
        .await
        .context("the store task failed")??;
        // Made just now, or by someone else just before: the same rules as for one found.
        check_own_dir(&self.root, &self.root)?;
        Ok(store)
    }

    /// Opens the store for a command that only reads: `None` when the data directory has no
    /// database yet (nothing is created then).
    pub async fn open_existing_store(&self) -> anyhow::Result<Option<SqliteStore>> {
        let path = self.database();
        tokio::task::spawn_blocking(move || {
            SqliteStore::open_if_exists(&path).map_err(anyhow::Error::from)
        })
        .await
        .context("the store task failed")?
    }

    /// What a read-only command says when the data directory has no database.
    pub fn no_data_yet(&self) -> String {
        format!(
            "no data yet in {}: nothing has run with this data directory (`omabox run` creates it)",
            self.root.display()
        )
    }
}

/// The state directory as the user named it: `explicit` (`--data-dir`, `OMABOX_DATA_DIR`
/// or the configuration file), else `$XDG_DATA_HOME/omabox`, else `~/.local/share/omabox`.
pub fn choose(
    explicit: Option<&Path>,
    xdg_data_home: Option<&OsStr>,
    home: Option<&OsStr>,
) -> anyhow::Result<PathBuf> {
    if let Some(dir) = explicit {
        if dir.as_os_str().is_empty() {
            anyhow::bail!("--data-dir is empty: name a directory");
        }
        return Ok(dir.to_path_buf());
    }
    if let Some(xdg) = xdg_data_home.filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(xdg).join("omabox"));
    }
    match home.filter(|value| !value.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".local/share/omabox")),
        None => anyhow::bail!(
            "cannot choose a data directory: neither XDG_DATA_HOME nor HOME is set; pass --data-dir DIR"
        ),
    }
}

/// The default image cache: `/var/lib/omabox/images` for root, otherwise
/// `$XDG_CACHE_HOME/omabox/images` (an absolute one), else `~/.cache/omabox/images`, else
/// `<tmp>/omabox/images` (the image crate's rule, with the node's settings as its inputs).
/// The `image_cache` setting replaces it.
pub fn default_image_cache(
    root: bool,
    xdg_cache_home: Option<&OsStr>,
    home: Option<&OsStr>,
    tmp: &Path,
) -> PathBuf {
    omabox_backend_linux::image::ImageCache::default_dir_for(root, xdg_cache_home, home, tmp)
}

/// The environment layers kept below `image_cache`.
pub fn env_layers(image_cache: &Path) -> PathBuf {
    image_cache.join(ENV_LAYERS)
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
/// directory `data_dir` names (as chosen, [`choose`]), inside it, or holds it: its store
/// keeps the vault's secrets and every session's state, and a sandbox must never read or
/// write them (`--workspace ~` would copy or bind the whole store). Nothing is created.
pub fn check_apart(flag: &str, dir: &Path, data_dir: &Path) -> anyhow::Result<()> {
    let Ok(data) = std::fs::canonicalize(data_dir) else {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_data_dir_is_named_explicitly_else_by_xdg_else_by_home() {
        let os = |s: &'static str| Some(OsStr::new(s));
        assert_eq!(
            choose(Some(Path::new("/d")), os("/x"), os("/h")).unwrap(),
            Path::new("/d")
        );
        assert_eq!(
            choose(None, os("/x"), os("/h")).unwrap(),
            Path::new("/x/omabox")
        );
        assert_eq!(
            choose(None, os(""), os("/h")).unwrap(),
            Path::new("/h/.local/share/omabox")
        );
        assert!(choose(Some(Path::new("")), None, os("/h")).is_err());
        let error = choose(None, None, None).unwrap_err().to_string();
        assert!(error.contains("pass --data-dir DIR"), "{error}");
    }

    #[test]
    fn the_image_cache_defaults_by_user() {
        let os = |s: &'static str| Some(OsStr::new(s));
        let tmp = Path::new("/tmp");
        assert_eq!(
            default_image_cache(true, os("/x"), os("/h"), tmp),
            Path::new("/var/lib/omabox/images")
        );
        assert_eq!(
            default_image_cache(false, os("/x"), os("/h"), tmp),
            Path::new("/x/omabox/images")
        );
        assert_eq!(
            default_image_cache(false, os("relative"), os("/h"), tmp),
            Path::new("/h/.cache/omabox/images")
        );
        assert_eq!(
            default_image_cache(false, None, None, tmp),
            Path::new("/tmp/omabox/images")
        );
        assert_eq!(env_layers(Path::new("/c")), Path::new("/c/env-layers"));
    }

    /// The crates that own a layout below the data dir use the names `DataDir` gives.
    #[test]
    fn the_layout_is_the_one_the_owning_crates_use() {
        let dir = tempfile::tempdir().unwrap();
        let data = DataDir::at(dir.path());
        omabox_persistence::BlobStore::new(data.root()).unwrap();
        assert!(data.blobs().join("sha256").is_dir());
        omabox_proxy::promoted::PromotedStore::open(data.root()).unwrap();
        assert!(data.promoted().is_dir());
        omabox_proxy::operator_key::load_or_create(data.root()).unwrap();
        assert!(data.operator_key().is_file());
        assert_eq!(data.database(), dir.path().join("omabox.db"));
        assert_eq!(data.memory_stages(), dir.path().join("memory/.pending"));
        assert_eq!(data.agent_cache(None), dir.path().join("agents"));
        assert_eq!(data.agent_cache(Some(Path::new("/a"))), Path::new("/a"));
    }
}
