//! The behavioural contract of a fence store and an orphan queue, written once and run
//! against every implementation (see `ports.rs`). Semantics: reference §1.1 and §1.11.
//! The lease journal and usage ledger (omabox extensions) are in `journal.rs`.

mod credentials;
mod journal;
mod run_queue;
pub use credentials::*;
pub use journal::*;
pub use run_queue::*;

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, EnqueueRuntimeOrphanInput,
    ManagedSandboxLease, Nullable, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RunQueuePort, RuntimeCheckpointKind,
    RuntimeCheckpointRef, RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimePublicationCandidate,
    RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourcePublication,
    RuntimeResourceScope, SecretString, SessionTokenPort, TerminationReason, UsageLedgerPort,
    VaultSecretPort,
};
use omabox_store::{
    ManualClock, MemoryFenceStore, MemoryLeaseJournal, MemoryOrphanStore, MemoryRunQueue,
    MemorySessionTokens, MemoryUsageLedger, MemoryVault, PostgresStore, SqliteStore, iso_millis,
};
use omabox_test_support::postgres::TestPostgres;
use std::sync::Arc;
use tempfile::TempDir;

/// 2026-12-02T14:39:12.000Z
pub const T0: u64 = 1_796_222_352_000;
pub const TTL: u64 = 1_000;

/// One implementation under test, on a manual clock standing at [`T0`].
pub struct Subject {
    pub fences: Arc<dyn RuntimeResourceFencePort>,
    pub orphans: Arc<dyn RuntimeOrphanPort>,
    pub journal: Arc<dyn RuntimeLeaseJournalPort>,
    pub usage: Arc<dyn UsageLedgerPort>,
    pub tokens: Arc<dyn SessionTokenPort>,
    pub vault: Arc<dyn VaultSecretPort>,
    pub runs: Arc<dyn RunQueuePort>,
    pub clock: ManualClock,
    _dir: Option<TempDir>,
    _server: Option<TestPostgres>,
}

pub fn memory() -> Subject {
    let clock = ManualClock::new(T0);
    let fences = Arc::new(MemoryFenceStore::new().with_clock(clock.clone()));
    Subject {
        journal: Arc::new(MemoryLeaseJournal::new(fences.clone())),
        runs: Arc::new(MemoryRunQueue::new(fences.clone())),
        fences,
        orphans: Arc::new(MemoryOrphanStore::new()),
        usage: Arc::new(MemoryUsageLedger::new()),
        tokens: Arc::new(MemorySessionTokens::new().with_clock(clock.clone())),
        vault: Arc::new(MemoryVault::new()),
        clock,
        _dir: None,
        _server: None,
    }
}

pub fn sqlite() -> Subject {
    let clock = ManualClock::new(T0);
    let dir = tempfile::tempdir().unwrap();
    let store = Arc::new(
        SqliteStore::open(dir.path().join("state").join("omabox.db"))
            .unwrap()
            .with_clock(clock.clone()),
    );
    Subject {
        fences: store.clone(),
        orphans: store.clone(),
        journal: store.clone(),
        usage: store.clone(),
        tokens: store.clone(),
        runs: store.clone(),
        vault: store,
        clock,
        _dir: Some(dir),
        _server: None,
    }
}

/// A `PostgresStore` on a fresh server of its own, or `None` when this machine cannot run
/// PostgreSQL (the capability gate printed why; under `CI=true` it failed the test).
pub async fn postgres() -> Option<Subject> {
    let server = TestPostgres::start_or_skip()?;
    // A collation where "a" sorts before "B": orderings must still be byte-wise.
    let url = server.create_database_icu("omabox_suite", "en-US").unwrap();
    let clock = ManualClock::new(T0);
    let store = Arc::new(
        PostgresStore::connect(&url)
            .await
            .unwrap()
            .with_clock(clock.clone()),
    );
    Some(Subject {
        fences: store.clone(),
        orphans: store.clone(),
        journal: store.clone(),
        usage: store.clone(),
        tokens: store.clone(),
        runs: store.clone(),
        vault: store,
        clock,
        _dir: None,
        _server: Some(server),
    })
}

pub fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", "work")
}

impl Subject {
    pub async fn try_acquire(&self, owner: &str, ttl_ms: u64) -> AcquireRuntimeFenceResult {
        self.fences
            .acquire(AcquireRuntimeFenceInput {
                scope: scope(),
                owner_id: owner.into(),
                ttl_ms,
            })
            .await
            .unwrap()
    }

