//! A pre-started setup stage that forks per sandbox, so a start does not pay for an exec.
//!
//! Exec'ing `omabox-sandbox-init` costs a sandbox start ~1.6 ms on a VM before its
//! `main` runs (the dynamic loader and libc's start-up, `cpuid` included). So a
//! [`LinuxRuntime`](crate::LinuxRuntime) keeps one `omabox-sandbox-init --zygote-fd N`
//! process, exec'd once (with an empty environment, `/dev/null` stdio, a session of its
//! own, like every init) and single-threaded for life, that forks children into the new
//! namespaces with `CLONE_PARENT`: each is the host's child, which waits for and reaps it
//! through the pidfd the zygote sends back. On the host's `SOCK_SEQPACKET` socket:
//!
//! - `FORK ns` + the child's three handoff fds and `/dev/null` → a child that continues
//!   at once exactly like an exec'd init (default signal mask, a session of its own,
//!   `/dev/null` stdio, no fd but the three); answer: its pid and pidfd.
//! - `SPARE ns` → a child forked ahead: it does the same, makes its network namespace,
//!   and waits on a socket of its own for its handoff fds; answer: its pid, pidfd and that
//!   socket. The host keeps one spare and hands the next start's fds to it directly, so a
//!   start waits for neither the zygote, a fork nor a network namespace.
//!
//! A child takes the plan's environment once it has read the plan. The zygote never runs
//! code of a plan and holds nothing of the host's but its socket; it exits when the host
//! closes it (the host dropped the runtime, or died); a spare exits when its socket
//! closes. The first start of a runtime execs as before and then starts the zygote for
//! the next; a zygote that fails is dropped and the start falls back to the exec.

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

/// Request kinds (the first 4 bytes; the namespace flags follow).
const FORK: u32 = 1;
const SPARE: u32 = 2;

/// The runtime's zygote, shared by its clones; `None` until the first start made one.
pub(crate) type SharedZygote = Arc<Mutex<Option<Zygote>>>;

/// The host's handle on a zygote process.
#[derive(Debug)]
pub(crate) struct Zygote {
    sock: OwnedFd,
    pidfd: OwnedFd,
    /// A child forked ahead, waiting for its fds.
    spare: Option<Spare>,
    /// A `SPARE` request whose answer is not read yet (its namespaces).
    asked: Option<libc::c_int>,
}

/// A spare child, as the host holds it.
#[derive(Debug)]
struct Spare {
    ns: libc::c_int,
    sock: OwnedFd,
    pid: i32,
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
            spare: None,
            asked: None,
        })
    }

    /// A child in `ns` whose handoff fds are `fds` (plan read end, status write end,
    /// agent socket, `/dev/null`): the spare if it fits, else a fresh fork; then asks for
    /// the next spare.
    fn fork(&mut self, fds: [BorrowedFd<'_>; 4], ns: libc::c_int) -> io::Result<Spawned> {
        if let Some(asked) = self.asked.take() {
            let (pid, mut got) = self.answer()?;
            if pid > 0 && got.len() == 2 {
                let sock = got.pop().unwrap_or_else(|| unreachable!());
                let pidfd = got.pop().unwrap_or_else(|| unreachable!());
                self.spare = Some(Spare {
                    ns: asked,
                    sock,
                    pid,
                    pidfd,
                });
            } else {
                got.iter().for_each(kill_and_reap);
            }
        }
        let spawned = match self.spare.take() {
            Some(spare) if spare.ns == ns => {
                let handed = send_with_fds(
                    spare.sock.as_fd(),
                    &[0; 4],
                    &[fds[0].as_raw_fd(), fds[1].as_raw_fd(), fds[2].as_raw_fd()],
                );
                match handed {
                    Ok(()) => Some(Spawned {
                        pid: spare.pid,
                        pidfd: spare.pidfd,
                    }),
                    Err(_) => {
                        kill_and_reap(&spare.pidfd);
                        None
                    }
                }
            }
            Some(spare) => {
                kill_and_reap(&spare.pidfd);
                None
            }
            None => None,
        };
        let spawned = match spawned {
            Some(s) => s,
            None => {
                send_with_fds(
                    self.sock.as_fd(),
                    &request(FORK, ns),
                    &fds.map(|f| f.as_raw_fd()),
                )?;
                let (pid, mut got) = self.answer()?;
                if pid <= 0 {
                    got.iter().for_each(kill_and_reap);
                    return Err(io::Error::from_raw_os_error(-pid));
                }
                let pidfd = got
                    .pop()
                    .ok_or_else(|| io::Error::other("the zygote sent no pidfd"))?;
                Spawned { pid, pidfd }
            }
        };
        // The next start's spare, forked while this sandbox sets itself up.
        if send_with_fds(self.sock.as_fd(), &request(SPARE, ns), &[]).is_ok() {
            self.asked = Some(ns);
        }
        Ok(spawned)
    }

    /// The zygote's next answer: a pid (or -errno) and the fds it carried.
    fn answer(&self) -> io::Result<(i32, Vec<OwnedFd>)> {
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
        let (n, got) = recv_with_fds(self.sock.as_fd(), &mut data)?;
        if n != 4 {
            return Err(io::Error::other("the zygote closed its socket"));
        }
        Ok((i32::from_ne_bytes(data), got))
    }
}

/// A request: its kind and the namespace flags.
fn request(kind: u32, ns: libc::c_int) -> [u8; 8] {
    let mut r = [0u8; 8];
    r[..4].copy_from_slice(&kind.to_ne_bytes());
    r[4..].copy_from_slice(&ns.to_ne_bytes());
    r
}

