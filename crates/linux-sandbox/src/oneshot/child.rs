//! The one-shot sandbox's PID 1: a fork of the (single-threaded) host process, not an
//! exec'd binary. It runs the same setup stage as `omabox-sandbox-init` (network
//! namespace first, then the plan's cgroup, mounts, user namespace and hardening), then
//! starts the one command in a process group of its own with the host's pipes as its
//! stdio, reaps every process of the namespace, forwards the host's kill requests to the
//! command's group and reports its exit on the status pipe.
//!
//! It is a copy of the host's memory, so the first thing it does is let go of the
//! host: default signal handlers, a session of its own, `/dev/null` as stdio, every fd
//! but its five closed (not just marked close-on-exec: nothing is exec'd in this
//! process), and `/proc/1/cmdline` pointed away from the host's argv. The host's memory
//! it still holds stays unreadable to the sandbox: the process is made non-dumpable by the
//! hardening step, so its `/proc/1/{environ,mem,exe}` are closed to sandbox processes,
//! and the command it starts execs at once (a fresh address space).

use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use crate::handoff::{self, InitSpec};
use crate::setup;
use crate::sys;

use super::{ChildCgroup, ForkedPlan, MAX_FORKED_PLAN, wire};
use crate::cgroup::CgroupPaths;

/// What the child has from the clone: its fds, and whether the host sends a user
/// namespace with the go. The plan itself comes after the go ([`ForkedPlan`]).
pub(super) struct ChildPlan {
    pub(super) userns_sent: bool,
    pub(super) status: RawFd,
    pub(super) control: RawFd,
    pub(super) stdin: RawFd,
    pub(super) stdout: RawFd,
    pub(super) stderr: RawFd,
    pub(super) null: RawFd,
    /// The CPU mask to take back once the plan is here: the host keeps this process off
    /// its own CPU until then (see `fork_into`), and whatever runs in the sandbox
    /// inherits the mask this process has when it starts it.
    pub(super) affinity: Option<libc::cpu_set_t>,
}

/// The namespaces this process makes itself, first thing after leaving the host's session
/// and fds: everything but the PID (and, unprivileged, user) namespace the clone made.
const OWN_NAMESPACES: libc::c_int =
    libc::CLONE_NEWNET | libc::CLONE_NEWNS | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS;

/// The command, from the [`ForkedPlan`].
struct Command {
    argv: Vec<CString>,
    envp: Vec<CString>,
}

/// The child's whole life. Never returns; never unwinds into the host's frames.
pub(super) fn main(plan: &ChildPlan) -> ! {
    let code = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(plan))).unwrap_or(101);
    // SAFETY: ends this process without running the host's atexit handlers or flushing
    // its stdio buffers (copies of the host's, not ours to write).
    unsafe { libc::_exit(code) }
}

