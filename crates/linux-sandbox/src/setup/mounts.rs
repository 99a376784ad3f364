//! Building the sandbox's mount tree in its private mount namespace, then pivoting
//! into it. Runs in the setup stage only (never in the host process).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use super::{SetupError, etc};
use crate::idmap::{self, IdRange};
use crate::plan::{RootfsSource, SandboxPlan};
use crate::sys::{self, mount, umount2};

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// Host directories bound read-only for the preinstalled rootfs, where present.
const PREINSTALLED_DIRS: &[&str] = &["usr", "bin", "sbin", "lib", "lib64", "lib32", "libx32"];
/// Non-secret host `/etc` entries the preinstalled rootfs binds read-only, where present:
/// the loader cache (libraries in non-default directories), Debian's alternatives
/// symlinks (`awk`, `editor`, …), the time zone, and the TLS trust store (the host's CA
/// certificates, so a sandbox trusts what the host trusts).
const PREINSTALLED_ETC_BINDS: &[&str] = &["ld.so.cache", "alternatives", "localtime", "ssl/certs"];
/// Device nodes of `/dev`: name, major, minor (the kernel's fixed numbers,
/// Documentation/admin-guide/devices.txt).
const DEVICES: &[(&str, u32, u32)] = &[
    ("null", 1, 3),
    ("zero", 1, 5),
    ("full", 1, 7),
    ("random", 1, 8),
    ("urandom", 1, 9),
    ("tty", 5, 0),
];
/// `/proc` files hidden behind `/dev/null`: kernel memory, keys, timers, scheduler, and
/// the host-wide files only host root may read (physical page state, slab and vmalloc
/// layout, physical memory and I/O maps, the kernel config, module addresses, the
/// kernel log); and host-wide ones every user may read that no program in a sandbox
/// needs: interrupt counts per device (the timing of the host's keystrokes — a
/// documented side channel), softirq counts, the free-page layout (`buddyinfo`,
/// `zoneinfo`: what page-placement attacks watch) and the kernel's command line (which
/// sometimes holds boot secrets).
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "timer_list",
    "sched_debug",
    "latency_stats",
    "kallsyms",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "slabinfo",
    "vmallocinfo",
    "pagetypeinfo",
    "iomem",
    "ioports",
    "mtrr",
    "config.gz",
    "modules",
    "kmsg",
    "interrupts",
    "softirqs",
    "buddyinfo",
    "zoneinfo",
    "cmdline",
];
/// `/proc` directories hidden behind an empty read-only directory: hardware, and the
/// host's pressure stall figures (how contended the whole host's CPU, memory and I/O
/// are, moment by moment).
const PROC_MASKED_DIRS: &[&str] = &["acpi", "scsi", "asound", "pressure"];
/// `/proc` entries made read-only (kernel tunables, magic keys, interrupts).
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `mount_setattr(2)`: changes flags of one mount, or of a whole tree with `recursive`.
/// Unlike a remount, the recursive form also reaches submounts of a bind.
fn set_attr(path: &Path, set: u64, recursive: bool) -> io::Result<()> {
    change_attr(path, set, 0, recursive)
}

/// `mount_setattr(2)` setting the flags `set` and clearing `clear`.
fn change_attr(path: &Path, set: u64, clear: u64, recursive: bool) -> io::Result<()> {
    let c = sys::cstr(path)?;
    let attr = MountAttr {
        attr_set: set,
        attr_clr: clear,
        propagation: 0,
        userns_fd: 0,
    };
    let flags = if recursive { libc::AT_RECURSIVE } else { 0 } | libc::AT_SYMLINK_NOFOLLOW;
    // SAFETY: `c` is a valid C string, `attr` a valid mount_attr of the size passed;
    // the kernel only reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a mount was made: `false` when its target does not exist (ENOENT, or one of
/// `also`), any other error as it is.
fn unless_absent(r: io::Result<()>, also: &[i32]) -> io::Result<bool> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
        Err(e) if e.raw_os_error().is_some_and(|n| also.contains(&n)) => Ok(false),
        Err(e) => Err(e),
    }
}

