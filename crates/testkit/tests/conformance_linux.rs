//! The conformance suite against the `linux` backend (namespace sandboxes).
//!
//! Runs only where linux sandboxes can be created (root or unprivileged user namespaces,
//! cgroups, the `omabox-sandbox-init` binary built next to the test binaries). Elsewhere
//! each case prints why it skipped; under `CI=true` a missing capability fails instead.

use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory};
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
                LinuxSandboxConfig::default(),
            )) as Arc<dyn ManagedSandboxProvider>)
        }),
        workspace_dir: "/workspace".into(),
        outputs_dir: "/mnt/session/outputs".into(),
    })
}

omabox_testkit::conformance_suite!(linux, linux_backend());

/// `sandbox_active_seconds` is recorded once, from the start acquire observed to the stop
/// terminate or reap observed, even when the reap runs in another process (a fresh driver).
#[tokio::test]
async fn records_sandbox_active_seconds_once_from_a_serialized_lease() {
    use omabox_contract::{
        AbortSignal, ManagedSandboxPort, TerminationReason, UsageKind, UsageLedgerPort,
    };
    use omabox_store::MemoryUsageLedger;
    use omabox_testkit::conformance::Subject;

    let Some(backend) = linux_backend() else {
        return;
    };
    let subject = Subject::new(backend).await;
    let ledger = Arc::new(MemoryUsageLedger::default());
    subject.driver.runtime().record_usage_into(ledger.clone());
    let acquired = subject
        .acquire_on(&subject.driver, subject.shell("true"), AbortSignal::never())
        .await
        .expect("acquire");
    let metadata = acquired.lease.metadata.clone().expect("lease metadata");
    assert!(metadata.contains_key(omabox_sandbox::managed::STARTED_AT_METADATA_KEY));

    // Another process: a fresh driver that only has the serialized lease.
    let lease: omabox_contract::ManagedSandboxLease =
        serde_json::from_str(&serde_json::to_string(&acquired.lease).unwrap()).unwrap();
    let other = subject.fresh_driver().await;
    other.runtime().record_usage_into(ledger.clone());
    for _ in 0..2 {
        other
            .runtime()
            .reap(&acquired.scope, &lease, TerminationReason::LeaseLost)
            .await
            .expect("reap");
    }
    subject
        .driver
        .runtime()
        .terminate(
            &acquired.scope,
            &acquired.fence,
            &acquired.lease,
            TerminationReason::Completed,
        )
        .await
        .expect("terminate after reap is idempotent");

    let records = ledger.usage(&acquired.scope.session_id).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.kind, UsageKind::SandboxActiveSeconds);
    assert_eq!(record.provider, "linux");
    assert_eq!(record.runtime_id, acquired.lease.runtime_id);
    assert_eq!(record.scope, acquired.scope);
    assert!(record.seconds < 600, "{record:?}");
    assert!(record.started_at <= record.stopped_at, "{record:?}");
    subject.assert_nothing_left().await;
}
