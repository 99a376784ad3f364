//! Session tokens end to end: `SessionTokenFence` inside a real `ManagedRuntimeHost` run
//! (fakes for every port but the fence and the token store, which are the store's in-memory
//! twins on one manual clock). The fake harness plays the harness-env projection: it reads
//! the token from the sink's slot for its (scope, generation) and verifies it.

use async_trait::async_trait;
use omabox_contract::{
    IssueSessionTokenInput, ManagedWorkExecutionResult, PortError, RunHarnessInput,
    RuntimeOrphanPort, RuntimeResourceScope, SecretString, SessionTokenClaims, SessionTokenPort,
};
use omabox_host::runtime_host::{ManagedRuntimeHost, ManagedRuntimeRunResult};
use omabox_host::session_tokens::{SessionTokenFence, SessionTokenSlots};
use omabox_store::{ManualClock, MemoryFenceStore, MemorySessionTokens};
use omabox_testkit::fakes::{Fixture, Gate};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// 2026-12-02T14:39:12.000Z
const T0: u64 = 1_796_222_352_000;
const TOKEN_TTL: u64 = 3_600_000;

/// A token the fake harness read, and what it verified to.
type Seen = (SecretString, Option<SessionTokenClaims>);

struct Harness {
    fixture: Fixture,
    clock: ManualClock,
    fences: Arc<MemoryFenceStore>,
    tokens: Arc<dyn SessionTokenPort>,
    slots: SessionTokenSlots,
    /// What the fake harness saw: the token it read and what it verified to.
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Harness {
    fn new() -> Self {
        let clock = ManualClock::new(T0);
        let tokens = Arc::new(MemorySessionTokens::new().with_clock(clock.clone()));
        Self::with_tokens(clock, tokens)
    }

    fn with_tokens(clock: ManualClock, tokens: Arc<dyn SessionTokenPort>) -> Self {
        let h = Self {
            fixture: Fixture::fault_matrix(),
            fences: Arc::new(MemoryFenceStore::new().with_clock(clock.clone())),
            clock,
            tokens,
            slots: SessionTokenSlots::new(),
            seen: Arc::default(),
        };
        h.harness_reads_its_token();
        h
    }

    /// The fake harness: reads its claim's token from the slot and verifies it, like the
    /// proxy would on its first model call.
    fn harness_reads_its_token(&self) {
        let slots = self.slots.clone();
        let tokens = Arc::clone(&self.tokens);
        let seen = Arc::clone(&self.seen);
        self.fixture.harness.run.set(move |input: RunHarnessInput| {
            let token = slots.get(&input.scope, input.fence.generation);
            let tokens = Arc::clone(&tokens);
            let seen = Arc::clone(&seen);
            async move {
                let token = token.ok_or_else(|| PortError::new("no session token in the slot"))?;
                let claims = tokens.verify(token.expose()).await?;
                seen.lock().unwrap().push((token, claims));
                Ok(ManagedWorkExecutionResult::Completed)
            }
        });
    }

    fn host(&self) -> ManagedRuntimeHost {
        let mut deps = self.fixture.dependencies();
        deps.fences = Arc::new(
            SessionTokenFence::new(
                self.fences.clone(),
                Arc::clone(&self.tokens),
                Arc::new(self.slots.clone()),
            )
            .with_ttl_ms(TOKEN_TTL),
        );
        ManagedRuntimeHost::new(deps).expect("valid host")
    }

    fn scope(&self) -> RuntimeResourceScope {
        self.fixture.scope()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    async fn verifies(&self, token: &SecretString) -> Option<(RuntimeResourceScope, u64)> {
        self.tokens
            .verify(token.expose())
            .await
            .unwrap()
            .map(|claims| (claims.scope, claims.generation))
    }
}

/// Captures everything `tracing` writes in this test binary: one global subscriber, installed
/// once. (A per-thread subscriber loses events under `cargo test`, whose parallel test
/// threads without a subscriber can cache a callsite's interest as "never".) Other tests'
/// lines land here too, which only widens the leak check.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn global() -> Self {
        static GLOBAL: std::sync::OnceLock<Captured> = std::sync::OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let captured = Captured::default();
                let sink = captured.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_max_level(tracing::Level::TRACE)
                    .with_ansi(false)
                    .with_writer(move || sink.clone())
                    .finish();
                tracing::subscriber::set_global_default(subscriber)
                    .expect("the only global subscriber of this binary");
                captured
            })
            .clone()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_run_holds_one_token_for_its_claim_and_revokes_it_at_cleanup() {
    let captured = Captured::global();
    let h = Harness::new();
    // Terminate fails, so the run also leaves an orphan record to inspect.
    h.fixture
        .sandbox
        .terminate
        .fails(PortError::new("provider control plane unavailable"));

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let seen = h.seen();
    assert_eq!(seen.len(), 1, "the harness ran once");
    let (token, claims) = seen[0].clone();
    let claims = claims.expect("the token verified while the harness ran");
    assert_eq!((claims.scope, claims.generation), (h.scope(), 1));
    // Issued with the fence's TTL (shorter than the cap): it expires with the fence.
    assert_eq!(
        claims.expires_at,
        omabox_store::iso_millis(T0 + h.fixture.lease_ttl_ms)
    );
    assert!(token.expose().starts_with("omst_"));

    // After the run: revoked, and the slot is empty.
    assert_eq!(h.verifies(&token).await, None);
    assert!(h.slots.is_empty());
    assert_eq!(h.slots.get(&h.scope(), 1), None);

    // The token is nowhere else.
    let orphans = h.fixture.orphans.store.list(10).await.unwrap();
    assert_eq!(orphans.len(), 1);
    let token = token.expose();
    let places = [
        (
            "result",
            format!("{result:?} {}", serde_json::to_string(&result).unwrap()),
        ),
        (
            "orphan",
            format!("{orphans:?} {}", serde_json::to_string(&orphans).unwrap()),
        ),
        (
            "lease",
            format!(
                "{:?} {}",
                h.fixture.spec.lease,
                serde_json::to_string(&h.fixture.spec.lease).unwrap()
            ),
        ),
        ("call log", format!("{:?}", h.fixture.log)),
        ("logs", captured.text()),
    ];
    for (place, text) in places {
        assert!(
            !text.contains(token),
            "the token leaked into the {place}: {text}"
        );
    }
    assert!(
        captured.text().contains("session token issued"),
        "tracing captured"
    );
}

