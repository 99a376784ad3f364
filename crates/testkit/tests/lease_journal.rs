//! The lease journal end to end: `JournaledSandbox` inside a real `ManagedRuntimeHost` run
//! (fakes for every port but the fence and the journal, which are the store's in-memory
//! twins on a manual clock), and `AbandonedLeaseReaper` after a host "crash".

use async_trait::async_trait;
use omabox_contract::{
    LeaseJournalEntry, ManagedSandboxLease, ManagedSandboxPort, ManagedWorkExecutionResult,
    PortError, RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeResourceScope, TerminationReason,
};
use omabox_host::lease_journal::{AbandonedLeaseReaper, AbandonedLeaseSummary, JournaledSandbox};
use omabox_host::reconciler::{ManagedRuntimeOrphanReconciler, SandboxPortResolver};
use omabox_host::runtime_host::{ManagedRuntimeHost, ManagedRuntimeRunResult};
use omabox_store::{ManualClock, MemoryFenceStore, MemoryLeaseJournal};
use omabox_testkit::fakes::{FakeSandbox, Fixture, Gate, ReapCall};
use std::sync::{Arc, Mutex};

/// 2026-12-02T14:39:12.000Z
const T0: u64 = 1_796_222_352_000;

/// A fault-matrix fixture whose fence is the store's real in-memory fence on a manual clock,
/// whose sandbox is journaled, and a host over both.
struct Harness {
    fixture: Fixture,
    clock: ManualClock,
    fences: Arc<MemoryFenceStore>,
    journal: Arc<dyn RuntimeLeaseJournalPort>,
    sandbox: Arc<JournaledSandbox>,
}

impl Harness {
    fn new() -> Self {
        Self::with_journal(|fences| Arc::new(MemoryLeaseJournal::new(fences)))
    }

    fn with_journal(
        journal: impl FnOnce(Arc<MemoryFenceStore>) -> Arc<dyn RuntimeLeaseJournalPort>,
    ) -> Self {
        let fixture = Fixture::fault_matrix();
        let clock = ManualClock::new(T0);
        let fences = Arc::new(MemoryFenceStore::new().with_clock(clock.clone()));
        let journal = journal(Arc::clone(&fences));
        let sandbox = Arc::new(
            JournaledSandbox::new(fixture.sandbox.clone(), Arc::clone(&journal)).with_clock({
                let clock = clock.clone();
                move || omabox_store::Clock::now_ms(&clock)
            }),
        );
        Self {
            fixture,
            clock,
            fences,
            journal,
            sandbox,
        }
    }

    fn host(&self) -> ManagedRuntimeHost {
        let mut deps = self.fixture.dependencies();
        deps.fences = self.fences.clone();
        deps.sandbox = self.sandbox.clone();
        ManagedRuntimeHost::new(deps).expect("valid host")
    }

    fn scope(&self) -> RuntimeResourceScope {
        self.fixture.scope()
    }

    fn lease(&self) -> ManagedSandboxLease {
        self.fixture.spec.lease.clone()
    }

    /// The reaper, resolving the fixture's provider `fake` to the bare fake sandbox.
    fn reaper(&self) -> AbandonedLeaseReaper {
        AbandonedLeaseReaper::new(Arc::clone(&self.journal), resolver(&self.fixture.sandbox))
    }

    async fn journaled(&self) -> Vec<LeaseJournalEntry> {
        self.journal.list(100).await.expect("journal lists")
    }

    async fn abandoned(&self) -> Vec<LeaseJournalEntry> {
        self.journal.abandoned(100).await.expect("journal lists")
    }
}

fn resolver(sandbox: &Arc<FakeSandbox>) -> SandboxPortResolver {
    let sandbox = Arc::clone(sandbox);
    Arc::new(move |provider: &str| {
        (provider == "fake").then(|| Arc::clone(&sandbox) as Arc<dyn ManagedSandboxPort>)
    })
}

