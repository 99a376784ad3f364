//! Port of `runtime-fault-matrix.test.ts` (reference §8.1, 34 cases): the managed runtime
//! host against the fault-matrix fixture, one fault per test, asserting the result, which
//! steps ran, and the exact cleanup order.
//!
//! Parameterized TypeScript cases (`it.each`) are one Rust test per row, named
//! `<case>_<row>`. Where a case cannot be expressed 1:1 in Rust the test says how it differs.

use omabox_contract::{
    AbortController, CredentialEgressRequirement, EnqueueRuntimeOrphanInput, HarnessDriverType,
    LiveTurnCheckpoint, ManagedRuntimeProfile, ManagedWorkExecutionResult, Nullable,
    OutputDurability, OutputRequirement, OutputStrategy, PortError, PublishRuntimeResourcesResult,
    RenewRuntimeFenceResult, RunHarnessInput, RuntimeCheckpointKind, RuntimeCheckpointRef,
    RuntimeCheckpointRequirement, RuntimeOrphanPort, RuntimeOrphanRecord,
    RuntimeProcessDeclaration, RuntimePublicationCandidate, RuntimeResourcePublication,
    SandboxHeartbeatResult, SessionInputAccessPort, SessionOutputCapability, SuspendResume,
    TerminationReason, runtime_orphan_id,
};
use omabox_host::reconciler::{
    ManagedRuntimeOrphanReconciler, ReconcileSummary, reconcile_limit_from_json,
};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_testkit::fakes::{
    FakeSessionAccess, Fixture, Gate, ReapCall, compatible_ref, egress_capabilities, lease,
    request_checkpoint, resource, session, workspace_binding,
};
use std::collections::BTreeMap;
use std::sync::Arc;

// ---------------------------------------------------------------------------------------------
// helpers

async fn run(
    fixture: &Fixture,
    input: ManagedRuntimeRunInput,
) -> Result<ManagedRuntimeRunResult, PortError> {
    fixture
        .host()
        .expect("valid host settings")
        .run(input)
        .await
}

fn completed(revision: u64) -> ManagedRuntimeRunResult {
    ManagedRuntimeRunResult::Completed { revision }
}

fn failed_message(result: &ManagedRuntimeRunResult) -> &str {
    match result {
        ManagedRuntimeRunResult::Failed { error } => error.message(),
        other => panic!("expected failed, got {other:?}"),
    }
}

fn checkpoint(id: &str, session_id: &str, turn_id: Option<&str>) -> LiveTurnCheckpoint {
    LiveTurnCheckpoint {
        checkpoint_id: id.to_owned(),
        session_id: session_id.to_owned(),
        turn_id: turn_id.map(str::to_owned),
    }
}

fn with_runtime_checkpoint(
    profile: &ManagedRuntimeProfile,
    mode: RuntimeCheckpointRequirement,
) -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        runtime_checkpoint: mode,
        ..profile.clone()
    }
}

fn with_egress(
    profile: &ManagedRuntimeProfile,
    requirement: CredentialEgressRequirement,
) -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        credential_egress: Some(omabox_contract::CredentialEgressProfile { requirement }),
        ..profile.clone()
    }
}

/// A workspace materialize that returns only once its signal aborted.
fn materialize_waits_for_abort(fixture: &Fixture) {
    fixture.workspace.materialize.set(|input| async move {
        input.signal.aborted().await;
        Ok(workspace_binding("workspace-fault"))
    });
}

// ---------------------------------------------------------------------------------------------
// 1

#[tokio::test]
async fn fences_and_aborts_outputs_when_a_live_turn_checkpoint_loses_ownership() {
    let fixture = Fixture::fault_matrix();
    fixture
        .fences
        .publish
        .returns(PublishRuntimeResourcesResult::Lost);
    let session_id = fixture.scope().session_id;
    fixture.harness.run.set(move |input: RunHarnessInput| {
        let request = checkpoint("checkpoint_turn_1", &session_id, Some("turn_1"));
        async move {
            request_checkpoint(&input, request).await?;
            Ok(ManagedWorkExecutionResult::Completed)
        }
    });

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert_eq!(fixture.workspace.checkpoint.count(), 1);
    assert_eq!(fixture.outputs.finalize.count(), 1);
    assert!(fixture.log.contains("outputs.abort:lease_lost"));
    assert!(fixture.log.contains("sandbox.terminate:lease_lost"));
}

