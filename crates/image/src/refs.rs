//! The cache's reference index: which registry reference (`registry/repo:tag`) resolved
//! to which unpacked image, so `omabox image ls` shows names, a pinned pull finds its
//! image without the registry, and `prune` knows what is still named.
//!
//! `<cache>/refs.json`, rewritten whole (temp file + rename) under `locks/refs.lock`.
//! Must never hold a credential: only names, digests and times.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::digest::is_sha256_hex;
use crate::{CachedImage, ImageCache, ImageError};

/// One name in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageRef {
    /// `registry/repository[:tag][@digest]`.
    pub name: String,
    /// The image manifest it resolved to (`sha256:<hex>`), the cache entry's key.
    pub digest: String,
    /// The image index it was picked from, when the reference named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index_digest: Option<String>,
    /// When it was last resolved (ms since the epoch).
    pub resolved_at_ms: u64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RefIndex {
    version: u32,
    refs: BTreeMap<String, ImageRef>,
}

/// What [`ImageCache::remove_named`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Removal {
    /// Names taken out of the index.
    pub refs: Vec<String>,
    /// Unpacked images deleted (`sha256:<hex>`).
    pub images: Vec<String>,
}

impl ImageCache {
    /// Every name in the index, sorted.
    pub fn refs(&self) -> Result<Vec<ImageRef>, ImageError> {
        Ok(self.read_refs()?.refs.into_values().collect())
    }

