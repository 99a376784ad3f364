//! The seccomp rules: which syscalls are refused (EPERM) or answered ENOSYS, and for
//! which arguments (socket families, namespace flags, terminal injection, setuid modes).
//! Must never allow by rule what a deny rule of the same syscall refuses (seccompiler's
//! rules of one syscall are ORed), nor leave a listed call reachable under another
//! number (see `bpf` for x32 and `clone3`).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::SetupError;

/// The newest syscall number this filter was written against (`removexattrat`, Linux
/// 6.13; numbers are shared by every architecture from 424 on). Anything newer is
/// answered ENOSYS: a syscall added to the kernel later is new attack surface this deny
/// list has never looked at, and programs treat ENOSYS as "not on this kernel".
pub(super) const NEWEST_KNOWN_SYSCALL: u32 = 466;

/// Syscalls answered ENOSYS, as if the kernel lacked them (programs fall back):
/// `clone3` (its flags live in memory a filter cannot inspect; libc falls back to
/// `clone`, whose flags the filter checks); `io_setup`, whose contexts come out of the
/// host-wide `fs.aio-max-nr` pool (a sandbox could take every slot and make host
/// processes fail); `io_uring_*` (its requests bypass this filter by design);
/// `memfd_secret` (unswappable memory removed from the kernel's direct map);
/// `openat2` (its mode cannot be inspected, see [`mode_rules`]).
pub(super) fn unimplemented_syscalls() -> Vec<i64> {
    vec![
        libc::SYS_clone3,
        libc::SYS_io_setup,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_memfd_secret,
        libc::SYS_openat2,
    ]
}

/// Syscalls refused with EPERM unconditionally: mount-table changes, kernel keyring,
/// BPF, perf, kexec, kernel modules, reboot, swap, handle-based opens (which bypass path
/// checks), ptrace and cross-process memory access, namespace changes, raw I/O ports,
/// x86 segment descriptors (`modify_ldt`: a long line of kernel bugs, which nothing but
/// 16-bit emulators needs; Docker's default profile refuses it too), userfaultfd,
/// fanotify, clock setting, kernel log, accounting and quotas. Mostly also
/// stopped by the missing capabilities; the filter holds even if a capability ever
/// leaked.
pub(super) fn denied_syscalls() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_chroot,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_move_mount,
        libc::SYS_open_tree,
        libc::SYS_mount_setattr,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_reboot,
        libc::SYS_swapon,
        libc::SYS_swapoff,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_userfaultfd,
        libc::SYS_acct,
        libc::SYS_quotactl,
        libc::SYS_quotactl_fd,
        libc::SYS_syslog,
        libc::SYS_vhangup,
        libc::SYS_settimeofday,
        libc::SYS_clock_settime,
        libc::SYS_clock_adjtime,
        libc::SYS_pidfd_getfd,
        libc::SYS_kcmp,
        libc::SYS_fanotify_init,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_iopl,
        libc::SYS_ioperm,
        libc::SYS_modify_ldt,
        libc::SYS_uselib,
        libc::SYS__sysctl,
        libc::SYS_nfsservctl,
        libc::SYS_lookup_dcookie,
    ]);
    v
}

pub(super) fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SetupError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SetupError::Seccomp(e.to_string()))
}

pub(super) fn rule(c: SeccompCondition) -> Result<SeccompRule, SetupError> {
    all_of(vec![c])
}

