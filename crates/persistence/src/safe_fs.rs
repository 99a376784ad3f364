//! Directory-fd based filesystem primitives that never follow a symlink.
//!
//! A workspace or outputs directory is writable by the sandbox, possibly while we read it
//! (background processes survive the harness). Path-based calls would follow a symlink the
//! sandbox swapped in for a directory and read or write host files outside the binding. So
//! every walk here opens each component relative to its parent's fd with `O_NOFOLLOW`, and
//! every restore creates with `O_CREAT | O_EXCL | O_NOFOLLOW`, `mkdirat` or `symlinkat` inside
//! a directory fd opened the same way.

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

/// Deepest directory nesting a walk, restore or removal follows.
pub(crate) const MAX_DEPTH: usize = 1024;

/// The parts of a `stat` that change whenever a file's content may have changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct StatKey {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i64,
    pub ctime_ns: i64,
}

/// What a no-follow `stat` says about one entry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct EntryStat {
    pub file_type: FileType,
    pub mode: u32,
    pub key: StatKey,
    /// Hard links to the inode.
    pub nlink: u64,
    /// Bytes allocated on disk (`st_blocks * 512`); less than the size for a sparse file.
    pub allocated: u64,
}

// The field types of `struct stat` differ between architectures; the casts are lossless
// widenings on every Linux target.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn entry_stat(stat: &Stat) -> EntryStat {
    EntryStat {
        file_type: FileType::from_raw_mode(stat.st_mode as _),
        mode: (stat.st_mode as u32) & 0o777,
        nlink: stat.st_nlink as u64,
        allocated: (stat.st_blocks.max(0) as u64).saturating_mul(512),
        key: StatKey {
            dev: stat.st_dev as u64,
            ino: stat.st_ino as u64,
            size: stat.st_size.max(0) as u64,
            mtime_ns: (stat.st_mtime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(stat.st_mtime_nsec as i64),
            ctime_ns: (stat.st_ctime as i64)
                .saturating_mul(1_000_000_000)
                .saturating_add(stat.st_ctime_nsec as i64),
        },
    }
}

/// Nanoseconds since the epoch, on the clock file timestamps use.
pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| i64::try_from(elapsed.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Opens a directory the caller owns the path of; only its last component must not be a link.
pub(crate) fn open_root(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        rustix::fs::CWD,
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the directory `name` inside `dir`; fails (`ELOOP`/`ENOTDIR`) on a symlink.
pub(crate) fn open_dir_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?)
}

/// Opens the file `name` inside `dir` for reading; never follows a symlink and never blocks
/// on a FIFO swapped in for the file (the caller checks the type with `fstat`).
pub(crate) fn open_file_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    Ok(std::fs::File::from(fd))
}

/// Creates the file `name` inside `dir`; fails if anything (a symlink included) is there.
pub(crate) fn create_file_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<std::fs::File> {
    let fd = rustix::fs::openat(
        dir,
        name,
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )?;
    Ok(std::fs::File::from(fd))
}

/// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
pub(crate) fn stat_at(dir: BorrowedFd<'_>, name: &str) -> io::Result<EntryStat> {
    Ok(entry_stat(&rustix::fs::statat(
        dir,
        name,
        AtFlags::SYMLINK_NOFOLLOW,
    )?))
}

/// `fstat(fd)`.
pub(crate) fn stat_fd(fd: impl AsFd) -> io::Result<EntryStat> {
    Ok(entry_stat(&rustix::fs::fstat(fd)?))
}

/// [`list_names`], or `None` as soon as `dir` holds more than `cap` entries (so a directory
/// of millions of entries never grows host memory past the caller's limit).
pub(crate) fn list_names_capped(dir: BorrowedFd<'_>, cap: u64) -> io::Result<Option<Vec<CString>>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if names.len() as u64 >= cap {
            return Ok(None);
        }
        names.push(name.to_owned());
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(Some(names))
}

/// The entry names of `dir` (without `.` and `..`), sorted by bytes.
pub(crate) fn list_names(dir: BorrowedFd<'_>) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        names.push(name.to_owned());
    }
    names.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names)
}

/// Splits a manifest-relative path into its segments, or `None` when it is empty, absolute,
/// or has an empty, `.` or `..` segment or a NUL byte.
pub(crate) fn split_relative(path: &str) -> Option<Vec<&str>> {
    if path.is_empty() || path.starts_with('/') || path.contains('\0') {
        return None;
    }
    let parts: Vec<&str> = path.split('/').collect();
    if parts
        .iter()
        .any(|part| part.is_empty() || *part == "." || *part == "..")
    {
        return None;
    }
    Some(parts)
}

/// Opens parent directories of relative paths, keeping the last one open because walks and
/// manifests visit siblings together. Every component is opened with `O_NOFOLLOW`.
#[derive(Debug, Default)]
pub(crate) struct ParentCursor {
    path: Vec<String>,
    fd: Option<OwnedFd>,
}

