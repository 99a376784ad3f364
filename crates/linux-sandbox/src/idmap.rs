//! Each sandbox's own host id range, and the idmapped mounts that let it write its
//! writable binds.
//!
//! As root, every sandbox runs in a user namespace of its own whose ids `0..65536` map
//! to a host range `base..base + 65536` that no host account and no other sandbox uses:
//! its uid 0 is an unprivileged host uid, so files it leaves behind, per-user kernel
//! counters (inotify, pending signals, mqueue bytes) and `/proc` permission checks are
//! those of a nobody. Ranges are slots above [`FIRST_BASE`], claimed by creating
//! [`SLOTS_DIR`]`/<slot>` (holding the sandbox's state dir) under a lock, host-wide so
//! no two runtime dirs hand out the same range; the slot is freed when the sandbox is
//! destroyed, and a slot whose state dir is gone (a crash in between) is reclaimed by
//! the next allocation that probes it.
//!
//! The host creates the namespace with a short-lived helper child ([`create_userns`])
//! while the setup stage execs, and hands it over on the agent socket (a setup stage
//! whose host sent none creates it itself, the same way). The setup stage (host root,
//! before it runs anything of the sandbox) attaches the
//! workspace, outputs, binds and an image's lower layer as idmapped mounts through it
//! (`open_tree` + `mount_setattr(MOUNT_ATTR_IDMAP)` + `move_mount`: host id `k` appears
//! as the sandbox's `k`, so its uid 0 acts as host uid 0 there and only there), builds
//! the rest as root, and finally [`enter`]s it as its uid 0. The other namespaces stay
//! owned by the host's user namespace, where the sandbox has no capability.
//!
//! What this must never do: map a sandbox id to a host id outside its range, attach a
//! writable mount that is not `nosuid`/`nodev`, or let a file created through an
//! idmapped mount carry setuid/setgid bits (the seccomp filter refuses those modes, see
//! `setup::harden`).

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;

use crate::sys;

/// Ids per sandbox: a full 16-bit range, as a container image expects.
pub const RANGE: u32 = 65_536;
/// First host id handed to sandboxes: far above any account (`/etc/passwd`,
/// `/etc/subuid` entries up there make the allocator skip the slots they touch).
pub const FIRST_BASE: u32 = 0x4000_0000;
/// Concurrent sandboxes per runtime dir.
const SLOTS: u32 = 16_384;
/// Host-wide slot files, one per live sandbox, naming its state dir.
pub const SLOTS_DIR: &str = "/run/omabox-idmap";

/// A claimed host id range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdRange {
    /// First host id (the sandbox's uid and gid 0).
    pub base: u32,
}

impl IdRange {
    fn slot(self) -> u32 {
        (self.base - FIRST_BASE) / RANGE
    }

    /// The `uid_map` / `gid_map` line.
    pub fn map_line(self) -> String {
        format!("0 {} {RANGE}\n", self.base)
    }
}

/// Claims a free id range for the sandbox whose state dir is `state_dir` (which
/// exists already). Host-wide: every runtime dir draws from [`SLOTS_DIR`].
pub fn allocate(state_dir: &Path) -> io::Result<IdRange> {
    // In memory, like the runtime dir: a slot is claimed and freed at every start, and on
    // a disk `/run` each is a file created and unlinked (with its block discarded).
    let _ = crate::runtime_dir::ensure_locked(Path::new(SLOTS_DIR), "lock");
    allocate_in(Path::new(SLOTS_DIR), state_dir)
}

/// Frees the range held by the sandbox of `state_dir` (no-op when it is not the
/// holder, or was freed already).
pub fn free(range: IdRange, state_dir: &Path) -> io::Result<()> {
    free_in(Path::new(SLOTS_DIR), range, state_dir)
}

/// Removes every slot whose sandbox has no state dir any more (see `is_stale`), so a
/// crashed host leaves no slot behind once `reap` ran. Returns how many went.
pub fn free_stale() -> io::Result<usize> {
    free_stale_in(Path::new(SLOTS_DIR))
}

fn free_stale_in(dir: &Path) -> io::Result<usize> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let _lock = sys::FileLock::take(&dir.join("lock"))?;
    let mut freed = 0;
    for entry in entries {
        let path = entry?.path();
        let is_slot = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.parse::<u32>().is_ok());
        if is_slot && is_stale(&path) {
            std::fs::remove_file(&path)?;
            freed += 1;
        }
    }
    Ok(freed)
}