// 2–4 `rejects an invalid live checkpoint: %s`

async fn rejects_an_invalid_live_checkpoint(requests: Vec<LiveTurnCheckpoint>) {
    let fixture = Fixture::fault_matrix();
    fixture.harness.requests_checkpoints(requests);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(
        failed_message(&result),
        "Harness requested an invalid or duplicate live checkpoint"
    );
}

#[tokio::test]
async fn rejects_an_invalid_live_checkpoint_empty_id() {
    rejects_an_invalid_live_checkpoint(vec![checkpoint("", "session_fault", None)]).await;
}

#[tokio::test]
async fn rejects_an_invalid_live_checkpoint_cross_session() {
    rejects_an_invalid_live_checkpoint(vec![checkpoint(
        "checkpoint_wrong_session",
        "session_intruder",
        None,
    )])
    .await;
}

#[tokio::test]
async fn rejects_an_invalid_live_checkpoint_duplicate() {
    rejects_an_invalid_live_checkpoint(vec![
        checkpoint("checkpoint_duplicate", "session_fault", None),
        checkpoint("checkpoint_duplicate", "session_fault", None),
    ])
    .await;
}

// 5

#[tokio::test]
async fn checkpoints_a_live_turn_when_session_output_persistence_is_disabled() {
    let mut fixture = Fixture::fault_matrix();
    fixture.profile.outputs.requirement = OutputRequirement::Disabled;
    fixture.harness.requests_checkpoints(vec![checkpoint(
        "checkpoint_without_outputs",
        "session_fault",
        None,
    )]);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, completed(1));
    assert!(!fixture.outputs.prepare.called());
    assert!(!fixture.outputs.collect.called());
    assert!(!fixture.outputs.finalize.called());
    assert_eq!(fixture.fences.publish.count(), 2);
}

// 6

#[tokio::test]
async fn accepts_an_empty_session_resource_set_without_a_materializer() {
    let fixture = Fixture::fault_matrix();
    let mut input = fixture.input();
    input.session = Some(session(&fixture.scope(), &[], Vec::new()));

    assert_eq!(run(&fixture, input).await.expect("resolves"), completed(1));
}

// 7

#[tokio::test]
async fn rejects_an_advertised_runtime_checkpoint_strategy_when_its_port_is_absent() {
    let mut fixture = Fixture::fault_matrix();
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    fixture.profile =
        with_runtime_checkpoint(&fixture.profile, RuntimeCheckpointRequirement::Optional);

    let error = run(&fixture, fixture.input()).await.expect_err("rejects");

    assert!(
        error
            .message()
            .contains("does not provide RuntimeCheckpointPort"),
        "{error}"
    );
    assert!(!fixture.fences.acquire.called());
}

// 8

#[tokio::test]
async fn fails_the_fenced_transaction_when_required_credential_egress_cannot_be_prepared() {
    let mut fixture = Fixture::fault_matrix();
    let egress = fixture.with_credential_egress();
    egress.prepare.returns(None);
    fixture.profile = with_egress(&fixture.profile, CredentialEgressRequirement::Required);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(
        failed_message(&result),
        "Required credential egress could not be prepared for this Session"
    );
    assert!(!fixture.sandbox.acquire.called());
}

// 9

#[tokio::test]
async fn fences_an_execution_that_was_cancelled_before_resource_materialization() {
    let fixture = Fixture::fault_matrix();
    let controller = AbortController::new();
    controller.abort(PortError::new("caller stopped"));
    let mut input = fixture.input();
    input.signal = Some(controller.signal());

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert!(!fixture.harness.run.called());
    assert!(fixture.log.contains("fence.release:lease_lost"));
}

// 10

#[tokio::test]
async fn handles_cancellation_that_races_a_completed_scheduler_sleep() {
    let fixture = Fixture::fault_matrix();
    let controller = AbortController::new();
    let scheduler = fixture.scheduler.clone().expect("fake scheduler");
    scheduler.sleep.set({
        let controller = controller.clone();
        move |_| {
            controller.abort(PortError::new("cancelled while asleep"));
            async { Ok(()) }
        }
    });
    materialize_waits_for_abort(&fixture);
    let mut input = fixture.input();
    input.signal = Some(controller.signal());

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert!(!fixture.fences.renew.called());
}

