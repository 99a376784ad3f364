//! [`MemoryCommitFence`]: the fence port of `omabox run`, which commits the run's staged
//! memory-store write-backs right after its publication and discards them when it releases
//! without one (`memory_stage.rs`). A run of `omabox serve`'s queue publishes through the
//! queue's `publish_for_run` instead of the fence port's `publish`. Fence semantics are the store's, unchanged: every call is
//! passed through, and a commit failure never changes a fence result (the stage stays on disk
//! and `omabox reap` finishes it).

use super::memory_stage::MemoryStage;
use crate::store_choice::ChosenStore;
use async_trait::async_trait;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeResourceFence,
    RuntimeResourceFencePort, TerminationReason,
};
use std::sync::Arc;

/// The store's fence port plus the memory stage's commit (module doc).
#[derive(Clone)]
pub struct MemoryCommitFence {
    store: Arc<dyn RuntimeResourceFencePort>,
    history: ChosenStore,
    stage: Arc<MemoryStage>,
    /// A queued run publishes through the run queue (with its claim), never directly.
    queued: Option<crate::runner::QueuedRun>,
}

impl std::fmt::Debug for MemoryCommitFence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryCommitFence")
            .field("stage", &self.stage)
            .finish_non_exhaustive()
    }
}

impl MemoryCommitFence {
    /// `store`'s fences, committing `stage` on publication.
    pub fn new(store: &ChosenStore, stage: Arc<MemoryStage>) -> Self {
        Self {
            store: store.fences(),
            history: store.clone(),
            stage,
            queued: None,
        }
    }

    /// Publishes through `queued`'s run queue: the publication, the run's revision and the
    /// history row's run id in one transaction, only while the run's claim is live.
    pub fn publishing_through(mut self, queued: Option<crate::runner::QueuedRun>) -> Self {
        self.queued = queued;
        self
    }

    /// Ends the stage, committing it if `published`; a failure is logged and left to
    /// `omabox reap`.
    async fn finish(&self, published: bool) {
        let stage = Arc::clone(&self.stage);
        match tokio::task::spawn_blocking(move || stage.finish(published)).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(
                %error,
                "memory stores not written back yet; `omabox reap` finishes it"
            ),
            Err(error) => tracing::warn!(%error, "the memory store task failed"),
        }
    }
}

#[async_trait]
impl RuntimeResourceFencePort for MemoryCommitFence {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        let result = self.store.acquire(input).await?;
        if let AcquireRuntimeFenceResult::Acquired { fence, .. } = &result {
            self.stage.set_claim(fence.scope(), fence.generation);
        }
        Ok(result)
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        self.store.is_current(fence).await
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        self.store.renew(fence, ttl_ms).await
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        // Its candidates' blobs are stored, not yet named by any publication: where a test
        // runs a collection on another host.
        crate::pause_point::pause_async("run-publishing").await;
        let result = match &self.queued {
            Some(queued) => queued.queue.publish_for_run(&queued.claim, input).await?,
            None => self.store.publish(input).await?,
        };
        if let PublishRuntimeResourcesResult::Published { .. } = result {
            omabox_sandbox::fault::point("run-published");
            self.finish(true).await;
        }
        Ok(result)
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        let released = self.store.release(fence, reason).await;
        // Write-backs after the publication (a sync still queued) or a publish whose result
        // was lost: the history decides, as it does for a killed run.
        if self.stage.is_pending() {
            let published = match self.stage.claim() {
                Some(claim) => Some(
                    self.history
                        .publications_of(&claim.scope)
                        .await
                        .map(|history| history.iter().any(|p| p.generation == claim.generation))
                        .map_err(|error| format!("{error:#}")),
                ),
                None => None,
            };
            let published = match published {
                Some(Ok(published)) => published,
                Some(Err(error)) => {
                    tracing::warn!(%error, "cannot read the publication history; `omabox reap` finishes the memory stores");
                    return released;
                }
                None => false,
            };
            self.finish(published).await;
        }
        released
    }
}

/// Whether `claim`'s generation published (its revision is in the history).
pub fn generation_published(
    store: &ChosenStore,
    claim: &super::memory_stage::Claim,
) -> Result<bool, String> {
    store
        .publications_of_blocking(&claim.scope)
        .map(|history| history.iter().any(|p| p.generation == claim.generation))
        .map_err(|error| error.to_string())
}
