//! The tar unpacker: applies untrusted tar streams (plain or gzip) to a private rootfs
//! directory, with OCI whiteouts.
//!
//! What it must never do: write, link, delete or change metadata outside the rootfs it
//! was given; follow a symlink of the image (every ancestor of an entry is checked with
//! `lstat` to be a real directory; files are created `O_CREAT|O_EXCL|O_NOFOLLOW`);
//! accept an absolute path or a `..` component in an entry name or hard-link target;
//! create a device node; restore extended attributes (file capabilities). Modes and
//! numeric owners are kept (setuid included, as Docker does): the sandbox mounts its
//! root `nosuid`, as an idmapped layer.

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use super::digest::HashingReader;
use super::limits::{HeaderBudget, Tally, UnpackLimits};
use super::{ImageError, OPAQUE_WHITEOUT, WHITEOUT_PREFIX};

// ---------------------------------------------------------------------------------------
// Formats

pub(super) enum Compression {
    None,
    Gzip,
    Unsupported(&'static str),
    NotTar,
}

/// Looks at the first bytes of a stream without consuming them.
///
/// A `BufReader` over a file fills its buffer with one read, which holds the first 512
/// bytes of any file that long.
pub(super) fn sniff<R: BufRead>(r: &mut R) -> io::Result<Compression> {
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
pub(super) fn tar_stream<'a, R: Read + 'a>(
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

pub(super) fn unpack_tarball(
    path: &Path,
    hex: &str,
    rootfs: &Path,
    limits: UnpackLimits,
) -> Result<(), ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let mut hashing = HashingReader::new(file);
    {
        let stream = tar_stream(&mut hashing, &|| path.display().to_string())?;
        let mut unpacker = Unpacker::new(rootfs, limits);
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
// The unpacker

/// Owner, mode and mtime applied to a directory once everything is unpacked (so a
/// read-only directory can still be filled, and its mtime is not disturbed).
#[derive(Debug, Clone, Copy)]
pub(super) struct DirMeta {
    mode: u32,
    uid: u64,
    gid: u64,
    mtime: u64,
}

/// Applies tar streams to a rootfs directory it alone writes to.
pub(super) struct Unpacker {
    root: PathBuf,
    as_root: bool,
    dirs: BTreeMap<PathBuf, DirMeta>,
    tally: Tally,
}

impl Unpacker {
    pub(super) fn new(root: &Path, limits: UnpackLimits) -> Self {
        Self {
            root: root.to_path_buf(),
            as_root: rustix::process::geteuid().is_root(),
            dirs: BTreeMap::new(),
            tally: Tally::new(limits),
        }
    }

    /// Applies one tar stream. With `whiteouts`, `.wh.<name>` deletes `<name>` of lower
    /// layers and `.wh..wh..opq` empties its directory of lower layers' entries.
    pub(super) fn apply(
        &mut self,
        stream: impl Read,
        whiteouts: bool,
        context: &str,
    ) -> Result<(), ImageError> {
        let tar_err = |source| ImageError::Tar {
            context: context.to_owned(),
            source,
        };
        // The parser reads an entry's headers and extensions whole into memory: capped.
        let budget = HeaderBudget::default();
        let mut archive = tar::Archive::new(budget.wrap(stream));
        let mut created: HashSet<PathBuf> = HashSet::new();
        let mut entries = archive.entries().map_err(tar_err)?;
        loop {
            budget.between_entries();
            let Some(entry) = entries.next() else {
                break;
            };
            budget.in_entry();
            let mut entry = entry.map_err(|e| budget.explain(e, context))?;
            self.tally.entry()?;
            let raw = PathBuf::from(OsStr::from_bytes(&entry.path_bytes()));
            self.apply_entry(&mut entry, &raw, whiteouts, context, &mut created)
                .map_err(|e| name_too_long(e, &raw))?;
            // What the entry did not read (a whiteout's, a skipped device's data) is
            // skipped here, outside the header budget.
            io::copy(&mut entry, &mut io::sink()).map_err(tar_err)?;
        }
        Ok(())
    }

    fn apply_entry<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        raw: &Path,
        whiteouts: bool,
        context: &str,
        created: &mut HashSet<PathBuf>,
    ) -> Result<(), ImageError> {
        let tar_err = |source| ImageError::Tar {
            context: context.to_owned(),
            source,
        };
        let rel = clean(raw)?;
        let kind = entry.header().entry_type();
        if whiteouts && let Some(name) = rel.file_name().map(OsStrExt::as_bytes) {
            if name == OPAQUE_WHITEOUT {
                let dir = rel.parent().unwrap_or(Path::new(""));
                self.opaque(raw, dir, created)?;
                return Ok(());
            }
            if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
                let target = rel.with_file_name(OsStr::from_bytes(hidden));
                if !created.contains(&target) {
                    self.whiteout(raw, &target)?;
                }
                return Ok(());
            }
        }
        if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            return Ok(());
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
            return Ok(());
        }
        self.parents(raw, &rel, true)?;
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
            let left = self.tally.bytes_left();
            let written = io::copy(&mut (&mut *entry).take(left.saturating_add(1)), &mut file)
                .map_err(tar_err)?;
            self.tally.bytes(written)?;
            file.flush().map_err(|e| ImageError::write(&target, e))?;
            self.own_and_mode(&target, meta, Some(&file))?;
        } else if kind.is_symlink() {
            let link = entry
                .link_name_bytes()
                .ok_or_else(|| ImageError::unsafe_entry(raw, "symlink without a target"))?;
            self.clear(&target)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&link), &target)
                .map_err(|e| ImageError::write(&target, e))?;
            self.lchown(&target, meta)?;
            set_mtime(&target, meta.mtime)?;
        } else if kind.is_hard_link() {
            let link = entry
                .link_name_bytes()
                .ok_or_else(|| ImageError::unsafe_entry(raw, "hard link without a target"))?;
            let link_raw = PathBuf::from(OsStr::from_bytes(&link));
            let link_rel = clean(&link_raw)?;
            self.parents(raw, &link_rel, false)?;
            let source = self.root.join(&link_rel);
            match fs::symlink_metadata(&source) {
                Ok(m) if !m.is_dir() => {}
                _ => {
                    return Err(ImageError::unsafe_entry(
                        raw,
                        format!(
                            "hard link to {}, which is not a file unpacked before it",
                            link_raw.display()
                        ),
                    ));
                }
            }
            if source == target {
                return Ok(());
            }
            self.clear(&target)?;
            // std's hard_link uses linkat without AT_SYMLINK_FOLLOW: a symlink is
            // linked itself, never followed.
            fs::hard_link(&source, &target).map_err(|e| ImageError::write(&target, e))?;
        } else if kind == tar::EntryType::Fifo {
            self.clear(&target)?;
            // mknod never follows a symlink at the final component (removed above).
            rustix::fs::mknodat(
                rustix::fs::CWD,
                &target,
                rustix::fs::FileType::Fifo,
                rustix::fs::Mode::from_raw_mode(0o600),
                0,
            )
            .map_err(|e| ImageError::write(&target, e.into()))?;
            self.own_and_mode(&target, meta, None)?;
        } else if kind == tar::EntryType::Char || kind == tar::EntryType::Block {
            // Device nodes are skipped: /dev is built by the sandbox and nodev
            // would make these inert anyway.
            return Ok(());
        } else {
            return Err(ImageError::Unsupported(format!(
                "image entry {} has unsupported tar type {kind:?}",
                crate::escape::path(raw)
            )));
        }
        created.insert(rel);
        Ok(())
    }

    /// Applies the deferred directory owners, modes and mtimes, deepest first.
    pub(super) fn finish(self) -> Result<(), ImageError> {
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
    pub(super) fn parents(&self, raw: &Path, rel: &Path, create: bool) -> Result<(), ImageError> {
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

    pub(super) fn is_real_dir_chain(&self, rel: &Path) -> bool {
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
    pub(super) fn clear(&self, target: &Path) -> Result<(), ImageError> {
        match fs::symlink_metadata(target) {
            Ok(_) => remove_any(target),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(ImageError::write(target, e)),
        }
    }

    pub(super) fn whiteout(&mut self, raw: &Path, target: &Path) -> Result<(), ImageError> {
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

    pub(super) fn opaque(
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

    pub(super) fn lchown(&self, path: &Path, meta: DirMeta) -> Result<(), ImageError> {
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
    pub(super) fn own_and_mode(
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

/// A write that failed because the entry's name is too long for the filesystem is the
/// image's fault: said so.
fn name_too_long(e: ImageError, raw: &Path) -> ImageError {
    match e {
        ImageError::Write { source, .. } if source.raw_os_error() == Some(libc::ENAMETOOLONG) => {
            ImageError::unsafe_entry(
                raw,
                "its name is too long (a component over 255 bytes, or a path over 4096)",
            )
        }
        other => other,
    }
}

/// The archive path made relative, with `.` dropped; absolute paths and `..` refused.
pub(super) fn clean(raw: &Path) -> Result<PathBuf, ImageError> {
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

pub(super) fn mkdir(path: &Path) -> Result<(), ImageError> {
    fs::DirBuilder::new()
        .mode(0o755)
        .create(path)
        .map_err(|e| ImageError::write(path, e))
}

/// Removes whatever is at `path` without following a symlink there.
pub(super) fn remove_any(path: &Path) -> Result<(), ImageError> {
    let meta = fs::symlink_metadata(path).map_err(|e| ImageError::write(path, e))?;
    if meta.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
    .map_err(|e| ImageError::write(path, e))
}

pub(super) fn set_mtime(path: &Path, mtime: u64) -> Result<(), ImageError> {
    let t = rustix::fs::Timespec {
        tv_sec: i64::try_from(mtime).unwrap_or(0),
        tv_nsec: 0,
    };
    let times = rustix::fs::Timestamps {
        last_access: t,
        last_modification: t,
    };
    // AT_SYMLINK_NOFOLLOW sets a symlink's own times.
    rustix::fs::utimensat(
        rustix::fs::CWD,
        path,
        &times,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
    )
    .map_err(|e| ImageError::write(path, e.into()))
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
}
