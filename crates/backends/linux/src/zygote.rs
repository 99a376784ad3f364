//! A pre-started setup stage that forks per sandbox, so a start does not pay for an exec.
//!
//! Exec'ing `omabox-sandbox-init` costs a sandbox start ~1.6 ms on a VM before its
//! `main` runs (the dynamic loader and libc's start-up, `cpuid` included). So a
//! [`LinuxRuntime`](crate::LinuxRuntime) keeps one `omabox-sandbox-init --zygote-fd N`
//! process, exec'd once (with an empty environment, `/dev/null` stdio, a session of its
//! own, like every init) and single-threaded for life: per start the host sends it the
//! child's three handoff fds and `/dev/null` over a `SOCK_SEQPACKET` socket, and it
//! forks a child into the new namespaces with `CLONE_PARENT` (so the child is the
//! host's, which waits for and reaps it through the pidfd the zygote sends back) that
//! continues exactly like an exec'd init: default signal mask, a session of its own,
//! `/dev/null` stdio, no fd but the three. It then takes the plan's environment once it
//! has read the plan. The zygote itself never runs code of a plan and holds nothing of
//! the host's but its socket; it exits when the host closes it (the host dropped the
//! runtime, or died).
//!
//! The first start of a runtime execs as before and then starts the zygote for the
//! next; a zygote that fails is dropped and the start falls back to the exec.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use crate::spawn::{self, ExecSpec, Spawned};
use crate::sys;

/// How long the host waits for the zygote's answer before giving up on it.
const REPLY_TIMEOUT_MS: i32 = 5_000;

/// The namespaces a zygote may be asked to fork into.
const ALLOWED_NS: libc::c_int = libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWUSER;

/// The runtime's zygote, shared by its clones; `None` until the first start made one.
pub(crate) type SharedZygote = Arc<Mutex<Option<Zygote>>>;

/// The host's handle on a zygote process.
#[derive(Debug)]
pub(crate) struct Zygote {
    sock: OwnedFd,
    pidfd: OwnedFd,
}

impl Zygote {
    /// Execs `init_binary` in zygote mode.
    pub(crate) fn spawn(init_binary: &Path) -> io::Result<Self> {
        let (host, child) = seqpacket_pair()?;
        let (err_r, err_w) = sys::pipe()?;
        let null = spawn::dev_null()?;
        let program = sys::cstr(init_binary)?;
        let exec = ExecSpec {
            program: program.clone(),
            argv: vec![program, c"--zygote-fd".into(), spawn::fd_arg(&child)],
            envp: Vec::new(),
            keep: vec![child.as_raw_fd()],
            stdio: null.as_raw_fd(),
            error_fd: err_w.as_raw_fd(),
        };
        let spawned = spawn::clone_exec(&exec, 0)?;
        drop((child, err_w, null));
        // The child has exec'd (its copy of `err_w` closed) or failed and said why.
        let mut msg = [0u8; 5];
        // SAFETY: `msg` is a writable buffer of its length.
        let n = unsafe { libc::read(err_r.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if n == 5 {
            let _ = sys::pidfd_reap(spawned.pidfd.as_fd(), false);
            let errno = i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
            return Err(io::Error::from_raw_os_error(errno));
        }
        Ok(Self {
            sock: host,
            pidfd: spawned.pidfd,
        })
    }

    /// Asks the zygote for a child in `ns` whose handoff fds are `fds` (plan read end,
    /// status write end, agent socket, `/dev/null`).
    fn fork(&self, fds: [BorrowedFd<'_>; 4], ns: libc::c_int) -> io::Result<Spawned> {
        let raw = fds.map(|f| f.as_raw_fd());
        send_with_fds(self.sock.as_fd(), &ns.to_ne_bytes(), &raw)?;
        let mut pfd = libc::pollfd {
            fd: self.sock.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut pfd, 1, REPLY_TIMEOUT_MS) } <= 0 {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the zygote did not answer",
            ));
        }
        let mut data = [0u8; 4];
        let (n, mut got) = recv_with_fds(self.sock.as_fd(), &mut data)?;
        let pid = i32::from_ne_bytes(data);
        if n != 4 {
            return Err(io::Error::other("the zygote closed its socket"));
        }
        // With an error, every fd is a spare the zygote discarded; else, after the
        // child's pidfd. Spares are our children: killed and reaped here.
        let spares = if pid <= 0 {
            std::mem::take(&mut got)
        } else {
            got.split_off(got.len().min(1))
        };
        for spare in spares {
            kill_and_reap(&spare);
        }
        if pid <= 0 {
            return Err(io::Error::from_raw_os_error(-pid));
        }
        let pidfd = got
            .pop()
            .ok_or_else(|| io::Error::other("the zygote sent no pidfd"))?;
        Ok(Spawned { pid, pidfd })
    }
}

