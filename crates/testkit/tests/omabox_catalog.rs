//! omabox's own conformance rows (each backend's `catalog::conformance_row`) checked against the
//! live drivers: a row is a claim, and the driver's descriptor and ports must make it true.

use omabox_backend_local::managed::{
    LocalManagedRuntimeOptions, create_managed_runtime_provider_driver,
};
use omabox_contract::{
    HarnessDriverType, ManagedRuntimeProviderDriverPort, OutputDurability, OutputStrategy,
    RuntimeResourceScope, SuspendResume,
};
use omabox_host::catalog::{
    CatalogDurability, CatalogOutputStrategy, CatalogSuspendResume, ConformanceCatalog,
    ManagedRuntimeProviderConformance,
};
use omabox_persistence::{FilesystemSessionOutputPort, FilesystemWorkspacePort};
use omabox_sandbox::SandboxFactoryEnv;
use std::sync::Arc;

/// The create input of an `ama_worker` plan running `sh`, with runtime checkpoints of
/// `kind` required (`None`: disabled).
fn create_input(
    kind: Option<omabox_contract::RuntimeCheckpointKind>,
) -> omabox_contract::ManagedRuntimeProviderCreateInput {
    let requirement = if kind.is_some() {
        "required"
    } else {
        "disabled"
    };
    omabox_contract::ManagedRuntimeProviderCreateInput {
        environment_id: "e".into(),
        placement: omabox_contract::ManagedRuntimeProviderPlacement::InProcess,
        profile: serde_json::from_value(serde_json::json!({
            "workspace": {"requirement": "durable"},
            "outputs": {"requirement": "durable"},
            "runtimeCheckpoint": requirement,
            "driver": {"type": "ama_worker", "process": {"command": "sh"}},
        }))
        .expect("profile"),
        plan: serde_json::from_value(serde_json::json!({
            "workspaceStrategy": "checkpoint_restore",
            "outputStrategy": "final_collect",
            "runtimeCheckpoint": kind,
            "driver": {"type": "ama_worker", "process": {"command": "sh"}},
        }))
        .expect("plan"),
        provider_config: serde_json::Map::new(),
    }
}

/// Checks `row` against `driver`: lanes, workspace strategies, outputs, suspend/resume and
/// runtime checkpoints, from the descriptor and from the live ports.
pub async fn assert_row_matches_driver(
    row: &ManagedRuntimeProviderConformance,
    driver: &dyn ManagedRuntimeProviderDriverPort,
) {
    let descriptor = driver.descriptor();
    assert_eq!(descriptor.provider, row.id);
    let scope = RuntimeResourceScope::new("w", "e", "s", "k");
    let resources = driver.create(create_input(None)).await.expect("create");

    // Lanes: the descriptor, and the live harness driver plus a projected transport.
    let mut live_lanes = resources
        .harness_driver
        .driver_capabilities(&scope)
        .await
        .unwrap()
        .drivers;
    if resources.supervisor_transport.is_some()
        && !live_lanes.contains(&HarnessDriverType::OpenmaSupervised)
    {
        live_lanes.push(HarnessDriverType::OpenmaSupervised);
    }
    assert_eq!(row.driver_lanes, descriptor.capabilities.harness.drivers);
    assert_eq!(row.driver_lanes, live_lanes);

    // Workspace strategies.
    let live_workspace = resources.workspace.capabilities(&scope).await.unwrap();
    assert_eq!(
        row.workspace.strategies,
        descriptor.capabilities.workspace.strategies
    );
    assert_eq!(row.workspace.strategies, live_workspace.strategies);

    // Outputs (the catalog admits durable_mount and final_collect only).
    let live_outputs = resources.outputs.capabilities(&scope).await.unwrap();
    assert_eq!(descriptor.capabilities.outputs, live_outputs);
    let claimed: Vec<OutputStrategy> = row
        .outputs
        .strategies
        .iter()
        .map(|strategy| match strategy {
            CatalogOutputStrategy::DurableMount => OutputStrategy::DurableMount,
            CatalogOutputStrategy::FinalCollect => OutputStrategy::FinalCollect,
        })
        .collect();
    let live: Vec<OutputStrategy> = live_outputs
        .strategies
        .iter()
        .map(|out| out.strategy)
        .collect();
    assert_eq!(claimed, live);
    let durable = live_outputs
        .strategies
        .iter()
        .all(|out| out.durability == OutputDurability::Durable);
    assert_eq!(
        row.outputs.durability == CatalogDurability::Durable,
        durable
    );

    // Suspend/resume and runtime checkpoints.
    let live_sandbox = resources.sandbox.capabilities(&scope).await.unwrap();
    assert_eq!(descriptor.capabilities.sandbox, live_sandbox);
    let suspend = match live_sandbox.suspend_resume {
        SuspendResume::Supported => CatalogSuspendResume::Supported,
        SuspendResume::Unsupported => CatalogSuspendResume::Unsupported,
    };
    assert_eq!(row.lifecycle.suspend_resume, suspend);
    assert_eq!(row.runtime_checkpoints, live_sandbox.runtime_checkpoints);
    // A plan without runtime checkpoints gets no port; each kind the row claims is served
    // by a port for a plan that asks for it.
    assert!(resources.runtime_checkpoint.is_none());
    for kind in &row.runtime_checkpoints {
        let planned = driver
            .create(create_input(Some(*kind)))
            .await
            .expect("create");
        assert!(planned.runtime_checkpoint.is_some(), "{kind} is served");
    }
}

