//! Hardening of the setup stage before it becomes the agent: rlimits, capabilities,
//! securebits, no_new_privs, dumpable, Landlock, seccomp. Applied in that order, seccomp
//! last, so each step still has the rights the next one needs.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RestrictionStatus,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use super::SetupError;
use crate::plan::{RootfsSource, SandboxPlan};
use crate::sys;

fn err(step: &str) -> impl FnOnce(io::Error) -> SetupError + '_ {
    move |source| SetupError::Step {
        step: step.to_owned(),
        source,
    }
}

/// POSIX message queue bytes the sandbox's user may hold (the kernel's default), so a
/// host whose own limit is higher does not hand that on.
const MSGQUEUE_BYTES: u64 = 800 << 10;
/// Queued signals (real-time ones included) the sandbox's user may have pending. The
/// count is per user: without a user namespace of its own, a sandbox would otherwise
/// fill the counter its host uid shares with host processes.
const SIGPENDING: u64 = 1024;

/// Lowers `RLIMIT_NOFILE` (fd exhaustion stays inside the sandbox), `RLIMIT_MSGQUEUE`,
/// `RLIMIT_SIGPENDING` and `RLIMIT_RTPRIO` (no real-time scheduling: a spinning
/// SCHED_FIFO task would starve host tasks on its CPU whatever the CPU quota), and
/// disables core dumps.
pub(super) fn rlimits(plan: &SandboxPlan) -> Result<(), SetupError> {
    for (resource, value, step) in [
        (
            libc::RLIMIT_NOFILE,
            plan.limits.nofile,
            "lower RLIMIT_NOFILE",
        ),
        (
            libc::RLIMIT_MSGQUEUE,
            MSGQUEUE_BYTES,
            "lower RLIMIT_MSGQUEUE",
        ),
        (
            libc::RLIMIT_SIGPENDING,
            SIGPENDING,
            "lower RLIMIT_SIGPENDING",
        ),
        (libc::RLIMIT_RTPRIO, 0, "lower RLIMIT_RTPRIO"),
        (libc::RLIMIT_CORE, 0, "lower RLIMIT_CORE"),
    ] {
        sys::lower_rlimit(resource, value).map_err(err(step))?;
    }
    Ok(())
}

/// SysV IPC and POSIX mqueue limits of the sandbox's own IPC namespace (the defaults
/// allow 32,000 queues and semaphore sets and 4,096 shared memory segments). Their
/// memory is charged to the sandbox's memory cgroup anyway; these keep the object
/// counts small too. Written through `/proc/sys`, which addresses the IPC namespace of
/// the writer: the setup stage's own, created by the clone.
pub(super) fn ipc_limits() -> Result<(), SetupError> {
    for (file, value) in [
        ("/proc/sys/kernel/shmmni", "256"),
        ("/proc/sys/kernel/msgmni", "256"),
        // semmsl semmns semopm semmni
        ("/proc/sys/kernel/sem", "250 8192 32 128"),
        ("/proc/sys/fs/mqueue/queues_max", "64"),
    ] {
        std::fs::write(file, value).map_err(err(file))?;
    }
    Ok(())
}

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

