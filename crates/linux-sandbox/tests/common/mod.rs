//! Shared test support: the loud-skip helper and a sandbox guard that always tears down.
//! The linux backend's tests use this file too (their `common` includes it).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use omabox_agent::client::{AgentClient, ExecOutput};
use omabox_linux_sandbox::{
    LinuxRuntime, LinuxSandbox, RuntimeConfig, SandboxIdentity, SandboxPlan,
};

/// Runtime dir and cgroup parent used by every test (a test run's leftovers are easy to
/// find and cannot be confused with real sandboxes).
pub const TEST_RUNTIME_DIR: &str = "/run/omabox-test";
pub const TEST_CGROUP_PARENT: &str = "omabox-test";

/// Returns `false` (after printing why) when the sandbox cannot run here. Under
/// `CI=true` a missing capability is a failure, never a skip.
pub fn can_run() -> bool {
    omabox_test_support::require_capability(
        probe_reason().map(|reason| format!("the linux sandbox cannot run here: {reason}")),
    )
}

/// `omabox-sandbox-init`, the omabox-linux-sandbox crate's binary: in the target profile
/// dir above this test binary's `deps/`, where a test run of this crate (or `cargo build
/// --bins`, or a workspace test run) puts it. (`env!("CARGO_BIN_EXE_…")` would name only
/// the test's own crate's binaries, and this file serves the linux backend's tests too.)
pub fn init_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/");
    profile_dir.join(omabox_linux_sandbox::INIT_BINARY)
}

fn probe_reason() -> Option<String> {
    if !init_binary().is_file() {
        return Some(format!(
            "{} is missing (build it: cargo build -p omabox-linux-sandbox --bins)",
            init_binary().display()
        ));
    }
    let caps = match omabox_linux_sandbox::LinuxCapabilities::probe() {
        Ok(c) => c,
        Err(e) => return Some(format!("probe failed: {e}")),
    };
    if !caps.root {
        return Some("the tests need root (cgroup limits are asserted)".into());
    }
    caps.check(&test_plan()).err().map(|e| e.to_string())
}

pub fn runtime() -> LinuxRuntime {
    runtime_in(PathBuf::from(TEST_RUNTIME_DIR), TEST_CGROUP_PARENT)
}

/// A runtime with its own state dir and cgroup parent, for tests that check that
/// nothing at all is left there.
pub fn runtime_in(runtime_dir: PathBuf, cgroup_parent: &str) -> LinuxRuntime {
    LinuxRuntime::new(RuntimeConfig {
        runtime_dir,
        cgroup_parent: cgroup_parent.into(),
        init_binary: Some(init_binary()),
        ..RuntimeConfig::default()
    })
    .expect("linux runtime")
}

/// Default plan of the tests: preinstalled rootfs, small limits.
pub fn test_plan() -> SandboxPlan {
    let mut plan = SandboxPlan::preinstalled("sandbox");
    plan.limits.memory_bytes = Some(128 << 20);
    plan.limits.pids_max = Some(64);
    plan.limits.tmp_bytes = 8 << 20;
    plan.limits.nofile = 256;
    plan
}

/// A started sandbox with a connected client. Drop destroys the sandbox and checks that
/// nothing is left.
pub struct Sandboxed {
    pub sandbox: Option<LinuxSandbox>,
    pub client: AgentClient,
    pub identity: SandboxIdentity,
}

impl Sandboxed {
    pub async fn start(plan: SandboxPlan) -> Self {
        let rt = runtime();
        let mut sandbox = tokio::task::spawn_blocking(move || rt.start(&plan))
            .await
            .unwrap()
            .expect("sandbox start");
        let identity = sandbox.identity().clone();
        let client = sandbox.connect_agent().await.expect("agent handshake");
        Self {
            sandbox: Some(sandbox),
            client,
            identity,
        }
    }

    /// Runs a shell script inside.
    pub async fn sh(&self, script: &str) -> ExecOutput {
        self.client
            .exec(omabox_agent::client::ExecRequest::shell(script).timeout(Duration::from_secs(60)))
            .await
            .expect("exec")
    }

