//! Shared by the CLI's end-to-end tests: where the binaries are, and whether linux sandboxes
//! can run on this machine (a missing capability skips with a printed reason locally and
//! fails under `CI=true`).

use omabox_backend_linux::factory::{INIT_ENV, LinuxSandboxFactory};
use omabox_sandbox::{SandboxFactoryContext, SandboxFactoryEnv};
use std::path::{Path, PathBuf};

pub mod serve;

/// The `omabox` binary under test.
pub fn omabox_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_omabox"))
}

/// One test's data dir, linux runtime dir and cgroup parent (named after the runtime dir,
/// so parallel tests never share one); the cgroup parent is removed when it is dropped
/// (from every hierarchy, if empty).
#[allow(dead_code)]
pub struct TestDirs {
    pub data: tempfile::TempDir,
    pub runtime_dir: tempfile::TempDir,
    pub cgroup_parent: String,
}

#[allow(dead_code)]
impl TestDirs {
    /// Fresh dirs; the cgroup parent is `omabox-<kind>-test-<runtime dir name>`.
    pub fn new(kind: &str) -> Self {
        let runtime_dir = tempfile::tempdir().unwrap();
        let cgroup_parent = format!(
            "omabox-{kind}-test-{}",
            runtime_dir.path().file_name().unwrap().to_string_lossy()
        );
        Self {
            data: tempfile::tempdir().unwrap(),
            runtime_dir,
            cgroup_parent,
        }
    }

