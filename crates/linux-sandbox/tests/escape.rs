//! Escape tests (issue item 7): each test is one attack from inside a sandbox that must
//! fail, run through the real agent protocol. Listed in SECURITY.md at the repository
//! root. Syscall-level probes use Python's ctypes from the preinstalled rootfs (the
//! host's /usr), with syscall numbers taken from the `libc` crate so they match the
//! architecture.

mod common;

use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::time::Duration;

use omabox_sandbox_net::netns;

use common::{Sandboxed, can_run, test_plan};

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

/// Asserts the probe printed EPERM or EACCES.
async fn assert_denied(sb: &Sandboxed, what: &str, nr: i64, args: &[i64]) {
    let out = sb.ok(&syscall_probe(nr, args)).await;
    assert!(
        out == "EPERM" || out == "EACCES",
        "{what}: expected EPERM/EACCES, got {out:?}"
    );
}

async fn start() -> Option<Sandboxed> {
    if !can_run() {
        return None;
    }
    Some(Sandboxed::start(test_plan()).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pid1_is_the_agent_and_host_processes_are_invisible() {
    let Some(mut sb) = start().await else { return };
    let comm = sb.ok("cat /proc/1/comm").await;
    assert!(comm.starts_with("omabox-sandbox"), "pid 1 is {comm:?}");
    // Every process the sandbox sees is the agent or part of this very pipeline.
    let comms = sb
        .ok("for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null")
        .await;
    for c in comms.lines() {
        assert!(
            c.starts_with("omabox-sandbox") || ["sh", "cat"].contains(&c),
            "unexpected process visible in the sandbox: {c:?} (all: {comms:?})"
        );
    }
    // The host test process: neither visible nor signallable by its host pid.
    let host_pid = std::process::id();
    let out = sb.sh(&format!("kill -0 {host_pid}")).await;
    assert!(
        !out.success(),
        "the sandbox could signal host pid {host_pid}"
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostname_differs_from_the_host() {
    let Some(mut sb) = start().await else { return };
    let inside = sb.ok("cat /proc/sys/kernel/hostname").await;
    assert_eq!(inside, "sandbox");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_ne!(inside, host.trim());
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_loopback_and_host_loopback_services_are_unreachable() {
    let Some(mut sb) = start().await else { return };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let ifaces = sb
        .ok("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
        .await;
    assert_eq!(ifaces, "lo", "interfaces inside: {ifaces:?}");
    let out = sb
        .ok(&format!(
            "python3 -c 'import socket,errno\ntry:\n socket.create_connection((\"127.0.0.1\",{port}),timeout=2); print(\"CONNECTED\")\nexcept OSError as e: print(errno.errorcode.get(e.errno,e))'"
        ))
        .await;
    assert_ne!(out, "CONNECTED", "reached the host's loopback service");
    // Loopback itself works inside (it is up).
    let lo = sb
        .ok("python3 -c 'import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); s.listen(); c=socket.create_connection(s.getsockname()); print(\"ok\")'")
        .await;
    assert_eq!(lo, "ok");
    drop(listener);
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workspace_and_outputs_writes_land_in_the_host_dirs() {
    if !can_run() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.workspace = Some(ws.path().to_path_buf());
    plan.outputs = Some(outputs.path().to_path_buf());
    let mut sb = Sandboxed::start(plan).await;
    assert_eq!(sb.ok("pwd").await, "/workspace");
    sb.ok("echo hello > /workspace/a.txt && echo out > /mnt/session/outputs/b.txt")
        .await;
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "hello\n"
    );
    assert_eq!(
        std::fs::read_to_string(outputs.path().join("b.txt")).unwrap(),
        "out\n"
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_secrets_and_files_outside_the_binds_are_unreachable() {
    let Some(mut sb) = start().await else { return };
    // A canary on the host's /tmp and /root must not be visible.
    let canary = format!("/tmp/omabox-canary-{}", std::process::id());
    std::fs::write(&canary, "secret").unwrap();
    let _cleanup = Remove(canary.clone().into());
    for script in [
        "cat /etc/shadow".to_owned(),
        format!("cat {canary}"),
        "ls -A /root | grep .".to_owned(),
        "ls /home".to_owned(),
        "cat /etc/machine-id".to_owned(),
        "ls /etc/ssh".to_owned(),
        // The sandbox's PID 1 is non-dumpable: its environ, exe and fds are closed to
        // sandbox processes (so the host binary behind /proc/1/exe cannot be opened).
        "cat /proc/1/environ".to_owned(),
        "cat /proc/1/exe > /dev/null".to_owned(),
        "readlink /proc/1/fd/0".to_owned(),
        "cat /proc/1/fd/0 > /dev/null".to_owned(),
        "ls /proc/1/root/".to_owned(),
    ] {
        let out = sb.sh(&script).await;
        assert!(
            !out.success(),
            "{script:?} succeeded inside the sandbox: {}",
            out.combined()
        );
    }
    // /etc holds the generated passwd, not the host's users.
    let passwd = sb.ok("cut -d: -f1 /etc/passwd | tr '\\n' ' '").await;
    assert_eq!(passwd, "root nobody");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_outside_the_writable_places_fail() {
    let Some(mut sb) = start().await else { return };
    for path in [
        "/usr/bin/omabox-x",
        "/etc/passwd",
        "/x",
        "/dev/x",
        "/proc/sys/kernel/hostname",
    ] {
        let out = sb.sh(&format!("echo x > {path}")).await;
        assert!(!out.success(), "writing {path} succeeded");
    }
    sb.ok("echo x > /tmp/ok && echo x > /dev/shm/ok").await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sensitive_proc_entries_are_masked() {
    let Some(mut sb) = start().await else { return };
    // Each entry is either absent from this kernel or masked (empty).
    // The host's keystroke timing (`interrupts`), softirqs, free-page layout and kernel
    // command line too.
    for entry in [
        "kcore",
        "keys",
        "timer_list",
        "sched_debug",
        "kallsyms",
        "interrupts",
        "softirqs",
        "buddyinfo",
        "zoneinfo",
        "cmdline",
    ] {
        let size = sb
            .ok(&format!(
                "if [ -e /proc/{entry} ]; then wc -c < /proc/{entry}; else echo 0; fi"
            ))
            .await;
        assert_eq!(size, "0", "/proc/{entry} is not masked");
    }
    let out = sb.sh("echo 1 > /proc/sysrq-trigger").await;
    assert!(!out.success(), "/proc/sysrq-trigger writable");
    // Masked directories (where this kernel has them) show nothing and take nothing.
    for dir in ["acpi", "scsi", "asound", "pressure"] {
        let shown = sb
            .ok(&format!(
                "if [ -d /proc/{dir} ]; then ls -A /proc/{dir} | wc -l; else echo 0; fi"
            ))
            .await;
        assert_eq!(shown, "0", "/proc/{dir} is not masked");
        let out = sb
            .sh(&format!("[ -d /proc/{dir} ] && mkdir /proc/{dir}/x"))
            .await;
        assert!(!out.success(), "/proc/{dir} writable");
    }
    sb.destroy();
}

/// `/dev` and `/dev/shm` are bound from the scratch tmpfs, each with its own mount
/// flags: `/dev` read-only, neither executable nor with devices or setuid.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dev_and_dev_shm_carry_their_mount_flags() {
    let Some(mut sb) = start().await else { return };
    // `/dev` is the one mount whose device nodes open (its own, made by the setup stage):
    // read-only, so nothing can be created in it; every writable mount is nodev.
    for (mount, flags) in [
        ("/dev", &["ro", "nosuid", "noexec"][..]),
        ("/dev/shm", &["rw", "nosuid", "nodev", "noexec"]),
        ("/proc/acpi", &["ro", "nosuid", "nodev", "noexec"]),
        ("/tmp", &["rw", "nosuid", "nodev"]),
    ] {
        let options = sb
            .ok(&format!(
                "awk '$5 == \"{mount}\" {{ print $6 }}' /proc/self/mountinfo | tail -n 1"
            ))
            .await;
        if mount == "/proc/acpi" && options.is_empty() {
            continue; // no ACPI on this kernel
        }
        let options: Vec<&str> = options.split(',').collect();
        for flag in flags {
            assert!(options.contains(flag), "{mount}: {options:?} lacks {flag}");
        }
    }
    // The nodes are the kernel's null, zero, full, random, urandom and tty, and nothing
    // else is a device there.
    let nodes = sb
        .ok("find /dev -xdev \\( -type c -o -type b \\) | sort; stat -c '%n %t:%T %a' /dev/null /dev/zero /dev/full /dev/random /dev/urandom /dev/tty")
        .await;
    assert_eq!(
        nodes,
        "/dev/full\n/dev/null\n/dev/random\n/dev/tty\n/dev/urandom\n/dev/zero\n\
         /dev/null 1:3 666\n/dev/zero 1:5 666\n/dev/full 1:7 666\n\
         /dev/random 1:8 666\n/dev/urandom 1:9 666\n/dev/tty 5:0 666",
        "{nodes}"
    );
    // Executing from /dev/shm fails even for a copied binary.
    let code = sb
        .ok("cp /bin/true /dev/shm/t && chmod +x /dev/shm/t && { /dev/shm/t 2>/dev/null; echo $?; }")
        .await;
    assert_eq!(code, "126", "a binary in /dev/shm ran (exit {code})");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_processes_have_no_privileges() {
    let Some(mut sb) = start().await else { return };
    let status = sb
        .ok("grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '")
        .await;
    for line in status.lines() {
        let (k, v) = line.split_once(':').unwrap();
        let v = v.trim();
        match k {
            "NoNewPrivs" => assert_eq!(v, "1"),
            "Seccomp" => assert_eq!(v, "2"),
            _ => assert_eq!(v, "0000000000000000", "{k} = {v}"),
        }
    }
    let cgroup = sb.ok("cat /proc/self/cgroup").await;
    for line in cgroup.lines() {
        assert!(line.ends_with(":/"), "cgroup namespace not rooted: {line}");
    }
    let report = sb.sandbox.as_ref().unwrap().report().unwrap().clone();
    assert!(report.seccomp);
    assert_eq!(report.bounding_caps, 0);
    if report.landlock_abi > 0 {
        assert!(
            report.landlock_enforced,
            "landlock available but not enforced"
        );
    }
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_bomb_is_oom_killed_inside_only() {
    let Some(mut sb) = start().await else { return };
    // 128 MiB limit; try to touch 1 GiB.
    let out = sb
        .sh("exec python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'")
        .await;
    assert!(
        out.exit.signal.as_deref() == Some("SIGKILL") || out.exit.code == Some(137),
        "memory bomb ended with {:?}",
        out.exit
    );
    // The agent survived and the sandbox still works.
    assert_eq!(sb.ok("echo alive").await, "alive");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fork_bomb_is_contained_by_the_pids_limit() {
    let Some(mut sb) = start().await else { return };
    // pids.max = 64: forking stops with EAGAIN well before that many children.
    let out = sb
        .ok("python3 -c '
import os, signal, time, errno
kids = []
try:
    while len(kids) < 10000:
        pid = os.fork()
        if pid == 0:
            time.sleep(60); os._exit(0)
        kids.append(pid)
    print(\"UNBOUNDED\", len(kids))
except OSError as e:
    print(errno.errorcode[e.errno], len(kids))
for k in kids: os.kill(k, signal.SIGKILL)
for k in kids: os.waitpid(k, 0)
'")
        .await;
    let (err, n) = out.split_once(' ').unwrap();
    assert_eq!(err, "EAGAIN", "fork bomb: {out}");
    assert!(
        n.parse::<u32>().unwrap() < 64,
        "fork bomb made {n} processes"
    );
    assert_eq!(sb.ok("echo alive").await, "alive");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filling_tmp_is_bounded() {
    let Some(mut sb) = start().await else { return };
    // /tmp is an 8 MiB tmpfs.
    let out = sb
        .sh("dd if=/dev/zero of=/tmp/fill bs=1M count=64 2>&1; stat -c %s /tmp/fill")
        .await;
    let size: u64 = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(size <= 8 << 20, "/tmp grew to {size} bytes");
    assert!(
        out.combined().contains("No space left"),
        "{}",
        out.combined()
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausting_fds_is_bounded() {
    let Some(mut sb) = start().await else { return };
    let out = sb
        .ok("python3 -c '
import errno, resource
fs = []
try:
    while len(fs) < 100000: fs.append(open(\"/dev/null\"))
    print(\"UNBOUNDED\", len(fs))
except OSError as e:
    print(errno.errorcode[e.errno], len(fs), resource.getrlimit(resource.RLIMIT_NOFILE)[1])
'")
        .await;
    let parts: Vec<&str> = out.split(' ').collect();
    assert_eq!(parts[0], "EMFILE", "{out}");
    assert!(parts[1].parse::<u32>().unwrap() <= 256, "{out}");
    assert_eq!(parts[2], "256", "hard limit: {out}");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mount_umount_pivot_root_and_chroot_are_denied() {
    let Some(mut sb) = start().await else { return };
    let (tmp, root) = (0x2f746d70_i64, 0); // args do not matter: the call is refused first
    assert_denied(&sb, "mount", libc::SYS_mount, &[0, 0, 0, 0, 0]).await;
    assert_denied(&sb, "umount2", libc::SYS_umount2, &[0, 0]).await;
    assert_denied(&sb, "pivot_root", libc::SYS_pivot_root, &[0, 0]).await;
    assert_denied(&sb, "chroot", libc::SYS_chroot, &[root]).await;
    assert_denied(&sb, "fsopen", libc::SYS_fsopen, &[tmp, 0]).await;
    assert_denied(&sb, "open_tree", libc::SYS_open_tree, &[-100, 0, 0]).await;
    // And the tools, for good measure.
    let out = sb.sh("mount -t tmpfs none /tmp").await;
    assert!(!out.success());
    let out = sb.sh("umount -l /proc").await;
    assert!(!out.success());
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loading_a_kernel_module_is_denied() {
    let Some(mut sb) = start().await else { return };
    assert_denied(&sb, "init_module", libc::SYS_init_module, &[0, 0, 0]).await;
    assert_denied(&sb, "finit_module", libc::SYS_finit_module, &[0, 0, 0]).await;
    assert_denied(&sb, "delete_module", libc::SYS_delete_module, &[0, 0]).await;
    assert_denied(&sb, "kexec_load", libc::SYS_kexec_load, &[0, 0, 0, 0]).await;
    assert_denied(&sb, "reboot", libc::SYS_reboot, &[0, 0, 0, 0]).await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyctl_is_denied() {
    let Some(mut sb) = start().await else { return };
    // KEYCTL_GET_KEYRING_ID of the session keyring.
    assert_denied(&sb, "keyctl", libc::SYS_keyctl, &[0, -3, 0]).await;
    assert_denied(&sb, "add_key", libc::SYS_add_key, &[0, 0, 0, 0, 0]).await;
    assert_denied(&sb, "request_key", libc::SYS_request_key, &[0, 0, 0, 0]).await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bpf_is_denied() {
    let Some(mut sb) = start().await else { return };
    assert_denied(&sb, "bpf", libc::SYS_bpf, &[0, 0, 0]).await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn perf_event_open_is_denied() {
    let Some(mut sb) = start().await else { return };
    assert_denied(
        &sb,
        "perf_event_open",
        libc::SYS_perf_event_open,
        &[0, 0, -1, -1, 0],
    )
    .await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ptrace_of_another_process_is_denied() {
    let Some(mut sb) = start().await else { return };
    let victim = sb.ok("sleep 30 >/dev/null 2>&1 & echo $!").await;
    let victim: i64 = victim.parse().unwrap();
    assert_denied(&sb, "ptrace attach", libc::SYS_ptrace, &[16, victim, 0, 0]).await;
    assert_denied(&sb, "ptrace attach pid 1", libc::SYS_ptrace, &[16, 1, 0, 0]).await;
    assert_denied(
        &sb,
        "process_vm_readv",
        libc::SYS_process_vm_readv,
        &[victim, 0, 0, 0, 0, 0],
    )
    .await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_and_packet_sockets_are_denied() {
    let Some(mut sb) = start().await else { return };
    let (af_packet, af_inet) = (libc::AF_PACKET as i64, libc::AF_INET as i64);
    let sock_raw = libc::SOCK_RAW as i64;
    assert_denied(
        &sb,
        "AF_PACKET",
        libc::SYS_socket,
        &[af_packet, sock_raw, 0x0300],
    )
    .await;
    assert_denied(
        &sb,
        "AF_PACKET dgram",
        libc::SYS_socket,
        &[af_packet, 2, 0x0300],
    )
    .await;
    assert_denied(
        &sb,
        "SOCK_RAW icmp",
        libc::SYS_socket,
        &[af_inet, sock_raw, 1],
    )
    .await;
    assert_denied(
        &sb,
        "SOCK_RAW|CLOEXEC",
        libc::SYS_socket,
        &[af_inet, sock_raw | libc::SOCK_CLOEXEC as i64, 255],
    )
    .await;
    sb.destroy();
}

#[cfg(target_arch = "x86_64")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x86_segment_descriptors_and_io_ports_are_out_of_reach() {
    // modify_ldt: per-process segment descriptors, a long line of kernel bugs; iopl and
    // ioperm: raw I/O ports.
    let Some(mut sb) = start().await else { return };
    assert_denied(&sb, "modify_ldt read", libc::SYS_modify_ldt, &[0, 0, 0]).await;
    assert_denied(&sb, "modify_ldt write", libc::SYS_modify_ldt, &[1, 0, 16]).await;
    assert_denied(&sb, "iopl", libc::SYS_iopl, &[3]).await;
    assert_denied(&sb, "ioperm", libc::SYS_ioperm, &[0, 1, 1]).await;
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creating_device_nodes_is_denied() {
    let Some(mut sb) = start().await else { return };
    let out = sb
        .ok("python3 -c '
import os, stat, errno
for path in (\"/tmp/null\", \"/dev/shm/sda\", \"/dev/sda\", \"/workspace/null\"):
    try:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3)); print(\"CREATED\")
    except OSError as e: print(errno.errorcode[e.errno])
'")
        .await;
    for line in out.lines() {
        assert!(
            line == "EPERM" || line == "EACCES" || line == "EROFS",
            "mknod: {out}"
        );
    }
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_namespaces_are_denied() {
    let Some(mut sb) = start().await else { return };
    let newuser = libc::CLONE_NEWUSER as i64;
    assert_denied(&sb, "unshare(CLONE_NEWUSER)", libc::SYS_unshare, &[newuser]).await;
    assert_denied(
        &sb,
        "unshare(CLONE_NEWNS)",
        libc::SYS_unshare,
        &[libc::CLONE_NEWNS as i64],
    )
    .await;
    assert_denied(&sb, "setns", libc::SYS_setns, &[0, 0]).await;
    // clone(CLONE_NEWUSER) directly (SIGCHLD as exit signal); a child would print.
    assert_denied(
        &sb,
        "clone(CLONE_NEWUSER)",
        libc::SYS_clone,
        &[newuser | 17, 0, 0, 0, 0],
    )
    .await;
    let out = sb.sh("unshare -U -r true").await;
    assert!(!out.success(), "unshare -U worked");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_traversal_through_the_agent_stays_inside() {
    if !can_run() {
        return;
    }
    let parent = tempfile::tempdir().unwrap();
    let ws = parent.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    std::fs::write(parent.path().join("outside.txt"), "host-only").unwrap();
    let mut plan = test_plan();
    plan.workspace = Some(ws.clone());
    let mut sb = Sandboxed::start(plan).await;
    // `..` in a read path: resolves inside the sandbox, where the host file does not exist.
    assert!(
        sb.client
            .read_file("/workspace/../outside.txt")
            .await
            .is_err()
    );
    assert!(sb.client.read_file("../outside.txt").await.is_err());
    // An absolute path reaches the sandbox's generated file, never the host's.
    let passwd = sb.client.read_file("/etc/passwd").await.unwrap();
    assert!(!passwd.contains(":1000:"), "host passwd leaked: {passwd}");
    // A symlink in the workspace to a host path resolves inside the sandbox.
    std::os::unix::fs::symlink(parent.path().join("outside.txt"), ws.join("link")).unwrap();
    assert!(sb.client.read_file("/workspace/link").await.is_err());
    // Writes through `..` land inside the sandbox (its /tmp), never next to the host dir.
    let _ = sb
        .client
        .write_file("/workspace/../../tmp/escaped", "x")
        .await;
    let _ = sb.client.write_file("../escaped", "x").await;
    assert!(!parent.path().join("escaped").exists());
    // tar restore with a `..` entry: refused or confined; the host dir is untouched.
    let mut archive = Vec::new();
    {
        let mut b = tar_header("../escaped-tar", 1);
        b.extend_from_slice(b"x");
        b.resize(1024, 0);
        archive.extend_from_slice(&b);
        archive.resize(archive.len() + 1024, 0);
    }
    let _ = sb.client.tar_in_bytes("/workspace/sub", archive).await;
    assert!(!parent.path().join("escaped-tar").exists());
    assert!(!ws.join("escaped-tar").exists());
    assert_eq!(
        std::fs::read_to_string(parent.path().join("outside.txt")).unwrap(),
        "host-only"
    );
    sb.destroy();
}

/// A ustar header for a regular file (raw, so `..` names are not sanitized away).
fn tar_header(name: &str, size: u64) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..108].copy_from_slice(b"0000644\0");
    h[108..116].copy_from_slice(b"0000000\0");
    h[116..124].copy_from_slice(b"0000000\0");
    h[124..136].copy_from_slice(format!("{size:011o}\0").as_bytes());
    h[136..148].copy_from_slice(b"00000000000\0");
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|b| *b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_nothing_behind() {
    let Some(mut sb) = start().await else { return };
    sb.ok("sleep 60 >/dev/null 2>&1 & sleep 60 >/dev/null 2>&1 & echo started")
        .await;
    sb.destroy(); // asserts: no process, cgroup dir, state dir or mount left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_from_a_serialized_identity_without_the_handle() {
    if !can_run() {
        return;
    }
    let rt = common::runtime();
    let sandbox = tokio::task::spawn_blocking(move || rt.start(&test_plan()))
        .await
        .unwrap()
        .unwrap();
    let json = serde_json::to_string(sandbox.identity()).unwrap();
    let pid = sandbox.pid();
    // Lose the handle without running its teardown, as a crashed host would.
    std::mem::forget(sandbox);
    let identity: omabox_linux_sandbox::SandboxIdentity = serde_json::from_str(&json).unwrap();
    assert!(identity.is_alive());
    let first = identity.destroy(Duration::from_secs(10)).unwrap();
    assert!(first.killed);
    // We are still the parent of the forgotten init: reap the zombie like an init would.
    // SAFETY: waitpid on our own child with a valid status pointer.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    let second = identity.destroy(Duration::from_secs(10)).unwrap();
    assert!(!second.killed, "second destroy must be a no-op");
    common::assert_gone(&identity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_networking_config_is_refused_before_anything_is_created() {
    if !can_run() {
        return;
    }
    let mut plan = test_plan();
    plan.network.config = omabox_contract::networking::NetworkingConfig::Limited {
        allowed_hosts: vec!["169.254.169.254".into()],
        allow_package_managers: false,
        allow_mcp_servers: false,
    };
    let err = common::runtime().start(&plan).unwrap_err();
    let text = std::error::Error::source(&err).unwrap().to_string();
    assert!(
        text.starts_with("networking: ") && text.contains("169.254.169.254"),
        "{text}"
    );
    assert!(
        matches!(err, omabox_linux_sandbox::StartError::Plan(_)),
        "refused at validation, before any state dir: {err:?}"
    );
}

struct Remove(std::path::PathBuf);

impl Drop for Remove {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Set in the re-executed test process that runs a sandbox from a terminal.
const TTY_PROBE_OUT: &str = "OMABOX_TEST_TTY_PROBE_OUT";

/// Inside the sandbox: open `/dev/tty`, take its foreground process group, read a line.
const TTY_PROBE: &str = r#"python3 - <<'PY'
import errno, fcntl, os, select, struct, termios
try:
    fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
except OSError as e:
    print("open:" + errno.errorcode[e.errno])
    raise SystemExit
print("open:OK")
try:
    fcntl.ioctl(fd, termios.TIOCSPGRP, struct.pack("i", os.getpgrp()))
    print("tiocspgrp:OK")
except OSError as e:
    print("tiocspgrp:" + errno.errorcode[e.errno])
r, _, _ = select.select([fd], [], [], 2)
print("read:" + (os.read(fd, 100).decode(errors="replace").strip() if r else "nothing"))
PY"#;

/// The test process is re-executed in a session of its own whose controlling terminal
/// is a pty the test created (as if a user ran omabox from a terminal); that process
/// starts a sandbox and probes the terminal from inside while the test types a secret.
#[test]
fn the_host_terminal_does_not_reach_the_sandbox() {
    if let Some(out) = std::env::var_os(TTY_PROBE_OUT) {
        return tty_probe_from_a_terminal(std::path::Path::new(&out));
    }
    if !can_run() {
        return;
    }
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two fds into the given ints; the other pointers may be null.
    let r = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two fresh fds that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let out = tempfile::NamedTempFile::new().unwrap();
    let slave_fd = slave.as_raw_fd();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "the_host_terminal_does_not_reach_the_sandbox",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(TTY_PROBE_OUT, out.path())
    .stdin(slave.try_clone().unwrap())
    .stdout(slave.try_clone().unwrap())
    .stderr(slave.try_clone().unwrap());
    // SAFETY: setsid and ioctl are async-signal-safe raw syscalls on an inherited fd.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setsid() < 0 || libc::ioctl(slave_fd, libc::TIOCSCTTY, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    // Only the child may hold the terminal, so reading the master ends when it exits.
    drop((cmd, slave));
    // Type a secret, and keep draining the terminal so the child never blocks on it.
    let mut typist = std::fs::File::from(master);
    use std::io::{Read, Write};
    typist.write_all(b"typed-secret\n").unwrap();
    let drain = std::thread::spawn(move || {
        let mut all = Vec::new();
        let mut buf = [0u8; 4096];
        while let Ok(n) = typist.read(&mut buf) {
            if n == 0 {
                break;
            }
            all.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&all).into_owned()
    });
    let status = child.wait().unwrap();
    let transcript = drain.join().unwrap();
    assert!(status.success(), "probe process failed: {transcript}");
    let report = std::fs::read_to_string(out.path()).unwrap();
    assert!(
        report.contains("open:ENXIO"),
        "the sandbox opened the host terminal: {report}\n{transcript}"
    );
    assert!(!report.contains("typed-secret"), "{report}");
    assert!(report.contains("init-tty:0\n"), "{report}");
    assert!(report.contains("same-session:false\n"), "{report}");
}

/// The re-executed side of `the_host_terminal_does_not_reach_the_sandbox`.
fn tty_probe_from_a_terminal(out: &std::path::Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut sb = Sandboxed::start(test_plan()).await;
        let probe = sb.sh(TTY_PROBE).await;
        // The sandbox init as the host sees it: its session and controlling terminal.
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", sb.identity.pid)).unwrap();
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        // SAFETY: getsid(0) only queries the caller.
        let own_session = unsafe { libc::getsid(0) };
        let report = format!(
            "{}{}init-tty:{}\nsame-session:{}\n",
            String::from_utf8_lossy(&probe.stdout),
            String::from_utf8_lossy(&probe.stderr),
            fields[4],
            fields[3] == own_session.to_string(),
        );
        std::fs::write(out, report).unwrap();
        sb.destroy();
    });
}

/// Creates a socket of each (name, family, type, protocol) inside and prints
/// `name:OK` or `name:<errno>` per line.
fn socket_probe(cases: &[(&str, i32, i32, i32)]) -> String {
    let cases: Vec<String> = cases
        .iter()
        .map(|(n, f, t, p)| format!("(\"{n}\",{f},{t},{p})"))
        .collect();
    format!(
        "python3 -c 'import ctypes,errno\nl=ctypes.CDLL(None,use_errno=True)\n\
         for n,f,t,p in [{}]:\n r=l.socket(f,t,p); e=ctypes.get_errno()\n \
         print(n+\":\"+(\"OK\" if r>=0 else errno.errorcode[e]))'",
        cases.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_families_are_an_allow_list() {
    let Some(mut sb) = start().await else { return };
    let (stream, dgram, raw) = (libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_RAW);
    let allowed = [
        ("unix", libc::AF_UNIX, stream, 0),
        ("inet-tcp", libc::AF_INET, stream, 0),
        ("inet-udp", libc::AF_INET, dgram, libc::IPPROTO_UDP),
        ("inet6", libc::AF_INET6, stream, libc::IPPROTO_TCP),
        ("netlink-route", libc::AF_NETLINK, raw, libc::NETLINK_ROUTE),
    ];
    let out = sb.ok(&socket_probe(&allowed)).await;
    for (name, ..) in allowed {
        assert!(out.contains(&format!("{name}:OK")), "{name}: {out}");
    }
    let refused = [
        ("vsock", libc::AF_VSOCK, stream, 0),
        ("packet", libc::AF_PACKET, dgram, 0),
        ("bluetooth", libc::AF_BLUETOOTH, raw, 0),
        ("alg", libc::AF_ALG, libc::SOCK_SEQPACKET, 0),
        ("key", libc::AF_KEY, raw, 2),
        ("appletalk", libc::AF_APPLETALK, dgram, 0),
        ("can", libc::AF_CAN, raw, 1),
        ("tipc", libc::AF_TIPC, libc::SOCK_RDM, 0),
        ("rds", libc::AF_RDS, libc::SOCK_SEQPACKET, 0),
        ("xdp", libc::AF_XDP, raw, 0),
        (
            "uevent",
            libc::AF_NETLINK,
            dgram,
            libc::NETLINK_KOBJECT_UEVENT,
        ),
        ("audit", libc::AF_NETLINK, raw, libc::NETLINK_AUDIT),
        ("nl-generic", libc::AF_NETLINK, raw, libc::NETLINK_GENERIC),
        ("sock-packet", libc::AF_INET, 10, 0),
        ("sctp", libc::AF_INET, stream, libc::IPPROTO_SCTP),
        ("inet6-raw", libc::AF_INET6, raw, libc::IPPROTO_ICMPV6),
    ];
    let out = sb.ok(&socket_probe(&refused)).await;
    for (name, ..) in refused {
        assert!(
            out.contains(&format!("{name}:EPERM")) || out.contains(&format!("{name}:EAFNOSUPPORT")),
            "{name} was not refused: {out}"
        );
    }
    // socketpair: unix only.
    let pair = sb
        .ok("python3 -c 'import socket; socket.socketpair(); print(\"ok\")'")
        .await;
    assert_eq!(pair, "ok");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_wide_kernel_resources_are_denied_or_bounded() {
    let Some(mut sb) = start().await else { return };
    // AIO contexts come from the host-wide fs.aio-max-nr: no io_setup at all.
    let ctx = sb.ok(&syscall_probe(libc::SYS_io_setup, &[1, 0])).await;
    assert_eq!(ctx, "ENOSYS", "io_setup");
    for (what, nr, args) in [
        ("io_uring_setup", libc::SYS_io_uring_setup, vec![1, 0]),
        ("memfd_secret", libc::SYS_memfd_secret, vec![0]),
    ] {
        assert_eq!(sb.ok(&syscall_probe(nr, &args)).await, "ENOSYS", "{what}");
    }
    for (what, nr) in [
        ("userfaultfd", libc::SYS_userfaultfd),
        ("fanotify_init", libc::SYS_fanotify_init),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
    ] {
        assert_denied(&sb, what, nr, &[0, 0, 0, 0, 0]).await;
    }
    // SysV IPC and mqueue limits of the sandbox's own IPC namespace; the host's are
    // untouched.
    let inside = sb
        .ok("cat /proc/sys/kernel/shmmni /proc/sys/kernel/msgmni /proc/sys/fs/mqueue/queues_max; cut -f4 /proc/sys/kernel/sem")
        .await;
    assert_eq!(
        inside.split_whitespace().collect::<Vec<_>>(),
        ["256", "256", "64", "128"]
    );
    let host_shmmni = std::fs::read_to_string("/proc/sys/kernel/shmmni").unwrap();
    assert_ne!(
        host_shmmni.trim(),
        "256",
        "the host's own limit was changed"
    );
    // Per-user counters: small rlimits, no real-time priority.
    let limits = sb
        .ok("grep -E '^Max (pending signals|msgqueue size|realtime priority) ' /proc/self/limits | awk '{print ($NF ~ /^([0-9]+|unlimited)$/) ? $(NF-1) : $(NF-2)}'")
        .await;
    assert_eq!(
        limits.split_whitespace().collect::<Vec<_>>(),
        ["1024", "819200", "0"]
    );
    sb.destroy();
}

/// The sandbox's CPU quota as its cgroup holds it (quota, period), `None` without a cpu
/// cgroup of its own (v1).
fn cgroup_cpu_quota(cgroup: &omabox_linux_sandbox::CgroupPaths) -> Option<(String, String)> {
    let dirs = &cgroup.dirs;
    if cgroup.unified {
        let max = std::fs::read_to_string(dirs[0].join("cpu.max")).unwrap();
        let (q, p) = max.trim().split_once(' ').unwrap();
        return Some((q.to_owned(), p.to_owned()));
    }
    let cpu = dirs.iter().find(|d| d.join("cpu.cfs_quota_us").exists())?;
    let read = |f: &str| {
        std::fs::read_to_string(cpu.join(f))
            .unwrap()
            .trim()
            .to_owned()
    };
    Some((read("cpu.cfs_quota_us"), read("cpu.cfs_period_us")))
}

/// How many CPUs the host can ever have (the kernel's `possible` list).
fn possible_cpus() -> u64 {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    list.trim()
        .split(',')
        .map(|part| part.rsplit('-').next().unwrap().parse::<u64>().unwrap() + 1)
        .max()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_quota_below_the_hosts_cpus_is_in_the_sandboxs_cgroup() {
    if !can_run() {
        return;
    }
    // Half a CPU: less than any host has.
    let mut plan = test_plan();
    plan.limits.cpu = Some(omabox_linux_sandbox::CpuLimit::millicpus(500));
    let mut sb = Sandboxed::start(plan).await;
    assert_eq!(
        cgroup_cpu_quota(&sb.identity.cgroup),
        Some(("50000".to_owned(), "100000".to_owned()))
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_quota_of_every_possible_cpu_joins_no_v1_cpu_cgroup() {
    if !can_run() {
        return;
    }
    // As many CPUs as the host can ever have: a quota that limits nothing.
    let mut plan = test_plan();
    plan.limits.cpu = Some(omabox_linux_sandbox::CpuLimit::millicpus(
        possible_cpus() * 1000,
    ));
    let mut sb = Sandboxed::start(plan).await;
    let cgroup = sb.identity.cgroup.clone();
    if cgroup.unified {
        // v2: one directory, the (no-op) quota written as asked.
        assert!(cgroup_cpu_quota(&cgroup).is_some());
    } else {
        assert_eq!(cgroup_cpu_quota(&cgroup), None, "{:?}", cgroup.dirs);
        // The memory and pids hierarchies stay: they hold the limits and are how
        // teardown finds every process of the sandbox.
        for file in ["memory.limit_in_bytes", "pids.max"] {
            assert!(
                cgroup.dirs.iter().any(|d| d.join(file).exists()),
                "no {file} in {:?}",
                cgroup.dirs
            );
        }
        let pid = sb.ok("echo $$").await;
        assert!(!pid.trim().is_empty());
        assert!(
            !cgroup.tasks().is_empty(),
            "the sandbox's processes are tracked"
        );
    }
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_buffers_count_against_the_sandboxs_memory() {
    let Some(mut sb) = start().await else { return };
    // 128 MiB limit. Each loopback connection nobody reads holds up to ~4 MiB of kernel
    // buffers; uncharged (cgroup v1 without a socket limit), 100 of them pinned ~390 MiB
    // of host memory outside the limit and counted against the host-wide TCP pool.
    let out = sb
        .python(
            r#"
import socket
ls = socket.socket(); ls.bind(("127.0.0.1", 0)); ls.listen(128)
held, queued, chunk = [], 0, b"x" * 65536
for _ in range(100):
    c = socket.create_connection(ls.getsockname()); s, _ = ls.accept()
    c.setblocking(False)
    while True:
        try: queued += c.send(chunk)
        except OSError: break
    held.append((c, s))
print(queued)
"#,
        )
        .await;
    let queued: u64 = out.trim().parse().expect("bytes queued");
    assert!(
        queued < 192 << 20,
        "{} MiB of socket buffers held under a 128 MiB limit",
        queued >> 20
    );
    if !sb.identity.cgroup.unified {
        let memory = sb
            .identity
            .cgroup
            .dirs
            .iter()
            .find(|d| d.join("memory.limit_in_bytes").exists())
            .expect("a memory controller dir");
        if let Ok(limit) = std::fs::read_to_string(memory.join("memory.kmem.tcp.limit_in_bytes")) {
            assert_eq!(limit.trim(), (128u64 << 20).to_string());
        }
    }
    assert_eq!(sb.ok("echo alive").await, "alive");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_huge_page_pool_is_out_of_reach() {
    let Some(mut sb) = start().await else { return };
    // The hugetlb pool is host-wide and bounded by no cgroup the sandbox is in: every way
    // to it is refused with EPERM (the kernel's own answer with an empty pool would be
    // ENOMEM, or success for the memfd). Ordinary mappings still work.
    let out = sb
        .python(
            r#"
import ctypes, errno, mmap, os
libc = ctypes.CDLL(None, use_errno=True)
said = []
try:
    mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x40000)
    said.append("mmap:ok")
except OSError as e:
    said.append("mmap:" + errno.errorcode[e.errno])
try:
    os.memfd_create("x", os.MFD_HUGETLB)
    said.append("memfd:ok")
except OSError as e:
    said.append("memfd:" + errno.errorcode[e.errno])
r = libc.shmget(0, 2 << 20, 0o1000 | 0o600 | 0o4000)
said.append("shmget:" + ("ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]))
m = mmap.mmap(-1, 2 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m[0] = 1
said.append("plain:ok")
print(" ".join(said))
"#,
        )
        .await;
    assert_eq!(out, "mmap:EPERM memfd:EPERM shmget:EPERM plain:ok");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_take_the_hosts_ptys() {
    let Some(mut sb) = start().await else { return };
    // Every devpts instance draws on one host-wide pool (`kernel.pty.max`); the sandbox's
    // own instance stops at 128, where an unbounded one gave it all it had fds for.
    let out = sb
        .python(
            r#"
import errno, os
fds = []
try:
    while len(fds) < 1000:
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
    print(len(fds), "none")
except OSError as e:
    print(len(fds), errno.errorcode[e.errno])
"#,
        )
        .await;
    let (n, err) = out.split_once(' ').unwrap();
    assert_eq!((n.parse::<u32>().unwrap(), err), (128, "ENOSPC"), "{out}");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_stall_host_opens_with_a_lease() {
    if !can_run() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.workspace = Some(ws.path().to_path_buf());
    let mut sb = Sandboxed::start(plan).await;
    // A lease on a workspace file (the sandbox owns it through the idmapped bind), with
    // SIGIO ignored, held every host open of that file for `fs.lease-break-time`.
    let out = sb
        .python(
            r#"
import errno, fcntl, os
with open("/workspace/leased", "w") as f:
    f.write("hi")
fd = os.open("/workspace/leased", os.O_RDONLY)
try:
    fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
    print("leased")
except OSError as e:
    print(errno.errorcode[e.errno])
"#,
        )
        .await;
    assert_eq!(out, "EPERM");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_cannot_change_a_ptys_line_discipline() {
    let Some(mut sb) = start().await else { return };
    // TIOCSETD on its own pty would make the kernel load a line discipline's module
    // (`dev.tty.ldisc_autoload`): N_HDLC (13), N_GSM0710 (21), even N_TTY (0).
    let out = sb
        .python(
            r#"
import errno, fcntl, os, struct
fd = os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY)
said = []
for d in (13, 21, 0):
    try:
        fcntl.ioctl(fd, 0x5423, struct.pack("i", d))
        said.append("ok")
    except OSError as e:
        said.append(errno.errorcode[e.errno])
print(" ".join(said))
"#,
        )
        .await;
    assert_eq!(out, "EPERM EPERM EPERM");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_only_proc_files_are_unreadable() {
    let Some(mut sb) = start().await else { return };
    for f in [
        "kpageflags",
        "kpagecount",
        "kpagecgroup",
        "slabinfo",
        "vmallocinfo",
        "pagetypeinfo",
        "iomem",
        "ioports",
        "config.gz",
        "modules",
        "kmsg",
    ] {
        let out = sb.sh(&format!("head -c 64 /proc/{f} | wc -c")).await;
        let n = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        assert!(n == "0" || n.is_empty(), "/proc/{f}: read {n} bytes");
    }
    sb.destroy();
}

/// Sets the mode bits of a file in every way a mode reaches the kernel, as Python can.
const SETUID_PROBE: &str = r##"python3 - <<'PY'
import ctypes, errno, os
l = ctypes.CDLL(None, use_errno=True)
def attempt(name, f):
    try:
        f()
        print(name + ":OK")
    except OSError as e:
        print(name + ":" + errno.errorcode[e.errno])
open("/workspace/plain", "w").write("#!/bin/sh\nid -u\n")
os.chmod("/workspace/plain", 0o755)
attempt("chmod-suid", lambda: os.chmod("/workspace/plain", 0o4755))
attempt("chmod-sgid", lambda: os.chmod("/workspace/plain", 0o2755))
fd = os.open("/workspace/plain", os.O_RDONLY)
attempt("fchmod-suid", lambda: os.fchmod(fd, 0o4755))
attempt("open-suid", lambda: os.close(os.open("/workspace/created", os.O_CREAT | os.O_WRONLY, 0o4755)))
attempt("mkdir-sgid", lambda: os.mkdir("/workspace/dir", 0o2775))
attempt("mknod-suid", lambda: os.mknod("/workspace/fifo", 0o4644 | 0o010000))
def openat2():
    r = l.syscall(437, -100, b"/workspace/o2", b"\0" * 24, 24)
    if r < 0:
        raise OSError(ctypes.get_errno(), "openat2")
attempt("openat2", openat2)
attempt("chmod-plain", lambda: os.chmod("/workspace/plain", 0o750))
PY"##;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_cannot_leave_setuid_or_setgid_files_in_host_dirs() {
    if !can_run() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.workspace = Some(ws.path().to_path_buf());
    let mut sb = Sandboxed::start(plan).await;
    let out = sb.ok(SETUID_PROBE).await;
    for refused in [
        "chmod-suid",
        "chmod-sgid",
        "fchmod-suid",
        "open-suid",
        "mkdir-sgid",
        "mknod-suid",
    ] {
        assert!(
            out.contains(&format!("{refused}:EPERM")),
            "{refused} was not refused: {out}"
        );
    }
    assert!(out.contains("openat2:ENOSYS"), "{out}");
    assert!(out.contains("chmod-plain:OK"), "{out}");
    // A tarball with setuid/setgid members is extracted without those bits.
    let mut tar = tar_member("suid-tool", 0o4755, b"#!/bin/sh\n");
    tar.extend(tar_member("sgid-tool", 0o2755, b"#!/bin/sh\n"));
    tar.extend([0u8; 1024]);
    sb.client
        .tar_in_bytes("/workspace", tar)
        .await
        .expect("tar in");
    // A real binary the sandbox tries to make setuid (its owner on the host is root:
    // the workspace is an idmapped mount).
    sb.sh("cp /usr/bin/id /workspace/id-copy; chmod u+s /workspace/id-copy")
        .await;
    // Live state of the sandbox is not reachable by other host users.
    use std::os::unix::process::CommandExt;
    let runtime_dir = std::path::Path::new(common::TEST_RUNTIME_DIR);
    let nobody_ls = std::process::Command::new("ls")
        .arg(sb.identity.state_dir.as_os_str())
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        !nobody_ls.status.success(),
        "a host user listed the state dir"
    );
    let mode = std::fs::metadata(runtime_dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "runtime dir mode {mode:o}");
    sb.destroy();
    // From the host: nothing the sandbox left is setuid or setgid.
    use std::os::unix::fs::PermissionsExt;
    let mut seen = 0;
    for entry in walk(ws.path()) {
        let mode = std::fs::symlink_metadata(&entry)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o6000, 0, "{} has mode {mode:o}", entry.display());
        seen += 1;
    }
    assert!(seen >= 3, "the sandbox wrote its files: {seen}");
    // From a host user's side: running what the sandbox left gains nothing.
    std::fs::set_permissions(ws.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let copy = ws.path().join("id-copy");
    assert!(copy.exists(), "the sandbox copied the binary");
    let ran = std::process::Command::new(&copy)
        .arg("-u")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&ran.stdout).trim(), "65534");
}

fn tar_member(name: &str, mode: u32, body: &[u8]) -> Vec<u8> {
    let mut h = tar::Header::new_ustar();
    h.set_path(name).unwrap();
    h.set_size(body.len() as u64);
    h.set_mode(mode);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    let mut v = h.as_bytes().to_vec();
    v.extend_from_slice(body);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&p));
        }
        out.push(p);
    }
    out
}

/// The `Uid:`/`Gid:` lines of a host process: (real, effective, saved, fs) each.
fn host_ids_of(pid: i32) -> (Vec<u32>, Vec<u32>) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap()
            .split_whitespace()
            .map(|n| n.parse().unwrap())
            .collect()
    };
    (ids("Uid:"), ids("Gid:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_sandbox_runs_as_its_own_unprivileged_host_ids() {
    if !can_run() {
        return;
    }
    let (mut a, mut b) = tokio::join!(Sandboxed::start(test_plan()), Sandboxed::start(test_plan()));
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let mut bases = Vec::new();
    for sb in [&a, &b] {
        let base = sb.identity.id_base.expect("an id range as root");
        assert!(base >= omabox_linux_sandbox::idmap::FIRST_BASE);
        // Inside: uid 0 of a namespace mapping 65536 ids onto the range.
        let map = sb.ok("cat /proc/self/uid_map /proc/self/gid_map").await;
        let lines: Vec<Vec<&str>> = map
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines.len(), 2, "{map}");
        for l in &lines {
            assert_eq!(l, &["0", &base.to_string(), "65536"], "{map}");
        }
        assert_eq!(sb.ok("id -u; id -g").await, "0\n0");
        // From the host: the agent (PID 1) and a command it runs have only range ids.
        let (uids, gids) = host_ids_of(sb.identity.pid);
        assert!(
            uids.iter().chain(&gids).all(|id| *id == base),
            "{uids:?} {gids:?}"
        );
        let groups = sb.ok("cat /proc/self/status | grep ^Groups:").await;
        assert_eq!(
            groups.trim(),
            "Groups:",
            "supplementary groups left: {groups}"
        );
        // No host account uses the range.
        for line in passwd.lines() {
            let id: u32 = line.split(':').nth(2).unwrap().parse().unwrap();
            assert!(!(base..base + 65536).contains(&id), "{line}");
        }
        bases.push(base);
    }
    assert_ne!(bases[0], bases[1], "two live sandboxes share an id range");
    let slot = |base: u32| {
        std::path::Path::new(omabox_linux_sandbox::idmap::SLOTS_DIR)
            .join(((base - omabox_linux_sandbox::idmap::FIRST_BASE) / 65536).to_string())
    };
    assert!(slot(bases[0]).exists());
    a.destroy();
    b.destroy();
    assert!(
        !slot(bases[0]).exists() && !slot(bases[1]).exists(),
        "ranges not freed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_user_kernel_counters_are_not_host_roots() {
    let Some(mut sb) = start().await else { return };
    // Take every inotify instance the sandbox's user may have and hold them.
    let mut holder = sb
        .client
        .spawn(omabox_agent::client::ExecRequest::shell(
            "exec python3 -c 'import ctypes,sys,time\nl=ctypes.CDLL(None)\nfds=[l.inotify_init() for _ in range(100000)]\nprint(sum(f>=0 for f in fds)); sys.stdout.flush(); time.sleep(600)'",
        ))
        .await
        .unwrap();
    let mut stdout = holder.stdout.take().unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    use tokio::io::AsyncReadExt;
    while stdout.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
        line.push(byte[0]);
    }
    let held: usize = String::from_utf8_lossy(&line).parse().unwrap();
    let max: usize = std::fs::read_to_string("/proc/sys/fs/inotify/max_user_instances")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(held > 0 && held <= max, "held {held} of {max}");
    // Host root (this test) can still create one: the sandbox's count is its own uid's.
    // SAFETY: inotify_init1 takes flags only; the fd is closed right away.
    let fd = unsafe { libc::inotify_init1(libc::IN_CLOEXEC) };
    assert!(
        fd >= 0,
        "host root cannot create an inotify instance: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: closes the fd just created.
    unsafe { libc::close(fd) };
    holder.kill("SIGKILL").unwrap();
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn syscalls_newer_than_the_filter_are_enosys() {
    let Some(mut sb) = start().await else { return };
    // open_tree_attr (6.15), file_getattr/file_setattr (6.17), and numbers no kernel has
    // yet: never reached, whatever this kernel offers.
    for nr in [467i64, 468, 469, 470, 500, 1000] {
        let out = sb.ok(&syscall_probe(nr, &[0, 0, 0, 0, 0])).await;
        assert_eq!(out, "ENOSYS", "syscall {nr}");
    }
    // The newest known ones still reach the kernel (which answers for itself).
    let out = sb.ok(&syscall_probe(libc::SYS_mseal, &[0, 0, 0])).await;
    assert_ne!(out, "ENOSYS", "mseal");
    assert_denied(&sb, "quotactl_fd", libc::SYS_quotactl_fd, &[0, 0, 0, 0]).await;
    sb.destroy();
}

/// Issue 12's enforced path, its base: a sandbox's namespace has no route out, and the
/// only way out is a socket the host bound inside it (a listener on a loopback address,
/// the DNS stub's UDP socket). The sandbox can neither squat a privileged port next to
/// them nor reach any other address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_host_owned_sockets_lead_out_of_the_namespace() {
    let Some(mut sb) = start().await else { return };
    let identity = sb.sandbox.as_ref().unwrap().identity().clone();
    let pidfd = identity.pidfd().unwrap();
    let listener = netns::listen_tcp(pidfd.as_fd(), "127.0.0.1:80".parse().unwrap()).unwrap();
    let accepted = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    });
    sb.ok("python3 -c 'import socket; s=socket.create_connection((\"127.0.0.1\",80),timeout=5); s.sendall(b\"through the host\"); s.close()'")
        .await;
    assert_eq!(accepted.join().unwrap(), "through the host");

    let udp = netns::bind_udp(pidfd.as_fd(), "127.0.0.53:53".parse().unwrap()).unwrap();
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    sb.ok("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b\"query\", (\"127.0.0.53\",53))'")
        .await;
    let mut buf = [0u8; 64];
    let (n, _) = udp.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"query");

    let errno_of = |code: &str| {
        format!(
            "python3 -c 'import socket,errno\ntry:\n {code}\n print(\"DONE\")\nexcept OSError as e: print(errno.errorcode[e.errno])'"
        )
    };
    // No privileged port for the sandbox, so no squatting next to the host's listeners.
    let bind = sb
        .ok(&errno_of("s=socket.socket(); s.bind((\"127.0.0.2\",443))"))
        .await;
    assert_eq!(bind, "EACCES");
    // No route anywhere but loopback, for IPv4 and IPv6.
    for target in ["(\"198.18.0.1\",80)", "(\"2001:db8::1\",80)"] {
        let family = if target.contains(':') {
            "AF_INET6"
        } else {
            "AF_INET"
        };
        let out = sb
            .ok(&errno_of(&format!(
                "s=socket.socket(socket.{family}); s.settimeout(5); s.connect({target})"
            )))
            .await;
        assert!(
            out == "ENETUNREACH" || out == "EADDRNOTAVAIL",
            "{target}: {out}"
        );
    }
    sb.destroy();
}
