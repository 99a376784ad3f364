//! Tar a directory out, extract a tar stream into a directory.
//!
//! Extraction is traversal-safe and fails loudly instead of skipping: an entry with an
//! absolute path or a `..` component, an entry whose parent inside the target is a
//! symlink (writing through it could land anywhere), a hard link pointing outside the
//! target, and device nodes are errors. Existing symlinks at an entry's own path are
//! replaced, never followed. The checks are path-based: a process inside the sandbox
//! racing the extraction by swapping directories for symlinks is not defended against
//! (the sandbox boundary is).

use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};

use bytes::Bytes;
use tokio::sync::mpsc;

use super::conn::{Inbound, StreamIo};
use super::files::ok;
use crate::frame::{DATA_CHUNK, channel};
use crate::message::{ErrorKind, Event, RemoteError, TarInDone, WriteDone};

/// `Write` that hands fixed-size chunks to the async side (blocking when it is behind).
struct ChunkWriter {
    tx: mpsc::Sender<Bytes>,
    buf: Vec<u8>,
}

impl ChunkWriter {
    fn push(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(
            &mut self.buf,
            Vec::with_capacity(DATA_CHUNK),
        ));
        self.tx
            .blocking_send(chunk)
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "tar stream cancelled"))
    }
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let room = DATA_CHUNK - self.buf.len();
        let n = room.min(data.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= DATA_CHUNK {
            self.push()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.push()
    }
}

fn append_tree<W: Write>(b: &mut tar::Builder<W>, root: &Path, rel: &Path) -> io::Result<u64> {
    let dir = root.join(rel);
    let mut names: Vec<_> = std::fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort();
    let mut count = 0;
    for name in names {
        let rel_child = rel.join(&name);
        let full = root.join(&rel_child);
        let ft = std::fs::symlink_metadata(&full)?.file_type();
        if ft.is_dir() {
            b.append_path_with_name(&full, &rel_child)?;
            count += 1 + append_tree(b, root, &rel_child)?;
        } else if ft.is_file() || ft.is_symlink() {
            b.append_path_with_name(&full, &rel_child)?;
            count += 1;
        } else {
            tracing::debug!(path = %full.display(), "tar out skips a special file");
        }
    }
    Ok(count)
}

pub(crate) async fn tar_out(io: &mut StreamIo, path: &str) -> Result<Event, RemoteError> {
    let root = io.conn.agent.resolve(path);
    let meta = tokio::fs::metadata(&root)
        .await
        .map_err(|e| RemoteError::io(format!("cannot stat {}", root.display()), &e))?;
    if !meta.is_dir() {
        return Err(RemoteError::new(
            ErrorKind::InvalidRequest,
            format!("{} is not a directory", root.display()),
        ));
    }
    let (tx, mut rx) = mpsc::channel::<Bytes>(4);
    let build_root = root.clone();
    let builder = tokio::task::spawn_blocking(move || -> io::Result<u64> {
        let mut b = tar::Builder::new(ChunkWriter {
            tx,
            buf: Vec::with_capacity(DATA_CHUNK),
        });
        b.follow_symlinks(false);
        b.mode(tar::HeaderMode::Complete);
        append_tree(&mut b, &build_root, Path::new(""))?;
        let mut w = b.into_inner()?;
        w.flush()?;
        Ok(0)
    });
    let sender = io.sender(channel::STDOUT);
    let mut bytes = 0u64;
    while let Some(chunk) = rx.recv().await {
        bytes += chunk.len() as u64;
        if !sender.send_all(chunk).await {
            return Err(RemoteError::new(ErrorKind::Io, "tar stream cancelled"));
        }
    }
    match builder.await {
        Ok(Ok(_)) => {
            sender.eof();
            ok(&WriteDone {
                path: root.to_string_lossy().into_owned(),
                bytes,
            })
        }
        Ok(Err(e)) => Err(RemoteError::io(
            format!("cannot archive {}", root.display()),
            &e,
        )),
        Err(e) => Err(RemoteError::new(
            ErrorKind::Io,
            format!("tar task failed: {e}"),
        )),
    }
}

/// `Read` over chunks arriving from the async side.
struct ChunkReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.cur.len());
        out[..n].copy_from_slice(&self.cur.split_to(n));
        Ok(n)
    }
}

pub(crate) async fn tar_in(io: &mut StreamIo, path: &str) -> Result<Event, RemoteError> {
    let dst = io.conn.agent.resolve(path);
    tokio::fs::create_dir_all(&dst)
        .await
        .map_err(|e| RemoteError::io(format!("cannot create {}", dst.display()), &e))?;
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let target = dst.clone();
    let unpacker = tokio::task::spawn_blocking(move || {
        unpack_safe(
            ChunkReader {
                rx,
                cur: Bytes::new(),
            },
            &target,
        )
    });
    let credit = io.input_credit();
    loop {
        match io.inbound.recv().await {
            Some(Inbound::Data(chunk)) => {
                let len = chunk.len();
                if tx.send(chunk).await.is_err() {
                    break; // the unpacker stopped (error or end of archive)
                }
                credit.consumed(len);
            }
            Some(Inbound::Eof) => break,
            Some(Inbound::Control(_)) => {}
            None => return Err(RemoteError::new(ErrorKind::Io, "tar upload cancelled")),
        }
    }
    drop(tx);
    let entries = unpacker
        .await
        .map_err(|e| RemoteError::new(ErrorKind::Io, format!("untar task failed: {e}")))??;
    ok(&TarInDone {
        path: dst.to_string_lossy().into_owned(),
        entries,
    })
}

fn unsafe_path(msg: String) -> RemoteError {
    RemoteError::new(ErrorKind::UnsafePath, msg)
}