fn run(plan: &ChildPlan) -> i32 {
    let entered = handoff::monotonic_us();
    // SAFETY: the status pipe's write end is ours (the host closed its copy of this
    // fd number in our memory image only; the kernel object is shared as intended).
    let mut status = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(plan.status) });
    let fail = |status: &mut std::fs::File, text: String| {
        let _ = write!(status, "{}{text}", handoff::FAILED as char);
        1
    };
    if let Err(e) = detach_from_host(plan) {
        return fail(&mut status, format!("one-shot init: {e}"));
    }
    // The network namespace first, alone (the costliest, ~350 µs): the mount table is
    // copied after it, when the host has read its own (`/proc/self/mountinfo`, in its
    // probe): copying it holds the kernel's mount-namespace lock, which every read of a
    // mountinfo waits for.
    let net = libc::CLONE_NEWNET;
    if let Err(e) = sys::unshare(net).and_then(|()| sys::unshare(OWN_NAMESPACES & !net)) {
        return fail(
            &mut status,
            format!("one-shot init: unshare namespaces: {e}"),
        );
    }
    let netns = handoff::monotonic_us();
    // SAFETY: `control` is open in this process and owned by nothing else here.
    let control = unsafe { OwnedFd::from_raw_fd(plan.control) };
    // The plan comes as soon as the host's state dir exists; the go after it.
    let (mut spec, command, cgroup) = match read_plan(control.as_fd()) {
        Ok(p) => p,
        Err(e) => return fail(&mut status, format!("reading the plan: {e}")),
    };
    let plan_read = handoff::monotonic_us();
    if let Some(mask) = &plan.affinity {
        crate::sys::set_affinity(mask);
    }
    // cgroup v1 as root: part of the cgroup is made here, while the host makes the rest
    // and the user namespace (it knows every directory, and destroys them as if it had
    // made them all).
    if let Some(Err(e)) = cgroup.map(|c| make_cgroup(&c, &spec)) {
        return fail(&mut status, format!("create cgroup: {e}"));
    }
    let leave = CgroupExit::open(&spec.cgroup_join);
    // Blocks until the host made the user namespace (as root) and claimed the id range.
    let (userns, id_base) = match wait_for_go(control.as_fd(), plan.userns_sent) {
        Ok(go) => go,
        Err(e) => {
            // A host that died here cannot remove the cgroup made for this sandbox, ours
            // and its part (an `omabox reap` that ran meanwhile may have come too early):
            // we are not in it yet, and the host is gone.
            let planned = CgroupPaths {
                dirs: spec
                    .cgroup_join
                    .iter()
                    .filter_map(|tasks| tasks.parent().map(Into::into))
                    .collect(),
                unified: false,
            };
            let _ = planned.remove(std::time::Duration::from_millis(100));
            return fail(&mut status, format!("waiting for the host: {e}"));
        }
    };
    let go = handoff::monotonic_us();
    spec.id_base = id_base;
    // The seccomp program follows the go: the host builds it while this process sets
    // up the sandbox (it is read just before it is installed).
    let control_fd = plan.control;
    let early = setup::Early::seccomp_from(move || {
        // SAFETY: `control` (this fd) stays open until this process exits.
        let control = unsafe { BorrowedFd::borrow_raw(control_fd) };
        setup::harden::decode_program(|buf| read_exact(control, buf))
    });
    let mut report = match setup::run(&spec, userns, early) {
        Ok(r) => r,
        Err(e) => return fail(&mut status, e.to_string()),
    };
    report.clock_us = vec![
        ("init main".into(), entered),
        ("init netns".into(), netns),
        ("init plan read".into(), plan_read),
        ("init go".into(), go),
        ("init ready".into(), handoff::monotonic_us()),
    ];
    let mut line = vec![handoff::READY];
    line.extend(serde_json::to_vec(&report).unwrap_or_default());
    line.push(b'\n');
    if status.write_all(&line).is_err() {
        return 1;
    }
    supervise(plan, &command, &mut status, &control, &leave)
}

/// The `tasks` files of the sandbox cgroup's parents (v1), opened while this process is
/// still host root: once no other process is left in the sandbox, it moves itself there
/// (writing `0` moves the writing thread; the kernel checks the opener's credentials), so
/// the host can remove the sandbox's cgroup while this process exits instead of after.
/// Best effort: a file that cannot be opened or written leaves the removal to the host's
/// teardown, after this process is gone. Close-on-exec: never the command's.
struct CgroupExit(Vec<std::fs::File>);

impl CgroupExit {
    fn open(joined: &[std::path::PathBuf]) -> Self {
        Self(
            joined
                .iter()
                .filter_map(|tasks| tasks.parent()?.parent().map(|p| p.join("tasks")))
                .filter_map(|p| std::fs::OpenOptions::new().write(true).open(p).ok())
                .collect(),
        )
    }

    fn leave(&self) {
        for mut file in &self.0 {
            let _ = file.write_all(b"0");
        }
    }
}

/// Makes this process's part of the sandbox's cgroup directories and writes their limits
/// (not joined yet: the setup stage joins them all first thing, the host's part made by
/// then), checking they are among the ones the spec joins.
fn make_cgroup(cgroup: &ChildCgroup, spec: &InitSpec) -> std::io::Result<CgroupPaths> {
    let made = CgroupPaths::create(&cgroup.layout, &cgroup.parent, &spec.id, &spec.plan.limits)?;
    let files = made.self_join_files().unwrap_or_default();
    if files.is_empty() || !files.iter().all(|f| spec.cgroup_join.contains(f)) {
        let _ = made.remove(std::time::Duration::from_millis(100));
        return Err(std::io::Error::other(
            "the cgroup directories differ from the ones the setup stage joins",
        ));
    }
    Ok(made)
}