    /// Acquires and expects success.
    pub async fn acquire(
        &self,
        owner: &str,
    ) -> (RuntimeResourceFence, Option<RuntimeResourcePublication>) {
        match self.try_acquire(owner, TTL).await {
            AcquireRuntimeFenceResult::Acquired { fence, publication } => (fence, publication),
            AcquireRuntimeFenceResult::Conflict { expires_at } => {
                panic!("{owner} expected to acquire, got conflict until {expires_at:?}")
            }
        }
    }

    /// Acquires and expects a conflict; returns its expiresAt.
    pub async fn conflict(&self, owner: &str) -> Option<String> {
        match self.try_acquire(owner, TTL).await {
            AcquireRuntimeFenceResult::Conflict { expires_at } => expires_at,
            AcquireRuntimeFenceResult::Acquired { fence, .. } => {
                panic!(
                    "{owner} expected a conflict, acquired generation {}",
                    fence.generation
                )
            }
        }
    }

    pub async fn publish_with(
        &self,
        fence: &RuntimeResourceFence,
        workspace: &str,
        output: Option<&str>,
        checkpoint: Nullable<RuntimeCheckpointRef>,
    ) -> PublishRuntimeResourcesResult {
        self.fences
            .publish(PublishRuntimeResourcesInput {
                fence: fence.clone(),
                workspace_candidate: candidate(workspace),
                output_candidate: output.map(candidate),
                runtime_checkpoint: checkpoint,
            })
            .await
            .unwrap()
    }

    pub async fn publish(
        &self,
        fence: &RuntimeResourceFence,
        workspace: &str,
    ) -> PublishRuntimeResourcesResult {
        self.publish_with(fence, workspace, None, Nullable::Absent)
            .await
    }

    pub async fn is_current(&self, fence: &RuntimeResourceFence) -> bool {
        self.fences.is_current(fence).await.unwrap()
    }

    pub async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> RenewRuntimeFenceResult {
        self.fences.renew(fence, ttl_ms).await.unwrap()
    }

    pub async fn release(&self, fence: &RuntimeResourceFence) {
        self.fences
            .release(fence, TerminationReason::Completed)
            .await
            .unwrap();
    }
}

pub fn candidate(id: &str) -> RuntimePublicationCandidate {
    RuntimePublicationCandidate {
        id: id.into(),
        content_hash: format!("sha256:{id}"),
        metadata: None,
    }
}

pub fn checkpoint(id: &str) -> RuntimeCheckpointRef {
    RuntimeCheckpointRef {
        provider: "linux".into(),
        checkpoint_id: id.into(),
        kind: RuntimeCheckpointKind::Filesystem,
        source_runtime_id: "runtime-1".into(),
        session_id: "session".into(),
        work_generation: 1,
        workspace_revision: 1,
        harness_version: "1.0.0".into(),
        runtime_identity: "{}".into(),
    }
}

fn published(revision: u64) -> PublishRuntimeResourcesResult {
    PublishRuntimeResourcesResult::Published { revision }
}

fn with_token(fence: &RuntimeResourceFence, token: &str) -> RuntimeResourceFence {
    RuntimeResourceFence {
        token: SecretString::new(token),
        ..fence.clone()
    }
}

// ---- fences -------------------------------------------------------------------------------

pub async fn generations_increase_per_new_owner(s: Subject) {
    let (first, publication) = s.acquire("owner-a").await;
    assert_eq!(first.generation, 1);
    assert_eq!(publication, None);
    assert_eq!(first.scope(), scope());
    assert_eq!(first.owner_id, "owner-a");
    assert_eq!(first.expires_at, iso_millis(T0 + TTL));
    s.release(&first).await;

    let (second, _) = s.acquire("owner-b").await;
    assert_eq!(second.generation, 2);
    assert_ne!(second.token, first.token);

    s.clock.advance(TTL);
    let (third, _) = s.acquire("owner-c").await;
    assert_eq!(third.generation, 3);
    s.release(&third).await;

    // A fresh acquire by an earlier owner is a new generation too.
    let (fourth, _) = s.acquire("owner-a").await;
    assert_eq!(fourth.generation, 4);
    assert_ne!(fourth.token, first.token);

    // Scopes are independent.
    let other = s
        .fences
        .acquire(AcquireRuntimeFenceInput {
            scope: RuntimeResourceScope::new("workspace", "environment", "session", "other"),
            owner_id: "owner-a".into(),
            ttl_ms: TTL,
        })
        .await
        .unwrap();
    let AcquireRuntimeFenceResult::Acquired { fence, .. } = other else {
        panic!("other scope should be free: {other:?}");
    };
    assert_eq!(fence.generation, 1);
}

