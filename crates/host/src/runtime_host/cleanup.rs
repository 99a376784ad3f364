//! Cleanup (reference §2.4): runs after every claimed fence, in this exact order.
//!
//! 1. detach the caller's signal;
//! 2. stop the periodic sync and drain queued syncs;
//! 3. abort the internal signal (stops the monitor);
//! 4. revoke egress *before* compute stops or is retained;
//! 5. await the monitor;
//! 6. terminate compute unless a retained runtime was published, enqueueing an orphan (token
//!    redacted) when terminate fails;
//! 7. release published outputs or abort unpublished ones;
//! 8. release egress;
//! 9. release the workspace binding;
//! 10. release the fence;
//! 11. surface a cleanup-persistence error.
//!
//! Ordinary release failures are bounded best effort and never surface. A revoke failure, an
//! orphan-enqueue failure or an egress-release failure is a *persistence* failure: the run
//! rejects with it after all remaining cleanup, even over a `completed` result, because a
//! credential grant or a leaked runtime that nobody will reap must not look like success.

use super::state::{RunContext, observed};
use super::transaction::Allocated;
use crate::run_observer::{RunStep, StepFacts};
use omabox_contract::{EnqueueRuntimeOrphanInput, OutputAbortReason, PortError, TerminationReason};
use std::sync::Arc;
use tokio::task::JoinHandle;

const CLEANUP: &str = "Managed runtime cleanup";

/// Steps 1–11. `Err` is the cleanup-persistence error `run` rejects with.
pub(super) async fn run(
    context: &Arc<RunContext>,
    mut allocated: Allocated,
    monitor: JoinHandle<()>,
) -> Result<(), PortError> {
    let deps = &context.host.deps;
    let mut persistence_error: Option<PortError> = None;
    // 1. Detach the caller's signal.
    context.detach_external_signal();
    // 2. Stop the periodic sync; wait for it and for queued syncs.
    if let Some(periodic) = allocated.periodic.as_mut() {
        periodic.stop(CLEANUP).await;
    }
    if let Some(sync) = &allocated.session_sync {
        sync.settle().await;
    }
    // 3. Abort the internal signal: the monitor stops.
    context.abort(PortError::new(CLEANUP));
    // 4. Revoke credential egress before compute stops or is retained.
    if let (Some(binding), Some(egress)) = (&allocated.egress, deps.credential_egress.as_ref()) {
        let reason = context.cleanup_reason();
        let fence = context.fence();
        let call = egress.revoke(&context.scope, &fence, binding, reason);
        let revoked = observed(context, RunStep::CredentialEgressRevoke, call, |_| {
            StepFacts::Nothing
        })
        .await;
        if let Err(error) = revoked {
            // A grant must not stay attached to a retained runtime: terminate it after all.
            context.ledger().retained_runtime_published = false;
            tracing::warn!(error = %context.redact(&error), "credential egress revoke failed");
            persistence_error = Some(error);
        }
    }
    // 5. Await the monitor.
    let _ = monitor.await;
    // 6. Terminate compute unless a retained runtime was published.
    let retained = context.ledger().retained_runtime_published;
    if let Some(lease) = context.sandbox_lease().filter(|_| !retained) {
        let reason = context.cleanup_reason();
        let fence = context.fence();
        let call = deps
            .sandbox
            .terminate(&context.scope, &fence, &lease, reason);
        let runtime_id = lease.runtime_id.clone();
        let terminated = observed(context, RunStep::SandboxTerminate, call, |()| {
            StepFacts::Terminated { runtime_id, reason }
        })
        .await;
        if let Err(error) = terminated {
            // Deliberate difference: the reference redacts only `Error` messages and enqueues
            // any other thrown value raw; a Rust port can only fail with a `PortError`, and
            // it is always redacted before it is persisted.
            let error = context.redact(&error);
            tracing::warn!(%error, runtime_id = %lease.runtime_id, "terminate failed; enqueueing an orphan");
            let runtime_id = lease.runtime_id.clone();
            let call = deps.orphans.enqueue(EnqueueRuntimeOrphanInput {
                scope: context.scope.clone(),
                generation: fence.generation,
                owner_id: fence.owner_id.clone(),
                sandbox: lease,
                reason,
                error,
            });
            let enqueued = observed(context, RunStep::OrphansEnqueue, call, |()| {
                StepFacts::Orphaned { runtime_id }
            })
            .await;
            if let Err(error) = enqueued {
                tracing::warn!(error = %context.redact(&error), "orphan enqueue failed");
                persistence_error = Some(error);
            }
        }
    }
    // 7. Release published outputs; abort unpublished ones. Errors are ignored.
    if let Some(binding) = &allocated.outputs {
        let fence = context.fence();
        if context.ledger().output_published {
            let call = deps.outputs.release(&context.scope, &fence, binding);
            let _ = observed(context, RunStep::OutputsRelease, call, |()| {
                StepFacts::Nothing
            })
            .await;
        } else {
            let reason = match context.cleanup_reason() {
                TerminationReason::LeaseLost => OutputAbortReason::LeaseLost,
                _ => OutputAbortReason::Failed,
            };
            let call = deps.outputs.abort(&context.scope, &fence, binding, reason);
            let _ = observed(context, RunStep::OutputsAbort, call, |()| {
                StepFacts::OutputsAborted(reason)
            })
            .await;
        }
    }
    // 8. Release credential egress; its error is kept only if none is recorded yet.
    if let (Some(binding), Some(egress)) = (&allocated.egress, deps.credential_egress.as_ref()) {
        let fence = context.fence();
        let call = egress.release(&context.scope, &fence, binding);
        let released = observed(context, RunStep::CredentialEgressRelease, call, |()| {
            StepFacts::Nothing
        })
        .await;
        if let Err(error) = released {
            tracing::warn!(error = %context.redact(&error), "credential egress release failed");
            persistence_error.get_or_insert(error);
        }
    }
    // 9. Release the workspace binding. Errors are ignored.
    if let Some(binding) = &allocated.workspace {
        let fence = context.fence();
        let call = deps.workspace.release(&context.scope, &fence, binding);
        let _ = observed(context, RunStep::WorkspaceRelease, call, |()| {
            StepFacts::Nothing
        })
        .await;
    }
    // 10. Release the fence. Errors are ignored.
    let reason = context.cleanup_reason();
    let fence = context.fence();
    let generation = fence.generation;
    let call = deps.fences.release(&fence, reason);
    let _ = observed(context, RunStep::FenceRelease, call, |()| {
        StepFacts::FenceReleased { generation, reason }
    })
    .await;
    // 11. Surface a cleanup-persistence error.
    match persistence_error {
        Some(error) => Err(context.redact(&error)),
        None => Ok(()),
    }
}