/// Kills and reaps a child of ours through its pidfd.
fn kill_and_reap(pidfd: &OwnedFd) {
    let _ = sys::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 1000);
    let _ = sys::pidfd_reap(pidfd.as_fd(), true);
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Its spare (our child) comes back with the answer to SHUTDOWN, to be reaped.
        if send_with_fds(self.sock.as_fd(), &SHUTDOWN.to_ne_bytes(), &[]).is_ok() {
            let mut pfd = libc::pollfd {
                fd: self.sock.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, 1000) } > 0 {
                let mut data = [0u8; 4];
                if let Ok((_, spares)) = recv_with_fds(self.sock.as_fd(), &mut data) {
                    for spare in spares {
                        kill_and_reap(&spare);
                    }
                }
            }
        }
        // EOF on its socket ends it; it is our child, so reap it (kill it if it lingers).
        // SAFETY: shutdown on a socket we own.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
        if !matches!(sys::pidfd_wait_exit(self.pidfd.as_fd(), 1000), Ok(true)) {
            let _ = sys::pidfd_kill(self.pidfd.as_fd(), libc::SIGKILL);
            let _ = sys::pidfd_wait_exit(self.pidfd.as_fd(), 1000);
        }
        let _ = sys::pidfd_reap(self.pidfd.as_fd(), true);
    }
}

