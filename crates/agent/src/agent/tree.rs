//! Directory-tree operations: make a directory (with parents, chowned to an account),
//! rename, and remove a file or a whole tree.
//!
//! Removal works on directory fds (`openat` with `O_NOFOLLOW|O_DIRECTORY`, `unlinkat`),
//! never on path strings below the target: a symlink inside the tree is unlinked, never
//! followed, and a directory swapped for a symlink while the removal runs is unlinked
//! as the symlink it became. It must never remove anything outside the named tree.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Dir, Mode, OFlags};
use rustix::io::Errno;

use super::conn::StreamIo;
use super::users;
use crate::message::{ErrorKind, MadeDir, RemoteError};

/// Runs blocking file-system work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, RemoteError> + Send + 'static,
) -> Result<T, RemoteError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| RemoteError::new(ErrorKind::Io, format!("file task failed: {e}")))?
}

/// uid and gid of the account `owner` names, if any.
pub(crate) fn owner_ids(
    etc: &Path,
    owner: Option<&str>,
) -> Result<Option<(u32, u32)>, RemoteError> {
    owner
        .map(|name| users::lookup(etc, name).map(|a| (a.uid, a.gid)))
        .transpose()
}

/// Creates `dir` and its missing ancestors (mode 0755), chowning each one created to
/// `ids`; returns the directories created, outermost first. An existing directory (or
/// symlink to one) is fine; an existing non-directory is `already_exists`.
pub(crate) fn create_dirs(
    dir: &Path,
    ids: Option<(u32, u32)>,
) -> Result<Vec<PathBuf>, RemoteError> {
    let mut missing = Vec::new();
    for a in dir.ancestors() {
        match std::fs::metadata(a) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => {
                return Err(RemoteError::new(
                    ErrorKind::AlreadyExists,
                    format!("{} exists and is not a directory", a.display()),
                ));
            }
            // ENOTDIR: an ancestor is a file, which the next round reports.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
                ) =>
            {
                missing.push(a.to_path_buf());
            }
            Err(e) => return Err(RemoteError::io(format!("cannot stat {}", a.display()), &e)),
        }
    }
    let mut created = Vec::new();
    for d in missing.into_iter().rev() {
        match std::fs::DirBuilder::new().mode(0o755).create(&d) {
            Ok(()) => {}
            // Made by someone else meanwhile: fine if it is a directory.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && d.is_dir() => continue,
            Err(e) => {
                return Err(RemoteError::io(
                    format!("cannot create {}", d.display()),
                    &e,
                ));
            }
        }
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::lchown(&d, Some(uid), Some(gid))
                .map_err(|e| RemoteError::io(format!("cannot chown {}", d.display()), &e))?;
        }
        created.push(d);
    }
    Ok(created)
}

pub(crate) async fn make_dir(
    io: &StreamIo,
    path: &str,
    owner: Option<String>,
) -> Result<MadeDir, RemoteError> {
    let agent = io.conn.agent.clone();
    let p = agent.resolve(path);
    blocking(move || {
        let ids = owner_ids(&agent.config.etc_dir, owner.as_deref())?;
        let created = create_dirs(&p, ids)?;
        Ok(MadeDir {
            path: p.to_string_lossy().into_owned(),
            created: !created.is_empty(),
        })
    })
    .await
}

pub(crate) async fn rename(io: &StreamIo, from: &str, to: &str) -> Result<(), RemoteError> {
    let (a, b) = (io.conn.agent.resolve(from), io.conn.agent.resolve(to));
    tokio::fs::rename(&a, &b).await.map_err(|e| {
        RemoteError::io(
            format!("cannot rename {} to {}", a.display(), b.display()),
            &e,
        )
    })
}

pub(crate) async fn remove(io: &StreamIo, path: &str) -> Result<(), RemoteError> {
    let p = io.conn.agent.resolve(path);
    blocking(move || {
        let ctx = |e: io::Error| RemoteError::io(format!("cannot remove {}", p.display()), &e);
        let (parent, name) = split(&p).ok_or_else(|| {
            RemoteError::new(
                ErrorKind::InvalidRequest,
                format!("{} cannot be removed", p.display()),
            )
        })?;
        let dir = rustix::fs::open(
            &parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| ctx(e.into()))?;
        remove_at(dir, &name).map_err(ctx)
    })
    .await
}

/// The parent directory and final name of `p`, with `.` and `..` settled lexically; `None`
/// for `/` (or anything naming no entry).
fn split(p: &Path) -> Option<(PathBuf, CString)> {
    let mut parts: Vec<&OsStr> = Vec::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    let name = parts.pop()?;
    let mut parent = PathBuf::from("/");
    parent.extend(parts);
    use std::os::unix::ffi::OsStrExt;
    Some((parent, CString::new(name.as_bytes()).ok()?))
}

