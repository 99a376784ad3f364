//! Zero-copy relaying on linux: each direction moves bytes socket → pipe → socket with
//! `splice(2)`, so payload never enters the relay's memory (and cannot be logged by it).
//!
//! Readiness: an `EAGAIN` from socket → pipe is ambiguous (empty socket or full pipe), so the
//! socket's readiness is cleared only when the pipe is empty (then the socket must be
//! empty); pipe → socket `EAGAIN` can only mean a full send buffer. Each loop iteration
//! either moves bytes or awaits readiness: no spinning.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

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
    let (s, d) = (src.as_fd(), dst.as_fd());
    let (pr, pw) = (pipe.read.as_fd(), pipe.write.as_fd());
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
        use rustix::pipe::{PipeFlags, fcntl_setpipe_size, pipe_with};
        let (read, write) = pipe_with(PipeFlags::NONBLOCK | PipeFlags::CLOEXEC)?;
        let capacity = fcntl_setpipe_size(&write, bytes as usize)
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

fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    use rustix::pipe::SpliceFlags;
    // No offsets: sockets and pipes have none.
    Ok(rustix::pipe::splice(
        from,
        None,
        to,
        None,
        len,
        SpliceFlags::MOVE | SpliceFlags::NONBLOCK,
    )?)
}

/// Half-closes `fd`'s sending side (the peer sees EOF). A socket already disconnected has
/// nothing to shut down, so the result is ignored.
fn shutdown_write(fd: BorrowedFd<'_>) {
    let _ = rustix::net::shutdown(fd, rustix::net::Shutdown::Write);
}