/// A child from `zygote` (if there is one and it works), else `None`: the caller execs.
/// A zygote that failed is dropped, so the next start makes a new one.
pub(crate) fn fork(
    zygote: &SharedZygote,
    fds: [BorrowedFd<'_>; 4],
    ns: libc::c_int,
) -> Option<Spawned> {
    let mut slot = zygote.lock().unwrap_or_else(PoisonError::into_inner);
    let result = slot.as_ref()?.fork(fds, ns);
    match result {
        Ok(spawned) => Some(spawned),
        Err(_) => {
            *slot = None;
            None
        }
    }
}

/// After a start that had no zygote: makes one for the next start (best effort).
pub(crate) fn ensure(zygote: &SharedZygote, init_binary: &Path) {
    let mut slot = zygote.lock().unwrap_or_else(PoisonError::into_inner);
    if slot.is_none() {
        *slot = Zygote::spawn(init_binary).ok();
    }
}

/// The fds a forked child continues with, as an exec'd init gets them.
#[derive(Debug)]
pub struct ChildFds {
    /// Read end of the plan pipe.
    pub plan: OwnedFd,
    /// Write end of the status pipe.
    pub status: OwnedFd,
    /// The agent socket.
    pub agent: OwnedFd,
    /// A spare child made its network namespace before it was handed out: how that went.
    /// `None`: not done yet (the setup stage does it first thing).
    pub network: Option<Result<(), crate::setup::SetupError>>,
}

/// The request that ends a zygote (instead of namespace flags): it answers with the
/// spare child's pidfd, if it has one, for the host to kill and reap (the spare is the
/// host's child), and exits.
const SHUTDOWN: libc::c_int = -1;

/// A child forked ahead of the next request, in the namespaces of the last one, with its
/// network namespace made; it waits on its socket for its handoff fds.
struct Spare {
    ns: libc::c_int,
    sock: OwnedFd,
    pid: i32,
    pidfd: OwnedFd,
}

/// The zygote's loop (in `omabox-sandbox-init --zygote-fd N`, single-threaded): hands
/// out a child per request — the spare forked after the previous request when there is
/// one (so a start does not wait for a fork and a network namespace), else a fresh
/// fork. Returns in the child, set up like an exec'd init; returns `None` in the zygote
/// once the host closed the socket or asked it to stop.
pub fn serve(sock: OwnedFd) -> Option<ChildFds> {
    let mut spare: Option<Spare> = None;
    let mut last_ns = None;
    loop {
        if spare.is_none()
            && let Some(ns) = last_ns
        {
            match prefork(ns) {
                Ok(Prefork::Spare(s)) => spare = Some(s),
                Ok(Prefork::Child(fds)) => {
                    // The spare closed every fd of the zygote's (`close_range`).
                    std::mem::forget(sock);
                    return Some(fds);
                }
                // Forks on request instead.
                Err(_) => last_ns = None,
            }
        }
        let mut data = [0u8; 4];
        let (n, fds) = match recv_with_fds(sock.as_fd(), &mut data) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        let ns = libc::c_int::from_ne_bytes(data);
        if n == 0 || (n == 4 && ns == SHUTDOWN) {
            if let Some(s) = spare.take() {
                let _ = sys::pidfd_kill(s.pidfd.as_fd(), libc::SIGKILL);
                let _ = send_with_fds(sock.as_fd(), &s.pid.to_ne_bytes(), &[s.pidfd.as_raw_fd()]);
            } else {
                let _ = send_with_fds(sock.as_fd(), &0i32.to_ne_bytes(), &[]);
            }
            return None;
        }
        let Ok([plan, status, agent, null]) = <[OwnedFd; 4]>::try_from(fds) else {
            let _ = send_with_fds(sock.as_fd(), &(-libc::EINVAL).to_ne_bytes(), &[]);
            continue;
        };
        if n != 4 || ns & !ALLOWED_NS != 0 {
            let _ = send_with_fds(sock.as_fd(), &(-libc::EINVAL).to_ne_bytes(), &[]);
            continue;
        }
        last_ns = Some(ns);
        // A spare that cannot be used is killed; the host reaps it (its pidfd rides
        // along with the answer).
        let mut discarded = None;
        if let Some(s) = spare.take() {
            let handed = s.ns == ns
                && send_with_fds(
                    s.sock.as_fd(),
                    &[0; 4],
                    &[plan.as_raw_fd(), status.as_raw_fd(), agent.as_raw_fd()],
                )
                .is_ok();
            if handed {
                let _ = send_with_fds(sock.as_fd(), &s.pid.to_ne_bytes(), &[s.pidfd.as_raw_fd()]);
                continue;
            }
            let _ = sys::pidfd_kill(s.pidfd.as_fd(), libc::SIGKILL);
            discarded = Some(s.pidfd);
        }
        let extra: Vec<RawFd> = discarded.iter().map(|fd| fd.as_raw_fd()).collect();
        match fork_child(ns) {
            Ok(None) => {
                // The child: the zygote's sockets are not its to keep.
                drop(sock);
                drop(discarded);
                let ready = become_init(&plan, &status, &agent, &null);
                drop(null);
                return match ready {
                    Ok(()) => Some(ChildFds {
                        plan,
                        status,
                        agent,
                        network: None,
                    }),
                    // SAFETY: ends the half-made child; the host sees its status pipe close.
                    Err(_) => unsafe { libc::_exit(127) },
                };
            }
            Ok(Some((pid, pidfd))) => {
                let mut sent = vec![pidfd.as_raw_fd()];
                sent.extend(&extra);
                let _ = send_with_fds(sock.as_fd(), &pid.to_ne_bytes(), &sent);
            }
            Err(e) => {
                let errno = e.raw_os_error().unwrap_or(libc::EIO);
                let _ = send_with_fds(sock.as_fd(), &(-errno).to_ne_bytes(), &extra);
            }
        }
    }
}

enum Prefork {
    /// In the zygote: the spare.
    Spare(Spare),
    /// In the spare, once it got its fds.
    Child(ChildFds),
}

/// Forks a spare into `ns`. The spare makes its session, mask and fds like
/// [`become_init`] (its stdio is the zygote's `/dev/null`), makes its network namespace
/// and waits for its handoff fds; it exits if the zygote goes away first.
fn prefork(ns: libc::c_int) -> io::Result<Prefork> {
    let (mine, its) = seqpacket_pair()?;
    match fork_child(ns)? {
        Some((pid, pidfd)) => Ok(Prefork::Spare(Spare {
            ns,
            sock: mine,
            pid,
            pidfd,
        })),
        None => {
            // SAFETY (whole block): in the spare; session and mask syscalls on a local,
            // initialized sigset_t.
            unsafe {
                let mut empty: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut empty);
                libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
                if libc::setsid() < 0 {
                    libc::_exit(127);
                }
            }
            let keep = its.as_raw_fd() as libc::c_uint;
            // Every fd but 0-2 (the zygote's /dev/null) and the spare's own socket.
            if close_range(3, keep - 1).is_err()
                || close_range(keep + 1, libc::c_uint::MAX).is_err()
            {
                // SAFETY: ends the spare before it was handed out.
                unsafe { libc::_exit(127) }
            }
            // Closed above: not ours to close again.
            std::mem::forget(mine);
            let network = crate::setup::isolate_network();
            let mut data = [0u8; 4];
            let fds = loop {
                match recv_with_fds(its.as_fd(), &mut data) {
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Ok((0, _)) | Err(_) => {
                        // SAFETY: the zygote went away before handing this spare out.
                        unsafe { libc::_exit(0) }
                    }
                    Ok((_, fds)) => break fds,
                }
            };
            drop(its);
            let Ok([plan, status, agent]) = <[OwnedFd; 3]>::try_from(fds) else {
                // SAFETY: a malformed handoff; the host sees the status pipe close.
                unsafe { libc::_exit(127) }
            };
            Ok(Prefork::Child(ChildFds {
                plan,
                status,
                agent,
                network: Some(network),
            }))
        }
    }
}

