//! Session tokens around a claim: the fence decorator that issues a work item's session
//! token when the host claims it and revokes it when the host releases it (omabox extension;
//! the contract's "Credentials and the inference proxy" — the Work `sessions_token` that the
//! harness presents as `HOSTED_INFERENCE_TOKEN` and to the MCP proxy).
//!
//! ```text
//!   fence.acquire(ttl) ─► acquired ─► tokens.issue(scope, generation, ttl) ─► sink.deliver
//!        │ (issue fails) ─► fence.release(failed) ─► acquire fails (the host rejects)
//!   fence.renew(ttl) ─► renewed ─► tokens.extend(scope, generation, ttl)
//!   fence.release ─► sink.withdraw ─► tokens.revoke(scope, generation) ─► fence.release
//!   (host died) fence expires ─► token expires with it; `AbandonedLeaseReaper` revokes it
//! ```
//!
//! The token travels from the store to the [`SessionTokenSink`] and nowhere else: the
//! decorator keeps no copy, and the fence, the lease, the run result and the orphan record
//! have no field for it. The CLI's harness-env projection reads it back from the sink
//! ([`SessionTokenSlots::get`], keyed by the `scope` and `fence.generation` of
//! `RunHarnessInput`) and sets `HOSTED_INFERENCE_TOKEN` for that run only.
//!
//! Invariants:
//! - **One claim, one live token.** Issuing for a generation revokes every older generation's
//!   token of the same work item (the store does it in the issue transaction), so a reclaim
//!   rotates the token; a re-entrant acquire of the same generation delivers a fresh token
//!   that replaces the sink's slot (both stay valid until the claim ends).
//! - **No claim without its token.** If `issue` fails, the just-acquired fence is released
//!   (best-effort, reason `failed`) and `acquire` fails, as for any acquire failure.
//! - **Release never fails because of tokens.** The token is withdrawn and revoked *before*
//!   the fence is released (so it dies no later than the claim); a failed revoke is logged and
//!   the token lapses at its expiry (or at the next generation's issue).
//! - **A token expires with its fence.** It is issued with the fence's TTL and, each time the
//!   fence is renewed, extended to the renewed fence's TTL (the same token: the harness read
//!   it from its environment once). So a host that died stops its token no later than its
//!   fence expires; the lease reaper also revokes it. `with_ttl_ms` only caps the TTL (a
//!   token never outlives its last issue or renewal by more than the cap). A failed extend
//!   is logged and does not fail the renewal: the token then lapses at the fence's previous
//!   expiry, which only ends the harness's model access early, never extends it.
//! - Nothing here logs a token: log fields are the scope's ids, the generation and errors
//!   from the token store (which never carry a token).

use async_trait::async_trait;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, IssueSessionTokenInput, PortError,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RenewRuntimeFenceResult,
    RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourceScope, SecretString,
    SessionTokenPort, TerminationReason,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// Default cap on a session token's TTL: 12 hours (the fence's TTL is normally far shorter
/// and is what applies).
pub const DEFAULT_SESSION_TOKEN_TTL_MS: u64 = 12 * 60 * 60 * 1000;

/// Where the decorator hands a freshly issued token: the caller's side of the harness env.
///
/// Implementations must not log or persist the token; [`SessionTokenSlots`] is the in-memory
/// implementation the CLI uses.
pub trait SessionTokenSink: Send + Sync {
    /// The claim `(scope, generation)` now has `token` (replacing any earlier one of it).
    fn deliver(&self, scope: &RuntimeResourceScope, generation: u64, token: SecretString);
    /// The claim ended: forget its token.
    fn withdraw(&self, scope: &RuntimeResourceScope, generation: u64);
}

/// An in-memory [`SessionTokenSink`]: one slot per live claim, read by the harness env
/// projection. Clones share the slots.
#[derive(Clone, Default)]
pub struct SessionTokenSlots {
    slots: Arc<Mutex<HashMap<(RuntimeResourceScope, u64), SecretString>>>,
}

impl SessionTokenSlots {
    /// No slots yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The token of the live claim `(scope, generation)`, if one was delivered and not yet
    /// withdrawn.
    pub fn get(&self, scope: &RuntimeResourceScope, generation: u64) -> Option<SecretString> {
        lock(&self.slots).get(&(scope.clone(), generation)).cloned()
    }

    /// The token of the scope's current claim: the live slot with the highest generation
    /// (for a lane that knows the scope but not the generation, like the supervisor
    /// transport). A scope has one live claim at a time, and a newer generation's issue
    /// revokes the older tokens, so the highest generation is the only one that can verify.
    pub fn current(&self, scope: &RuntimeResourceScope) -> Option<SecretString> {
        lock(&self.slots)
            .iter()
            .filter(|((slot_scope, _), _)| slot_scope == scope)
            .max_by_key(|((_, generation), _)| *generation)
            .map(|(_, token)| token.clone())
    }