/// Kills and reaps a child of ours through its pidfd.
fn kill_and_reap(pidfd: &OwnedFd) {
    let _ = sys::pidfd_kill(pidfd.as_fd(), libc::SIGKILL);
    let _ = sys::pidfd_wait_exit(pidfd.as_fd(), 1000);
    let _ = sys::pidfd_reap(pidfd.as_fd(), true);
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // Spares are our children: a requested one is collected first, then killed and
        // reaped.
        if self.asked.take().is_some()
            && let Ok((_, got)) = self.answer()
        {
            got.iter().for_each(kill_and_reap);
        }
        if let Some(spare) = self.spare.take() {
            kill_and_reap(&spare.pidfd);
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
    let result = slot.as_mut()?.fork(fds, ns);
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
    /// A spare made its network namespace before it was handed out: how that went.
    /// `None`: not done yet (the setup stage does it first thing).
    pub network: Option<Result<(), crate::setup::SetupError>>,
}

/// The zygote's loop (in `omabox-sandbox-init --zygote-fd N`, single-threaded): answers
/// `FORK` and `SPARE` requests (module doc). Returns in a child, set up like an exec'd
/// init; returns `None` in the zygote once the host closed the socket.
pub fn serve(sock: OwnedFd) -> Option<ChildFds> {
    loop {
        let mut data = [0u8; 8];
        let (n, fds) = match recv_with_fds(sock.as_fd(), &mut data) {
            Ok(r) => r,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return None,
        };
        if n == 0 {
            return None;
        }
        let kind = u32::from_ne_bytes([data[0], data[1], data[2], data[3]]);
        let ns = libc::c_int::from_ne_bytes([data[4], data[5], data[6], data[7]]);
        let refuse = |errno: libc::c_int| {
            let _ = send_with_fds(sock.as_fd(), &(-errno).to_ne_bytes(), &[]);
        };
        if n != 8 || ns & !ALLOWED_NS != 0 {
            refuse(libc::EINVAL);
            continue;
        }
        if kind == SPARE && fds.is_empty() {
            match spare(ns) {
                Ok(Forked::Parent(pid, pidfd, its_sock)) => {
                    let _ = send_with_fds(
                        sock.as_fd(),
                        &pid.to_ne_bytes(),
                        &[pidfd.as_raw_fd(), its_sock.as_raw_fd()],
                    );
                }
                Ok(Forked::Child(fds)) => {
                    // The spare closed every fd of the zygote's (`close_range`).
                    std::mem::forget(sock);
                    return Some(fds);
                }
                Err(e) => refuse(e.raw_os_error().unwrap_or(libc::EIO)),
            }
            continue;
        }
        let Ok([plan, status, agent, null]) = <[OwnedFd; 4]>::try_from(fds) else {
            refuse(libc::EINVAL);
            continue;
        };
        if kind != FORK {
            refuse(libc::EINVAL);
            continue;
        }
        match fork_child(ns) {
            Ok(None) => {
                // The child: the zygote's socket is not its to keep.
                drop(sock);
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
                let _ = send_with_fds(sock.as_fd(), &pid.to_ne_bytes(), &[pidfd.as_raw_fd()]);
            }
            Err(e) => refuse(e.raw_os_error().unwrap_or(libc::EIO)),
        }
    }
}

enum Forked {
    /// In the zygote: the spare's pid, pidfd and the host's end of its socket.
    Parent(i32, OwnedFd, OwnedFd),
    /// In the spare, once it got its fds.
    Child(ChildFds),
}

/// Forks a spare into `ns`. The spare makes its session, mask and fds like
/// [`become_init`] (its stdio is the zygote's `/dev/null`), makes its network namespace
/// and waits for its handoff fds; it exits if its socket closes first.
fn spare(ns: libc::c_int) -> io::Result<Forked> {
    let (host_end, its) = seqpacket_pair()?;
    if let Some((pid, pidfd)) = fork_child(ns)? {
        drop(its);
        return Ok(Forked::Parent(pid, pidfd, host_end));
    }
    // SAFETY: (the whole block) in the spare; session and mask syscalls on a local,
    // initialized sigset_t.
    unsafe {
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        if libc::setsid() < 0 {
            libc::_exit(127);
        }
    }
    // Every fd but 0-2 (the zygote's /dev/null) and the spare's own socket.
    if sys::close_all_but(&mut [its.as_raw_fd()]).is_err() {
        // SAFETY: ends the spare before it was handed out.
        unsafe { libc::_exit(127) }
    }
    // Closed above: not ours to close again.
    std::mem::forget(host_end);
    let network = crate::setup::isolate_network();
    let mut data = [0u8; 4];
    let fds = loop {
        match recv_with_fds(its.as_fd(), &mut data) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // SAFETY: the host let go of this spare before handing it out.
            Ok((0, _)) | Err(_) => unsafe { libc::_exit(0) },
            Ok((_, fds)) => break fds,
        }
    };
    drop(its);
    let Ok([plan, status, agent]) = <[OwnedFd; 3]>::try_from(fds) else {
        // SAFETY: a malformed handoff; the host sees the status pipe close.
        unsafe { libc::_exit(127) }
    };
    Ok(Forked::Child(ChildFds {
        plan,
        status,
        agent,
        network: Some(network),
    }))
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
    // SAFETY: (the whole block) syscalls on integers and a local, initialized sigset_t.
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
    sys::close_all_but(&mut [
        plan.as_raw_fd(),
        status.as_raw_fd(),
        agent.as_raw_fd(),
        null.as_raw_fd(),
    ])
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