fn claim(path: &Path, holder: &Path) -> io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(holder.as_os_str().as_bytes())
}

fn allocate_in(dir: &Path, state_dir: &Path) -> io::Result<IdRange> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let _lock = sys::FileLock::take(&dir.join("lock"))?;
    let used = host_ids();
    // Start at a spot derived from the holder so allocations rarely probe the same
    // slots first; every slot is tried once.
    let start = state_dir
        .as_os_str()
        .as_bytes()
        .iter()
        .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(*b as u32))
        % SLOTS;
    for i in 0..SLOTS {
        let slot = (start + i) % SLOTS;
        let base = FIRST_BASE + slot * RANGE;
        if used.iter().any(|&(lo, hi)| lo < base + RANGE && hi > base) {
            continue;
        }
        let path = dir.join(slot.to_string());
        match claim(&path, state_dir) {
            Ok(()) => return Ok(IdRange { base }),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                if is_stale(&path) {
                    std::fs::remove_file(&path)?;
                    claim(&path, state_dir)?;
                    return Ok(IdRange { base });
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::other(format!(
        "all {SLOTS} sandbox id ranges are in use"
    )))
}

fn free_in(dir: &Path, range: IdRange, state_dir: &Path) -> io::Result<()> {
    let path = dir.join(range.slot().to_string());
    match std::fs::read(&path) {
        Ok(holder) if holder == state_dir.as_os_str().as_bytes() => std::fs::remove_file(&path),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

/// A slot whose sandbox has no state dir any more (a crash between destroy's steps,
/// or before the identity was written).
fn is_stale(slot: &Path) -> bool {
    match std::fs::read(slot) {
        Ok(holder) => {
            let holder = Path::new(std::ffi::OsStr::from_bytes(&holder));
            !holder.is_absolute() || !holder.exists()
        }
        Err(_) => false,
    }
}

/// Id ranges (`[lo, hi)`) of host accounts and subordinate ranges.
fn host_ids() -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    for f in ["/etc/passwd", "/etc/group"] {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
            if let Some(id) = line.split(':').nth(2).and_then(|s| s.parse::<u32>().ok()) {
                out.push((id, id.saturating_add(1)));
            }
        }
    }
    for f in ["/etc/subuid", "/etc/subgid"] {
        for line in std::fs::read_to_string(f).unwrap_or_default().lines() {
            let mut p = line.split(':').skip(1);
            if let (Some(Ok(lo)), Some(Ok(n))) = (
                p.next().map(str::parse::<u32>),
                p.next().map(str::parse::<u32>),
            ) {
                out.push((lo, lo.saturating_add(n)));
            }
        }
    }
    out
}

/// Writes the id maps of the user namespace of `pid` (a child just cloned with
/// `CLONE_NEWUSER`).
fn write_maps(pid: &str, range: IdRange) -> io::Result<()> {
    let line = range.map_line();
    std::fs::write(format!("/proc/{pid}/gid_map"), &line)?;
    std::fs::write(format!("/proc/{pid}/uid_map"), &line)
}

const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// A detached, `nosuid`/`nodev` copy of the mount tree at `source`, idmapped through
/// `userns`: host id `k` appears inside as the sandbox's `k`, so the
/// sandbox's uid 0 owns what host root owns there. Attach it with `move_mount`.
pub fn idmapped_tree(source: &Path, userns: &OwnedFd) -> io::Result<OwnedFd> {
    let c = sys::cstr(source)?;
    // SAFETY: `c` is a valid C string; the result is checked below.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a fresh fd that only we own.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        attr_clr: 0,
        propagation: libc::MS_PRIVATE,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: `tree` is a valid mount fd, `empty` a valid C string, `attr` a valid
    // mount_attr of the size passed; the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            (libc::AT_EMPTY_PATH | libc::AT_RECURSIVE) as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(tree)
}

/// A new user namespace whose ids `0..65536` map to `range` and whose owner is the
/// range's base: a helper child becomes the base uid and unshares it, the caller (root
/// of the parent namespace) writes its maps and keeps it by an fd, and the helper is
/// killed and reaped when the returned [`UsernsHelper`] is dropped (a host drops it once
/// it has handed the namespace on and released the sandbox, so the helper's exit is not
/// on the start's critical path).
///
/// The helper is a `CLONE_VM` child on a small stack of its own (like `spawn`'s), not a
/// fork: no page tables are copied for it and none torn down when it dies, which made
/// up most of this step's cost. It shares the caller's memory, so it makes only raw
/// syscalls on its own stack and on `HelperArgs`, which stays alive and unchanged
/// until it is reaped. It starts with every signal blocked and never unblocks one (only
/// the SIGKILL that ends it reaches it), so no signal handler of the caller (the host's
/// runtime, say) ever runs on it. Its only write to shared memory is `errno` (it shares
/// the calling thread's TLS), on a failed syscall just before it exits: the caller then
/// sees EOF on the pipe and reports that, not an errno. Callers: the host (`LinuxRuntime
/// ::start`, any thread) and, for a sandbox whose host did not send one, the setup stage.
pub fn create_userns(range: IdRange) -> io::Result<(OwnedFd, UsernsHelper)> {
    begin_userns(range)?.finish()
}

/// A [`create_userns`] whose helper is started and not waited for yet: the caller does
/// other work (the host makes the cgroup) while the helper is scheduled, becomes the
/// base uid and unshares. Dropped unfinished, the helper is killed and reaped. Only a
/// failing helper writes to shared memory (`errno`, see [`create_userns`]); the start
/// fails then anyway, though an error the caller meets meanwhile may name a wrong errno.
#[derive(Debug)]
pub struct PendingUserns {
    range: IdRange,
    pipe: File,
    helper: UsernsHelper,
}

/// Starts the helper of [`create_userns`]; [`PendingUserns::finish`] completes it.
pub fn begin_userns(range: IdRange) -> io::Result<PendingUserns> {
    // The helper tells its pid as `/proc` (still the host's here) knows it: the pid
    // clone returns is one of the sandbox's pid namespace.
    let (r, w) = sys::pipe()?;
    let stack = crate::spawn::ChildStack::new()?;
    // Boxed: it must stay where it is until the helper is reaped, which may be after
    // this function returned (`UsernsHelper` owns it).
    let args = Box::new(HelperArgs {
        base: range.base,
        pipe_w: w.as_raw_fd(),
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
    });
    // SAFETY: sigset_t is plain data; sigfillset initializes it.
    let (mut all, mut old): (libc::sigset_t, libc::sigset_t) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    // SAFETY: valid, writable sigset_t values; only this thread's mask changes.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }
    // The helper starts on this CPU: its few syscalls then run as soon as we wait for
    // them, instead of after the wake-up of an idle CPU (~0.3 ms in a VM whose idle
    // vCPUs halt).
    let affinity = sys::pin_to_this_cpu();
    // SAFETY: `userns_helper` runs on `stack` (its top, 16-byte aligned) in a child
    // sharing our memory; it reads only `args` and its own stack, and makes only raw
    // syscalls (see the fn doc). `args` and `stack` outlive it: both move into the
    // `UsernsHelper` (or are dropped below only after it was reaped on failure), whose
    // drop kills and reaps it before freeing either.
    let pid = unsafe {
        libc::clone(
            userns_helper,
            stack.top(),
            libc::CLONE_VM | libc::SIGCHLD,
            &*args as *const HelperArgs as *mut libc::c_void,
        )
    };
    let clone_err = io::Error::last_os_error();
    if let Some(mask) = affinity {
        sys::set_affinity(&mask);
    }
    // SAFETY: restores this thread's previous mask from a valid sigset_t.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut()) };
    if pid < 0 {
        return Err(clone_err);
    }
    drop(w);
    let helper = UsernsHelper {
        pid,
        _stack: stack,
        _args: args,
    };
    Ok(PendingUserns {
        range,
        pipe: File::from(r),
        helper,
    })
}

impl PendingUserns {
    /// Waits for the helper's namespace, writes its maps and opens it.
    pub fn finish(self) -> io::Result<(OwnedFd, UsernsHelper)> {
        let Self {
            range,
            mut pipe,
            helper,
        } = self;
        let ns = (|| {
            // Up to the newline, not to EOF: a helper another host thread cloned meanwhile
            // may hold a copy of `w` for a moment.
            let mut host_pid = Vec::new();
            let mut buf = [0u8; 32];
            while !host_pid.ends_with(b"\n") && host_pid.len() <= 32 {
                match std::io::Read::read(&mut pipe, &mut buf) {
                    Ok(0) => break,
                    Ok(n) => host_pid.extend_from_slice(&buf[..n]),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            let host_pid = String::from_utf8_lossy(host_pid.strip_suffix(b"\n").unwrap_or(&[]));
            if host_pid.is_empty() || !host_pid.bytes().all(|b| b.is_ascii_digit()) {
                return Err(io::Error::other("the user namespace helper did not report"));
            }
            write_maps(&host_pid, range)?;
            // A host killed here leaves the helper behind only until its parent-death
            // signal (the crash tests kill one here).
            crate::fault::point("linux-start-userns");
            Ok(OwnedFd::from(File::open(format!(
                "/proc/{host_pid}/ns/user"
            ))?))
        })();
        // On failure the helper goes now (dropped with the error).
        ns.map(|ns| (ns, helper))
    }
}

/// The sleeping helper of a [`create_userns`] namespace, with the stack and arguments
/// it runs on: dropping it kills and reaps the helper, then frees them. Until then it
/// only sleeps (every signal blocked, no fd open); it also dies with its caller
/// (`PR_SET_PDEATHSIG`), so a host killed before the drop leaves nothing.
pub struct UsernsHelper {
    pid: libc::pid_t,
    _stack: crate::spawn::ChildStack,
    _args: Box<HelperArgs>,
}

impl std::fmt::Debug for UsernsHelper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsernsHelper")
            .field("pid", &self.pid)
            .finish()
    }
}

impl Drop for UsernsHelper {
    fn drop(&mut self) {
        // SAFETY: kill and waitpid on our own child; the stack and arguments it uses
        // are freed only after it was reaped (fields drop after this body).
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            while libc::waitpid(self.pid, std::ptr::null_mut(), 0) < 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
        }
    }
}