/// The [`ForkedPlan`], before the go: a 4-byte length, then its JSON.
fn read_plan(control: BorrowedFd<'_>) -> std::io::Result<(InitSpec, Command, Option<ChildCgroup>)> {
    let mut len = [0u8; 4];
    read_exact(control, &mut len)?;
    let len = u32::from_ne_bytes(len) as usize;
    if len > MAX_FORKED_PLAN {
        return Err(std::io::Error::other("oversized plan"));
    }
    let mut bytes = vec![0u8; len];
    read_exact(control, &mut bytes)?;
    let plan: ForkedPlan = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
    let cstrings = |items: Vec<String>| -> std::io::Result<Vec<CString>> {
        items
            .into_iter()
            .map(|s| CString::new(s).map_err(std::io::Error::other))
            .collect()
    };
    let command = Command {
        argv: cstrings(plan.argv)?,
        envp: cstrings(plan.envp)?,
    };
    if command.argv.is_empty() {
        return Err(std::io::Error::other("no program"));
    }
    Ok((plan.spec, command, plan.cgroup))
}

fn read_exact(fd: BorrowedFd<'_>, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match read_some(fd.as_raw_fd(), &mut buf[got..])? {
            0 => return Err(std::io::Error::other("the host closed the control channel")),
            n => got += n,
        }
    }
    Ok(())
}

/// Default signal handlers, an empty mask but `SIGCHLD` (taken through a signalfd
/// later), a session of its own (no controlling terminal: `/dev/tty` gives ENXIO inside),
/// `/dev/null` as stdio, and no fd of the host's but the five it was given.
fn detach_from_host(plan: &ChildPlan) -> std::io::Result<()> {
    // SAFETY: (the whole block) signal, session and fd syscalls on integers and on local,
    // initialized sigaction/sigset_t values.
    unsafe {
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        for sig in 1..=64 {
            libc::sigaction(sig, &dfl, std::ptr::null_mut());
        }
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
        sys::check(libc::setsid())?;
        for target in 0..3 {
            sys::check(libc::dup2(plan.null, target))?;
        }
    }
    sys::close_all_but(&mut [
        plan.status,
        plan.control,
        plan.stdin,
        plan.stdout,
        plan.stderr,
    ])?;
    hide_host_argv();
    forget_host_environment();
    // The name `ps`, `pgrep` and the sandbox's `/proc/1/comm` show: the init's, not the
    // host binary's (`scripts/check-leftovers` finds a leaked one by it).
    // SAFETY: PR_SET_NAME copies at most 16 bytes from a NUL-terminated literal.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"omabox-sandbox-init".as_ptr()) };
    Ok(())
}

/// What `/proc/1/cmdline` (readable by every process of the sandbox) shows instead of
/// the host's argv, which may name host paths.
const CMDLINE: &[u8] = b"omabox-sandbox-init\0";

unsafe extern "C" {
    /// glibc's pointer to `argv[0]`, where the kernel's argv range starts.
    static program_invocation_name: *mut libc::c_char;
    /// glibc's environment array.
    static mut environ: *mut *mut libc::c_char;
}

/// Wipes this process's copy of the host's environment (the user's shell variables,
/// tokens and keys among them) and leaves it empty. Nothing here reads it: the command
/// gets the plan's `env`, its `PATH` search too. No sandbox process can read PID 1's
/// memory (non-dumpable, no ptrace), so this is for the day a kernel bug lets one: a
/// secret PID 1 never held cannot leak from it.
fn forget_host_environment() {
    // SAFETY: single-threaded; `environ` is glibc's NULL-terminated array of
    // NUL-terminated strings, each writable (on the initial stack, or copies setenv made
    // in the heap), and this process's own copy. clearenv only resets the array.
    unsafe {
        let mut entry = environ;
        while !entry.is_null() && !(*entry).is_null() {
            let s = *entry;
            std::ptr::write_bytes(s, 0, libc::strlen(s));
            entry = entry.add(1);
        }
        libc::clearenv();
    }
}

