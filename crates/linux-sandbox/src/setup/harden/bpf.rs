//! The filter as installed: seccompiler's rules with a hand-assembled front (ENOSYS
//! answers, x32 refusal, a binary-search fast path for unlisted syscalls), and the BPF
//! interpreter tests that prove the fast path changes no verdict. Must never change a
//! verdict of the rules in `seccomp`.

use seccompiler::BpfProgram;

use super::SetupError;

use super::seccomp::{NEWEST_KNOWN_SYSCALL, build_filter_from, rules, unimplemented_syscalls};
#[cfg(test)]
use super::seccomp::{SOCK_PACKET, denied_syscalls};

const BPF_LD_W_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const BPF_JEQ_K: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const BPF_JGT_K: u16 = (libc::BPF_JMP | libc::BPF_JGT | libc::BPF_K) as u16;
const BPF_JGE_K: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const BPF_RET_K: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const BPF_JA: u16 = (libc::BPF_JMP | libc::BPF_JA) as u16;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

fn ins(code: u16, jt: u8, jf: u8, k: u32) -> seccompiler::sock_filter {
    seccompiler::sock_filter { code, jt, jf, k }
}

/// Hand-written checks for what seccompiler cannot say (its filter has one action for
/// every match): the [`unimplemented_syscalls`] and every syscall newer than
/// [`NEWEST_KNOWN_SYSCALL`] get ENOSYS, and on x86_64 every x32-ABI
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
    // Newer than this build knows: skip the comparisons and the JA to the ENOSYS return.
    p.push(ins(BPF_JGT_K, (n + 1) as u8, 0, NEWEST_KNOWN_SYSCALL));
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

/// A binary search over the syscall numbers of the rules, on the accumulator (which
/// holds the syscall number): ALLOW for a number not listed, EPERM for one of `denied`
/// (refused whatever its arguments), and a fall-through past its end for one of
/// `conditional` (seccompiler's chain, which then holds only those, decides). `None` if
/// a jump would not fit cBPF's 8-bit offsets (never for the ~60 numbers of this filter;
/// the filter then goes without).
///
/// seccompiler's verdict for an unlisted number is ALLOW and for an unconditional rule
/// EPERM, so this changes no verdict (`the_fast_path_changes_no_verdict`). It exists for
/// the kernel: at attach time it emulates the filter for every syscall number to find
/// the ones it can allow without running it, and a search (about 6 comparisons) instead
/// of a walk down a chain of every listed syscall makes installing the filter cheaper.
/// Measured here, `seccomp(SET_MODE_FILTER)` in a forked child, p50 of 200: a search in
/// front of the whole chain (683 instructions) ~205 µs; the search also answering the
/// unconditional refusals, in front of a chain of the conditional ones only (464) ~155
/// µs (an earlier linear-only filter: ~230 µs).
fn search_listed(conditional: &[u32], denied: &[u32]) -> Option<BpfProgram> {
    // Code for `keys` (number, refused outright) whose fall-through exits jump to one
    // past its end.
    fn emit(keys: &[(u32, bool)]) -> Option<BpfProgram> {
        if keys.len() <= 3 {
            let n = keys.len();
            let refuses = keys.iter().any(|(_, denied)| *denied);
            // [JEQ k0, JEQ k1, JEQ k2, RET ALLOW, (RET EPERM)]: a conditional match
            // jumps past the end, a refused one to the RET EPERM.
            let len = n + 1 + usize::from(refuses);
            let mut v: BpfProgram = keys
                .iter()
                .enumerate()
                .map(|(i, (k, denied))| {
                    let to = if *denied { len - 1 } else { len };
                    ins(BPF_JEQ_K, (to - i - 1) as u8, 0, *k)
                })
                .collect();
            v.push(ins(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW));
            if refuses {
                v.push(ins(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | libc::EPERM as u32));
            }
            return Some(v);
        }
        let mid = keys.len() / 2;
        let left = emit(&keys[..mid])?;
        let right = emit(&keys[mid..])?;
        let (llen, rlen) = (left.len(), right.len());
        // A >= keys[mid]: skip the left half.
        let mut v = vec![ins(BPF_JGE_K, u8::try_from(llen).ok()?, 0, keys[mid].0)];
        for (i, mut x) in left.into_iter().enumerate() {
            // The left half's fall-through exits (to its end) must now also skip the right.
            if x.code == BPF_JEQ_K && i + 1 + x.jt as usize == llen {
                x.jt = u8::try_from(x.jt as usize + rlen).ok()?;
            }
            v.push(x);
        }
        v.extend(right);
        Some(v)
    }
    let mut keys: Vec<(u32, bool)> = conditional
        .iter()
        .map(|k| (*k, false))
        .chain(denied.iter().map(|k| (*k, true)))
        .collect();
    keys.sort_unstable();
    keys.dedup_by_key(|(k, _)| *k);
    emit(&keys)
}

/// The whole filter: seccompiler's architecture check, then [`prelude`], then the
/// [`search_listed`] fast path, then seccompiler's rules (the conditional ones). One filter, not two stacked
/// ones, because the kernel evaluates (and caches) every attached filter per syscall
/// number at attach time.
pub fn build_program() -> Result<BpfProgram, SetupError> {
    assemble(true)
}