// 11

#[tokio::test]
async fn aborts_the_active_harness_when_the_provider_reports_its_sandbox_lease_lost() {
    let fixture = Fixture::fault_matrix();
    let ready = Gate::new();
    let may_heartbeat = Gate::new();
    fixture
        .scheduler
        .as_ref()
        .expect("fake scheduler")
        .wakes_on(may_heartbeat.clone());
    fixture.sandbox.acquire.set({
        let ready = ready.clone();
        move |_| {
            ready.open();
            async { Ok(lease("fake", "runtime-fault")) }
        }
    });
    fixture
        .sandbox
        .heartbeat
        .returns(SandboxHeartbeatResult::Lost);
    fixture.harness.run.set(move |input: RunHarnessInput| {
        let (ready, may_heartbeat) = (ready.clone(), may_heartbeat.clone());
        async move {
            ready.wait().await;
            may_heartbeat.open();
            input.signal.aborted().await;
            Ok(ManagedWorkExecutionResult::Aborted)
        }
    });

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert_eq!(fixture.sandbox.heartbeat.count(), 1);
}

// 12–13 `turns a %s heartbeat failure into lease loss`

async fn turns_a_heartbeat_failure_into_lease_loss(failure_at: &'static str) {
    let fixture = Fixture::fault_matrix();
    let failure = PortError::new(format!("{failure_at} heartbeat failed"));
    fixture
        .scheduler
        .as_ref()
        .expect("fake scheduler")
        .sleep
        .set({
            let failure = failure.clone();
            move |_| {
                let outcome = if failure_at == "scheduler" {
                    Err(failure.clone())
                } else {
                    Ok(())
                };
                async move { outcome }
            }
        });
    let fence = fixture.fence();
    fixture.fences.renew.set(move |_| {
        let outcome = if failure_at == "fence" {
            Err(failure.clone())
        } else {
            Ok(RenewRuntimeFenceResult::Renewed {
                fence: fence.clone(),
            })
        };
        async move { outcome }
    });
    materialize_waits_for_abort(&fixture);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
}

#[tokio::test]
async fn turns_a_scheduler_heartbeat_failure_into_lease_loss() {
    turns_a_heartbeat_failure_into_lease_loss("scheduler").await;
}

#[tokio::test]
async fn turns_a_fence_heartbeat_failure_into_lease_loss() {
    turns_a_heartbeat_failure_into_lease_loss("fence").await;
}

// 14

#[tokio::test]
async fn passes_an_omitted_session_content_accessor_through_the_materializer_boundary() {
    let mut fixture = Fixture::fault_matrix();
    let materializer = fixture.with_session_inputs();
    let mut input = fixture.input();
    input.session = Some(session(
        &fixture.scope(),
        &[],
        vec![resource(
            "file",
            &[
                ("id", "resource_file"),
                ("file_id", "file_01"),
                ("mount_path", "/workspace/input.txt"),
            ],
        )],
    ));

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, completed(1));
    let call = materializer.materialize.first().expect("materialized");
    assert!(call.context.access.is_none(), "no access key");
}

// 15

#[tokio::test]
async fn passes_a_provided_session_content_accessor_through_unchanged() {
    let mut fixture = Fixture::fault_matrix();
    let materializer = fixture.with_session_inputs();
    let access: Arc<dyn SessionInputAccessPort> = Arc::new(FakeSessionAccess);
    let mut input = fixture.input();
    input.session = Some(session(&fixture.scope(), &[], Vec::new()));
    input.session_input_access = Some(Arc::clone(&access));

    run(&fixture, input).await.expect("resolves");

    let call = materializer.materialize.first().expect("materialized");
    let passed = call.context.access.expect("access passed");
    assert!(Arc::ptr_eq(&passed, &access), "the same accessor object");
}

// 16: vitest fake timers → tokio's paused clock, which auto-advances to the next timer when
// every task is idle (the TypeScript test advances 10 ms by hand).