/// Overwrites this process's copy of the host's argv strings (which `/proc/1/cmdline`
/// reads, unlike `environ`, without ptrace access) with [`CMDLINE`] and NULs. Only
/// if the memory at `argv[0]` holds exactly the arguments std saw at start-up; else it
/// is left alone (then `/proc/1/cmdline` shows the host's command line).
fn hide_host_argv() {
    use std::os::unix::ffi::OsStrExt;
    let mut expected = Vec::new();
    for arg in std::env::args_os() {
        expected.extend_from_slice(arg.as_bytes());
        expected.push(0);
    }
    // SAFETY: reads glibc's initialized global.
    let start = unsafe { program_invocation_name }.cast::<u8>();
    if start.is_null() || expected.len() < CMDLINE.len() {
        return;
    }
    // SAFETY: the argv strings are one contiguous, writable block on the initial stack
    // from `argv[0]` on, as long as the arguments are (checked byte by byte before
    // anything is written, comparing up to the first difference only); this process is
    // single-threaded and its memory its own (a copy of the host's).
    unsafe {
        for (i, &b) in expected.iter().enumerate() {
            if *start.add(i) != b {
                return;
            }
        }
        let region = std::slice::from_raw_parts_mut(start, expected.len());
        region.fill(0);
        region[..CMDLINE.len()].copy_from_slice(CMDLINE);
    }
}

/// Waits for the host's go: one byte (carrying the user namespace when one was made),
/// then the id range's base (4 bytes, native endian; 0: none).
fn wait_for_go(
    control: BorrowedFd<'_>,
    userns: bool,
) -> std::io::Result<(Option<OwnedFd>, Option<u32>)> {
    let ns = if userns {
        Some(handoff::recv_fd(control)?)
    } else {
        let mut byte = [0u8; 1];
        if read_some(control.as_raw_fd(), &mut byte)? == 0 {
            return Err(std::io::Error::other("the host closed the control channel"));
        }
        None
    };
    let mut base = [0u8; 4];
    read_exact(control, &mut base)?;
    let base = u32::from_ne_bytes(base);
    Ok((ns, (base != 0).then_some(base)))
}

