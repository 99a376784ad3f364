//! The resource transaction (reference §2.3 steps 13–36), top to bottom.
//!
//! Every step is one named call followed by `throwIfAborted` on the run's internal signal, so
//! a lost fence, a lost sandbox, a failed heartbeat or a caller's cancel stops the transaction
//! at the next step boundary. Ports receive that signal too and are expected to stop early.
//! Whatever was allocated is recorded in [`Allocated`] *before* the abort check, so cleanup
//! (§2.4) releases exactly what exists.

use super::ManagedRuntimeRunResult;
use super::identity::{self, CreatedCheckpointExpectation};
use super::live_checkpoint::LiveTurns;
use super::session_sync::{self, PeriodicSync, SessionInputSync};
use super::state::{RunContext, observed};
use crate::run_observer::{RunStep, StepFacts};
use omabox_contract::{
    AcquireSandboxInput, AttachOutputsInput, AttachWorkspaceInput, CheckpointWorkspaceInput,
    CollectOutputsInput, CreateRuntimeCheckpointInput, CredentialEgressBinding,
    CredentialEgressPrepareRequirement, CredentialEgressRequirement, FinalizeOutputsInput,
    ManagedSandboxLease, ManagedWorkExecutionResult, MaterializeSessionInputsInput,
    MaterializeWorkspaceInput, Nullable, PortError, PrepareCredentialEgressInput,
    PrepareOutputsInput, PublishRuntimeResourcesInput, PublishRuntimeResourcesResult,
    RunHarnessInput, RuntimeCheckpointRef, RuntimeCheckpointRequirement,
    RuntimePublicationCandidate, SessionInputLifecycleContext, SessionOutputBinding,
    TerminationReason, WorkspaceBinding, WorkspaceCheckpointCandidate, WorkspaceStrategy,
};
use std::sync::Arc;
use std::time::Instant;

const HARNESS_SETTLED: &str = "Managed runtime harness settled";
const EGRESS_NOT_PREPARED: &str =
    "Required credential egress could not be prepared for this Session";
const INCOMPATIBLE_CHECKPOINT: &str =
    "RuntimeCheckpointPort returned an incompatible checkpoint ref";

/// What the transaction allocated so far; cleanup releases exactly these. The sandbox lease
/// lives in the [`RunContext`] because the heartbeat monitor reads it.
#[derive(Default)]
pub(super) struct Allocated {
    pub workspace: Option<WorkspaceBinding>,
    pub outputs: Option<SessionOutputBinding>,
    pub egress: Option<CredentialEgressBinding>,
    pub session_sync: Option<Arc<SessionInputSync>>,
    pub periodic: Option<PeriodicSync>,
}