#[tokio::test]
async fn a_lease_is_journaled_on_acquire_and_forgotten_on_terminate() {
    let h = Harness::new();
    // What the journal holds while the harness runs.
    let seen = Arc::new(Mutex::new(Vec::new()));
    h.fixture.harness.run.set({
        let journal = Arc::clone(&h.journal);
        let seen = Arc::clone(&seen);
        move |_| {
            let journal = Arc::clone(&journal);
            let seen = Arc::clone(&seen);
            async move {
                let entries = journal.list(10).await?;
                seen.lock().unwrap().extend(entries);
                Ok(ManagedWorkExecutionResult::Completed)
            }
        }
    });

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![LeaseJournalEntry {
            scope: h.scope(),
            generation: 1,
            owner_id: "fault-owner".into(),
            lease: h.lease(),
            acquired_at: "2026-12-02T14:39:12.000Z".into(),
        }]
    );
    assert!(h.fixture.log.contains("sandbox.terminate:completed"));
    assert!(h.journaled().await.is_empty(), "forgotten after terminate");
}

#[tokio::test]
async fn a_failed_terminate_leaves_the_lease_journaled_and_an_orphan() {
    let h = Harness::new();
    h.fixture
        .sandbox
        .terminate
        .fails(PortError::new("provider control plane unavailable"));

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let orphans = h.fixture.orphans.store.list(10).await.unwrap();
    assert_eq!(orphans.len(), 1);
    let journaled = h.journaled().await;
    assert_eq!(journaled.len(), 1);
    // The orphan and the journal entry name the same compute by the same id.
    assert_eq!(journaled[0].id(), orphans[0].id);
    // The fence was released in cleanup, so the entry is abandoned at once.
    assert_eq!(h.abandoned().await, journaled);

    // The orphan reconciler reaping through the journaled port also forgets the entry.
    let reconciler =
        ManagedRuntimeOrphanReconciler::new(h.fixture.orphans.clone(), h.sandbox.clone());
    let summary = reconciler.run_once(10).await.unwrap();
    assert_eq!((summary.resolved, summary.remaining), (1, 0));
    assert!(h.journaled().await.is_empty());
    assert_eq!(h.reaper().run_once(10).await.unwrap().inspected, 0);
}

#[tokio::test]
async fn a_crashed_host_leaves_a_lease_the_reaper_reaps_once_the_fence_expires() {
    let h = Harness::new();
    let in_harness = Gate::new();
    h.fixture.harness.run.set({
        let in_harness = in_harness.clone();
        move |_| {
            in_harness.open();
            std::future::pending()
        }
    });

    // The host "dies" mid-harness: its run future is dropped, which runs no cleanup.
    let run = tokio::spawn({
        let host = h.host();
        let input = h.fixture.input();
        async move { host.run(input).await }
    });
    in_harness.wait().await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    assert!(!h.fixture.sandbox.terminate.called(), "no cleanup ran");
    assert!(h.fixture.orphans.store.list(10).await.unwrap().is_empty());

    // Journaled, but not abandoned while the dead host's fence is unexpired.
    assert_eq!(h.journaled().await.len(), 1);
    let nothing = h.reaper().run_once(10).await.unwrap();
    assert_eq!(nothing, AbandonedLeaseSummary::default());
    h.clock.advance(h.fixture.lease_ttl_ms - 1);
    assert!(h.abandoned().await.is_empty());

    // Expired: abandoned, reaped exactly once with lease_lost, and forgotten.
    h.clock.advance(1);
    let summary = h.reaper().run_once(10).await.unwrap();
    assert_eq!(
        summary,
        AbandonedLeaseSummary {
            inspected: 1,
            reaped: 1,
            remaining: 0,
            errors: Vec::new(),
        }
    );
    assert_eq!(
        h.fixture.sandbox.reap.calls(),
        vec![ReapCall {
            scope: h.scope(),
            lease: h.lease(),
            reason: TerminationReason::LeaseLost,
        }]
    );
    assert!(h.journaled().await.is_empty());

    // Repeatable: a second pass finds nothing and reaps nothing.
    assert_eq!(
        h.reaper().run_once(10).await.unwrap(),
        AbandonedLeaseSummary::default()
    );
    assert_eq!(h.fixture.sandbox.reap.count(), 1);
}

