//! Pre-flight admission (reference §2.1 steps 1–8): everything checked before a fence is
//! claimed. Every failure here *rejects* `run`; no resource is touched and nothing needs
//! cleaning up.

use super::HostInner;
use super::identity::RuntimeIdentity;
use super::state::Admission;
use crate::plan::resolve_managed_runtime_plan;
use omabox_contract::{
    CredentialEgressEnforcement, CredentialEgressRequirement, HarnessDriverType,
    ManagedRuntimePlan, ManagedRuntimeProfile, ManagedRuntimeResourceCapabilities, PortError,
    RuntimeResourceScope, RuntimeSessionSnapshot,
};

/// Steps 1–8 in order.
pub(super) async fn admit(
    host: &HostInner,
    scope: &RuntimeResourceScope,
    profile: &ManagedRuntimeProfile,
    session: Option<&RuntimeSessionSnapshot>,
) -> Result<Admission, PortError> {
    // 1. Session resources the worker does not own need the host materializer.
    require_session_input_materializer(host, profile, session)?;
    // 2. A repository resource makes credential egress required.
    let egress_requirement = effective_egress_requirement(profile, session);
    // 3. Every port's capabilities, in parallel.
    let capabilities = query_capabilities(host, scope).await?;
    // 4. The plan.
    let plan = resolve_managed_runtime_plan(profile, &capabilities)?;
    // 5. An advertised runtime checkpoint needs its port.
    require_runtime_checkpoint_port(host, &plan)?;
    // 6. Required egress needs its port.
    require_credential_egress_port(host, egress_requirement)?;
    // 7. Required egress must be enforced.
    check_credential_egress_enforcement(host, scope, egress_requirement).await?;
    // 8. The harness identity for runtime checkpoints.
    let identity = RuntimeIdentity::of(profile);
    tracing::debug!(
        step = "preflight",
        workspace_strategy = %plan.workspace_strategy,
        egress = %egress_requirement,
        "managed runtime admitted"
    );
    Ok(Admission {
        plan,
        egress_requirement,
        identity,
    })
}

fn require_session_input_materializer(
    host: &HostInner,
    profile: &ManagedRuntimeProfile,
    session: Option<&RuntimeSessionSnapshot>,
) -> Result<(), PortError> {
    let Some(session) = session else {
        return Ok(());
    };
    if host.deps.session_inputs.is_none() && requires_host_materializer(profile, session) {
        return Err(PortError::new(
            "Session resources require a SessionInputMaterializerPort",
        ));
    }
    Ok(())
}

/// An unmodified AMA worker owns memory stores itself; files, repositories and any unknown
/// resource type belong to the host materializer, and a supervised harness owns nothing.
fn requires_host_materializer(
    profile: &ManagedRuntimeProfile,
    session: &RuntimeSessionSnapshot,
) -> bool {
    if session.resources.is_empty() {
        return false;
    }
    if profile.driver.driver_type() == HarnessDriverType::OpenmaSupervised {
        return true;
    }
    session
        .resources
        .iter()
        .any(|resource| resource.resource_type != "memory_store")
}

fn effective_egress_requirement(
    profile: &ManagedRuntimeProfile,
    session: Option<&RuntimeSessionSnapshot>,
) -> CredentialEgressRequirement {
    let repository = session.is_some_and(|session| {
        session
            .resources
            .iter()
            .any(|resource| resource.resource_type == "github_repository")
    });
    if repository {
        CredentialEgressRequirement::Required
    } else {
        profile.credential_egress_requirement()
    }
}

async fn query_capabilities(
    host: &HostInner,
    scope: &RuntimeResourceScope,
) -> Result<ManagedRuntimeResourceCapabilities, PortError> {
    let deps = &host.deps;
    let (sandbox, workspace, outputs, harness) = futures::try_join!(
        deps.sandbox.capabilities(scope),
        deps.workspace.capabilities(scope),
        deps.outputs.capabilities(scope),
        deps.harness_driver.driver_capabilities(scope),
    )?;
    Ok(ManagedRuntimeResourceCapabilities {
        sandbox,
        workspace,
        outputs,
        harness,
    })
}

fn require_runtime_checkpoint_port(
    host: &HostInner,
    plan: &ManagedRuntimePlan,
) -> Result<(), PortError> {
    match plan.runtime_checkpoint {
        Some(kind) if host.deps.runtime_checkpoint.is_none() => Err(PortError::new(format!(
            "The selected composition advertises {kind} runtime checkpoints but does not provide RuntimeCheckpointPort"
        ))),
        _ => Ok(()),
    }
}

fn require_credential_egress_port(
    host: &HostInner,
    requirement: CredentialEgressRequirement,
) -> Result<(), PortError> {
    if requirement == CredentialEgressRequirement::Required && host.deps.credential_egress.is_none()
    {
        return Err(PortError::new(
            "Required credential egress is unavailable: this Runtime Host has no CredentialEgressPort",
        ));
    }
    Ok(())
}

async fn check_credential_egress_enforcement(
    host: &HostInner,
    scope: &RuntimeResourceScope,
    requirement: CredentialEgressRequirement,
) -> Result<(), PortError> {
    let Some(egress) = host.deps.credential_egress.as_ref() else {
        return Ok(());
    };
    if requirement == CredentialEgressRequirement::Disabled {
        return Ok(());
    }
    let capabilities = egress.capabilities(scope).await?;
    if requirement == CredentialEgressRequirement::Required
        && capabilities.enforcement != CredentialEgressEnforcement::Enforced
    {
        return Err(PortError::new(format!(
            "This profile requires enforced credential egress, but the provider reports {}",
            capabilities.enforcement
        )));
    }
    Ok(())
}
