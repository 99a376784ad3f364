//! The work-item runner (`omabox_host::work_item`): admission through the provider host, the
//! resources hook (the lease journal), session tokens around the claim, and the run observer
//! seeing admission and then every step in the contract's order — over real in-memory fences.

use omabox_contract::{
    CredentialEgressCapabilities, ManagedRuntimeProviderResources, PortError,
    RuntimeLeaseJournalPort, SessionTokenPort,
};
use omabox_host::run_observer::{RunStep, StepFacts, StepOutcome};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use omabox_host::session_tokens::SessionTokenSlots;
use omabox_host::work_item::{
    SessionTokenIssuer, WorkItemPolicy, WorkItemPorts, WorkItemRunner, session_scope,
};
use omabox_store::{MemoryFenceStore, MemoryLeaseJournal, MemoryOrphanStore, MemorySessionTokens};
use omabox_testkit::drivers::{FakeProviderDriver, provider_descriptor};
use omabox_testkit::fakes::{Fixture, FixtureSpec};
use std::sync::Arc;

struct Rig {
    fixture: Fixture,
    journal: Arc<MemoryLeaseJournal>,
    tokens: Arc<MemorySessionTokens>,
    slots: SessionTokenSlots,
    runner: WorkItemRunner,
}

fn rig(egress: CredentialEgressCapabilities) -> Rig {
    let mut spec = FixtureSpec::fault_matrix();
    spec.scope = session_scope("s1");
    let fixture = Fixture::new(spec);
    let mut descriptor = provider_descriptor("fixture-provider");
    descriptor.credential_egress = egress;
    let driver = Arc::new(FakeProviderDriver::returning(
        descriptor,
        ManagedRuntimeProviderResources {
            sandbox: fixture.sandbox.clone(),
            workspace: fixture.workspace.clone(),
            outputs: fixture.outputs.clone(),
            harness_driver: fixture.harness.clone(),
            supervisor_transport: None,
            runtime_checkpoint: None,
            credential_egress: None,
            session_inputs: None,
        },
    ));
    let fences = Arc::new(MemoryFenceStore::new());
    let journal = Arc::new(MemoryLeaseJournal::new(Arc::clone(&fences)));
    let tokens = Arc::new(MemorySessionTokens::new());
    let slots = SessionTokenSlots::new();
    let runner = WorkItemRunner::new(
        WorkItemPolicy::new("owner-1", None),
        WorkItemPorts {
            driver,
            fences,
            orphans: Arc::new(MemoryOrphanStore::new()),
            lease_journal: Some(Arc::clone(&journal) as _),
            session_tokens: Some(SessionTokenIssuer {
                tokens: Arc::clone(&tokens) as _,
                sink: Arc::new(slots.clone()),
            }),
        },
    )
    .expect("runner");
    Rig {
        fixture,
        journal,
        tokens,
        slots,
        runner,
    }
}

#[tokio::test]
async fn the_observer_sees_admission_then_every_step_in_order() {
    let rig = rig(CredentialEgressCapabilities::unsupported());
    let result = rig.runner.run(rig.fixture.input()).await.expect("run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_eq!(
        rig.fixture.observer.steps(),
        [
            RunStep::Admission,
            RunStep::FenceAcquire,
            RunStep::WorkspaceMaterialize,
            RunStep::OutputsPrepare,
            RunStep::SandboxAcquire,
            RunStep::WorkspaceAttach,
            RunStep::OutputsAttach,
            RunStep::HarnessRun,
            RunStep::WorkspaceCheckpoint,
            RunStep::OutputsCollect,
            RunStep::OutputsFinalize,
            RunStep::FencePublish,
            RunStep::SandboxTerminate,
            RunStep::OutputsRelease,
            RunStep::WorkspaceRelease,
            RunStep::FenceRelease,
        ]
    );
    let events = rig.fixture.observer.events();
    assert!(matches!(
        &events[1].outcome,
        StepOutcome::Done(StepFacts::FenceClaimed {
            generation: 1,
            publication: None
        })
    ));
    // Terminated: the journal forgot the lease it recorded.
    assert!(rig.journal.list(10).await.expect("list").is_empty());
    // Released: the claim's token was withdrawn from the sink.
    assert!(rig.slots.get(&session_scope("s1"), 1).is_none());
}

#[tokio::test]
async fn the_resources_hook_journals_the_lease_and_tokens_live_only_during_the_claim() {
    let rig = rig(CredentialEgressCapabilities::unsupported());
    rig.fixture
        .sandbox
        .terminate
        .fails(PortError::new("terminate failed"));
    let slots = rig.slots.clone();
    let tokens = Arc::clone(&rig.tokens);
    rig.fixture
        .harness
        .run
        .set(move |input: omabox_contract::RunHarnessInput| {
            let slots = slots.clone();
            let tokens = Arc::clone(&tokens);
            async move {
                // While the harness runs, the claim's token is in the sink and valid.
                let token = slots
                    .get(&input.scope, input.fence.generation)
                    .expect("a token for the claim");
                assert!(
                    tokens
                        .verify(token.expose())
                        .await
                        .expect("verify")
                        .is_some()
                );
                Ok(omabox_contract::ManagedWorkExecutionResult::Completed)
            }
        });
    let result = rig.runner.run(rig.fixture.input()).await.expect("run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    // Terminate failed: the journaled lease stays for the reaper.
    let journaled = rig.journal.list(10).await.expect("list");
    assert_eq!(journaled.len(), 1);
    assert_eq!(
        journaled[0].lease.runtime_id,
        rig.fixture.spec.lease.runtime_id
    );
    assert!(
        rig.fixture
            .observer
            .steps()
            .contains(&RunStep::OrphansEnqueue)
    );
}

#[tokio::test]
async fn an_admission_failure_is_reported_and_claims_nothing() {
    let rig = rig(CredentialEgressCapabilities::unsupported());
    let mut input = rig.fixture.input();
    input.profile.credential_egress = Some(omabox_contract::CredentialEgressProfile {
        requirement: omabox_contract::CredentialEgressRequirement::Required,
    });
    let error = rig.runner.run(input).await.expect_err("rejected");
    assert_eq!(rig.fixture.observer.steps(), [RunStep::Admission]);
    assert_eq!(rig.fixture.observer.errors(), [error.message().to_owned()]);
    assert!(!rig.fixture.sandbox.acquire.called());
}
