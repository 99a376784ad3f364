//! Zero-copy relaying on linux: each direction moves bytes socket → pipe → socket with
//! `splice(2)`, so payload never enters the relay's memory (and cannot be logged by it).
//!
//! Readiness: an `EAGAIN` from socket → pipe is ambiguous (empty socket or full pipe), so the
//! socket's readiness is cleared only when the pipe is empty (then the socket must be
//! empty); pipe → socket `EAGAIN` can only mean a full send buffer. Each loop iteration
//! either moves bytes or awaits readiness: no spinning.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use tokio::io::Interest;
use tokio::net::TcpStream;

/// A pipe's default size, assumed when resizing fails.
const DEFAULT_PIPE_BYTES: usize = 64 * 1024;

/// Moves bytes both ways until both directions reached end of stream (each end's write
/// side is shut down after its peer's EOF, as `copy_bidirectional` does), through a pipe of
/// `pipe_bytes` per direction (a source is not read while its pipe is full: a peer that does
/// not drain stops its source), calling `on_data` whenever bytes arrive. Returns the bytes
/// moved (a → b, b → a).
pub(crate) async fn splice_bidirectional(
    a: &TcpStream,
    b: &TcpStream,
    pipe_bytes: u32,
    on_data: &(dyn Fn() + Sync),
) -> io::Result<(u64, u64)> {
    tokio::try_join!(
        pump(a, b, pipe_bytes, on_data),
        pump(b, a, pipe_bytes, on_data)
    )
}

async fn pump(
    src: &TcpStream,
    dst: &TcpStream,
    pipe_bytes: u32,
    on_data: &(dyn Fn() + Sync),
) -> io::Result<u64> {
    let pipe = Pipe::new(pipe_bytes)?;
    let (s, d) = (src.as_raw_fd(), dst.as_raw_fd());
    let (pr, pw) = (pipe.read.as_raw_fd(), pipe.write.as_raw_fd());
    let (mut in_pipe, mut eof, mut total) = (0usize, false, 0u64);
    loop {
        if !eof && in_pipe < pipe.capacity {
            let want = pipe.capacity - in_pipe;
            let filled = if in_pipe == 0 {
                src.try_io(Interest::READABLE, || splice(s, pw, want))
            } else {
                splice(s, pw, want)
            };
            match filled {
                Ok(0) => eof = true,
                Ok(n) => {
                    in_pipe += n;
                    on_data();
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if in_pipe == 0 {
                        src.readable().await?;
                        continue;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
        if in_pipe > 0 {
            match dst.try_io(Interest::WRITABLE, || splice(pr, d, in_pipe)) {
                Ok(n) => {
                    in_pipe -= n;
                    total += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => dst.writable().await?,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        } else if eof {
            shutdown_write(d);
            return Ok(total);
        }
    }
}

/// A non-blocking pipe, closed on drop.
struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    capacity: usize,
}

impl Pipe {
    /// A pipe of `bytes` (the kernel rounds up to a power of two pages).
    fn new(bytes: u32) -> io::Result<Self> {
        let mut fds = [0 as libc::c_int; 2];
        // SAFETY: `fds` is a writable array of two ints, as pipe2 requires.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        let asked = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: F_SETPIPE_SZ on an open pipe takes an int; failure only returns -1.
        let size = unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, asked) };
        let capacity = usize::try_from(size)
            .ok()
            .filter(|s| *s > 0)
            .unwrap_or(DEFAULT_PIPE_BYTES);
        Ok(Self {
            read,
            write,
            capacity,
        })
    }
}

fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    // SAFETY: both descriptors are open for the duration of the call (borrowed from live
    // sockets and a live pipe); null offsets are required for sockets and pipes.
    let n = unsafe {
        libc::splice(
            from,
            std::ptr::null_mut(),
            to,
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Half-closes `fd`'s sending side (the peer sees EOF). A socket already disconnected has
/// nothing to shut down, so the result is ignored.
fn shutdown_write(fd: RawFd) {
    // SAFETY: `fd` is an open socket borrowed from a live `TcpStream`.
    unsafe {
        libc::shutdown(fd, libc::SHUT_WR);
    }
}