fn read_some(fd: RawFd, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        // SAFETY: `buf` is a valid writable buffer of its length.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Starts the command (unless the host asked to stop first), then reaps and forwards
/// kill requests until the host closes the control channel or kills us, or until the
/// command has exited and no process is left in the namespace: then this process exits
/// on its own (nothing could write the command's pipes or need a kill request any more,
/// and its exit, the namespaces' teardown included, overlaps the host reading the exit
/// status instead of starting only at the host's kill).
fn supervise(
    plan: &ChildPlan,
    command: &Command,
    status: &mut std::fs::File,
    control: &OwnedFd,
    cgroup: &CgroupExit,
) -> i32 {
    let mut pending = [0u8; 16];
    // SAFETY: a non-blocking read of what the host sent so far into a local buffer.
    let early = unsafe {
        libc::recv(
            control.as_raw_fd(),
            pending.as_mut_ptr().cast(),
            pending.len(),
            libc::MSG_DONTWAIT,
        )
    };
    if early >= 0 {
        // A kill request (or the host gone) before the command ran: run nothing.
        let _ = status.write_all(&[wire::INTERRUPTED, b'\n']);
        return 0;
    }
    // SAFETY: a signalfd for SIGCHLD, which is blocked (see detach_from_host).
    let sigfd = unsafe {
        let mut mask: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut mask);
        libc::sigaddset(&mut mask, libc::SIGCHLD);
        libc::signalfd(-1, &mask, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    if sigfd < 0 {
        let e = std::io::Error::last_os_error();
        let _ = writeln!(
            status,
            "{}cannot wait for the command: {e}",
            wire::NOT_STARTED as char
        );
        return 1;
    }
    // SAFETY: a fresh fd only we own.
    let sigfd = unsafe { OwnedFd::from_raw_fd(sigfd) };
    let pid = match spawn(plan, command) {
        Ok(pid) => pid,
        Err(e) => {
            let _ = writeln!(
                status,
                "{}cannot start {:?}: {e}",
                wire::NOT_STARTED as char,
                command
                    .argv
                    .iter()
                    .map(|a| a.to_string_lossy())
                    .collect::<Vec<_>>()
            );
            return 0;
        }
    };
    let mut running = true;
    loop {
        let mut fds = [
            libc::pollfd {
                fd: control.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: sigfd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: `fds` is a valid array of two pollfds.
        if unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) } < 0 {
            continue; // EINTR
        }
        if fds[1].revents != 0 {
            let mut info = [0u8; 128];
            while read_some(sigfd.as_raw_fd(), &mut info).is_ok_and(|n| n > 0) {}
            // The exit line and, once nothing is left, the `D` line go in one write, so
            // the host reads them together.
            let mut report = Vec::new();
            let empty = loop {
                let mut st = 0;
                // SAFETY: waitpid with a valid status pointer; reaps our children only.
                let r = unsafe { libc::waitpid(-1, &mut st, libc::WNOHANG) };
                if r > 0 {
                    if r == pid && running {
                        running = false;
                        report.extend_from_slice(wire::exit_line(st).as_bytes());
                    }
                    continue;
                }
                // Every process of the namespace descends from this one (orphans are
                // reparented here): no child means nothing is left.
                break r < 0
                    && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD);
            };
            let done = empty && !running;
            if done {
                // Out of the sandbox's cgroup before saying so: it is empty then.
                cgroup.leave();
                report.extend_from_slice(&[wire::EMPTY, b'\n']);
            }
            if !report.is_empty() {
                let _ = status.write_all(&report);
            }
            if done {
                return 0;
            }
        }
        if fds[0].revents != 0 {
            let mut buf = [0u8; 16];
            match read_some(control.as_raw_fd(), &mut buf) {
                Ok(0) | Err(_) => return 0,
                Ok(n) => {
                    for b in &buf[..n] {
                        let sig = match *b {
                            wire::TERM => libc::SIGTERM,
                            wire::KILL => libc::SIGKILL,
                            _ => continue,
                        };
                        if running {
                            // SAFETY: kill(2) on the command's own process group
                            // (pid > 1: it is a child of PID 1).
                            unsafe { libc::kill(-pid, sig) };
                        }
                    }
                }
            }
        }
    }
}

/// Starts the command with `posix_spawn` (glibc's is a `CLONE_VM | CLONE_VFORK` clone:
/// no copy of this process's page tables): its own process group, the host's pipes as
/// stdio, every other fd closed, default signal handlers and an empty mask, the plan's env
/// plus the command's. A program without a `/` is searched in that env's `PATH` (default
/// `/bin:/usr/bin`), like `execvp`: missing or non-executable candidates are skipped.
/// Returns its pid, or why it could not start.
fn spawn(plan: &ChildPlan, command: &Command) -> std::io::Result<i32> {
    let mut argv: Vec<*mut libc::c_char> =
        command.argv.iter().map(|a| a.as_ptr().cast_mut()).collect();
    argv.push(std::ptr::null_mut());
    let mut envp: Vec<*mut libc::c_char> =
        command.envp.iter().map(|e| e.as_ptr().cast_mut()).collect();
    envp.push(std::ptr::null_mut());
    let program = command.argv[0].as_bytes();
    let candidates: Vec<CString> = if program.contains(&b'/') {
        vec![command.argv[0].clone()]
    } else {
        let path = command
            .envp
            .iter()
            .find_map(|e| e.as_bytes().strip_prefix(b"PATH="))
            .unwrap_or(b"/bin:/usr/bin");
        path.split(|&b| b == b':')
            .map(|dir| {
                let dir = if dir.is_empty() { &b"."[..] } else { dir };
                let mut full = dir.to_vec();
                full.push(b'/');
                full.extend_from_slice(program);
                CString::new(full).unwrap_or_default()
            })
            .collect()
    };
    let spawned = Spawner::new(plan).and_then(|spawner| spawner.first(&candidates, &argv, &envp));
    for fd in [plan.stdin, plan.stdout, plan.stderr] {
        // SAFETY: our copies of the command's pipe ends: the command has its own now, and
        // without a command the host must see EOF at once.
        unsafe { libc::close(fd) };
    }
    spawned
}

impl Spawner {
    /// Spawns the first candidate that exists and may be executed. A candidate that
    /// `access` finds missing is skipped without a spawn: each failed spawn is a clone,
    /// 64 `sigaction`s, an `execve` and an exit of a child, all on the run's path (three
    /// of them for `true` in Debian's default `PATH`: a shell loop of `omabox sandbox run
    /// -- true` took 4.05 ms per run with them, 3.65 ms without; bwrap 3.55). Whatever
    /// else `access` says, `posix_spawn` itself decides.
    fn first(
        &self,
        candidates: &[CString],
        argv: &[*mut libc::c_char],
        envp: &[*mut libc::c_char],
    ) -> std::io::Result<i32> {
        let mut last = std::io::Error::from_raw_os_error(libc::ENOENT);
        let mut denied = None;
        for candidate in candidates {
            // SAFETY: a NUL-terminated path; access(2) only reads it.
            if unsafe { libc::access(candidate.as_ptr(), libc::X_OK) } != 0 {
                let e = std::io::Error::last_os_error();
                if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) {
                    last = e;
                    continue;
                }
            }
            match self.spawn(candidate, argv, envp) {
                Ok(pid) => return Ok(pid),
                Err(e) => {
                    let errno = e.raw_os_error();
                    if errno == Some(libc::EACCES) {
                        denied = Some(e);
                    } else if matches!(errno, Some(libc::ENOENT | libc::ENOTDIR | libc::ESTALE)) {
                        last = e;
                    } else {
                        return Err(e);
                    }
                }
            }
        }
        Err(denied.unwrap_or(last))
    }
}

