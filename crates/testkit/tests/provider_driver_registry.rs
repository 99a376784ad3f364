//! Port of `provider-driver-registry.test.ts` (reference §8.3): provider admission, one Rust
//! test per TypeScript case, named after it.

use omabox_contract::PortError;
use omabox_contract::{
    AbortController, CredentialEgressCapabilities, CredentialEgressEnforcement,
    CredentialEgressMode, CredentialEgressProfile, CredentialEgressRequirement, ErrorKind,
    HardTerminate, HarnessDriverDeclaration, HarnessDriverType, HarnessIdentity,
    HarnessSupervisorCommand, HarnessSupervisorEvent, ManagedRuntimeProfile,
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderPlacement, ManagedSandboxLease,
    ManagedWorkExecutionResult, OutputRequirement, OutputsProfile, RunHarnessInput,
    RuntimeCheckpointKind, RuntimeCheckpointRequirement, RuntimeProcessDeclaration,
    RuntimeResourceFence, RuntimeResourceScope, SandboxResourceCapabilities, SecretString,
    SupervisorProtocol, SuspendResume, WorkspaceProfile, WorkspaceRequirement, WorkspaceStrategy,
};
use omabox_host::registry::{
    ManagedRuntimeProviderRegistry, ManagedRuntimeProviderSelection, PrepareProviderInput,
};
use omabox_testkit::drivers::{
    CapabilityOnlyEgress, CapabilityOnlyOutputs, CapabilityOnlySandbox, CapabilityOnlyWorkspace,
    FakeProviderDriver, ScriptedSupervisorTransport, UnusedRuntimeCheckpoint, provider_descriptor,
    provider_resources,
};
use std::sync::Arc;

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace_1", "environment_1", "session_1", "work_1")
}

/// Durable workspace and outputs, no runtime checkpoint, required egress, `ama_worker`.
fn durable_profile() -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        workspace: WorkspaceProfile {
            requirement: WorkspaceRequirement::Durable,
            preferred_strategies: None,
        },
        outputs: OutputsProfile {
            requirement: OutputRequirement::Durable,
            preferred_strategies: None,
        },
        runtime_checkpoint: RuntimeCheckpointRequirement::Disabled,
        credential_egress: Some(CredentialEgressProfile {
            requirement: CredentialEgressRequirement::Required,
        }),
        driver: HarnessDriverDeclaration::AmaWorker {
            process: RuntimeProcessDeclaration::command("managed-agent-worker"),
        },
    }
}

fn supervised_declaration() -> HarnessDriverDeclaration {
    HarnessDriverDeclaration::OpenmaSupervised {
        protocol: SupervisorProtocol::V1,
        supervisor: RuntimeProcessDeclaration::command("openma-supervisor"),
        harness: HarnessIdentity {
            id: "pi".into(),
            version: "1".into(),
        },
        ready_timeout_ms: 1_000,
        heartbeat_timeout_ms: 1_000,
        drain_timeout_ms: 1_000,
    }
}

fn supervised_profile() -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        credential_egress: None,
        driver: supervised_declaration(),
        ..durable_profile()
    }
}

fn unsupported_egress() -> CredentialEgressCapabilities {
    CredentialEgressCapabilities {
        enforcement: CredentialEgressEnforcement::Unsupported,
        credential_mode: CredentialEgressMode::Snapshot,
        intercepted_protocols: Vec::new(),
    }
}

fn registry(
    drivers: Vec<Arc<dyn ManagedRuntimeProviderDriverPort>>,
) -> ManagedRuntimeProviderRegistry {
    ManagedRuntimeProviderRegistry::new(drivers).expect("registry")
}

fn single(driver: FakeProviderDriver) -> ManagedRuntimeProviderRegistry {
    registry(vec![Arc::new(driver)])
}

async fn prepare(
    registry: &ManagedRuntimeProviderRegistry,
    provider: &str,
    placement: ManagedRuntimeProviderPlacement,
    profile: ManagedRuntimeProfile,
) -> Result<ManagedRuntimeProviderSelection, PortError> {
    registry
        .prepare(PrepareProviderInput {
            provider: provider.into(),
            placement,
            scope: scope(),
            profile,
            provider_config: serde_json::Map::new(),
        })
        .await
}

