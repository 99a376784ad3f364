//! Image artifacts: a local rootfs directory, rootfs tarball or OCI image layout turned
//! into a directory the sandbox uses as the read-only lower layer of its overlay root.
//!
//! omabox pulls nothing: there is no registry client, no registry auth and no network
//! access here. An image is a local path the operator names explicitly (the contract's
//! "Images" section); a registry image is brought in with other tools first (e.g.
//! `skopeo copy docker://debian:12 oci:/srv/images/debian:12`, or `docker export`).
//!
//! # What [`ImageCache::resolve`] accepts
//!
//! | reference | detected by | result |
//! |-----------|-------------|--------|
//! | a directory without `oci-layout` | `stat` | the directory itself, never copied or written |
//! | a tar archive, plain or gzip | magic bytes (`ustar` at offset 257; `1f 8b` then `ustar` inside), not the file name | unpacked once into `<cache>/sha256/<sha256 of the file>/rootfs` |
//! | an OCI image layout directory (`oci-layout`, `index.json`, `blobs/sha256/…`) | the `oci-layout` file | the manifest for this host's platform (or the only one) unpacked once into `<cache>/sha256/<manifest digest>/rootfs`, layers applied in order with whiteouts |
//!
//! zstd, xz and bzip2 compression, non-sha256 digests and registry references are
//! refused with a clear error.
//!
//! # Cache layout
//!
//! ```text
//! <cache>/                       mode 0700, must be owned by the caller and not group/world writable
//!   sha256/<hex>/rootfs/         an unpacked image (published by one rename, never changed after)
//!   sha256/<hex>/image.json      what it was unpacked from (kind, reference, digest)
//!   locks/<hex>.lock             flock(2) serializing unpackers of one digest
//!   tmp/<hex>.<pid>.<n>/         an unpack in progress; removed on failure, and by the
//!                                next unpacker of the same digest after a crash
//! ```
//!
//! An entry is keyed by content (the tarball's bytes, the OCI manifest's digest), so a
//! changed tarball is a new entry and an unchanged one is never unpacked twice. Nothing
//! is evicted automatically; [`ImageCache::list`] shows the entries and
//! [`ImageCache::remove`] deletes one (the caller makes sure no sandbox uses it).
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
//! Disk use is not bounded: a decompression bomb fills the cache's filesystem.

use std::collections::{BTreeMap, HashSet};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use oci_spec::image::{Arch, Descriptor, ImageIndex, ImageManifest, MediaType, Os};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// Largest JSON blob (index, manifest) read into memory.
const MAX_JSON_BLOB: u64 = 4 << 20;
/// How deep nested image indexes may go.
const MAX_INDEX_DEPTH: usize = 4;
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
        }
    }
}

/// An image ready to be the sandbox's overlay lower layer.
#[derive(Debug, Clone, PartialEq, Eq)]
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
}

/// One unpacked image in the cache.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CachedImage {
    /// `sha256:<hex>`.
    pub digest: String,
    /// What it was unpacked from.
    pub kind: ImageKind,
    /// The reference it was first unpacked from (informational).
    pub source: PathBuf,
    /// The unpacked rootfs.
    #[serde(skip)]
    pub rootfs_dir: PathBuf,
}

/// Why an image could not be resolved.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageError {
    /// Reading the image failed.
    #[error("cannot read image {}", path.display())]
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
    /// An archive entry that would escape the rootfs or write through a symlink.
    #[error("unsafe image entry {entry:?}: {reason}")]
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
    #[error("cannot unpack {}", path.display())]
    Write {
        /// The path written.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
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
            entry: entry.display().to_string(),
            reason: reason.into(),
        }
    }

    /// Whether the image itself is at fault (bad format, unsafe or tampered content),
    /// as opposed to the host (I/O, the cache directory).
    pub fn is_bad_image(&self) -> bool {
        !matches!(
            self,
            Self::Read { .. } | Self::Write { .. } | Self::Cache { .. }
        )
    }
}

/// The content-addressed cache of unpacked images (layout in the module doc).
#[derive(Debug, Clone)]
pub struct ImageCache {
    dir: PathBuf,
}

