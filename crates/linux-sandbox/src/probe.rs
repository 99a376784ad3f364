//! What this kernel and this process can do, probed once; admission is checking a plan
//! against this value. "Absent" (`Ok` with the feature off) and "probe failed" (`Err`)
//! are different outcomes.

use std::io;

use serde::{Deserialize, Serialize};

use crate::cgroup::CgroupLayout;
use crate::plan::{RootfsSource, SandboxPlan};

/// Namespace kinds the kernel offers (`/proc/self/ns/<kind>` exists).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Namespaces {
    /// user
    pub user: bool,
    /// mnt
    pub mount: bool,
    /// pid
    pub pid: bool,
    /// net
    pub net: bool,
    /// ipc
    pub ipc: bool,
    /// uts
    pub uts: bool,
    /// cgroup
    pub cgroup: bool,
    /// time
    pub time: bool,
}

/// Probed facts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LinuxCapabilities {
    /// Effective uid is 0.
    pub root: bool,
    /// Namespace kinds.
    pub namespaces: Namespaces,
    /// Unprivileged users may create user namespaces. Probed only without root, the one
    /// case admission asks (as root: `false`, not read).
    pub unprivileged_userns: bool,
    /// Cgroup layout; `None`: no cgroup hierarchy with the controllers we use.
    pub cgroup: Option<CgroupLayout>,
    /// Landlock ABI (0 = none).
    pub landlock_abi: u32,
    /// Seccomp filter mode (`SECCOMP_GET_ACTION_AVAIL` of the errno action succeeds).
    pub seccomp: bool,
    /// pidfds (`pidfd_open`, Linux >= 5.3), used to avoid pid reuse.
    pub pidfd: bool,
}

/// The probe itself failed (as opposed to finding a feature absent).
#[derive(Debug, thiserror::Error)]
#[error("probing {what} failed")]
pub struct ProbeError {
    /// What was being probed.
    pub what: &'static str,
    /// Why.
    #[source]
    pub source: io::Error,
}

/// A requirement of a plan this machine does not meet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the linux sandbox cannot run here: {missing}; {fix}")]
pub struct MissingRequirement {
    /// What is missing.
    pub missing: String,
    /// How to fix it.
    pub fix: String,
}

fn missing(what: &str, fix: &str) -> MissingRequirement {
    MissingRequirement {
        missing: what.to_owned(),
        fix: fix.to_owned(),
    }
}