fn assert_rejects(
    result: Result<ManagedRuntimeProviderSelection, PortError>,
    needle: &str,
) -> PortError {
    let error = result.expect_err("prepare must reject");
    assert!(
        error.message().contains(needle),
        "expected {needle:?} in {:?}",
        error.message()
    );
    error
}

#[tokio::test]
async fn projects_a_provider_supervisor_transport_into_the_supervised_harness_lane() {
    let mut descriptor = provider_descriptor("supervised-provider");
    descriptor.capabilities.harness.drivers = vec![
        HarnessDriverType::AmaWorker,
        HarnessDriverType::OpenmaSupervised,
    ];
    descriptor.credential_egress = unsupported_egress();
    let transport = ScriptedSupervisorTransport::new(vec![
        HarnessSupervisorEvent::Ready {
            protocol: "openma-harness-supervisor-v1".into(),
        },
        HarnessSupervisorEvent::Completed { exit_code: 0 },
        HarnessSupervisorEvent::Drained,
    ]);
    let recorder = transport.recorder();
    let mut resources = provider_resources();
    resources.credential_egress = None;
    resources.supervisor_transport = Some(Arc::new(transport));
    let registry = single(FakeProviderDriver::returning(descriptor, resources));

    let selection = prepare(
        &registry,
        "supervised-provider",
        ManagedRuntimeProviderPlacement::InProcess,
        supervised_profile(),
    )
    .await
    .expect("admitted");

    let result = selection
        .resources
        .harness_driver
        .run(RunHarnessInput {
            scope: scope(),
            fence: RuntimeResourceFence {
                workspace_id: "workspace_1".into(),
                environment_id: "environment_1".into(),
                session_id: "session_1".into(),
                work_id: "work_1".into(),
                owner_id: "owner_1".into(),
                generation: 1,
                token: SecretString::new("fence_1"),
                expires_at: "2026-09-07T12:00:00.000Z".into(),
            },
            sandbox: ManagedSandboxLease {
                provider: "supervised-provider".into(),
                runtime_id: "runtime_1".into(),
                metadata: None,
            },
            workspace_path: "/workspace".into(),
            output_path: Some("/mnt/session/outputs".into()),
            driver: supervised_declaration(),
            checkpoint: None,
            signal: AbortController::new().signal(),
        })
        .await;
    assert_eq!(result, Ok(ManagedWorkExecutionResult::Completed));
    assert_eq!(
        recorder.commands(),
        vec![
            HarnessSupervisorCommand::Start {
                scope: scope(),
                harness: HarnessIdentity {
                    id: "pi".into(),
                    version: "1".into()
                },
                workspace_path: "/workspace".into(),
                output_path: Some("/mnt/session/outputs".into()),
            },
            HarnessSupervisorCommand::Drain,
        ]
    );
    assert_eq!(
        serde_json::to_value(&recorder.commands()[0]).unwrap(),
        serde_json::json!({
            "type": "start",
            "scope": {
                "workspaceId": "workspace_1",
                "environmentId": "environment_1",
                "sessionId": "session_1",
                "workId": "work_1",
            },
            "harness": {"id": "pi", "version": "1"},
            "workspacePath": "/workspace",
            "outputPath": "/mnt/session/outputs",
        })
    );
}

#[tokio::test]
async fn rejects_a_supervised_provider_that_omits_both_the_driver_and_transport_port() {
    let mut descriptor = provider_descriptor("broken-supervised");
    descriptor.capabilities.harness.drivers = vec![
        HarnessDriverType::AmaWorker,
        HarnessDriverType::OpenmaSupervised,
    ];
    descriptor.credential_egress = unsupported_egress();
    let mut resources = provider_resources();
    resources.credential_egress = None;
    let registry = single(FakeProviderDriver::returning(descriptor, resources));

    let error = assert_rejects(
        prepare(
            &registry,
            "broken-supervised",
            ManagedRuntimeProviderPlacement::InProcess,
            supervised_profile(),
        )
        .await,
        "advertises openma_supervised without a HarnessSupervisorTransportPort",
    );
    assert_eq!(
        error.message(),
        "broken-supervised advertises openma_supervised without a HarnessSupervisorTransportPort"
    );
    assert_eq!(error.kind(), ErrorKind::Capability);
}