#[tokio::test]
async fn the_local_row_matches_the_live_local_driver() {
    let data = tempfile::tempdir().unwrap();
    let env: SandboxFactoryEnv = [("OMABOX_TEST_MODE", "1")].into_iter().collect();
    let driver = create_managed_runtime_provider_driver(LocalManagedRuntimeOptions {
        env,
        workspace: Arc::new(FilesystemWorkspacePort::new(data.path()).unwrap()),
        outputs: Arc::new(FilesystemSessionOutputPort::new(data.path()).unwrap()),
        readiness_timeout: None,
        harness_output: None,
    })
    .await
    .expect("local driver");
    let row = omabox_backend_local::catalog::conformance_row();
    assert_row_matches_driver(&row, driver.as_ref()).await;
    assert_managed_and_appendable(row);
}

#[tokio::test]
async fn the_linux_row_matches_the_live_linux_driver() {
    use omabox_backend_linux::factory::LinuxSandboxFactory;
    use omabox_backend_linux::managed::LinuxManagedRuntimeOptions;
    // Building the driver allocates nothing, so this runs on any machine.
    let data = tempfile::tempdir().unwrap();
    let driver = omabox_backend_linux::managed::create_managed_runtime_provider_driver(
        LinuxManagedRuntimeOptions {
            factory: LinuxSandboxFactory::new(),
            config: Default::default(),
            workspace: Arc::new(FilesystemWorkspacePort::new(data.path()).unwrap()),
            outputs: Arc::new(FilesystemSessionOutputPort::new(data.path()).unwrap()),
            readiness_timeout: None,
            harness_output: None,
            credential_egress: None,
        },
    )
    .await
    .expect("linux driver");
    let row = omabox_backend_linux::catalog::conformance_row();
    assert_row_matches_driver(&row, driver.as_ref()).await;
    assert_managed_and_appendable(row);
}

#[tokio::test]
async fn the_docker_row_matches_the_live_docker_driver() {
    use omabox_backend_docker::managed::DockerManagedRuntimeOptions;
    use omabox_backend_docker::{DockerConfig, Engine};
    use omabox_test_support::dockerd::TestDockerd;
    // The driver is built over a live engine (its own dockerd); no container is made.
    if !omabox_test_support::require_capability(TestDockerd::missing()) {
        return;
    }
    let dockerd = TestDockerd::start();
    let engine = Engine::connect(&dockerd.host()).await.expect("engine");
    let data = tempfile::tempdir().unwrap();
    let driver = omabox_backend_docker::managed::managed_runtime_provider_driver(
        DockerManagedRuntimeOptions {
            engine,
            config: DockerConfig::new("busybox", omabox_backend_docker::host::current()),
            workspace: Arc::new(FilesystemWorkspacePort::new(data.path()).unwrap()),
            outputs: Arc::new(FilesystemSessionOutputPort::new(data.path()).unwrap()),
            readiness_timeout: None,
            harness_output: None,
            credential_egress: None,
        },
    )
    .await
    .expect("docker driver");
    let row = omabox_backend_docker::catalog::conformance_row();
    assert_row_matches_driver(&row, &driver).await;
    assert_managed_and_appendable(row);
}

