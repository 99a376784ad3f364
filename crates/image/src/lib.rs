//! Root filesystem images for omabox's backends: a local rootfs directory, rootfs
//! tarball, OCI image layout or registry image turned into a directory a sandbox uses as
//! the read-only lower layer of its overlay root. Depends on nothing of omabox's.
//!
//! An image value is either an existing local path (the table below) or a registry
//! reference ([`ImageSource::parse`]); a registry image is pulled (`registry.rs` over
//! `distribution.rs`, omabox's own distribution client: realms and redirects under
//! `net_policy.rs`, every body capped while it streams, a deadline and a stall rule;
//! every blob verified while it streams into a temporary OCI layout in the cache) and
//! then unpacked exactly like a local OCI image layout. Registry
//! credentials come from a [`CredentialSource`] (docker's `config.json`, or any the caller chains)
//! and are never logged, cached or put into an error.
//!
//! # What [`ImageCache::resolve`] accepts
//!
//! | reference | detected by | result |
//! |-----------|-------------|--------|
//! | a directory without `oci-layout` | `stat` | the directory itself, never copied or written |
//! | a tar archive, plain or gzip | magic bytes (`ustar` at offset 257; `1f 8b` then `ustar` inside), not the file name | unpacked once into `<cache>/sha256/<sha256 of the file>/rootfs` |
//! | an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/…`) | the `oci-layout` file | the manifest for this host's platform (or the only one) unpacked once into `<cache>/sha256/<manifest digest>/rootfs`, layers applied in order with whiteouts |
//!
//! zstd, xz and bzip2 compression and non-sha256 digests are refused with a clear error.
//!
//! # Cache layout
//!
//! ```text
//! <cache>/                       mode 0700, must be owned by the caller and not group/world writable
//!   sha256/<hex>/rootfs/         an unpacked image (published by one rename, never changed after)
//!   sha256/<hex>/image.json      what it was unpacked from (kind, reference, digest)
//!   refs.json                    registry name -> manifest digest (`refs.rs`)
//!   locks/<hex>.lock             flock(2) serializing unpackers and removers of one digest
//!   locks/pull-<hex>.lock        flock(2), shared by the pulls downloading that manifest
//!   locks/refs.lock              flock(2) serializing writers of refs.json
//!   tmp/<hex>.<pid>.<n>/         an unpack in progress; removed on failure, and by the
//!                                next unpacker of the same digest after a crash
//!   tmp/pull-<hex>.<pid>.<n>/    a pull's OCI layout being downloaded (removed when the
//!                                pull ends, whatever the outcome)
//! ```
//!
//! A temporary entry a killed process left is removed by [`ImageCache::sweep_temps`]
//! (`omabox image prune`, `omabox reap`) once nobody holds the lock that covers it
//! (`locks.rs`), never while its maker lives.
//!
//! A registry image's entry is keyed by its image manifest's digest, like an OCI
//! layout's. Two processes pulling the same image download it twice into their own
//! temporary layouts and unpack it once (the digest's lock); neither sees a partial
//! entry.
//!
//! An entry is keyed by content (the tarball's bytes, the OCI manifest's digest), so a
//! changed tarball is a new entry and an unchanged one is never unpacked twice. Nothing
//! is evicted automatically; [`ImageCache::list`] shows the entries and
//! [`ImageCache::remove`] deletes one, atomically against sandboxes starting on it: a
//! resolved image is held ([`ImageHold`]) until its sandbox recorded its roots, and a
//! removal asks the cache's user source who reads it only once it holds the image
//! (`removal.rs`).
//!
//! # Unpacking untrusted archives
//!
//! The host does not trust an image. The unpacker is the only writer of its private
//! temporary directory and:
//!
//! - refuses entries with absolute paths or `..` components, and hard-link targets alike;
//! - checks with `lstat` that every ancestor of an entry is a real directory inside the
//!   rootfs, so it never writes, links or deletes through a symlink (an entry below a
//!   symlink is refused, even when the symlink points inside the image);
//!   creates files with `O_CREAT|O_EXCL|O_NOFOLLOW` after removing what was there;
//! - never follows a symlink of the image (their targets are only resolved inside the
//!   sandbox, after `pivot_root`);
//! - skips character and block device nodes (the sandbox's `/dev` is built separately
//!   and `nodev` would make them inert anyway); FIFOs are kept;
//! - ignores extended attributes (so file capabilities are not restored);
//! - keeps numeric owners (when running as root) and modes, setuid and setgid bits
//!   included, as Docker does: the sandbox mounts its overlay root `nosuid`, and
//!   `no_new_privs` plus the locked securebits would make them inert anyway;
//! - verifies every OCI blob against its digest and size (JSON blobs before parsing,
//!   layers while they stream through the unpacker; a mismatch discards the whole
//!   unpack, so nothing unverified is ever published), and a tarball against the
//!   digest it was keyed by.
//!
//! - stops past [`UnpackLimits`] (bytes of file data, entries, 512 layers) and caps what
//!   the tar parser may hold for one entry's headers at 1 MiB (`limits.rs`).
//!
//! Disk use is bounded only by those limits (64 GiB by default).

