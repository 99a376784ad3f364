//! Every port of the synthetic addresses to one listener: a `BPF_PROG_TYPE_SK_LOOKUP`
//! program attached to the sandbox's network namespace hands each TCP connection to
//! `127.64.0.0/10` (the addresses the DNS stub answers names with) to the relay's catch-all
//! listener, whatever port was dialed. The accepted socket keeps the dialed address and port
//! as its local address, so the relay sees the original destination as usual. Without it a
//! per-port backend reaches only the ports it listens on.
//!
//! The program is eleven lines of logic, written out as instructions below (there is no
//! BPF compiler in the build): check IPv4 TCP, check the destination against
//! `127.64.0.0/10`, take the socket from a one-entry `SOCKMAP`, `bpf_sk_assign` it, release
//! it, pass. The kernel's verifier checks it at load. The link (attached to the namespace)
//! and the map live as long as the [`Redirect`] value; dropping it detaches the program.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

const BPF_MAP_CREATE: libc::c_int = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_int = 2;
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_LINK_CREATE: libc::c_int = 28;
const BPF_MAP_TYPE_SOCKMAP: u32 = 15;
const BPF_PROG_TYPE_SK_LOOKUP: u32 = 30;
const BPF_SK_LOOKUP: u32 = 36;
const BPF_FUNC_MAP_LOOKUP_ELEM: i32 = 1;
const BPF_FUNC_SK_RELEASE: i32 = 86;
const BPF_FUNC_SK_ASSIGN: i32 = 124;
const BPF_PSEUDO_MAP_FD: u8 = 1;
/// `struct bpf_sk_lookup` field offsets (uapi).
const CTX_FAMILY: i16 = 8;
const CTX_PROTOCOL: i16 = 12;
const CTX_LOCAL_IP4: i16 = 40;

/// One BPF instruction (`struct bpf_insn`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// `127.64.0.0/10` as a little-endian load of the network-order address sees it: the first
/// byte and the top two bits of the second.
#[cfg(target_endian = "little")]
const SYNTHETIC_MASK: i32 = 0xc0ff;
#[cfg(target_endian = "little")]
const SYNTHETIC_NET: i32 = 0x407f;

/// The program; `map_fd` is the SOCKMAP holding the listener at key 0.
fn program(map_fd: RawFd) -> Vec<Insn> {
    const OUT: i16 = 22;
    let jump_out = |at: i16| OUT - (at + 1);
    vec![
        insn(0xbf, 6, 1, 0, 0),                           // 0: r6 = ctx
        insn(0x61, 2, 6, CTX_PROTOCOL, 0),                // 1: r2 = protocol
        insn(0x55, 2, 0, jump_out(2), libc::IPPROTO_TCP), // 2: not TCP -> out
        insn(0x61, 2, 6, CTX_FAMILY, 0),                  // 3: r2 = family
        insn(0x55, 2, 0, jump_out(4), libc::AF_INET),     // 4: not IPv4 -> out
        insn(0x61, 2, 6, CTX_LOCAL_IP4, 0),               // 5: r2 = dst address
        insn(0x54, 2, 0, 0, SYNTHETIC_MASK),              // 6: w2 &= mask
        insn(0x55, 2, 0, jump_out(7), SYNTHETIC_NET),     // 7: not synthetic -> out
        insn(0x62, 10, 0, -4, 0),                         // 8: key = 0 on the stack
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),      // 9: r1 = map
        insn(0x00, 0, 0, 0, 0),                           // 10: (second half)
        insn(0xbf, 2, 10, 0, 0),                          // 11: r2 = fp
        insn(0x07, 2, 0, 0, -4),                          // 12: r2 = &key
        insn(0x85, 0, 0, 0, BPF_FUNC_MAP_LOOKUP_ELEM),    // 13: r0 = listener
        insn(0x15, 0, 0, jump_out(14), 0),                // 14: none -> out
        insn(0xbf, 7, 0, 0, 0),                           // 15: r7 = listener
        insn(0xbf, 1, 6, 0, 0),                           // 16: r1 = ctx
        insn(0xbf, 2, 7, 0, 0),                           // 17: r2 = listener
        insn(0xb7, 3, 0, 0, 0),                           // 18: r3 = 0 (flags)
        insn(0x85, 0, 0, 0, BPF_FUNC_SK_ASSIGN),          // 19: assign
        insn(0xbf, 1, 7, 0, 0),                           // 20: r1 = listener
        insn(0x85, 0, 0, 0, BPF_FUNC_SK_RELEASE),         // 21: release
        insn(0xb7, 0, 0, 0, 1),                           // 22 (OUT): r0 = SK_PASS
        insn(0x95, 0, 0, 0, 0),                           // 23: exit
    ]
}

