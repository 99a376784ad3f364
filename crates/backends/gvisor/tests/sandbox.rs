//! The gvisor backend against the real runsc: exec, files, destroy.
//!
//! Pause/resume/fork have no test here: the one written failed in about half its runs in
//! debug builds (the restored process crashed; `repro/runsc_restore.py` shows Debian's runsc
//! 0.0~20221219 killing restored processes without omabox), and a test CI cannot run is no
//! test. Until one passes in CI, pause/resume/fork are built but unproven (issue 29).
//!
//! Needs root and `runsc` (scripts/setup installs it); without them the tests skip
//! locally and fail under CI=true.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use omabox_backend_gvisor::{GvisorConfig, GvisorRuntime, GvisorSandboxPort};
use omabox_sandbox::SandboxPort;

fn runsc() -> Option<PathBuf> {
    ["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The runtime under a fresh directory, or `None` (skipped) where runsc or root is missing.
fn runtime(dir: &Path) -> Option<GvisorRuntime> {
    let missing = match runsc() {
        None => Some("runsc is not installed (scripts/setup installs it)".to_owned()),
        // SAFETY: geteuid has no preconditions.
        Some(_) if unsafe { libc::geteuid() } != 0 => Some("runsc needs root here".to_owned()),
        Some(_) => None,
    };
    if !omabox_test_support::require_capability(missing) {
        return None;
    }
    Some(
        GvisorRuntime::new(GvisorConfig {
            runsc: runsc()?,
            dir: dir.to_path_buf(),
            init: PathBuf::from(env!("CARGO_BIN_EXE_omabox-gvisor-init")),
            platform: "ptrace".into(),
        })
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_commands_with_exit_codes_and_files_and_destroy_removes_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rt) = runtime(tmp.path()) else {
        return;
    };
    let sandbox = Arc::new(rt.create().await.unwrap());
    let port = GvisorSandboxPort::new(sandbox.clone());

    assert_eq!(port.exec("echo hello", None).await.unwrap(), "hello");
    let failed = port
        .exec("echo out; echo err >&2; exit 3", None)
        .await
        .unwrap();
    // stdout, a line break, then stderr (the agent client's combined form).
    assert_eq!(failed, "out\n\nerr\n[exit 3]");
    // gVisor's kernel, not the host's, answers.
    let kernel = port
        .exec("dmesg 2>/dev/null | head -1; uname -r", None)
        .await
        .unwrap();
    assert!(!kernel.contains(&host_release()), "{kernel}");

    port.write_file("/workspace/note.txt", "written by the port")
        .await
        .unwrap();
    assert_eq!(
        port.read_file("note.txt").await.unwrap(),
        "written by the port"
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.workspace().join("note.txt")).unwrap(),
        "written by the port"
    );
    // The host's /etc and data directory are not the sandbox's. (`test`, not `ls`: this
    // runsc rejects coreutils' statx flags, see SECURITY.md.)
    let seen = port
        .exec(
            &format!(
                "test -e /etc/shadow && echo shadow; test -e {} && echo data; \
                 test -e /etc/passwd && echo passwd",
                tmp.path().display()
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(seen, "passwd");

    let dir = sandbox.dir().to_path_buf();
    port.as_destroy().unwrap().destroy().await.unwrap();
    assert!(!dir.exists());
    assert!(port.exec("true", None).await.is_err());
}

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}
