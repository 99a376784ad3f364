//! The conformance case of `process` runtime checkpoints: a provider that captures
//! processes carries a running process, with what it holds in memory, from one run of a
//! work item into the next; one that does not is refused when a profile requires them.

use super::cases::{profile, provider_host};
use super::subject::Subject;
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, RuntimeCheckpointKind, RuntimeCheckpointRef,
    RuntimeCheckpointRequirement, RuntimeResourceScope,
};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_store::MemoryFenceStore;
use std::sync::Arc;

/// The harness of every run (a checkpoint is reused only by the same harness identity).
/// The first run starts a counter that keeps its count only in a shell variable, in a
/// session of its own so it outlives the harness, and records where it got to. A later run
/// checks the counter goes on from there; its exit code says which check failed: 4 no
/// counter in the root (a cold sandbox), 5 it stopped, 6 it started over.
const HARNESS: &str = r#"
    if [ ! -f "$WS/count-before.txt" ]; then
        setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/omabox-count; sleep 0.1; done' \
            omabox-counter </dev/null >/dev/null 2>&1 &
        sleep 0.5
        cat /tmp/omabox-count > "$WS/count-before.txt"
        exit 0
    fi
    before=$(cat "$WS/count-before.txt")
    a=$(cat /tmp/omabox-count 2>/dev/null) || exit 4
    sleep 0.5
    b=$(cat /tmp/omabox-count)
    [ "$b" -gt "$a" ] || exit 5
    [ "$a" -ge "$before" ] || exit 6
    echo "$before $a $b" > "$WS/restored.txt"
"#;

fn published_checkpoint(
    fences: &MemoryFenceStore,
    scope: &RuntimeResourceScope,
) -> Option<RuntimeCheckpointRef> {
    fences
        .inspect(scope)
        .and_then(|record| record.publication)
        .and_then(|publication| publication.runtime_checkpoint.into_option())
}

/// Runtime checkpoints: with `process` advertised, the next run of a work item restores
/// the previous run's processes (a counter held only in memory goes on, the workspace is
/// the published one); without, a profile that requires them is refused at admission.
pub async fn process_checkpoints_carry_running_processes_into_the_next_run(subject: &Subject) {
    let fences = Arc::new(MemoryFenceStore::new());
    let host = provider_host(subject, Arc::clone(&fences));
    let scope = subject.scope();
    let advertised = subject
        .driver
        .descriptor()
        .capabilities
        .sandbox
        .runtime_checkpoints;
    let capturing = subject.observer().capabilities().process_checkpoints;
    assert_eq!(
        advertised,
        if capturing {
            vec![RuntimeCheckpointKind::Process]
        } else {
            Vec::new()
        },
        "runtime checkpoints advertised iff the provider captures processes"
    );
    let mut first = profile(subject.shell(HARNESS));
    first.runtime_checkpoint = RuntimeCheckpointRequirement::Required;
    if !capturing {
        let error = host
            .run(ManagedRuntimeRunInput::new(scope, first))
            .await
            .expect_err("required runtime checkpoints are refused");
        assert!(
            error
                .message()
                .contains("cannot provide a runtime checkpoint"),
            "{}",
            error.message()
        );
        return;
    }
    let result = host
        .run(ManagedRuntimeRunInput::new(scope.clone(), first.clone()))
        .await
        .expect("first run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let taken = published_checkpoint(&fences, &scope).expect("a runtime checkpoint published");
    assert_eq!(taken.kind, RuntimeCheckpointKind::Process);
    assert_eq!(taken.provider, subject.backend.name);
    assert!(!taken.checkpoint_id.contains('/'), "an id, not a path");
    let json = serde_json::to_string(&taken).unwrap();
    assert!(!json.contains(&subject.token), "no fence token in the ref");

    let result = host
        .run(ManagedRuntimeRunInput::new(scope.clone(), first.clone()))
        .await
        .expect("second run");
    assert_eq!(
        result,
        ManagedRuntimeRunResult::Completed { revision: 2 },
        "the second run found the first run's counter still counting"
    );
    let next = published_checkpoint(&fences, &scope).expect("a newer checkpoint published");
    assert_ne!(next.checkpoint_id, taken.checkpoint_id);

    // A checkpoint is restored once: a run from the consumed one starts cold, where the
    // counter is missing (exit 4), and still publishes.
    let observer = subject.observer();
    observer
        .remove_processes(&next.checkpoint_id)
        .await
        .expect("remove the newer checkpoint");
    let result = host
        .run(ManagedRuntimeRunInput::new(scope.clone(), first))
        .await
        .expect("third run");
    match result {
        ManagedRuntimeRunResult::Failed { error } => {
            assert_eq!(error.message(), "AMA worker exited with code 4");
        }
        other => panic!("a run whose checkpoint is gone starts cold: {other:?}"),
    }
    observer
        .remove_processes(&next.checkpoint_id)
        .await
        .expect("removing a removed checkpoint succeeds");
}
