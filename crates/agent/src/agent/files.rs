//! File bytes in and out (streamed under flow control), stat and list (with the owner's
//! and group's names from the sandbox's account files).
//!
//! Writes go to a temporary file in the target's directory which is synced and renamed
//! into place, so a reader never sees half a file and a cancelled write leaves nothing.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::AsyncWriteExt;

use super::conn::{Inbound, StreamIo};
use super::tree;
use super::users::Names;
use crate::frame::channel;
use crate::message::{DirEntry, ErrorKind, Event, FileKind, FileStat, RemoteError, WriteDone};

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn lossy(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

pub(crate) async fn read_file(io: &mut StreamIo, path: &str) -> Result<Event, RemoteError> {
    let p = io.conn.agent.resolve(path);
    // Non-blocking open: a fifo without a writer would block the open forever. Only a
    // regular file is read (a device like `/dev/zero` never ends).
    let mut f = tokio::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&p)
        .await
        .map_err(|e| RemoteError::io(format!("cannot open {}", p.display()), &e))?;
    let meta = f
        .metadata()
        .await
        .map_err(|e| RemoteError::io(format!("cannot stat {}", p.display()), &e))?;
    if meta.is_dir() {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("{} is a directory", p.display()),
        ));
    }
    if !meta.is_file() {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("{} is not a regular file", p.display()),
        ));
    }
    io.event(&Event::File {
        size: meta.len(),
        mode: meta.mode() & 0o7777,
    });
    let sender = io.sender(channel::STDOUT);
    let (_, bytes) = sender
        .pump(&mut f, None, std::time::Duration::ZERO)
        .await
        .map_err(|e| RemoteError::io(format!("cannot read {}", p.display()), &e))?;
    ok(&WriteDone {
        path: lossy(&p),
        bytes,
    })
}

/// Removes a temporary file unless disarmed.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub(crate) async fn write_file(
    io: &mut StreamIo,
    path: &str,
    mode: Option<u32>,
    create_parents: bool,
    owner: Option<&str>,
) -> Result<Event, RemoteError> {
    let p = io.conn.agent.resolve(path);
    let ids = tree::owner_ids(&io.conn.agent.config.etc_dir, owner)?;
    let (Some(parent), Some(name)) = (p.parent(), p.file_name()) else {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("{} is not a file path", p.display()),
        ));
    };
    if create_parents {
        let parent = parent.to_path_buf();
        tree::blocking(move || tree::create_dirs(&parent, ids)).await?;
    }
    let existing = tokio::fs::metadata(&p).await.ok();
    if existing.as_ref().is_some_and(|m| m.is_dir()) {
        return Err(RemoteError::new(
            ErrorKind::AlreadyExists,
            format!("{} is a directory", p.display()),
        ));
    }
    let tmp = parent.join(format!(
        ".{}.omabox-{}-{}.tmp",
        name.to_string_lossy(),
        std::process::id(),
        TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let mut guard = TempFile(Some(tmp.clone()));
    let mut f = tokio::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .await
        .map_err(|e| RemoteError::io(format!("cannot create {}", p.display()), &e))?;
    let credit = io.input_credit();
    let mut bytes = 0u64;
    loop {
        match io.inbound.recv().await {
            Some(Inbound::Data(chunk)) => {
                f.write_all(&chunk)
                    .await
                    .map_err(|e| RemoteError::io(format!("cannot write {}", p.display()), &e))?;
                bytes += chunk.len() as u64;
                credit.consumed(chunk.len());
            }
            Some(Inbound::Eof) => break,
            Some(Inbound::Control(_)) => {}
            None => return Err(RemoteError::new(ErrorKind::Io, "write cancelled")),
        }
    }
    let sync = async {
        f.flush().await?;
        f.sync_all().await?;
        // Never setuid/setgid: a file written here may be run by a host user later.
        let perm = match (mode, &existing) {
            (Some(m), _) => m & 0o1777,
            (None, Some(meta)) => meta.mode() & 0o1777,
            (None, None) => 0o644,
        };
        tokio::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(perm)).await?;
        if let Some((uid, gid)) = ids {
            std::os::unix::fs::fchown(&f, Some(uid), Some(gid))?;
        }
        drop(f);
        tokio::fs::rename(&tmp, &p).await
    };
    sync.await
        .map_err(|e| RemoteError::io(format!("cannot write {}", p.display()), &e))?;
    guard.0 = None;
    ok(&WriteDone {
        path: lossy(&p),
        bytes,
    })
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Dir
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

pub(crate) async fn stat(io: &StreamIo, path: &str) -> Result<FileStat, RemoteError> {
    let p = io.conn.agent.resolve(path);
    let meta = tokio::fs::symlink_metadata(&p)
        .await
        .map_err(|e| RemoteError::io(format!("cannot stat {}", p.display()), &e))?;
    let names = Names::load(&io.conn.agent.config.etc_dir);
    let link_target = if meta.file_type().is_symlink() {
        tokio::fs::read_link(&p).await.ok().map(|t| lossy(&t))
    } else {
        None
    };
    Ok(file_stat(&p, &meta, link_target, &names))
}

/// The [`FileStat`] of `path`, from its `lstat` metadata.
pub(crate) fn file_stat(
    path: &Path,
    meta: &std::fs::Metadata,
    link_target: Option<String>,
    names: &Names,
) -> FileStat {
    FileStat {
        path: lossy(path),
        kind: kind_of(meta.file_type()),
        size: meta.len(),
        mode: meta.mode() & 0o7777,
        mtime_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
        link_target,
        uid: meta.uid(),
        gid: meta.gid(),
        owner: names.user(meta.uid()),
        group: names.group(meta.gid()),
    }
}

pub(crate) async fn list_dir(io: &StreamIo, path: &str) -> Result<Vec<DirEntry>, RemoteError> {
    let p = io.conn.agent.resolve(path);
    let ctx = |e: std::io::Error| RemoteError::io(format!("cannot list {}", p.display()), &e);
    let mut rd = tokio::fs::read_dir(&p).await.map_err(ctx)?;
    let names = Names::load(&io.conn.agent.config.etc_dir);
    let mut out = Vec::new();
    while let Some(entry) = rd.next_entry().await.map_err(ctx)? {
        let Ok(meta) = entry.metadata().await else {
            continue; // vanished meanwhile
        };
        let link_target = if meta.file_type().is_symlink() {
            tokio::fs::read_link(entry.path())
                .await
                .ok()
                .map(|t| lossy(&t))
        } else {
            None
        };
        out.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            mtime_ms: meta.mtime() * 1000 + meta.mtime_nsec() / 1_000_000,
            link_target,
            kind: kind_of(meta.file_type()),
            size: meta.len(),
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
            owner: names.user(meta.uid()),
            group: names.group(meta.gid()),
        });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub(crate) fn ok<T: serde::Serialize>(value: &T) -> Result<Event, RemoteError> {
    let result = serde_json::to_value(value)
        .map_err(|e| RemoteError::new(ErrorKind::Io, format!("cannot encode reply: {e}")))?;
    Ok(Event::Ok { result })
}
