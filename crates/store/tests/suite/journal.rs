//! The lease journal and the usage ledger (omabox extensions), run against every store.

use super::{Subject, T0, TTL, scope};
use omabox_contract::{
    LeaseJournalEntry, MAX_USAGE_SECONDS_PER_RECORD, ManagedSandboxLease, RuntimeResourceScope,
    UsageKind, UsageRecord,
};
use omabox_store::iso_millis;

fn runtime(runtime_id: &str) -> ManagedSandboxLease {
    ManagedSandboxLease {
        provider: "linux".into(),
        runtime_id: runtime_id.into(),
        metadata: Some([("pid".to_owned(), 7_u64.into())].into()),
    }
}

fn entry(scope: RuntimeResourceScope, generation: u64, runtime_id: &str) -> LeaseJournalEntry {
    LeaseJournalEntry {
        scope,
        generation,
        owner_id: "owner-a".into(),
        lease: runtime(runtime_id),
        acquired_at: iso_millis(T0),
    }
}

impl Subject {
    async fn abandoned_ids(&self) -> Vec<String> {
        self.journal
            .abandoned(100)
            .await
            .unwrap()
            .iter()
            .map(LeaseJournalEntry::id)
            .collect()
    }

    async fn journaled(&self) -> Vec<LeaseJournalEntry> {
        self.journal.list(100).await.unwrap()
    }
}

// ---- lease journal ------------------------------------------------------------------------