impl ImageCache {
    /// A cache rooted at `dir` (created on first use).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The default cache directory: `/var/lib/omabox/images` for root, otherwise
    /// `$XDG_CACHE_HOME/omabox/images` (or `~/.cache/omabox/images`).
    pub fn default_dir() -> PathBuf {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            return PathBuf::from("/var/lib/omabox/images");
        }
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
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
            ImageKind::Directory => Ok(ResolvedImage {
                rootfs_dir: fs::canonicalize(reference)
                    .map_err(|e| ImageError::io(reference, e))?,
                digest: None,
                kind,
                unpacked: false,
            }),
            ImageKind::Tarball => {
                let hex = sha256_file(reference)?;
                self.fill(&hex, kind, reference, |rootfs| {
                    unpack_tarball(reference, &hex, rootfs)
                })
            }
            ImageKind::OciLayout => {
                let layout = OciLayout::open(reference)?;
                let manifest = layout.select_manifest()?;
                let hex = sha256_hex_of(&manifest).map_err(|reason| layout.invalid(reason))?;
                self.fill(&hex, kind, reference, |rootfs| {
                    layout.unpack(&manifest, rootfs)
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

    /// Deletes one unpacked image (`sha256:<hex>`). The caller makes sure no running
    /// sandbox uses it. Returns whether it was there.
    pub fn remove(&self, digest: &str) -> Result<bool, ImageError> {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        if !is_sha256_hex(hex) {
            return Err(ImageError::Unsupported(format!(
                "{digest:?} is not a sha256 digest"
            )));
        }
        let _lock = self.lock(hex)?;
        let entry = self.dir.join("sha256").join(hex);
        match fs::remove_dir_all(&entry) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(ImageError::write(&entry, e)),
        }
    }

    /// Returns the cached rootfs for `hex`, unpacking it with `unpack` under the digest's
    /// lock when missing.
    fn fill(
        &self,
        hex: &str,
        kind: ImageKind,
        reference: &Path,
        unpack: impl FnOnce(&Path) -> Result<(), ImageError>,
    ) -> Result<ResolvedImage, ImageError> {
        let entry = self.dir.join("sha256").join(hex);
        let rootfs = entry.join("rootfs");
        let done = |unpacked| {
            Ok(ResolvedImage {
                rootfs_dir: fs::canonicalize(&rootfs).map_err(|e| ImageError::io(&rootfs, e))?,
                digest: Some(format!("sha256:{hex}")),
                kind,
                unpacked,
            })
        };
        self.prepare()?;
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
            source: std::path::absolute(reference).unwrap_or_else(|_| reference.to_path_buf()),
            rootfs_dir: PathBuf::new(),
        };
        let meta_path = tmp.path.join("image.json");
        let json = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        fs::write(&meta_path, json).map_err(|e| ImageError::write(&meta_path, e))?;
        fs::rename(&tmp.path, &entry).map_err(|e| ImageError::write(&entry, e))?;
        tmp.defuse();
        done(true)
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
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
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

    fn lock(&self, hex: &str) -> Result<File, ImageError> {
        self.prepare()?;
        let path = self.dir.join("locks").join(format!("{hex}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| ImageError::write(&path, e))?;
        loop {
            // SAFETY: flock on an fd we own; no memory is involved.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(file);
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(ImageError::write(&path, e));
            }
        }
    }

    /// Removes unpacks of `hex` left by a process that died mid-way (we hold the lock,
    /// so none of them is in progress).
    fn remove_stale_temps(&self, hex: &str) {
        let Ok(entries) = fs::read_dir(self.dir.join("tmp")) else {
            return;
        };
        let prefix = format!("{hex}.");
        for entry in entries.flatten() {
            if entry.file_name().as_bytes().starts_with(prefix.as_bytes()) {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
}

/// A temporary cache entry, removed on drop unless defused.
struct TempEntry {
    path: PathBuf,
    armed: bool,
}

impl TempEntry {
    fn create(tmp_root: &Path, hex: &str) -> Result<Self, ImageError> {
        static N: AtomicU64 = AtomicU64::new(0);
        let path = tmp_root.join(format!(
            "{hex}.{}.{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| ImageError::write(&path, e))?;
        Ok(Self { path, armed: true })
    }

    fn defuse(mut self) {
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

// ---------------------------------------------------------------------------------------
// Formats

enum Compression {
    None,
    Gzip,
    Unsupported(&'static str),
    NotTar,
}

/// Looks at the first bytes of a stream without consuming them.
///
/// A `BufReader` over a file fills its buffer with one read, which holds the first 512
/// bytes of any file that long.
fn sniff<R: BufRead>(r: &mut R) -> io::Result<Compression> {
    let head = r.fill_buf()?;
    Ok(match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => Compression::Unsupported("zstd"),
        [0xfd, b'7', b'z', b'X', b'Z', 0, ..] => Compression::Unsupported("xz"),
        [b'B', b'Z', b'h', ..] => Compression::Unsupported("bzip2"),
        h if h.len() >= 262 && &h[257..262] == b"ustar" => Compression::None,
        _ => Compression::NotTar,
    })
}

/// A tar stream from a reader: gunzipped if it starts with the gzip magic.
fn tar_stream<'a, R: Read + 'a>(
    reader: R,
    what: &dyn Fn() -> String,
) -> Result<Box<dyn Read + 'a>, ImageError> {
    let mut buffered = BufReader::with_capacity(64 << 10, reader);
    let kind = sniff(&mut buffered).map_err(|source| ImageError::Tar {
        context: what(),
        source,
    })?;
    match kind {
        Compression::Gzip => Ok(Box::new(flate2::bufread::MultiGzDecoder::new(buffered))),
        Compression::Unsupported(c) => Err(ImageError::Unsupported(format!(
            "{} is {c}-compressed; only plain and gzip-compressed tar is supported",
            what()
        ))),
        // An empty layer may be a bare end-of-archive; the tar parser decides.
        Compression::None | Compression::NotTar => Ok(Box::new(buffered)),
    }
}

/// Hashes everything read through it.
struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    len: u64,
}

impl<R: Read> HashingReader<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            len: 0,
        }
    }

    /// Reads the rest and returns (hex digest, total length).
    fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((hex::encode(self.hasher.finalize()), self.len))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
}

fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let (hex, _) = HashingReader::new(BufReader::with_capacity(256 << 10, file))
        .finish()
        .map_err(|e| ImageError::io(path, e))?;
    Ok(hex)
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The hex part of a descriptor's sha256 digest; anything else is refused (the hex is a
/// file name below `blobs/sha256` and a cache entry name).
fn sha256_hex_of(desc: &Descriptor) -> Result<String, String> {
    let digest = desc.digest();
    let hex = digest.digest();
    if digest.algorithm().to_string() != "sha256" || !is_sha256_hex(hex) {
        return Err(format!(
            "digest {digest} is not a sha256 digest (only sha256 is supported)"
        ));
    }
    Ok(hex.to_owned())
}

fn unpack_tarball(path: &Path, hex: &str, rootfs: &Path) -> Result<(), ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let mut hashing = HashingReader::new(file);
    {
        let stream = tar_stream(&mut hashing, &|| path.display().to_string())?;
        let mut unpacker = Unpacker::new(rootfs);
        unpacker.apply(stream, false, "")?;
        unpacker.finish()?;
    }
    let (actual, _) = hashing.finish().map_err(|e| ImageError::io(path, e))?;
    if actual != hex {
        return Err(ImageError::Changed(path.to_path_buf()));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// OCI image layout

struct OciLayout {
    dir: PathBuf,
}

impl OciLayout {
    fn open(dir: &Path) -> Result<Self, ImageError> {
        let layout = Self {
            dir: dir.to_path_buf(),
        };
        let marker = dir.join("oci-layout");
        let text = read_limited(&marker, MAX_JSON_BLOB)?;
        let version = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("imageLayoutVersion")?.as_str().map(str::to_owned))
            .ok_or_else(|| layout.invalid("oci-layout has no imageLayoutVersion".into()))?;
        if !version.starts_with("1.") {
            return Err(layout.invalid(format!(
                "image layout version {version} is not supported (1.x is)"
            )));
        }
        Ok(layout)
    }

    fn invalid(&self, reason: String) -> ImageError {
        ImageError::InvalidLayout {
            path: self.dir.clone(),
            reason,
        }
    }

    /// The manifest for this host (linux and the host's architecture), or the only
    /// manifest there is. Nested indexes are followed.
    fn select_manifest(&self) -> Result<Descriptor, ImageError> {
        let index_path = self.dir.join("index.json");
        let text = read_limited(&index_path, MAX_JSON_BLOB)?;
        let index: ImageIndex =
            serde_json::from_slice(&text).map_err(|e| self.invalid(format!("index.json: {e}")))?;
        let mut manifests = Vec::new();
        self.collect_manifests(&index, 0, &mut manifests)?;
        if manifests.len() == 1 {
            return Ok(manifests.remove(0));
        }
        let arch = Arch::default();
        let matching = manifests.iter().find(|d| {
            d.platform()
                .as_ref()
                .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == arch)
        });
        match matching {
            Some(d) => Ok(d.clone()),
            None => Err(ImageError::NoManifest {
                path: self.dir.clone(),
                platform: format!("linux/{arch}"),
                available: if manifests.is_empty() {
                    "no image manifests".into()
                } else {
                    manifests
                        .iter()
                        .map(|d| match d.platform() {
                            Some(p) => format!("{}/{}", p.os(), p.architecture()),
                            None => "unknown platform".into(),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            }),
        }
    }

    fn collect_manifests(
        &self,
        index: &ImageIndex,
        depth: usize,
        out: &mut Vec<Descriptor>,
    ) -> Result<(), ImageError> {
        for desc in index.manifests() {
            match desc.media_type() {
                MediaType::ImageManifest => out.push(desc.clone()),
                MediaType::Other(m)
                    if m == "application/vnd.docker.distribution.manifest.v2+json" =>
                {
                    out.push(desc.clone());
                }
                MediaType::ImageIndex => {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(self.invalid("image indexes nest too deeply".into()));
                    }
                    let nested: ImageIndex = self.read_json(desc)?;
                    self.collect_manifests(&nested, depth + 1, out)?;
                }
                MediaType::Other(m)
                    if m == "application/vnd.docker.distribution.manifest.list.v2+json" =>
                {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(self.invalid("image indexes nest too deeply".into()));
                    }
                    let nested: ImageIndex = self.read_json(desc)?;
                    self.collect_manifests(&nested, depth + 1, out)?;
                }
                // Artifacts, signatures, attestations: not images.
                _ => {}
            }
        }
        Ok(())
    }

    fn blob_path(&self, desc: &Descriptor) -> Result<PathBuf, ImageError> {
        let hex = sha256_hex_of(desc).map_err(|r| self.invalid(r))?;
        Ok(self.dir.join("blobs/sha256").join(hex))
    }

    /// Reads a small JSON blob, checks its size and digest, then parses it.
    fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        desc: &Descriptor,
    ) -> Result<T, ImageError> {
        let path = self.blob_path(desc)?;
        if desc.size() > MAX_JSON_BLOB {
            return Err(self.invalid(format!(
                "blob {} is {} bytes, more than a manifest may be",
                desc.digest(),
                desc.size()
            )));
        }
        let bytes = read_limited(&path, MAX_JSON_BLOB)?;
        let actual = hex::encode(Sha256::digest(&bytes));
        check_blob(desc, &actual, bytes.len() as u64)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.invalid(format!("blob {}: {e}", desc.digest())))
    }

    fn unpack(&self, manifest_desc: &Descriptor, rootfs: &Path) -> Result<(), ImageError> {
        let manifest: ImageManifest = self.read_json(manifest_desc)?;
        let mut unpacker = Unpacker::new(rootfs);
        for (i, layer) in manifest.layers().iter().enumerate() {
            let context = format!("layer {} ({})", i + 1, layer.digest());
            match layer.media_type() {
                MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd => {
                    return Err(ImageError::Unsupported(format!(
                        "{context} is zstd-compressed; only plain and gzip-compressed layers are supported"
                    )));
                }
                _ => {}
            }
            let path = self.blob_path(layer)?;
            let file = File::open(&path).map_err(|e| ImageError::io(&path, e))?;
            let mut hashing = HashingReader::new(file);
            let applied = tar_stream(&mut hashing, &|| context.clone())
                .and_then(|stream| unpacker.apply(stream, true, &context));
            // A blob that does not match its digest is reported as such, even when its
            // bytes also failed to unpack: tampering is the cause worth naming.
            let (actual, len) = hashing.finish().map_err(|e| ImageError::io(&path, e))?;
            check_blob(layer, &actual, len)?;
            applied?;
        }
        unpacker.finish()
    }
}

fn check_blob(desc: &Descriptor, actual_hex: &str, len: u64) -> Result<(), ImageError> {
    let expected = desc.digest().to_string();
    if desc.digest().digest() != actual_hex {
        return Err(ImageError::DigestMismatch {
            expected,
            actual: format!("content hashes to sha256:{actual_hex}"),
        });
    }
    if desc.size() != len {
        return Err(ImageError::DigestMismatch {
            expected,
            actual: format!("{len} bytes, not {}", desc.size()),
        });
    }
    Ok(())
}

fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(ImageError::Unsupported(format!(
            "{} is larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

// ---------------------------------------------------------------------------------------
// The unpacker

/// Owner, mode and mtime applied to a directory once everything is unpacked (so a
/// read-only directory can still be filled, and its mtime is not disturbed).
#[derive(Debug, Clone, Copy)]
struct DirMeta {
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
}

/// Applies tar streams to a rootfs directory it alone writes to.
struct Unpacker {
    root: PathBuf,
    as_root: bool,
    dirs: BTreeMap<PathBuf, DirMeta>,
}

impl Unpacker {
    fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
            // SAFETY: geteuid has no preconditions and cannot fail.
            as_root: unsafe { libc::geteuid() } == 0,
            dirs: BTreeMap::new(),
        }
    }

    /// Applies one tar stream. With `whiteouts`, `.wh.<name>` deletes `<name>` of lower
    /// layers and `.wh..wh..opq` empties its directory of lower layers' entries.
    fn apply(
        &mut self,
        stream: impl Read,
        whiteouts: bool,
        context: &str,
    ) -> Result<(), ImageError> {
        let tar_err = |source| ImageError::Tar {
            context: context.to_owned(),
            source,
        };
        let mut archive = tar::Archive::new(stream);
        let mut created: HashSet<PathBuf> = HashSet::new();
        for entry in archive.entries().map_err(tar_err)? {
            let mut entry = entry.map_err(tar_err)?;
            let raw = PathBuf::from(OsStr::from_bytes(&entry.path_bytes()));
            let rel = clean(&raw)?;
            let kind = entry.header().entry_type();
            if whiteouts && let Some(name) = rel.file_name().map(OsStrExt::as_bytes) {
                if name == OPAQUE_WHITEOUT {
                    let dir = rel.parent().unwrap_or(Path::new(""));
                    self.opaque(&raw, dir, &created)?;
                    continue;
                }
                if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
                    let target = rel.with_file_name(OsStr::from_bytes(hidden));
                    if !created.contains(&target) {
                        self.whiteout(&raw, &target)?;
                    }
                    continue;
                }
            }
            if kind.is_pax_global_extensions()
                || kind.is_pax_local_extensions()
                || kind.is_gnu_longname()
                || kind.is_gnu_longlink()
            {
                continue;
            }
            let header = entry.header();
            let meta = DirMeta {
                mode: header.mode().map_err(tar_err)? & 0o7777,
                uid: header.uid().map_err(tar_err)?,
                gid: header.gid().map_err(tar_err)?,
                mtime: header.mtime().unwrap_or(0),
            };
            if rel.as_os_str().is_empty() {
                // "./": the rootfs directory itself.
                if kind.is_dir() {
                    self.dirs.insert(rel, meta);
                }
                continue;
            }
            self.parents(&raw, &rel, true)?;
            let target = self.root.join(&rel);
            if kind.is_dir() {
                match fs::symlink_metadata(&target) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => {
                        remove_any(&target)?;
                        mkdir(&target)?;
                    }
                    Err(_) => mkdir(&target)?,
                }
                self.dirs.insert(rel.clone(), meta);
            } else if kind.is_file() || kind == tar::EntryType::Continuous || kind.is_gnu_sparse() {
                self.clear(&target)?;
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                    .open(&target)
                    .map_err(|e| ImageError::write(&target, e))?;
                io::copy(&mut entry, &mut file).map_err(tar_err)?;
                file.flush().map_err(|e| ImageError::write(&target, e))?;
                self.own_and_mode(&target, meta, Some(&file))?;
            } else if kind.is_symlink() {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| ImageError::unsafe_entry(&raw, "symlink without a target"))?;
                self.clear(&target)?;
                std::os::unix::fs::symlink(OsStr::from_bytes(&link), &target)
                    .map_err(|e| ImageError::write(&target, e))?;
                self.lchown(&target, meta)?;
                set_mtime(&target, meta.mtime)?;
            } else if kind.is_hard_link() {
                let link = entry
                    .link_name_bytes()
                    .ok_or_else(|| ImageError::unsafe_entry(&raw, "hard link without a target"))?;
                let link_raw = PathBuf::from(OsStr::from_bytes(&link));
                let link_rel = clean(&link_raw)?;
                self.parents(&raw, &link_rel, false)?;
                let source = self.root.join(&link_rel);
                match fs::symlink_metadata(&source) {
                    Ok(m) if !m.is_dir() => {}
                    _ => {
                        return Err(ImageError::unsafe_entry(
                            &raw,
                            format!(
                                "hard link to {}, which is not a file unpacked before it",
                                link_raw.display()
                            ),
                        ));
                    }
                }
                if source == target {
                    continue;
                }
                self.clear(&target)?;
                // std's hard_link uses linkat without AT_SYMLINK_FOLLOW: a symlink is
                // linked itself, never followed.
                fs::hard_link(&source, &target).map_err(|e| ImageError::write(&target, e))?;
            } else if kind == tar::EntryType::Fifo {
                self.clear(&target)?;
                let c = cstring(&target)?;
                // SAFETY: `c` is a valid NUL-terminated path; mknod creates a FIFO and
                // never follows a symlink at the final component (we removed it).
                if unsafe { libc::mknod(c.as_ptr(), libc::S_IFIFO | 0o600, 0) } != 0 {
                    return Err(ImageError::write(&target, io::Error::last_os_error()));
                }
                self.own_and_mode(&target, meta, None)?;
            } else if kind == tar::EntryType::Char || kind == tar::EntryType::Block {
                // Device nodes are skipped: /dev is built by the sandbox and nodev
                // would make these inert anyway.
                continue;
            } else {
                return Err(ImageError::Unsupported(format!(
                    "image entry {} has unsupported tar type {kind:?}",
                    raw.display()
                )));
            }
            created.insert(rel);
        }
        Ok(())
    }

    /// Applies the deferred directory owners, modes and mtimes, deepest first.
    fn finish(self) -> Result<(), ImageError> {
        for (rel, meta) in self.dirs.iter().rev() {
            if !self.is_real_dir_chain(rel) {
                continue; // replaced or deleted by a later layer
            }
            let path = self.root.join(rel);
            self.lchown(&path, *meta)?;
            fs::set_permissions(&path, fs::Permissions::from_mode(meta.mode))
                .map_err(|e| ImageError::write(&path, e))?;
            set_mtime(&path, meta.mtime)?;
        }
        Ok(())
    }

    /// Checks that every ancestor of `rel` is a real directory (never a symlink);
    /// missing ones are created when `create`, else refused.
    fn parents(&self, raw: &Path, rel: &Path, create: bool) -> Result<(), ImageError> {
        let mut cur = self.root.clone();
        let Some(parent) = rel.parent() else {
            return Ok(());
        };
        for comp in parent.components() {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(ImageError::unsafe_entry(
                        raw,
                        format!(
                            "goes through the symlink {}",
                            cur.strip_prefix(&self.root).unwrap_or(&cur).display()
                        ),
                    ));
                }
                Ok(_) => {
                    return Err(ImageError::unsafe_entry(
                        raw,
                        format!(
                            "its parent {} is not a directory",
                            cur.strip_prefix(&self.root).unwrap_or(&cur).display()
                        ),
                    ));
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound && create => mkdir(&cur)?,
                Err(e) => return Err(ImageError::write(&cur, e)),
            }
        }
        Ok(())
    }