/// Unlinks a non-directory entry; `Ok(false)` when it is a directory.
fn unlink_entry(dir: impl AsFd, name: &CString) -> io::Result<bool> {
    match rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty()) {
        Ok(()) => Ok(true),
        Err(Errno::ISDIR) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Opens a directory entry without following a symlink; `None` (after unlinking it) when
/// it is no longer a directory (swapped for a symlink or a file meanwhile).
fn open_dir_entry(dir: impl AsFd, name: &CString) -> io::Result<Option<OwnedFd>> {
    let dir = dir.as_fd();
    match rustix::fs::openat(
        dir,
        name.as_c_str(),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => Ok(Some(fd)),
        Err(Errno::NOTDIR | Errno::LOOP) => {
            rustix::fs::unlinkat(dir, name.as_c_str(), AtFlags::empty())?;
            Ok(None)
        }
        Err(e) => Err(e.into()),
    }
}

fn entry_names(dir: &OwnedFd) -> io::Result<Vec<CString>> {
    let mut names = Vec::new();
    let mut it = Dir::read_from(dir)?;
    while let Some(entry) = it.read() {
        let entry = entry?;
        let n = entry.file_name();
        if n != c"." && n != c".." {
            names.push(n.to_owned());
        }
    }
    Ok(names)
}

/// Removes `name` in `parent` and, when it is a directory, everything below it. The walk
/// keeps one fd per level (iterative: a deep tree costs fds, bounded by the fd limit,
/// never stack).
fn remove_at(parent: OwnedFd, name: &CString) -> io::Result<()> {
    if unlink_entry(&parent, name)? {
        return Ok(());
    }
    let Some(top) = open_dir_entry(&parent, name)? else {
        return Ok(());
    };
    let names = entry_names(&top)?;
    // (directory fd, entries left to remove, its name in the level above)
    let mut stack: Vec<(OwnedFd, Vec<CString>, CString)> = vec![(top, names, name.clone())];
    while let Some((fd, left, _)) = stack.last_mut() {
        if let Some(child) = left.pop() {
            if unlink_entry(&*fd, &child)? {
                continue;
            }
            if let Some(sub) = open_dir_entry(&*fd, &child)? {
                let names = entry_names(&sub)?;
                stack.push((sub, names, child));
            }
            continue;
        }
        let Some((fd, _, own)) = stack.pop() else {
            break;
        };
        drop(fd);
        let above = stack.last().map_or(parent.as_fd(), |(fd, _, _)| fd.as_fd());
        rustix::fs::unlinkat(above, own.as_c_str(), AtFlags::REMOVEDIR)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir_fd(p: &Path) -> OwnedFd {
        rustix::fs::open(p, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap()
    }

    /// What the walk does when a directory it is about to enter became a symlink (the
    /// race a sandbox process could run): the link is removed, its target never entered.
    #[test]
    fn a_directory_swapped_for_a_symlink_is_unlinked_not_entered() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("outside")).unwrap();
        std::fs::write(t.path().join("outside/keep"), b"k").unwrap();
        std::fs::create_dir(t.path().join("tree")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), t.path().join("tree/d")).unwrap();
        let tree = dir_fd(&t.path().join("tree"));
        assert!(
            open_dir_entry(&tree, &CString::new("d").unwrap())
                .unwrap()
                .is_none()
        );
        assert!(t.path().join("tree/d").symlink_metadata().is_err());
        assert!(t.path().join("outside/keep").is_file());
        // A file in its place is unlinked the same way.
        std::fs::write(t.path().join("tree/f"), b"x").unwrap();
        assert!(
            open_dir_entry(&tree, &CString::new("f").unwrap())
                .unwrap()
                .is_none()
        );
        assert!(!t.path().join("tree/f").exists());
        // And the whole tree goes, its symlinked-to directory stays.
        std::fs::create_dir_all(t.path().join("tree/a/b")).unwrap();
        std::os::unix::fs::symlink(t.path().join("outside"), t.path().join("tree/a/b/l")).unwrap();
        remove_at(dir_fd(t.path()), &CString::new("tree").unwrap()).unwrap();
        assert!(!t.path().join("tree").exists());
        assert!(t.path().join("outside/keep").is_file());
    }

    #[test]
    fn split_settles_dots() {
        let (p, n) = split(Path::new("/a/b/../c/./d")).unwrap();
        assert_eq!(p, PathBuf::from("/a/c"));
        assert_eq!(n.as_c_str(), c"d");
        assert!(split(Path::new("/")).is_none());
        assert!(split(Path::new("/a/..")).is_none());
    }
}