#[tokio::test(start_paused = true)]
async fn uses_the_default_heartbeat_scheduler_for_both_timer_wake_and_cleanup_cancellation() {
    let mut fixture = Fixture::fault_matrix();
    fixture.without_scheduler();
    fixture.heartbeat_interval_ms = 10;
    let started = Gate::new();
    let renewed = Gate::new();
    let fence = fixture.fence();
    fixture.fences.renew.set({
        let renewed = renewed.clone();
        move |_| {
            renewed.open();
            let fence = fence.clone();
            async move { Ok(RenewRuntimeFenceResult::Renewed { fence }) }
        }
    });
    fixture.harness.run.set({
        let started = started.clone();
        move |_| {
            started.open();
            let renewed = renewed.clone();
            async move {
                renewed.wait().await;
                Ok(ManagedWorkExecutionResult::Completed)
            }
        }
    });

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert!(started.is_open());
    assert_eq!(result, completed(1));
    assert_eq!(fixture.fences.renew.count(), 1);
    assert_eq!(fixture.sandbox.heartbeat.count(), 1);
}

// 17

#[tokio::test]
async fn publishes_a_compatible_runtime_checkpoint_with_the_process_identity() {
    let mut fixture = Fixture::fault_matrix();
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    let checkpoints = fixture.with_runtime_checkpoint();
    let mut process = RuntimeProcessDeclaration::command("community-worker");
    process.cwd = Some("/workspace/project".into());
    process.env = Some(BTreeMap::from([(
        "TOKEN".to_owned(),
        "must-not-be-persisted".to_owned(),
    )]));
    fixture.profile = ManagedRuntimeProfile {
        runtime_checkpoint: RuntimeCheckpointRequirement::Required,
        driver: omabox_contract::HarnessDriverDeclaration::AmaWorker { process },
        ..fixture.profile.clone()
    };

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, completed(1));
    let create = checkpoints.create.first().expect("created");
    assert_eq!(create.harness_version, "ama-worker-v1");
    assert!(create.runtime_identity.contains("/workspace/project"));
    // The TypeScript test JSON-serializes the create input; its Debug form is the Rust
    // equivalent that includes every field.
    assert!(!format!("{create:?}").contains("must-not-be-persisted"));
    let publish = fixture.fences.publish.last().expect("published");
    let published = publish
        .runtime_checkpoint
        .as_option()
        .expect("runtime checkpoint");
    assert_eq!(published.checkpoint_id, "checkpoint_1");
}

// 18

#[tokio::test]
async fn falls_back_to_a_fresh_sandbox_when_a_compatible_checkpoint_cannot_be_restored() {
    let mut fixture = Fixture::fault_matrix();
    fixture.fences.acquires_with_publication(
        fixture.fence(),
        RuntimeResourcePublication {
            generation: 0,
            revision: 1,
            workspace_candidate: RuntimePublicationCandidate {
                id: "workspace-old".into(),
                content_hash: "sha256:old".into(),
                metadata: None,
            },
            output_candidate: None,
            runtime_checkpoint: Nullable::Value(RuntimeCheckpointRef {
                provider: "fake".into(),
                checkpoint_id: "checkpoint-old".into(),
                kind: RuntimeCheckpointKind::Process,
                source_runtime_id: "runtime-old".into(),
                session_id: "session_fault".into(),
                work_generation: 0,
                workspace_revision: 1,
                harness_version: "ama-worker-v1".into(),
                runtime_identity:
                    r#"{"process":{"command":"community-worker","envKeys":[]},"type":"ama_worker"}"#
                        .into(),
            }),
        },
    );
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    fixture
        .sandbox
        .acquire
        .returns(lease("fake", "runtime-fresh"));
    let checkpoints = fixture.with_runtime_checkpoint();
    checkpoints
        .restore
        .fails(PortError::new("provider restore failed"));
    checkpoints
        .create
        .fails(PortError::new("fresh snapshot unavailable"));
    fixture.profile =
        with_runtime_checkpoint(&fixture.profile, RuntimeCheckpointRequirement::Optional);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, completed(1));
    assert_eq!(checkpoints.restore.count(), 1);
    assert_eq!(fixture.sandbox.acquire.count(), 1);
}

// 19–20 `handles a mismatched runtime-checkpoint workspace revision in %s mode`