/// What the user namespace helper reads (in the caller's memory, which it shares).
struct HelperArgs {
    base: u32,
    pipe_w: libc::c_int,
    /// The caller's pid: the helper dies with it.
    parent: libc::pid_t,
}

/// The user namespace helper: dies with its caller, becomes the range's base uid/gid,
/// unshares a user namespace, writes its host pid (`/proc/self`) into the pipe, closes it and sleeps
/// until it is killed. On any failure it exits without reporting (the caller reads EOF).
extern "C" fn userns_helper(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `HelperArgs` `create_userns` passed to clone, alive and
    // unchanged until this child is reaped. Raw syscalls only, on integers, on C string
    // literals and on a buffer of this stack: no allocation, no lock, no libc state.
    unsafe {
        let args = &*(arg as *const HelperArgs);
        let base = args.base as libc::c_long;
        // None of the caller's other fds (a copy of its table) stays open in here.
        let w = args.pipe_w as libc::c_uint;
        if w > 0 {
            libc::syscall(
                libc::SYS_close_range,
                0 as libc::c_uint,
                w - 1,
                0 as libc::c_uint,
            );
        }
        libc::syscall(
            libc::SYS_close_range,
            w + 1,
            libc::c_uint::MAX,
            0 as libc::c_uint,
        );
        // The namespace's owner is its creator's euid, and the kernel charges the
        // per-user counters (inotify, pending signals, …) of everything inside to the
        // owner one level up: so the range's base must create it, not root.
        if libc::syscall(
            libc::SYS_setgroups,
            0 as libc::c_long,
            std::ptr::null::<u8>(),
        ) < 0
            || libc::syscall(libc::SYS_setresgid, base, base, base) < 0
            || libc::syscall(libc::SYS_setresuid, base, base, base) < 0
            || libc::syscall(libc::SYS_unshare, libc::CLONE_NEWUSER as libc::c_long) < 0
        {
            libc::syscall(libc::SYS_exit, 1 as libc::c_long);
        }
        // Killed with its caller, should that die first (a host killed mid-start): no
        // helper is ever left sleeping. Set after the id changes (which clear it), and
        // checked after, for a caller that died before.
        libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_PDEATHSIG as libc::c_long,
            libc::SIGKILL as libc::c_long,
        );
        if libc::syscall(libc::SYS_getppid) != args.parent as libc::c_long {
            libc::syscall(libc::SYS_exit, 1 as libc::c_long);
        }
        let mut buf = [0u8; 32];
        let n = libc::syscall(
            libc::SYS_readlinkat,
            libc::AT_FDCWD as libc::c_long,
            c"/proc/self".as_ptr(),
            buf.as_mut_ptr(),
            buf.len() - 1,
        );
        if n > 0 {
            // Newline-terminated: the caller reads up to it (`n` < 32: room is left).
            if let Some(end) = buf.get_mut(n as usize) {
                *end = b'\n';
            }
            let n = n + 1;
            libc::syscall(
                libc::SYS_write,
                args.pipe_w as libc::c_long,
                buf.as_ptr(),
                n as usize,
            );
        }
        libc::syscall(libc::SYS_close, args.pipe_w as libc::c_long);
        loop {
            // No fds, no timeout: sleeps until the SIGKILL.
            libc::syscall(
                libc::SYS_ppoll,
                std::ptr::null::<u8>(),
                0 as libc::c_long,
                std::ptr::null::<u8>(),
                std::ptr::null::<u8>(),
                0 as libc::c_long,
            );
        }
    }
}