/// A rule that matches when every condition holds.
pub(super) fn all_of(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SetupError> {
    SeccompRule::new(conditions).map_err(|e| SetupError::Seccomp(e.to_string()))
}

/// Address families `socket` may create: what an ordinary program needs. Everything
/// else (`AF_VSOCK`, `AF_PACKET`, `AF_BLUETOOTH`, `AF_ALG`, `AF_KEY`, …) is refused:
/// families are not all namespaced (vsock reaches the hypervisor), and each one is
/// kernel attack surface.
pub(super) const SOCKET_FAMILIES: [libc::c_int; 4] = [
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];
/// IP protocols an inet socket may use: the default for its type, TCP, UDP, ICMP(v6)
/// (ping sockets). SCTP, DCCP, MPTCP, … are refused (rarely needed, and loading their
/// modules on demand is a classic way into buggy kernel code).
pub(super) const IP_PROTOCOLS: [libc::c_int; 5] = [
    0,
    libc::IPPROTO_TCP,
    libc::IPPROTO_UDP,
    libc::IPPROTO_ICMP,
    libc::IPPROTO_ICMPV6,
];

/// Refusals of setuid/setgid mode bits wherever a mode is passed: `chmod`, `fchmod`,
/// `fchmodat`, `fchmodat2`, `open`/`openat`/`creat` (the mode of a created file),
/// `mkdir`/`mkdirat`, `mknod`/`mknodat`. A sandbox writes into host directories (the
/// workspace and outputs binds, where its uid 0 acts as the directory's host owner),
/// and a host user must never find a setuid or setgid file there. `openat2` carries
/// its mode in memory a filter cannot read: it gets ENOSYS (libc falls back to
/// `openat`). Writes by the sandbox to an existing setuid file clear the bits (it has no
/// `CAP_FSETID`), and it cannot `chown` or set file capabilities (no capabilities).
pub(super) fn mode_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, SetupError> {
    let privileged = |arg: u8| -> Result<Vec<SeccompRule>, SetupError> {
        [libc::S_ISUID, libc::S_ISGID]
            .iter()
            .map(|bit| rule(cond(arg, SeccompCmpOp::MaskedEq(*bit as u64), *bit as u64)?))
            .collect()
    };
    let mut v = vec![
        (libc::SYS_fchmod, privileged(1)?),
        (libc::SYS_fchmodat, privileged(2)?),
        (libc::SYS_fchmodat2, privileged(2)?),
        (libc::SYS_openat, privileged(3)?),
        (libc::SYS_mkdirat, privileged(2)?),
        (libc::SYS_mknodat, privileged(2)?),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        (libc::SYS_chmod, privileged(1)?),
        (libc::SYS_open, privileged(2)?),
        (libc::SYS_creat, privileged(1)?),
        (libc::SYS_mkdir, privileged(1)?),
        (libc::SYS_mknod, privileged(1)?),
    ]);
    Ok(v)
}

/// The obsolete `SOCK_PACKET` type (`libc` deprecates its constant).
pub(super) const SOCK_PACKET: libc::c_int = 10;
/// `SOCK_DCCP` (not in `libc`).
pub(super) const SOCK_DCCP: libc::c_int = 6;

/// `socket` and `socketpair` refusals: an allow list of families and, within them, of
/// types and protocols. The only netlink protocol is `NETLINK_ROUTE` (interfaces and
/// addresses; `NETLINK_KOBJECT_UEVENT` would deliver host device events, `NETLINK_AUDIT`
/// reaches the host's audit log, …); raw sockets only for netlink (inet raw sockets
/// forge packets); `SOCK_PACKET` (which the kernel turns into `AF_PACKET`), `SOCK_RDM`
/// and `SOCK_DCCP` never. `socketpair` only for `AF_UNIX`, the only family that has it.
pub(super) fn socket_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, SetupError> {
    let other_family = SOCKET_FAMILIES
        .iter()
        .map(|f| cond(0, SeccompCmpOp::Ne, *f as u64))
        .collect::<Result<Vec<_>, _>>()?;
    let mut socket = vec![
        all_of(other_family)?,
        all_of(vec![
            cond(0, SeccompCmpOp::Eq, libc::AF_NETLINK as u64)?,
            cond(2, SeccompCmpOp::Ne, libc::NETLINK_ROUTE as u64)?,
        ])?,
        all_of(vec![
            cond(0, SeccompCmpOp::Ne, libc::AF_NETLINK as u64)?,
            cond(1, SeccompCmpOp::MaskedEq(0xf), libc::SOCK_RAW as u64)?,
        ])?,
    ];
    for t in [SOCK_PACKET, libc::SOCK_RDM, SOCK_DCCP] {
        socket.push(rule(cond(1, SeccompCmpOp::MaskedEq(0xf), t as u64)?)?);
    }
    for f in [libc::AF_INET, libc::AF_INET6] {
        let mut c = vec![cond(0, SeccompCmpOp::Eq, f as u64)?];
        for p in IP_PROTOCOLS {
            c.push(cond(2, SeccompCmpOp::Ne, p as u64)?);
        }
        socket.push(all_of(c)?);
    }
    let socketpair = vec![rule(cond(0, SeccompCmpOp::Ne, libc::AF_UNIX as u64)?)?];
    Ok(vec![
        (libc::SYS_socket, socket),
        (libc::SYS_socketpair, socketpair),
    ])
}