/// The most instructions one classic BPF program may have (the kernel's `BPF_MAXINSNS`).
const MAX_INSNS: usize = 4096;

/// `program` as sent from the host to a one-shot PID 1: its instruction count (4 bytes,
/// native endian), then each instruction's 8 bytes as the kernel lays them out.
pub fn encode_program(program: &BpfProgram) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + program.len() * 8);
    out.extend_from_slice(&(program.len() as u32).to_ne_bytes());
    for i in program {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.extend_from_slice(&[i.jt, i.jf]);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    out
}

/// Reads what [`encode_program`] wrote, through `read_exact` (refusing an empty program
/// or one longer than the kernel takes).
pub fn decode_program(
    mut read_exact: impl FnMut(&mut [u8]) -> std::io::Result<()>,
) -> Result<BpfProgram, SetupError> {
    let fail = |e: std::io::Error| SetupError::Seccomp(format!("receiving the filter: {e}"));
    let mut len = [0u8; 4];
    read_exact(&mut len).map_err(fail)?;
    let len = u32::from_ne_bytes(len) as usize;
    if len == 0 || len > MAX_INSNS {
        return Err(SetupError::Seccomp(format!(
            "a filter of {len} instructions"
        )));
    }
    let mut bytes = vec![0u8; len * 8];
    read_exact(&mut bytes).map_err(fail)?;
    Ok(bytes
        .chunks_exact(8)
        .map(|c| {
            ins(
                u16::from_ne_bytes([c[0], c[1]]),
                c[2],
                c[3],
                u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            )
        })
        .collect())
}

fn assemble(fast_path: bool) -> Result<BpfProgram, SetupError> {
    let all = rules()?;
    let numbers = |conditional: bool| -> Vec<u32> {
        all.iter()
            .filter(|(_, r)| r.is_empty() != conditional)
            .map(|(nr, _)| *nr as u32)
            .collect()
    };
    // With the fast path, the search answers the unconditional refusals itself: only the
    // syscalls whose verdict depends on their arguments stay in seccompiler's chain.
    let search = fast_path
        .then(|| search_listed(&numbers(true), &numbers(false)))
        .flatten();
    let chain = if search.is_some() {
        all.into_iter().filter(|(_, r)| !r.is_empty()).collect()
    } else {
        all
    };
    let mut main = build_filter_from(chain)?;
    // Splice in front of seccompiler's "load syscall number" (the first absolute load of
    // offset 0; the architecture check before it loads offset 4 and only jumps within
    // itself, so no jump crosses the splice point).
    let at = main
        .iter()
        .position(|i| i.code == BPF_LD_W_ABS && i.k == 0)
        .ok_or_else(|| SetupError::Seccomp("unexpected filter layout".into()))?;
    let mut front = prelude();
    front.extend(search.unwrap_or_default());
    main.splice(at..at, front);
    if main.len() > u16::MAX as usize {
        return Err(SetupError::Seccomp("filter too long".into()));
    }
    Ok(main)
}

/// Installs the filter on the calling (only) thread; inherited by every child.
pub(in crate::setup) fn seccomp(program: &BpfProgram) -> Result<(), SetupError> {
    seccompiler::apply_filter(program).map_err(|e| SetupError::Seccomp(e.to_string()))
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
        // The search is in place: it answers the unconditional refusals, which leave
        // seccompiler's chain, so the whole program is shorter.
        assert!(
            fast.len() < linear.len(),
            "{} vs {}",
            fast.len(),
            linear.len()
        );
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
        .map(|r| [0, r as libc::c_ulong, 0, 0, 0, 0]);
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
        // Every number past the newest syscall this build knows.
        expected.extend(NEWEST_KNOWN_SYSCALL + 1..1200);
        expected.sort_unstable();
        assert_eq!(enosys, expected);
        assert_ne!(
            run(&p, NEWEST_KNOWN_SYSCALL, NATIVE, [0; 6]),
            SECCOMP_RET_ERRNO | libc::ENOSYS as u32
        );
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
        assert_eq!(ioctl(libc::TIOCSTI as libc::c_ulong), EPERM);
        assert_eq!(ioctl(libc::FIONREAD as libc::c_ulong), SECCOMP_RET_ALLOW);
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

    #[test]
    fn a_program_crosses_the_wire_unchanged_and_bad_lengths_are_refused() {
        let program = build_program().unwrap();
        let bytes = encode_program(&program);
        let mut at = 0;
        let read = |from: &[u8], at: &mut usize, buf: &mut [u8]| {
            let end = *at + buf.len();
            if end > from.len() {
                return Err(std::io::Error::other("short"));
            }
            buf.copy_from_slice(&from[*at..end]);
            *at = end;
            Ok(())
        };
        let got = decode_program(|buf| read(&bytes, &mut at, buf)).unwrap();
        assert_eq!(encode_program(&got), bytes);
        for len in [0u32, 4097] {
            let bad = len.to_ne_bytes();
            let mut at = 0;
            assert!(
                decode_program(|buf| read(&bad, &mut at, buf)).is_err(),
                "{len}"
            );
        }
        let mut at = 0;
        let short = &bytes[..bytes.len() - 1];
        assert!(decode_program(|buf| read(short, &mut at, buf)).is_err());
    }
}