    /// `omabox workspace export --session SESSION` into a new temporary dir's `ws/`.
    pub fn export(&self, session: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let output = self
            .command(&["workspace", "export", "--session", session])
            .arg(dir.path().join("ws"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        dir
    }

    /// [`omabox_command`] in these dirs.
    pub fn command(&self, args: &[&str]) -> std::process::Command {
        omabox_command(
            self.data.path(),
            self.runtime_dir.path(),
            &self.cgroup_parent,
            args,
        )
    }
}

impl Drop for TestDirs {
    fn drop(&mut self) {
        remove_cgroup_parent(&self.cgroup_parent);
    }
}

/// `omabox --data-dir DATA ARGS…` for a test with its own linux runtime dir and cgroup
/// parent: the init next to `omabox`, no image from the environment, stdin `/dev/null`.
/// Tests add their own environment on top (a later `env` wins).
#[allow(dead_code)]
pub fn omabox_command(
    data: &Path,
    runtime_dir: &Path,
    cgroup_parent: &str,
    args: &[&str],
) -> std::process::Command {
    let mut command = std::process::Command::new(omabox_bin());
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env(omabox_backend_linux::factory::RUNTIME_DIR_ENV, runtime_dir)
        .env(
            omabox_backend_linux::factory::CGROUP_PARENT_ENV,
            cgroup_parent,
        )
        .env(INIT_ENV, init_bin())
        .env_remove("OMABOX_LINUX_IMAGE")
        .env_remove("SANDBOX_IMAGE")
        .stdin(std::process::Stdio::null());
    command
}

/// The sandbox's PID 1, which must sit next to `omabox`.
pub fn init_bin() -> PathBuf {
    omabox_bin().with_file_name("omabox-sandbox-init")
}

#[allow(dead_code)]
/// Why gvisor sandboxes cannot run here (root, runsc, the init binary beside omabox), or
/// `None`.
pub fn gvisor_missing() -> Option<String> {
    let init = omabox_bin().with_file_name("omabox-gvisor-init");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("runsc needs root".into());
    }
    if omabox_backend_gvisor::locate_runsc().is_none() {
        return Some("runsc is not installed (scripts/setup installs it)".into());
    }
    (!init.is_file()).then(|| {
        format!(
            "{} is not built (cargo build -p omabox-backend-gvisor --bins)",
            init.display()
        )
    })
}

#[allow(dead_code)]
/// `true` when linux sandboxes can run here. Otherwise prints why and returns `false`, or
/// panics under `CI=true` ([`omabox_test_support::require_capability`]).
pub fn linux_available() -> bool {
    omabox_test_support::require_capability(
        linux_unavailable_reason()
            .map(|reason| format!("linux sandboxes cannot run here: {reason}")),
    )
}

#[allow(dead_code)]
fn linux_unavailable_reason() -> Option<String> {
    if !init_bin().is_file() {
        return Some(format!(
            "{} is missing (build it: cargo build --bins)",
            init_bin().display()
        ));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("linux sandboxes need root (cgroup limits)".into());
    }
    let ctx = SandboxFactoryContext {
        session_id: "probe".into(),
        workdir: std::env::temp_dir(),
        memory_root: None,
        outputs_root: None,
    };
    let env: SandboxFactoryEnv = [(INIT_ENV, init_bin().display().to_string())]
        .into_iter()
        .collect();
    LinuxSandboxFactory::new()
        .check_host(&ctx, &env)
        .err()
        .map(|error| format!("{error}: {:?}", std::error::Error::source(&error)))
}

/// A minimal Debian bookworm root filesystem (`debootstrap --variant=minbase`, from the
/// machine's Debian mirror), made once per target dir under a lock and reused:
/// `target/omabox-test-images/bookworm`. `None` (printed reason; a failure under
/// `CI=true`) without debootstrap.
#[allow(dead_code)]
pub fn debian_rootfs() -> Option<PathBuf> {
    let found = std::process::Command::new("debootstrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !omabox_test_support::require_capability(
        (!found).then(|| "debootstrap is missing (apt-get install debootstrap)".to_owned()),
    ) {
        return None;
    }
    let images = omabox_bin()
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(std::env::temp_dir)
        .join("omabox-test-images");
    std::fs::create_dir_all(&images).unwrap();
    let rootfs = images.join("bookworm");
    let lock = std::fs::File::create(images.join(".lock")).unwrap();
    // Released when `lock` drops.
    lock.lock().unwrap();
    if !rootfs.join("usr/bin/apt-get").is_file() {
        let partial = images.join("bookworm.partial");
        let _ = std::fs::remove_dir_all(&partial);
        let mirror = std::env::var("OMABOX_TEST_DEBIAN_MIRROR")
            .unwrap_or_else(|_| "http://deb.debian.org/debian".into());
        let out = std::process::Command::new("debootstrap")
            .args(["--variant=minbase", "bookworm"])
            .arg(&partial)
            .arg(&mirror)
            .output()
            .expect("run debootstrap");
        assert!(
            out.status.success(),
            "debootstrap bookworm from {mirror}: {}",
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .rev()
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
        let _ = std::fs::remove_dir_all(&rootfs);
        std::fs::rename(&partial, &rootfs).unwrap();
    }
    Some(rootfs)
}

/// The directories a cgroup parent named `name` has on this machine: one per v1
/// controller hierarchy, or the one under the v2 root (none without cgroups).
#[allow(dead_code)]
pub fn cgroup_parent_dirs(name: &str) -> Vec<PathBuf> {
    match omabox_backend_linux::CgroupLayout::detect() {
        Ok(Some(omabox_backend_linux::CgroupLayout::V1 { controllers })) => {
            controllers.values().map(|mount| mount.join(name)).collect()
        }
        Ok(Some(omabox_backend_linux::CgroupLayout::V2 { root, .. })) => vec![root.join(name)],
        _ => Vec::new(),
    }
}

/// Removes the (empty) cgroup parent `name` a test used, from every hierarchy.
#[allow(dead_code)]
pub fn remove_cgroup_parent(name: &str) {
    for dir in cgroup_parent_dirs(name) {
        let _ = std::fs::remove_dir(dir);
    }
}

/// A command's exit status and both outputs, for assertion messages.
#[allow(dead_code)]
pub fn describe(output: &std::process::Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command` with `input` on its stdin (e.g. `omabox vault put NAME`, which reads the
/// value there) and asserts it succeeded.
#[allow(dead_code)]
pub fn run_with_stdin(command: &mut std::process::Command, input: &str) {
    use std::io::Write as _;
    let mut child = command
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write stdin");
    assert!(child.wait().expect("wait").success(), "{command:?} failed");
}
