//! Wire compatibility: every type that crosses a process boundary reads a JSON document
//! written by hand from the TypeScript shapes (reference §1) and writes it back unchanged.
//!
//! "Unchanged" is compared as JSON values (key order free, every key, literal and `null`
//! kept; an absent key stays absent).

use omabox_contract::*;
use serde::{Serialize, de::DeserializeOwned};

fn round_trip<T: Serialize + DeserializeOwned>(fixture: &str) {
    let path = format!("{}/tests/fixtures/{fixture}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"));
    let original: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    let typed: T = serde_json::from_str(&text)
        .unwrap_or_else(|error| panic!("{fixture} does not parse as its type: {error}"));
    let written = serde_json::to_value(&typed).expect("serializes");
    assert_eq!(written, original, "{fixture} changed on the way through");
}

macro_rules! fixtures {
    ($($test:ident: $ty:ty = $file:literal;)+) => {
        $(
            #[test]
            fn $test() {
                round_trip::<$ty>($file);
            }
        )+
    };
}

fixtures! {
    scope: RuntimeResourceScope = "scope.json";
    fence: RuntimeResourceFence = "fence.json";
    publication_with_runtime_checkpoint: RuntimeResourcePublication = "publication.json";
    publication_with_absent_runtime_checkpoint: RuntimeResourcePublication = "publication_absent_checkpoint.json";
    publication_with_null_runtime_checkpoint: RuntimeResourcePublication = "publication_null_checkpoint.json";
    acquire_acquired: AcquireRuntimeFenceResult = "acquire_acquired.json";
    acquire_conflict: AcquireRuntimeFenceResult = "acquire_conflict.json";
    acquire_conflict_without_expiry: AcquireRuntimeFenceResult = "acquire_conflict_null.json";
    renew_lost: RenewRuntimeFenceResult = "renew_lost.json";
    publish_published: PublishRuntimeResourcesResult = "publish_published.json";
    lease_with_metadata: ManagedSandboxLease = "lease.json";
    lease_minimal: ManagedSandboxLease = "lease_minimal.json";
    heartbeat_alive: SandboxHeartbeatResult = "heartbeat_alive.json";
    observation: SandboxObservation = "observation.json";
    workspace_binding: WorkspaceBinding = "workspace_binding.json";
    workspace_candidate: WorkspaceCheckpointCandidate = "workspace_candidate.json";
    output_binding: SessionOutputBinding = "output_binding.json";
    output_entry: SessionOutputEntryCandidate = "output_entry.json";
    output_manifest: SessionOutputManifestCandidate = "output_manifest.json";
    runtime_checkpoint_ref: RuntimeCheckpointRef = "checkpoint_ref.json";
    egress_capabilities: CredentialEgressCapabilities = "egress_capabilities.json";
    egress_binding: CredentialEgressBinding = "egress_binding.json";
    profile_supervised: ManagedRuntimeProfile = "profile_supervised.json";
    profile_worker: ManagedRuntimeProfile = "profile_worker.json";
    plan: ManagedRuntimePlan = "plan.json";
    driver_descriptor: ManagedRuntimeProviderDriverDescriptor = "descriptor.json";
    provider_create_input: ManagedRuntimeProviderCreateInput = "create_input.json";
    orphan_record: RuntimeOrphanRecord = "orphan_record.json";
    session_snapshot: RuntimeSessionSnapshot = "session_snapshot.json";
    supervisor_start_command: HarnessSupervisorCommand = "supervisor_start.json";
    supervisor_reject_command: HarnessSupervisorCommand = "supervisor_reject.json";
    supervisor_checkpoint_event: HarnessSupervisorEvent = "supervisor_event_checkpoint.json";
    supervisor_completed_event: HarnessSupervisorEvent = "supervisor_event_completed.json";
    execution_result: ManagedWorkExecutionResult = "execution_aborted.json";
    memory_mutation: SessionMemoryMutationResult = "memory_mutation.json";
}

#[test]
fn orphan_id_in_the_fixture_is_the_runtime_orphan_id() {
    let text = std::fs::read_to_string(format!(
        "{}/tests/fixtures/orphan_record.json",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap();
    let record: RuntimeOrphanRecord = serde_json::from_str(&text).unwrap();
    assert_eq!(
        record.id,
        runtime_orphan_id(&record.scope, record.generation, &record.sandbox)
    );
}

#[test]
fn unknown_enum_literals_are_rejected() {
    assert!(serde_json::from_str::<WorkspaceStrategy>("\"durable-mount\"").is_err());
    assert!(serde_json::from_str::<TerminationReason>("\"lost\"").is_err());
    assert!(serde_json::from_str::<SandboxHeartbeatResult>(r#"{"type":"dead"}"#).is_err());
}

fn names<T: ToString>(values: impl IntoIterator<Item = T>) -> Vec<String> {
    values.into_iter().map(|value| value.to_string()).collect()
}

#[test]
fn every_enum_literal_matches_the_reference() {
    assert_eq!(
        names(WorkspaceStrategy::ALL),
        [
            "durable_mount",
            "retained_runtime",
            "checkpoint_restore",
            "ephemeral"
        ]
    );
    assert_eq!(
        names(OutputStrategy::ALL),
        ["durable_mount", "watch_and_upload", "final_collect"]
    );
    assert_eq!(
        names(ManagedRuntimeProviderPlacement::ALL),
        ["in_process", "driver_service", "provider_native"]
    );
    assert_eq!(
        names(EnvironmentWorkerInstallationMode::ALL),
        [
            "runtime_host",
            "provider_dispatch",
            "provider_activation",
            "external_worker"
        ]
    );
    assert_eq!(
        names(
            EnvironmentWorkerInstallationMode::ALL
                .iter()
                .map(|mode| mode.strategy())
        ),
        [
            "claim_then_acquire",
            "poll_unacked_then_dispatch",
            "acquire_then_session_poll",
            "external_worker"
        ]
    );
    assert_eq!(
        names(CredentialEgressEnforcement::ALL),
        ["enforced", "advisory", "unsupported"]
    );
}
