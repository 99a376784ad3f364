//! Port of `runtime-host.test.ts` (reference §8.2, 9 cases): plan resolution through the
//! host's public API, and the lifecycle of a run against scripted ports — fence renewal
//! during slow materialization, exact call order of a publishing run, later generations,
//! fence loss, retained runtimes and runtime-checkpoint restore.
//!
//! Each TypeScript fixture records only some calls under its own names; the Rust `CallLog`
//! records every call, and each test projects it onto the names the TypeScript test records.
//!
//! Two further tests cover the periodic Session-input sync of the newest host (steps 22–23),
//! which the indexed TypeScript catalogue predates.

use omabox_contract::{
    HardTerminate, HarnessDriverDeclaration, HarnessDriverType, ManagedRuntimePlan,
    ManagedRuntimeProfile, ManagedRuntimeResourceCapabilities, ManagedWorkExecutionResult,
    Nullable, OutputDurability, OutputRequirement, OutputStrategy, PortError,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RunHarnessInput, RuntimeCheckpointKind,
    RuntimeCheckpointRef, RuntimeCheckpointRequirement, RuntimeProcessDeclaration,
    RuntimePublicationCandidate, RuntimeResourcePublication, RuntimeResourceScope,
    SandboxHarnessDriverCapabilities, SandboxResourceCapabilities, SessionOutputCapabilities,
    SessionOutputCapability, SessionOutputEntryCandidate, SuspendResume,
    WorkspacePersistenceCapabilities, WorkspaceRequirement, WorkspaceStrategy,
};
use omabox_host::plan::resolve_managed_runtime_plan;
use omabox_host::runtime_host::{ManagedRuntimeHost, ManagedRuntimeRunResult};
use omabox_testkit::fakes::{
    Fixture, FixtureSpec, Gate, enforced_binding, lease, live_checkpoint, manifest_candidate,
    outputs_binding, profile, request_checkpoint, resource, session, supervised_driver,
    workspace_binding, workspace_candidate,
};

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace_1", "environment_1", "session_1", "work_1")
}

fn direct_driver() -> HarnessDriverDeclaration {
    let mut process = RuntimeProcessDeclaration::command("node");
    process.args = Some(vec!["worker.mjs".into()]);
    HarnessDriverDeclaration::AmaWorker { process }
}

fn durable_profile() -> ManagedRuntimeProfile {
    profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Durable,
        RuntimeCheckpointRequirement::Optional,
        direct_driver(),
    )
}

/// The runtime-host fixture: `worker_1`-style owner, the given generation and token, a
/// scheduler that blocks until aborted, outputs advertising nothing.
fn fixture(owner_id: &str, generation: u64, token: &str, runtime_id: &str) -> Fixture {
    let fixture = Fixture::new(FixtureSpec {
        scope: scope(),
        owner_id: owner_id.into(),
        generation,
        token: token.into(),
        expires_at: "2026-09-03T12:00:00.000Z".into(),
        lease: lease("fake", runtime_id),
        egress_binding: enforced_binding("egress"),
    });
    fixture.outputs.advertises(Vec::new());
    fixture
}

fn host(fixture: &Fixture) -> ManagedRuntimeHost {
    fixture.host().expect("valid host settings")
}

fn capabilities(
    sandbox: SandboxResourceCapabilities,
    workspace: Vec<WorkspaceStrategy>,
    outputs: Vec<SessionOutputCapability>,
) -> ManagedRuntimeResourceCapabilities {
    ManagedRuntimeResourceCapabilities {
        sandbox,
        workspace: WorkspacePersistenceCapabilities {
            strategies: workspace,
        },
        outputs: SessionOutputCapabilities {
            strategies: outputs,
        },
        harness: SandboxHarnessDriverCapabilities {
            drivers: vec![HarnessDriverType::AmaWorker],
        },
    }
}

fn sandbox_caps(
    suspend_resume: SuspendResume,
    runtime_checkpoints: Vec<RuntimeCheckpointKind>,
) -> SandboxResourceCapabilities {
    SandboxResourceCapabilities {
        suspend_resume,
        hard_terminate: HardTerminate::Supported,
        runtime_checkpoints,
    }
}

fn output(strategy: OutputStrategy, durability: OutputDurability) -> SessionOutputCapability {
    SessionOutputCapability {
        strategy,
        durability,
    }
}

// ---------------------------------------------------------------------------------------------
// managed runtime plan