#![forbid(unsafe_code)]

use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

mod cred_helper;
mod credentials;
mod digest;
mod distribution;
mod escape;
mod fault;
mod limits;
mod locks;
mod net_policy;
mod oci;
mod reference;
mod refs;
mod registry;
mod removal;
mod unpack;

pub use credentials::{
    CredentialChain, CredentialSource, DockerConfig, RegistryCredential, StaticCredentials,
};
pub use limits::{MAX_BYTES_ENV, MAX_ENTRIES_ENV, UnpackLimits};
pub use net_policy::{ALLOWED_HOSTS_ENV, AllowedHost, BUILT_IN as BUILT_IN_ALLOWED_HOSTS};
pub use reference::{ImageSource, RegistryReference};
pub use refs::{ImageRef, Removal};
pub use registry::{
    INSECURE_REGISTRIES_ENV, NoProgress, PULL_TIMEOUT_ENV, PullProgress, PullTimeouts, PulledImage,
    RegistryConfig, STALL_TIMEOUT_ENV,
};
pub use removal::{ImageHold, UserList};

use digest::{sha256_file, sha256_hex_of};
use locks::TempEntry;
use oci::OciLayout;
use unpack::{Compression, sniff, unpack_tarball};

/// Largest JSON blob (index, manifest) read into memory.
const MAX_JSON_BLOB: u64 = 4 << 20;
/// How deep nested image indexes may go.
const MAX_INDEX_DEPTH: usize = 4;
/// Most layers an image may have (Docker's own limit is 127).
const MAX_LAYERS: usize = 512;
const OPAQUE_WHITEOUT: &[u8] = b".wh..wh..opq";
const WHITEOUT_PREFIX: &[u8] = b".wh.";

/// What an image reference names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ImageKind {
    /// An unpacked rootfs directory, used as is.
    Directory,
    /// A tar archive of a rootfs, plain or gzip-compressed.
    Tarball,
    /// An OCI image layout directory.
    OciLayout,
    /// An image pulled from a registry.
    Registry,
}

impl ImageKind {
    /// Tells what `path` is from its type and its first bytes (never its name).
    pub fn detect(path: &Path) -> Result<Self, ImageError> {
        let meta = fs::metadata(path).map_err(|e| ImageError::io(path, e))?;
        if meta.is_dir() {
            return Ok(if path.join("oci-layout").is_file() {
                Self::OciLayout
            } else {
                Self::Directory
            });
        }
        if !meta.is_file() {
            return Err(ImageError::Unrecognized(path.to_path_buf()));
        }
        let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
        match sniff(&mut BufReader::new(&file)).map_err(|e| ImageError::io(path, e))? {
            Compression::None => Ok(Self::Tarball),
            Compression::Gzip => {
                // Look inside: a gzip file is a tarball only if it holds a tar archive.
                let mut head = Vec::with_capacity(512);
                flate2::read::MultiGzDecoder::new(
                    File::open(path).map_err(|e| ImageError::io(path, e))?,
                )
                .take(512)
                .read_to_end(&mut head)
                .map_err(|e| ImageError::io(path, e))?;
                if head.len() >= 262 && &head[257..262] == b"ustar" {
                    Ok(Self::Tarball)
                } else {
                    Err(ImageError::Unrecognized(path.to_path_buf()))
                }
            }
            Compression::Unsupported(what) => Err(ImageError::Unsupported(format!(
                "{} is {what}-compressed; only plain and gzip-compressed tar archives are supported",
                path.display()
            ))),
            Compression::NotTar => Err(ImageError::Unrecognized(path.to_path_buf())),
        }
    }

    /// Name used in messages and `image.json`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Directory => "rootfs directory",
            Self::Tarball => "rootfs tarball",
            Self::OciLayout => "OCI image layout",
            Self::Registry => "registry image",
        }
    }
}