    /// How many claims hold a token now.
    pub fn len(&self) -> usize {
        lock(&self.slots).len()
    }

    /// Whether no claim holds a token.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl SessionTokenSink for SessionTokenSlots {
    fn deliver(&self, scope: &RuntimeResourceScope, generation: u64, token: SecretString) {
        lock(&self.slots).insert((scope.clone(), generation), token);
    }

    fn withdraw(&self, scope: &RuntimeResourceScope, generation: u64) {
        lock(&self.slots).remove(&(scope.clone(), generation));
    }
}

impl fmt::Debug for SessionTokenSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTokenSlots")
            .field("live", &self.len())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every mutation is one insert or remove, so a poisoned map is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A [`RuntimeResourceFencePort`] that gives every claim a session token (module doc).
#[derive(Clone)]
pub struct SessionTokenFence {
    inner: Arc<dyn RuntimeResourceFencePort>,
    tokens: Arc<dyn SessionTokenPort>,
    sink: Arc<dyn SessionTokenSink>,
    ttl_ms: u64,
}

impl fmt::Debug for SessionTokenFence {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionTokenFence")
            .field("ttl_ms", &self.ttl_ms)
            .finish_non_exhaustive()
    }
}

impl SessionTokenFence {
    /// Issues tokens from `tokens` for the claims of `inner` into `sink`, with
    /// [`DEFAULT_SESSION_TOKEN_TTL_MS`].
    pub fn new(
        inner: Arc<dyn RuntimeResourceFencePort>,
        tokens: Arc<dyn SessionTokenPort>,
        sink: Arc<dyn SessionTokenSink>,
    ) -> Self {
        Self {
            inner,
            tokens,
            sink,
            ttl_ms: DEFAULT_SESSION_TOKEN_TTL_MS,
        }
    }

    /// Caps the TTL of issued and extended tokens at `ttl_ms` (module doc).
    pub fn with_ttl_ms(mut self, ttl_ms: u64) -> Self {
        self.ttl_ms = ttl_ms;
        self
    }

    /// Issue failed after the fence was acquired: give the claim back and fail `acquire`.
    async fn abandon_claim(&self, fence: &RuntimeResourceFence, error: PortError) -> PortError {
        let error = error.redacted(fence.token.expose());
        tracing::warn!(
            %error,
            work_id = %fence.work_id,
            generation = fence.generation,
            "issuing the session token failed; releasing the claim"
        );
        if let Err(release) = self.inner.release(fence, TerminationReason::Failed).await {
            tracing::warn!(
                error = %release.redacted(fence.token.expose()),
                work_id = %fence.work_id,
                generation = fence.generation,
                "releasing the claim after a failed token issue failed; it expires by TTL"
            );
        }
        PortError::new(format!("Session token issue failed: {error}"))
    }
}

#[async_trait]
impl RuntimeResourceFencePort for SessionTokenFence {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        let ttl_ms = input.ttl_ms.min(self.ttl_ms);
        let acquired = self.inner.acquire(input).await?;
        let AcquireRuntimeFenceResult::Acquired { fence, .. } = &acquired else {
            return Ok(acquired);
        };
        let scope = fence.scope();
        let issued = self
            .tokens
            .issue(IssueSessionTokenInput {
                scope: scope.clone(),
                generation: fence.generation,
                ttl_ms,
            })
            .await;
        match issued {
            Ok(token) => {
                self.sink.deliver(&scope, fence.generation, token);
                tracing::debug!(
                    work_id = %scope.work_id,
                    generation = fence.generation,
                    "session token issued"
                );
                Ok(acquired)
            }
            Err(error) => Err(self.abandon_claim(fence, error).await),
        }
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        self.inner.is_current(fence).await
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        let renewed = self.inner.renew(fence, ttl_ms).await?;
        if let RenewRuntimeFenceResult::Renewed { .. } = &renewed {
            let scope = fence.scope();
            let extended = self
                .tokens
                .extend(&scope, fence.generation, ttl_ms.min(self.ttl_ms))
                .await;
            if let Err(error) = extended {
                tracing::warn!(
                    error = %error.redacted(fence.token.expose()),
                    work_id = %scope.work_id,
                    generation = fence.generation,
                    "extending the session token failed; it lapses at the fence's previous expiry"
                );
            }
        }
        Ok(renewed)
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        self.inner.publish(input).await
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        let scope = fence.scope();
        self.sink.withdraw(&scope, fence.generation);
        if let Err(error) = self.tokens.revoke(&scope, fence.generation).await {
            tracing::warn!(
                error = %error.redacted(fence.token.expose()),
                work_id = %scope.work_id,
                generation = fence.generation,
                "revoking the session token failed; it lapses at its expiry"
            );
        }
        self.inner.release(fence, reason).await
    }
}