#[test]
fn selects_semantic_strategies_without_branching_on_a_provider_name() {
    let plan = resolve_managed_runtime_plan(
        &durable_profile(),
        &capabilities(
            sandbox_caps(SuspendResume::Unsupported, vec![]),
            vec![
                WorkspaceStrategy::CheckpointRestore,
                WorkspaceStrategy::Ephemeral,
            ],
            vec![output(
                OutputStrategy::FinalCollect,
                OutputDurability::Durable,
            )],
        ),
    )
    .expect("admitted");

    assert_eq!(
        plan,
        ManagedRuntimePlan {
            workspace_strategy: WorkspaceStrategy::CheckpointRestore,
            output_strategy: Some(OutputStrategy::FinalCollect),
            runtime_checkpoint: None,
            driver: direct_driver(),
        }
    );
}

#[test]
fn rejects_an_unavailable_durable_workspace_before_acquiring_resources() {
    let error = resolve_managed_runtime_plan(
        &durable_profile(),
        &capabilities(
            sandbox_caps(
                SuspendResume::Supported,
                vec![RuntimeCheckpointKind::Filesystem],
            ),
            vec![
                WorkspaceStrategy::RetainedRuntime,
                WorkspaceStrategy::Ephemeral,
            ],
            vec![output(
                OutputStrategy::FinalCollect,
                OutputDurability::Durable,
            )],
        ),
    )
    .expect_err("rejected");

    assert!(error.message().contains("durable workspace"), "{error}");
}

#[test]
fn covers_explicit_strategy_preferences_and_every_capability_requirement() {
    let caps = capabilities(
        sandbox_caps(
            SuspendResume::Supported,
            vec![RuntimeCheckpointKind::Filesystem],
        ),
        vec![
            WorkspaceStrategy::RetainedRuntime,
            WorkspaceStrategy::Ephemeral,
        ],
        vec![output(
            OutputStrategy::FinalCollect,
            OutputDurability::BestEffort,
        )],
    );
    let with = |workspace: WorkspaceRequirement,
                outputs: OutputRequirement,
                checkpoint: RuntimeCheckpointRequirement| {
        profile(workspace, outputs, checkpoint, direct_driver())
    };

    let mut preferred = with(
        WorkspaceRequirement::Continuable,
        OutputRequirement::BestEffort,
        RuntimeCheckpointRequirement::Required,
    );
    preferred.workspace.preferred_strategies = Some(vec![
        WorkspaceStrategy::DurableMount,
        WorkspaceStrategy::Ephemeral,
        WorkspaceStrategy::RetainedRuntime,
    ]);
    preferred.outputs.preferred_strategies = Some(vec![OutputStrategy::FinalCollect]);
    let plan = resolve_managed_runtime_plan(&preferred, &caps).expect("admitted");
    assert_eq!(plan.workspace_strategy, WorkspaceStrategy::RetainedRuntime);
    assert_eq!(plan.output_strategy, Some(OutputStrategy::FinalCollect));
    assert_eq!(
        plan.runtime_checkpoint,
        Some(RuntimeCheckpointKind::Filesystem)
    );

    let plan = resolve_managed_runtime_plan(
        &with(
            WorkspaceRequirement::Ephemeral,
            OutputRequirement::Disabled,
            RuntimeCheckpointRequirement::Disabled,
        ),
        &caps,
    )
    .expect("admitted");
    assert_eq!(plan.workspace_strategy, WorkspaceStrategy::RetainedRuntime);
    assert_eq!(plan.output_strategy, None);
    assert_eq!(plan.runtime_checkpoint, None);

    let mut durable_mount_only = with(
        WorkspaceRequirement::Continuable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
    );
    durable_mount_only.workspace.preferred_strategies = Some(vec![WorkspaceStrategy::DurableMount]);
    let error = resolve_managed_runtime_plan(&durable_mount_only, &caps).expect_err("rejected");
    assert!(error.message().contains("continuable workspace"), "{error}");

    let error = resolve_managed_runtime_plan(
        &with(
            WorkspaceRequirement::Ephemeral,
            OutputRequirement::Durable,
            RuntimeCheckpointRequirement::Disabled,
        ),
        &caps,
    )
    .expect_err("rejected");
    assert!(
        error.message().contains("durable Session outputs"),
        "{error}"
    );

    let mut no_checkpoints = caps.clone();
    no_checkpoints.sandbox.runtime_checkpoints.clear();
    let error = resolve_managed_runtime_plan(
        &with(
            WorkspaceRequirement::Ephemeral,
            OutputRequirement::Disabled,
            RuntimeCheckpointRequirement::Required,
        ),
        &no_checkpoints,
    )
    .expect_err("rejected");
    assert!(error.message().contains("runtime checkpoint"), "{error}");

    let mut supervised = with(
        WorkspaceRequirement::Ephemeral,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
    );
    supervised.driver = supervised_driver();
    let error = resolve_managed_runtime_plan(&supervised, &caps).expect_err("rejected");
    assert!(
        error.message().contains("openma_supervised harness driver"),
        "{error}"
    );
}