/// Enters `userns` and becomes its uid/gid 0 with no supplementary groups (the host's
/// would otherwise stay effective). Needs a single-threaded caller that is root of the
/// parent namespace and not chrooted (after `pivot_root` it is not).
pub fn enter(userns: &OwnedFd) -> io::Result<()> {
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: setns on an fd we own; plain id syscalls with no memory arguments but a
    // null group list of length 0.
    unsafe {
        check(libc::setns(userns.as_raw_fd(), libc::CLONE_NEWUSER))?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setresgid(0, 0, 0))?;
        check(libc::setresuid(0, 0, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_distinct_freed_and_reclaimed_after_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let slots = dir.path().join("slots");
        let state = |n: &str| {
            let p = dir.path().join(n);
            std::fs::create_dir_all(&p).unwrap();
            p
        };
        let (a_dir, b_dir) = (state("a"), state("b"));
        let a = allocate_in(&slots, &a_dir).unwrap();
        let b = allocate_in(&slots, &b_dir).unwrap();
        assert_ne!(a, b);
        for r in [a, b] {
            assert!(r.base >= FIRST_BASE && r.base % RANGE == 0);
            assert!(
                host_ids()
                    .iter()
                    .all(|&(lo, hi)| hi <= r.base || lo >= r.base + RANGE)
            );
        }
        // Freeing by a non-holder does nothing; by the holder frees it.
        free_in(&slots, a, &b_dir).unwrap();
        assert!(slots.join(a.slot().to_string()).exists());
        free_in(&slots, a, &a_dir).unwrap();
        assert!(!slots.join(a.slot().to_string()).exists());
        // b's sandbox crashed: its state dir is gone, its slot is stale and reclaimed by
        // an allocation that probes it.
        let b_slot = slots.join(b.slot().to_string());
        assert!(!is_stale(&b_slot));
        std::fs::remove_dir(&b_dir).unwrap();
        assert!(is_stale(&b_slot));
        // The holder whose hash starts at b's slot gets it back.
        let c_dir = (0..)
            .map(|i| dir.path().join(format!("c{i}")))
            .find(|p| {
                let start = p
                    .as_os_str()
                    .as_bytes()
                    .iter()
                    .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(*b as u32))
                    % SLOTS;
                start == b.slot()
            })
            .unwrap();
        std::fs::create_dir(&c_dir).unwrap();
        assert_eq!(allocate_in(&slots, &c_dir).unwrap(), b);
        assert_eq!(a.map_line(), format!("0 {} 65536\n", a.base));
        // The reaper's pass frees stale slots and only those.
        let d_dir = state("d");
        let d = allocate_in(&slots, &d_dir).unwrap();
        std::fs::remove_dir(&c_dir).unwrap();
        assert_eq!(free_stale_in(&slots).unwrap(), 1);
        assert!(!slots.join(b.slot().to_string()).exists());
        assert!(slots.join(d.slot().to_string()).exists());
        assert_eq!(free_stale_in(&dir.path().join("none")).unwrap(), 0);
    }
}