/// Steps 13–36. `Ok` is `completed` or `lease_lost`; `Err` is the failing step's error, which
/// the caller turns into `failed` or `lease_lost` (the reference's `catch`).
pub(super) async fn run(
    context: &Arc<RunContext>,
    allocated: &mut Allocated,
) -> Result<ManagedRuntimeRunResult, PortError> {
    // 13. Materialize the workspace from the last published candidate.
    let workspace = materialize_workspace(context).await?;
    allocated.workspace = Some(workspace.clone());
    context.throw_if_aborted()?;
    // 14. Prepare outputs.
    if context.plan.output_strategy.is_some() {
        allocated.outputs = prepare_outputs(context).await?;
        context.throw_if_aborted()?;
    }
    // 15. Prepare credential egress.
    if let Some(requirement) = egress_prepare_requirement(context) {
        allocated.egress = prepare_credential_egress(context, requirement).await?;
        if requirement == CredentialEgressPrepareRequirement::Required && allocated.egress.is_none()
        {
            return Err(PortError::new(EGRESS_NOT_PREPARED));
        }
        context.throw_if_aborted()?;
    }
    // 16. Warm-start from a reusable runtime checkpoint (failures fall back to 17).
    if let Some(lease) = restore_runtime_checkpoint(context).await {
        context.set_sandbox_lease(lease);
    }
    // 17. Otherwise acquire fresh compute.
    if context.sandbox_lease().is_none() {
        let lease = acquire_sandbox(context, &workspace, allocated).await?;
        context.set_sandbox_lease(lease);
    }
    context.throw_if_aborted()?;
    let sandbox = context
        .sandbox_lease()
        .ok_or_else(|| PortError::new("Managed runtime has no sandbox lease"))?;
    // 18. Attach the workspace.
    attach_workspace(context, &workspace, &sandbox).await?;
    context.throw_if_aborted()?;
    // 19. Attach outputs.
    if let Some(binding) = &allocated.outputs {
        attach_outputs(context, binding, &sandbox).await?;
        context.throw_if_aborted()?;
    }
    // 20. Attach credential egress.
    if let Some(binding) = &allocated.egress {
        attach_credential_egress(context, binding, &sandbox).await?;
        context.throw_if_aborted()?;
    }
    // 21. Materialize Session inputs.
    if materialize_session_inputs(context, &workspace, &sandbox).await? {
        context.throw_if_aborted()?;
    }
    // 22. The serialized Session-input sync helper.
    let sync = SessionInputSync::new(context, sandbox.clone());
    allocated.session_sync = Some(Arc::clone(&sync));
    // 23. Periodic sync for materializer-owned writable memory stores.
    if sync.needs_periodic_sync() {
        allocated.periodic = Some(PeriodicSync::start(&sync));
    }
    // 24. The live-turn checkpoint callback.
    let live_turns = Arc::new(LiveTurns {
        context: Arc::clone(context),
        sync: Arc::clone(&sync),
        workspace: workspace.clone(),
        sandbox: sandbox.clone(),
        outputs: allocated.outputs.clone(),
    });
    // 25. Run the harness.
    let execution = run_harness(
        context,
        &workspace,
        allocated.outputs.as_ref(),
        &sandbox,
        live_turns,
    )
    .await?;
    // 26. Stop the periodic sync and wait for every queued sync.
    if let Some(periodic) = allocated.periodic.as_mut() {
        periodic.stop(HARNESS_SETTLED).await;
    }
    sync.settle().await;
    // 27. Lost ownership while the harness ran.
    if context.lease_lost() {
        context.set_cleanup_reason(TerminationReason::LeaseLost);
        return Ok(ManagedRuntimeRunResult::LeaseLost);
    }
    // 28. The periodic sync failed.
    if let Some(failure) = context.ledger().session_input_sync_failure.clone() {
        return Err(failure);
    }
    // 29. The harness stopped on cancellation.
    if execution == ManagedWorkExecutionResult::Aborted {
        context.set_cleanup_reason(TerminationReason::LeaseLost);
        return Ok(ManagedRuntimeRunResult::LeaseLost);
    }
    // 30. Final Session-input sync.
    sync.sync("final").await?;
    // 31. Suspend a retained runtime; its lease replaces the old one.
    let mut sandbox = sandbox;
    if context.plan.workspace_strategy == WorkspaceStrategy::RetainedRuntime {
        sandbox = suspend_sandbox(context, &sandbox).await?;
        context.set_sandbox_lease(sandbox.clone());
        context.throw_if_aborted()?;
    }
    // 32. Capture the workspace candidate.
    let workspace_candidate = checkpoint_workspace(context, &workspace, &sandbox).await?;
    context.throw_if_aborted()?;
    // 33. Create a compatible runtime checkpoint.
    let mut runtime_checkpoint = None;
    if context.plan.runtime_checkpoint.is_some() {
        runtime_checkpoint =
            create_runtime_checkpoint(context, &sandbox, &workspace_candidate).await?;
        context.throw_if_aborted()?;
    }
    // 34. Collect and finalize outputs.
    let mut output_candidate = None;
    if let Some(binding) = &allocated.outputs {
        output_candidate = finalize_outputs(context, binding).await?;
        context.ledger().published_output_candidate = output_candidate.clone();
    }
    // 35. Publish atomically under the fence.
    let published = publish(
        context,
        &workspace_candidate,
        output_candidate,
        runtime_checkpoint,
    )
    .await?;
    let PublishRuntimeResourcesResult::Published { revision } = published else {
        context.set_cleanup_reason(TerminationReason::LeaseLost);
        return Ok(ManagedRuntimeRunResult::LeaseLost);
    };
    // 36. Completed.
    {
        let mut ledger = context.ledger();
        ledger.output_published = true;
        ledger.retained_runtime_published =
            context.plan.workspace_strategy == WorkspaceStrategy::RetainedRuntime;
        ledger.cleanup_reason = TerminationReason::Completed;
    }
    tracing::debug!(
        step = "completed",
        generation = context.generation(),
        revision
    );
    Ok(ManagedRuntimeRunResult::Completed { revision })
}

