//! The OCI bundle of one sandbox (`config.json`) and the shared read-only root it uses.
//!
//! The root is a directory of ours: the host's `/usr` bound read-only (with the merged-usr
//! links `/bin`, `/lib`, `/lib64`, `/sbin`), an `/etc` holding only what we write into it
//! (accounts, `resolv.conf` naming the host's DNS stub, `hosts`, the public CA bundle),
//! a tmpfs `/tmp`, the sandbox's own `/workspace` bound read-write, the Session outputs at
//! `/mnt/session/outputs` when given, and the init binary at `/.omabox/init`. Never: expose
//! the host's `/etc`, `/root`, `/home` or omabox's data directory to a sandbox; write JSON
//! by string formatting (paths are serde strings).

use std::path::{Path, PathBuf};

use omabox_agent::account;
use serde_json::{Value, json};

use crate::GvisorError;

/// Where the init binary appears in the sandbox.
pub const INIT_PATH: &str = "/.omabox/init";
/// The sandbox's workspace.
pub const WORKSPACE: &str = "/workspace";
/// Where the Session outputs directory appears, when the sandbox has one.
pub const OUTPUTS: &str = "/mnt/session/outputs";
/// The CA bundle of the default root (a copy of the host's public one, so HTTPS works).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// The host's CA bundle the default root copies (absent: the root has none).
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Names resolve through the host's DNS stub, bound at 127.0.0.1:53 in the sandbox's own
/// network namespace (networking other than `none`; under `none` nothing answers).
const RESOLV_CONF: &str = "nameserver 127.0.0.1\noptions ndots:0\n";
const HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";

/// The accounts a sandbox knows (the agent reads them for `user`/`owner`).
const PASSWD: &str =
    "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
/// E2B's default user, whose home (a tmpfs of the sandbox's own, owned by it) a sandbox
/// with [`Layout::user_home`] has.
pub use omabox_agent::account::{USER_HOME, USER_ID as USER_UID};

/// The directory beside the generated root with the accounts of E2B's user
/// (`passwd`, `group`).
pub fn accounts_dir(root: &Path) -> PathBuf {
    root.with_file_name("accounts")
}

/// Creates (idempotently) the shared root directory under `dir`.
pub fn prepare_root(dir: &Path) -> Result<PathBuf, GvisorError> {
    let root = dir.join("rootfs");
    let io = |what: &str, e| GvisorError::Io {
        what: format!("{what} in {}", root.display()),
        source: e,
    };
    for sub in [
        "usr",
        "etc",
        "tmp",
        "workspace",
        "proc",
        "dev",
        "sys",
        "root",
        ".omabox",
        "home/user",
        "mnt/session/outputs",
        "etc/ssl/certs",
    ] {
        std::fs::create_dir_all(root.join(sub)).map_err(|e| io("creating a directory", e))?;
    }
    // Each file is written whole under a temporary name and renamed into place: another
    // process of this backend may be starting a sandbox on this root right now.
    write_whole(&root.join(".omabox/init"), b"").map_err(|e| io("the init mount point", e))?;
    for (link, target) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        let path = root.join(link);
        if std::fs::symlink_metadata(&path).is_err() {
            std::os::unix::fs::symlink(target, &path).map_err(|e| io("a usr link", e))?;
        }
    }
    write_whole(&root.join("etc/passwd"), PASSWD.as_bytes()).map_err(|e| io("etc/passwd", e))?;
    let accounts = accounts_dir(&root);
    std::fs::create_dir_all(&accounts).map_err(|e| io("creating the accounts", e))?;
    // The accounts of a sandbox with E2B's user (bound over the generated ones).
    let passwd = format!("{PASSWD}{}\n", account::passwd_line("/bin/sh"));
    let group = format!("{GROUP}{}\n", account::group_line());
    write_whole(&accounts.join("passwd"), passwd.as_bytes()).map_err(|e| io("the accounts", e))?;
    write_whole(&accounts.join("group"), group.as_bytes()).map_err(|e| io("the accounts", e))?;
    write_whole(&root.join("etc/group"), GROUP.as_bytes()).map_err(|e| io("etc/group", e))?;
    write_whole(&root.join("etc/resolv.conf"), RESOLV_CONF.as_bytes())
        .map_err(|e| io("etc/resolv.conf", e))?;
    write_whole(&root.join("etc/hosts"), HOSTS.as_bytes()).map_err(|e| io("etc/hosts", e))?;
    // Public certificates (not secret; absent is fine): HTTPS clients in the sandbox need
    // them, and credential egress appends its CA to a copy.
    if let Ok(bundle) = std::fs::read(HOST_CA_BUNDLE) {
        write_whole(&root.join(CA_BUNDLE.trim_start_matches('/')), &bundle)
            .map_err(|e| io("the CA bundle", e))?;
    }
    // The dynamic loader's cache of the host's /usr (not secret; absent is fine).
    if let Ok(cache) = std::fs::read("/etc/ld.so.cache") {
        write_whole(&root.join("etc/ld.so.cache"), &cache).map_err(|e| io("ld.so.cache", e))?;
    }
    Ok(root)
}

