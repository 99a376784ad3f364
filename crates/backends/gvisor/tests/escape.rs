//! Escape tests for the gvisor backend: the linux backend's (linux-sandbox
//! `tests/escape.rs`) that apply to a runsc sandbox, each one attack from inside that must
//! fail, run through the agent. Syscall probes use Python's ctypes from the root's
//! `/usr` (the host's, read-only), with syscall numbers from the `libc` crate. A syscall
//! reaches gVisor's kernel (the Sentry), never the host's: a call it refuses (EPERM,
//! EACCES) or does not implement (ENOSYS) is denied. Listed in SECURITY.md.
//!
//! Needs root and runsc (scripts/setup); without them the tests skip locally and fail
//! under CI=true.

use std::path::PathBuf;
use std::sync::Arc;

use omabox_backend_gvisor::{GvisorConfig, GvisorRuntime, GvisorSandboxPort, SandboxSpec};
use omabox_sandbox::SandboxPort;

fn missing() -> Option<String> {
    if omabox_backend_gvisor::locate_runsc().is_none() {
        return Some("runsc is not installed (scripts/setup installs it)".into());
    }
    (!omabox_backend_gvisor::runs_as_root()).then(|| "runsc needs root here".into())
}

struct Sandboxed {
    port: GvisorSandboxPort,
    _dir: tempfile::TempDir,
}

