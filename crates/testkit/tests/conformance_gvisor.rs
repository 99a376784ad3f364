//! The conformance suite against the `gvisor` backend: runsc sandboxes (ptrace platform)
//! under a directory of each case's own, the host's `/usr` read-only under a generated
//! `/etc`. Needs root, runsc (scripts/setup installs it) and the `omabox-gvisor-init`
//! binary next to the test binaries (`cargo build -p omabox-backend-gvisor --bins`); a
//! missing one skips with its reason, and fails under `CI=true`.

use std::sync::Arc;

use omabox_backend_gvisor::managed::GvisorManagedProvider;
use omabox_backend_gvisor::{GvisorConfig, GvisorRuntime};
use omabox_sandbox::managed::ManagedSandboxProvider;
use omabox_testkit::conformance::{BackendUnderTest, require_capability};

fn missing() -> Option<String> {
    if !omabox_backend_gvisor::runs_as_root() {
        return Some("runsc needs root here".into());
    }
    if omabox_backend_gvisor::locate_runsc().is_none() {
        return Some("runsc is not installed (scripts/setup installs it)".into());
    }
    omabox_backend_gvisor::locate_init().err().map(|tried| {
        format!(
            "omabox-gvisor-init is not built (tried {tried}; cargo build -p \
             omabox-backend-gvisor --bins)"
        )
    })
}

async fn gvisor_backend() -> Option<BackendUnderTest> {
    if !require_capability(missing()) {
        return None;
    }
    let dir = Arc::new(tempfile::tempdir().unwrap());
    let runtime = GvisorRuntime::new(GvisorConfig {
        runsc: omabox_backend_gvisor::locate_runsc().unwrap(),
        dir: dir.path().to_path_buf(),
        init: omabox_backend_gvisor::locate_init().unwrap(),
        platform: "ptrace".into(),
        limits: Default::default(),
        network: Default::default(),
        test_hosts: None,
        image_root: None,
    })
    .unwrap();
    Some(BackendUnderTest {
        name: "gvisor".into(),
        provider: Arc::new(move || {
            let _alive = &dir;
            Ok(Arc::new(GvisorManagedProvider::new(runtime.clone()))
                as Arc<dyn ManagedSandboxProvider>)
        }),
        workspace_dir: "/workspace".into(),
        outputs_dir: "/mnt/session/outputs".into(),
    })
}

omabox_testkit::conformance_suite!(gvisor, gvisor_backend().await);