/// `clone3(ns | CLONE_PARENT | CLONE_PIDFD)` without a stack (fork semantics; this
/// process is single-threaded). `Ok(None)` in the child.
fn fork_child(ns: libc::c_int) -> io::Result<Option<(i32, OwnedFd)>> {
    let mut pidfd: libc::c_int = -1;
    // `struct clone_args` (version 0). No exit signal: with CLONE_PARENT the child's
    // is the zygote's own (SIGCHLD), delivered to the host.
    let mut args = [0u64; 8];
    args[0] = (ns | libc::CLONE_PARENT | libc::CLONE_PIDFD) as u64;
    args[1] = &mut pidfd as *mut libc::c_int as u64;
    // SAFETY: clone3 with a valid, live clone_args; fork semantics.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args.as_mut_ptr(),
            std::mem::size_of_val(&args),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    if ret == 0 {
        return Ok(None);
    }
    // SAFETY: the kernel stored a fresh pidfd that only we own.
    Ok(Some((ret as i32, unsafe { OwnedFd::from_raw_fd(pidfd) })))
}

/// What `spawn::clone_exec`'s child does before its exec: a session of its own, an empty
/// signal mask, `/dev/null` stdio, and no fd but the three handoff fds.
fn become_init(
    plan: &OwnedFd,
    status: &OwnedFd,
    agent: &OwnedFd,
    null: &OwnedFd,
) -> io::Result<()> {
    // SAFETY (whole block): syscalls on integers and a local, initialized sigset_t.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        sys::check(libc::setsid())?;
        for target in 0..3 {
            sys::check(libc::dup2(null.as_raw_fd(), target))?;
        }
    }
    // `null` stays open here (its owner closes it): Rust owns it.
    let mut keep = [
        plan.as_raw_fd(),
        status.as_raw_fd(),
        agent.as_raw_fd(),
        null.as_raw_fd(),
    ];
    keep.sort_unstable();
    let mut from: libc::c_uint = 3;
    for fd in keep {
        let fd = fd as libc::c_uint;
        if fd > from {
            close_range(from, fd - 1)?;
        }
        from = fd + 1;
    }
    close_range(from, libc::c_uint::MAX)
}

fn close_range(first: libc::c_uint, last: libc::c_uint) -> io::Result<()> {
    // SAFETY: closes fds of this process that nothing here uses or owns (every fd still
    // needed is outside the range).
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0 as libc::c_uint) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two ints.
    sys::check(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    // SAFETY: fresh fds only we own.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Room for up to 4 fds in a control message (u64s keep it aligned for cmsghdr).
type Control = [u64; 6];

fn send_with_fds(sock: BorrowedFd<'_>, data: &[u8], fds: &[RawFd]) -> io::Result<()> {
    debug_assert!(fds.len() <= 4);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control: Control = [0; 6];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE only computes a size (within `control` for <= 4 fds).
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(bytes) } as _;
        // SAFETY: `msg` points at `control`, which has room for one header with
        // `fds.len()` fds, so CMSG_FIRSTHDR is non-null and CMSG_DATA within it.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: `msg` points at live `iov`, `data` and `control`.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// One message: its data length and the fds it carried (close-on-exec, ours).
fn recv_with_fds(sock: BorrowedFd<'_>, data: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    let mut control: Control = [0; 6];
    // SAFETY: msghdr is plain data; zeroed is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at a writable `iov` and `control`, alive for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` (msg_controllen says how much); CMSG_FIRSTHDR
    // and CMSG_NXTHDR stay within it, and an SCM_RIGHTS header's data holds fds, every
    // one of them ours now.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let first = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(first.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::other("file descriptor message truncated"));
    }
    Ok((n as usize, fds))
}