impl Sandboxed {
    /// A sandbox binding `spec`, or `None` (skipped) where runsc or root is missing.
    async fn start(spec: SandboxSpec) -> Option<Self> {
        if !omabox_test_support::require_capability(missing()) {
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let runtime = GvisorRuntime::new(GvisorConfig {
            runsc: omabox_backend_gvisor::locate_runsc().unwrap(),
            dir: dir.path().to_path_buf(),
            init: PathBuf::from(env!("CARGO_BIN_EXE_omabox-gvisor-init")),
            platform: "ptrace".into(),
            limits: Default::default(),
            network: Default::default(),
            test_hosts: None,
            image_root: None,
        })
        .unwrap();
        let sandbox = runtime.create_with(spec).await.unwrap();
        Some(Self {
            port: GvisorSandboxPort::new(Arc::new(sandbox)),
            _dir: dir,
        })
    }

    /// `command`'s combined output, trimmed.
    async fn sh(&self, command: &str) -> String {
        self.port
            .exec(command, Some(30_000))
            .await
            .unwrap()
            .trim()
            .to_owned()
    }

    /// Asserts `syscall(nr, args…)` is refused (EPERM, EACCES) or unimplemented (ENOSYS;
    /// ENODEV: gVisor has no such device, e.g. no perf events).
    async fn assert_denied(&self, what: &str, nr: i64, args: &[i64]) {
        let out = self.sh(&syscall_probe(nr, args)).await;
        assert!(
            ["EPERM", "EACCES", "ENOSYS", "ENODEV"].contains(&out.as_str()),
            "{what}: expected EPERM/EACCES/ENOSYS/ENODEV, got {out:?}"
        );
    }

    async fn destroy(self) {
        self.port.sandbox().destroy().await.unwrap();
    }
}

/// A Python one-liner that performs `syscall(nr, args…)` and prints `0` or the errno
/// name.
fn syscall_probe(nr: i64, args: &[i64]) -> String {
    let args: Vec<String> = args.iter().map(|a| format!("ctypes.c_long({a})")).collect();
    format!(
        "python3 -c 'import ctypes,errno; l=ctypes.CDLL(None,use_errno=True); \
         r=l.syscall(ctypes.c_long({nr}){}{}); e=ctypes.get_errno(); \
         print(0 if r>=0 else errno.errorcode[e])'",
        if args.is_empty() { "" } else { "," },
        args.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kernel_is_gvisors_and_host_processes_are_invisible() {
    let Some(sb) = Sandboxed::start(SandboxSpec::default()).await else {
        return;
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(sb.sh("uname -r").await, host.trim());
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(sb.sh("hostname").await, hostname.trim());
    // Every process the sandbox sees is its init (the agent) or this very pipeline.
    let comms = sb
        .sh("for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null")
        .await;
    for c in comms.lines() {
        assert!(
            ["init", "sh", "cat"].contains(&c),
            "unexpected process visible in the sandbox: {c:?} (all: {comms:?})"
        );
    }
    let me = std::process::id();
    let seen = sb
        .sh(&format!("test -e /proc/{me} && echo seen || echo unseen"))
        .await;
    assert_eq!(seen, "unseen");
    sb.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_files_outside_the_binds_are_unreachable_and_the_root_is_read_only() {
    let parent = tempfile::tempdir().unwrap();
    let (ws, outputs) = (parent.path().join("ws"), parent.path().join("out"));
    std::fs::create_dir(&ws).unwrap();
    std::fs::create_dir(&outputs).unwrap();
    std::fs::write(parent.path().join("outside.txt"), "host-only").unwrap();
    let spec = SandboxSpec {
        workspace: Some(ws.clone()),
        outputs: Some(outputs.clone()),
        user_home: false,
        image_root: None,
    };
    let Some(sb) = Sandboxed::start(spec).await else {
        return;
    };
    // The generated /etc: no shadow, no host accounts; no home directories.
    assert_eq!(sb.sh("test -e /etc/shadow || echo absent").await, "absent");
    let passwd = sb.sh("cat /etc/passwd").await;
    assert_eq!(passwd.lines().count(), 2, "{passwd}");
    // /home holds only the empty mount point of E2B's user's home (a tmpfs of the
    // sandbox's own when the sandbox has that user).
    assert_eq!(
        sb.sh("python3 -c 'import os; print(os.listdir(\"/home\"), os.listdir(\"/home/user\"))'")
            .await,
        "['user'] []"
    );
    // (os.listdir: Debian 12's coreutils statx a tmpfs mount point with flags this runsc
    // answers EINVAL.)
    let root = sb
        .sh("python3 -c 'import os; print(os.listdir(\"/root\"))'")
        .await;
    assert_eq!(root, "[]");
    // Nothing of the host's file system but /usr: the test's own directory is not there.
    let here = parent.path().display().to_string();
    assert_eq!(
        sb.sh(&format!("test -e {here} || echo absent")).await,
        "absent"
    );
    // The root and /usr are read-only; the workspace, outputs and /tmp are not.
    for path in ["/usr/escaped", "/etc/escaped", "/escaped"] {
        let out = sb
            .sh(&format!("(echo x > {path}) 2>/dev/null; echo rc=$?"))
            .await;
        assert!(out == "rc=1" || out == "rc=2", "{path}: {out}");
    }
    sb.sh("echo w > /workspace/w.txt; echo o > /mnt/session/outputs/o.txt; echo t > /tmp/t")
        .await;
    assert_eq!(std::fs::read_to_string(ws.join("w.txt")).unwrap(), "w\n");
    assert_eq!(
        std::fs::read_to_string(outputs.join("o.txt")).unwrap(),
        "o\n"
    );
    // Traversal and a host-path symlink resolve inside the sandbox.
    let client = sb.port.sandbox().client().await.unwrap();
    assert!(client.read_file("/workspace/../outside.txt").await.is_err());
    std::os::unix::fs::symlink(parent.path().join("outside.txt"), ws.join("link")).unwrap();
    assert!(client.read_file("/workspace/link").await.is_err());
    let _ = client.write_file("/workspace/../../escaped", "x").await;
    assert!(!parent.path().join("escaped").exists());
    assert_eq!(
        std::fs::read_to_string(parent.path().join("outside.txt")).unwrap(),
        "host-only"
    );
    sb.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounts_namespaces_modules_and_host_kernel_interfaces_are_denied() {
    let Some(sb) = Sandboxed::start(SandboxSpec::default()).await else {
        return;
    };
    // New namespaces are not in this list: gVisor's kernel makes user, mount and network
    // namespaces of its own (the Sentry's; the host kernel never sees them, SECURITY.md).
    for (what, nr, args) in [
        ("mount", libc::SYS_mount, &[0, 0, 0, 0, 0][..]),
        ("umount2", libc::SYS_umount2, &[0, 0]),
        ("pivot_root", libc::SYS_pivot_root, &[0, 0]),
        ("chroot", libc::SYS_chroot, &[0]),
        ("init_module", libc::SYS_init_module, &[0, 0, 0]),
        ("finit_module", libc::SYS_finit_module, &[0, 0, 0]),
        ("kexec_load", libc::SYS_kexec_load, &[0, 0, 0, 0]),
        ("reboot", libc::SYS_reboot, &[0, 0, 0, 0]),
        ("bpf", libc::SYS_bpf, &[0, 0, 0]),
        (
            "perf_event_open",
            libc::SYS_perf_event_open,
            &[0, 0, -1, -1, 0],
        ),
        ("iopl", libc::SYS_iopl, &[3]),
        ("ioperm", libc::SYS_ioperm, &[0, 1024, 1]),
    ] {
        sb.assert_denied(what, nr, args).await;
    }
    let out = sb.sh("mount -t tmpfs none /tmp 2>&1; echo rc=$?").await;
    assert!(!out.ends_with("rc=0"), "{out}");

    // Keyrings are gVisor's own (runsc 2024 implements keyctl/add_key in its kernel; 2022's
    // refused them): a key the sandbox adds to its user's keyring is never in the host's.
    let description = format!("omabox-escape-probe-{}", std::process::id());
    let added = sb
        .sh(&format!(
            "python3 -c 'import ctypes,errno; l=ctypes.CDLL(None,use_errno=True); \
             r=l.syscall(ctypes.c_long({}), b\"user\", b\"{description}\", b\"x\", \
             ctypes.c_long(1), ctypes.c_long(-4)); \
             print(\"added\" if r>=0 else errno.errorcode[ctypes.get_errno()])'",
            libc::SYS_add_key
        ))
        .await;
    assert!(
        ["added", "EPERM", "EACCES", "ENOSYS"].contains(&added.as_str()),
        "{added}"
    );
    let host_keys = std::fs::read_to_string("/proc/keys").unwrap_or_default();
    assert!(
        !host_keys.contains(&description),
        "the sandbox's key ({added}) reached the host kernel: {host_keys}"
    );
    sb.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_sockets_device_nodes_and_new_privileges_are_denied() {
    let Some(sb) = Sandboxed::start(SandboxSpec::default()).await else {
        return;
    };
    let out = sb
        .sh("python3 -c '
import socket, errno
for fam, kind in ((socket.AF_INET, socket.SOCK_RAW), (socket.AF_PACKET, socket.SOCK_RAW)):
    try:
        socket.socket(fam, kind, 0); print(\"OPENED\")
    except OSError as e: print(errno.errorcode[e.errno])
'")
        .await;
    for line in out.lines() {
        assert!(
            [
                "EPERM",
                "EACCES",
                "EAFNOSUPPORT",
                "ESOCKTNOSUPPORT",
                "EPROTONOSUPPORT"
            ]
            .contains(&line),
            "{out}"
        );
    }
    // A device node in the host's directories is refused; in gVisor's own tmpfs runsc
    // 20221219 makes one (it does not check CAP_MKNOD), but it names gVisor's devices,
    // never the host's: the host's first disk (block 8:0) cannot be opened through it.
    let out = sb
        .sh("python3 -c '
import os, stat, errno
for path, kind, dev in ((\"/workspace/null\", stat.S_IFCHR, (1, 3)), (\"/tmp/sda\", stat.S_IFBLK, (8, 0))):
    try:
        os.mknod(path, kind | 0o666, os.makedev(*dev))
    except OSError as e:
        print(path, \"mknod\", errno.errorcode[e.errno]); continue
    try:
        os.close(os.open(path, os.O_RDONLY)); print(path, \"OPENED\")
    except OSError as e: print(path, \"open\", errno.errorcode[e.errno])
'")
        .await;
    let mut lines = out.lines();
    let workspace = lines.next().unwrap_or_default();
    assert!(
        workspace == "/workspace/null mknod EPERM" || workspace == "/workspace/null mknod EACCES",
        "{out}"
    );
    let tmp = lines.next().unwrap_or_default();
    assert!(
        tmp.starts_with("/tmp/sda mknod E") || tmp.starts_with("/tmp/sda open E"),
        "{out}"
    );
    // No new privileges; none of the capabilities an escape needs.
    let status = sb
        .sh("grep -E '^(NoNewPrivs|CapEff|CapBnd)' /proc/self/status")
        .await;
    // PR_GET_NO_NEW_PRIVS (gVisor's /proc/self/status has no NoNewPrivs line).
    let no_new_privs = sb
        .sh("python3 -c 'import ctypes; print(ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))'")
        .await;
    assert_eq!(no_new_privs, "1");
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:\t"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .unwrap();
    // CAP_SYS_ADMIN 21, CAP_SYS_PTRACE 19, CAP_SYS_MODULE 16, CAP_NET_ADMIN 12,
    // CAP_NET_RAW 13, CAP_MKNOD 27, CAP_SYS_RAWIO 17 (linux/capability.h).
    for cap in [21, 19, 16, 12, 13, 27, 17] {
        assert_eq!(bounding & (1 << cap), 0, "capability {cap} in {status}");
    }
    sb.destroy().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_nothing_behind() {
    let parent = tempfile::tempdir().unwrap();
    let ws = parent.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let spec = SandboxSpec {
        workspace: Some(ws.clone()),
        outputs: None,
        user_home: false,
        image_root: None,
    };
    let Some(sb) = Sandboxed::start(spec).await else {
        return;
    };
    sb.sh("sleep 300 >/dev/null 2>&1 &").await;
    let dir = sb.port.sandbox().dir().to_path_buf();
    let id = sb.port.sandbox().id().to_owned();
    sb.destroy().await;
    assert!(!dir.exists());
    // The caller's workspace stays; no process of the sandbox does.
    assert!(ws.is_dir());
    assert_eq!(processes_mentioning(&id), 0);
}

/// Processes whose command line names `marker`.
fn processes_mentioning(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}
