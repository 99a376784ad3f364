//! Thin, safe wrappers over the raw syscalls this crate needs. Each wrapper converts its
//! arguments to C strings before the call and turns `-1` into `io::Error`.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

pub(crate) fn cstr(p: impl AsRef<std::ffi::OsStr>) -> io::Result<CString> {
    CString::new(p.as_ref().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

pub(crate) fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

fn check_long(r: libc::c_long) -> io::Result<libc::c_long> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An exclusive `flock` on a file (created 0600 if absent), held until drop.
pub(crate) struct FileLock(#[allow(dead_code)] std::fs::File);

impl FileLock {
    pub(crate) fn take(path: &Path) -> io::Result<Self> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)?;
        loop {
            // SAFETY: flock on an fd we own; no memory effects.
            if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } == 0 {
                return Ok(Self(f));
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Whether `path` is on a tmpfs (or ramfs): memory, cleared at boot.
pub(crate) fn on_tmpfs(path: &Path) -> io::Result<bool> {
    let c = cstr(path)?;
    // SAFETY: statfs is plain data the kernel fills; `c` is a valid C string.
    let mut buf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid C string and `buf` a statfs the kernel writes whole.
    check(unsafe { libc::statfs(c.as_ptr(), &mut buf) })?;
    /// `TMPFS_MAGIC` and `RAMFS_MAGIC` of `<linux/magic.h>`; `f_type` is signed in glibc's
    /// `statfs` and unsigned in musl's, so it is compared as the kernel's unsigned word.
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    Ok(matches!(buf.f_type as u64, TMPFS_MAGIC | RAMFS_MAGIC))
}

/// `mount(2)`.
pub(crate) fn mount(
    source: Option<&Path>,
    target: &Path,
    fstype: Option<&str>,
    flags: libc::c_ulong,
    data: Option<&str>,
) -> io::Result<()> {
    let source = source.map(cstr).transpose()?;
    let target = cstr(target)?;
    let fstype = fstype.map(cstr).transpose()?;
    let data = data.map(cstr).transpose()?;
    let ptr = |c: &Option<CString>| c.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
    // SAFETY: every pointer is either null or a NUL-terminated string that outlives the
    // call; mount(2) only reads them.
    check(unsafe {
        libc::mount(
            ptr(&source),
            target.as_ptr(),
            ptr(&fstype),
            flags,
            ptr(&data).cast(),
        )
    })
}

/// `CLOCK_MONOTONIC` in microseconds. The same clock on both sides of the sandbox
/// boundary (no time namespace), so host and setup stage can share one timeline.
pub fn monotonic_us() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// `umount2(2)`.
/// Clock ticks per second of `/proc/<pid>/stat`'s times (`_SC_CLK_TCK`); `None` if unknown.
pub(crate) fn clock_ticks_per_second() -> Option<u64> {
    // SAFETY: sysconf reads a constant of the C library; no pointer is involved.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|t| *t > 0)
}

pub(crate) fn umount2(target: &Path, flags: libc::c_int) -> io::Result<()> {
    let target = cstr(target)?;
    // SAFETY: `target` is a valid C string for the duration of the call.
    check(unsafe { libc::umount2(target.as_ptr(), flags) })
}

/// `pivot_root(2)` (no libc wrapper exists).
pub(crate) fn pivot_root(new_root: &Path, put_old: &Path) -> io::Result<()> {
    let new_root = cstr(new_root)?;
    let put_old = cstr(put_old)?;
    // SAFETY: both arguments are valid C strings for the duration of the call.
    check_long(unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) })
        .map(drop)
}

/// `mknod(2)`.
pub(crate) fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) -> io::Result<()> {
    let path = cstr(path)?;
    // SAFETY: `path` is a valid C string for the duration of the call.
    check(unsafe { libc::mknod(path.as_ptr(), mode, dev) })
}

/// `unshare(2)`.
pub(crate) fn unshare(flags: libc::c_int) -> io::Result<()> {
    // SAFETY: unshare takes a flag word and has no memory effects.
    check(unsafe { libc::unshare(flags) })
}

/// `sethostname(2)`.
pub(crate) fn sethostname(name: &str) -> io::Result<()> {
    // SAFETY: the pointer/length pair describes `name`'s bytes, which outlive the call.
    check(unsafe { libc::sethostname(name.as_ptr().cast(), name.len()) })
}

/// `prctl(2)` with integer arguments.
pub(crate) fn prctl(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<()> {
    // SAFETY: every option used by this crate takes integer arguments only.
    check(unsafe { libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) })
}

/// The type of `setrlimit`'s resource argument: an enum in glibc, an int in musl.
#[cfg(target_env = "gnu")]
pub(crate) type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
pub(crate) type RlimitResource = libc::c_int;

/// Sets soft and hard limit of `resource` to `value` (lowering only, without
/// CAP_SYS_RESOURCE; never raises above the current hard limit).
pub(crate) fn lower_rlimit(resource: RlimitResource, value: u64) -> io::Result<()> {
    let mut cur = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `cur` is a valid, writable rlimit.
    check(unsafe { libc::getrlimit(resource, &mut cur) })?;
    let v = value.min(cur.rlim_max);
    let new = libc::rlimit {
        rlim_cur: v,
        rlim_max: v,
    };
    // SAFETY: `new` is a valid rlimit read by the kernel.
    check(unsafe { libc::setrlimit(resource, &new) })
}

/// A socket for interface ioctls and a zeroed request naming interface `name`
/// (NUL-terminated, shorter than `IFNAMSIZ`).
fn interface_request(name: &[u8]) -> io::Result<(OwnedFd, libc::ifreq)> {
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own; OwnedFd closes it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is a plain C struct; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(name) {
        *dst = *src as libc::c_char;
    }
    Ok((sock, req))
}

/// Brings the loopback interface up (the only interface of a fresh network namespace).
pub(crate) fn loopback_up() -> io::Result<()> {
    let (sock, mut req) = interface_request(b"lo\0")?;
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_flags of the valid `req`.
    check(unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as libc::Ioctl,
            &mut req,
        )
    })?;
    // SAFETY: the union member written by SIOCGIFFLAGS is ifru_flags.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the valid `req`.
    check(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &req) })
}