async fn materialize_workspace(context: &RunContext) -> Result<WorkspaceBinding, PortError> {
    let active_checkpoint = context
        .publication
        .as_ref()
        .map(|publication| publication.workspace_candidate.clone());
    let from_checkpoint = active_checkpoint.as_ref().map(|c| c.id.clone());
    let call = context
        .host
        .deps
        .workspace
        .materialize(MaterializeWorkspaceInput {
            scope: context.scope.clone(),
            fence: context.fence(),
            strategy: context.plan.workspace_strategy,
            active_checkpoint,
            idempotency_key: context.idempotency_key("workspace-materialize"),
            signal: context.signal(),
        });
    observed(context, RunStep::WorkspaceMaterialize, call, |binding| {
        StepFacts::Workspace {
            binding: binding.clone(),
            from_checkpoint,
        }
    })
    .await
}

async fn prepare_outputs(context: &RunContext) -> Result<Option<SessionOutputBinding>, PortError> {
    let Some(strategy) = context.plan.output_strategy else {
        return Ok(None);
    };
    let call = context.host.deps.outputs.prepare(PrepareOutputsInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        strategy,
        idempotency_key: context.idempotency_key("outputs-prepare"),
        signal: context.signal(),
    });
    let binding = observed(context, RunStep::OutputsPrepare, call, |binding| {
        StepFacts::Outputs(binding.clone())
    })
    .await?;
    Ok(Some(binding))
}

/// The requirement passed to `prepare`, when egress is wanted and a port exists.
fn egress_prepare_requirement(context: &RunContext) -> Option<CredentialEgressPrepareRequirement> {
    context.host.deps.credential_egress.as_ref()?;
    match context.egress_requirement {
        CredentialEgressRequirement::Disabled => None,
        CredentialEgressRequirement::Required => Some(CredentialEgressPrepareRequirement::Required),
        CredentialEgressRequirement::BestEffort => {
            Some(CredentialEgressPrepareRequirement::BestEffort)
        }
    }
}

async fn prepare_credential_egress(
    context: &RunContext,
    requirement: CredentialEgressPrepareRequirement,
) -> Result<Option<CredentialEgressBinding>, PortError> {
    let Some(egress) = context.host.deps.credential_egress.as_ref() else {
        return Ok(None);
    };
    let call = egress.prepare(PrepareCredentialEgressInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        requirement,
        idempotency_key: context.idempotency_key("credential-egress-prepare"),
        signal: context.signal(),
    });
    observed(context, RunStep::CredentialEgressPrepare, call, |_| {
        StepFacts::Nothing
    })
    .await
}

/// Step 16. A runtime checkpoint is an optimization: any restore failure falls back to a
/// fresh acquire, because the canonical recovery path is the published workspace.
async fn restore_runtime_checkpoint(context: &RunContext) -> Option<ManagedSandboxLease> {
    let kind = context.plan.runtime_checkpoint?;
    let checkpoint = context
        .publication
        .as_ref()
        .and_then(|publication| publication.runtime_checkpoint.as_option())?;
    if !identity::is_reusable(
        Some(checkpoint),
        &context.scope,
        context.generation(),
        kind,
        &context.identity,
    ) {
        return None;
    }
    let port = context.host.deps.runtime_checkpoint.as_ref()?;
    let fence = context.fence();
    let call = port.restore(&context.scope, &fence, checkpoint);
    let restored = observed(context, RunStep::RuntimeCheckpointRestore, call, |lease| {
        StepFacts::Sandbox(Box::new(lease.clone()))
    })
    .await;
    match restored {
        Ok(lease) => Some(lease),
        Err(error) => {
            tracing::debug!(error = %context.redact(&error), "runtime checkpoint restore failed; acquiring fresh compute");
            None
        }
    }
}

async fn acquire_sandbox(
    context: &RunContext,
    workspace: &WorkspaceBinding,
    allocated: &Allocated,
) -> Result<ManagedSandboxLease, PortError> {
    let call = context.host.deps.sandbox.acquire(AcquireSandboxInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        plan: context.plan.clone(),
        workspace: workspace.clone(),
        outputs: allocated.outputs.clone(),
        credential_egress: allocated.egress.clone(),
        signal: context.signal(),
    });
    observed(context, RunStep::SandboxAcquire, call, |lease| {
        StepFacts::Sandbox(Box::new(lease.clone()))
    })
    .await
}

async fn attach_workspace(
    context: &RunContext,
    workspace: &WorkspaceBinding,
    sandbox: &ManagedSandboxLease,
) -> Result<(), PortError> {
    let call = context.host.deps.workspace.attach(AttachWorkspaceInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        strategy: context.plan.workspace_strategy,
        binding: workspace.clone(),
        sandbox: sandbox.clone(),
        signal: context.signal(),
    });
    observed(context, RunStep::WorkspaceAttach, call, |_| {
        StepFacts::Nothing
    })
    .await
}

