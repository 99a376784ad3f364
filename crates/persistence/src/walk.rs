//! An iterative, no-follow, depth-first walk of a sandbox-writable tree.
//!
//! Visits entries in the order checkpoints record them: names sorted by bytes, a directory
//! before its children, children before the directory's next sibling. It keeps an explicit
//! stack (one open directory fd per level) instead of recursing, so a tree nested as deep as
//! [`MAX_DEPTH`] never overflows a thread's stack; the visitor decides whether to descend.
//! Every directory is opened relative to its parent with `O_NOFOLLOW` (see `safe_fs`).
//!
//! What it must never do: follow a symlink, or descend deeper than [`MAX_DEPTH`] levels.

use crate::error::{IoContext, PersistenceError, Result};
use crate::safe_fs::{self, EntryStat, MAX_DEPTH};
use crate::snapshot::changed_or_io;
use rustix::fs::FileType;
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// One entry the walk found.
pub(crate) struct Visit<'a> {
    /// The directory holding the entry.
    pub dir: BorrowedFd<'a>,
    /// The entry's name in `dir`; `None` when it is not UTF-8 (`path` is then lossy).
    pub name: Option<&'a str>,
    /// The path relative to the root, `/`-separated.
    pub path: String,
    /// Its no-follow stat (`None` for a non-UTF-8 name, which is not stat'ed).
    pub stat: Option<EntryStat>,
    /// Segments in `path`.
    pub depth: usize,
}

/// What the visitor wants after a directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Descend {
    /// Walk into it.
    Yes,
    /// Skip its contents.
    No,
}

struct Frame {
    fd: OwnedFd,
    prefix: String,
    names: std::vec::IntoIter<CString>,
}

/// Bounds of one walk.
pub(crate) struct WalkLimits {
    /// Most entries listed in all (each directory's listing is capped by what is left).
    pub max_entries: u64,
    /// The error once `max_entries` is passed.
    pub too_many: fn(u64) -> PersistenceError,
}

/// Walks `root`; `what` names the tree in errors ("workspace", "outputs"). Entries that vanish
/// between listing and stat are left out. The visitor is called for every entry; for a
/// directory its answer decides whether the walk descends (never past [`MAX_DEPTH`]). More
/// than `limits.max_entries` listed entries fail the walk before they are all held in memory.
pub(crate) fn walk(
    root: OwnedFd,
    what: &str,
    limits: WalkLimits,
    mut visit: impl FnMut(Visit<'_>) -> Result<Descend>,
) -> Result<()> {
    let mut listed = 0u64;
    let mut list = |dir: BorrowedFd<'_>, path: &str| -> Result<Vec<CString>> {
        let left = limits.max_entries.saturating_sub(listed);
        let names = safe_fs::list_names_capped(dir, left)
            .ctx(|| format!("Cannot list {what} directory /{path}"))?
            .ok_or_else(|| (limits.too_many)(limits.max_entries))?;
        listed += names.len() as u64;
        Ok(names)
    };
    let names = list(root.as_fd(), "")?;
    let mut stack = vec![Frame {
        fd: root,
        prefix: String::new(),
        names: names.into_iter(),
    }];
    while let Some(frame) = stack.last_mut() {
        let Some(name) = frame.names.next() else {
            stack.pop();
            continue;
        };
        let depth = stack.len();
        let frame = &stack[depth - 1];
        let Ok(text) = name.to_str() else {
            let path = join(&frame.prefix, &name.to_string_lossy());
            visit(Visit {
                dir: frame.fd.as_fd(),
                name: None,
                path,
                stat: None,
                depth,
            })?;
            continue;
        };
        let path = join(&frame.prefix, text);
        let stat = match safe_fs::stat_at(frame.fd.as_fd(), text) {
            Ok(stat) => stat,
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(PersistenceError::io(format!("Cannot stat {path}"), error)),
        };
        let descend = visit(Visit {
            dir: frame.fd.as_fd(),
            name: Some(text),
            path: path.clone(),
            stat: Some(stat),
            depth,
        })?;
        if stat.file_type != FileType::Directory || descend == Descend::No || depth >= MAX_DEPTH {
            continue;
        }
        let child = safe_fs::open_dir_at(frame.fd.as_fd(), text)
            .map_err(|error| changed_or_io(&path, error))?;
        let names = list(child.as_fd(), &path)?;
        stack.push(Frame {
            fd: child,
            prefix: path,
            names: names.into_iter(),
        });
    }
    Ok(())
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}
