//! Capabilities, securebits, no_new_privs and dumpable: after [`drop_capabilities`]
//! uid 0 keeps no power, not even across `execve` — or, in a sandbox with its own root
//! filesystem, only the file-ownership set inside its user namespace. Must never leave
//! another capability in any set, nor an unlocked securebit that would give one back.

use std::io;

use super::SetupError;
use crate::sys;

use super::err;

const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// What uid 0 keeps inside the sandbox's user namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::setup) enum RootPower {
    /// Nothing (the default root: the host's `/usr` read-only, nothing to administer).
    None,
    /// [`FILE_OWNERSHIP_CAPS`]: a sandbox with its own root filesystem (an image)
    /// administers it — apt and dpkg chown files, drop to `_apt` and back. Each of these
    /// capabilities is checked against the sandbox's user namespace, so it reaches only
    /// processes of the sandbox and inodes whose owners are in its own unprivileged id
    /// range; never a host file, never a host process.
    FileOwnership,
}

/// CHOWN (0), DAC_OVERRIDE (1), FOWNER (3), KILL (5), SETGID (6), SETUID (7) (numbers of
/// `linux/capability.h`): what apt and dpkg need. Not FSETID (setuid/setgid modes are
/// refused by the seccomp filter anyway), DAC_READ_SEARCH (`open_by_handle_at`), SETPCAP
/// (securebits), anything of SYS_* or NET_*.
const FILE_OWNERSHIP_CAPS: u32 = (1 << 0) | (1 << 1) | (1 << 3) | (1 << 5) | (1 << 6) | (1 << 7);

/// Drops every capability from every set but what `power` keeps. The agent needs none: it
/// only starts processes (same uid), signals its own process groups and touches files in
/// writable binds. With [`RootPower::None`] uid 0 keeps no power after this: securebits
/// stop `execve` from granting root its capabilities back, the bounding set is empty, and
/// ambient raising is locked off. With [`RootPower::FileOwnership`] the bounding set holds
/// only [`FILE_OWNERSHIP_CAPS`]; uid 0 keeps them across `execve` (plain root semantics,
/// capped by the bounding set and no_new_privs), a switch to another uid drops them (the
/// setuid fixup stays on), and the securebits are locked so nothing turns that off.
pub(in crate::setup) fn drop_capabilities(power: RootPower) -> Result<u32, SetupError> {
    let (bits, keep) = match power {
        RootPower::None => (
            SECBIT_NOROOT
                | SECBIT_NOROOT_LOCKED
                | SECBIT_NO_SETUID_FIXUP
                | SECBIT_NO_SETUID_FIXUP_LOCKED
                | SECBIT_KEEP_CAPS_LOCKED
                | SECBIT_NO_CAP_AMBIENT_RAISE
                | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
            0,
        ),
        RootPower::FileOwnership => (
            SECBIT_NOROOT_LOCKED
                | SECBIT_NO_SETUID_FIXUP_LOCKED
                | SECBIT_KEEP_CAPS_LOCKED
                | SECBIT_NO_CAP_AMBIENT_RAISE
                | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
            FILE_OWNERSHIP_CAPS,
        ),
    };
    sys::prctl(libc::PR_SET_SECUREBITS, bits).map_err(err("set securebits"))?;
    sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )
    .map_err(err("clear ambient capabilities"))?;
    let last = last_cap();
    for cap in 0..=last {
        if cap < 32 && keep & (1 << cap) != 0 {
            continue;
        }
        match sys::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong) {
            Ok(()) => {}
            // Unknown to this kernel: nothing to drop.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(err("drop bounding capabilities")(e)),
        }
    }
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [
        CapData {
            effective: keep,
            permitted: keep,
            inheritable: 0,
        },
        CapData {
            effective: 0,
            permitted: 0,
            inheritable: 0,
        },
    ];
    // SAFETY: header and two data structs in the layout capset(2) expects for version 3.
    let r = unsafe {
        libc::syscall(
            libc::SYS_capset,
            &mut header as *mut CapHeader,
            data.as_ptr(),
        )
    };
    if r < 0 {
        return Err(err("clear capabilities")(io::Error::last_os_error()));
    }
    let mut remaining = 0;
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_READ takes an integer and returns 0/1.
        if unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } == 1 {
            remaining += 1;
        }
    }
    Ok(remaining)
}

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63)
}

/// no_new_privs (setuid files and file capabilities grant nothing) and non-dumpable
/// PID 1 (sandbox processes cannot open `/proc/1/{exe,mem,environ,fd}` or ptrace it, so
/// the host-side binary behind `/proc/1/exe` cannot be reached; cf. CVE-2019-5736).
pub(in crate::setup) fn no_new_privs() -> Result<(), SetupError> {
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(err("set no_new_privs"))?;
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(err("clear dumpable"))
}