#[tokio::test]
async fn a_failed_or_unroutable_reap_keeps_the_entry_and_reports_why() {
    let h = Harness::new();
    let scope = h.scope();
    for provider in ["fake", "gone"] {
        h.journal
            .record(LeaseJournalEntry {
                scope: scope.clone(),
                generation: 7,
                owner_id: "dead-host".into(),
                lease: ManagedSandboxLease {
                    provider: provider.into(),
                    runtime_id: "r".into(),
                    metadata: None,
                },
                acquired_at: "2026-12-02T14:39:12.000Z".into(),
            })
            .await
            .unwrap();
    }
    h.fixture
        .sandbox
        .reap
        .fails(PortError::new("provider still partitioned"));

    let summary = h.reaper().run_once(10).await.unwrap();

    assert_eq!(
        (summary.inspected, summary.reaped, summary.remaining),
        (2, 0, 2)
    );
    let errors: Vec<(&str, &str)> = summary
        .errors
        .iter()
        .map(|failure| (failure.provider.as_str(), failure.error.as_str()))
        .collect();
    assert_eq!(
        errors,
        [
            ("fake", "provider still partitioned"),
            ("gone", "No sandbox backend is registered for provider gone"),
        ]
    );
    assert_eq!(h.journaled().await.len(), 2);

    // Once the provider answers again, the next pass reaps what it can route.
    h.fixture.sandbox.reap.set(|_| async { Ok(()) });
    let summary = h.reaper().run_once(10).await.unwrap();
    assert_eq!((summary.reaped, summary.remaining), (1, 1));
    assert_eq!(h.journaled().await[0].lease.provider, "gone");

    let text = "Abandoned lease reap limit must be a positive integer";
    assert_eq!(h.reaper().run_once(0).await.unwrap_err().message(), text);
    assert_eq!(
        h.reaper().run_once(1 << 53).await.unwrap_err().message(),
        text
    );
}

/// A journal whose `record` always fails.
struct RefusingJournal(MemoryLeaseJournal);