#[tokio::test]
async fn a_reclaim_after_a_dead_host_rotates_the_token() {
    let h = Harness::new();
    // Run 1: the host "dies" inside the harness, so nothing is released or revoked.
    let in_harness = Gate::new();
    h.fixture.harness.run.set({
        let in_harness = in_harness.clone();
        move |_| {
            in_harness.open();
            std::future::pending()
        }
    });
    let run = tokio::spawn({
        let host = h.host();
        let input = h.fixture.input();
        async move { host.run(input).await }
    });
    in_harness.wait().await;
    run.abort();
    assert!(run.await.unwrap_err().is_cancelled());
    let first = h
        .slots
        .get(&h.scope(), 1)
        .expect("generation 1 holds a token");
    assert_eq!(h.verifies(&first).await, Some((h.scope(), 1)), "still live");

    // The fence expires; run 2 reclaims the work item as generation 2.
    h.clock.advance(h.fixture.lease_ttl_ms);
    h.harness_reads_its_token();
    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    let seen = h.seen();
    assert_eq!(seen.len(), 1);
    let (second, claims) = seen[0].clone();
    let claims = claims.expect("generation 2's token verified during its run");
    assert_eq!((claims.scope, claims.generation), (h.scope(), 2));
    assert_ne!(second, first);
    assert_eq!(h.verifies(&first).await, None, "rotated out by the reclaim");
    assert_eq!(h.verifies(&second).await, None, "revoked at cleanup");
    // The dead host's slot is still there (its process would be gone); the live one is not.
    assert!(h.slots.get(&h.scope(), 1).is_some());
    assert_eq!(h.slots.get(&h.scope(), 2), None);
}

#[tokio::test]
async fn consecutive_runs_get_different_tokens_for_their_generations() {
    let h = Harness::new();
    for _ in 0..2 {
        let result = h.host().run(h.fixture.input()).await.expect("resolves");
        assert!(matches!(result, ManagedRuntimeRunResult::Completed { .. }));
    }
    let seen = h.seen();
    let generations: Vec<u64> = seen
        .iter()
        .map(|(_, claims)| claims.as_ref().expect("verified").generation)
        .collect();
    assert_eq!(generations, [1, 2]);
    assert_ne!(seen[0].0, seen[1].0);
    for (token, _) in &seen {
        assert_eq!(h.verifies(token).await, None);
    }
}

/// A token store whose `issue` or `revoke` fails, over a working one.
struct Faulty {
    inner: MemorySessionTokens,
    fail_issue: bool,
    fail_revoke: bool,
}

#[async_trait]
impl SessionTokenPort for Faulty {
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError> {
        if self.fail_issue {
            return Err(PortError::new("token store unavailable"));
        }
        self.inner.issue(input).await
    }

    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError> {
        self.inner.verify(token).await
    }

    async fn revoke(&self, scope: &RuntimeResourceScope, generation: u64) -> Result<(), PortError> {
        if self.fail_revoke {
            return Err(PortError::new("token store unavailable"));
        }
        self.inner.revoke(scope, generation).await
    }

    async fn extend(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        ttl_ms: u64,
    ) -> Result<(), PortError> {
        self.inner.extend(scope, generation, ttl_ms).await
    }
}

fn faulty(clock: &ManualClock, fail_issue: bool, fail_revoke: bool) -> Arc<dyn SessionTokenPort> {
    Arc::new(Faulty {
        inner: MemorySessionTokens::new().with_clock(clock.clone()),
        fail_issue,
        fail_revoke,
    })
}