    fn is_real_dir_chain(&self, rel: &Path) -> bool {
        let mut cur = self.root.clone();
        for comp in rel.components() {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(m) if m.is_dir() => {}
                _ => return false,
            }
        }
        true
    }

    /// Removes a non-directory at `target` (a symlink is removed, not followed); a
    /// directory is replaced too, as an upper layer replacing it would.
    fn clear(&self, target: &Path) -> Result<(), ImageError> {
        match fs::symlink_metadata(target) {
            Ok(_) => remove_any(target),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::write(target, e)),
        }
    }

    fn whiteout(&mut self, raw: &Path, target: &Path) -> Result<(), ImageError> {
        let name = target.file_name().map(OsStrExt::as_bytes).unwrap_or(b"");
        if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') {
            return Err(ImageError::unsafe_entry(raw, "whiteout of no valid name"));
        }
        if !self.is_real_dir_chain(target.parent().unwrap_or(Path::new(""))) {
            return Ok(()); // nothing below a missing (or non-)directory to delete
        }
        let path = self.root.join(target);
        if fs::symlink_metadata(&path).is_ok() {
            remove_any(&path)?;
        }
        Ok(())
    }

    fn opaque(
        &mut self,
        raw: &Path,
        dir: &Path,
        created: &HashSet<PathBuf>,
    ) -> Result<(), ImageError> {
        self.parents(raw, &dir.join("x"), true)?;
        let path = self.root.join(dir);
        match fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(ImageError::unsafe_entry(
                    raw,
                    "opaque whiteout in a non-directory",
                ));
            }
            Err(_) => {
                mkdir(&path)?;
                return Ok(());
            }
        }
        let entries = fs::read_dir(&path).map_err(|e| ImageError::write(&path, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ImageError::write(&path, e))?;
            if !created.contains(&dir.join(entry.file_name())) {
                remove_any(&entry.path())?;
            }
        }
        Ok(())
    }

    fn lchown(&self, path: &Path, meta: DirMeta) -> Result<(), ImageError> {
        if !self.as_root {
            return Ok(()); // only root can give files away; the tree is ours then
        }
        let (Ok(uid), Ok(gid)) = (u32::try_from(meta.uid), u32::try_from(meta.gid)) else {
            return Err(ImageError::unsafe_entry(path, "owner id out of range"));
        };
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))
            .map_err(|e| ImageError::write(path, e))
    }

    /// Owner first, then mode: chown clears setuid/setgid, which are kept on purpose
    /// (see the module doc).
    fn own_and_mode(
        &self,
        path: &Path,
        meta: DirMeta,
        file: Option<&File>,
    ) -> Result<(), ImageError> {
        self.lchown(path, meta)?;
        let perms = fs::Permissions::from_mode(meta.mode);
        match file {
            Some(f) => f.set_permissions(perms),
            None => fs::set_permissions(path, perms),
        }
        .map_err(|e| ImageError::write(path, e))?;
        set_mtime(path, meta.mtime)
    }
}