/// A relative, `..`-free path, or an error naming the entry.
fn sanitize(p: &Path) -> Result<PathBuf, RemoteError> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::ParentDir | Component::RootDir | Component::Prefix(_) => {
                return Err(unsafe_path(format!(
                    "tar entry {} escapes the target directory",
                    p.display()
                )));
            }
        }
    }
    Ok(out)
}

/// Every existing ancestor of `rel` under `dst` must be a real directory, not a symlink.
fn check_parents(dst: &Path, rel: &Path) -> Result<(), RemoteError> {
    let mut cur = dst.to_path_buf();
    let parents: Vec<_> = rel.components().collect();
    for c in parents.iter().take(parents.len().saturating_sub(1)) {
        cur.push(c);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(unsafe_path(format!(
                    "tar entry {} would be written through the symlink {}",
                    rel.display(),
                    cur.display()
                )));
            }
            Ok(m) if !m.is_dir() => {
                return Err(RemoteError::new(
                    ErrorKind::AlreadyExists,
                    format!("{} is not a directory", cur.display()),
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir(&cur)
                    .or_else(|e| {
                        if e.kind() == io::ErrorKind::AlreadyExists {
                            Ok(())
                        } else {
                            Err(e)
                        }
                    })
                    .map_err(|e| RemoteError::io(format!("cannot create {}", cur.display()), &e))?;
            }
            Err(e) => {
                return Err(RemoteError::io(
                    format!("cannot stat {}", cur.display()),
                    &e,
                ));
            }
        }
    }
    Ok(())
}

/// Removes a non-directory at `p` (a symlink is removed, not followed).
fn clear_slot(p: &Path) -> Result<(), RemoteError> {
    match std::fs::symlink_metadata(p) {
        Ok(m) if m.is_dir() => Err(RemoteError::new(
            ErrorKind::AlreadyExists,
            format!("{} is a directory", p.display()),
        )),
        Ok(_) => std::fs::remove_file(p)
            .map_err(|e| RemoteError::io(format!("cannot replace {}", p.display()), &e)),
        Err(_) => Ok(()),
    }
}

fn unpack_safe<R: Read>(reader: R, dst: &Path) -> Result<u64, RemoteError> {
    let tar_err = |e: io::Error| RemoteError::io("cannot read tar stream", &e);
    let mut archive = tar::Archive::new(reader);
    let mut dirs: Vec<(PathBuf, u32)> = Vec::new();
    let mut count = 0u64;
    for entry in archive.entries().map_err(tar_err)? {
        let mut entry = entry.map_err(tar_err)?;
        let raw = entry.path().map_err(tar_err)?.into_owned();
        let rel = sanitize(&raw)?;
        let kind = entry.header().entry_type();
        if rel.as_os_str().is_empty() {
            continue; // "./": the target itself
        }
        check_parents(dst, &rel)?;
        let target = dst.join(&rel);
        // setuid/setgid bits are dropped: an extracted file may be run by a host user
        // later (the linux sandbox's seccomp filter would refuse them anyway).
        let mode = entry.header().mode().unwrap_or(0o644) & 0o1777;
        let ctx = |e: io::Error| RemoteError::io(format!("cannot extract {}", rel.display()), &e);
        if kind.is_dir() {
            match std::fs::symlink_metadata(&target) {
                Ok(m) if m.file_type().is_symlink() => {
                    return Err(unsafe_path(format!(
                        "tar directory entry {} would replace a symlink",
                        rel.display()
                    )));
                }
                Ok(m) if m.is_dir() => {}
                Ok(_) => {
                    clear_slot(&target)?;
                    std::fs::create_dir(&target).map_err(ctx)?;
                }
                Err(_) => std::fs::create_dir(&target).map_err(ctx)?,
            }
            // Modes are applied last, so a read-only directory can still be filled.
            dirs.push((target, mode));
        } else if kind.is_file()
            || kind == tar::EntryType::Continuous
            || kind.is_gnu_sparse()
            || kind.is_symlink()
        {
            clear_slot(&target)?;
            // Not preserved: the tar crate then applies `mode & 0o777`, so no
            // setuid/setgid bit is ever set.
            entry.set_preserve_permissions(false);
            entry.set_preserve_mtime(true);
            entry.set_unpack_xattrs(false);
            entry.unpack(&target).map_err(ctx)?;
        } else if kind.is_hard_link() {
            let link = entry
                .link_name()
                .map_err(tar_err)?
                .ok_or_else(|| {
                    RemoteError::new(ErrorKind::InvalidRequest, "hard link without a target")
                })?
                .into_owned();
            let link_rel = sanitize(&link)?;
            check_parents(dst, &link_rel)?;
            let src = dst.join(&link_rel);
            if std::fs::symlink_metadata(&src).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(unsafe_path(format!(
                    "tar hard link {} points at the symlink {}",
                    rel.display(),
                    link_rel.display()
                )));
            }
            clear_slot(&target)?;
            std::fs::hard_link(&src, &target).map_err(ctx)?;
        } else if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            continue;
        } else {
            return Err(RemoteError::new(
                ErrorKind::Unsupported,
                format!(
                    "tar entry {} has unsupported type {:?}",
                    rel.display(),
                    kind
                ),
            ));
        }
        count += 1;
    }
    for (dir, mode) in dirs.into_iter().rev() {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
            .map_err(|e| RemoteError::io(format!("cannot set mode of {}", dir.display()), &e))?;
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_rejects_escapes() {
        assert!(sanitize(Path::new("../x")).is_err());
        assert!(sanitize(Path::new("a/../../x")).is_err());
        assert!(sanitize(Path::new("/etc/passwd")).is_err());
        assert_eq!(sanitize(Path::new("./a/b")).unwrap(), PathBuf::from("a/b"));
    }
}