async fn attach_outputs(
    context: &RunContext,
    binding: &SessionOutputBinding,
    sandbox: &ManagedSandboxLease,
) -> Result<(), PortError> {
    let Some(strategy) = context.plan.output_strategy else {
        return Ok(());
    };
    let call = context.host.deps.outputs.attach(AttachOutputsInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        strategy,
        binding: binding.clone(),
        sandbox: sandbox.clone(),
        signal: context.signal(),
    });
    observed(context, RunStep::OutputsAttach, call, |_| {
        StepFacts::Nothing
    })
    .await
}

async fn attach_credential_egress(
    context: &RunContext,
    binding: &CredentialEgressBinding,
    sandbox: &ManagedSandboxLease,
) -> Result<(), PortError> {
    let Some(egress) = context.host.deps.credential_egress.as_ref() else {
        return Ok(());
    };
    let fence = context.fence();
    let call = egress.attach(&context.scope, &fence, binding, sandbox, context.signal());
    observed(context, RunStep::CredentialEgressAttach, call, |_| {
        StepFacts::Nothing
    })
    .await
}

/// Step 21; `Ok(true)` when the materializer ran.
async fn materialize_session_inputs(
    context: &Arc<RunContext>,
    workspace: &WorkspaceBinding,
    sandbox: &ManagedSandboxLease,
) -> Result<bool, PortError> {
    let (Some(materializer), Some(session)) = (
        context.host.deps.session_inputs.as_ref(),
        context.session.as_ref(),
    ) else {
        return Ok(false);
    };
    let call = materializer.materialize(MaterializeSessionInputsInput {
        context: SessionInputLifecycleContext {
            scope: context.scope.clone(),
            fence: context.fence(),
            session: session.clone(),
            sandbox: sandbox.clone(),
            resource_ownership: session_sync::resource_ownership(context),
            access: context.session_input_access.clone(),
            authorize: session_sync::authorize(context, session_sync::LOST_DURING_MATERIALIZATION),
            signal: context.signal(),
        },
        workspace: workspace.clone(),
        active_workspace_checkpoint: context
            .publication
            .as_ref()
            .map(|publication| publication.workspace_candidate.clone()),
        idempotency_key: context.idempotency_key("session-inputs-materialize"),
    });
    observed(context, RunStep::SessionInputsMaterialize, call, |_| {
        StepFacts::Nothing
    })
    .await?;
    Ok(true)
}

async fn run_harness(
    context: &RunContext,
    workspace: &WorkspaceBinding,
    outputs: Option<&SessionOutputBinding>,
    sandbox: &ManagedSandboxLease,
    live_turns: Arc<LiveTurns>,
) -> Result<ManagedWorkExecutionResult, PortError> {
    let call = context.host.deps.harness_driver.run(RunHarnessInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        sandbox: sandbox.clone(),
        workspace_path: workspace.mount_path.clone(),
        output_path: outputs.map(|binding| binding.mount_path.clone()),
        driver: context.plan.driver.clone(),
        checkpoint: Some(live_turns.callback()),
        signal: context.signal(),
    });
    observed(context, RunStep::HarnessRun, call, |result| {
        StepFacts::Harness(*result)
    })
    .await
}

async fn suspend_sandbox(
    context: &RunContext,
    sandbox: &ManagedSandboxLease,
) -> Result<ManagedSandboxLease, PortError> {
    let fence = context.fence();
    let call = context
        .host
        .deps
        .sandbox
        .suspend(&context.scope, &fence, sandbox, context.signal());
    observed(context, RunStep::SandboxSuspend, call, |lease| {
        StepFacts::Sandbox(Box::new(lease.clone()))
    })
    .await
}

async fn checkpoint_workspace(
    context: &RunContext,
    workspace: &WorkspaceBinding,
    sandbox: &ManagedSandboxLease,
) -> Result<WorkspaceCheckpointCandidate, PortError> {
    let call = context
        .host
        .deps
        .workspace
        .checkpoint(CheckpointWorkspaceInput {
            scope: context.scope.clone(),
            fence: context.fence(),
            strategy: context.plan.workspace_strategy,
            binding: workspace.clone(),
            sandbox: sandbox.clone(),
            idempotency_key: context.idempotency_key("workspace-checkpoint"),
            signal: context.signal(),
        });
    observed(context, RunStep::WorkspaceCheckpoint, call, |candidate| {
        StepFacts::Checkpoint(candidate.clone())
    })
    .await
}