#[async_trait]
impl RuntimeLeaseJournalPort for RefusingJournal {
    async fn record(&self, _entry: LeaseJournalEntry) -> Result<(), PortError> {
        Err(PortError::new("disk full"))
    }
    async fn forget(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError> {
        self.0.forget(scope, lease).await
    }
    async fn list(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        self.0.list(limit).await
    }
    async fn abandoned(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        self.0.abandoned(limit).await
    }
}

#[tokio::test]
async fn an_unjournaled_lease_is_terminated_and_acquire_fails() {
    let h =
        Harness::with_journal(|fences| Arc::new(RefusingJournal(MemoryLeaseJournal::new(fences))));

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    let ManagedRuntimeRunResult::Failed { error } = result else {
        panic!("expected failed, got {result:?}");
    };
    assert_eq!(
        error.message(),
        "Sandbox lease runtime-fault could not be journaled, so it was terminated: disk full"
    );
    // The decorator terminated the compute it could not record; the host had no lease.
    let terminated = h.fixture.sandbox.terminate.calls();
    assert_eq!(terminated.len(), 1);
    assert_eq!(terminated[0].lease, h.lease());
    assert_eq!(terminated[0].reason, TerminationReason::Failed);
    assert!(h.fixture.orphans.store.list(10).await.unwrap().is_empty());
    assert!(h.journaled().await.is_empty());
    assert!(!h.fixture.harness.run.called());
}

#[tokio::test]
async fn an_unjournaled_lease_whose_terminate_fails_says_so_without_the_token() {
    let h =
        Harness::with_journal(|fences| Arc::new(RefusingJournal(MemoryLeaseJournal::new(fences))));
    // A careless provider echoes the fence token (the store's fence issues its own).
    h.fixture.sandbox.terminate.set(|call| async move {
        Err(PortError::new(format!(
            "denied for {}",
            call.fence.token.expose()
        )))
    });

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    let ManagedRuntimeRunResult::Failed { error } = result else {
        panic!("expected failed, got {result:?}");
    };
    assert_eq!(
        error.message(),
        "Sandbox lease runtime-fault could not be journaled (disk full), and terminating it \
         failed: denied for [redacted]"
    );
}

#[tokio::test]
async fn suspend_forgets_a_retained_runtime_and_reap_forgets_a_reaped_one() {
    let h = Harness::new();
    let scope = h.scope();
    let entry = |runtime_id: &str| LeaseJournalEntry {
        scope: scope.clone(),
        generation: 1,
        owner_id: "fault-owner".into(),
        lease: ManagedSandboxLease {
            provider: "fake".into(),
            runtime_id: runtime_id.into(),
            metadata: None,
        },
        acquired_at: "2026-12-02T14:39:12.000Z".into(),
    };
    h.journal.record(entry("retained")).await.unwrap();
    h.journal.record(entry("reaped")).await.unwrap();

    h.sandbox
        .suspend(
            &scope,
            &h.fixture.fence(),
            &entry("retained").lease,
            omabox_contract::AbortSignal::never(),
        )
        .await
        .unwrap();
    h.sandbox
        .reap(&scope, &entry("reaped").lease, TerminationReason::Failed)
        .await
        .unwrap();

    assert!(h.journaled().await.is_empty());
}

#[tokio::test]
async fn the_reaper_revokes_the_session_tokens_of_the_claims_it_reaps() {
    use omabox_contract::{IssueSessionTokenInput, SessionTokenPort};
    let h = Harness::new();
    let tokens = Arc::new(omabox_store::MemorySessionTokens::new().with_clock(h.clock.clone()));
    let issue = |scope: RuntimeResourceScope, generation: u64| {
        let tokens = Arc::clone(&tokens);
        async move {
            tokens
                .issue(IssueSessionTokenInput {
                    scope,
                    generation,
                    ttl_ms: 10 * 3_600_000,
                })
                .await
                .unwrap()
        }
    };
    // A dead host's claim (no fence holds generation 7) with a long-lived token, and a live
    // token of another work item.
    let dead = issue(h.scope(), 7).await;
    let other_scope = RuntimeResourceScope::new("w", "e", "other-session", "main");
    let other = issue(other_scope, 1).await;
    h.journal
        .record(LeaseJournalEntry {
            scope: h.scope(),
            generation: 7,
            owner_id: "dead-host".into(),
            lease: h.lease(),
            acquired_at: "2026-12-02T14:39:12.000Z".into(),
        })
        .await
        .unwrap();
    // A reap that fails still revokes first (the claim is dead either way) and keeps the
    // entry; the next pass reaps it.
    h.fixture.sandbox.reap.fails(PortError::new("partitioned"));
    let reaper = h.reaper().with_session_tokens(tokens.clone());
    assert_eq!(reaper.run_once(10).await.unwrap().remaining, 1);
    assert_eq!(tokens.verify(dead.expose()).await.unwrap(), None);
    h.fixture.sandbox.reap.returns(());
    assert_eq!(reaper.run_once(10).await.unwrap().reaped, 1);
    assert!(tokens.verify(other.expose()).await.unwrap().is_some());
}

/// Hundreds of dead hosts: one `run_all` reaps every abandoned lease in pages, lists past the
/// ones that fail (each tried once), and counts as remaining what is still journaled.
#[tokio::test]
async fn run_all_reaps_every_page_and_counts_what_stays_in_the_journal() {
    let h = Harness::new();
    for index in 0..250u64 {
        // Every tenth names a provider nobody can reap.
        let provider = if index % 10 == 0 { "gone" } else { "fake" };
        h.journal
            .record(LeaseJournalEntry {
                scope: RuntimeResourceScope::new("w", "e", format!("dead{index:03}"), "main"),
                generation: 1,
                owner_id: "dead-host".into(),
                lease: ManagedSandboxLease {
                    provider: provider.into(),
                    runtime_id: format!("r{index}"),
                    metadata: None,
                },
                acquired_at: "2026-12-02T14:39:12.000Z".into(),
            })
            .await
            .unwrap();
    }
    let limited = h.reaper().run_all(100, Some(30)).await.unwrap();
    assert_eq!((limited.inspected, limited.reaped), (30, 27));
    assert_eq!(limited.remaining, 250 - 27, "counted in the journal");

    let summary = h.reaper().run_all(100, None).await.unwrap();
    assert_eq!(summary.inspected, 250 - 27);
    assert_eq!(summary.reaped, 225 - 27);
    assert_eq!(summary.remaining, 25);
    assert_eq!(summary.errors.len(), 25);
    assert_eq!(h.journal.abandoned(1000).await.unwrap().len(), 25);
    // The one-page pass reports the journal too, not `inspected - reaped`.
    let once = h.reaper().run_once(5).await.unwrap();
    assert_eq!((once.inspected, once.reaped, once.remaining), (5, 0, 25));
}
