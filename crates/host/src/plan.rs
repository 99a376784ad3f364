//! Plan resolution: which strategies a profile gets from a set of capabilities.
//!
//! Pure and provider-blind: the same function admits a profile against a descriptor (before
//! allocation) and against live ports (after `create`), so drift between the two shows up as
//! two different plans.

use omabox_contract::{
    HarnessDriverDeclaration, ManagedRuntimePlan, ManagedRuntimeProfile,
    ManagedRuntimeResourceCapabilities, OutputDurability, OutputRequirement, OutputStrategy,
    PortError, RuntimeCheckpointKind, RuntimeCheckpointRequirement, WorkspaceRequirement,
    WorkspaceStrategy,
};

/// Workspace strategies eligible for a requirement, in default preference order.
pub fn eligible_workspace_strategies(
    requirement: WorkspaceRequirement,
) -> &'static [WorkspaceStrategy] {
    use WorkspaceStrategy::*;
    match requirement {
        WorkspaceRequirement::Durable => &[DurableMount, CheckpointRestore],
        WorkspaceRequirement::Continuable => &[DurableMount, CheckpointRestore, RetainedRuntime],
        WorkspaceRequirement::Ephemeral => {
            &[DurableMount, CheckpointRestore, RetainedRuntime, Ephemeral]
        }
    }
}

const DEFAULT_OUTPUT_PREFERENCE: &[OutputStrategy] = &[
    OutputStrategy::DurableMount,
    OutputStrategy::WatchAndUpload,
    OutputStrategy::FinalCollect,
];

const RUNTIME_CHECKPOINT_PREFERENCE: &[RuntimeCheckpointKind] = &[
    RuntimeCheckpointKind::Process,
    RuntimeCheckpointKind::Filesystem,
];

/// `resolveManagedRuntimePlan`: fails with a `ManagedRuntimeCapabilityError` carrying the
/// contract's exact text when a requirement cannot be met.
pub fn resolve_managed_runtime_plan(
    profile: &ManagedRuntimeProfile,
    capabilities: &ManagedRuntimeResourceCapabilities,
) -> Result<ManagedRuntimePlan, PortError> {
    Ok(ManagedRuntimePlan {
        workspace_strategy: resolve_workspace(profile, capabilities)?,
        output_strategy: resolve_outputs(profile, capabilities)?,
        runtime_checkpoint: resolve_runtime_checkpoint(profile, capabilities)?,
        driver: resolve_driver(&profile.driver, capabilities)?,
    })
}

fn resolve_workspace(
    profile: &ManagedRuntimeProfile,
    capabilities: &ManagedRuntimeResourceCapabilities,
) -> Result<WorkspaceStrategy, PortError> {
    let requirement = profile.workspace.requirement;
    let eligible = eligible_workspace_strategies(requirement);
    let preference: Vec<WorkspaceStrategy> = match &profile.workspace.preferred_strategies {
        Some(preferred) => preferred
            .iter()
            .copied()
            .filter(|strategy| eligible.contains(strategy))
            .collect(),
        None => eligible.to_vec(),
    };
    preference
        .into_iter()
        .find(|strategy| capabilities.workspace.strategies.contains(strategy))
        .ok_or_else(|| {
            PortError::capability(format!(
                "The selected composition cannot provide a {} workspace",
                requirement.as_str()
            ))
        })
}

fn resolve_outputs(
    profile: &ManagedRuntimeProfile,
    capabilities: &ManagedRuntimeResourceCapabilities,
) -> Result<Option<OutputStrategy>, PortError> {
    let requirement = profile.outputs.requirement;
    if requirement == OutputRequirement::Disabled {
        return Ok(None);
    }
    let available: Vec<OutputStrategy> = capabilities
        .outputs
        .strategies
        .iter()
        .filter(|capability| {
            requirement == OutputRequirement::BestEffort
                || capability.durability == OutputDurability::Durable
        })
        .map(|capability| capability.strategy)
        .collect();
    let preference = profile
        .outputs
        .preferred_strategies
        .as_deref()
        .unwrap_or(DEFAULT_OUTPUT_PREFERENCE);
    preference
        .iter()
        .copied()
        .find(|strategy| available.contains(strategy))
        .map(Some)
        .ok_or_else(|| {
            PortError::capability(format!(
                "The selected composition cannot provide {} Session outputs",
                requirement.as_str()
            ))
        })
}

fn resolve_runtime_checkpoint(
    profile: &ManagedRuntimeProfile,
    capabilities: &ManagedRuntimeResourceCapabilities,
) -> Result<Option<RuntimeCheckpointKind>, PortError> {
    if profile.runtime_checkpoint == RuntimeCheckpointRequirement::Disabled {
        return Ok(None);
    }
    let kind = RUNTIME_CHECKPOINT_PREFERENCE
        .iter()
        .copied()
        .find(|kind| capabilities.sandbox.runtime_checkpoints.contains(kind));
    if kind.is_none() && profile.runtime_checkpoint == RuntimeCheckpointRequirement::Required {
        return Err(PortError::capability(
            "The selected composition cannot provide a runtime checkpoint",
        ));
    }
    Ok(kind)
}

fn resolve_driver(
    driver: &HarnessDriverDeclaration,
    capabilities: &ManagedRuntimeResourceCapabilities,
) -> Result<HarnessDriverDeclaration, PortError> {
    let driver_type = driver.driver_type();
    if !capabilities.harness.drivers.contains(&driver_type) {
        return Err(PortError::capability(format!(
            "The selected composition cannot run the {} harness driver",
            driver_type.as_str()
        )));
    }
    Ok(driver.clone())
}