/// Writes `bytes` to `path` so that a reader sees the old file or the new one, never a part.
fn write_whole(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = path.with_file_name(format!(
        ".{name}.{}.{}",
        std::process::id(),
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::write(&temp, bytes)
        .and_then(|()| std::fs::rename(&temp, path))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&temp);
        })
}

/// What one sandbox's bundle is made of.
#[derive(Debug, Clone, Copy)]
pub struct Layout<'a> {
    /// The root: the shared one of [`prepare_root`], or an image's rootfs.
    pub root: &'a Path,
    /// Whether `root` is an image's (its own `/usr` and `/etc`): then the host's `/usr` is
    /// not bound, and `resolv_conf` is bound at `/etc/resolv.conf`.
    pub image: bool,
    /// The generated `resolv.conf` naming the host's DNS stub (for an image root).
    pub resolv_conf: &'a Path,
    /// The host directory bound read-write at [`WORKSPACE`].
    pub workspace: &'a Path,
    /// The host directory bound read-write at [`OUTPUTS`], when the sandbox has one.
    pub outputs: Option<&'a Path>,
    /// The init binary.
    pub init: &'a Path,
    /// The sandbox's host name.
    pub hostname: &'a str,
    /// Whether runsc runs with `--network host` in a namespace omabox made: the spec then
    /// names no network namespace (runsc would make a fresh one), so the sandbox is in
    /// runsc's own, ours.
    pub host_network: bool,
    /// E2B's user `user` (uid [`USER_UID`]) with a writable [`USER_HOME`] (a tmpfs of the
    /// sandbox's own), its accounts bound over the generated `/etc/passwd` and `/etc/group`
    /// (not over an image's).
    pub user_home: bool,
}

/// `config.json` for a sandbox laid out as `layout` says.
pub fn config(layout: &Layout<'_>) -> Value {
    let Layout {
        root,
        image,
        resolv_conf,
        workspace,
        outputs,
        init,
        hostname,
        host_network,
        user_home,
    } = *layout;
    let bind = |dest: &str, source: &Path, ro: bool| {
        json!({
            "destination": dest,
            "type": "bind",
            "source": source,
            "options": if ro { json!(["rbind", "ro"]) } else { json!(["rbind", "rw"]) },
        })
    };
    let mut config = json!({
        "ociVersion": "1.0.0",
        "process": {
            "terminal": false,
            "user": { "uid": 0, "gid": 0 },
            "args": [INIT_PATH],
            "env": [
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME=/root",
            ],
            "cwd": WORKSPACE,
            "capabilities": caps(),
            "noNewPrivileges": true,
        },
        // An image root is writable through the overlay in the sandbox's memory
        // (`Runsc::overlay_root`); the host's directory never is.
        "root": { "path": root, "readonly": !image },
        "hostname": hostname,
        "mounts": [
            { "destination": "/proc", "type": "proc", "source": "proc" },
            { "destination": "/dev", "type": "tmpfs", "source": "tmpfs" },
            { "destination": "/tmp", "type": "tmpfs", "source": "tmpfs" },
            { "destination": "/root", "type": "tmpfs", "source": "tmpfs" },
            bind("/usr", Path::new("/usr"), true),
            bind(WORKSPACE, workspace, false),
            bind(INIT_PATH, init, true),
        ],
        "linux": {
            "namespaces": [
                { "type": "pid" }, { "type": "network" }, { "type": "ipc" },
                { "type": "uts" }, { "type": "mount" },
            ],
        },
    });
    if let Some(mounts) = config.get_mut("mounts").and_then(Value::as_array_mut) {
        if let Some(outputs) = outputs {
            mounts.push(bind(OUTPUTS, outputs, false));
        }
        if user_home {
            mounts.push(json!({
                "destination": USER_HOME, "type": "tmpfs", "source": "tmpfs",
                "options": [format!("uid={USER_UID}"), format!("gid={USER_UID}"), "mode=0755"],
            }));
            if !image {
                let accounts = accounts_dir(root);
                mounts.push(bind("/etc/passwd", &accounts.join("passwd"), true));
                mounts.push(bind("/etc/group", &accounts.join("group"), true));
            }
        }
        if image {
            // The image's own /usr; its /etc with our resolv.conf (the stub's address).
            mounts.retain(|m| m["destination"] != "/usr");
            mounts.push(bind("/etc/resolv.conf", resolv_conf, true));
        }
    }
    if host_network
        && let Some(namespaces) = config
            .pointer_mut("/linux/namespaces")
            .and_then(Value::as_array_mut)
    {
        namespaces.retain(|ns| ns["type"] != "network");
        // runsc gives a `--network host` sandbox no user namespace of its own: its Sentry
        // would be root with the spec's capabilities over the host's user namespace (the
        // network namespace's owner). A user namespace of the spec's puts it (and the
        // gofer) in one; uid 0 maps to 0 so the gofer still opens the bundle's root-owned
        // directories, while its capabilities hold only in that namespace (no binding
        // below 1024 in ours, no other host privilege).
        namespaces.push(json!({ "type": "user" }));
        if let Some(linux) = config.get_mut("linux").and_then(Value::as_object_mut) {
            let map = json!([{ "containerID": 0, "hostID": 0, "size": 1 }]);
            linux.insert("uidMappings".into(), map.clone());
            linux.insert("gidMappings".into(), map);
        }
    }
    config
}

