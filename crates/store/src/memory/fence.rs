//! `MemoryFenceStore`: the reference `MemoryRuntimeResourceFencePort`.

use crate::clock::{Clock, SystemClock};
use crate::fence_state::{AcquireStep, FenceRecord};
use crate::token::{RandomTokens, TokenSource};
use async_trait::async_trait;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeResourceFence,
    RuntimeResourceFencePort, RuntimeResourceScope, SecretString, TerminationReason,
};
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

/// The record of one work item as the in-memory store keeps it (the token itself is the
/// proof of ownership).
pub type MemoryFenceRecord = FenceRecord<SecretString>;

/// An in-memory [`RuntimeResourceFencePort`], keyed by [`RuntimeResourceScope::key`].
///
/// Holds tokens in memory (it has nowhere else to keep them) but never prints them.
pub struct MemoryFenceStore {
    records: Mutex<HashMap<String, MemoryFenceRecord>>,
    clock: Arc<dyn Clock>,
    tokens: Arc<dyn TokenSource>,
}

impl MemoryFenceStore {
    /// An empty store on the system clock with random tokens.
    pub fn new() -> Self {
        Self {
            records: Mutex::new(HashMap::new()),
            clock: Arc::new(SystemClock),
            tokens: Arc::new(RandomTokens),
        }
    }

    /// Uses `clock` for "now" (for example a [`crate::ManualClock`]).
    pub fn with_clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Uses `tokens` to issue the token of each new generation.
    pub fn with_token_source(mut self, tokens: impl TokenSource + 'static) -> Self {
        self.tokens = Arc::new(tokens);
        self
    }

    /// A copy of the record of `scope`, if it was ever acquired (test helper).
    pub fn inspect(&self, scope: &RuntimeResourceScope) -> Option<MemoryFenceRecord> {
        self.lock().get(&scope.key()).cloned()
    }

    /// True when `generation` still holds `scope`'s fence (active and unexpired), decided
    /// with this store's clock read under its lock.
    pub(crate) fn held_by(&self, scope: &RuntimeResourceScope, generation: u64) -> bool {
        let records = self.lock();
        let now_ms = self.clock.now_ms();
        records
            .get(&scope.key())
            .is_some_and(|record| record.held_by(generation, now_ms))
    }

    /// "Now" by this store's clock.
    pub(crate) fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    /// Publishes `input` now (the port's `publish`, synchronous): `Some(revision)`, or
    /// `None` when the fence is lost.
    pub(crate) fn publish_now(&self, input: &PublishRuntimeResourcesInput) -> Option<u64> {
        let mut records = self.lock();
        let now_ms = self.clock.now_ms();
        records
            .get_mut(&input.fence.scope().key())
            .and_then(|record| record.publish(input, now_ms))
            .map(|published| published.revision)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, MemoryFenceRecord>> {
        // No transition panics halfway, so a poisoned map is still consistent.
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Default for MemoryFenceStore {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryFenceStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryFenceStore")
            .field("records", &self.lock().len())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl RuntimeResourceFencePort for MemoryFenceStore {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        let mut records = self.lock();
        let now_ms = self.clock.now_ms();
        let record = records.entry(input.scope.key()).or_default();
        let step = record.acquire(&input.owner_id, input.ttl_ms, now_ms, |generation| {
            self.tokens.issue(generation)
        });
        Ok(match step {
            AcquireStep::Conflict { expires_at_ms } => AcquireRuntimeFenceResult::Conflict {
                expires_at: Some(crate::clock::iso_millis(expires_at_ms)),
            },
            AcquireStep::Reentrant(active) | AcquireStep::Claimed(active) => {
                let token = active.proof.clone();
                AcquireRuntimeFenceResult::Acquired {
                    fence: active.to_fence(&input.scope, token),
                    publication: record.publication.clone(),
                }
            }
        })
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        let records = self.lock();
        let now_ms = self.clock.now_ms();
        Ok(records
            .get(&fence.scope().key())
            .is_some_and(|record| record.is_current(fence, now_ms)))
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        let mut records = self.lock();
        let now_ms = self.clock.now_ms();
        let renewed = records
            .get_mut(&fence.scope().key())
            .and_then(|record| record.renew(fence, ttl_ms, now_ms));
        Ok(match renewed {
            Some(active) => RenewRuntimeFenceResult::Renewed {
                fence: active.to_fence(&fence.scope(), fence.token.clone()),
            },
            None => RenewRuntimeFenceResult::Lost,
        })
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        let mut records = self.lock();
        let now_ms = self.clock.now_ms();
        let published = records
            .get_mut(&input.fence.scope().key())
            .and_then(|record| record.publish(&input, now_ms));
        Ok(match published {
            Some(published) => PublishRuntimeResourcesResult::Published {
                revision: published.revision,
            },
            None => PublishRuntimeResourcesResult::Lost,
        })
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        if let Some(record) = self.lock().get_mut(&fence.scope().key()) {
            record.release(fence);
        }
        Ok(())
    }
}