/// Drops every capability from every set. The agent needs none: it only starts
/// processes (same uid), signals its own process groups and touches files in writable
/// binds. uid 0 keeps no power after this: securebits stop `execve` from granting root
/// its capabilities back, the bounding set is empty, and ambient raising is locked off.
pub(super) fn drop_capabilities() -> Result<u32, SetupError> {
    sys::prctl(
        libc::PR_SET_SECUREBITS,
        SECBIT_NOROOT
            | SECBIT_NOROOT_LOCKED
            | SECBIT_NO_SETUID_FIXUP
            | SECBIT_NO_SETUID_FIXUP_LOCKED
            | SECBIT_KEEP_CAPS_LOCKED
            | SECBIT_NO_CAP_AMBIENT_RAISE
            | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
    )
    .map_err(err("set securebits"))?;
    sys::prctl(
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
    )
    .map_err(err("clear ambient capabilities"))?;
    let last = last_cap();
    for cap in 0..=last {
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
    let data = [CapData {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
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
pub(super) fn no_new_privs() -> Result<(), SetupError> {
    sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map_err(err("set no_new_privs"))?;
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(err("clear dumpable"))
}

/// Kernel's Landlock ABI version, 0 when absent or disabled.
pub fn landlock_abi() -> io::Result<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a null attribute with size 0 and the VERSION flag only queries the ABI.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(0),
            _ => Err(e),
        };
    }
    Ok(r as u32)
}

/// Restricts filesystem access to reading the sandbox tree plus writing its writable
/// places, and scopes signals and abstract unix sockets to the sandbox. Returns whether
/// a ruleset is enforced.
pub(super) fn landlock(plan: &SandboxPlan) -> Result<bool, SetupError> {
    let lerr = |e: landlock::RulesetError| SetupError::Landlock(e.to_string());
    // The newest ABI this code was written and tested against; newer kernels enforce it.
    let abi = ABI::V6;
    let level = if plan.hardening.require_landlock {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let tree_rw = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let file_rw =
        AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;

    let mut writable: Vec<&Path> = vec![Path::new("/tmp"), Path::new("/dev/shm")];
    if matches!(plan.rootfs, RootfsSource::Directory { .. }) {
        writable.push(Path::new("/"));
    }
    if plan.workspace.is_some() {
        writable.push(Path::new("/workspace"));
    }
    if plan.outputs.is_some() {
        writable.push(Path::new("/mnt/session/outputs"));
    }
    writable.extend(
        plan.binds
            .iter()
            .filter(|b| b.writable)
            .map(|b| b.target.as_path()),
    );
    let files: [&Path; 7] = [
        Path::new("/dev/null"),
        Path::new("/dev/zero"),
        Path::new("/dev/full"),
        Path::new("/dev/tty"),
        Path::new("/dev/random"),
        Path::new("/dev/urandom"),
        Path::new("/dev/pts"),
    ];

    let mut created = Ruleset::default()
        .set_compatibility(level)
        .handle_access(all)
        .map_err(lerr)?
        .scope(Scope::from_all(abi))
        .map_err(lerr)?
        .create()
        .map_err(lerr)?;
    created = created
        .add_rule(PathBeneath::new(open(Path::new("/"))?, read))
        .map_err(lerr)?;
    for p in writable {
        created = created
            .add_rule(PathBeneath::new(open(p)?, tree_rw))
            .map_err(lerr)?;
    }
    for p in files.iter().chain([&Path::new("/proc")]) {
        if p.exists() {
            created = created
                .add_rule(PathBeneath::new(open(p)?, file_rw))
                .map_err(lerr)?;
        }
    }
    let status: RestrictionStatus = created.restrict_self().map_err(lerr)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

fn open(p: &Path) -> Result<PathFd, SetupError> {
    PathFd::new(p).map_err(|e| SetupError::Landlock(format!("open {}: {e}", p.display())))
}

/// Syscalls answered ENOSYS, as if the kernel lacked them (programs fall back):
/// `clone3` (its flags live in memory a filter cannot inspect; libc falls back to
/// `clone`, whose flags the filter checks); `io_setup`, whose contexts come out of the
/// host-wide `fs.aio-max-nr` pool (a sandbox could take every slot and make host
/// processes fail); `io_uring_*` (its requests bypass this filter by design);
/// `memfd_secret` (unswappable memory removed from the kernel's direct map);
/// `openat2` (its mode cannot be inspected, see [`mode_rules`]).
fn unimplemented_syscalls() -> Vec<i64> {
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
/// userfaultfd, fanotify, clock setting, kernel log, accounting and quotas. Mostly also
/// stopped by the missing capabilities; the filter holds even if a capability ever
/// leaked.
fn denied_syscalls() -> Vec<i64> {
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
        libc::SYS_uselib,
        libc::SYS__sysctl,
        libc::SYS_nfsservctl,
        libc::SYS_lookup_dcookie,
    ]);
    v
}

fn cond(arg: u8, op: SeccompCmpOp, value: u64) -> Result<SeccompCondition, SetupError> {
    SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
        .map_err(|e| SetupError::Seccomp(e.to_string()))
}

fn rule(c: SeccompCondition) -> Result<SeccompRule, SetupError> {
    all_of(vec![c])
}

/// A rule that matches when every condition holds.
fn all_of(conditions: Vec<SeccompCondition>) -> Result<SeccompRule, SetupError> {
    SeccompRule::new(conditions).map_err(|e| SetupError::Seccomp(e.to_string()))
}

/// Address families `socket` may create: what an ordinary program needs. Everything
/// else (`AF_VSOCK`, `AF_PACKET`, `AF_BLUETOOTH`, `AF_ALG`, `AF_KEY`, …) is refused:
/// families are not all namespaced (vsock reaches the hypervisor), and each one is
/// kernel attack surface.
const SOCKET_FAMILIES: [libc::c_int; 4] = [
    libc::AF_UNIX,
    libc::AF_INET,
    libc::AF_INET6,
    libc::AF_NETLINK,
];
/// IP protocols an inet socket may use: the default for its type, TCP, UDP, ICMP(v6)
/// (ping sockets). SCTP, DCCP, MPTCP, … are refused (rarely needed, and loading their
/// modules on demand is a classic way into buggy kernel code).
const IP_PROTOCOLS: [libc::c_int; 5] = [
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
fn mode_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, SetupError> {
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
const SOCK_PACKET: libc::c_int = 10;
/// `SOCK_DCCP` (not in `libc`).
const SOCK_DCCP: libc::c_int = 6;

/// `socket` and `socketpair` refusals: an allow list of families and, within them, of
/// types and protocols. The only netlink protocol is `NETLINK_ROUTE` (interfaces and
/// addresses; `NETLINK_KOBJECT_UEVENT` would deliver host device events, `NETLINK_AUDIT`
/// reaches the host's audit log, …); raw sockets only for netlink (inet raw sockets
/// forge packets); `SOCK_PACKET` (which the kernel turns into `AF_PACKET`), `SOCK_RDM`
/// and `SOCK_DCCP` never. `socketpair` only for `AF_UNIX`, the only family that has it.
fn socket_rules() -> Result<Vec<(i64, Vec<SeccompRule>)>, SetupError> {
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

/// The main filter's rules: syscall number → conditions (none: always refused).
fn rules() -> Result<BTreeMap<i64, Vec<SeccompRule>>, SetupError> {
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
    // ioctl(TIOCSTI / TIOCLINUX): no typing into a terminal's input queue.
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(cond(1, SeccompCmpOp::Eq, libc::TIOCSTI)?)?,
            rule(cond(1, SeccompCmpOp::Eq, libc::TIOCLINUX)?)?,
        ],
    );
    Ok(rules)
}

/// Builds the main filter (seccompiler): default allow, listed calls EPERM.
pub fn build_filter() -> Result<BpfProgram, SetupError> {
    let arch = TargetArch::try_from(std::env::consts::ARCH)
        .map_err(|e| SetupError::Seccomp(e.to_string()))?;
    let filter = SeccompFilter::new(
        rules()?,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch,
    )
    .map_err(|e| SetupError::Seccomp(e.to_string()))?;
    BpfProgram::try_from(filter).map_err(|e| SetupError::Seccomp(e.to_string()))
}

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const BPF_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// Hand-written checks for what seccompiler cannot say (its filter has one action for
/// every match): the [`unimplemented_syscalls`] get ENOSYS, and on x86_64 every x32-ABI
/// syscall number is refused so no listed call can be reached under its x32 alias.
/// Falls through when neither applies.
fn prelude() -> BpfProgram {
    // seccomp_data: nr at offset 0.
    let mut p = vec![ins(BPF_LD_W_ABS, 0, 0, 0)];
    if cfg!(target_arch = "x86_64") {
        p.push(ins(BPF_JGE_K, 0, 1, 0x4000_0000));
        p.push(ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32));
    }
    let enosys = unimplemented_syscalls();
    let n = enosys.len();
    for (i, nr) in enosys.into_iter().enumerate() {
        // Matched: jump past the remaining comparisons to the ENOSYS return.
        p.push(ins(BPF_JEQ_K, (n - 1 - i + 1) as u8, 0, nr as u32));
    }
    // None matched: skip the ENOSYS return.
    p.push(ins(BPF_JA, 0, 0, 1));
    p.push(ins(
        BPF_RET_K,
        0,
        0,
        SECCOMP_RET_ERRNO | libc::ENOSYS as u32,
    ));
    p
}

/// A binary search over the sorted syscall numbers `listed`, on the accumulator (which
/// holds the syscall number): returns ALLOW for any number not listed, and falls
/// through past its end for a listed one. `None` if a jump would not fit cBPF's 8-bit
/// offsets (never for the ~60 numbers of this filter; the filter then goes without).
///
/// seccompiler's rules are a linear chain, one comparison per listed syscall, and its
/// verdict for an unlisted number is ALLOW, so this changes no verdict. It exists for the
/// kernel: at attach time it emulates the filter for every syscall number to find the
/// ones it can allow without running the filter, and a search (about 6 comparisons)
/// instead of a walk down the whole chain halves the cost of installing the filter
/// (measured ~230 → ~120 µs).
fn allow_unlisted(listed: &[u32]) -> Option<BpfProgram> {
    // Code for `keys` whose "listed" exits jump to one past its end.
    fn emit(keys: &[u32]) -> Option<BpfProgram> {
        if keys.len() <= 3 {
            let n = keys.len();
            let mut v: BpfProgram = keys
                .iter()
                .enumerate()
                // From the i-th comparison, past the remaining ones and the return.
                .map(|(i, k)| ins(BPF_JEQ_K, (n - i) as u8, 0, *k))
                .collect();
            v.push(ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW));
            return Some(v);
        }
        let mid = keys.len() / 2;
        let left = emit(&keys[..mid])?;
        let right = emit(&keys[mid..])?;
        let (llen, rlen) = (left.len(), right.len());
        // A >= keys[mid]: skip the left half.
        let mut v = vec![ins(BPF_JGE_K, u8::try_from(llen).ok()?, 0, keys[mid])];
        for (i, mut x) in left.into_iter().enumerate() {
            // The left half's "listed" exits (to its end) must now also skip the right.
            if x.code == BPF_JEQ_K && i + 1 + x.jt as usize == llen {
                x.jt = u8::try_from(x.jt as usize + rlen).ok()?;
            }
            v.push(x);
        }
        v.extend(right);
        Some(v)
    }
    emit(listed)
}

/// The whole filter: seccompiler's architecture check, then [`prelude`], then the
/// [`allow_unlisted`] fast path, then seccompiler's rules. One filter, not two stacked
/// ones, because the kernel evaluates (and caches) every attached filter per syscall
/// number at attach time.
pub fn build_program() -> Result<BpfProgram, SetupError> {
    assemble(true)
}

fn assemble(fast_path: bool) -> Result<BpfProgram, SetupError> {
    let mut main = build_filter()?;
    // Splice in front of seccompiler's "load syscall number" (the first absolute load of
    // offset 0; the architecture check before it loads offset 4 and only jumps within
    // itself, so no jump crosses the splice point).
    let at = main
        .iter()
        .position(|i| i.code == BPF_LD_W_ABS && i.k == 0)
        .ok_or_else(|| SetupError::Seccomp("unexpected filter layout".into()))?;
    let mut front = prelude();
    if fast_path {
        let mut listed: Vec<u32> = rules()?.keys().map(|nr| *nr as u32).collect();
        listed.sort_unstable();
        listed.dedup();
        if let Some(search) = allow_unlisted(&listed) {
            front.extend(search);
        }
    }
    main.splice(at..at, front);
    if main.len() > u16::MAX as usize {
        return Err(SetupError::Seccomp("filter too long".into()));
    }
    Ok(main)
}

/// Installs the filter on the calling (only) thread; inherited by every child.
pub(super) fn seccomp() -> Result<(), SetupError> {
    let program = build_program()?;
    seccompiler::apply_filter(&program).map_err(|e| SetupError::Seccomp(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filter_builds_and_the_prelude_follows_the_arch_check() {
        let p = build_program().unwrap();
        let at = p
            .iter()
            .position(|i| i.code == BPF_LD_W_ABS && i.k == 0)
            .unwrap();
        assert_eq!(p[at..at + prelude().len()], prelude()[..]);
        // The arch check loads offset 4 first.
        assert_eq!((p[0].code, p[0].k), (BPF_LD_W_ABS, 4));
    }

    /// A classic-BPF interpreter for what these filters use, over a `seccomp_data`.
    fn run(p: &[seccompiler::sock_filter], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = [0u32; 16];
        data[0] = nr;
        data[1] = arch;
        for (i, a) in args.iter().enumerate() {
            data[4 + 2 * i] = *a as u32;
            data[5 + 2 * i] = (*a >> 32) as u32;
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = &p[pc];
            match (i.code & 0x07) as u32 {
                libc::BPF_LD => {
                    assert_eq!(i.code, BPF_LD_W_ABS);
                    acc = data[(i.k / 4) as usize];
                    pc += 1;
                }
                libc::BPF_ALU => {
                    assert_eq!(i.code as u32, libc::BPF_ALU | libc::BPF_AND | libc::BPF_K);
                    acc &= i.k;
                    pc += 1;
                }
                libc::BPF_RET => return i.k,
                libc::BPF_JMP => {
                    let op = (i.code & 0xf0) as u32;
                    if op == libc::BPF_JA {
                        pc += 1 + i.k as usize;
                        continue;
                    }
                    let taken = match op {
                        libc::BPF_JEQ => acc == i.k,
                        libc::BPF_JGE => acc >= i.k,
                        libc::BPF_JGT => acc > i.k,
                        libc::BPF_JSET => acc & i.k != 0,
                        _ => panic!("unexpected jump op {op:#x}"),
                    };
                    pc += 1 + if taken { i.jt } else { i.jf } as usize;
                }
                class => panic!("unexpected class {class}"),
            }
        }
    }

    const EPERM: u32 = SECCOMP_RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn the_fast_path_changes_no_verdict() {
        let linear = assemble(false).unwrap();
        let fast = build_program().unwrap();
        assert!(fast.len() > linear.len(), "the fast path is in place");
        let arches = [0xc000_003e_u32, 0x4000_0003, 0xc000_00b7, 0];
        let socket = [
            [libc::AF_PACKET as u64, libc::SOCK_RAW as u64, 0, 0, 0, 0],
            [
                libc::AF_INET as u64,
                (libc::SOCK_RAW | libc::SOCK_CLOEXEC) as u64,
                0,
                0,
                0,
                0,
            ],
            [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            [libc::AF_UNIX as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0],
            [libc::AF_VSOCK as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            [
                libc::AF_NETLINK as u64,
                libc::SOCK_RAW as u64,
                libc::NETLINK_KOBJECT_UEVENT as u64,
                0,
                0,
                0,
            ],
            [libc::AF_NETLINK as u64, libc::SOCK_RAW as u64, 0, 0, 0, 0],
        ];
        let clone = [
            libc::CLONE_NEWNS,
            libc::CLONE_NEWUSER,
            libc::CLONE_NEWNET,
            libc::CLONE_NEWPID,
            libc::CLONE_VM | libc::CLONE_VFORK,
            libc::SIGCHLD,
        ]
        .map(|f| [f as u64, 0, 0, 0, 0, 0]);
        let ioctl = [
            libc::TIOCSTI,
            libc::TIOCLINUX,
            libc::TIOCGWINSZ,
            libc::FIONREAD,
        ]
        .map(|r| [0, r, 0, 0, 0, 0]);
        let mut args: Vec<[u64; 6]> = vec![[0; 6], [u64::MAX; 6]];
        args.extend(socket);
        args.extend(clone);
        args.extend(ioctl);
        for arch in arches {
            for nr in (0..1200u32)
                .chain(0x4000_0000..0x4000_0400)
                .chain([u32::MAX])
            {
                for a in &args {
                    assert_eq!(
                        run(&linear, nr, arch, *a),
                        run(&fast, nr, arch, *a),
                        "nr {nr} arch {arch:#x} args {a:?}"
                    );
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_denied_set_is_unchanged() {
        const NATIVE: u32 = 0xc000_003e;
        let p = build_program().unwrap();
        let denied: Vec<u32> = (0..1200u32)
            .filter(|nr| run(&p, *nr, NATIVE, [0; 6]) == EPERM)
            .collect();
        let mut expected: Vec<u32> = denied_syscalls().iter().map(|n| *n as u32).collect();
        // socket(AF_UNSPEC) and socketpair(AF_UNSPEC): not an allowed family.
        expected.extend([libc::SYS_socket as u32, libc::SYS_socketpair as u32]);
        expected.sort_unstable();
        assert_eq!(denied, expected);
        let enosys: Vec<u32> = (0..1200u32)
            .filter(|nr| run(&p, *nr, NATIVE, [0; 6]) == SECCOMP_RET_ERRNO | libc::ENOSYS as u32)
            .collect();
        let mut expected: Vec<u32> = unimplemented_syscalls().iter().map(|n| *n as u32).collect();
        expected.sort_unstable();
        assert_eq!(enosys, expected);
        // Argument-dependent refusals.
        let sock3 = |a: i32, b: i32, c: i32| {
            run(
                &p,
                libc::SYS_socket as u32,
                NATIVE,
                [a as u64, b as u64, c as u64, 0, 0, 0],
            )
        };
        let sock = |a: u64, b: u64| sock3(a as i32, b as i32, 0);
        assert_eq!(sock(libc::AF_PACKET as u64, libc::SOCK_DGRAM as u64), EPERM);
        assert_eq!(sock(libc::AF_INET as u64, libc::SOCK_RAW as u64), EPERM);
        assert_eq!(
            sock(libc::AF_INET as u64, libc::SOCK_STREAM as u64),
            SECCOMP_RET_ALLOW
        );
        let (stream, dgram, raw) = (libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW);
        let cloexec = libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
        for (family, ty, proto) in [
            (libc::AF_UNIX, stream | cloexec, 0),
            (libc::AF_UNIX, libc::SOCK_SEQPACKET, 0),
            (libc::AF_INET, dgram | cloexec, libc::IPPROTO_UDP),
            (libc::AF_INET6, stream, libc::IPPROTO_TCP),
            (libc::AF_INET, dgram, libc::IPPROTO_ICMP),
            (libc::AF_NETLINK, raw | cloexec, libc::NETLINK_ROUTE),
            (libc::AF_NETLINK, dgram, libc::NETLINK_ROUTE),
        ] {
            assert_eq!(
                sock3(family, ty, proto),
                SECCOMP_RET_ALLOW,
                "{family} {ty} {proto}"
            );
        }
        for (family, ty, proto) in [
            (libc::AF_VSOCK, stream, 0),
            (libc::AF_BLUETOOTH, raw, 0),
            (libc::AF_ALG, libc::SOCK_SEQPACKET, 0),
            (libc::AF_KEY, raw, 2),
            (libc::AF_NETLINK, dgram, libc::NETLINK_KOBJECT_UEVENT),
            (libc::AF_NETLINK, raw, libc::NETLINK_AUDIT),
            (libc::AF_INET, SOCK_PACKET, 0),
            (libc::AF_INET6, raw | cloexec, 0),
            (libc::AF_INET, stream, libc::IPPROTO_SCTP),
            (libc::AF_INET, 6, 33),
            (libc::AF_UNSPEC, stream, 0),
            (1000, stream, 0),
        ] {
            assert_eq!(sock3(family, ty, proto), EPERM, "{family} {ty} {proto}");
        }
        let pair = |f: i32| {
            run(
                &p,
                libc::SYS_socketpair as u32,
                NATIVE,
                [f as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0],
            )
        };
        assert_eq!(pair(libc::AF_UNIX), SECCOMP_RET_ALLOW);
        assert_eq!(pair(libc::AF_INET), EPERM);
        let clone = |f: libc::c_int| {
            run(
                &p,
                libc::SYS_clone as u32,
                NATIVE,
                [f as u64, 0, 0, 0, 0, 0],
            )
        };
        assert_eq!(clone(libc::CLONE_NEWUSER), EPERM);
        assert_eq!(clone(libc::SIGCHLD), SECCOMP_RET_ALLOW);
        assert_eq!(
            run(&p, libc::SYS_clone3 as u32, NATIVE, [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
        let ioctl = |r: u64| run(&p, libc::SYS_ioctl as u32, NATIVE, [0, r, 0, 0, 0, 0]);
        assert_eq!(ioctl(libc::TIOCSTI), EPERM);
        assert_eq!(ioctl(libc::FIONREAD), SECCOMP_RET_ALLOW);
        // x32 aliases and foreign architectures.
        assert_eq!(
            run(&p, 0x4000_0000 | libc::SYS_mount as u32, NATIVE, [0; 6]),
            EPERM
        );
        assert_ne!(
            run(&p, libc::SYS_read as u32, 0x4000_0003, [0; 6]),
            SECCOMP_RET_ALLOW
        );
    }
}