pub(super) fn step<T>(what: impl FnOnce() -> String, r: io::Result<T>) -> Result<T, SetupError> {
    r.map_err(|source| SetupError::Step {
        step: what(),
        source,
    })
}

/// Creates `inside` (a directory, or an empty file when `file`) below `root`, refusing
/// to follow a symlink anywhere on the way: a rootfs image must not redirect a mount
/// target outside the new root.
pub(super) fn make_target(root: &Path, inside: &Path, file: bool) -> Result<PathBuf, SetupError> {
    let mut p = root.to_path_buf();
    let comps: Vec<_> = inside
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n),
            _ => None,
        })
        .collect();
    for (i, name) in comps.iter().enumerate() {
        p.push(name);
        let last = i + 1 == comps.len();
        match std::fs::symlink_metadata(&p) {
            Ok(m) if m.file_type().is_symlink() => {
                return Err(SetupError::Symlink(inside.to_path_buf()));
            }
            Ok(m) if m.is_dir() != (last && file) => {}
            Ok(_) => {
                return Err(SetupError::Step {
                    step: format!("create mount target {}", inside.display()),
                    source: io::Error::new(
                        io::ErrorKind::AlreadyExists,
                        "exists with another type",
                    ),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let r = if last && file {
                    std::fs::File::create(&p).map(drop)
                } else {
                    std::fs::DirBuilder::new().mode(0o755).create(&p)
                };
                step(|| format!("create mount target {}", inside.display()), r)?;
            }
            Err(e) => return step(|| format!("inspect {}", inside.display()), Err(e)),
        }
    }
    Ok(p)
}

/// Bind-mounts `source` at `inside` below `root` with `attrs` applied to the whole tree.
fn bind(root: &Path, source: &Path, inside: &Path, attrs: u64) -> Result<(), SetupError> {
    let is_file = !step(
        || format!("inspect bind source {}", source.display()),
        std::fs::metadata(source),
    )?
    .is_dir();
    let target = make_target(root, inside, is_file)?;
    step(
        || format!("bind {} at {}", source.display(), inside.display()),
        mount(
            Some(source),
            &target,
            None,
            libc::MS_BIND | libc::MS_REC,
            None,
        ),
    )?;
    step(
        || format!("set flags of {}", inside.display()),
        set_attr(&target, attrs, true),
    )
}

/// Attaches a detached (idmapped) mount tree the host prepared at `inside` below
/// `root`, with `attrs` added to the whole tree.
fn attach(root: &Path, tree: OwnedFd, inside: &Path, attrs: u64) -> Result<(), SetupError> {
    let is_file = !step(
        || format!("inspect mount for {}", inside.display()),
        std::fs::File::from(tree.try_clone().map_err(|source| SetupError::Step {
            step: format!("inspect mount for {}", inside.display()),
            source,
        })?)
        .metadata(),
    )?
    .is_dir();
    let target = make_target(root, inside, is_file)?;
    let c = step(|| "mount target".into(), sys::cstr(&target))?;
    let empty = c"";
    // SAFETY: `tree` is a mount fd, `empty` and `c` valid C strings; the kernel only
    // reads them.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r < 0 {
        return step(
            || format!("attach {}", inside.display()),
            Err(io::Error::last_os_error()),
        );
    }
    step(
        || format!("set flags of {}", inside.display()),
        set_attr(&target, attrs, true),
    )
}

