//! The cache's locks (`locks/*.lock`, flock(2)) and its temporary entries (`tmp/`), and
//! the sweep that removes the temporary entries of processes that died (`kill -9`, power
//! loss) — run by `omabox image prune` and by `omabox reap`'s leftover sweep.
//!
//! Every temporary entry is covered by a lock its maker holds for as long as the entry
//! may be in use, so the sweep needs no pid and no age: it takes that lock without
//! waiting, and only if it gets it is the entry a dead process's.
//!
//! | entry in `tmp/`            | made by                 | covered by (held while in use)          |
//! |----------------------------|-------------------------|-----------------------------------------|
//! | `<hex>.<pid>.<n>`          | an unpack, a removal    | `locks/<hex>.lock`, exclusive           |
//! | `pull-<hex>.<pid>.<n>`     | a pull's download       | `locks/pull-<hex>.lock`, shared         |
//! | `refs.<pid>.0`             | a `refs.json` rewrite   | `locks/refs.lock`, exclusive            |
//!
//! Must never: remove an entry whose lock someone holds, wait for a lock while sweeping,
//! follow a symlink in `tmp/`, or remove a name it does not know.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::digest::is_sha256_hex;
use crate::{ImageCache, ImageError};

impl ImageCache {
    /// Takes `locks/<name>.lock` exclusively, waiting for it.
    pub(crate) fn lock(&self, name: &str) -> Result<File, ImageError> {
        self.prepare()?;
        let (file, path) = self.open_lock(name)?;
        file.lock().map_err(|e| ImageError::write(&path, e))?;
        Ok(file)
    }

    /// Takes `locks/<name>.lock` shared, waiting for it.
    pub(crate) fn lock_shared(&self, name: &str) -> Result<File, ImageError> {
        self.prepare()?;
        let (file, path) = self.open_lock(name)?;
        file.lock_shared()
            .map_err(|e| ImageError::write(&path, e))?;
        Ok(file)
    }

    /// Takes `locks/<name>.lock` exclusively if nobody holds it; `None` if someone does.
    pub(crate) fn try_lock(&self, name: &str) -> Result<Option<File>, ImageError> {
        let (file, path) = self.open_lock(name)?;
        match file.try_lock() {
            Ok(()) => Ok(Some(file)),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(ImageError::write(&path, e)),
        }
    }

    fn open_lock(&self, name: &str) -> Result<(File, PathBuf), ImageError> {
        let path = self.dir().join("locks").join(format!("{name}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ImageError::write(&path, e))?;
        Ok((file, path))
    }

    /// Removes the temporary entries of dead processes (module doc); returns them. A
    /// cache that does not exist has none.
    pub fn sweep_temps(&self) -> Result<Vec<PathBuf>, ImageError> {
        let tmp = self.dir().join("tmp");
        let entries = match fs::read_dir(&tmp) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io(&tmp, e)),
        };
        let mut removed = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(&tmp, e))?;
            let Some(lock) = entry.file_name().to_str().and_then(covering_lock) else {
                continue;
            };
            let Some(_held) = self.try_lock(&lock)? else {
                continue; // its maker is alive
            };
            let path = entry.path();
            // remove_dir_all does not follow symlinks inside the tree (nor this one).
            let gone = match fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(&path),
                Ok(_) => fs::remove_file(&path),
                Err(e) => Err(e),
            };
            match gone {
                Ok(()) => removed.push(path),
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(ImageError::write(&path, e)),
            }
        }
        removed.sort();
        Ok(removed)
    }

    /// Removes entries of `hex` in `tmp/` left by a process that died mid-way; the
    /// caller holds `locks/<hex>.lock`, so none of them is in use.
    pub(crate) fn remove_stale_temps(&self, hex: &str) {
        let Ok(entries) = fs::read_dir(self.dir().join("tmp")) else {
            return;
        };
        let prefix = format!("{hex}.");
        for entry in entries.flatten() {
            if entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(&prefix))
            {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// The lock (name below `locks/`) that covers a `tmp/` entry, if the name is one of ours.
fn covering_lock(name: &str) -> Option<String> {
    let (stem, rest) = name.split_once('.')?;
    if rest.is_empty() {
        return None;
    }
    if stem == "refs" {
        return Some("refs".into());
    }
    if let Some(hex) = stem.strip_prefix("pull-") {
        return is_sha256_hex(hex).then(|| format!("pull-{hex}"));
    }
    is_sha256_hex(stem).then(|| stem.to_owned())
}

/// `tmp_root/<name>.<pid>.<n>`, a name this process has not used yet.
fn fresh(tmp_root: &Path, name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    tmp_root.join(format!(
        "{name}.{}.{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ))
}

/// A temporary cache entry, removed on drop unless defused.
pub(crate) struct TempEntry {
    pub(crate) path: PathBuf,
    armed: bool,
}

impl TempEntry {
    /// `tmp_root/<name>.<pid>.<n>`, mode 0700. The caller holds the lock that covers
    /// `name` (module doc).
    pub(crate) fn create(tmp_root: &Path, name: &str) -> Result<Self, ImageError> {
        let path = fresh(tmp_root, name);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| ImageError::write(&path, e))?;
        Ok(Self { path, armed: true })
    }

    /// Renames `from` to a fresh `tmp_root/<name>.<pid>.<n>` and owns it there (removed
    /// on drop); `None` if `from` does not exist.
    pub(crate) fn take(
        tmp_root: &Path,
        name: &str,
        from: &Path,
    ) -> Result<Option<Self>, ImageError> {
        let path = fresh(tmp_root, name);
        match fs::rename(from, &path) {
            Ok(()) => Ok(Some(Self { path, armed: true })),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(ImageError::write(from, e)),
        }
    }

    pub(crate) fn defuse(mut self) {
        self.armed = false;
    }
}

impl Drop for TempEntry {
    fn drop(&mut self) {
        if self.armed {
            // remove_dir_all does not follow symlinks inside the tree.
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_entries_whose_lock_nobody_holds_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(dir.path().join("cache"));
        cache.prepare().unwrap();
        let tmp = cache.dir().join("tmp");
        let hex = "a".repeat(64);
        let names = [
            format!("{hex}.1.0"),
            format!("pull-{hex}.1.0"),
            "refs.1.0".to_owned(),
            "unknown.1.0".to_owned(),
            format!("pull-{}.1.0", "z".repeat(64)),
        ];
        let make = || {
            for name in &names {
                fs::create_dir_all(tmp.join(name).join("blobs")).unwrap();
            }
        };
        make();
        // Live makers: every covering lock held (the unpack's and refs' exclusive, the
        // pull's shared).
        let held = [
            cache.lock(&hex).unwrap(),
            cache.lock_shared(&format!("pull-{hex}")).unwrap(),
            cache.lock("refs").unwrap(),
        ];
        assert!(cache.sweep_temps().unwrap().is_empty());
        drop(held);
        let removed = cache.sweep_temps().unwrap();
        assert_eq!(
            removed,
            [
                tmp.join(format!("{hex}.1.0")),
                tmp.join(format!("pull-{hex}.1.0")),
                tmp.join("refs.1.0")
            ]
        );
        // Names that are not ours stay.
        assert!(tmp.join("unknown.1.0").is_dir());
        assert!(tmp.join(format!("pull-{}.1.0", "z".repeat(64))).is_dir());
        // No cache: nothing to do.
        assert!(
            ImageCache::new(dir.path().join("none"))
                .sweep_temps()
                .unwrap()
                .is_empty()
        );
    }
}
