//! The live-turn checkpoint callback handed to the harness (reference §2.3 step 24).
//!
//! A harness may ask the host to publish the workspace (and outputs) mid-run, after a turn.
//! Each request is validated (non-empty id, this session, not yet committed), synced, captured
//! and published under the current fence with `runtimeCheckpoint: null`. A rejected
//! publication means another owner took over: the lease is lost and the harness is told so.
//! With outputs disabled the previously published output candidate is carried forward.

use super::session_sync::SessionInputSync;
use super::state::RunContext;
use omabox_contract::{
    CheckpointWorkspaceInput, CollectOutputsInput, FinalizeOutputsInput, LiveCheckpointCallback,
    LiveTurnCheckpoint, ManagedSandboxLease, Nullable, PortError, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, SessionOutputBinding, WorkspaceBinding,
};
use std::sync::Arc;

const INVALID_LIVE_CHECKPOINT: &str = "Harness requested an invalid or duplicate live checkpoint";
const LOST_DURING_LIVE_CHECKPOINT: &str = "Runtime resource fence lost during live checkpoint";

/// The bindings a live checkpoint captures; fixed once the harness starts.
pub(super) struct LiveTurns {
    pub context: Arc<RunContext>,
    pub sync: Arc<SessionInputSync>,
    pub workspace: WorkspaceBinding,
    pub sandbox: ManagedSandboxLease,
    pub outputs: Option<SessionOutputBinding>,
}

impl LiveTurns {
    /// The callback passed as `checkpoint` to `harnessDriver.run`.
    pub fn callback(self: Arc<Self>) -> LiveCheckpointCallback {
        Arc::new(move |request| {
            let turns = Arc::clone(&self);
            Box::pin(async move { turns.checkpoint(request).await })
        })
    }

    async fn checkpoint(&self, request: LiveTurnCheckpoint) -> Result<(), PortError> {
        let context = &self.context;
        let deps = &context.host.deps;
        // 24a. validate.
        let duplicate = context
            .ledger()
            .committed_checkpoint_ids
            .contains(&request.checkpoint_id);
        if request.checkpoint_id.is_empty()
            || request.session_id != context.scope.session_id
            || duplicate
        {
            return Err(PortError::new(INVALID_LIVE_CHECKPOINT));
        }
        let id = request.checkpoint_id;
        tracing::debug!(step = "live_checkpoint", checkpoint_id = %id, generation = context.generation());
        // 24b. sync Session inputs.
        context.throw_if_aborted()?;
        self.sync.sync(&format!("checkpoint-{id}")).await?;
        // 24c. capture the workspace.
        let workspace_candidate = deps
            .workspace
            .checkpoint(CheckpointWorkspaceInput {
                scope: context.scope.clone(),
                fence: context.fence(),
                strategy: context.plan.workspace_strategy,
                binding: self.workspace.clone(),
                sandbox: self.sandbox.clone(),
                idempotency_key: context.idempotency_key(&format!("workspace-checkpoint-{id}")),
                signal: context.signal(),
            })
            .await?;
        context.throw_if_aborted()?;
        // 24d. collect and finalize outputs; the output binding exists only when the plan has
        // an output strategy.
        if let (Some(binding), Some(strategy)) = (&self.outputs, context.plan.output_strategy) {
            let entries = deps
                .outputs
                .collect(CollectOutputsInput {
                    scope: context.scope.clone(),
                    fence: context.fence(),
                    strategy,
                    binding: binding.clone(),
                    signal: context.signal(),
                })
                .await?;
            context.throw_if_aborted()?;
            let manifest = deps
                .outputs
                .finalize(FinalizeOutputsInput {
                    scope: context.scope.clone(),
                    fence: context.fence(),
                    strategy,
                    binding: binding.clone(),
                    entries,
                    idempotency_key: context.idempotency_key(&format!("outputs-finalize-{id}")),
                    signal: context.signal(),
                })
                .await?;
            context.ledger().published_output_candidate = Some(manifest.to_publication_candidate());
            context.throw_if_aborted()?;
        }
        // 24e. publish (outputs disabled: the previous output candidate is carried forward).
        let output_candidate = context.ledger().published_output_candidate.clone();
        let published = deps
            .fences
            .publish(PublishRuntimeResourcesInput {
                fence: context.fence(),
                workspace_candidate: workspace_candidate.to_publication_candidate(),
                output_candidate,
                runtime_checkpoint: Nullable::Null,
            })
            .await?;
        // 24f. a rejected publication loses the lease.
        match published {
            PublishRuntimeResourcesResult::Lost => {
                context.lose_lease(LOST_DURING_LIVE_CHECKPOINT);
                Err(PortError::new(LOST_DURING_LIVE_CHECKPOINT))
            }
            PublishRuntimeResourcesResult::Published { revision } => {
                tracing::debug!(step = "live_checkpoint.published", checkpoint_id = %id, revision);
                let mut ledger = context.ledger();
                ledger.committed_checkpoint_ids.insert(id);
                ledger.output_published = self.outputs.is_some();
                Ok(())
            }
        }
    }
}
