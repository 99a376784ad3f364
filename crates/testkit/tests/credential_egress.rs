//! Port of `credential-egress.test.ts` (reference §8.5, 11 cases): Session-input materializer
//! requirements, the egress requirement a repository resource implies, ownership of memory
//! stores, and the egress lifecycle (prepare before acquire, attach before the harness, revoke
//! before terminate, release after) including on lease loss.
//!
//! Fixture: generation 7, token `runtime-fence-secret`, binding `egress-binding-7`
//! (enforced, live), a durable workspace, disabled outputs, required egress, and a harness
//! advertising both lanes. The TypeScript fakes assert their inputs inline; here the fakes
//! record inputs and the tests assert them after the run.

use omabox_contract::{
    AbortController, CredentialEgressEnforcement, CredentialEgressPrepareRequirement,
    CredentialEgressProfile, CredentialEgressRequirement, HarnessDriverType,
    ManagedWorkExecutionResult, MemoryStoreOwnership, OutputRequirement, PortError,
    RuntimeCheckpointRequirement, RuntimeResourceScope, RuntimeSessionResourceSnapshot,
    WorkspaceRequirement,
};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_testkit::fakes::{
    CallLog, FakeCredentialEgress, Fixture, FixtureSpec, ama_worker, egress_capabilities,
    enforced_binding, lease, profile, resource, session, supervised_driver,
};
use std::sync::Arc;

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace_1", "environment_1", "session_1", "work_1")
}

/// The credential-egress fixture, with the egress port unless `egress` is false.
fn fixture(egress: bool) -> (Fixture, Option<Arc<FakeCredentialEgress>>) {
    let mut fixture = Fixture::new(FixtureSpec {
        scope: scope(),
        owner_id: "owner_1".into(),
        generation: 7,
        token: "runtime-fence-secret".into(),
        expires_at: "2099-09-06T00:00:00.000Z".into(),
        lease: lease("fake", "sandbox-1"),
        egress_binding: enforced_binding("egress-binding-7"),
    });
    fixture.profile = profile(
        WorkspaceRequirement::Durable,
        OutputRequirement::Disabled,
        RuntimeCheckpointRequirement::Disabled,
        ama_worker("worker"),
    );
    fixture.profile.credential_egress = Some(CredentialEgressProfile {
        requirement: CredentialEgressRequirement::Required,
    });
    fixture.outputs.advertises(Vec::new());
    fixture.harness.advertises(vec![
        HarnessDriverType::AmaWorker,
        HarnessDriverType::OpenmaSupervised,
    ]);
    let port = egress.then(|| fixture.with_credential_egress());
    (fixture, port)
}

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

/// The names the TypeScript fixture records (the egress revoke keeps its reason).
fn ts_calls(log: &CallLog) -> Vec<String> {
    log.entries()
        .into_iter()
        .filter_map(|entry| {
            let name = entry.split(':').next().unwrap_or_default().to_owned();
            match name.as_str() {
                "egress.revoke" => Some(entry),
                "egress.prepare"
                | "sandbox.acquire"
                | "workspace.attach"
                | "egress.attach"
                | "harness.run"
                | "fence.publish"
                | "sandbox.terminate"
                | "egress.release"
                | "workspace.release"
                | "fence.release"
                | "session_inputs.materialize" => Some(name),
                _ => None,
            }
        })
        .collect()
}

fn memory_store() -> RuntimeSessionResourceSnapshot {
    resource(
        "memory_store",
        &[
            ("memory_store_id", "memstore_01"),
            ("mount_path", "/workspace/memory"),
            ("access", "read_write"),
        ],
    )
}

fn repository(mount_path: &str) -> RuntimeSessionResourceSnapshot {
    let mut repository = resource(
        "github_repository",
        &[
            ("id", "sesrsc_repo_01"),
            ("mount_path", mount_path),
            ("url", "https://github.com/openma-ai/example.git"),
        ],
    );
    repository.fields.insert(
        "checkout".into(),
        serde_json::json!({"type": "commit", "sha": "0123456789abcdef"}),
    );
    repository
}