/// An image ready to be the sandbox's overlay lower layer.
#[derive(Debug, Clone)]
pub struct ResolvedImage {
    /// Absolute, symlink-free path of the unpacked rootfs.
    pub rootfs_dir: PathBuf,
    /// `sha256:<hex>` of the tarball or of the OCI manifest; `None` for a directory.
    pub digest: Option<String>,
    /// What the reference was.
    pub kind: ImageKind,
    /// Whether this call unpacked it (`false`: it was in the cache already, or a
    /// directory).
    pub unpacked: bool,
    /// Keeps the cached image from being removed: keep it until the sandbox that uses
    /// the image has recorded its roots (`None` for a directory, which is never removed).
    pub hold: Option<ImageHold>,
}

/// One unpacked image in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedImage {
    /// `sha256:<hex>`.
    pub digest: String,
    /// What it was unpacked from.
    pub kind: ImageKind,
    /// What it was first unpacked from (informational): a path, or a registry
    /// reference.
    pub source: String,
    /// Bytes of the unpacked tree (file sizes; 0 for entries made before it was
    /// recorded).
    #[serde(default)]
    pub size_bytes: u64,
    /// The unpacked rootfs.
    #[serde(skip)]
    pub rootfs_dir: PathBuf,
}

/// Why an image could not be resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Reading the image failed.
    #[error("cannot read image {}", escape::path(path))]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// Neither a directory, an OCI image layout nor a tar archive.
    #[error(
        "{} is not a rootfs directory, an OCI image layout or a (gzip-compressed) tar archive",
        .0.display()
    )]
    Unrecognized(PathBuf),
    /// A format this build does not take.
    #[error("{0}")]
    Unsupported(String),
    /// An archive entry that would escape the rootfs or write through a symlink (the
    /// entry's name escaped, see `escape.rs`).
    #[error("unsafe image entry \"{entry}\": {reason}")]
    UnsafeEntry {
        /// The entry's path as written in the archive.
        entry: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A tar stream that cannot be read.
    #[error("malformed tar archive{}", context_suffix(.context))]
    Tar {
        /// Which layer, if any.
        context: String,
        /// The parser's error.
        #[source]
        source: io::Error,
    },
    /// A blob whose content does not match its digest or size.
    #[error(
        "OCI blob {expected} does not match its descriptor ({actual}): the image is corrupt or was tampered with"
    )]
    DigestMismatch {
        /// The digest the descriptor names.
        expected: String,
        /// What was found instead.
        actual: String,
    },
    /// A tarball changed between hashing and unpacking.
    #[error("{} changed while it was being unpacked", .0.display())]
    Changed(PathBuf),
    /// An OCI image layout that does not follow the spec.
    #[error("invalid OCI image layout {}: {reason}", path.display())]
    InvalidLayout {
        /// The layout directory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// No manifest for this platform.
    #[error("OCI image layout {} has no image for {platform} (it has: {available})", path.display())]
    NoManifest {
        /// The layout directory.
        path: PathBuf,
        /// `os/arch` looked for.
        platform: String,
        /// What the index lists.
        available: String,
    },
    /// Writing the unpacked tree failed.
    #[error("cannot unpack {}", escape::path(path))]
    Write {
        /// The path written.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// An image value that is neither an existing path nor a valid registry reference.
    #[error("invalid image reference {value:?}: {reason}")]
    BadReference {
        /// The value as given.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Talking to the registry failed (never carries a credential).
    #[error("cannot pull {reference}: {reason}")]
    Registry {
        /// The canonical reference.
        reference: String,
        /// What failed.
        reason: String,
    },
    /// A name or digest the cache does not have.
    #[error("{0} is not in the image cache")]
    NotCached(String),
    /// An image a sandbox is starting on: resolved, its roots not recorded yet
    /// (`removal.rs`).
    #[error(
        "{digest} is in use by a sandbox that is starting: not removed (try again once it runs, then stop it first)"
    )]
    Busy {
        /// The image.
        digest: String,
    },
    /// An image a sandbox reads (see [`ImageCache::with_user_source`]).
    #[error(
        "{digest} is in use by sandbox {sandbox}: stop it first (or `omabox reap` it if its host is gone)"
    )]
    InUse {
        /// The image.
        digest: String,
        /// The sandbox reading it.
        sandbox: String,
    },
    /// An image larger than a limit allows (bytes, entries, layers, a tar header).
    #[error("{0}")]
    Limit(String),
    /// A setting (an env value) that cannot be used.
    #[error("{key}={value:?} is invalid: {reason}")]
    BadSetting {
        /// The env key.
        key: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The cache directory cannot be used.
    #[error("image cache {}: {reason}", path.display())]
    Cache {
        /// The cache path.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

fn context_suffix(context: &str) -> String {
    if context.is_empty() {
        String::new()
    } else {
        format!(" ({context})")
    }
}

impl ImageError {
    fn io(path: &Path, source: io::Error) -> Self {
        Self::Read {
            path: path.to_path_buf(),
            source,
        }
    }

    fn write(path: &Path, source: io::Error) -> Self {
        Self::Write {
            path: path.to_path_buf(),
            source,
        }
    }

    fn unsafe_entry(entry: &Path, reason: impl Into<String>) -> Self {
        Self::UnsafeEntry {
            entry: escape::path(entry),
            reason: escape::untrusted(&reason.into(), 4096),
        }
    }

    /// Whether the image itself is at fault (bad format, unsafe or tampered content),
    /// as opposed to the host (I/O, the cache directory).
    pub fn is_bad_image(&self) -> bool {
        !matches!(
            self,
            Self::Read { .. }
                | Self::Write { .. }
                | Self::Cache { .. }
                | Self::Registry { .. }
                | Self::NotCached(_)
                | Self::BadSetting { .. }
                | Self::Busy { .. }
                | Self::InUse { .. }
        )
    }
}

/// The content-addressed cache of unpacked images (layout in the module doc).
#[derive(Debug, Clone)]
pub struct ImageCache {
    dir: PathBuf,
    /// Who reads which image: images in use are never deleted (`removal.rs`).
    users: removal::Users,
    /// What one image may unpack to.
    limits: UnpackLimits,
}

impl ImageCache {
    /// A cache rooted at `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            users: removal::Users::default(),
            limits: UnpackLimits::default(),
        }
    }

    /// The same cache, unpacking images within `limits` (bytes, entries).
    pub fn with_limits(mut self, limits: UnpackLimits) -> Self {
        self.limits = limits;
        self
    }

    /// The default cache directory: `/var/lib/omabox/images` for `root`, otherwise
    /// `<xdg_cache_home>/omabox/images` (an absolute one), else `<home>/.cache/omabox/images`,
    /// else `<tmp>/omabox/images`.
    pub fn default_dir_for(
        root: bool,
        xdg_cache_home: Option<&std::ffi::OsStr>,
        home: Option<&std::ffi::OsStr>,
        tmp: &Path,
    ) -> PathBuf {
        if root {
            return PathBuf::from("/var/lib/omabox/images");
        }
        let base = xdg_cache_home
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| home.map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(|| tmp.to_path_buf());
        base.join("omabox/images")
    }

    /// The cache directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Turns an image reference (an absolute or relative local path) into a rootfs
    /// directory, unpacking it into the cache unless it is there already. Blocking; may
    /// take long the first time. Concurrent callers (threads or processes) for the same
    /// image wait for one another and unpack it once.
    pub fn resolve(&self, reference: &Path) -> Result<ResolvedImage, ImageError> {
        let kind = ImageKind::detect(reference)?;
        match kind {
            ImageKind::Registry => Err(ImageError::Unrecognized(reference.to_path_buf())),
            ImageKind::Directory => Ok(ResolvedImage {
                rootfs_dir: fs::canonicalize(reference)
                    .map_err(|e| ImageError::io(reference, e))?,
                digest: None,
                kind,
                unpacked: false,
                hold: None,
            }),
            ImageKind::Tarball => {
                let hex = sha256_file(reference)?;
                self.fill(&hex, kind, &source_of(reference), |rootfs| {
                    unpack_tarball(reference, &hex, rootfs, self.limits)
                })
            }
            ImageKind::OciLayout => {
                let layout = OciLayout::open(reference)?;
                let manifest = layout.select_manifest()?;
                let hex = sha256_hex_of(&manifest).map_err(|reason| layout.invalid(reason))?;
                self.fill(&hex, kind, &source_of(reference), |rootfs| {
                    layout.unpack(&manifest, rootfs, self.limits)
                })
            }
        }
    }

    /// Every unpacked image in the cache.
    pub fn list(&self) -> Result<Vec<CachedImage>, ImageError> {
        let root = self.dir.join("sha256");
        let entries = match fs::read_dir(&root) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ImageError::io(&root, e)),
        };
        let mut images = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::io(&root, e))?;
            let meta_path = entry.path().join("image.json");
            let Ok(text) = fs::read(&meta_path) else {
                continue;
            };
            if let Ok(mut image) = serde_json::from_slice::<CachedImage>(&text) {
                image.rootfs_dir = entry.path().join("rootfs");
                images.push(image);
            }
        }
        images.sort_by(|a, b| a.digest.cmp(&b.digest));
        Ok(images)
    }

    /// Returns the cached rootfs for `hex`, unpacking it with `unpack` under the digest's
    /// lock when missing.
    fn fill(
        &self,
        hex: &str,
        kind: ImageKind,
        source: &str,
        unpack: impl FnOnce(&Path) -> Result<(), ImageError>,
    ) -> Result<ResolvedImage, ImageError> {
        let entry = self.entry_dir(hex);
        let rootfs = entry.join("rootfs");
        self.prepare()?;
        // Held from here until the caller's sandbox has recorded its roots (`removal.rs`).
        let hold = self.hold(hex)?;
        let done = |unpacked| {
            Ok(ResolvedImage {
                rootfs_dir: fs::canonicalize(&rootfs).map_err(|e| ImageError::io(&rootfs, e))?,
                digest: Some(format!("sha256:{hex}")),
                kind,
                unpacked,
                hold: Some(hold.clone()),
            })
        };
        if rootfs.is_dir() {
            return done(false);
        }
        let _lock = self.lock(hex)?;
        if rootfs.is_dir() {
            return done(false); // another process unpacked it while we waited
        }
        self.remove_stale_temps(hex);
        let tmp = TempEntry::create(&self.dir.join("tmp"), hex)?;
        let tmp_rootfs = tmp.path.join("rootfs");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&tmp_rootfs)
            .map_err(|e| ImageError::write(&tmp_rootfs, e))?;
        unpack(&tmp_rootfs)?;
        let meta = CachedImage {
            digest: format!("sha256:{hex}"),
            kind,
            source: source.to_owned(),
            size_bytes: tree_size(&tmp_rootfs),
            rootfs_dir: PathBuf::new(),
        };
        let meta_path = tmp.path.join("image.json");
        let json = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        fs::write(&meta_path, json).map_err(|e| ImageError::write(&meta_path, e))?;
        fs::rename(&tmp.path, &entry).map_err(|e| ImageError::write(&entry, e))?;
        tmp.defuse();
        done(true)
    }

    fn entry_dir(&self, hex: &str) -> PathBuf {
        self.dir.join("sha256").join(hex)
    }

    /// Creates the cache directories and checks that nobody else can write into them
    /// (another user could otherwise plant an "unpacked image").
    fn prepare(&self) -> Result<(), ImageError> {
        let cache_err = |reason: String| ImageError::Cache {
            path: self.dir.clone(),
            reason,
        };
        if !self.dir.is_absolute() {
            return Err(cache_err("must be an absolute path".into()));
        }
        if let Some(parent) = self.dir.parent() {
            fs::create_dir_all(parent).map_err(|e| cache_err(format!("cannot create it: {e}")))?;
        }
        match fs::DirBuilder::new().mode(0o700).create(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(cache_err(format!("cannot create it: {e}"))),
        }
        let meta = fs::symlink_metadata(&self.dir).map_err(|e| cache_err(e.to_string()))?;
        let euid = rustix::process::geteuid().as_raw();
        if !meta.is_dir() {
            return Err(cache_err("is not a directory (or is a symlink)".into()));
        }
        if meta.uid() != euid || meta.mode() & 0o022 != 0 {
            return Err(cache_err(format!(
                "must be a directory owned by uid {euid} and not writable by group or others (it is uid {}, mode {:o})",
                meta.uid(),
                meta.mode() & 0o7777
            )));
        }
        for sub in ["sha256", "locks", "tmp"] {
            let p = self.dir.join(sub);
            match fs::DirBuilder::new().mode(0o700).create(&p) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(ImageError::write(&p, e)),
            }
        }
        Ok(())
    }
}

fn source_of(reference: &Path) -> String {
    std::path::absolute(reference)
        .unwrap_or_else(|_| reference.to_path_buf())
        .display()
        .to_string()
}

/// Apparent size of the regular files below `root` (symlinks not followed).
fn tree_size(root: &Path) -> u64 {
    let mut total = 0;
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if meta.is_dir() {
                todo.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_files_and_other_compressions_are_refused_by_magic() {
        let dir = tempfile::tempdir().unwrap();
        let named_tar = dir.path().join("rootfs.tar");
        fs::write(&named_tar, b"not a tar at all").unwrap();
        assert!(matches!(
            ImageKind::detect(&named_tar),
            Err(ImageError::Unrecognized(_))
        ));
        let zstd = dir.path().join("rootfs");
        fs::write(&zstd, [0x28, 0xb5, 0x2f, 0xfd, 0, 0]).unwrap();
        let e = ImageKind::detect(&zstd).unwrap_err();
        assert!(e.to_string().contains("zstd"), "{e}");
        assert!(matches!(
            ImageKind::detect(dir.path()),
            Ok(ImageKind::Directory)
        ));
    }
}