impl LinuxCapabilities {
    /// Probes the running kernel and process.
    pub fn probe() -> Result<Self, ProbeError> {
        // One directory read: each entry of /proc/self/ns is a namespace type this
        // kernel has (a stat per type follows each magic link, at several times the
        // cost). Unreadable: none, as a failed stat said before.
        let present: Vec<std::ffi::OsString> = std::fs::read_dir("/proc/self/ns")
            .map(|dir| dir.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        let ns = |n: &str| present.iter().any(|p| p == n);
        let namespaces = Namespaces {
            user: ns("user"),
            mount: ns("mnt"),
            pid: ns("pid"),
            net: ns("net"),
            ipc: ns("ipc"),
            uts: ns("uts"),
            cgroup: ns("cgroup"),
            time: ns("time"),
        };
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let unprivileged_userns = !root && unprivileged_userns()?;
        let cgroup = CgroupLayout::detect().map_err(|source| ProbeError {
            what: "cgroup layout",
            source,
        })?;
        let landlock_abi = crate::setup::harden::landlock_abi().map_err(|source| ProbeError {
            what: "landlock",
            source,
        })?;
        // One syscall, where reading /proc/self/status cost ~20 µs of every start: whether
        // the kernel's filter mode knows the errno action this filter returns.
        let errno_action: u32 = libc::SECCOMP_RET_ERRNO;
        // SAFETY: SECCOMP_GET_ACTION_AVAIL only reads the u32 it is given.
        let seccomp = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_GET_ACTION_AVAIL,
                0,
                &errno_action as *const u32,
            )
        } == 0;
        let pidfd = match crate::sys::pidfd_open(std::process::id() as i32) {
            Ok(_) => true,
            Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => false,
            Err(source) => {
                return Err(ProbeError {
                    what: "pidfd",
                    source,
                });
            }
        };
        Ok(Self {
            root,
            namespaces,
            unprivileged_userns,
            cgroup,
            landlock_abi,
            seccomp,
            pidfd,
        })
    }

    /// Checks that `plan` can run here; the error says what is missing and how to fix it.
    pub fn check(&self, plan: &SandboxPlan) -> Result<(), MissingRequirement> {
        let n = &self.namespaces;
        for (have, name, config) in [
            (n.mount, "mount namespaces", "CONFIG_NAMESPACES"),
            (n.pid, "pid namespaces", "CONFIG_PID_NS"),
            (n.net, "network namespaces", "CONFIG_NET_NS"),
            (n.ipc, "ipc namespaces", "CONFIG_IPC_NS"),
            (n.uts, "uts namespaces", "CONFIG_UTS_NS"),
            (n.cgroup, "cgroup namespaces", "CONFIG_CGROUPS"),
        ] {
            if !have {
                return Err(missing(
                    &format!("{name} are missing"),
                    &format!("use a kernel built with {config}"),
                ));
            }
        }
        if !(self.root || n.user && self.unprivileged_userns) {
            return Err(missing(
                "not running as root and unprivileged user namespaces are disabled",
                "run as root, or enable them (sysctl user.max_user_namespaces=15000 and, on Debian, kernel.unprivileged_userns_clone=1)",
            ));
        }
        if !self.pidfd {
            return Err(missing("pidfds are missing", "use Linux >= 5.3"));
        }
        let wants_limits = plan.limits.memory_bytes.is_some()
            || plan.limits.pids_max.is_some()
            || plan.limits.cpu.is_some();
        if wants_limits {
            match &self.cgroup {
                None => {
                    return Err(missing(
                        "no cgroup hierarchy is mounted",
                        "mount cgroup2 at /sys/fs/cgroup, or the v1 memory and pids controllers at /sys/fs/cgroup/<controller>",
                    ));
                }
                Some(layout) => {
                    let lacking = layout.missing_required();
                    if !lacking.is_empty() {
                        return Err(missing(
                            &format!("cgroup controllers {lacking:?} are missing"),
                            "mount them (v1: /sys/fs/cgroup/<controller>) or enable them in /sys/fs/cgroup/cgroup.subtree_control (v2)",
                        ));
                    }
                }
            }
        }
        if plan.hardening.seccomp && !self.seccomp {
            return Err(missing(
                "seccomp is missing",
                "use a kernel built with CONFIG_SECCOMP_FILTER",
            ));
        }
        if plan.hardening.require_landlock && self.landlock_abi == 0 {
            return Err(missing(
                "landlock is required but missing",
                "boot with landlock in lsm= (Linux >= 5.13), or do not require it",
            ));
        }
        // Read only for the plans that need it (the preinstalled rootfs does not).
        if matches!(plan.rootfs, RootfsSource::Directory { .. }) && !overlayfs() {
            return Err(missing(
                "overlayfs is missing (needed by a directory rootfs)",
                "modprobe overlay, or use the preinstalled rootfs",
            ));
        }
        Ok(())
    }
}

/// Whether user namespaces may be made without privileges (`user.max_user_namespaces`
/// above 0 and, on Debian's older kernels, `kernel.unprivileged_userns_clone` on).
fn unprivileged_userns() -> Result<bool, ProbeError> {
    let fail = |source| ProbeError {
        what: "user namespace limits",
        source,
    };
    let max_userns = read_opt("/proc/sys/user/max_user_namespaces")
        .map_err(fail)?
        .and_then(|s| s.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let debian_switch = read_opt("/proc/sys/kernel/unprivileged_userns_clone")
        .map_err(fail)?
        .map(|s| s.trim() == "1")
        .unwrap_or(true);
    Ok(max_userns > 0 && debian_switch)
}

/// Whether the kernel has the overlay filesystem (needed by a directory rootfs). An
/// unreadable `/proc/filesystems` counts as no.
fn overlayfs() -> bool {
    std::fs::read_to_string("/proc/filesystems").is_ok_and(|filesystems| {
        filesystems
            .lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    })
}

fn read_opt(p: &str) -> io::Result<Option<String>> {
    match std::fs::read_to_string(p) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_finds_what_this_kernel_has() {
        // Every kernel omabox supports (and CI's) has seccomp filters, pidfds, the
        // namespaces and the overlay filesystem; the probe must see them, by whatever
        // cheap means it uses.
        let caps = LinuxCapabilities::probe().unwrap();
        assert!(caps.seccomp, "{caps:?}");
        assert!(caps.pidfd, "{caps:?}");
        let n = caps.namespaces;
        assert!(
            n.mount && n.pid && n.net && n.ipc && n.uts && n.cgroup,
            "{n:?}"
        );
        assert!(overlayfs());
        // As root the unprivileged switch is not read (nothing asks for it then).
        if caps.root {
            assert!(!caps.unprivileged_userns);
        }
    }
}