#[tokio::test]
async fn the_gvisor_row_matches_the_live_gvisor_driver() {
    use omabox_backend_gvisor::managed::GvisorManagedRuntimeOptions;
    use omabox_backend_gvisor::{GvisorConfig, GvisorRuntime};
    use omabox_backend_linux::credential_egress::{CredentialEgress, EgressCredential};
    use omabox_backend_linux::managed::CredentialEgressOptions;
    // Building the driver starts no sandbox; the runtime prepares its directory only.
    let runsc = omabox_backend_gvisor::locate_runsc();
    let missing = match &runsc {
        None => Some("runsc is not installed (scripts/setup installs it)".to_owned()),
        Some(_) if !omabox_backend_gvisor::runs_as_root() => {
            Some("the gvisor backend needs root".to_owned())
        }
        Some(_) => None,
    };
    if !omabox_test_support::require_capability(missing) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let runtime = GvisorRuntime::new(GvisorConfig {
        runsc: runsc.unwrap(),
        dir: data.path().join("gvisor"),
        init: data.path().join("init"),
        platform: "ptrace".into(),
        limits: Default::default(),
        network: Default::default(),
        test_hosts: None,
        image_root: None,
    })
    .expect("gvisor runtime");
    let options = |credential_egress| GvisorManagedRuntimeOptions {
        runtime: runtime.clone(),
        workspace: Arc::new(FilesystemWorkspacePort::new(data.path()).unwrap()),
        outputs: Arc::new(FilesystemSessionOutputPort::new(data.path()).unwrap()),
        readiness_timeout: None,
        harness_output: None,
        credential_egress,
    };
    let driver = omabox_backend_gvisor::managed::managed_runtime_provider_driver(options(None))
        .await
        .expect("gvisor driver");
    let row = omabox_backend_gvisor::catalog::conformance_row();
    assert_row_matches_driver(&row, &driver).await;
    assert_managed_and_appendable(row);
    assert_eq!(
        driver.descriptor().credential_egress,
        omabox_contract::CredentialEgressCapabilities::unsupported()
    );
    // Given rules, the driver enforces credential egress (as the row claims).
    let egress = CredentialEgressOptions {
        vault: Arc::new(omabox_store::MemoryVault::new()),
        rules: vec![EgressCredential::parse("api.test=token").unwrap()],
        upstream_roots: Some(Vec::new()),
    };
    let driver =
        omabox_backend_gvisor::managed::managed_runtime_provider_driver(options(Some(egress)))
            .await
            .expect("gvisor driver");
    assert_eq!(
        driver.descriptor().credential_egress,
        CredentialEgress::capabilities_value()
    );
}

/// The row is a managed-runtime row that extends the OpenMA catalog without a clash.
fn assert_managed_and_appendable(row: ManagedRuntimeProviderConformance) {
    let id = row.id.clone();
    let mut catalog = ConformanceCatalog::openma();
    catalog.extend([row]).expect("a new id");
    assert!(catalog.require(&id).is_ok());
}

#[tokio::test]
async fn the_docker_driver_enforces_credential_egress_when_given_rules() {
    use omabox_backend_docker::managed::DockerManagedRuntimeOptions;
    use omabox_backend_docker::{DockerConfig, Engine};
    use omabox_backend_linux::credential_egress::{CredentialEgress, EgressCredential};
    use omabox_backend_linux::managed::CredentialEgressOptions;
    // Building the driver sends nothing to the engine.
    let engine = Engine::connect_pinned("tcp://127.0.0.1:9").expect("engine");
    let data = tempfile::tempdir().unwrap();
    let options = |credential_egress| DockerManagedRuntimeOptions {
        engine: engine.clone(),
        config: DockerConfig::new("busybox", omabox_backend_docker::host::current()),
        workspace: Arc::new(FilesystemWorkspacePort::new(data.path()).unwrap()),
        outputs: Arc::new(FilesystemSessionOutputPort::new(data.path()).unwrap()),
        readiness_timeout: None,
        harness_output: None,
        credential_egress,
    };
    let plain = omabox_backend_docker::managed::managed_runtime_provider_driver(options(None))
        .await
        .expect("docker driver");
    assert_eq!(
        plain.descriptor().credential_egress,
        omabox_contract::CredentialEgressCapabilities::unsupported()
    );
    let egress = CredentialEgressOptions {
        vault: Arc::new(omabox_store::MemoryVault::new()),
        rules: vec![EgressCredential::parse("api.test=token").unwrap()],
        upstream_roots: Some(Vec::new()),
    };
    let driver =
        omabox_backend_docker::managed::managed_runtime_provider_driver(options(Some(egress)))
            .await
            .expect("docker driver");
    assert_eq!(
        driver.descriptor().credential_egress,
        CredentialEgress::capabilities_value()
    );
}