#[tokio::test]
async fn validates_registry_identity_and_placement_before_allocation() {
    let empty = ManagedRuntimeProviderRegistry::new(vec![Arc::new(FakeProviderDriver::returning(
        provider_descriptor(""),
        provider_resources(),
    ))])
    .expect_err("empty id");
    assert_eq!(
        empty.message(),
        "Managed Runtime provider id must not be empty"
    );
    assert_eq!(empty.kind(), ErrorKind::InvalidArgument);

    let duplicate = ManagedRuntimeProviderRegistry::new(vec![
        Arc::new(FakeProviderDriver::returning(
            provider_descriptor("duplicate"),
            provider_resources(),
        )),
        Arc::new(FakeProviderDriver::returning(
            provider_descriptor("duplicate"),
            provider_resources(),
        )),
    ])
    .expect_err("duplicate id");
    assert_eq!(
        duplicate.message(),
        "Duplicate Managed Runtime provider: duplicate"
    );
    assert_eq!(duplicate.kind(), ErrorKind::Failure);

    let driver = Arc::new(FakeProviderDriver::returning(
        provider_descriptor("known"),
        provider_resources(),
    ));
    let registry = registry(vec![driver.clone()]);
    let descriptors = registry.descriptors();
    assert_eq!(descriptors.len(), 1);
    assert_eq!(descriptors[0].provider, "known");

    let unknown = assert_rejects(
        prepare(
            &registry,
            "missing",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "Unknown Managed Runtime provider",
    );
    assert_eq!(
        unknown.message(),
        "Unknown Managed Runtime provider: missing"
    );

    let placement = assert_rejects(
        prepare(
            &registry,
            "known",
            ManagedRuntimeProviderPlacement::DriverService,
            durable_profile(),
        )
        .await,
        "does not support driver_service placement",
    );
    assert_eq!(
        placement.message(),
        "known does not support driver_service placement"
    );
    assert_eq!(placement.kind(), ErrorKind::Capability);
    assert!(driver.creates().is_empty(), "nothing allocated");
}

#[tokio::test]
async fn detects_resource_plan_drift_after_provider_allocation() {
    let mut descriptor = provider_descriptor("drift");
    descriptor.capabilities.workspace.strategies = vec![
        WorkspaceStrategy::DurableMount,
        WorkspaceStrategy::CheckpointRestore,
    ];
    let mut resources = provider_resources();
    resources.workspace = Arc::new(CapabilityOnlyWorkspace {
        strategies: vec![WorkspaceStrategy::CheckpointRestore],
    });
    let registry = single(FakeProviderDriver::returning(descriptor, resources));

    let error = assert_rejects(
        prepare(
            &registry,
            "drift",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "drifted from the advertised capability plan",
    );
    assert_eq!(
        error.message(),
        "drift resource Ports drifted from the advertised capability plan"
    );
}

#[tokio::test]
async fn requires_the_checkpoint_and_credential_egress_ports_advertised_by_a_provider() {
    let checkpoint_profile = ManagedRuntimeProfile {
        credential_egress: None,
        runtime_checkpoint: RuntimeCheckpointRequirement::Required,
        ..durable_profile()
    };
    let filesystem_sandbox = || SandboxResourceCapabilities {
        suspend_resume: SuspendResume::Unsupported,
        hard_terminate: HardTerminate::Supported,
        runtime_checkpoints: vec![RuntimeCheckpointKind::Filesystem],
    };
    let mut checkpoint_descriptor = provider_descriptor("checkpoint");
    checkpoint_descriptor.capabilities.sandbox = filesystem_sandbox();

    let mut without_port = provider_resources();
    without_port.sandbox = Arc::new(CapabilityOnlySandbox::new(filesystem_sandbox()));
    without_port.credential_egress = None;
    let missing_checkpoint = single(FakeProviderDriver::returning(
        checkpoint_descriptor.clone(),
        without_port.clone(),
    ));
    let error = assert_rejects(
        prepare(
            &missing_checkpoint,
            "checkpoint",
            ManagedRuntimeProviderPlacement::InProcess,
            checkpoint_profile.clone(),
        )
        .await,
        "without a RuntimeCheckpointPort",
    );
    assert_eq!(
        error.message(),
        "checkpoint advertises runtime checkpoints without a RuntimeCheckpointPort"
    );

    let mut with_port = without_port;
    with_port.runtime_checkpoint = Some(Arc::new(UnusedRuntimeCheckpoint));
    let with_checkpoint = single(FakeProviderDriver::returning(
        checkpoint_descriptor,
        with_port,
    ));
    let selection = prepare(
        &with_checkpoint,
        "checkpoint",
        ManagedRuntimeProviderPlacement::InProcess,
        checkpoint_profile,
    )
    .await
    .expect("admitted");
    assert_eq!(
        selection.plan.runtime_checkpoint,
        Some(RuntimeCheckpointKind::Filesystem)
    );

    let mut no_egress = provider_resources();
    no_egress.credential_egress = None;
    let missing_egress = single(FakeProviderDriver::returning(
        provider_descriptor("missing-egress"),
        no_egress,
    ));
    let error = assert_rejects(
        prepare(
            &missing_egress,
            "missing-egress",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "without a CredentialEgressPort",
    );
    assert_eq!(
        error.message(),
        "missing-egress advertises enforced credential egress without a CredentialEgressPort"
    );

    // The TypeScript fake reports `best_effort`, which is not an enforcement literal; the
    // closest valid non-enforced value is `advisory`.
    let mut weak = provider_resources();
    weak.credential_egress = Some(Arc::new(CapabilityOnlyEgress {
        capabilities: CredentialEgressCapabilities {
            enforcement: CredentialEgressEnforcement::Advisory,
            credential_mode: CredentialEgressMode::Live,
            intercepted_protocols: Vec::new(),
        },
    }));
    let weak_egress = single(FakeProviderDriver::returning(
        provider_descriptor("weak-egress"),
        weak,
    ));
    let error = assert_rejects(
        prepare(
            &weak_egress,
            "weak-egress",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "cannot enforce credential egress",
    );
    assert_eq!(
        error.message(),
        "weak-egress resource Port cannot enforce credential egress"
    );

    let complete = single(FakeProviderDriver::returning(
        provider_descriptor("complete"),
        provider_resources(),
    ));
    let selection = prepare(
        &complete,
        "complete",
        ManagedRuntimeProviderPlacement::InProcess,
        durable_profile(),
    )
    .await
    .expect("admitted");
    assert_eq!(selection.descriptor.provider, "complete");
}

#[tokio::test]
async fn rejects_an_incompatible_replacement_before_allocating_provider_compute() {
    let mut descriptor = provider_descriptor("ephemeral-only");
    descriptor.capabilities.workspace.strategies = vec![WorkspaceStrategy::Ephemeral];
    descriptor.capabilities.outputs.strategies = Vec::new();
    descriptor.credential_egress = unsupported_egress();
    let driver = Arc::new(FakeProviderDriver::new(descriptor, |_| {
        Err(PortError::new("must not allocate"))
    }));
    let registry = registry(vec![driver.clone()]);

    let error = assert_rejects(
        prepare(
            &registry,
            "ephemeral-only",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "durable workspace",
    );
    assert_eq!(error.kind(), ErrorKind::Capability);
    assert_eq!(driver.creates().len(), 0);
}

#[tokio::test]
async fn rejects_a_driver_whose_returned_resource_ports_drift_from_its_descriptor() {
    let mut resources = provider_resources();
    resources.outputs = Arc::new(CapabilityOnlyOutputs {
        strategies: Vec::new(),
    });
    let registry = single(FakeProviderDriver::returning(
        provider_descriptor("drifting-provider"),
        resources,
    ));

    let error = assert_rejects(
        prepare(
            &registry,
            "drifting-provider",
            ManagedRuntimeProviderPlacement::InProcess,
            durable_profile(),
        )
        .await,
        "durable Session outputs",
    );
    assert_eq!(error.kind(), ErrorKind::Capability);
}
