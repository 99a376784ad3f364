//! [`FakeOutputs`]: a scripted `SessionOutputPort`.
//!
//! Defaults: strategies `[final_collect/durable]`; `prepare` → `{outputs-fault,
//! /mnt/session/outputs}`; `attach` → ok; `collect` → `[]`; `finalize` →
//! `{outputs-candidate, sha256:outputs, 0 entries}`; `release`, `abort` → ok.

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AttachOutputsInput, CollectOutputsInput, FinalizeOutputsInput, OUTPUTS_MOUNT_PATH,
    OutputAbortReason, OutputDurability, OutputStrategy, PortError, PrepareOutputsInput,
    RuntimeResourceFence, RuntimeResourceScope, SessionOutputBinding, SessionOutputCapabilities,
    SessionOutputCapability, SessionOutputEntryCandidate, SessionOutputManifestCandidate,
    SessionOutputPort,
};

/// Input of `release`.
#[derive(Debug, Clone)]
pub struct OutputsReleaseCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: SessionOutputBinding,
}

/// Input of `abort`.
#[derive(Debug, Clone)]
pub struct OutputsAbortCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: SessionOutputBinding,
    /// Why.
    pub reason: OutputAbortReason,
}

impl WithSignal for PrepareOutputsInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for CollectOutputsInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for FinalizeOutputsInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// An outputs binding at `/mnt/session/outputs`.
pub fn outputs_binding(binding_id: &str) -> SessionOutputBinding {
    SessionOutputBinding {
        binding_id: binding_id.to_owned(),
        mount_path: OUTPUTS_MOUNT_PATH.to_owned(),
        metadata: None,
    }
}

/// A manifest candidate without metadata.
pub fn manifest_candidate(
    id: &str,
    content_hash: &str,
    entries: u64,
) -> SessionOutputManifestCandidate {
    SessionOutputManifestCandidate {
        id: id.to_owned(),
        content_hash: content_hash.to_owned(),
        entries,
        metadata: None,
    }
}

fn to_wire(reason: OutputAbortReason) -> &'static str {
    match reason {
        OutputAbortReason::Failed => "failed",
        OutputAbortReason::LeaseLost => "lease_lost",
    }
}

/// A scripted Session outputs port.
#[derive(Debug)]
pub struct FakeOutputs {
    log: CallLog,
    /// `capabilities`.
    pub capabilities: Step<RuntimeResourceScope, SessionOutputCapabilities>,
    /// `prepare`.
    pub prepare: Step<PrepareOutputsInput, SessionOutputBinding>,
    /// `attach`.
    pub attach: Step<AttachOutputsInput, ()>,
    /// `collect`.
    pub collect: Step<CollectOutputsInput, Vec<SessionOutputEntryCandidate>>,
    /// `finalize`.
    pub finalize: Step<FinalizeOutputsInput, SessionOutputManifestCandidate>,
    /// `release`.
    pub release: Step<OutputsReleaseCall, ()>,
    /// `abort`.
    pub abort: Step<OutputsAbortCall, ()>,
}

impl FakeOutputs {
    /// The fault-matrix outputs port.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            capabilities: Step::new(|_| async {
                Ok(SessionOutputCapabilities {
                    strategies: vec![SessionOutputCapability {
                        strategy: OutputStrategy::FinalCollect,
                        durability: OutputDurability::Durable,
                    }],
                })
            }),
            prepare: Step::new(|_| async { Ok(outputs_binding("outputs-fault")) }),
            attach: Step::new(|_| async { Ok(()) }),
            collect: Step::new(|_| async { Ok(Vec::new()) }),
            finalize: Step::new(|_| async {
                Ok(manifest_candidate("outputs-candidate", "sha256:outputs", 0))
            }),
            release: Step::new(|_| async { Ok(()) }),
            abort: Step::new(|_| async { Ok(()) }),
        }
    }

    /// Makes `capabilities` advertise exactly `strategies`.
    pub fn advertises(&self, strategies: Vec<SessionOutputCapability>) {
        self.capabilities
            .returns(SessionOutputCapabilities { strategies });
    }
}

#[async_trait]
impl SessionOutputPort for FakeOutputs {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        self.log.push(format!("{}.capabilities", names::OUTPUTS));
        self.capabilities.invoke(scope.clone()).await
    }

    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError> {
        self.log.push(format!("{}.prepare", names::OUTPUTS));
        self.prepare.invoke(input).await
    }

    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError> {
        self.log.push(format!("{}.attach", names::OUTPUTS));
        self.attach.invoke(input).await
    }

    async fn collect(
        &self,
        input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError> {
        self.log.push(format!("{}.collect", names::OUTPUTS));
        self.collect.invoke(input).await
    }

    async fn finalize(
        &self,
        input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError> {
        self.log.push(format!("{}.finalize", names::OUTPUTS));
        self.finalize.invoke(input).await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.release", names::OUTPUTS));
        self.release
            .invoke(OutputsReleaseCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
            })
            .await
    }

    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        self.log
            .push(format!("{}.abort:{}", names::OUTPUTS, to_wire(reason)));
        self.abort
            .invoke(OutputsAbortCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
                reason,
            })
            .await
    }
}