fn bpf<T>(cmd: libc::c_int, attr: &mut T) -> io::Result<RawFd> {
    // SAFETY: `attr` is a live, properly laid out prefix of `union bpf_attr` for `cmd`,
    // and its size is passed; the kernel zero-extends the rest.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>() as libc::c_uint,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as RawFd)
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: the kernel just returned this fd to us and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
}

#[repr(C)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
struct LinkCreate {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
}

/// An attached redirect; dropping it detaches the program.
#[derive(Debug)]
pub struct Redirect {
    _link: OwnedFd,
    _map: OwnedFd,
}

impl Redirect {
    /// Loads the program for `listener` (a listening TCP socket) and attaches it to the
    /// network namespace `netns` refers to.
    pub fn attach(netns: &OwnedFd, listener: &impl AsRawFd) -> io::Result<Self> {
        let map = owned(bpf(
            BPF_MAP_CREATE,
            &mut MapCreate {
                map_type: BPF_MAP_TYPE_SOCKMAP,
                key_size: 4,
                value_size: 8,
                max_entries: 1,
            },
        )?);
        let key: u32 = 0;
        let value: u64 = listener.as_raw_fd() as u64;
        bpf(
            BPF_MAP_UPDATE_ELEM,
            &mut MapUpdate {
                map_fd: map.as_raw_fd() as u32,
                _pad: 0,
                key: &key as *const u32 as u64,
                value: &value as *const u64 as u64,
                flags: 0,
            },
        )?;
        let insns = program(map.as_raw_fd());
        let license = b"Dual MIT/GPL\0";
        let mut log = vec![0u8; 4096];
        let mut name = [0u8; 16];
        name[..13].copy_from_slice(b"omabox_lookup");
        let loaded = bpf(
            BPF_PROG_LOAD,
            &mut ProgLoad {
                prog_type: BPF_PROG_TYPE_SK_LOOKUP,
                insn_cnt: insns.len() as u32,
                insns: insns.as_ptr() as u64,
                license: license.as_ptr() as u64,
                log_level: 1,
                log_size: log.len() as u32,
                log_buf: log.as_mut_ptr() as u64,
                kern_version: 0,
                prog_flags: 0,
                prog_name: name,
                prog_ifindex: 0,
                expected_attach_type: BPF_SK_LOOKUP,
            },
        );
        let prog = match loaded {
            Ok(fd) => owned(fd),
            Err(e) => {
                let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
                let why = String::from_utf8_lossy(&log[..end]);
                return Err(io::Error::new(
                    e.kind(),
                    format!("loading the sk_lookup program: {e}: {}", why.trim()),
                ));
            }
        };
        let link = owned(bpf(
            BPF_LINK_CREATE,
            &mut LinkCreate {
                prog_fd: prog.as_raw_fd() as u32,
                target_fd: netns.as_raw_fd() as u32,
                attach_type: BPF_SK_LOOKUP,
                flags: 0,
            },
        )?);
        Ok(Self {
            _link: link,
            _map: map,
        })
    }
}