const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// Builds the whole tree under `scratch` and returns the new root (not yet pivoted).
///
/// With `userns` (the sandbox's own user namespace and id range, as root), the
/// workspace, outputs, binds and an overlay's lower layer are attached as idmapped
/// mounts through it, so the sandbox's uid 0 (an unprivileged host id) acts as host
/// uid 0 there and only there; the overlay's upper layer belongs to the sandbox's root.
pub(super) fn build(
    plan: &SandboxPlan,
    scratch: &Path,
    userns: Option<&(OwnedFd, IdRange)>,
) -> Result<PathBuf, SetupError> {
    // Nothing we mount may propagate back to the host.
    step(
        || "make mounts private".into(),
        mount(
            None,
            Path::new("/"),
            None,
            libc::MS_REC | libc::MS_PRIVATE,
            None,
        ),
    )?;
    // Scratch tmpfs: holds the root skeleton, the generated /etc and the overlay upper
    // layer. Its pages are charged to the sandbox's memory cgroup, so an image root (whose
    // package manager writes into `/`) may grow it up to the memory limit.
    let size = match plan.rootfs {
        RootfsSource::Preinstalled => plan.limits.scratch_bytes,
        RootfsSource::Directory { .. } => plan
            .limits
            .memory_bytes
            .unwrap_or(0)
            .max(plan.limits.scratch_bytes),
    };
    let opts = format!("size={},mode=0755", size.max(1 << 20));
    tmpfs(
        scratch,
        "scratch tmpfs",
        libc::MS_NOSUID | libc::MS_NODEV,
        &opts,
    )?;
    let root = scratch.join("root");
    step(
        || "create root".into(),
        std::fs::DirBuilder::new().mode(0o755).create(&root),
    )?;

    match &plan.rootfs {
        RootfsSource::Preinstalled => preinstalled_root(plan, &root)?,
        RootfsSource::Directory { path } => {
            // Topmost first: the environment layers, then the image.
            let sources = plan.root_layers.iter().chain(std::iter::once(path));
            let mut lowers = Vec::new();
            for (i, source) in sources.enumerate() {
                lowers.push(match userns {
                    Some((ns, _)) => {
                        let name = format!("lower{i}");
                        let tree = idmapped(source, ns)?;
                        attach(scratch, tree, Path::new(&name), MOUNT_ATTR_RDONLY)?;
                        scratch.join(name)
                    }
                    None => source.clone(),
                });
            }
            let upper_parent = plan.root_upper.as_deref().unwrap_or(scratch);
            overlay_root(
                &lowers,
                upper_parent,
                plan.root_upper.is_some(),
                &root,
                userns.map(|(_, r)| *r),
                &plan.hostname,
            )?
        }
    }
    let rw = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
    let place = |source: &Path, inside: &Path, attrs: u64| match userns {
        Some((ns, _)) => attach(&root, idmapped(source, ns)?, inside, attrs),
        None => bind(&root, source, inside, attrs),
    };
    if let Some(ws) = &plan.workspace {
        place(ws, Path::new("/workspace"), rw)?;
    }
    if plan.workspace_tmpfs {
        workspace_tmpfs(plan, &root, userns.map(|(_, r)| *r))?;
    }
    if plan.user_home {
        super::home::user_home(plan, &root, userns.map(|(_, r)| *r))?;
    }
    if let Some(out) = &plan.outputs {
        place(out, Path::new("/mnt/session/outputs"), rw)?;
    }
    for b in &plan.binds {
        let attrs = if b.writable {
            rw
        } else {
            rw | MOUNT_ATTR_RDONLY
        };
        place(&b.source, &b.target, attrs)?;
    }
    proc_mount(&root)?;
    dev(&root, scratch)?;
    // The masks of `/proc` directories: an empty read-only directory of the scratch
    // tmpfs bound over each, not a tmpfs of its own (a superblock fewer each).
    let empty = scratch.join("empty");
    step(
        || "create empty dir".into(),
        std::fs::DirBuilder::new().mode(0o555).create(&empty),
    )?;
    for d in PROC_MASKED_DIRS {
        let target = root.join("proc").join(d);
        bind_over(
            &format!("mask /proc/{d}"),
            &empty,
            &target,
            false,
            // Not a directory: nothing to hide behind an empty one.
            &[libc::ENOTDIR],
        )?;
    }
    let tmp = make_target(&root, Path::new("/tmp"), false)?;
    let opts = format!("size={},mode=1777", plan.limits.tmp_bytes.max(4096));
    tmpfs(&tmp, "/tmp", libc::MS_NOSUID | libc::MS_NODEV, &opts)?;
    if plan.memory_mount {
        let memory = make_target(&root, Path::new(MEMORY_MOUNT), false)?;
        tmpfs(
            &memory,
            "/mnt/memory",
            libc::MS_NOSUID | libc::MS_NODEV,
            &opts,
        )?;
    }
    Ok(root)
}