#[tokio::test]
async fn a_failed_issue_gives_the_claim_back_and_fails_the_run() {
    let clock = ManualClock::new(T0);
    let h = Harness::with_tokens(clock.clone(), faulty(&clock, true, false));

    let error = h.host().run(h.fixture.input()).await.unwrap_err();

    assert!(
        error
            .to_string()
            .contains("Session token issue failed: token store unavailable"),
        "{error}"
    );
    assert!(
        !h.fixture.sandbox.acquire.called(),
        "no compute without a token"
    );
    assert!(h.seen().is_empty());
    assert!(h.slots.is_empty());
    // Released: the next claim is a new generation at once, not a conflict until expiry.
    let next = omabox_contract::RuntimeResourceFencePort::acquire(
        h.fences.as_ref(),
        omabox_contract::AcquireRuntimeFenceInput {
            scope: h.scope(),
            owner_id: "another-owner".into(),
            ttl_ms: 1_000,
        },
    )
    .await
    .unwrap();
    assert!(
        matches!(
            next,
            omabox_contract::AcquireRuntimeFenceResult::Acquired { ref fence, .. }
                if fence.generation == 2
        ),
        "{next:?}"
    );
}

#[tokio::test]
async fn a_failed_revoke_never_fails_the_release() {
    let clock = ManualClock::new(T0);
    let h = Harness::with_tokens(clock.clone(), faulty(&clock, false, true));

    let result = h.host().run(h.fixture.input()).await.expect("resolves");

    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert!(h.slots.is_empty(), "withdrawn even so");
    let (token, claims) = h.seen()[0].clone();
    assert!(claims.is_some());
    // Not revoked, so it lapses at its expiry: the fence's.
    assert!(h.verifies(&token).await.is_some());
    clock.advance(h.fixture.lease_ttl_ms);
    assert_eq!(h.verifies(&token).await, None);
}

/// The decorator alone over the in-memory fence and token stores on one clock.
fn token_fence(
    clock: &ManualClock,
) -> (
    SessionTokenFence,
    Arc<MemorySessionTokens>,
    SessionTokenSlots,
) {
    let tokens = Arc::new(MemorySessionTokens::new().with_clock(clock.clone()));
    let slots = SessionTokenSlots::new();
    let fence = SessionTokenFence::new(
        Arc::new(MemoryFenceStore::new().with_clock(clock.clone())),
        tokens.clone(),
        Arc::new(slots.clone()),
    )
    .with_ttl_ms(TOKEN_TTL);
    (fence, tokens, slots)
}

#[tokio::test]
async fn a_token_is_renewed_with_its_fence_and_expires_with_it() {
    use omabox_contract::{
        AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, RenewRuntimeFenceResult,
        RuntimeResourceFencePort as _,
    };
    const FENCE_TTL: u64 = 30_000;
    let clock = ManualClock::new(T0);
    let (fences, tokens, slots) = token_fence(&clock);
    let scope = RuntimeResourceScope::new("local", "default", "s", "main");
    let AcquireRuntimeFenceResult::Acquired { fence, .. } = fences
        .acquire(AcquireRuntimeFenceInput {
            scope: scope.clone(),
            owner_id: "host-a".into(),
            ttl_ms: FENCE_TTL,
        })
        .await
        .unwrap()
    else {
        panic!("not acquired");
    };
    let token = slots.get(&scope, fence.generation).unwrap();
    let expiry = |claims: Option<SessionTokenClaims>| claims.map(|claims| claims.expires_at);
    assert_eq!(
        expiry(tokens.verify(token.expose()).await.unwrap()),
        Some(omabox_store::iso_millis(T0 + FENCE_TTL))
    );

    // Two heartbeats: each renewal moves the token's expiry with the fence's.
    for beat in 1..=2 {
        clock.advance(FENCE_TTL - 1);
        let renewed = fences.renew(&fence, FENCE_TTL).await.unwrap();
        let RenewRuntimeFenceResult::Renewed { fence: renewed } = renewed else {
            panic!("lost");
        };
        let claims = tokens.verify(token.expose()).await.unwrap();
        assert_eq!(
            expiry(claims),
            Some(renewed.expires_at.clone()),
            "beat {beat}"
        );
    }
    // The host dies: no more renewals. The token dies with the fence, not a TTL later.
    clock.advance(FENCE_TTL - 1);
    assert!(tokens.verify(token.expose()).await.unwrap().is_some());
    clock.advance(1);
    assert!(!fences.is_current(&fence).await.unwrap());
    assert_eq!(tokens.verify(token.expose()).await.unwrap(), None);
    // A renewal after the fence was lost extends nothing.
    assert!(matches!(
        fences.renew(&fence, FENCE_TTL).await.unwrap(),
        RenewRuntimeFenceResult::Lost
    ));
    assert_eq!(tokens.verify(token.expose()).await.unwrap(), None);
}
