//! What passes between the host and the setup stage before the agent takes over.
//!
//! The host first sends one byte carrying the idmapped mount fds of the writable binds
//! (`SCM_RIGHTS`, see [`send_fds`]; possibly none) on the plan socket, then one
//! [`InitSpec`] (JSON), and closes it; the setup stage blocks on that read, so it runs no code of the plan before the host has moved
//! it into its cgroup. The setup stage answers on the status pipe with exactly one
//! message and closes it: `R` + [`SetupReport`] JSON (ready), `E` + text (setup failed),
//! or, written by the cloned child itself, `X` + errno (the exec failed).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::plan::SandboxPlan;

pub use crate::sys::monotonic_us;

/// Tag of a ready message.
pub const READY: u8 = b'R';
/// Tag of a setup failure.
pub const FAILED: u8 = b'E';
/// Tag of an exec failure (written between clone and exec).
pub const EXEC_FAILED: u8 = b'X';

/// Input of the setup stage.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InitSpec {
    /// Sandbox id (for messages only).
    pub id: String,
    /// The plan to carry out.
    pub plan: SandboxPlan,
    /// Host directory (empty, owned by this sandbox) where the setup stage mounts its
    /// scratch tmpfs, inside its private mount namespace; the host never sees the mount.
    pub scratch_dir: PathBuf,
    /// cgroup v1 `tasks` files the setup stage writes `0` into before anything else,
    /// joining the sandbox cgroup itself (see `setup::join_cgroups`). Empty when the
    /// host moved it already (cgroup v2, or no cgroups).
    #[serde(default)]
    pub cgroup_join: Vec<PathBuf>,
    /// The sandbox runs in a user namespace of its own with a host id range (the host
    /// wrote its maps before sending this): after the host-path steps the setup stage
    /// becomes the namespace's uid/gid 0.
    #[serde(default)]
    pub userns: bool,
    /// How many idmapped mount fds came with the plan: one per writable bind, in the
    /// order workspace, outputs, writable `binds`.
    #[serde(default)]
    pub idmapped: usize,
}

/// Most fds [`send_fds`] carries.
pub const MAX_FDS: usize = 16;

/// Sends one byte with `fds` attached.
pub fn send_fds(sock: &OwnedFd, fds: &[RawFd]) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "too many binds",
        ));
    }
    let byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let mut control = [0u64; 16 + MAX_FDS / 2];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let bytes = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE/CMSG_LEN are pure arithmetic.
        let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: `control` is 8-byte aligned and at least `space` bytes long, so the
        // first header and its data fit; CMSG_FIRSTHDR/CMSG_DATA point into it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as usize;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    // SAFETY: `msg` points at live buffers set up above.
    if unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Receives the byte of [`send_fds`] and the fds attached to it (close-on-exec).
pub fn recv_fds(sock: &OwnedFd) -> io::Result<Vec<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 16 + MAX_FDS / 2];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` points at live, writable buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut out = Vec::new();
    // SAFETY: the kernel filled `control` with well-formed headers within
    // msg_controllen; CMSG_* walk only those. Each SCM_RIGHTS fd is fresh and ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c).cast::<RawFd>();
                let count = ((*c).cmsg_len - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    out.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if n != 1 || byte[0] != b'F' || msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "malformed mount handoff",
        ));
    }
    Ok(out)
}

/// What the setup stage actually enforced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SetupReport {
    /// Landlock ABI of the kernel (0 = none).
    pub landlock_abi: u32,
    /// Whether a Landlock ruleset was enforced (fully or partially).
    pub landlock_enforced: bool,
    /// Whether the seccomp filter is installed.
    pub seccomp: bool,
    /// Capabilities left in the bounding set (expected: 0).
    pub bounding_caps: u32,
    /// Microseconds spent in each setup step, in order (diagnostics for benchmarks).
    #[serde(default)]
    pub step_micros: Vec<(String, u64)>,
    /// Milestones of the setup stage as absolute `CLOCK_MONOTONIC` microseconds (see
    /// [`monotonic_us`]), to line up with the host's own (diagnostics for benchmarks).
    #[serde(default)]
    pub clock_us: Vec<(String, u64)>,
}