pub async fn reentrant_acquire_by_same_owner_returns_same_fence(s: Subject) {
    let (first, _) = s.acquire("owner-a").await;
    assert_eq!(s.publish(&first, "ws-1").await, published(1));
    s.clock.advance(TTL / 2);
    let (again, publication) = s.acquire("owner-a").await;
    assert_eq!(again, first, "same generation, token and expiresAt");
    assert_eq!(publication.map(|p| p.revision), Some(1));
    assert!(s.is_current(&again).await);
}

pub async fn conflict_carries_the_active_expiry(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    assert_eq!(s.conflict("owner-b").await, Some(iso_millis(T0 + TTL)));
    s.clock.advance(400);
    let RenewRuntimeFenceResult::Renewed { fence: renewed } = s.renew(&fence, 5_000).await else {
        panic!("renew should succeed");
    };
    assert_eq!(
        s.conflict("owner-b").await,
        Some(renewed.expires_at.clone())
    );
    assert_eq!(renewed.expires_at, iso_millis(T0 + 400 + 5_000));
}

pub async fn expired_fence_is_taken_over_with_the_previous_publication(s: Subject) {
    let (old, _) = s.acquire("owner-a").await;
    assert_eq!(
        s.publish_with(&old, "ws-1", Some("out-1"), Nullable::Absent)
            .await,
        published(1)
    );
    s.clock.advance(TTL);
    let (new, publication) = s.acquire("owner-b").await;
    assert_eq!(new.generation, 2);
    assert_eq!(new.expires_at, iso_millis(T0 + 2 * TTL));
    assert_eq!(
        publication,
        Some(RuntimeResourcePublication {
            generation: 1,
            revision: 1,
            workspace_candidate: candidate("ws-1"),
            output_candidate: Some(candidate("out-1")),
            runtime_checkpoint: Nullable::Absent,
        })
    );
}

pub async fn is_current_only_for_the_active_unexpired_claim(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    assert!(s.is_current(&fence).await);
    assert!(!s.is_current(&with_token(&fence, "1:not-the-token")).await);
    let other_owner = RuntimeResourceFence {
        owner_id: "owner-b".into(),
        ..fence.clone()
    };
    assert!(!s.is_current(&other_owner).await);
    let other_generation = RuntimeResourceFence {
        generation: 2,
        ..fence.clone()
    };
    assert!(!s.is_current(&other_generation).await);
    let other_scope = RuntimeResourceFence {
        work_id: "other".into(),
        ..fence.clone()
    };
    assert!(!s.is_current(&other_scope).await);

    s.clock.advance(TTL - 1);
    assert!(s.is_current(&fence).await);
    s.clock.advance(1);
    assert!(!s.is_current(&fence).await, "expired at expiresAt");

    let (new, _) = s.acquire("owner-b").await;
    assert!(!s.is_current(&fence).await, "after takeover");
    assert!(s.is_current(&new).await);
    s.release(&new).await;
    assert!(!s.is_current(&new).await, "after release");
}

pub async fn renew_extends_and_is_lost_after_expiry_or_takeover(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    s.clock.advance(600);
    let RenewRuntimeFenceResult::Renewed { fence: renewed } = s.renew(&fence, TTL).await else {
        panic!("renew should succeed");
    };
    assert_eq!(renewed.expires_at, iso_millis(T0 + 600 + TTL));
    assert_eq!(renewed.token, fence.token);
    assert_eq!(renewed.generation, fence.generation);
    s.clock.advance(TTL - 1);
    // Past the original expiry; the copy held from before the renew is still the claim.
    assert!(s.is_current(&fence).await);
    assert_eq!(
        s.renew(&with_token(&fence, "bad"), TTL).await,
        RenewRuntimeFenceResult::Lost
    );

    s.clock.advance(1);
    assert_eq!(
        s.renew(&fence, TTL).await,
        RenewRuntimeFenceResult::Lost,
        "expired"
    );

    let (new, _) = s.acquire("owner-b").await;
    assert_eq!(
        s.renew(&fence, TTL).await,
        RenewRuntimeFenceResult::Lost,
        "taken over"
    );
    assert!(matches!(
        s.renew(&new, TTL).await,
        RenewRuntimeFenceResult::Renewed { .. }
    ));
}