/// The archive path made relative, with `.` dropped; absolute paths and `..` refused.
fn clean(raw: &Path) -> Result<PathBuf, ImageError> {
    let mut out = PathBuf::new();
    for comp in raw.components() {
        match comp {
            Component::Normal(c) => out.push(c),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(ImageError::unsafe_entry(raw, "absolute path"));
            }
            Component::ParentDir => {
                return Err(ImageError::unsafe_entry(raw, "path contains `..`"));
            }
        }
    }
    Ok(out)
}

fn mkdir(path: &Path) -> Result<(), ImageError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| ImageError::write(path, e))
}

/// Removes whatever is at `path` without following a symlink there.
fn remove_any(path: &Path) -> Result<(), ImageError> {
    let meta = fs::symlink_metadata(path).map_err(|e| ImageError::write(path, e))?;
    if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
    .map_err(|e| ImageError::write(path, e))
}

fn cstring(path: &Path) -> Result<CString, ImageError> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        ImageError::write(
            path,
            io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"),
        )
    })
}

fn set_mtime(path: &Path, mtime: u64) -> Result<(), ImageError> {
    let c = cstring(path)?;
    let t = libc::timespec {
        tv_sec: libc::time_t::try_from(mtime).unwrap_or(0),
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: `c` is a valid NUL-terminated path and `times` two valid timespecs;
    // AT_SYMLINK_NOFOLLOW sets a symlink's own times.
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            times.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if rc != 0 {
        return Err(ImageError::write(path, io::Error::last_os_error()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_refuses_escapes_and_drops_dots() {
        assert!(clean(Path::new("../x")).is_err());
        assert!(clean(Path::new("a/../../x")).is_err());
        assert!(clean(Path::new("/etc/passwd")).is_err());
        assert_eq!(clean(Path::new("./a/./b")).unwrap(), PathBuf::from("a/b"));
        assert_eq!(clean(Path::new("./")).unwrap(), PathBuf::new());
    }

    #[test]
    fn only_lowercase_sha256_hex_names_a_blob() {
        assert!(is_sha256_hex(&"a".repeat(64)));
        assert!(!is_sha256_hex(&"A".repeat(64)));
        assert!(!is_sha256_hex("../../etc/passwd"));
        assert!(!is_sha256_hex(&"a".repeat(63)));
    }

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
