//! The conformance suite against the `linux` backend (namespace sandboxes).
//!
//! Runs only where linux sandboxes can be created (root or unprivileged user namespaces,
//! cgroups, the `omabox-sandbox-init` binary built next to the test binaries). Elsewhere
//! each case prints why it skipped; under `CI=true` a missing capability fails instead.

use omabox_backend_linux::factory::LinuxSandboxFactory;
use omabox_backend_linux::managed::LinuxManagedProvider;
use omabox_sandbox::managed::ManagedSandboxProvider;
use omabox_sandbox::{SandboxFactoryContext, SandboxFactoryEnv};
use omabox_testkit::conformance::{BackendUnderTest, require_capability};
use std::sync::Arc;

fn linux_env() -> SandboxFactoryEnv {
    SandboxFactoryEnv::default()
}

/// `None` when this machine can run linux sandboxes, else why not.
fn missing_capability() -> Option<String> {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(error) => return Some(format!("no temporary directory: {error}")),
    };
    let ctx = SandboxFactoryContext {
        session_id: "probe".into(),
        workdir: dir.path().join("workspace"),
        memory_root: None,
        outputs_root: Some(dir.path().join("outputs")),
    };
    LinuxSandboxFactory::new()
        .check_host(&ctx, &linux_env())
        .err()
        .map(|error| {
            format!(
                "linux sandboxes cannot be created here: {error} (build the init binary with \
                 `cargo build -p omabox-backend-linux` if it is missing)"
            )
        })
}

fn linux_backend() -> Option<BackendUnderTest> {
    if !require_capability(missing_capability()) {
        return None;
    }
    Some(BackendUnderTest {
        name: "linux".into(),
        provider: Arc::new(|| {
            Ok(Arc::new(LinuxManagedProvider::new(
                LinuxSandboxFactory::new(),
                linux_env(),
            )) as Arc<dyn ManagedSandboxProvider>)
        }),
        workspace_dir: "/workspace".into(),
        outputs_dir: "/mnt/session/outputs".into(),
    })
}

omabox_testkit::conformance_suite!(linux, linux_backend());
