//! Host-owned sockets inside a sandbox's network namespace: the way out of a sandbox that
//! the host controls (issue 12's enforced path).
//!
//! A sandbox's network namespace has loopback only and no route anywhere: a packet to any
//! other address has nowhere to go. Every connection that leaves is one the sandbox makes
//! to a socket the *host* bound inside that namespace — a listener on a loopback address
//! the sandbox dials (named by a DNS stub whose socket is bound the same way). The host
//! accepts it in its own process, decides, and connects out from the host's namespace.
//! Nothing inside the sandbox (no route, no firewall rule, no process) takes part, so the
//! sandbox cannot change or bypass it: it has no CAP_NET_ADMIN over its namespace (owned by
//! the host's user namespace), and it cannot bind ports below
//! `net.ipv4.ip_unprivileged_port_start` (1024) there, so it cannot squat the host's
//! privileged-port listeners either.
//!
//! How a host socket lands in the namespace: a short-lived thread enters the namespace
//! through a pidfd of a process in it, the sandbox's init (`setns(pidfd, CLONE_NEWNET)`;
//! the pidfd is opened so that it cannot refer to a recycled pid, see [`pidfd_of`]),
//! creates and binds the socket, and exits. A socket stays in the
//! namespace it was created in for its whole life, whichever thread uses it later.

use std::io;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// Binds a TCP listener at `addr` inside the network namespace of the sandbox whose init
/// `pidfd` refers to.
pub fn listen_tcp(pidfd: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<TcpListener> {
    in_netns(pidfd, move || TcpListener::bind(addr))
}

/// Binds a UDP socket at `addr` inside the sandbox's network namespace (the DNS stub's).
pub fn bind_udp(pidfd: BorrowedFd<'_>, addr: SocketAddr) -> io::Result<UdpSocket> {
    in_netns(pidfd, move || UdpSocket::bind(addr))
}

/// Runs `make` on a fresh thread that first enters the network namespace of the process
/// `pidfd` refers to. The thread ends right after, so no other work of this process ever
/// runs in the sandbox's namespace. (One thread for many sockets: each spawn costs.)
pub fn in_netns<T: Send + 'static>(
    pidfd: BorrowedFd<'_>,
    make: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let fd = pidfd.try_clone_to_owned()?;
    std::thread::Builder::new()
        .name("omabox-netns".into())
        .spawn(move || {
            // SAFETY: setns takes an fd we own for the duration of the call and a flag; on
            // success it changes only this thread's network namespace.
            let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
            make()
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// A fresh network namespace with its loopback interface up and nothing else, held by the
/// returned fd (`/proc/thread-self/ns/net` of a thread that made it and ended): for a
/// sandbox whose runtime joins a namespace it is given rather than making its own (the
/// gvisor backend runs runsc in it with `--network host`). The namespace lives while the
/// fd or a process in it does. The fd serves [`in_netns`] as a pidfd would.
pub fn create() -> io::Result<OwnedFd> {
    std::thread::Builder::new()
        .name("omabox-netns".into())
        .spawn(|| {
            // SAFETY: unshare with a constant flag changes only this thread's network
            // namespace; the thread ends right after.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            loopback_up()?;
            Ok(OwnedFd::from(std::fs::File::open(
                "/proc/thread-self/ns/net",
            )?))
        })?
        .join()
        .map_err(|_| io::Error::other("the namespace thread panicked"))?
}

/// Brings the loopback interface of the calling thread's network namespace up.
fn loopback_up() -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own; OwnedFd closes it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is a plain C struct; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads ifr_name and writes ifr_flags of the valid `req`.
    if unsafe {
        libc::ioctl(
            sock.as_raw_fd(),
            libc::SIOCGIFFLAGS as libc::Ioctl,
            &mut req,
        )
    } < 0
    {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the union member SIOCGIFFLAGS wrote is ifru_flags.
    unsafe {
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    }
    // SAFETY: SIOCSIFFLAGS reads the valid `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS as libc::Ioctl, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Adds `address` to the loopback interface as the alias `lo:1` (class-A netmask, inside
/// 127.0.0.0/8 it changes no route). Why: glibc's `getaddrinfo` with `AI_ADDRCONFIG`
/// (used by `getent ahosts`, apt and others) returns no IPv4 address at all unless the
/// namespace has an IPv4 address other than 127.0.0.1, and a sandbox's namespace has only
/// that one.
pub fn loopback_alias(address: std::net::Ipv4Addr) -> io::Result<()> {
    // SAFETY: socket(2) with constant arguments; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh socket we own; OwnedFd closes it.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is a plain C struct; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo:1\0") {
        *dst = *src as libc::c_char;
    }
    let sin = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr {
            s_addr: u32::from(address).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: ifru_addr is a `sockaddr`, which a `sockaddr_in` fits exactly (both 16
    // bytes); the write covers only that union member.
    unsafe {
        std::ptr::write(
            std::ptr::addr_of_mut!(req.ifr_ifru.ifru_addr).cast::<libc::sockaddr_in>(),
            sin,
        );
    }
    // SAFETY: SIOCSIFADDR reads the valid `req`.
    let r = unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFADDR as libc::Ioctl, &req) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A pidfd for process `pid` that `is_it` (reading `/proc/<pid>`) confirmed to be the
/// process meant. The pidfd is opened first and the process checked to be alive after
/// `is_it` ran, so what `is_it` read was that process and not a later one reusing the pid:
/// the pidfd can never refer to a recycled pid. `is_it` answering `false` is
/// [`io::ErrorKind::NotFound`].
pub fn pidfd_of(pid: i32, is_it: impl FnOnce(i32) -> io::Result<bool>) -> io::Result<OwnedFd> {
    if pid <= 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("pid {pid} names no process"),
        ));
    }
    // SAFETY: pidfd_open takes integers; a non-negative result is a new fd we own.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    let pidfd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
    let not_it = || {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("pid {pid} is not the process meant"),
        )
    };
    if !is_it(pid)? {
        return Err(not_it());
    }
    // SAFETY: integer arguments and a null siginfo pointer; signal 0 only checks that the
    // process still exists.
    let alive = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if alive != 0 {
        return Err(not_it());
    }
    Ok(pidfd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pidfd_is_given_only_for_the_process_meant() {
        let me = std::process::id() as i32;
        assert!(pidfd_of(me, |_| Ok(true)).is_ok());
        let refused = pidfd_of(me, |_| Ok(false)).unwrap_err();
        assert_eq!(refused.kind(), io::ErrorKind::NotFound);
        assert_eq!(
            pidfd_of(0, |_| Ok(true)).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