/// `SHM_HUGETLB` of `shmget` (not in `libc`).
pub(super) const SHM_HUGETLB: libc::c_int = 0o4000;

/// Refusals of huge-page memory from the host's hugetlb pool: `mmap(MAP_HUGETLB)`,
/// `memfd_create(MFD_HUGETLB)`, `shmget(SHM_HUGETLB)`. The pool (`vm.nr_hugepages`) is
/// host-wide, reserved by the operator for its databases or packet processing, and
/// neither the memory cgroup nor a user namespace bounds it: anonymous huge pages need
/// no privilege, so one sandbox could take them all. Programs fall back to normal
/// pages when the pool says no. Transparent huge pages (`madvise`) are untouched: they
/// are ordinary, charged memory.
pub(super) fn hugetlb_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, SetupError> {
    let flag = |arg: u8, bit: libc::c_int| -> Result<Vec<SeccompRule>, SetupError> {
        Ok(vec![rule(cond(
            arg,
            SeccompCmpOp::MaskedEq(bit as u64),
            bit as u64,
        )?)?])
    };
    Ok(vec![
        (libc::SYS_mmap, flag(3, libc::MAP_HUGETLB)?),
        (
            libc::SYS_memfd_create,
            flag(1, libc::MFD_HUGETLB as libc::c_int)?,
        ),
        (libc::SYS_shmget, flag(2, SHM_HUGETLB)?),
    ])
}

/// The main filter's rules: syscall number → conditions (none: always refused).
pub(super) fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SetupError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for nr in denied_syscalls() {
        rules.insert(nr, Vec::new());
    }
    rules.extend(socket_rules()?);
    rules.extend(mode_rules()?);
    // clone(CLONE_NEW*): no new namespaces (a user namespace would hand back
    // capabilities over a fresh set of kernel attack surface).
    let ns_flags = [
        libc::CLONE_NEWNS,
        libc::CLONE_NEWCGROUP,
        libc::CLONE_NEWUTS,
        libc::CLONE_NEWIPC,
        libc::CLONE_NEWUSER,
        libc::CLONE_NEWPID,
        libc::CLONE_NEWNET,
    ];
    let mut clone_rules = Vec::new();
    for f in ns_flags {
        clone_rules.push(rule(cond(0, SeccompCmpOp::MaskedEq(f as u64), f as u64)?)?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    rules.extend(hugetlb_rules()?);
    // fcntl(F_SETLEASE): a lease on a file of a writable bind made any host process
    // opening that file (the user's editor, omabox's own readers) wait until the sandbox
    // let go, up to `fs.lease-break-time` (45 s) per open, had it ignored SIGIO.
    rules.insert(
        libc::SYS_fcntl,
        vec![rule(cond(1, SeccompCmpOp::Eq, libc::F_SETLEASE as u64)?)?],
    );
    // ioctl(TIOCSTI / TIOCLINUX): no typing into a terminal's input queue.
    // ioctl(TIOCSETD): no line discipline change on the sandbox's own ptys — with
    // `dev.tty.ldisc_autoload` (on by default) it loads the discipline's kernel module
    // (`n_hdlc`, `n_gsm`, … — old, rarely used code with a record of exploitable bugs).
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(cond(1, SeccompCmpOp::Eq, libc::TIOCSTI as libc::c_ulong)?)?,
            rule(cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX as libc::c_ulong)?)?,
            rule(cond(1, SeccompCmpOp::Eq, libc::TIOCSETD as libc::c_ulong)?)?,
        ],
    );
    Ok(rules)
}

/// Builds the main filter (seccompiler): default allow, listed calls EPERM.
pub fn build_filter() -> Result<BpfProgram, SetupError> {
    build_filter_from(rules()?)
}

/// [`build_filter`] over `rules` (a subset of [`rules`], see `bpf`).
pub(super) fn build_filter_from(
    rules: BTreeMap<i64, Vec<SeccompRule>>,
) -> Result<BpfProgram, SetupError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SetupError::Seccomp(e.to_string()))?;
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| SetupError::Seccomp(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| SetupError::Seccomp(e.to_string()))
}