/// `pidfd_open(2)`.
pub(crate) fn pidfd_open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes integers; a non-negative result is a new fd we own.
    let fd = check_long(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) })?;
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// `pidfd_send_signal(2)`. ESRCH (already exited) is `Ok(false)`.
pub(crate) fn pidfd_kill(pidfd: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<bool> {
    // SAFETY: integer arguments and a null siginfo pointer, which the kernel accepts.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match check_long(r) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Waits until the process behind `pidfd` has exited (works for non-children too), or
/// `timeout_ms` passed. Returns whether it exited.
pub(crate) fn pidfd_wait_exit(pidfd: BorrowedFd<'_>, timeout_ms: i32) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd: pidfd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: `pfd` is one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e);
        }
        return Ok(r > 0);
    }
}

/// Exit of a child, reaped through its pidfd.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reaped {
    /// Still running (only with `nohang`).
    Running,
    /// Exited or killed; the raw `si_code`/`si_status`.
    Exited { code: i32, status: i32 },
    /// Not our child or already reaped.
    Gone,
}

/// `waitid(P_PIDFD, …, WEXITED)`; reaps the child.
pub(crate) fn pidfd_reap(pidfd: BorrowedFd<'_>, nohang: bool) -> io::Result<Reaped> {
    let mut flags = libc::WEXITED;
    if nohang {
        flags |= libc::WNOHANG;
    }
    loop {
        // SAFETY: siginfo_t is plain data; all-zero is valid and lets us detect "no child
        // ready" under WNOHANG (si_pid stays 0).
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: `info` is a valid, writable siginfo_t; P_PIDFD takes the fd as id.
        let r = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                flags,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::ECHILD) => return Ok(Reaped::Gone),
                _ => return Err(e),
            }
        }
        // SAFETY: waitid filled `info` for SIGCHLD, whose union member holds pid/status.
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return Ok(Reaped::Running);
        }
        return Ok(Reaped::Exited {
            code: info.si_code,
            status,
        });
    }
}

