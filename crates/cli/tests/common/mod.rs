//! Shared by the CLI's end-to-end tests: where the binaries are, and whether linux sandboxes
//! can run on this machine (a missing capability skips with a printed reason locally and
//! fails under `CI=true`).

use omabox_backend_linux::factory::{INIT_ENV, LinuxSandboxFactory};
use omabox_sandbox::{SandboxFactoryContext, SandboxFactoryEnv};
use std::path::PathBuf;

/// The `omabox` binary under test.
pub fn omabox_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_omabox"))
}

/// The sandbox's PID 1, which must sit next to `omabox`.
pub fn init_bin() -> PathBuf {
    omabox_bin().with_file_name("omabox-sandbox-init")
}

/// `true` when linux sandboxes can run here. Otherwise prints why and returns `false`, or
/// panics under `CI=true` ([`omabox_test_support::require_capability`]).
pub fn linux_available() -> bool {
    omabox_test_support::require_capability(
        linux_unavailable_reason()
            .map(|reason| format!("linux sandboxes cannot run here: {reason}")),
    )
}

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