/// [`SandboxPlan::workspace_tmpfs`]: `/workspace` as a tmpfs owned by the sandbox's root
/// (`owner`: its id range, when this process builds the tree as host root), half the
/// memory limit (its pages are charged to the sandbox's memory cgroup: a full workspace
/// is ENOSPC, not an OOM kill of the sandbox), else as large as `/tmp`.
fn workspace_tmpfs(
    plan: &SandboxPlan,
    root: &Path,
    owner: Option<IdRange>,
) -> Result<(), SetupError> {
    let target = make_target(root, Path::new("/workspace"), false)?;
    let mut opts = format!("size={},mode=0755", half_memory_or_tmp(plan));
    if let Some(r) = owner {
        opts.push_str(&format!(",uid={0},gid={0}", r.base));
    }
    tmpfs(
        &target,
        "/workspace",
        libc::MS_NOSUID | libc::MS_NODEV,
        &opts,
    )
}

/// The size of a tmpfs the sandbox works in: half the memory limit (its pages are charged
/// to it), else the size of `/tmp`; at least 1 MiB.
pub(super) fn half_memory_or_tmp(plan: &SandboxPlan) -> u64 {
    plan.limits
        .memory_bytes
        .map_or(plan.limits.tmp_bytes, |m| m / 2)
        .max(1 << 20)
}

/// Mounts a tmpfs with `flags` and `options` at `target` (`what` names it in an error).
pub(super) fn tmpfs(
    target: &Path,
    what: &str,
    flags: libc::c_ulong,
    options: &str,
) -> Result<(), SetupError> {
    step(
        || format!("mount {what}"),
        mount(
            Some(Path::new("tmpfs")),
            target,
            Some("tmpfs"),
            flags,
            Some(options),
        ),
    )
}

/// The sandbox's own `devpts` instance, with at most 128 terminals (an agent's terminal
/// sessions need a handful): the kernel
/// counts every instance's ptys against one host-wide `kernel.pty.max` (4096, of which
/// `kernel.pty.reserve` — 1024 — only the host's own instance may use), so an unbounded
/// instance let one sandbox take every pty other sandboxes and containers could get.
const DEVPTS_OPTIONS: &str = "newinstance,ptmxmode=0666,mode=0620,max=128";

/// Where [`SandboxPlan::memory_mount`] puts its tmpfs.
pub(in crate::setup) const MEMORY_MOUNT: &str = "/mnt/memory";

fn idmapped(source: &Path, userns: &OwnedFd) -> Result<OwnedFd, SetupError> {
    step(
        || {
            format!(
                "idmap {} (needs a filesystem with idmapped mounts)",
                source.display()
            )
        },
        idmap::idmapped_tree(source, userns),
    )
}

