//! The host's only way into an environment layer's tree: directory-fd walks that never
//! follow a link.
//!
//! A layer's upper dir is written by a build sandbox, whose steps may leave a symlink
//! wherever the host works afterwards (`/etc` pointing at the host's `/etc`, a relative
//! `../../..` link, a link in the middle of a path or as its last component). So every
//! directory is opened relative to its parent's fd with `O_NOFOLLOW | O_DIRECTORY` (and
//! checked to be the inode the walk saw), every entry is read and changed through `*at` calls
//! on one name inside that directory's fd (`AT_SYMLINK_NOFOLLOW`; extended attributes
//! through `/proc/self/fd/<dir>/<name>` with the calls that do not follow the last
//! component), and no file of the layer is ever opened. Never: a path string into the layer,
//! a link followed, a file of the layer opened.

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Component, Path};

use rustix::fs::{AtFlags, Dir, FileType, Gid, Mode, OFlags, RenameFlags, Stat, Uid};

use super::EnvLayerError;

/// How a directory of a layer is opened: never through a link, never anything else.
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The most a list of extended attribute names or one value holds (the kernel's own caps,
/// `XATTR_LIST_MAX` and `XATTR_SIZE_MAX`).
pub(super) const XATTR_MAX: usize = 64 << 10;

/// What a walk takes before it refuses the tree.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    /// Entries (the root included).
    pub entries: u64,
    /// Directories open at once below the root (one fd each).
    pub depth: usize,
}

/// Opens the directory at `path`, a path the host owns; only its last component must not
/// be a link.
pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(
        rustix::fs::CWD,
        path,
        DIR_FLAGS,
        Mode::empty(),
    )?)
}

/// Opens the directory `name` (one component) of `dir`: `ELOOP` or `ENOTDIR` when it is a
/// link or anything but a directory.
pub(super) fn open_child<P: rustix::path::Arg>(
    dir: BorrowedFd<'_>,
    name: P,
) -> io::Result<OwnedFd> {
    Ok(rustix::fs::openat(dir, name, DIR_FLAGS, Mode::empty())?)
}

/// Opens `relative` (plain components only) below `root`, one directory at a time, never
/// through a link.
pub(super) fn open_beneath(root: BorrowedFd<'_>, relative: &Path) -> io::Result<OwnedFd> {
    let mut dir = rustix::io::fcntl_dupfd_cloexec(root, 0)?;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "only plain path components",
            ));
        };
        dir = open_child(dir.as_fd(), name)?;
    }
    Ok(dir)
}

/// Whether `error` says the entry is not a directory one may enter (a link, a file, gone).
pub(super) fn is_not_a_dir(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ELOOP | libc::ENOTDIR | libc::ENOENT)
    )
}

/// One entry of a walk: the name `name` in the directory `dir`, as `stat` saw it.
pub(super) struct Entry<'a> {
    /// The directory holding it (for the root: the root itself, and `name` is `.`).
    pub dir: BorrowedFd<'a>,
    /// Its name: one component.
    pub name: &'a CStr,
    /// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
    pub stat: &'a Stat,
    /// The components above it, for messages.
    above: &'a [CString],
}