async fn handles_a_mismatched_runtime_checkpoint_workspace_revision(
    mode: RuntimeCheckpointRequirement,
) -> Fixture {
    let mut fixture = Fixture::fault_matrix();
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    let checkpoints = fixture.with_runtime_checkpoint();
    checkpoints.create.set(|input| async move {
        let mut bad = compatible_ref(&input, "checkpoint_bad");
        bad.workspace_revision = input.workspace_revision + 1;
        Ok(bad)
    });
    fixture.profile = with_runtime_checkpoint(&fixture.profile, mode);
    fixture
}

#[tokio::test]
async fn handles_a_mismatched_runtime_checkpoint_workspace_revision_in_optional_mode() {
    let fixture = handles_a_mismatched_runtime_checkpoint_workspace_revision(
        RuntimeCheckpointRequirement::Optional,
    )
    .await;

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert!(
        matches!(result, ManagedRuntimeRunResult::Completed { .. }),
        "{result:?}"
    );
    let publish = fixture.fences.publish.last().expect("published");
    assert!(
        publish.runtime_checkpoint.is_absent(),
        "no runtimeCheckpoint key"
    );
}

#[tokio::test]
async fn handles_a_mismatched_runtime_checkpoint_workspace_revision_in_required_mode() {
    let fixture = handles_a_mismatched_runtime_checkpoint_workspace_revision(
        RuntimeCheckpointRequirement::Required,
    )
    .await;

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert!(
        matches!(result, ManagedRuntimeRunResult::Failed { .. }),
        "{result:?}"
    );
    assert!(!fixture.fences.publish.called());
}

// 21

#[tokio::test]
async fn fails_a_required_runtime_checkpoint_when_the_provider_cannot_create_it() {
    let mut fixture = Fixture::fault_matrix();
    fixture.sandbox.advertises(
        SuspendResume::Unsupported,
        vec![RuntimeCheckpointKind::Process],
    );
    let failure = PortError::new("snapshot backend unavailable");
    fixture
        .with_runtime_checkpoint()
        .create
        .fails(failure.clone());
    fixture.profile =
        with_runtime_checkpoint(&fixture.profile, RuntimeCheckpointRequirement::Required);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Failed { error: failure });
}

// 22: TypeScript throws the *string* "provider disconnected" and expects it passed to
// `enqueue` raw. Rust ports can only fail with a `PortError`, so the closest case is a
// failure whose message is that string; the host passes it (redacted, unchanged here).

#[tokio::test]
async fn records_a_non_error_provider_termination_failure_as_an_orphan() {
    let fixture = Fixture::fault_matrix();
    fixture
        .sandbox
        .terminate
        .fails(PortError::new("provider disconnected"));
    fixture.orphans.enqueue.set(|_| async { Ok(()) });

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, completed(1));
    let enqueued = fixture.orphans.enqueue.first().expect("enqueued");
    assert_eq!(enqueued.error.message(), "provider disconnected");
}

// 23: the TypeScript fixture's overriding `terminate` does not record a call; the Rust
// `CallLog` records every attempt, so the failed terminate appears first.

#[tokio::test]
async fn surfaces_failure_to_persist_an_orphan_after_completing_all_remaining_cleanup() {
    let fixture = Fixture::fault_matrix();
    let persistence_failure = PortError::new("orphan store unavailable");
    fixture
        .sandbox
        .terminate
        .fails(PortError::new("terminate failed"));
    fixture.orphans.enqueue.fails(persistence_failure.clone());

    let error = run(&fixture, fixture.input()).await.expect_err("rejects");

    assert_eq!(error, persistence_failure);
    assert_eq!(
        fixture.log.fault_matrix_calls(),
        [
            "terminate:completed",
            "outputs.release",
            "workspace.release",
            "release:completed"
        ]
    );
}

// 24

#[tokio::test]
async fn treats_ordinary_release_failures_as_bounded_best_effort_cleanup() {
    let fixture = Fixture::fault_matrix();
    fixture
        .outputs
        .release
        .fails(PortError::new("output release failed"));
    fixture
        .workspace
        .release
        .fails(PortError::new("workspace release failed"));
    fixture
        .fences
        .release
        .fails(PortError::new("fence release failed"));
    assert_eq!(
        run(&fixture, fixture.input()).await.expect("resolves"),
        completed(1)
    );

    let failed = Fixture::fault_matrix();
    failed.harness.run.fails(PortError::new("execution failed"));
    failed
        .outputs
        .abort
        .fails(PortError::new("output abort failed"));
    failed
        .workspace
        .release
        .fails(PortError::new("workspace release failed"));
    failed
        .fences
        .release
        .fails(PortError::new("fence release failed"));
    let result = run(&failed, failed.input()).await.expect("resolves");
    assert!(
        matches!(result, ManagedRuntimeRunResult::Failed { .. }),
        "{result:?}"
    );
}