fn preinstalled_root(plan: &SandboxPlan, root: &Path) -> Result<(), SetupError> {
    // pivot_root needs the new root to be a mount point.
    step(
        || "bind root".into(),
        mount(Some(root), root, None, libc::MS_BIND, None),
    )?;
    for d in PREINSTALLED_DIRS {
        let host = Path::new("/").join(d);
        let Ok(meta) = std::fs::symlink_metadata(&host) else {
            continue; // not present on this host
        };
        if meta.file_type().is_symlink() {
            let target = step(|| format!("read link /{d}"), std::fs::read_link(&host))?;
            step(|| format!("link /{d}"), symlink(&target, root.join(d)))?;
        } else if meta.is_dir() {
            bind(
                root,
                &host,
                Path::new(d),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )?;
        }
    }
    let etc_dir = make_target(root, Path::new("/etc"), false)?;
    step(
        || "generate /etc".into(),
        etc::generate(
            &etc_dir,
            &plan.hostname,
            plan.user_home
                .then(|| etc::user_lines(root.join("bin/bash").is_file())),
        ),
    )?;
    for f in PREINSTALLED_ETC_BINDS {
        let host = Path::new("/etc").join(f);
        if host.exists() {
            bind(
                root,
                &host,
                &Path::new("/etc").join(f),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            )?;
        }
    }
    for d in ["root", "workspace", "mnt/session"] {
        make_target(root, Path::new(d), false)?;
    }
    Ok(())
}

/// The overlay's mount options. An upper dir the host keeps (an environment layer) must
/// hold only what a lower layer means by itself, whatever the host's overlay module
/// defaults: no redirects (a renamed directory is copied instead), no metacopy files (their
/// data only in the lower), no index (hard links into the work dir).
fn overlay_options(lowers: &str, upper: &Path, work: &Path, kept_upper: bool) -> String {
    let mut opts = format!(
        "lowerdir={lowers},upperdir={},workdir={}",
        upper.display(),
        work.display()
    );
    if kept_upper {
        opts.push_str(",redirect_dir=off,index=off,metacopy=off");
    }
    opts
}

/// Mounts the overlay root: `lowers` topmost first, the upper and work dirs created in
/// `upper_parent` (the scratch tmpfs, or a build's host dir).
fn overlay_root(
    lowers: &[PathBuf],
    upper_parent: &Path,
    kept_upper: bool,
    root: &Path,
    owner: Option<IdRange>,
    hostname: &str,
) -> Result<(), SetupError> {
    // Overlay options are a comma-separated list with `:`-separated lowers: a path
    // holding either (or a backslash escape) would change the mount's meaning.
    let option_safe = |path: &Path| {
        let text = path.to_string_lossy();
        if text.contains([',', ':', '\\']) {
            return Err(SetupError::Step {
                step: "mount overlay".into(),
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("overlay path {text:?} holds ',', ':' or '\\'"),
                ),
            });
        }
        Ok(text.into_owned())
    };
    option_safe(upper_parent)?;
    let lower_s = lowers
        .iter()
        .map(|l| option_safe(l))
        .collect::<Result<Vec<_>, _>>()?
        .join(":");
    let upper = upper_parent.join("upper");
    let work = upper_parent.join("work");
    for d in [&upper, &work] {
        step(
            || "create overlay dirs".into(),
            std::fs::DirBuilder::new().mode(0o755).create(d),
        )?;
        // The upper layer's root is the merged root's: the sandbox's root owns it.
        if let Some(r) = owner {
            step(
                || "chown overlay dirs".into(),
                std::os::unix::fs::chown(d, Some(r.base), Some(r.base)),
            )?;
        }
    }
    // The sandbox's resolv.conf, hostname and hosts, written into the fresh upper layer
    // (never through the image's tree: a symlink there could point anywhere on the host).
    let etc = upper.join("etc");
    step(
        || "create overlay /etc".into(),
        std::fs::DirBuilder::new().mode(0o755).create(&etc),
    )?;
    let mut made = vec![etc.clone()];
    for (name, text) in etc::network_files(hostname) {
        let path = etc.join(name);
        step(|| format!("write /etc/{name}"), std::fs::write(&path, text))?;
        made.push(path);
    }
    if let Some(r) = owner {
        for path in &made {
            step(
                || "chown overlay /etc".into(),
                std::os::unix::fs::chown(path, Some(r.base), Some(r.base)),
            )?;
        }
    }
    let opts = overlay_options(&lower_s, &upper, &work, kept_upper);
    step(
        || format!("mount overlay of {lower_s}"),
        mount(
            Some(Path::new("overlay")),
            root,
            Some("overlay"),
            libc::MS_NOSUID | libc::MS_NODEV,
            Some(&opts),
        ),
    )
}

