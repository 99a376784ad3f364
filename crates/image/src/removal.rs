//! Deleting an image atomically against sandboxes that start on it.
//!
//! A start holds the image from the moment it is resolved until its sandbox has recorded
//! the roots it reads (the linux backend's `roots.json`, read back through the cache's
//! user source): resolving takes `locks/use-<hex>.lock` shared and hands it out as an
//! [`ImageHold`] inside the [`ResolvedImage`](crate::ResolvedImage). A removal
//! (`remove`, `remove_named`, `prune`):
//!
//! 1. takes `locks/use-<hex>.lock` exclusively *without waiting*: a start between its
//!    resolution and its record refuses the removal ([`ImageError::Busy`]);
//! 2. only then asks the user source who reads the image: every start that let go
//!    before has recorded its roots, so a sandbox using the image is seen
//!    ([`ImageError::InUse`]); a source that cannot tell refuses the removal;
//! 3. takes the digest's lock (unpackers') and renames the entry into `tmp/` before
//!    deleting it, so no reader, and no crash half-way, ever sees part of a tree under
//!    `sha256/` (a crash leaves a `tmp/` entry `sweep_temps` removes).
//!
//! A start that resolves after the removal finds nothing and unpacks (or pulls) afresh.
//! Must never: wait for a start, delete without both locks, or guess when the user
//! source fails.

use std::fmt;
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;

use crate::digest::is_sha256_hex;
use crate::locks::TempEntry;
use crate::{ImageCache, ImageError};

/// Keeps an image from being removed while held (module doc). Clones share the hold;
/// the last one dropped lets go.
#[derive(Clone)]
pub struct ImageHold {
    _lock: Arc<File>,
    digest: String,
}

impl fmt::Debug for ImageHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageHold")
            .field("digest", &self.digest)
            .finish()
    }
}

/// What the user source answers: (sandbox, directory it reads), or why it cannot tell.
pub type UserList = Result<Vec<(String, PathBuf)>, String>;

/// Who reads the cache's images, asked at removal time.
#[derive(Clone, Default)]
pub(crate) struct Users(Option<Arc<dyn Fn() -> UserList + Send + Sync>>);

impl fmt::Debug for Users {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Users(source)"
        } else {
            "Users(none)"
        })
    }
}

/// A removal in progress: both locks held (module doc, steps 1–3).
pub(crate) struct Removing<'a> {
    cache: &'a ImageCache,
    hex: String,
    _use: File,
    _lock: File,
}

impl ImageCache {
    /// The same cache, told which directories running sandboxes read (sandbox id, path):
    /// a fixed list. See [`Self::with_user_source`].
    pub fn with_users(self, users: Vec<(String, PathBuf)>) -> Self {
        self.with_user_source(move || Ok(users.clone()))
    }

    /// The same cache, asking `source` which directories sandboxes read (sandbox id,
    /// path) whenever a removal holds an image: [`Self::remove`] and
    /// [`Self::remove_named`] then refuse to delete such an image
    /// ([`ImageError::InUse`]) and [`Self::prune`] keeps it.
    pub fn with_user_source(
        mut self,
        source: impl Fn() -> UserList + Send + Sync + 'static,
    ) -> Self {
        self.users = Users(Some(Arc::new(source)));
        self
    }

    /// Holds image `hex` (module doc).
    pub(crate) fn hold(&self, hex: &str) -> Result<ImageHold, ImageError> {
        Ok(ImageHold {
            _lock: Arc::new(self.lock_shared(&format!("use-{hex}"))?),
            digest: format!("sha256:{hex}"),
        })
    }

    /// The sandbox reading image `hex`, if any (compared as canonical paths).
    fn user_of(&self, hex: &str) -> Result<Option<String>, ImageError> {
        let Some(source) = &self.users.0 else {
            return Ok(None);
        };
        let users = source().map_err(|reason| ImageError::Cache {
            path: self.dir().to_path_buf(),
            reason: format!("cannot tell which sandboxes use sha256:{hex}: {reason}"),
        })?;
        let rootfs = self.entry_dir(hex).join("rootfs");
        let canonical = std::fs::canonicalize(&rootfs).unwrap_or(rootfs);
        Ok(users
            .into_iter()
            .find(|(_, path)| {
                std::fs::canonicalize(path).unwrap_or_else(|_| path.clone()) == canonical
            })
            .map(|(sandbox, _)| sandbox))
    }

    /// Steps 1 and 2 of the module doc, then the digest's lock: a removal that may go
    /// ahead, or why not.
    pub(crate) fn removal(&self, hex: &str) -> Result<Removing<'_>, ImageError> {
        let digest = format!("sha256:{hex}");
        self.prepare()?;
        let held = self.try_lock(&format!("use-{hex}"))?;
        let Some(use_lock) = held else {
            return Err(ImageError::Busy { digest });
        };
        if let Some(sandbox) = self.user_of(hex)? {
            return Err(ImageError::InUse { digest, sandbox });
        }
        let lock = self.lock(hex)?;
        Ok(Removing {
            cache: self,
            hex: hex.to_owned(),
            _use: use_lock,
            _lock: lock,
        })
    }

    /// Deletes one unpacked image (`sha256:<hex>`) unless a sandbox is starting on it
    /// ([`ImageError::Busy`]) or reads it ([`ImageError::InUse`]). Returns whether it
    /// was there.
    pub fn remove(&self, digest: &str) -> Result<bool, ImageError> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if !is_sha256_hex(hex) {
            return Err(ImageError::Unsupported(format!(
                "{digest:?} is not a sha256 digest"
            )));
        }
        self.removal(hex)?.delete()
    }
}

impl Removing<'_> {
    /// The image's hex digest.
    pub(crate) fn hex(&self) -> &str {
        &self.hex
    }

    /// Step 3: renames the entry away, then deletes it. Whether it was there.
    pub(crate) fn delete(self) -> Result<bool, ImageError> {
        let entry = self.cache.entry_dir(&self.hex);
        let tmp = self.cache.dir().join("tmp");
        match TempEntry::take(&tmp, &self.hex, &entry)? {
            Some(taken) => {
                drop(taken); // removes it
                Ok(true)
            }
            None => Ok(false),
        }
    }
}
