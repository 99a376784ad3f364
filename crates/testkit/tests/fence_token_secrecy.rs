//! The fence token appears in no orphan record, no error text that leaves `run`, no lease and
//! no log line (architecture: "Secrets never travel"; reference §2.5).
//!
//! Several failing runs — each with port failures whose messages *contain* the token, the
//! worst case a provider can produce — are executed under a `tracing` subscriber that writes
//! every event and span field at TRACE level to a buffer; then every artifact is grepped for
//! the token.

use omabox_contract::{
    CredentialEgressProfile, CredentialEgressRequirement, PortError, PublishRuntimeResourcesResult,
    RenewRuntimeFenceResult,
};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use omabox_testkit::fakes::{Fixture, FixtureSpec};
use std::io::Write;
use std::sync::{Arc, Mutex};

const TOKEN: &str = "tok-7f3c-never-print-this";

/// A `MakeWriter` appending to a shared buffer.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Buffer {
    type Writer = Buffer;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

fn fixture() -> Fixture {
    let mut spec = FixtureSpec::fault_matrix();
    spec.token = TOKEN.into();
    Fixture::new(spec)
}

fn leaky(what: &str) -> PortError {
    PortError::new(format!("{what} failed for fence token {TOKEN}"))
}

/// Every artifact a run leaves, as text.
fn artifacts(fixture: &Fixture, outcome: &Result<ManagedRuntimeRunResult, PortError>) -> String {
    let mut text = format!("{outcome:?}\n");
    // The run observer's events (what `omabox run --json` renders).
    text.push_str(&fixture.observer.text());
    text.push_str(&serde_json::to_string(&fixture.orphans.records()).expect("json"));
    for call in fixture.sandbox.terminate.calls() {
        text.push_str(&serde_json::to_string(&call.lease).expect("json"));
    }
    for call in fixture.orphans.enqueue.calls() {
        text.push_str(&format!("{:?} {}", call.error, call.error));
    }
    for call in fixture.sandbox.acquire.calls() {
        // The acquire input carries the fence (redacted in Debug); the lease it returns is
        // checked through terminate above.
        text.push_str(&format!("{call:?}"));
    }
    text
}

#[tokio::test]
async fn the_fence_token_appears_in_no_orphan_record_error_text_lease_or_log_line() {
    let buffer = Buffer::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(buffer.clone())
        .finish();
    // Current-thread runtime: every task of the run polls on this thread.
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut outcomes = Vec::new();

    // 1. terminate fails with the token in its message → orphan enqueued, run completes.
    let terminate = fixture();
    terminate.sandbox.terminate.fails(leaky("terminate"));
    let outcome = terminate.host().expect("host").run(terminate.input()).await;
    assert_eq!(
        outcome,
        Ok(ManagedRuntimeRunResult::Completed { revision: 1 })
    );
    let records = terminate.orphans.records();
    assert_eq!(records.len(), 1);
    assert_eq!(
        records[0].last_error,
        "terminate failed for fence token [redacted]"
    );
    outcomes.push(artifacts(&terminate, &outcome));

    // 2. the harness fails with the token → failed result, redacted.
    let harness = fixture();
    harness.harness.run.fails(leaky("harness"));
    let outcome = harness.host().expect("host").run(harness.input()).await;
    assert!(matches!(
        outcome,
        Ok(ManagedRuntimeRunResult::Failed { .. })
    ));
    outcomes.push(artifacts(&harness, &outcome));

    // 3. terminate and enqueue both fail with the token → rejection, redacted.
    let enqueue = fixture();
    enqueue.sandbox.terminate.fails(leaky("terminate"));
    enqueue.orphans.enqueue.fails(leaky("enqueue"));
    let outcome = enqueue.host().expect("host").run(enqueue.input()).await;
    assert!(outcome.is_err());
    outcomes.push(artifacts(&enqueue, &outcome));

    // 4. egress revoke fails with the token → rejection, redacted.
    let mut revoke = fixture();
    revoke
        .with_credential_egress()
        .revoke
        .fails(leaky("revoke"));
    revoke.profile.credential_egress = Some(CredentialEgressProfile {
        requirement: CredentialEgressRequirement::Required,
    });
    let outcome = revoke.host().expect("host").run(revoke.input()).await;
    assert!(outcome.is_err());
    outcomes.push(artifacts(&revoke, &outcome));

    // 5. the heartbeat renew fails with the token → lease lost.
    let renew = fixture();
    renew
        .scheduler
        .as_ref()
        .expect("fake scheduler")
        .wakes_first_n(1);
    renew.fences.renew.fails(leaky("renew"));
    renew.harness.waits_for_abort();
    let outcome = renew.host().expect("host").run(renew.input()).await;
    assert_eq!(outcome, Ok(ManagedRuntimeRunResult::LeaseLost));
    outcomes.push(artifacts(&renew, &outcome));

    // 6. publication lost, then a lost renew: lease_lost paths log too.
    let lost = fixture();
    lost.fences
        .publish
        .returns(PublishRuntimeResourcesResult::Lost);
    lost.fences.renew.returns(RenewRuntimeFenceResult::Lost);
    let outcome = lost.host().expect("host").run(lost.input()).await;
    assert_eq!(outcome, Ok(ManagedRuntimeRunResult::LeaseLost));
    outcomes.push(artifacts(&lost, &outcome));

    // 7. a workspace checkpoint fails with the token → the observer sees only the redacted
    //    text (the step's own event, before the run settles).
    let checkpoint = fixture();
    checkpoint.workspace.checkpoint.fails(leaky("checkpoint"));
    let outcome = checkpoint
        .host()
        .expect("host")
        .run(checkpoint.input())
        .await;
    assert!(matches!(
        outcome,
        Ok(ManagedRuntimeRunResult::Failed { .. })
    ));
    assert_eq!(
        checkpoint.observer.errors(),
        ["checkpoint failed for fence token [redacted]"]
    );
    outcomes.push(artifacts(&checkpoint, &outcome));
    assert!(
        outcomes[0].contains("terminate failed for fence token [redacted]"),
        "the observer reports the failed terminate: {}",
        outcomes[0]
    );

    let log = String::from_utf8(buffer.0.lock().expect("buffer").clone()).expect("utf-8");
    assert!(
        log.contains("terminate failed for fence token [redacted]"),
        "the capture works and carries the redacted error:\n{log}"
    );
    for (index, line) in log.lines().enumerate() {
        assert!(
            !line.contains(TOKEN),
            "log line {index} leaks the token: {line}"
        );
    }
    for (scenario, text) in outcomes.iter().enumerate() {
        assert!(
            !text.contains(TOKEN),
            "scenario {} leaks the token: {text}",
            scenario + 1
        );
    }
}