impl Entry<'_> {
    /// Its type.
    pub fn kind(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }

    /// The inode: `(st_dev, st_ino)`.
    #[allow(clippy::unnecessary_cast)]
    pub fn inode(&self) -> (u64, u64) {
        (self.stat.st_dev as u64, self.stat.st_ino as u64)
    }

    /// Its path as the sandbox saw it, for messages: control and bidi characters escaped.
    pub fn shown(&self) -> String {
        let mut path = Vec::new();
        for name in self.above.iter().map(|n| n.as_c_str()).chain([self.name]) {
            if name != c"." {
                path.push(b'/');
                path.extend_from_slice(name.to_bytes());
            }
        }
        if path.is_empty() {
            path.push(b'/');
        }
        escape(&String::from_utf8_lossy(&path))
    }

    /// Changes its owner, never through a link.
    pub fn chown(&self, uid: u32, gid: u32) -> io::Result<()> {
        Ok(rustix::fs::chownat(
            self.dir,
            self.name,
            Some(Uid::from_raw(uid)),
            Some(Gid::from_raw(gid)),
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// `/proc/self/fd/<dir>/<name>`: the entry itself for the `l*xattr` calls, which follow
    /// the fd's magic link (to the very directory the walk holds) but not the last
    /// component.
    fn proc_path(&self) -> io::Result<CString> {
        let mut path = format!("/proc/self/fd/{}/", self.dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(self.name.to_bytes());
        CString::new(path).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))
    }

    /// The names of its extended attributes (none where the filesystem keeps none).
    pub fn xattr_names(&self, buf: &mut [u8]) -> io::Result<Vec<CString>> {
        let len = match rustix::fs::llistxattr(self.proc_path()?, &mut *buf) {
            Ok(len) => len,
            Err(rustix::io::Errno::OPNOTSUPP) => 0,
            Err(e) => return Err(e.into()),
        };
        Ok(buf[..len]
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .filter_map(|name| CString::new(name).ok())
            .collect())
    }

    /// The value of its extended attribute `name`.
    pub fn xattr(&self, name: &CStr, buf: &mut [u8]) -> io::Result<Vec<u8>> {
        let len = rustix::fs::lgetxattr(self.proc_path()?, name, &mut *buf)?;
        Ok(buf[..len].to_vec())
    }

    /// Sets its extended attribute `name` (which must exist) to `value`.
    pub fn set_xattr(&self, name: &CStr, value: &[u8]) -> io::Result<()> {
        Ok(rustix::fs::lsetxattr(
            self.proc_path()?,
            name,
            value,
            rustix::fs::XattrFlags::REPLACE,
        )?)
    }

    /// Removes its extended attribute `name`.
    pub fn remove_xattr(&self, name: &CStr) -> io::Result<()> {
        Ok(rustix::fs::lremovexattr(self.proc_path()?, name)?)
    }
}

/// `text` with control and bidirectional-formatting characters escaped (`\n`, `\u{202e}`):
/// a layer's names are the build's, and a message shows them on one line as they are.
pub(super) fn escape(text: &str) -> String {
    let bidi = |c: char| matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    text.chars()
        .map(|c| {
            if c.is_control() || bidi(c) {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// Calls `visit` for the root of `root` (named `.`) and then for every entry below it,
/// depth first, each directory entered only after `visit` saw it. Refuses more than
/// `limits.entries` entries or deeper nesting than `limits.depth`, and a directory that is
/// not the inode its entry showed (the tree changed under the walk).
pub(super) fn walk(
    root: BorrowedFd<'_>,
    limits: Limits,
    visit: &mut dyn FnMut(&Entry<'_>) -> Result<(), EnvLayerError>,
) -> Result<(), EnvLayerError> {
    let read = |shown: &str| {
        let what = format!("read the layer at {shown}");
        move |e: rustix::io::Errno| EnvLayerError::Io {
            what,
            source: e.into(),
        }
    };
    let stat = rustix::fs::statat(root, c".", AtFlags::SYMLINK_NOFOLLOW).map_err(read("/"))?;
    visit(&Entry {
        dir: root,
        name: c".",
        stat: &stat,
        above: &[],
    })?;
    let mut entries = 1u64;
    let mut stack = vec![Dir::read_from(root).map_err(read("/"))?];
    let mut above: Vec<CString> = Vec::new();
    loop {
        // The nesting of a directory entered from here.
        let depth = stack.len();
        let Some(dir) = stack.last_mut() else {
            break;
        };
        let Some(next) = dir.read() else {
            stack.pop();
            above.pop();
            continue;
        };
        let next = next.map_err(|e| read(&shown_dir(&above))(e))?;
        let name = next.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        entries += 1;
        if entries > limits.entries {
            return Err(EnvLayerError::Refused(format!(
                "more than {} entries",
                limits.entries
            )));
        }
        let dir_fd = dir.fd().map_err(|e| read(&shown_dir(&above))(e))?;
        let stat = rustix::fs::statat(dir_fd, name, AtFlags::SYMLINK_NOFOLLOW);
        let stat = stat.map_err(|e| read(&shown_dir(&above))(e))?;
        let entry = Entry {
            dir: dir_fd,
            name,
            stat: &stat,
            above: &above,
        };
        visit(&entry)?;
        if entry.kind() != FileType::Directory {
            continue;
        }
        let shown = entry.shown();
        let inode = entry.inode();
        if depth > limits.depth {
            return Err(EnvLayerError::Refused(format!(
                "{shown}: nested deeper than {} directories",
                limits.depth
            )));
        }
        let child = open_child(dir_fd, name).map_err(|e| EnvLayerError::Io {
            what: format!("read the layer at {shown}"),
            source: e,
        })?;
        let opened = rustix::fs::fstat(&child).map_err(read(&shown))?;
        #[allow(clippy::unnecessary_cast)]
        if (opened.st_dev as u64, opened.st_ino as u64) != inode {
            return Err(EnvLayerError::Refused(format!(
                "{shown} changed while the host walked the layer"
            )));
        }
        above.push(name.to_owned());
        stack.push(Dir::new(child).map_err(read(&shown))?);
    }
    Ok(())
}

/// The directory `above` names, for messages.
fn shown_dir(above: &[CString]) -> String {
    let mut path = String::new();
    for name in above {
        path.push('/');
        path.push_str(&String::from_utf8_lossy(name.to_bytes()));
    }
    if path.is_empty() {
        path.push('/');
    }
    escape(&path)
}

/// Directories [`remove_tree`] keeps open at once; a subtree deeper than this is moved up
/// to the top of the tree being removed (one `renameat`), and removed from there.
const REMOVE_DEPTH: usize = 32;
/// How often [`remove_tree`] reads one directory again that was not empty at its end (the
/// subtrees moved up into the top one; a writer adding entries).
const REMOVE_REREADS: u32 = 1 << 16;

/// Removes the tree at `path` (a path the host owns: only its last component must not be
/// a link; one is removed, not followed) however deep it is: iteratively, never holding
/// more than [`REMOVE_DEPTH`] directory fds and with no recursion, every entry removed
/// through `unlinkat` in its directory's fd. std's `remove_dir_all` recurses with one fd
/// per level: a build step's tree 20 000 directories deep overflowed a 2 MiB thread stack
/// (aborting the host process), and 3 000 deep failed with `EMFILE` under a 1024 fd limit,
/// leaving the tree for every later removal to trip over.
pub(super) fn remove_tree(path: &Path) -> io::Result<()> {
    let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a path with a parent",
        ));
    };
    let parent = rustix::fs::open(
        if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        },
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    match rustix::fs::statat(&parent, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
        Ok(stat) if FileType::from_raw_mode(stat.st_mode) != FileType::Directory => {
            return Ok(rustix::fs::unlinkat(&parent, name, AtFlags::empty())?);
        }
        Ok(_) => {}
    }
    let top = open_child(parent.as_fd(), name)?;
    let top_fd = rustix::io::fcntl_dupfd_cloexec(&top, 0)?;
    // The open directories, topmost first, each with its name in the one above it and how
    // often it was read again.
    let mut stack: Vec<(Dir, CString, u32)> = vec![(
        Dir::new(top)?,
        CString::new(name.as_encoded_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        0,
    )];
    let mut moved = 0u64;
    loop {
        let depth = stack.len();
        let Some((dir, _, _)) = stack.last_mut() else {
            break;
        };
        let Some(entry) = dir.read() else {
            let Some((mut dir, name, rereads)) = stack.pop() else {
                break;
            };
            let above = match stack.last() {
                Some((above, _, _)) => above.fd()?,
                None => parent.as_fd(),
            };
            match rustix::fs::unlinkat(above, &name, AtFlags::REMOVEDIR) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                // Entries it did not show (subtrees moved up into it): read it again.
                Err(rustix::io::Errno::NOTEMPTY) if rereads < REMOVE_REREADS => {
                    dir.rewind();
                    stack.push((dir, name, rereads + 1));
                }
                Err(e) => return Err(e.into()),
            }
            continue;
        };
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let fd = dir.fd()?;
        let is_dir = match entry.file_type() {
            FileType::Directory => true,
            FileType::Unknown => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory),
            _ => false,
        };
        if !is_dir {
            match rustix::fs::unlinkat(fd, name, AtFlags::empty()) {
                Ok(()) | Err(rustix::io::Errno::NOENT) => continue,
                // A directory after all (the tree changed): entered below.
                Err(rustix::io::Errno::ISDIR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        if depth < REMOVE_DEPTH {
            let child = open_child(fd, name)?;
            let name = name.to_owned();
            stack.push((Dir::new(child)?, name, 0));
            continue;
        }
        // Too deep to hold another fd: move the subtree to the top, under a name nothing
        // there has.
        loop {
            let to = format!(".omabox-removing-{moved}");
            moved += 1;
            match rustix::fs::renameat_with(fd, name, &top_fd, &to, RenameFlags::NOREPLACE) {
                Ok(()) => break,
                Err(rustix::io::Errno::EXIST) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Bytes of the regular files under `root` (each inode once), walked as [`walk`] does.
pub(super) fn size(root: BorrowedFd<'_>, limits: Limits) -> Result<u64, EnvLayerError> {
    let (mut bytes, mut seen) = (0u64, std::collections::HashSet::new());
    walk(root, limits, &mut |entry| {
        #[allow(clippy::unnecessary_cast)]
        if entry.kind() == FileType::RegularFile
            && (entry.stat.st_nlink == 1 || seen.insert(entry.inode()))
        {
            bytes = bytes.saturating_add(entry.stat.st_size.max(0) as u64);
        }
        Ok(())
    })?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tree deeper than any fd limit (25 000 levels: above this machine's 20 000, 25 times
    /// the usual 1024) with files, links and FIFOs along the way, removed on a thread with a
    /// 256 KiB stack. Before, std's `remove_dir_all` failed here (`EMFILE`) or overflowed
    /// the stack and aborted the process. On tmpfs where there is one: a disk's `rmdir`
    /// may wait for the device (GNU `rm -rf` took 60 s for this tree on the test machine's
    /// ext4).
    #[test]
    fn a_tree_deeper_than_any_fd_limit_is_removed_without_recursion() {
        let dir = match Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm").unwrap(),
            false => tempfile::tempdir().unwrap(),
        };
        let top = dir.path().join("partial");
        std::fs::create_dir(&top).unwrap();
        let kept = dir.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("file"), b"the host's").unwrap();
        let mut level = open_dir(&top).unwrap();
        for i in 0..25_000 {
            if i % 5_000 == 0 {
                rustix::fs::symlinkat(&kept, &level, "link").unwrap();
                rustix::fs::mkfifoat(&level, "fifo", Mode::from_raw_mode(0o644)).unwrap();
                rustix::fs::openat(
                    &level,
                    "file",
                    OFlags::CREATE | OFlags::WRONLY | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .unwrap();
                // A name the remover moves deep subtrees to is taken already.
                rustix::fs::mkdirat(&level, ".omabox-removing-0", Mode::from_raw_mode(0o755))
                    .unwrap();
            }
            rustix::fs::mkdirat(&level, "d", Mode::from_raw_mode(0o755)).unwrap();
            level = open_child(level.as_fd(), "d").unwrap();
        }
        drop(level);
        let path = top.clone();
        std::thread::Builder::new()
            .stack_size(256 << 10)
            .spawn(move || remove_tree(&path))
            .unwrap()
            .join()
            .expect("no stack overflow")
            .unwrap();
        assert!(!top.exists());
        // The links were removed, not followed.
        assert_eq!(std::fs::read(kept.join("file")).unwrap(), b"the host's");

        // A link at the top is removed itself; a path that is not there is no error.
        let link = dir.path().join("top-link");
        std::os::unix::fs::symlink(&kept, &link).unwrap();
        remove_tree(&link).unwrap();
        assert!(std::fs::symlink_metadata(&link).is_err());
        assert!(kept.join("file").exists());
        remove_tree(&dir.path().join("absent")).unwrap();
    }
}