// ---------------------------------------------------------------------------------------------
// managed runtime lifecycle

#[tokio::test]
async fn renews_the_resource_fence_while_slow_resources_materialize_before_a_sandbox_exists() {
    let mut fixture = fixture("worker_1", 1, "fence_1", "runtime_1");
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
        direct_driver(),
    );
    fixture
        .scheduler
        .as_ref()
        .expect("fake scheduler")
        .wakes_first_n(1);
    let materialize_may_finish = Gate::new();
    let fence = fixture.fence();
    fixture.fences.renew.set({
        let gate = materialize_may_finish.clone();
        move |_| {
            gate.open();
            let fence = fence.clone();
            async move { Ok(RenewRuntimeFenceResult::Renewed { fence }) }
        }
    });
    fixture.workspace.materialize.set(move |_| {
        let gate = materialize_may_finish.clone();
        async move {
            gate.wait().await;
            Ok(workspace_binding("workspace-binding"))
        }
    });

    let result = tokio::time::timeout(
        std::time::Duration::from_secs(1),
        host(&fixture).run(fixture.input()),
    )
    .await
    .expect("within 1 s")
    .expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_eq!(fixture.fences.renew.count(), 1);
}

#[tokio::test]
async fn publishes_immutable_workspace_and_output_candidates_under_the_active_fence() {
    let mut fixture = fixture("worker_1", 7, "fence_7", "runtime_1");
    fixture.profile = durable_profile();
    fixture.outputs.advertises(vec![output(
        OutputStrategy::FinalCollect,
        OutputDurability::Durable,
    )]);
    fixture
        .fences
        .publish
        .returns(PublishRuntimeResourcesResult::Published { revision: 11 });
    fixture
        .workspace
        .materialize
        .returns(workspace_binding("workspace-binding-1"));
    fixture.workspace.checkpoint.returns(workspace_candidate(
        "workspace-candidate-1",
        "sha256:workspace",
        10,
    ));
    fixture
        .outputs
        .prepare
        .returns(outputs_binding("output-binding-1"));
    fixture
        .outputs
        .collect
        .returns(vec![SessionOutputEntryCandidate {
            logical_path: "report.md".into(),
            content_hash: "sha256:report".into(),
            size: 42,
            media_type: None,
        }]);
    fixture.outputs.finalize.returns(manifest_candidate(
        "output-candidate-1",
        "sha256:manifest",
        1,
    ));
    fixture
        .harness
        .run
        .set(|input: RunHarnessInput| async move {
            let mut request = live_checkpoint("checkpoint_1", "session_1");
            request.turn_id = Some("turn_1".into());
            request_checkpoint(&input, request).await?;
            Ok(ManagedWorkExecutionResult::Completed)
        });

    let result = host(&fixture).run(fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 11 });
    assert_eq!(
        fixture.log.select_bare(&[
            "fence.acquire",
            "workspace.materialize",
            "outputs.prepare",
            "sandbox.acquire",
            "workspace.attach",
            "outputs.attach",
            "harness.run",
            "workspace.checkpoint",
            "outputs.collect",
            "outputs.finalize",
            "fence.publish",
            "sandbox.terminate",
            "outputs.abort",
            "outputs.release",
            "workspace.release",
            "fence.release",
        ]),
        [
            "fence.acquire",
            "workspace.materialize",
            "outputs.prepare",
            "sandbox.acquire",
            "workspace.attach",
            "outputs.attach",
            "harness.run",
            "workspace.checkpoint",
            "outputs.collect",
            "outputs.finalize",
            "fence.publish",
            "workspace.checkpoint",
            "outputs.collect",
            "outputs.finalize",
            "fence.publish",
            "sandbox.terminate",
            "outputs.release",
            "workspace.release",
            "fence.release",
        ]
    );
    let acquire = fixture.sandbox.acquire.first().expect("acquired");
    assert_eq!(acquire.workspace.mount_path, "/workspace");
    assert_eq!(
        acquire.outputs.expect("outputs binding").mount_path,
        "/mnt/session/outputs"
    );
    for publish in fixture.fences.publish.calls() {
        assert_eq!(publish.fence, fixture.fence());
        assert_eq!(publish.workspace_candidate.id, "workspace-candidate-1");
        assert_eq!(
            publish.output_candidate.expect("output candidate").id,
            "output-candidate-1"
        );
    }
}