fn proc_mount(root: &Path) -> Result<(), SetupError> {
    let p = make_target(root, Path::new("/proc"), false)?;
    // A fresh procfs: we are PID 1 of the new pid namespace, so it shows only the
    // sandbox's processes.
    step(
        || "mount /proc".into(),
        mount(
            Some(Path::new("proc")),
            &p,
            Some("proc"),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            None,
        ),
    )
}

/// `/dev` and `/dev/shm` are directories of the scratch tmpfs bound in place rather than
/// tmpfs mounts of their own: a tmpfs superblock cost ~8 µs to mount and ~5–10 µs to tear
/// down at PID 1's exit here (microbenchmark, perf). So `/dev/shm` shares the scratch tmpfs's size (the
/// scratch size; for an image root, with its upper layer).
fn dev(root: &Path, scratch: &Path) -> Result<(), SetupError> {
    let dev = make_target(root, Path::new("/dev"), false)?;
    let source = scratch.join("dev");
    step(
        || "create /dev".into(),
        std::fs::DirBuilder::new().mode(0o755).create(&source),
    )?;
    // A mount of its own over the image's `/dev`, read-only at the end (nothing can be
    // created in it), and the one mount of the sandbox whose device nodes open: every
    // writable one is nodev. The nodes are made here, by this process as host root before
    // it enters the sandbox's user namespace (which could not: CAP_MKNOD), not bound from
    // the host's `/dev`: six mounts fewer to make, and to tear down at PID 1's exit.
    step(
        || "bind /dev".into(),
        mount(Some(&source), &dev, None, libc::MS_BIND, None),
    )?;
    // SAFETY: umask(2) cannot fail; this process is single-threaded (setup stage).
    let umask = unsafe { libc::umask(0) };
    let made = DEVICES.iter().try_for_each(|(name, major, minor)| {
        step(
            || format!("create /dev/{name}"),
            sys::mknod(
                &dev.join(name),
                libc::S_IFCHR | 0o666,
                libc::makedev(*major, *minor),
            ),
        )
    });
    // SAFETY: as above; the umask this process had.
    unsafe { libc::umask(umask) };
    made?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
        ("ptmx", "pts/ptmx"),
    ] {
        step(
            || format!("link /dev/{name}"),
            symlink(target, dev.join(name)),
        )?;
    }
    let pts = dev.join("pts");
    step(|| "create /dev/pts".into(), std::fs::create_dir(&pts))?;
    step(
        || "mount /dev/pts".into(),
        mount(
            Some(Path::new("devpts")),
            &pts,
            Some("devpts"),
            libc::MS_NOSUID | libc::MS_NOEXEC,
            Some(DEVPTS_OPTIONS),
        ),
    )?;
    let shm = dev.join("shm");
    step(|| "create /dev/shm".into(), std::fs::create_dir(&shm))?;
    let shm_source = scratch.join("shm");
    step(
        || "create /dev/shm".into(),
        std::fs::DirBuilder::new()
            .mode(0o1777)
            .create(&shm_source)
            // The mode as given, whatever the umask.
            .and_then(|()| {
                std::fs::set_permissions(&shm_source, std::fs::Permissions::from_mode(0o1777))
            }),
    )?;
    step(
        || "bind /dev/shm".into(),
        mount(Some(&shm_source), &shm, None, libc::MS_BIND, None),
    )?;
    step(
        || "set flags of /dev/shm".into(),
        set_attr(&shm, SHM_ATTRS, false),
    )?;
    // `/dev` itself becomes read-only and its nodes openable (the scratch tmpfs it comes
    // from is nodev); its submounts keep their own flags.
    step(
        || "make /dev read-only".into(),
        change_attr(&dev, DEV_ATTRS, MOUNT_ATTR_NODEV, false),
    )
}