/// `kill(2)`; ESRCH is `Ok(false)`.
pub(crate) fn kill(pid: i32, sig: libc::c_int) -> io::Result<bool> {
    if pid <= 1 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "refusing to signal pid <= 1",
        ));
    }
    // SAFETY: integer arguments; pid > 1 so this never addresses a group or everyone.
    match check(unsafe { libc::kill(pid, sig) }) {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Closes every fd of this process from 3 up except those in `keep` (sorted in place;
/// entries below 3 and duplicates change nothing), with one `close_range(2)` per gap.
/// Raw syscalls only, no allocation: a freshly forked child of a multi-threaded
/// process may call it.
///
/// The caller must own every fd it closes this way: nothing else (an `OwnedFd` still
/// alive, a library) may use or close one again afterwards.
pub(crate) fn close_all_but(keep: &mut [RawFd]) -> io::Result<()> {
    keep.sort_unstable();
    let mut from: libc::c_uint = 3;
    for &fd in keep.iter() {
        let Ok(fd) = libc::c_uint::try_from(fd) else {
            continue;
        };
        if fd > from {
            close_range(from, fd - 1, 0)?;
        }
        from = from.max(fd.saturating_add(1));
    }
    close_range(from, libc::c_uint::MAX, 0)
}

/// Marks every fd of this process from `first` up close-on-exec, so a program it spawns
/// next inherits none of them (what glibc's `posix_spawn_file_actions_addclosefrom_np`
/// does in the child; musl has no such file action).
pub(crate) fn cloexec_from(first: libc::c_uint) -> io::Result<()> {
    close_range(
        first,
        libc::c_uint::MAX,
        libc::CLOSE_RANGE_CLOEXEC as libc::c_uint,
    )
}

/// `close_range(2)`: closes (flags 0) or marks close-on-exec (`CLOSE_RANGE_CLOEXEC`) the
/// fds of this process in `first..=last`.
fn close_range(first: libc::c_uint, last: libc::c_uint, flags: libc::c_uint) -> io::Result<()> {
    // SAFETY: acts on fds of this process only; a caller that closes them owns every one
    // and uses none again (`close_all_but`'s contract).
    check_long(unsafe { libc::syscall(libc::SYS_close_range, first, last, flags) }).map(drop)
}

/// A pipe whose both ends are close-on-exec.
pub(crate) fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints.
    check(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: the kernel returned two fresh fds that only we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A close-on-exec unix stream socketpair.
pub(crate) fn socketpair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints.
    check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: the kernel returned two fresh fds that only we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The boot id, to tell a pid of this boot from one of an earlier boot.
pub(crate) fn boot_id() -> io::Result<String> {
    Ok(read_kernel_text("/proc/sys/kernel/random/boot_id", 64)?
        .trim()
        .to_owned())
}

/// A file the kernel generates (procfs, sysfs), read whole in reads of `chunk` bytes.
/// Such a file's size reads as 0, for which `std::fs::read_to_string` first probes with
/// 32-byte reads and then doubles: nine reads for a 3 KiB `/proc/self/mountinfo`, each a
/// walk of the kernel's list from the start. `chunk` at least the usual size: one read
/// (and the one that sees the end).
pub fn read_kernel_text(path: impl AsRef<Path>, chunk: usize) -> io::Result<String> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path)?;
    let mut buf = vec![0u8; chunk.max(1)];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len + chunk.max(1), 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Start time of `pid` in clock ticks since boot (field 22 of `/proc/<pid>/stat`);
/// `None` when there is no such process.
pub(crate) fn process_start_time(pid: i32) -> io::Result<Option<u64>> {
    let stat = match read_kernel_text(format!("/proc/{pid}/stat"), 512) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    // The command name (field 2) may hold spaces and parentheses: split after the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))?;
    // `rest` starts at field 3; field 22 is the 20th from there.
    rest.split_whitespace()
        .nth(19)
        .and_then(|f| f.parse().ok())
        .map(Some)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
}

/// Sends one byte carrying `fd` (`SCM_RIGHTS`) on the unix stream socket `sock`.
pub(crate) fn send_fd(sock: BorrowedFd<'_>, fd: BorrowedFd<'_>) -> io::Result<()> {
    let byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 4];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one cmsghdr with one fd
    // (checked above), so CMSG_FIRSTHDR is non-null and CMSG_DATA within it; sendmsg
    // only reads `msg`, `iov` and `control`, all alive here.
    let sent = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd.as_raw_fd());
        libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    match sent {
        1 => Ok(()),
        n if n < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::other("short send of a file descriptor")),
    }
}