#[tokio::test]
async fn materializes_the_last_published_workspace_candidate_on_a_later_generation() {
    let mut fixture = fixture("worker_2", 2, "fence_2", "runtime_2");
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
        direct_driver(),
    );
    let previous = RuntimePublicationCandidate {
        id: "workspace-previous".into(),
        content_hash: "sha256:previous".into(),
        metadata: None,
    };
    fixture.fences.acquires_with_publication(
        fixture.fence(),
        RuntimeResourcePublication {
            generation: 1,
            revision: 4,
            workspace_candidate: previous.clone(),
            output_candidate: None,
            runtime_checkpoint: Nullable::Absent,
        },
    );
    fixture
        .fences
        .publish
        .returns(PublishRuntimeResourcesResult::Published { revision: 5 });

    host(&fixture).run(fixture.input()).await.expect("resolves");

    let materialize = fixture.workspace.materialize.first().expect("materialized");
    assert_eq!(materialize.active_checkpoint, Some(previous));
}

#[tokio::test]
async fn aborts_the_hand_and_never_publishes_after_the_resource_fence_is_lost() {
    let mut fixture = fixture("worker_1", 3, "fence_3", "runtime_1");
    fixture.profile = durable_profile();
    fixture.outputs.advertises(vec![output(
        OutputStrategy::FinalCollect,
        OutputDurability::Durable,
    )]);
    fixture
        .scheduler
        .as_ref()
        .expect("fake scheduler")
        .wakes_first_n(1);
    fixture.fences.renew.returns(RenewRuntimeFenceResult::Lost);
    fixture.harness.waits_for_abort();

    let result = host(&fixture).run(fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert!(!fixture.workspace.checkpoint.called());
    assert!(!fixture.outputs.finalize.called());
    assert!(!fixture.fences.publish.called());
}

#[tokio::test]
async fn suspends_and_retains_a_runtime_only_after_its_candidate_is_published() {
    let mut fixture = fixture("worker_1", 1, "fence_1", "sandbox-1");
    fixture.profile = profile(
        WorkspaceRequirement::Continuable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Optional,
        direct_driver(),
    );
    fixture.sandbox.acquire.returns(lease("e2b", "sandbox-1"));
    fixture.sandbox.advertises(
        SuspendResume::Supported,
        vec![RuntimeCheckpointKind::Process],
    );
    fixture
        .workspace
        .advertises(vec![WorkspaceStrategy::RetainedRuntime]);
    fixture.workspace.checkpoint.returns(workspace_candidate(
        "runtime-candidate",
        "sha256:runtime",
        1,
    ));
    fixture
        .with_runtime_checkpoint()
        .create
        .returns(RuntimeCheckpointRef {
            provider: "e2b".into(),
            checkpoint_id: "process-checkpoint-1".into(),
            kind: RuntimeCheckpointKind::Process,
            source_runtime_id: "sandbox-1".into(),
            session_id: "session_1".into(),
            work_generation: 1,
            workspace_revision: 1,
            harness_version: "ama-worker-v1".into(),
            runtime_identity: "test-runtime".into(),
        });

    let result = host(&fixture).run(fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_eq!(
        fixture.log.select_bare(&[
            "harness.run",
            "sandbox.suspend",
            "workspace.checkpoint",
            "runtime_checkpoint.create",
            "fence.publish",
            "sandbox.terminate",
            "workspace.release",
            "fence.release",
        ]),
        [
            "harness.run",
            "sandbox.suspend",
            "workspace.checkpoint",
            // Runtime checkpoints are created only after the canonical workspace candidate
            // exists, so the checkpoint records its revision.
            "runtime_checkpoint.create",
            "fence.publish",
            "workspace.release",
            "fence.release",
        ]
    );
    assert!(!fixture.sandbox.terminate.called());
}

#[tokio::test]
async fn restores_a_compatible_published_process_checkpoint_before_allocating_a_new_runtime() {
    let mut fixture = fixture("worker_restore", 2, "fence_restore", "runtime-restored");
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Optional,
        direct_driver(),
    );
    let checkpoint = RuntimeCheckpointRef {
        provider: "fake".into(),
        checkpoint_id: "process-checkpoint-1".into(),
        kind: RuntimeCheckpointKind::Process,
        source_runtime_id: "runtime-previous".into(),
        session_id: "session_1".into(),
        work_generation: 1,
        workspace_revision: 1,
        harness_version: "ama-worker-v1".into(),
        runtime_identity:
            r#"{"process":{"args":["worker.mjs"],"command":"node","envKeys":[]},"type":"ama_worker"}"#
                .into(),
    };
    fixture.fences.acquires_with_publication(
        fixture.fence(),
        RuntimeResourcePublication {
            generation: 1,
            revision: 1,
            workspace_candidate: RuntimePublicationCandidate {
                id: "workspace-1".into(),
                content_hash: "sha256:one".into(),
                metadata: None,
            },
            output_candidate: None,
            runtime_checkpoint: Nullable::Value(checkpoint.clone()),
        },
    );
    fixture
        .fences
        .publish
        .returns(PublishRuntimeResourcesResult::Published { revision: 2 });
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    let runtime_checkpoints = fixture.with_runtime_checkpoint();
    runtime_checkpoints
        .restore
        .returns(lease("fake", "runtime-restored"));
    fixture
        .workspace
        .checkpoint
        .returns(workspace_candidate("workspace-next", "sha256:next", 2));

    let result = host(&fixture).run(fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 2 });
    assert_eq!(
        runtime_checkpoints
            .restore
            .first()
            .expect("restored")
            .checkpoint,
        checkpoint
    );
    assert!(!fixture.sandbox.acquire.called());
}