pub async fn journal_records_upserts_lists_and_forgets(s: Subject) {
    let in_work = |work: &str| RuntimeResourceScope::new("w", "e", "s", work);
    s.journal
        .record(entry(in_work("k2"), 1, "r"))
        .await
        .unwrap();
    s.journal
        .record(entry(in_work("k1"), 2, "r"))
        .await
        .unwrap();
    s.journal
        .record(entry(in_work("k1"), 1, "r"))
        .await
        .unwrap();
    let all = s.journaled().await;
    let ids: Vec<String> = all.iter().map(LeaseJournalEntry::id).collect();
    assert_eq!(
        ids,
        [
            r#"["w","e","s","k1",1,"linux","r"]"#,
            r#"["w","e","s","k1",2,"linux","r"]"#,
            r#"["w","e","s","k2",1,"linux","r"]"#,
        ]
    );
    assert_eq!(all[0], entry(in_work("k1"), 1, "r"));
    assert_eq!(s.journal.list(2).await.unwrap(), all[..2].to_vec());
    assert!(s.journal.list(0).await.unwrap().is_empty());

    // Re-recording the same compute replaces owner and lease, keeps the observed start.
    let mut again = entry(in_work("k2"), 1, "r");
    again.owner_id = "owner-b".into();
    again.lease.metadata = Some([("suspended".to_owned(), true.into())].into());
    again.acquired_at = iso_millis(T0 + 5_000);
    s.journal.record(again.clone()).await.unwrap();
    let stored = s.journaled().await.pop().unwrap();
    assert_eq!(stored.owner_id, "owner-b");
    assert_eq!(stored.lease, again.lease);
    assert_eq!(stored.acquired_at, iso_millis(T0));

    // Forget drops the runtime in that scope, whatever generation journaled it; only there.
    s.journal
        .forget(&in_work("k1"), &runtime("r"))
        .await
        .unwrap();
    let left: Vec<String> = s
        .journaled()
        .await
        .iter()
        .map(LeaseJournalEntry::id)
        .collect();
    assert_eq!(left, [r#"["w","e","s","k2",1,"linux","r"]"#]);
    // Unknown leases and another provider's runtime of the same id: no-ops.
    s.journal
        .forget(&in_work("k2"), &runtime("other"))
        .await
        .unwrap();
    let foreign = ManagedSandboxLease {
        provider: "local-subprocess".into(),
        ..runtime("r")
    };
    s.journal.forget(&in_work("k2"), &foreign).await.unwrap();
    assert_eq!(s.journaled().await.len(), 1);
    s.journal
        .forget(&in_work("k2"), &runtime("r"))
        .await
        .unwrap();
    assert!(s.journaled().await.is_empty());
}

pub async fn journal_entry_is_not_abandoned_while_the_fence_is_held(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    s.journal
        .record(entry(scope(), fence.generation, "r"))
        .await
        .unwrap();
    assert!(s.abandoned_ids().await.is_empty());
    // Still held one millisecond before expiry, and after a renewal past the first expiry.
    s.clock.advance(TTL - 1);
    assert!(s.abandoned_ids().await.is_empty());
    s.renew(&fence, TTL).await;
    s.clock.advance(TTL - 1);
    assert!(s.abandoned_ids().await.is_empty());
    assert_eq!(s.journaled().await.len(), 1);
}

pub async fn journal_entry_is_abandoned_after_expiry(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    let journaled = entry(scope(), fence.generation, "r");
    s.journal.record(journaled.clone()).await.unwrap();
    // Expired exactly at expiresAt, like `isCurrent`.
    s.clock.advance(TTL);
    assert_eq!(
        s.journal.abandoned(10).await.unwrap(),
        vec![journaled.clone()]
    );
    // Abandoned is a query, not a move: the entry stays until forgotten, and repeats.
    assert_eq!(
        s.journal.abandoned(10).await.unwrap(),
        vec![journaled.clone()]
    );
    assert!(s.journal.abandoned(0).await.unwrap().is_empty());
    s.journal
        .forget(&journaled.scope, &journaled.lease)
        .await
        .unwrap();
    assert!(s.abandoned_ids().await.is_empty());
}

pub async fn journal_entry_is_abandoned_after_a_takeover(s: Subject) {
    let (first, _) = s.acquire("owner-a").await;
    s.journal
        .record(entry(scope(), first.generation, "r1"))
        .await
        .unwrap();
    s.clock.advance(TTL);
    let (second, _) = s.acquire("owner-b").await;
    assert_eq!(second.generation, first.generation + 1);
    s.journal
        .record(entry(scope(), second.generation, "r2"))
        .await
        .unwrap();
    // The old generation's lease is abandoned; the new holder's is not.
    assert_eq!(
        s.abandoned_ids().await,
        [entry(scope(), first.generation, "r1").id()]
    );
}

pub async fn journal_entry_is_abandoned_after_release_or_without_a_fence(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    s.journal
        .record(entry(scope(), fence.generation, "r"))
        .await
        .unwrap();
    let unknown = RuntimeResourceScope::new("w", "e", "s", "never-acquired");
    s.journal
        .record(entry(unknown.clone(), 1, "x"))
        .await
        .unwrap();
    // A work item this store never fenced has nobody holding it.
    assert_eq!(s.abandoned_ids().await, [entry(unknown, 1, "x").id()]);
    s.release(&fence).await;
    assert_eq!(s.abandoned_ids().await.len(), 2);
    assert_eq!(s.journal.abandoned(1).await.unwrap().len(), 1);
}

// ---- usage ledger -------------------------------------------------------------------------

fn usage(kind: UsageKind, runtime_id: &str, seconds: u64) -> UsageRecord {
    UsageRecord {
        kind,
        scope: scope(),
        provider: "linux".into(),
        runtime_id: runtime_id.into(),
        seconds,
        started_at: iso_millis(T0),
        stopped_at: iso_millis(T0 + seconds * 1_000),
        stop_estimated: false,
    }
}

pub async fn usage_is_clamped_idempotent_and_read_back(s: Subject) {
    let first = usage(UsageKind::SandboxActiveSeconds, "r1", 42);
    s.usage.record_usage(first.clone()).await.unwrap();
    // Terminate then reap of the same runtime: the first stop wins, nothing doubles.
    s.usage
        .record_usage(usage(UsageKind::SandboxActiveSeconds, "r1", 99))
        .await
        .unwrap();
    // Longer than a day: clamped to 24 h.
    let long = usage(UsageKind::SandboxActiveSeconds, "r2", 3 * 86_400);
    s.usage.record_usage(long.clone()).await.unwrap();
    // Another kind of the same runtime is its own record.
    let alive = usage(UsageKind::SessionAliveSeconds, "r1", 7);
    s.usage.record_usage(alive.clone()).await.unwrap();
    // Another session, with an estimated stop (a runtime found dead).
    let other = UsageRecord {
        scope: RuntimeResourceScope::new("workspace", "environment", "other-session", "work"),
        stop_estimated: true,
        ..usage(UsageKind::BrowserActiveSeconds, "b1", 3)
    };
    s.usage.record_usage(other.clone()).await.unwrap();

    let clamped = UsageRecord {
        seconds: MAX_USAGE_SECONDS_PER_RECORD,
        ..long
    };
    assert_eq!(
        s.usage.usage("session").await.unwrap(),
        vec![first.clone(), clamped.clone(), alive.clone()]
    );
    assert_eq!(
        s.usage.usage("other-session").await.unwrap(),
        vec![other.clone()]
    );
    assert!(s.usage.usage("nobody").await.unwrap().is_empty());
    assert_eq!(
        s.usage.list(10).await.unwrap(),
        vec![first.clone(), clamped, alive, other]
    );
    assert_eq!(s.usage.list(1).await.unwrap(), vec![first]);
}

/// The contract: a backend without an observed stop leaves `sandbox_active_seconds` absent
/// rather than writing a guessed duration. An estimate is omabox's own kind, whoever writes
/// it, and a runtime has at most one of the two sandbox kinds (the first wins).
pub async fn an_estimated_sandbox_stop_is_never_the_contract_kind(s: Subject) {
    // A reaper that found the runtime dead, stamping the contract kind by mistake.
    let guessed = UsageRecord {
        stop_estimated: true,
        ..usage(UsageKind::SandboxActiveSeconds, "dead", 30)
    };
    s.usage.record_usage(guessed.clone()).await.unwrap();
    // Measured first, then a reap of the same runtime estimating: the measurement stays.
    let measured = usage(UsageKind::SandboxActiveSeconds, "live", 12);
    s.usage.record_usage(measured.clone()).await.unwrap();
    s.usage
        .record_usage(UsageRecord {
            stop_estimated: true,
            ..usage(UsageKind::SandboxActiveSecondsEstimated, "live", 50)
        })
        .await
        .unwrap();
    // Estimated first: a later measurement of the same runtime adds nothing either.
    s.usage
        .record_usage(usage(UsageKind::SandboxActiveSeconds, "dead", 31))
        .await
        .unwrap();

    let records = s.usage.usage("session").await.unwrap();
    assert_eq!(
        records,
        vec![
            UsageRecord {
                kind: UsageKind::SandboxActiveSecondsEstimated,
                ..guessed
            },
            measured,
        ]
    );
    assert!(
        records
            .iter()
            .filter(|record| record.kind == UsageKind::SandboxActiveSeconds)
            .all(|record| !record.stop_estimated),
        "{records:?}"
    );
}
