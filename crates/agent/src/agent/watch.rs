//! Watching a directory with inotify: every change below it as a JSON line on the
//! stream's stdout channel, under its flow-control window.
//!
//! An unread stream makes this task stop reading inotify, so the kernel's queue (not the
//! agent) fills; its overflow is reported as an error that ends the stream. Recursive
//! watches follow directories created later; at most [`MAX_WATCHES`] directories are
//! watched, and a tree larger than that is refused rather than watched in part. What a new
//! directory already holds when its watch is added (written before the agent read the
//! directory's own event, or moved in with it) gets no event of its own from the kernel, so
//! the scan that adds the watch reports each entry it finds as created: nothing is missed,
//! and an entry written while the scan runs may be reported twice.
//!
//! With `include_entry`, each event carries its path's metadata, read (`lstat`, inside the
//! sandbox) when the event is read, so a path changed again meanwhile shows its latest
//! state and a path gone by then has none.
//!
//! Must never: follow a symlink to a directory (watches are added with `IN_DONT_FOLLOW`
//! and `IN_ONLYDIR`, subdirectories found without following links), or buffer events
//! beyond one kernel read.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use tokio::io::unix::AsyncFd;

use super::conn::StreamIo;
use super::files::file_stat;
use super::users::Names;
use crate::frame::channel;
use crate::message::{ErrorKind, Event, FileStat, RemoteError, WatchEvent};

/// Directories one watch may cover.
pub(crate) const MAX_WATCHES: usize = 8192;
/// Bytes of one inotify read.
const READ_BUFFER: usize = 64 * 1024;
/// Entries one new directory's scan may report (the kernel's default event queue); more end
/// the watch as an overflow does.
const MAX_FOUND: usize = 16_384;

/// The directories being watched, by watch descriptor, as paths relative to the root.
struct Watches {
    fd: AsyncFd<OwnedFd>,
    root: PathBuf,
    dirs: HashMap<i32, PathBuf>,
}

impl Watches {
    fn add(&mut self, relative: PathBuf) -> Result<(), RemoteError> {
        if self.dirs.len() >= MAX_WATCHES {
            return Err(RemoteError::new(
                ErrorKind::InvalidRequest,
                format!(
                    "{} holds more than {MAX_WATCHES} directories: watch a smaller tree",
                    self.root.display()
                ),
            ));
        }
        let flags = WatchFlags::CREATE
            | WatchFlags::MODIFY
            | WatchFlags::DELETE
            | WatchFlags::MOVED_FROM
            | WatchFlags::MOVED_TO
            | WatchFlags::ATTRIB
            | WatchFlags::DONT_FOLLOW
            | WatchFlags::ONLYDIR
            | WatchFlags::EXCL_UNLINK;
        let path = self.root.join(&relative);
        match inotify::add_watch(self.fd.get_ref().as_fd(), &path, flags) {
            Ok(wd) => {
                self.dirs.insert(wd, relative);
                Ok(())
            }
            // Gone or replaced meanwhile: nothing to watch there.
            Err(Errno::NOENT | Errno::NOTDIR) if !relative.as_os_str().is_empty() => Ok(()),
            Err(e) => Err(RemoteError::io(
                format!("cannot watch {}", path.display()),
                &e.into(),
            )),
        }
    }

    /// Watches `relative` and every directory below it (symlinks not followed). With
    /// `found`, every entry below `relative` is added to it, each after the watch of its
    /// directory (a directory just created: what it holds was created after it).
    fn add_tree(
        &mut self,
        relative: PathBuf,
        mut found: Option<&mut Vec<PathBuf>>,
    ) -> Result<(), RemoteError> {
        let mut pending = vec![relative];
        while let Some(dir) = pending.pop() {
            self.add(dir.clone())?;
            let Ok(entries) = std::fs::read_dir(self.root.join(&dir)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = dir.join(entry.file_name());
                if let Some(found) = found.as_deref_mut() {
                    if found.len() >= MAX_FOUND {
                        return Err(RemoteError::new(ErrorKind::Io, LOST_EVENTS));
                    }
                    found.push(path.clone());
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(path);
                }
            }
        }
        Ok(())
    }
}

/// Why a watch ended with events it could not report.
const LOST_EVENTS: &str =
    "too many file events were not read in time; the watch lost some and ended";

fn op_of(flags: ReadFlags) -> Option<&'static str> {
    if flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO) {
        Some("create")
    } else if flags.contains(ReadFlags::MODIFY) {
        Some("write")
    } else if flags.contains(ReadFlags::DELETE) {
        Some("remove")
    } else if flags.contains(ReadFlags::MOVED_FROM) {
        Some("rename")
    } else if flags.contains(ReadFlags::ATTRIB) {
        Some("chmod")
    } else {
        None
    }
}