fn position(calls: &[String], entry: &str) -> usize {
    calls
        .iter()
        .position(|call| call == entry)
        .unwrap_or_else(|| panic!("{entry} missing from {calls:?}"))
}

// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn leaves_memory_stores_to_an_official_ama_worker_without_requiring_a_host_materializer() {
    let (fixture, _) = fixture(true);
    let mut input = fixture.input();
    input.session = Some(session(&scope(), &[], vec![memory_store()]));

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert!(fixture.log.contains("harness.run"));
}

#[tokio::test]
async fn requires_the_host_materializer_for_memory_stores_used_by_a_supervised_harness() {
    let (mut fixture, _) = fixture(true);
    fixture.profile.driver = supervised_driver();
    let mut input = fixture.input();
    input.session = Some(session(&scope(), &[], vec![memory_store()]));

    let error = run(&fixture, input).await.expect_err("rejects");

    assert!(
        error
            .message()
            .contains("Session resources require a SessionInputMaterializerPort"),
        "{error}"
    );
    assert!(!fixture.log.contains("sandbox.acquire"));
}

#[tokio::test]
async fn fails_closed_before_allocating_compute_when_session_resources_have_no_materializer() {
    let (fixture, _) = fixture(true);
    let mut input = fixture.input();
    input.session = Some(session(&scope(), &[], vec![repository("/workspace")]));

    let error = run(&fixture, input).await.expect_err("rejects");

    assert!(
        error
            .message()
            .contains("Session resources require a SessionInputMaterializerPort"),
        "{error}"
    );
    assert!(!fixture.log.contains("sandbox.acquire"));
    assert!(!fixture.log.contains("harness.run"));
}

#[tokio::test]
async fn treats_a_repository_resource_as_requiring_credential_egress_even_when_the_profile_omits_it()
 {
    let (mut fixture, _) = fixture(false);
    fixture.with_session_inputs();
    fixture.profile.credential_egress = Some(CredentialEgressProfile {
        requirement: CredentialEgressRequirement::Disabled,
    });
    let mut input = fixture.input();
    input.session = Some(session(
        &scope(),
        &[],
        vec![repository("/workspace/example")],
    ));

    let error = run(&fixture, input).await.expect_err("rejects");

    assert!(
        error
            .message()
            .contains("Required credential egress is unavailable"),
        "{error}"
    );
    assert!(!fixture.log.contains("sandbox.acquire"));
}

#[tokio::test]
async fn materializes_session_resources_and_metadata_after_workspace_and_egress_attach_but_before_the_harness()
 {
    let (mut fixture, _) = fixture(true);
    let materializer = fixture.with_session_inputs();
    let snapshot = session(
        &scope(),
        &[
            ("input_file", "s3://fixture-bucket/input.csv"),
            ("commit_sha", "0123456789abcdef"),
        ],
        vec![resource(
            "file",
            &[
                ("id", "sesrsc_file_01"),
                ("file_id", "file_01"),
                ("mount_path", "/workspace/input.csv"),
            ],
        )],
    );
    let mut input = fixture.input();
    input.session = Some(snapshot.clone());

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let calls = ts_calls(&fixture.log);
    let materialized = position(&calls, "session_inputs.materialize");
    assert!(
        materialized > position(&calls, "egress.attach"),
        "{calls:?}"
    );
    assert!(materialized < position(&calls, "harness.run"), "{calls:?}");
    let call = materializer.materialize.first().expect("materialized");
    assert_eq!(call.context.scope, scope());
    assert_eq!(
        call.context.resource_ownership.memory_store,
        MemoryStoreOwnership::Worker
    );
    assert_eq!(call.context.session, snapshot);
    assert_eq!(call.workspace.mount_path, "/workspace");
    assert_eq!(call.context.sandbox.runtime_id, "sandbox-1");
}