/// `posix_spawn` attributes and file actions of the command.
struct Spawner {
    attr: libc::posix_spawnattr_t,
    actions: libc::posix_spawn_file_actions_t,
}

impl Spawner {
    fn new(plan: &ChildPlan) -> std::io::Result<Self> {
        let errno = |r: libc::c_int| {
            if r == 0 {
                Ok(())
            } else {
                Err(std::io::Error::from_raw_os_error(r))
            }
        };
        // SAFETY: both structures are initialized by their init functions before any
        // other use, and destroyed once in Drop.
        unsafe {
            let mut this = Self {
                attr: std::mem::zeroed(),
                actions: std::mem::zeroed(),
            };
            errno(libc::posix_spawnattr_init(&mut this.attr))?;
            errno(libc::posix_spawn_file_actions_init(&mut this.actions))?;
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            let mut all: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            errno(libc::posix_spawnattr_setflags(
                &mut this.attr,
                (libc::POSIX_SPAWN_SETPGROUP
                    | libc::POSIX_SPAWN_SETSIGMASK
                    | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short,
            ))?;
            errno(libc::posix_spawnattr_setpgroup(&mut this.attr, 0))?;
            errno(libc::posix_spawnattr_setsigmask(&mut this.attr, &empty))?;
            errno(libc::posix_spawnattr_setsigdefault(&mut this.attr, &all))?;
            for (fd, target) in [(plan.stdin, 0), (plan.stdout, 1), (plan.stderr, 2)] {
                errno(libc::posix_spawn_file_actions_adddup2(
                    &mut this.actions,
                    fd,
                    target,
                ))?;
            }
            // The command inherits its stdio and nothing else of PID 1's.
            sys::cloexec_from(3)?;
            Ok(this)
        }
    }

    fn spawn(
        &self,
        path: &CString,
        argv: &[*mut libc::c_char],
        envp: &[*mut libc::c_char],
    ) -> std::io::Result<i32> {
        let mut pid = 0;
        // SAFETY: valid, initialized attributes and actions; `path`, `argv` and `envp`
        // are NUL-terminated strings and null-terminated arrays alive for the call.
        let r = unsafe {
            libc::posix_spawn(
                &mut pid,
                path.as_ptr(),
                &self.actions,
                &self.attr,
                argv.as_ptr(),
                envp.as_ptr(),
            )
        };
        if r == 0 {
            Ok(pid)
        } else {
            Err(std::io::Error::from_raw_os_error(r))
        }
    }
}

impl Drop for Spawner {
    fn drop(&mut self) {
        // SAFETY: destroys what `new` initialized, once.
        unsafe {
            libc::posix_spawnattr_destroy(&mut self.attr);
            libc::posix_spawn_file_actions_destroy(&mut self.actions);
        }
    }
}