pub async fn publish_is_lost_for_a_stale_or_forged_or_expired_fence(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    assert_eq!(
        s.publish(&with_token(&fence, "1:forged"), "ws-x").await,
        PublishRuntimeResourcesResult::Lost
    );
    s.clock.advance(TTL);
    assert_eq!(
        s.publish(&fence, "ws-late").await,
        PublishRuntimeResourcesResult::Lost
    );

    let (new, publication) = s.acquire("owner-b").await;
    assert_eq!(publication, None, "nothing was published");
    assert_eq!(s.publish(&new, "ws-new").await, published(1));
    // The old generation cannot move the pointer, even with a fresh-looking candidate.
    assert_eq!(
        s.publish(&fence, "ws-stale").await,
        PublishRuntimeResourcesResult::Lost
    );
    let (_, publication) = s.acquire("owner-b").await;
    let publication = publication.unwrap();
    assert_eq!((publication.generation, publication.revision), (2, 1));
    assert_eq!(publication.workspace_candidate, candidate("ws-new"));

    // Never acquired.
    let stranger = RuntimeResourceFence {
        work_id: "never".into(),
        ..new.clone()
    };
    assert_eq!(
        s.publish(&stranger, "ws").await,
        PublishRuntimeResourcesResult::Lost
    );
}

pub async fn identical_republish_is_idempotent_and_changes_get_new_revisions(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    assert_eq!(
        s.publish_with(&fence, "ws-1", Some("out-1"), Nullable::Absent)
            .await,
        published(1)
    );
    assert_eq!(
        s.publish_with(&fence, "ws-1", Some("out-1"), Nullable::Absent)
            .await,
        published(1)
    );
    // absent ≡ null for idempotency.
    assert_eq!(
        s.publish_with(&fence, "ws-1", Some("out-1"), Nullable::Null)
            .await,
        published(1)
    );
    // Different workspace, output presence, output, checkpoint: each a new revision.
    assert_eq!(
        s.publish_with(&fence, "ws-2", Some("out-1"), Nullable::Absent)
            .await,
        published(2)
    );
    assert_eq!(
        s.publish_with(&fence, "ws-2", None, Nullable::Absent).await,
        published(3)
    );
    assert_eq!(
        s.publish_with(&fence, "ws-2", Some("out-2"), Nullable::Absent)
            .await,
        published(4)
    );
    let live = Nullable::Value(checkpoint("c-1"));
    assert_eq!(
        s.publish_with(&fence, "ws-2", Some("out-2"), live.clone())
            .await,
        published(5)
    );
    assert_eq!(
        s.publish_with(&fence, "ws-2", Some("out-2"), live).await,
        published(5)
    );
    // Going back to an earlier candidate is a change too.
    assert_eq!(
        s.publish_with(&fence, "ws-1", Some("out-1"), Nullable::Absent)
            .await,
        published(6)
    );

    // The same candidates from a new generation are a new publication.
    s.clock.advance(TTL);
    let (new, _) = s.acquire("owner-b").await;
    assert_eq!(
        s.publish_with(&new, "ws-1", Some("out-1"), Nullable::Absent)
            .await,
        published(7)
    );
}

pub async fn runtime_checkpoint_is_stored_as_given(s: Subject) {
    let (fence, _) = s.acquire("owner-a").await;
    let current = |s: &Subject| {
        let fences = s.fences.clone();
        async move {
            match fences
                .acquire(AcquireRuntimeFenceInput {
                    scope: scope(),
                    owner_id: "owner-a".into(),
                    ttl_ms: TTL,
                })
                .await
                .unwrap()
            {
                AcquireRuntimeFenceResult::Acquired { publication, .. } => publication.unwrap(),
                other => panic!("re-entrant acquire failed: {other:?}"),
            }
        }
    };

    s.publish_with(&fence, "ws-absent", None, Nullable::Absent)
        .await;
    assert_eq!(current(&s).await.runtime_checkpoint, Nullable::Absent);
    // An idempotent republish with null keeps what was stored.
    s.publish_with(&fence, "ws-absent", None, Nullable::Null)
        .await;
    assert_eq!(current(&s).await.runtime_checkpoint, Nullable::Absent);

    s.publish_with(&fence, "ws-null", None, Nullable::Null)
        .await;
    assert_eq!(current(&s).await.runtime_checkpoint, Nullable::Null);

    s.publish_with(&fence, "ws-value", None, Nullable::Value(checkpoint("c-9")))
        .await;
    let stored = current(&s).await;
    assert_eq!(
        stored.runtime_checkpoint,
        Nullable::Value(checkpoint("c-9"))
    );
    assert_eq!(stored.revision, 3);
    let json = serde_json::to_value(&stored).unwrap();
    assert_eq!(json["runtimeCheckpoint"]["checkpointId"], "c-9");
}

