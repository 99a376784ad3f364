//! The conformance suite against the `local` backend (host subprocesses, test mode).
//!
//! Commands in a local sandbox see host paths: `$PWD` is the workspace directory and
//! `$OMA_OUTPUTS_DIR` the outputs directory.

use omabox_backend_local::managed::LocalManagedProvider;
use omabox_sandbox::SandboxFactoryEnv;
use omabox_sandbox::managed::ManagedSandboxProvider;
use omabox_testkit::conformance::BackendUnderTest;
use std::sync::Arc;

fn local_backend() -> Option<BackendUnderTest> {
    Some(BackendUnderTest {
        name: "local".into(),
        provider: Arc::new(|| {
            let env: SandboxFactoryEnv = [("OMABOX_TEST_MODE", "1")].into_iter().collect();
            Ok(Arc::new(LocalManagedProvider::new(&env)?) as Arc<dyn ManagedSandboxProvider>)
        }),
        workspace_dir: "$PWD".into(),
        outputs_dir: "$OMA_OUTPUTS_DIR".into(),
    })
}

omabox_testkit::conformance_suite!(local, local_backend());

#[test]
fn the_local_provider_refuses_outside_test_mode() {
    let error = LocalManagedProvider::new(&SandboxFactoryEnv::default()).unwrap_err();
    assert!(error.message().contains("test mode"), "{}", error.message());
}
