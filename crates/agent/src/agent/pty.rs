//! Pseudo-terminals for attached processes (`spawn` with `pty`).
//!
//! The pair comes from `/dev/ptmx` as the agent sees it, which inside a sandbox is the
//! sandbox's own devpts instance; the peer is opened from the master (`TIOCGPTPEER`),
//! never by a path under `/dev/pts`. The child leads a new session with the terminal as
//! its controlling terminal and stdin/stdout/stderr. The master stays in the agent only:
//! it is close-on-exec from the start, so no process the agent starts inherits it, and
//! the agent drops its own copy of the peer right after the spawn, so reading the master
//! ends (`EIO`, read here as end of file) once every process holding the terminal closed
//! it.
//!
//! Never: hand the master to a child, open a terminal by name, or let a resize with
//! out-of-range numbers reach the kernel.

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use rustix::pty::OpenptFlags;
use rustix::termios::Winsize;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::message::PtySize;

/// `TERM` of a terminal process unless its env says otherwise.
pub(crate) const DEFAULT_TERM: &str = "xterm-256color";

/// Opens a terminal pair of `size`: the master (non-blocking, close-on-exec) and its peer
/// (close-on-exec; [`attach`] makes it the child's stdio).
pub(crate) fn open(size: PtySize) -> io::Result<(Master, OwnedFd)> {
    let flags = OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC;
    let master = rustix::pty::openpt(flags)?;
    rustix::pty::grantpt(&master)?;
    rustix::pty::unlockpt(&master)?;
    let peer = rustix::pty::ioctl_tiocgptpeer(&master, flags)?;
    set_size(&master, size)?;
    rustix::io::ioctl_fionbio(&master, true)?;
    // SAFETY: `master` is an open descriptor that the `AsyncFd` owns from here on: it
    // stays open, and `as_raw_fd` keeps returning it, until the `AsyncFd` is dropped.
    let master = unsafe { AsyncFd::register(master) }?;
    Ok((Master(Arc::new(master)), peer))
}

fn set_size(fd: &OwnedFd, size: PtySize) -> io::Result<()> {
    let winsize = Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    Ok(rustix::termios::tcsetwinsize(fd, winsize)?)
}

/// Makes `peer` the stdin, stdout and stderr of `cmd`, and the controlling terminal of
/// the new session the child starts (which also makes the child its process group's
/// leader, as `process_group(0)` does for a process without a terminal).
pub(crate) fn attach(cmd: &mut Command, peer: OwnedFd) -> io::Result<()> {
    let stdout = peer.try_clone()?;
    let stderr = peer.try_clone()?;
    cmd.stdin(Stdio::from(peer))
        .stdout(Stdio::from(stdout))
        .stderr(Stdio::from(stderr));
    let session = || -> io::Result<()> {
        rustix::process::setsid()?;
        // SAFETY: fd 0 is open here: the closure runs after the child's stdio was set up
        // (std duplicates the terminal onto 0, 1 and 2 first); the borrow ends with
        // this statement.
        let stdin = unsafe { BorrowedFd::borrow_raw(0) };
        rustix::process::ioctl_tiocsctty(stdin)?;
        Ok(())
    };
    // SAFETY: the closure runs in the forked child before exec. It only makes two raw
    // system calls (setsid, ioctl TIOCSCTTY), both async-signal-safe; it allocates
    // nothing and takes no lock.
    unsafe {
        cmd.pre_exec(session);
    }
    Ok(())
}

/// The agent's end of a terminal: reads what the terminal shows, writes what is typed,
/// resizes. Clones share the one descriptor (one task reads, one writes).
#[derive(Debug, Clone)]
pub(crate) struct Master(Arc<AsyncFd<OwnedFd>>);

impl Master {
    /// Sets the terminal's size; the kernel sends SIGWINCH to its foreground group.
    pub(crate) fn resize(&self, size: PtySize) -> io::Result<()> {
        set_size(self.0.get_ref(), size)
    }
}

impl AsyncRead for Master {
    /// `EIO` means every holder of the terminal closed it: end of file.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            let mut guard = ready!(self.0.poll_read_ready(cx))?;
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| Ok(rustix::io::read(fd.get_ref(), &mut *unfilled)?)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => {}
            }
        }
    }
}

impl AsyncWrite for Master {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.0.poll_write_ready(cx))?;
            match guard.try_io(|fd| Ok(rustix::io::write(fd.get_ref(), buf)?)) {
                Ok(result) => return Poll::Ready(result),
                Err(_would_block) => {}
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