#[tokio::test]
async fn marks_memory_stores_as_materializer_owned_for_a_supervised_harness() {
    let (mut fixture, _) = fixture(true);
    let materializer = fixture.with_session_inputs();
    fixture.profile.driver = supervised_driver();
    let mut input = fixture.input();
    input.session = Some(session(&scope(), &[], vec![memory_store()]));

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let call = materializer.materialize.first().expect("materialized");
    assert_eq!(
        call.context.resource_ownership.memory_store,
        MemoryStoreOwnership::Materializer
    );
}

#[tokio::test]
async fn does_not_start_the_harness_when_session_input_staging_fails() {
    let (mut fixture, _) = fixture(true);
    fixture
        .with_session_inputs()
        .materialize
        .fails(PortError::new("injected staging failure"));
    let mut input = fixture.input();
    input.session = Some(session(
        &scope(),
        &[("input_file", "s3://fixture-bucket/input.csv")],
        Vec::new(),
    ));

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(
        result,
        ManagedRuntimeRunResult::Failed {
            error: PortError::new("injected staging failure")
        }
    );
    assert!(fixture.log.contains("session_inputs.materialize"));
    assert!(!fixture.log.contains("harness.run"));
}

#[tokio::test]
async fn binds_enforced_egress_before_the_harness_and_revokes_it_before_sandbox_cleanup() {
    let (fixture, egress) = fixture(true);
    let egress = egress.expect("egress port");

    let result = run(&fixture, fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_eq!(
        ts_calls(&fixture.log),
        [
            "egress.prepare",
            "sandbox.acquire",
            "workspace.attach",
            "egress.attach",
            "harness.run",
            "fence.publish",
            "egress.revoke:completed",
            "sandbox.terminate",
            "egress.release",
            "workspace.release",
            "fence.release",
        ]
    );
    let binding = enforced_binding("egress-binding-7");
    let prepare = egress.prepare.first().expect("prepared");
    assert_eq!(prepare.fence, fixture.fence());
    assert_eq!(
        prepare.requirement,
        CredentialEgressPrepareRequirement::Required
    );
    let attach = egress.attach.first().expect("attached");
    assert_eq!(attach.binding, binding);
    assert_eq!(attach.sandbox.runtime_id, "sandbox-1");
    let acquire = fixture.sandbox.acquire.first().expect("acquired");
    assert_eq!(acquire.credential_egress.as_ref(), Some(&binding));
    let serialized = serde_json::to_string(&acquire.credential_egress).expect("json");
    assert!(!serialized.contains(fixture.token()));
}

#[tokio::test]
async fn fails_closed_before_allocating_compute_when_required_egress_is_unavailable() {
    let (fixture, _) = fixture(false);

    let error = run(&fixture, fixture.input()).await.expect_err("rejects");

    assert!(
        error
            .message()
            .to_lowercase()
            .contains("required credential egress"),
        "{error}"
    );
    assert!(!fixture.log.contains("sandbox.acquire"));
    assert!(!fixture.log.contains("harness.run"));
}

#[tokio::test]
async fn rejects_advisory_capability_for_a_required_profile() {
    let (fixture, egress) = fixture(true);
    egress
        .expect("egress port")
        .capabilities
        .returns(egress_capabilities(CredentialEgressEnforcement::Advisory));

    let error = run(&fixture, fixture.input()).await.expect_err("rejects");

    assert!(
        error
            .message()
            .contains("requires enforced credential egress"),
        "{error}"
    );
    assert!(!fixture.log.contains("egress.prepare"));
}

#[tokio::test]
async fn revokes_a_generation_before_termination_when_the_outer_work_lease_is_lost() {
    let (fixture, _) = fixture(true);
    let controller = AbortController::new();
    fixture.harness.run.set({
        let controller = controller.clone();
        move |input| {
            controller.abort(PortError::new("official Work lease lost"));
            async move {
                input.signal.aborted().await;
                Ok(ManagedWorkExecutionResult::Aborted)
            }
        }
    });
    let mut input = fixture.input();
    input.signal = Some(controller.signal());

    let result = run(&fixture, input).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::LeaseLost);
    let calls = ts_calls(&fixture.log);
    assert!(
        position(&calls, "egress.revoke:lease_lost") < position(&calls, "sandbox.terminate"),
        "{calls:?}"
    );
}