// ---------------------------------------------------------------------------------------------
// construction (reference §2.1; not a separate TypeScript case)

#[test]
fn rejects_a_session_input_sync_interval_that_is_not_a_positive_integer() {
    let mut fixture = fixture("worker_1", 1, "fence_1", "runtime_1");
    for invalid in [0, 1 << 53] {
        fixture.session_input_sync_interval_ms = Some(invalid);
        let error = fixture.host().expect_err("rejected");
        assert_eq!(
            error.message(),
            "sessionInputSyncIntervalMs must be a positive integer"
        );
    }
    fixture.session_input_sync_interval_ms = Some((1 << 53) - 1);
    assert!(fixture.host().is_ok());
}

// ---------------------------------------------------------------------------------------------
// periodic Session-input sync (newest host, steps 22–23; not in the indexed catalogue)

#[tokio::test(start_paused = true)]
async fn periodically_synchronizes_materializer_owned_writable_memory_stores() {
    let mut fixture = fixture("worker_1", 4, "fence_4", "runtime_1");
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
        supervised_driver(),
    );
    fixture
        .harness
        .advertises(vec![HarnessDriverType::OpenmaSupervised]);
    fixture.without_scheduler();
    fixture.session_input_sync_interval_ms = Some(100);
    let materializer = fixture.with_session_inputs();
    let two_syncs = Gate::new();
    materializer.synchronize.set({
        let two_syncs = two_syncs.clone();
        let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        move |_| {
            if count.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1 == 2 {
                two_syncs.open();
            }
            async { Ok(()) }
        }
    });
    fixture.harness.run.set(move |_| {
        let two_syncs = two_syncs.clone();
        async move {
            two_syncs.wait().await;
            Ok(ManagedWorkExecutionResult::Completed)
        }
    });
    let mut input = fixture.input();
    input.session = Some(session(
        &scope(),
        &[],
        vec![resource(
            "memory_store",
            &[
                ("memory_store_id", "memstore_01"),
                ("mount_path", "/workspace/memory"),
                ("access", "read_write"),
            ],
        )],
    ));

    let result = host(&fixture).run(input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let keys: Vec<String> = materializer
        .synchronize
        .calls()
        .into_iter()
        .map(|call| call.idempotency_key)
        .collect();
    assert_eq!(
        keys,
        [
            "work_1:4:session-inputs-synchronize-periodic-1",
            "work_1:4:session-inputs-synchronize-periodic-2",
            "work_1:4:session-inputs-synchronize-final",
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn fails_the_run_when_a_periodic_session_input_sync_fails() {
    let mut fixture = fixture("worker_1", 4, "fence_4", "runtime_1");
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
        supervised_driver(),
    );
    fixture
        .harness
        .advertises(vec![HarnessDriverType::OpenmaSupervised]);
    fixture.without_scheduler();
    fixture.session_input_sync_interval_ms = Some(100);
    let materializer = fixture.with_session_inputs();
    materializer
        .synchronize
        .fails(PortError::new("memory store write rejected"));
    fixture.harness.waits_for_abort();
    let mut input = fixture.input();
    input.session = Some(session(
        &scope(),
        &[],
        vec![resource(
            "memory_store",
            &[("memory_store_id", "memstore_01")],
        )],
    ));

    let result = host(&fixture).run(input).await.expect("resolves");

    assert_eq!(
        result,
        ManagedRuntimeRunResult::Failed {
            error: PortError::new("memory store write rejected")
        }
    );
    assert!(!fixture.fences.publish.called());
    assert!(fixture.log.contains("sandbox.terminate:failed"));
}