impl ParentCursor {
    /// The fd of the directory `parents` (a list of segments) under `root`.
    pub(crate) fn open<'a>(
        &'a mut self,
        root: BorrowedFd<'a>,
        parents: &[&str],
    ) -> io::Result<BorrowedFd<'a>> {
        if parents.is_empty() {
            return Ok(root);
        }
        let cached = self.fd.is_some()
            && self
                .path
                .iter()
                .map(String::as_str)
                .eq(parents.iter().copied());
        if !cached {
            self.fd = None;
            let mut current = open_dir_at(root, parents[0])?;
            for part in &parents[1..] {
                current = open_dir_at(current.as_fd(), part)?;
            }
            self.path = parents.iter().map(|part| (*part).to_owned()).collect();
            self.fd = Some(current);
        }
        match &self.fd {
            Some(fd) => Ok(fd.as_fd()),
            None => Err(io::Error::other("parent directory cursor is empty")),
        }
    }

    /// Forgets the cached directory (after it was renamed, removed or re-permissioned).
    pub(crate) fn reset(&mut self) {
        self.fd = None;
        self.path.clear();
    }
}

/// Removes `path` and everything under it without following symlinks, making directories
/// writable first so read-only trees restored from a manifest can be deleted too.
/// A missing `path` is success.
///
/// A sandbox can nest directories deeper than any walk follows. So that such a tree can still
/// be removed with a bounded number of open fds and stack frames, a directory met
/// [`REMOVE_DEPTH`] levels down is renamed (within the same filesystem, by fd) up into `path`
/// itself, and `path` is cleared again until it is empty.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    let stat = match rustix::fs::statat(rustix::fs::CWD, path, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(stat) => entry_stat(&stat),
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    if stat.file_type != FileType::Directory {
        return std::fs::remove_file(path);
    }
    empty_dir(path)?;
    std::fs::remove_dir(path)
}

/// Removes everything under the directory `path` (as [`remove_tree`] does) and keeps the
/// directory itself: a bind-mounted directory stays the mount's.
pub(crate) fn empty_dir(path: &Path) -> io::Result<()> {
    let dir = open_root(path)?;
    let _ = rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700));
    let mut hoisted = 0u64;
    // Each pass removes everything above REMOVE_DEPTH and hoists what is below, so the
    // remaining depth shrinks by REMOVE_DEPTH per pass.
    while !list_names(dir.as_fd())?.is_empty() {
        clear_dir(dir.as_fd(), dir.as_fd(), 0, &mut hoisted)?;
    }
    Ok(())
}

/// Nesting at which `remove_tree` hoists a subtree up to its root.
const REMOVE_DEPTH: usize = 256;

fn clear_dir(
    root: BorrowedFd<'_>,
    dir: BorrowedFd<'_>,
    depth: usize,
    hoisted: &mut u64,
) -> io::Result<()> {
    for name in list_names(dir)? {
        let is_dir = match rustix::fs::statat(dir, name.as_c_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => entry_stat(&stat).file_type == FileType::Directory,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(error) => return Err(error.into()),
        };
        if is_dir && depth + 1 >= REMOVE_DEPTH {
            *hoisted += 1;
            let target = format!(".omabox-hoisted-{}-{hoisted}", std::process::id());
            rustix::fs::renameat(dir, name.as_c_str(), root, target.as_str())?;
        } else if is_dir {
            let child = rustix::fs::openat(
                dir,
                name.as_c_str(),
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )?;
            let _ = rustix::fs::fchmod(&child, Mode::from_raw_mode(0o700));
            clear_dir(root, child.as_fd(), depth + 1, hoisted)?;
            drop(child);
            rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::REMOVEDIR)?;
        } else {
            match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_relative_rejects_traversal() {
        assert_eq!(split_relative("a/b"), Some(vec!["a", "b"]));
        for bad in [
            "",
            "/etc/x",
            "../x",
            "a/../../x",
            "a//b",
            "a/./b",
            "a/",
            "a\0b",
        ] {
            assert_eq!(split_relative(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn remove_tree_deletes_read_only_directories_and_not_link_targets() {
        let temp = tempfile::tempdir().unwrap();
        let outside = temp.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"keep").unwrap();
        let tree = temp.path().join("tree");
        std::fs::create_dir_all(tree.join("ro/inner")).unwrap();
        std::fs::write(tree.join("ro/inner/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, tree.join("ro/link")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            tree.join("ro/inner"),
            std::fs::Permissions::from_mode(0o500),
        )
        .unwrap();
        std::fs::set_permissions(tree.join("ro"), std::fs::Permissions::from_mode(0o500)).unwrap();
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
        assert!(outside.join("keep").exists());
        remove_tree(&tree).unwrap();
    }

    #[test]
    fn remove_tree_removes_a_tree_deeper_than_any_walk() {
        let temp = tempfile::tempdir().unwrap();
        let tree = temp.path().join("tree");
        // Built by fd so the path length does not matter.
        std::fs::create_dir(&tree).unwrap();
        let mut dir = open_root(&tree).unwrap();
        for _ in 0..(MAX_DEPTH + 300) {
            rustix::fs::mkdirat(&dir, "d", Mode::from_raw_mode(0o700)).unwrap();
            dir = open_dir_at(dir.as_fd(), "d").unwrap();
        }
        let file = rustix::fs::openat(
            &dir,
            "f",
            OFlags::CREATE | OFlags::WRONLY,
            Mode::from_raw_mode(0o600),
        )
        .unwrap();
        drop(file);
        drop(dir);
        remove_tree(&tree).unwrap();
        assert!(!tree.exists());
    }
}