// 25–26 `surfaces a credential egress %s persistence failure`

async fn surfaces_a_credential_egress_persistence_failure(phase: &str) {
    let mut fixture = Fixture::fault_matrix();
    let egress = fixture.with_credential_egress();
    egress.capabilities.returns(egress_capabilities(
        omabox_contract::CredentialEgressEnforcement::Enforced,
    ));
    let failure = PortError::new(format!("credential {phase} failed"));
    match phase {
        "revoke" => egress.revoke.fails(failure.clone()),
        _ => egress.release.fails(failure.clone()),
    }
    fixture.profile = with_egress(&fixture.profile, CredentialEgressRequirement::Required);

    let error = run(&fixture, fixture.input()).await.expect_err("rejects");

    assert_eq!(error, failure);
    assert_eq!(fixture.workspace.release.count(), 1);
    assert_eq!(fixture.fences.release.count(), 1);
}

#[tokio::test]
async fn surfaces_a_credential_egress_revoke_persistence_failure() {
    surfaces_a_credential_egress_persistence_failure("revoke").await;
}

#[tokio::test]
async fn surfaces_a_credential_egress_release_persistence_failure() {
    surfaces_a_credential_egress_persistence_failure("release").await;
}

// 27

#[tokio::test]
async fn rejects_unsupported_driver_output_checkpoint_profiles_before_fence_acquisition() {
    let best_effort_outputs = Fixture::fault_matrix();
    best_effort_outputs
        .outputs
        .advertises(vec![SessionOutputCapability {
            strategy: OutputStrategy::FinalCollect,
            durability: OutputDurability::BestEffort,
        }]);
    let error = run(&best_effort_outputs, best_effort_outputs.input())
        .await
        .expect_err("rejects");
    assert!(
        error.message().contains("durable Session outputs"),
        "{error}"
    );
    assert!(!best_effort_outputs.fences.acquire.called());

    let missing_driver = Fixture::fault_matrix();
    missing_driver
        .harness
        .advertises(vec![HarnessDriverType::OpenmaSupervised]);
    let error = run(&missing_driver, missing_driver.input())
        .await
        .expect_err("rejects");
    assert!(error.message().contains("ama_worker"), "{error}");
    assert!(!missing_driver.fences.acquire.called());

    let mut missing_checkpoint = Fixture::fault_matrix();
    missing_checkpoint.profile = with_runtime_checkpoint(
        &missing_checkpoint.profile,
        RuntimeCheckpointRequirement::Required,
    );
    let error = run(&missing_checkpoint, missing_checkpoint.input())
        .await
        .expect_err("rejects");
    assert!(error.message().contains("runtime checkpoint"), "{error}");
    assert!(!missing_checkpoint.fences.acquire.called());
}

// 28–30 `cleans every allocated resource when %s fails`

async fn cleans_every_allocated_resource(fixture: Fixture) {
    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert!(
        matches!(result, ManagedRuntimeRunResult::Failed { .. }),
        "{result:?}"
    );
    assert!(!fixture.fences.publish.called());
    assert_eq!(
        fixture.log.fault_matrix_calls(),
        [
            "terminate:failed",
            "outputs.abort:failed",
            "workspace.release",
            "release:failed"
        ]
    );
}

#[tokio::test]
async fn cleans_every_allocated_resource_when_harness_fails() {
    let fixture = Fixture::fault_matrix();
    fixture.harness.run.fails(PortError::new("harness failed"));
    cleans_every_allocated_resource(fixture).await;
}

#[tokio::test]
async fn cleans_every_allocated_resource_when_workspace_checkpoint_fails() {
    let fixture = Fixture::fault_matrix();
    fixture
        .workspace
        .checkpoint
        .fails(PortError::new("checkpoint failed"));
    cleans_every_allocated_resource(fixture).await;
}

#[tokio::test]
async fn cleans_every_allocated_resource_when_output_finalization_fails() {
    let fixture = Fixture::fault_matrix();
    fixture
        .outputs
        .finalize
        .fails(PortError::new("finalize failed"));
    cleans_every_allocated_resource(fixture).await;
}