/// Binds `source` over `target` (with its submounts when `recursive`) and makes the new
/// mount (tree) read-only, nosuid, nodev and noexec; a `target` that does not exist
/// (ENOENT, or one of `absent`) is skipped. `what` names the step in an error.
fn bind_over(
    what: &str,
    source: &Path,
    target: &Path,
    recursive: bool,
    absent: &[i32],
) -> Result<(), SetupError> {
    let flags = if recursive {
        libc::MS_BIND | libc::MS_REC
    } else {
        libc::MS_BIND
    };
    let bound = step(
        || what.into(),
        unless_absent(mount(Some(source), target, None, flags, None), absent),
    )?;
    if bound {
        step(|| what.into(), set_attr(target, MASK_ATTRS, recursive))?;
    }
    Ok(())
}

/// Read-only, nosuid, nodev, noexec.
const MASK_ATTRS: u64 = MOUNT_ATTR_RDONLY | SHM_ATTRS;

/// `/dev`: read-only, nosuid, noexec (its device nodes open).
const DEV_ATTRS: u64 = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC;

/// `/dev/shm`: writable, but nosuid, nodev, noexec.
const SHM_ATTRS: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC;

/// Makes `root` the new `/` and detaches the host's tree. After this, nothing of the
/// host's filesystem is reachable by path.
pub(super) fn pivot(root: &Path) -> Result<(), SetupError> {
    step(
        || "chdir to new root".into(),
        std::env::set_current_dir(root),
    )?;
    // pivot_root(".", "."): the old root ends up stacked on top of the new one at "/",
    // and is then lazily detached (no directory for it needed in the new root).
    step(
        || "pivot_root".into(),
        sys::pivot_root(Path::new("."), Path::new(".")),
    )?;
    step(
        || "detach old root".into(),
        umount2(Path::new("."), libc::MNT_DETACH),
    )?;
    step(|| "chdir /".into(), std::env::set_current_dir("/"))
}

/// After the pivot: hide or freeze sensitive `/proc` entries, and make a preinstalled
/// root read-only.
pub(super) fn finish(plan: &SandboxPlan) -> Result<(), SetupError> {
    // Each mask is tried at once, an absent entry skipped (no stat first: that would be
    // a second lookup of every entry in this fresh /proc, where each first one is slow).
    let null = Path::new("/dev/null");
    for f in PROC_MASKED_FILES {
        let p = Path::new("/proc").join(f);
        step(
            || format!("mask /proc/{f}"),
            unless_absent(mount(Some(null), &p, None, libc::MS_BIND, None), &[]),
        )?;
    }
    for e in PROC_READONLY {
        let p = Path::new("/proc").join(e);
        bind_over(&format!("freeze /proc/{e}"), &p, &p, true, &[])?;
    }
    let root_attrs = match plan.rootfs {
        RootfsSource::Preinstalled => MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
        RootfsSource::Directory { .. } => MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
    };
    step(
        || "set flags of /".into(),
        set_attr(Path::new("/"), root_attrs, false),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_upper_dirs_overlay_makes_no_redirects_metacopy_or_index() {
        let (upper, work) = (Path::new("/b/upper"), Path::new("/b/work"));
        assert_eq!(
            overlay_options("/l1:/l0", upper, work, false),
            "lowerdir=/l1:/l0,upperdir=/b/upper,workdir=/b/work"
        );
        assert_eq!(
            overlay_options("/l0", upper, work, true),
            "lowerdir=/l0,upperdir=/b/upper,workdir=/b/work,redirect_dir=off,index=off,metacopy=off"
        );
    }
}
