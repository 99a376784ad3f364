//! [`FakeFence`]: a scripted `RuntimeResourceFencePort`.
//!
//! Defaults (the fault-matrix fixture): `acquire` → `acquired` with the fixture's fence and no
//! publication; `renew` → `renewed` with the same fence; `publish` → `published` revision 1;
//! `release` → ok; `is_current` → true (reference §8.0: the indexed tests predate
//! `isCurrent`, so fakes answer true). For the reference's real semantics use
//! `omabox_store::MemoryFenceStore`.

use super::log::{CallLog, names};
use super::step::Step;
use async_trait::async_trait;
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RenewRuntimeFenceResult, RuntimeResourceFence,
    RuntimeResourceFencePort, RuntimeResourcePublication, TerminationReason,
};

/// Input of `renew`.
#[derive(Debug, Clone)]
pub struct RenewCall {
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// Requested TTL.
    pub ttl_ms: u64,
}

/// Input of `release`.
#[derive(Debug, Clone)]
pub struct FenceReleaseCall {
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// Why.
    pub reason: TerminationReason,
}

/// A scripted fence port.
#[derive(Debug)]
pub struct FakeFence {
    log: CallLog,
    /// `acquire`.
    pub acquire: Step<AcquireRuntimeFenceInput, AcquireRuntimeFenceResult>,
    /// `isCurrent`.
    pub is_current: Step<RuntimeResourceFence, bool>,
    /// `renew`.
    pub renew: Step<RenewCall, RenewRuntimeFenceResult>,
    /// `publish`.
    pub publish: Step<PublishRuntimeResourcesInput, PublishRuntimeResourcesResult>,
    /// `release`.
    pub release: Step<FenceReleaseCall, ()>,
}

impl FakeFence {
    /// A fence port that grants `fence` with no prior publication.
    pub fn new(log: CallLog, fence: RuntimeResourceFence) -> Self {
        let acquired = fence.clone();
        Self {
            log,
            acquire: Step::new(move |_| {
                let fence = acquired.clone();
                async move {
                    Ok(AcquireRuntimeFenceResult::Acquired {
                        fence,
                        publication: None,
                    })
                }
            }),
            is_current: Step::new(|_| async { Ok(true) }),
            renew: Step::new(move |_| {
                let fence = fence.clone();
                async move { Ok(RenewRuntimeFenceResult::Renewed { fence }) }
            }),
            publish: Step::new(|_| async {
                Ok(PublishRuntimeResourcesResult::Published { revision: 1 })
            }),
            release: Step::new(|_| async { Ok(()) }),
        }
    }

    /// Makes `acquire` return `fence` together with `publication`.
    pub fn acquires_with_publication(
        &self,
        fence: RuntimeResourceFence,
        publication: RuntimeResourcePublication,
    ) {
        self.acquire.returns(AcquireRuntimeFenceResult::Acquired {
            fence,
            publication: Some(publication),
        });
    }
}

#[async_trait]
impl RuntimeResourceFencePort for FakeFence {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        self.log.push(format!("{}.acquire", names::FENCE));
        self.acquire.invoke(input).await
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        self.log.push(format!("{}.is_current", names::FENCE));
        self.is_current.invoke(fence.clone()).await
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        self.log.push(format!("{}.renew", names::FENCE));
        self.renew
            .invoke(RenewCall {
                fence: fence.clone(),
                ttl_ms,
            })
            .await
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        self.log.push(format!("{}.publish", names::FENCE));
        self.publish.invoke(input).await
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.release:{reason}", names::FENCE));
        self.release
            .invoke(FenceReleaseCall {
                fence: fence.clone(),
                reason,
            })
            .await
    }
}