// 31

#[tokio::test]
async fn treats_a_rejected_atomic_publication_as_lease_loss_and_never_releases_outputs() {
    let fixture = Fixture::fault_matrix();
    fixture
        .fences
        .publish
        .returns(PublishRuntimeResourcesResult::Lost);

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    assert_eq!(
        fixture.log.fault_matrix_calls(),
        [
            "terminate:lease_lost",
            "outputs.abort:lease_lost",
            "workspace.release",
            "release:lease_lost"
        ]
    );
    assert!(!fixture.outputs.release.called());
}

// 32

#[tokio::test]
async fn persists_failed_hard_termination_without_the_fence_secret_and_reaps_it_later() {
    let fixture = Fixture::fault_matrix();
    fixture
        .sandbox
        .terminate
        .fails(PortError::new("provider control plane unavailable"));

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, completed(1));
    let scope = fixture.scope();
    let runtime = lease("fake", "runtime-fault");
    let pending = fixture.orphans.list(10).await.expect("list");
    assert_eq!(
        pending,
        [RuntimeOrphanRecord {
            id: runtime_orphan_id(&scope, 1, &runtime),
            scope: scope.clone(),
            generation: 1,
            owner_id: "fault-owner".into(),
            sandbox: runtime.clone(),
            reason: TerminationReason::Completed,
            attempts: 0,
            last_error: "provider control plane unavailable".into(),
        }]
    );
    let serialized = serde_json::to_string(&pending).expect("json");
    assert!(!serialized.contains(fixture.token()));

    let reconciler =
        ManagedRuntimeOrphanReconciler::new(fixture.orphans.clone(), fixture.sandbox.clone());
    assert_eq!(
        reconciler.run_once(10).await.expect("reconciled"),
        ReconcileSummary {
            inspected: 1,
            resolved: 1,
            remaining: 0
        }
    );
    assert_eq!(
        fixture.sandbox.reap.calls(),
        [ReapCall {
            scope,
            lease: runtime,
            reason: TerminationReason::Completed
        }]
    );
    assert!(fixture.orphans.list(10).await.expect("list").is_empty());
}

// 33

#[tokio::test]
async fn retains_an_orphan_and_increments_its_attempt_when_reconciliation_still_fails() {
    let fixture = Fixture::fault_matrix();
    fixture
        .orphans
        .enqueue(EnqueueRuntimeOrphanInput {
            scope: fixture.scope(),
            generation: 9,
            owner_id: "owner-stale".into(),
            sandbox: lease("fake", "runtime-stale"),
            reason: TerminationReason::LeaseLost,
            error: PortError::new("initial kill failed"),
        })
        .await
        .expect("enqueued");
    fixture
        .sandbox
        .reap
        .fails(PortError::new("still partitioned"));
    let reconciler =
        ManagedRuntimeOrphanReconciler::new(fixture.orphans.clone(), fixture.sandbox.clone());

    assert_eq!(
        reconciler.run_once(10).await.expect("reconciled"),
        ReconcileSummary {
            inspected: 1,
            resolved: 0,
            remaining: 1
        }
    );
    let records = fixture.orphans.list(10).await.expect("list");
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].attempts, 1);
    assert_eq!(records[0].last_error, "still partitioned");
}

// 34: a limit of 1.5 cannot be passed to `run_once(u64)`; the TypeScript value is a JSON
// number, so 1.5 is checked through `reconcile_limit_from_json`, the reconciler's validation
// of untyped input.

#[tokio::test]
async fn rejects_unsafe_orphan_reconciliation_limits() {
    let fixture = Fixture::fault_matrix();
    let orphans: Arc<dyn RuntimeOrphanPort> = Arc::new(omabox_store::MemoryOrphanStore::new());
    let reconciler = ManagedRuntimeOrphanReconciler::new(orphans, fixture.sandbox.clone());

    let error = reconciler.run_once(0).await.expect_err("rejects 0");
    assert!(error.message().contains("positive integer"), "{error}");
    let error = reconcile_limit_from_json(&serde_json::json!(1.5)).expect_err("rejects 1.5");
    assert!(error.message().contains("positive integer"), "{error}");
}