/// Receives the one byte `send_fd` sent on `sock` and the fd it carries (close-on-exec).
pub fn recv_fd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 4];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    loop {
        // SAFETY: `msg` points at `iov` (one writable byte) and `control` (writable),
        // both alive for the call.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::other("no file descriptor: the peer closed"));
        }
        break;
    }
    // SAFETY: the kernel filled `control` (msg_controllen says how much); CMSG_FIRSTHDR
    // and CMSG_NXTHDR stay within it, and CMSG_DATA of an SCM_RIGHTS header holds fds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        let mut found = None;
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    // Every fd received is ours now: keep the first, close the rest.
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    if found.is_none() {
                        found = Some(fd);
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
        if msg.msg_flags & libc::MSG_CTRUNC != 0 {
            return Err(io::Error::other("file descriptor message truncated"));
        }
        found.ok_or_else(|| io::Error::other("no file descriptor in the message"))
    }
}

/// Writes all of `bytes` to `fd` (a pipe or stream socket; never raises SIGPIPE).
pub(crate) fn write_all_fd(fd: BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: `bytes` is a valid buffer of its length; MSG_NOSIGNAL has no effect on
        // memory. `send` fails with ENOTSOCK on a pipe, where `write` is used instead.
        let n = unsafe {
            let n = libc::send(
                fd.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_NOSIGNAL,
            );
            if n < 0 && *libc::__errno_location() == libc::ENOTSOCK {
                libc::write(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len())
            } else {
                n
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// Restricts the calling thread to the CPU it runs on; returns its previous CPU mask
/// for [`set_affinity`], or `None` (nothing changed) if either call failed. A child
/// cloned meanwhile inherits the one-CPU mask and is queued on this CPU.
pub fn pin_to_this_cpu() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity/sched_setaffinity read or write
    // exactly one of it; sched_getcpu has no preconditions.
    unsafe {
        let mut old: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut old) < 0 {
            return None;
        }
        let cpu = libc::sched_getcpu();
        if cpu < 0 || cpu as usize >= libc::CPU_SETSIZE as usize {
            return None;
        }
        let mut one: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut one);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one) < 0 {
            return None;
        }
        Some(old)
    }
}

/// The calling thread's CPU mask, `None` if it cannot be read.
pub fn affinity() -> Option<libc::cpu_set_t> {
    // SAFETY: cpu_set_t is plain data; sched_getaffinity writes one.
    unsafe {
        let mut mask: libc::cpu_set_t = std::mem::zeroed();
        (libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut mask) == 0)
            .then_some(mask)
    }
}

/// How many CPUs this host can ever have online (the kernel's `nr_cpu_ids`: the highest
/// index in `/sys/devices/system/cpu/possible`, plus one), hot-pluggable ones included;
/// `u64::MAX` when that cannot be read (a limit is then never taken for a no-op).
pub fn possible_cpus() -> u64 {
    read_kernel_text("/sys/devices/system/cpu/possible", 64)
        .ok()
        .and_then(|list| parse_cpu_list_end(&list))
        .unwrap_or(u64::MAX)
}

/// The highest CPU index in a kernel CPU list (`0-3,8,10-11`), plus one.
fn parse_cpu_list_end(list: &str) -> Option<u64> {
    let mut end = None;
    for part in list.trim().split(',') {
        let last = part.rsplit('-').next()?.trim().parse::<u64>().ok()?;
        end = end.max(Some(last.checked_add(1)?));
    }
    end
}