pub async fn release_by_a_stale_fence_does_not_clear_the_current_one(s: Subject) {
    let (old, _) = s.acquire("owner-a").await;
    s.clock.advance(TTL);
    let (current, _) = s.acquire("owner-b").await;

    s.release(&old).await;
    assert!(s.is_current(&current).await);
    assert_eq!(
        s.conflict("owner-c").await,
        Some(current.expires_at.clone())
    );

    s.release(&with_token(&current, "2:forged")).await;
    assert!(s.is_current(&current).await);

    s.release(&current).await;
    assert!(!s.is_current(&current).await);
    s.release(&current).await; // twice: still fine
    let (next, _) = s.acquire("owner-c").await;
    assert_eq!(next.generation, 3, "released without waiting for expiry");
    assert_eq!(
        s.publish(&current, "ws").await,
        PublishRuntimeResourcesResult::Lost
    );
}

pub async fn released_fence_can_be_released_after_expiry(s: Subject) {
    // Release by the same claim clears the fence even after it expired (no takeover yet).
    let (fence, _) = s.acquire("owner-a").await;
    s.clock.advance(TTL * 5);
    s.release(&fence).await;
    let (next, _) = s.acquire("owner-a").await;
    assert_eq!(next.generation, 2);
    let never = RuntimeResourceFence {
        work_id: "never".into(),
        ..fence
    };
    s.release(&never).await;
}

// ---- orphans ------------------------------------------------------------------------------

fn lease(runtime: &str) -> ManagedSandboxLease {
    ManagedSandboxLease {
        provider: "linux".into(),
        runtime_id: runtime.into(),
        metadata: Some([("pid".to_owned(), 42_u64.into())].into()),
    }
}

fn orphan(work: &str, generation: u64, runtime: &str, error: &str) -> EnqueueRuntimeOrphanInput {
    EnqueueRuntimeOrphanInput {
        scope: RuntimeResourceScope::new("w", "e", "s", work),
        generation,
        owner_id: "owner-a".into(),
        sandbox: lease(runtime),
        reason: TerminationReason::Failed,
        error: PortError::new(error),
    }
}

pub async fn orphans_upsert_sort_limit_fail_and_resolve(s: Subject) {
    let q = &s.orphans;
    assert!(q.list(10).await.unwrap().is_empty());
    q.enqueue(orphan("k2", 1, "r", "boom 2")).await.unwrap();
    q.enqueue(orphan("k1", 1, "r", "boom 1")).await.unwrap();
    q.enqueue(orphan("k1", 2, "r", "boom 1b")).await.unwrap();

    let all = q.list(10).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|record| record.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            r#"["w","e","s","k1",1,"linux","r"]"#,
            r#"["w","e","s","k1",2,"linux","r"]"#,
            r#"["w","e","s","k2",1,"linux","r"]"#,
        ]
    );
    let first = &all[0];
    assert_eq!(first.scope, RuntimeResourceScope::new("w", "e", "s", "k1"));
    assert_eq!(first.generation, 1);
    assert_eq!(first.owner_id, "owner-a");
    assert_eq!(first.sandbox, lease("r"));
    assert_eq!(first.reason, TerminationReason::Failed);
    assert_eq!(first.attempts, 0);
    assert_eq!(first.last_error, "boom 1");

    assert_eq!(q.list(2).await.unwrap(), all[..2].to_vec());
    assert!(q.list(0).await.unwrap().is_empty());

    let id = first.id.clone();
    q.failed(&id, &PortError::new("reap failed once"))
        .await
        .unwrap();
    q.failed(&id, &PortError::new("reap failed twice"))
        .await
        .unwrap();
    let record = &q.list(1).await.unwrap()[0];
    assert_eq!(
        (record.attempts, record.last_error.as_str()),
        (2, "reap failed twice")
    );

    // Re-enqueue keeps attempts, replaces the rest.
    let mut again = orphan("k1", 1, "r", "terminate failed again");
    again.reason = TerminationReason::LeaseLost;
    again.owner_id = "owner-b".into();
    q.enqueue(again).await.unwrap();
    let record = &q.list(1).await.unwrap()[0];
    assert_eq!(record.attempts, 2);
    assert_eq!(record.last_error, "terminate failed again");
    assert_eq!(record.reason, TerminationReason::LeaseLost);
    assert_eq!(record.owner_id, "owner-b");

    // Unknown ids: no-ops.
    q.failed("nope", &PortError::new("x")).await.unwrap();
    q.resolve("nope").await.unwrap();
    assert_eq!(q.list(10).await.unwrap().len(), 3);

    q.resolve(&id).await.unwrap();
    let left: Vec<String> = q
        .list(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(left.len(), 2);
    assert!(!left.contains(&id));

    // A resolved orphan enqueued again starts from zero attempts.
    q.enqueue(orphan("k1", 1, "r", "back")).await.unwrap();
    assert_eq!(q.list(1).await.unwrap()[0].attempts, 0);
}