/// The event of an entry a new directory's scan found (`path` relative to the root).
fn created(path: &Path) -> WatchEvent {
    WatchEvent {
        name: path.to_string_lossy().into_owned(),
        op: "create".to_owned(),
        entry: None,
    }
}

fn line(value: &impl serde::Serialize) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// The metadata of `path` (a final symlink not followed); `None` once it is gone.
fn entry_of(path: &Path, names: &Names) -> Option<FileStat> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let target = if meta.file_type().is_symlink() {
        std::fs::read_link(path)
            .ok()
            .map(|t| t.to_string_lossy().into_owned())
    } else {
        None
    };
    Some(file_stat(path, &meta, target, names))
}

pub(crate) async fn watch_dir(
    io: &mut StreamIo,
    path: &str,
    recursive: bool,
    include_entry: bool,
) -> Result<Event, RemoteError> {
    let root = io.conn.agent.resolve(path);
    let meta = std::fs::symlink_metadata(&root)
        .map_err(|e| RemoteError::io(format!("cannot watch {}", root.display()), &e))?;
    if !meta.is_dir() {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("{} is not a directory", root.display()),
        ));
    }
    let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK)
        .map_err(|e| RemoteError::io("cannot start watching", &e.into()))?;
    // SAFETY: `fd` is an open inotify descriptor that the `AsyncFd` owns from here on: it
    // stays open, and `as_raw_fd` keeps returning it, until the `AsyncFd` is dropped.
    let fd = unsafe { AsyncFd::register(fd) }
        .map_err(|e| RemoteError::io("cannot start watching", &e.into_parts().1))?;
    let mut watches = Watches {
        fd,
        root,
        dirs: HashMap::new(),
    };
    if recursive {
        watches.add_tree(PathBuf::new(), None)?;
    } else {
        watches.add(PathBuf::new())?;
    }
    let out = io.sender(channel::STDOUT);
    if !out
        .send_all(line(&serde_json::json!({ "watching": watches.dirs.len() })))
        .await
    {
        return Ok(Event::Ok {
            result: serde_json::Value::Null,
        });
    }
    let mut buf = vec![MaybeUninit::<u8>::uninit(); READ_BUFFER];
    loop {
        let mut ready = watches
            .fd
            .readable()
            .await
            .map_err(|e| RemoteError::io("cannot read file events", &e))?;
        let mut seen: Vec<(WatchEvent, PathBuf, bool)> = Vec::new();
        let mut overflow = false;
        let mut forgotten = Vec::new();
        {
            let mut reader = inotify::Reader::new(watches.fd.get_ref().as_fd(), &mut buf);
            loop {
                match reader.next() {
                    Ok(event) => {
                        let flags = event.events();
                        if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                            overflow = true;
                            break;
                        }
                        if flags.contains(ReadFlags::IGNORED) {
                            forgotten.push(event.wd());
                            continue;
                        }
                        let (Some(dir), Some(op), Some(name)) = (
                            watches.dirs.get(&event.wd()),
                            op_of(flags),
                            event.file_name(),
                        ) else {
                            continue;
                        };
                        let name = Path::new(std::ffi::OsStr::from_bytes(name.to_bytes()));
                        let relative = dir.join(name);
                        let new_dir =
                            recursive && flags.contains(ReadFlags::ISDIR) && op == "create";
                        seen.push((
                            WatchEvent {
                                name: relative.to_string_lossy().into_owned(),
                                op: op.to_owned(),
                                entry: None,
                            },
                            relative,
                            new_dir,
                        ));
                    }
                    Err(Errno::AGAIN) => {
                        ready.clear_ready();
                        break;
                    }
                    Err(Errno::INTR) => {}
                    Err(e) => {
                        return Err(RemoteError::io("cannot read file events", &e.into()));
                    }
                }
            }
        }
        drop(ready);
        for wd in forgotten {
            watches.dirs.remove(&wd);
        }
        if overflow {
            return Err(RemoteError::new(ErrorKind::Io, LOST_EVENTS));
        }
        let names =
            (include_entry && !seen.is_empty()).then(|| Names::load(&io.conn.agent.config.etc_dir));
        for (event, relative, new_dir) in seen {
            let mut events = vec![(event, relative.clone())];
            if new_dir {
                let mut found = Vec::new();
                watches.add_tree(relative, Some(&mut found))?;
                events.extend(found.into_iter().map(|path| (created(&path), path)));
            }
            for (mut event, path) in events {
                if let Some(names) = &names {
                    event.entry = entry_of(&watches.root.join(&path), names);
                }
                if !out.send_all(line(&event)).await {
                    return Ok(Event::Ok {
                        result: serde_json::Value::Null,
                    });
                }
            }
        }
    }
}