    /// The image a pinned digest names, when the cache has it: the manifest itself, or
    /// the manifest a recorded image index resolved to.
    pub(crate) fn cached_digest(&self, digest: &str) -> Result<Option<String>, ImageError> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if is_sha256_hex(hex) && self.entry_dir(hex).join("rootfs").is_dir() {
            return Ok(Some(hex.to_owned()));
        }
        let refs = self.read_refs()?;
        Ok(refs
            .refs
            .values()
            .find(|r| r.index_digest.as_deref() == Some(digest))
            .and_then(|r| r.digest.strip_prefix("sha256:"))
            .filter(|hex| self.entry_dir(hex).join("rootfs").is_dir())
            .map(str::to_owned))
    }

    /// Records `name` → `digest` (replacing what the name pointed to before).
    pub(crate) fn record_ref(
        &self,
        name: &str,
        digest: &str,
        index_digest: Option<&str>,
    ) -> Result<(), ImageError> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        self.update_refs(|index| {
            index.refs.insert(
                name.to_owned(),
                ImageRef {
                    name: name.to_owned(),
                    digest: digest.to_owned(),
                    index_digest: index_digest.map(str::to_owned),
                    resolved_at_ms: now,
                },
            );
        })
    }

    /// Removes by name or by digest. A name (`registry/repo:tag` in any form docker
    /// accepts, or exactly as `image ls` prints it) leaves the index, and its image is
    /// deleted when no other name points to it; a digest (`sha256:<hex>`) deletes the
    /// image and every name pointing to it. An image a sandbox is starting on or reads
    /// (`removal.rs`) is refused before any name is removed.
    pub fn remove_named(&self, what: &str) -> Result<Removal, ImageError> {
        let mut removal = Removal::default();
        let hex = what.strip_prefix("sha256:").unwrap_or(what);
        if is_sha256_hex(hex) {
            let removing = self.removal(hex)?;
            let digest = format!("sha256:{hex}");
            self.update_refs(|index| {
                index.refs.retain(|name, r| {
                    let keep = r.digest != digest && r.index_digest.as_deref() != Some(&digest);
                    if !keep {
                        removal.refs.push(name.clone());
                    }
                    keep
                });
            })?;
            if removing.delete()? {
                removal.images.push(digest);
            } else if removal.refs.is_empty() {
                return Err(ImageError::NotCached(what.to_owned()));
            }
            return Ok(removal);
        }
        let canonical = crate::RegistryReference::parse(what)
            .map(|r| r.canonical())
            .unwrap_or_else(|_| what.to_owned());
        // The image the name's removal would delete is held (and checked) first.
        let index = self.read_refs()?;
        let mut removing = None;
        if let Some(r) = [canonical.as_str(), what]
            .into_iter()
            .find_map(|k| index.refs.get(k))
            && index.refs.values().filter(|o| o.digest == r.digest).count() == 1
            && let Some(hex) = r
                .digest
                .strip_prefix("sha256:")
                .filter(|h| is_sha256_hex(h))
        {
            removing = Some(self.removal(hex)?);
        }
        let mut orphaned = None;
        self.update_refs(|index| {
            let key = [canonical.as_str(), what]
                .into_iter()
                .find(|k| index.refs.contains_key(*k))
                .map(str::to_owned);
            if let Some(key) = key
                && let Some(r) = index.refs.remove(&key)
            {
                removal.refs.push(key);
                if !index.refs.values().any(|o| o.digest == r.digest) {
                    orphaned = Some(r.digest);
                }
            }
        })?;
        if removal.refs.is_empty() {
            return Err(ImageError::NotCached(what.to_owned()));
        }
        if let Some(digest) = orphaned {
            let hex = digest.strip_prefix("sha256:").unwrap_or(&digest);
            let deleted = match removing {
                Some(r) if r.hex() == hex => r.delete()?,
                // The index changed meanwhile: delete only what may go now; `prune`
                // takes the rest later.
                _ => match self.remove(&digest) {
                    Ok(deleted) => deleted,
                    Err(ImageError::Busy { .. } | ImageError::InUse { .. }) => false,
                    Err(e) => return Err(e),
                },
            };
            if deleted {
                removal.images.push(digest);
            }
        }
        Ok(removal)
    }

    /// Deletes every unpacked image no name in the index points to and no sandbox starts
    /// on or reads (local tarball and OCI-layout unpacks included: they are unpacked
    /// again from their file on next use), names whose image is gone, and leftover
    /// temporary entries of dead unpacks and pulls. Returns the images deleted.
    pub fn prune(&self) -> Result<Vec<CachedImage>, ImageError> {
        let mut named = std::collections::BTreeSet::new();
        self.update_refs(|index| {
            index.refs.retain(|_, r| {
                let hex = r.digest.strip_prefix("sha256:").unwrap_or(&r.digest);
                is_sha256_hex(hex) && self.entry_dir(hex).join("rootfs").is_dir()
            });
            named.extend(index.refs.values().map(|r| r.digest.clone()));
        })?;
        let mut removed = Vec::new();
        for image in self.list()? {
            let hex = image
                .digest
                .strip_prefix("sha256:")
                .unwrap_or(&image.digest);
            if named.contains(&image.digest) || !is_sha256_hex(hex) {
                continue;
            }
            match self.removal(hex) {
                Ok(removing) => {
                    if removing.delete()? {
                        removed.push(image);
                    }
                }
                Err(ImageError::Busy { .. } | ImageError::InUse { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        self.sweep_temps()?;
        Ok(removed)
    }

    fn read_refs(&self) -> Result<RefIndex, ImageError> {
        let path = self.dir().join("refs.json");
        match fs::read(&path) {
            Ok(text) => serde_json::from_slice(&text).map_err(|e| ImageError::Cache {
                path: path.clone(),
                reason: format!("the reference index is corrupt: {e}"),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(RefIndex {
                version: 1,
                refs: BTreeMap::new(),
            }),
            Err(e) => Err(ImageError::io(&path, e)),
        }
    }

    fn update_refs(&self, change: impl FnOnce(&mut RefIndex)) -> Result<(), ImageError> {
        let _lock = self.lock("refs")?;
        let mut index = self.read_refs()?;
        index.version = 1;
        change(&mut index);
        let path = self.dir().join("refs.json");
        let tmp = self
            .dir()
            .join("tmp")
            .join(format!("refs.{}.0", std::process::id()));
        let json = serde_json::to_vec_pretty(&index).unwrap_or_default();
        write_new(&tmp, &json)?;
        fs::rename(&tmp, &path).map_err(|e| ImageError::write(&path, e))
    }
}

fn write_new(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = fs::remove_file(path);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| ImageError::write(path, e))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| ImageError::write(path, e))
}