/// The parent of every sandbox's cgroup (under each controller on cgroup v1).
pub const CGROUP_PARENT: &str = "/omabox-gvisor";

/// `config` with the sandbox's own cgroup (`CGROUP_PARENT/<id>`, made and removed by runsc)
/// and `limits` as its resources.
pub fn with_cgroup(mut config: Value, id: &str, limits: &crate::GvisorLimits) -> Value {
    const PERIOD_US: u64 = 100_000;
    let mut resources = serde_json::Map::new();
    if let Some(bytes) = limits.memory_bytes {
        resources.insert("memory".into(), json!({ "limit": bytes }));
    }
    if let Some(pids) = limits.pids {
        resources.insert("pids".into(), json!({ "limit": pids }));
    }
    if let Some(milli) = limits.millicpus {
        let quota = (milli.saturating_mul(PERIOD_US) / 1000).max(1000);
        resources.insert("cpu".into(), json!({ "quota": quota, "period": PERIOD_US }));
    }
    if let Some(linux) = config.get_mut("linux").and_then(Value::as_object_mut) {
        linux.insert("cgroupsPath".into(), json!(format!("{CGROUP_PARENT}/{id}")));
        linux.insert("resources".into(), Value::Object(resources));
    }
    config
}

/// The memory cgroup of sandbox `id` (cgroup v1's memory controller, else v2's one tree).
pub fn memory_cgroup(id: &str) -> std::path::PathBuf {
    let parent = CGROUP_PARENT.trim_start_matches('/');
    let v1 = Path::new("/sys/fs/cgroup/memory").join(parent).join(id);
    if v1.is_dir() {
        v1
    } else {
        Path::new("/sys/fs/cgroup").join(parent).join(id)
    }
}

/// OOM kills counted in the memory cgroup of sandbox `id` (cgroup v1 `memory.oom_control`,
/// else v2 `memory.events`); 0 when it cannot be read (gone, or no such controller).
pub(crate) fn oom_kills(id: &str) -> u64 {
    let cgroup = memory_cgroup(id);
    ["memory.oom_control", "memory.events"]
        .iter()
        .find_map(|file| std::fs::read_to_string(cgroup.join(file)).ok())
        .and_then(|text| {
            text.lines()
                .find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
        })
        .unwrap_or(0)
}

/// Removes the cgroups of sandbox `id` (each controller's on cgroup v1, the one on v2) that
/// runsc left, once nothing runs in them; absent ones are fine.
pub fn remove_cgroups(id: &str) {
    let parent = CGROUP_PARENT.trim_start_matches('/');
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut dirs: Vec<std::path::PathBuf> = controllers
        .flatten()
        .map(|c| c.path().join(parent).join(id))
        .collect();
    dirs.push(Path::new("/sys/fs/cgroup").join(parent).join(id));
    for dir in dirs {
        remove_cgroup(&dir);
    }
}