    /// Runs a shell script and returns its trimmed stdout, asserting exit 0.
    pub async fn ok(&self, script: &str) -> String {
        succeeded(script, self.sh(script).await)
    }

    /// Runs a Python program inside (`python3 -c`, no shell quoting) and returns its
    /// trimmed stdout, asserting exit 0.
    pub async fn python(&self, program: &str) -> String {
        let out = self
            .client
            .exec(
                omabox_agent::client::ExecRequest::argv(["python3", "-c", program])
                    .timeout(Duration::from_secs(60)),
            )
            .await
            .expect("exec");
        succeeded(program, out)
    }

    /// Destroys the sandbox and asserts that nothing of it is left.
    pub fn destroy(&mut self) {
        if let Some(mut sb) = self.sandbox.take() {
            sb.destroy().expect("destroy");
            assert_gone(&self.identity);
        }
    }
}

/// The trimmed stdout of `what`'s run, asserting it exited 0.
fn succeeded(what: &str, out: ExecOutput) -> String {
    assert!(
        out.success(),
        "{what:?} failed: {:?}: {}",
        out.exit,
        out.combined()
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

impl Drop for Sandboxed {
    fn drop(&mut self) {
        if let Some(mut sb) = self.sandbox.take() {
            let _ = sb.destroy();
        }
        // Belt and braces, also when a test panicked half-way.
        let _ = self.identity.destroy(Duration::from_secs(10));
    }
}

/// Nothing of the sandbox remains: no process in its pid namespace, no cgroup dir, no
/// state dir, no mount of its state dir on the host.
pub fn assert_gone(id: &SandboxIdentity) {
    assert!(!id.is_alive(), "sandbox init still alive");
    assert!(
        !std::path::Path::new(&format!("/proc/{}", id.pid)).exists()
            || omabox_linux_sandbox_test_start_time(id.pid) != Some(id.start_time),
        "sandbox init still has a /proc entry (zombie?)"
    );
    assert!(
        !id.cgroup.exists(),
        "cgroup dirs left: {:?}",
        id.cgroup.dirs
    );
    assert!(!id.state_dir.exists(), "state dir left: {:?}", id.state_dir);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&id.id),
        "a mount mentioning the sandbox id is left on the host"
    );
}

fn omabox_linux_sandbox_test_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A private runtime dir + cgroup parent; on drop asserts (when not panicking) that both
/// are empty, then removes them.
pub struct Isolated {
    pub dir: tempfile::TempDir,
    pub cgroup_parent: String,
}

impl Isolated {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cgroup_parent = format!(
            "{TEST_CGROUP_PARENT}-{}",
            dir.path().file_name().unwrap().to_string_lossy()
        );
        Self { dir, cgroup_parent }
    }

    pub fn runtime(&self) -> LinuxRuntime {
        runtime_in(self.dir.path().to_path_buf(), &self.cgroup_parent)
    }

    /// Per-controller parent dirs of this runtime's cgroups.
    fn cgroup_parents(&self) -> Vec<PathBuf> {
        let Ok(Some(layout)) = omabox_linux_sandbox::CgroupLayout::detect() else {
            return Vec::new();
        };
        match layout {
            omabox_linux_sandbox::CgroupLayout::V1 { controllers } => controllers
                .values()
                .map(|m| m.join(&self.cgroup_parent))
                .collect(),
            omabox_linux_sandbox::CgroupLayout::V2 { root, .. } => {
                vec![root.join(&self.cgroup_parent)]
            }
        }
    }

    /// Asserts that no state dir and no sandbox cgroup is left.
    pub fn assert_empty(&self) {
        let left: Vec<_> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .collect();
        assert!(left.is_empty(), "state left in the runtime dir: {left:?}");
        for p in self.cgroup_parents() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                let dirs: Vec<_> = entries.flatten().filter(|e| e.path().is_dir()).collect();
                assert!(dirs.is_empty(), "cgroup dirs left under {p:?}: {dirs:?}");
            }
        }
    }
}

impl Drop for Isolated {
    fn drop(&mut self) {
        for p in self.cgroup_parents() {
            let _ = std::fs::remove_dir(p);
        }
    }
}