/// Step 33. An incompatible ref is an error; any error fails a `required` profile and is
/// dropped otherwise (the run publishes without a runtime checkpoint).
async fn create_runtime_checkpoint(
    context: &RunContext,
    sandbox: &ManagedSandboxLease,
    workspace_candidate: &WorkspaceCheckpointCandidate,
) -> Result<Option<RuntimeCheckpointRef>, PortError> {
    let (Some(kind), Some(port)) = (
        context.plan.runtime_checkpoint,
        context.host.deps.runtime_checkpoint.as_ref(),
    ) else {
        return Ok(None);
    };
    tracing::debug!(step = RunStep::RuntimeCheckpointCreate.name());
    let began = Instant::now();
    let fence = context.fence();
    let created = port
        .create(CreateRuntimeCheckpointInput {
            scope: context.scope.clone(),
            fence: fence.clone(),
            sandbox: sandbox.clone(),
            kind,
            workspace_revision: workspace_candidate.revision,
            harness_version: context.identity.harness_version.clone(),
            runtime_identity: context.identity.runtime_identity.clone(),
        })
        .await
        .and_then(|checkpoint| {
            let expected = CreatedCheckpointExpectation {
                kind,
                lease: sandbox,
                scope: &context.scope,
                generation: fence.generation,
                identity: &context.identity,
                workspace_revision: workspace_candidate.revision,
            };
            if expected.is_met_by(&checkpoint) {
                Ok(checkpoint)
            } else {
                Err(PortError::new(INCOMPATIBLE_CHECKPOINT))
            }
        });
    context.observe(RunStep::RuntimeCheckpointCreate, began, &created, |_| {
        StepFacts::Nothing
    });
    match created {
        Ok(checkpoint) => Ok(Some(checkpoint)),
        Err(error)
            if context.profile.runtime_checkpoint == RuntimeCheckpointRequirement::Required =>
        {
            Err(error)
        }
        Err(error) => {
            tracing::debug!(error = %context.redact(&error), "optional runtime checkpoint dropped");
            Ok(None)
        }
    }
}

/// Step 34: collect, then finalize.
async fn finalize_outputs(
    context: &RunContext,
    binding: &SessionOutputBinding,
) -> Result<Option<RuntimePublicationCandidate>, PortError> {
    let Some(strategy) = context.plan.output_strategy else {
        return Ok(None);
    };
    let outputs = &context.host.deps.outputs;
    let call = outputs.collect(CollectOutputsInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        strategy,
        binding: binding.clone(),
        signal: context.signal(),
    });
    let entries = observed(context, RunStep::OutputsCollect, call, |entries| {
        StepFacts::Collected(entries.clone())
    })
    .await?;
    context.throw_if_aborted()?;
    let call = outputs.finalize(FinalizeOutputsInput {
        scope: context.scope.clone(),
        fence: context.fence(),
        strategy,
        binding: binding.clone(),
        entries,
        idempotency_key: context.idempotency_key("outputs-finalize"),
        signal: context.signal(),
    });
    let manifest = observed(context, RunStep::OutputsFinalize, call, |manifest| {
        StepFacts::Finalized {
            manifest_id: manifest.id.clone(),
        }
    })
    .await?;
    context.throw_if_aborted()?;
    Ok(Some(manifest.to_publication_candidate()))
}

/// Step 35: the `runtimeCheckpoint` key is omitted entirely when there is none.
async fn publish(
    context: &RunContext,
    workspace_candidate: &WorkspaceCheckpointCandidate,
    output_candidate: Option<RuntimePublicationCandidate>,
    runtime_checkpoint: Option<RuntimeCheckpointRef>,
) -> Result<PublishRuntimeResourcesResult, PortError> {
    let call = context
        .host
        .deps
        .fences
        .publish(PublishRuntimeResourcesInput {
            fence: context.fence(),
            workspace_candidate: workspace_candidate.to_publication_candidate(),
            output_candidate,
            runtime_checkpoint: runtime_checkpoint.map_or(Nullable::Absent, Nullable::Value),
        });
    observed(
        context,
        RunStep::FencePublish,
        call,
        |published| match published {
            PublishRuntimeResourcesResult::Published { revision } => StepFacts::Published {
                revision: *revision,
            },
            PublishRuntimeResourcesResult::Lost => StepFacts::Lost,
        },
    )
    .await
}