/// For a sandbox whose owner is gone (reap), before its cgroups are removed: SIGKILL to
/// every host process whose command line names it (its runsc, gofer, sandbox and
/// subreaper; `id` is `omabox-gv-` and 32 random hex digits), until none is left or
/// [`CGROUP_EMPTY_WAIT`] passed (a killed process stays until its parent reaps it). A
/// runsc of a dead owner still restoring or tearing the sandbox down would otherwise make
/// its cgroups again after reap removed them. An owner's own destroy needs none of this:
/// it waited for its runsc, and its subreaper reaps the rest.
pub(crate) fn end_processes_naming(id: &str) {
    if !id.starts_with("omabox-gv-") {
        return;
    }
    let deadline = std::time::Instant::now() + CGROUP_EMPTY_WAIT;
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        let mut found = false;
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|name| name.parse::<i32>().ok())
                .filter(|pid| *pid != me)
            else {
                continue;
            };
            // Zombies have an empty command line: only live processes match.
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if cmdline
                .split(|b| *b == 0)
                .any(|arg| arg.windows(id.len()).any(|w| w == id.as_bytes()))
            {
                found = true;
                // SAFETY: kill(2) with plain integers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        if !found || std::time::Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// How long a sandbox cgroup may take to empty once its processes are killed: a killed
/// process whose parent is gone stays in it as a zombie until PID 1 reaps it, which on this
/// project's machines happens about every two seconds.
const CGROUP_EMPTY_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// rmdir of one sandbox cgroup, never a recursive removal (a cgroup directory's files are
/// the kernel's). A cgroup still holding processes (a reap right after its owner died,
/// while the sandbox's processes are still ending) gets them killed, as nothing but the
/// sandbox's processes is ever in it, and the rmdir retried for [`CGROUP_EMPTY_WAIT`].
fn remove_cgroup(dir: &Path) {
    let deadline = std::time::Instant::now() + CGROUP_EMPTY_WAIT;
    loop {
        match std::fs::remove_dir(dir) {
            Err(e)
                if e.raw_os_error() == Some(libc::EBUSY)
                    && std::time::Instant::now() < deadline =>
            {
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: kill(2) with plain integers.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            _ => return,
        }
    }
}

fn caps() -> Value {
    let set = json!([
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_NET_BIND_SERVICE",
    ]);
    json!({
        "bounding": set,
        "effective": set,
        "permitted": set,
    })
}

/// Writes `config` as `<bundle>/config.json`.
pub fn write(bundle: &Path, config: &Value) -> Result<(), GvisorError> {
    let io = |e| GvisorError::Io {
        what: format!("writing the bundle {}", bundle.display()),
        source: e,
    };
    std::fs::create_dir_all(bundle).map_err(io)?;
    let text = serde_json::to_vec_pretty(config).map_err(|e| io(std::io::Error::other(e)))?;
    std::fs::write(bundle.join("config.json"), text).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout<'a>(image: bool, outputs: Option<&'a Path>, host_network: bool) -> Layout<'a> {
        Layout {
            root: Path::new("/r"),
            image,
            resolv_conf: Path::new("/g/etc/resolv.conf"),
            workspace: Path::new("/w"),
            outputs,
            init: Path::new("/i"),
            hostname: "omabox",
            host_network,
            user_home: false,
        }
    }

    fn destinations(config: &Value) -> Vec<&str> {
        config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["destination"].as_str())
            .collect()
    }

    #[test]
    fn the_bundle_binds_what_the_layout_names_and_nothing_of_the_hosts_etc() {
        let plain = config(&layout(false, None, false));
        let mounts = destinations(&plain);
        assert!(mounts.contains(&"/usr") && mounts.contains(&WORKSPACE));
        assert!(!mounts.contains(&OUTPUTS) && !mounts.contains(&"/etc/resolv.conf"));
        assert_eq!(plain["root"]["readonly"], true);
        let namespaces = plain["linux"]["namespaces"].to_string();
        assert!(namespaces.contains("network"), "{namespaces}");

        let full = config(&layout(true, Some(Path::new("/o")), true));
        let mounts = destinations(&full);
        assert!(mounts.contains(&OUTPUTS) && mounts.contains(&"/etc/resolv.conf"));
        assert!(!mounts.contains(&"/usr"), "an image has its own /usr");
        // Writable only through runsc's overlay in the sandbox's memory.
        assert_eq!(full["root"]["readonly"], false);
        // runsc must stay in omabox's namespace: the spec names none of its own; the
        // Sentry gets a user namespace (uid 0 mapped to 0 only).
        let namespaces = full["linux"]["namespaces"].to_string();
        assert!(!namespaces.contains("network"), "{namespaces}");
        assert!(namespaces.contains("user"), "{namespaces}");
        assert_eq!(full["linux"]["uidMappings"][0]["size"], 1);
        assert!(!plain["linux"]["namespaces"].to_string().contains("user"));
        assert!(!full.to_string().contains("\"/etc\""), "no host /etc");
    }
}