/// Restricts process `pid` to `mask` without the CPU the caller runs on, when that
/// leaves at least one CPU. Best effort.
pub fn keep_off_this_cpu(pid: libc::pid_t, mask: &libc::cpu_set_t) {
    // SAFETY: sched_getcpu has no preconditions; CPU_* and sched_setaffinity work on a
    // valid cpu_set_t copy.
    unsafe {
        let cpu = libc::sched_getcpu();
        if cpu < 0 || cpu as usize >= libc::CPU_SETSIZE as usize || libc::CPU_COUNT(mask) < 2 {
            return;
        }
        let mut others = *mask;
        libc::CPU_CLR(cpu as usize, &mut others);
        if libc::CPU_COUNT(&others) > 0 {
            libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &others);
        }
    }
}

/// Sets the calling thread's CPU mask (undoes [`pin_to_this_cpu`]).
pub fn set_affinity(mask: &libc::cpu_set_t) {
    // SAFETY: reads one valid cpu_set_t.
    unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), mask) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `fd` is open in this process.
    fn is_open(fd: RawFd) -> bool {
        // SAFETY: F_GETFD on an integer only reads the fd table.
        unsafe { libc::fcntl(fd, libc::F_GETFD) >= 0 }
    }

    #[test]
    fn kernel_text_is_read_whole_whatever_the_chunk() {
        let whole = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        for chunk in [0, 1, 7, 64, 16 << 10] {
            assert_eq!(
                read_kernel_text("/proc/self/mountinfo", chunk).unwrap(),
                whole,
                "{chunk}"
            );
        }
        assert_eq!(
            read_kernel_text("/no/such/file", 64).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn the_possible_cpus_are_the_highest_index_of_the_list_plus_one() {
        assert_eq!(parse_cpu_list_end("0-1\n"), Some(2));
        assert_eq!(parse_cpu_list_end("0"), Some(1));
        assert_eq!(parse_cpu_list_end("0-3,8,10-11"), Some(12));
        assert_eq!(parse_cpu_list_end("0-x"), None);
        assert_eq!(parse_cpu_list_end(""), None);
        assert!(possible_cpus() >= 1);
    }

    #[test]
    fn close_all_but_keeps_exactly_the_listed_fds() {
        // Eight fds at known numbers, far above what the test harness holds.
        let (r, _w) = pipe().unwrap();
        let base = 200;
        for i in 0..8 {
            // SAFETY: dup2 onto a free number; the child below is the only one to close it.
            assert!(unsafe { libc::dup2(r.as_raw_fd(), base + i) } >= 0);
        }
        let stdio = [is_open(0), is_open(1), is_open(2)];
        // In a fork, so this (multi-threaded) test process keeps its own fds.
        // SAFETY: the child only makes raw syscalls and `_exit`s.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut keep = [base + 5, base + 1, base + 1, 2, base + 7];
            let closed = close_all_but(&mut keep).is_ok();
            let mut code = if closed { 0 } else { 1 };
            for i in 0..8 {
                if is_open(base + i) != [1, 5, 7].contains(&i) {
                    code |= 2;
                }
            }
            // 0-2 are never closed; `r` (below 200) is not kept.
            if stdio != [is_open(0), is_open(1), is_open(2)] || is_open(r.as_raw_fd()) {
                code |= 4;
            }
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child into a local int.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        for i in 0..8 {
            // SAFETY: these dups are ours and closed once here.
            unsafe { libc::close(base + i) };
        }
        assert!(libc::WIFEXITED(status));
        assert_eq!(libc::WEXITSTATUS(status), 0);
    }

    #[test]
    fn pinning_to_this_cpu_is_undone_by_set_affinity() {
        let mask = || {
            // SAFETY: cpu_set_t is plain data; sched_getaffinity writes one.
            unsafe {
                let mut m: libc::cpu_set_t = std::mem::zeroed();
                assert_eq!(
                    libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut m),
                    0
                );
                (0..libc::CPU_SETSIZE as usize)
                    .filter(|c| libc::CPU_ISSET(*c, &m))
                    .collect::<Vec<_>>()
            }
        };
        let before = mask();
        let old = pin_to_this_cpu().expect("pinned");
        let pinned = mask();
        assert_eq!(pinned.len(), 1, "{pinned:?}");
        assert!(before.contains(&pinned[0]));
        set_affinity(&old);
        assert_eq!(mask(), before);
    }
}
