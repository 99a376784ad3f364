//! The provider host: one dynamically selected provider driver projected into the ordinary
//! managed runtime host transaction.
//!
//! Per `run`: admit the profile against the driver (descriptor first, then its live ports,
//! see [`crate::registry`]), then run the unchanged input through a fresh
//! [`ManagedRuntimeHost`] built from the selected ports. Provider resources are fenced and
//! published by exactly the same host logic as any preinstalled composition; nothing here
//! branches on a provider name.
//!
//! A session that mounts a `github_repository` is admitted with credential egress
//! `required`, whatever the profile says: repository credentials may only reach the sandbox
//! through an enforced egress path. The original input (and profile) is what the host runs.
//!
//! Resources are created for every run (admission calls `driver.create`); compute itself is
//! allocated later, by `sandbox.acquire` inside the fenced transaction.
//!
//! omabox extensions: an optional [`ResourcesHook`] decorates the selected resources before
//! the host runs with them (the lease journal), and a run's
//! [`crate::run_observer::RunObserver`] is told how admission ended (step `admission`).

use crate::registry::{ManagedRuntimeProviderRegistry, PrepareProviderInput};
use crate::run_observer::{RunStep, StepEvent, StepFacts, StepOutcome};
use crate::runtime_host::{
    ManagedRuntimeHost, ManagedRuntimeHostDependencies, ManagedRuntimeRunInput,
    ManagedRuntimeRunResult,
};
use omabox_contract::{
    CredentialEgressProfile, CredentialEgressRequirement, ManagedRuntimeProfile,
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderPlacement,
    ManagedRuntimeProviderResources, PortError, RuntimeOrphanPort, RuntimeResourceFencePort,
    RuntimeSchedulerPort, RuntimeSessionSnapshot,
};
use std::sync::Arc;
use std::time::Instant;

/// Decorates the resources admission selected (e.g. journals the sandbox's leases) before
/// the host runs with them. It must return ports that behave as the given ones do.
pub type ResourcesHook =
    Arc<dyn Fn(ManagedRuntimeProviderResources) -> ManagedRuntimeProviderResources + Send + Sync>;

/// Session resource type whose credentials require enforced egress.
const GITHUB_REPOSITORY: &str = "github_repository";

/// `ManagedRuntimeProviderHostOptions`: the host dependencies that do not come from the
/// provider, plus the driver, its placement and its configuration.
///
/// `sessionInputSyncIntervalMs` is not passed through (the host default applies), as in the
/// original.
#[derive(Clone)]
pub struct ManagedRuntimeProviderHostOptions {
    /// Fence owner id of this host.
    pub owner_id: String,
    /// Fence TTL.
    pub lease_ttl_ms: u64,
    /// Heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// The fence control plane.
    pub fences: Arc<dyn RuntimeResourceFencePort>,
    /// The orphan queue.
    pub orphans: Arc<dyn RuntimeOrphanPort>,
    /// The host's clock (default: a tokio timer).
    pub scheduler: Option<Arc<dyn RuntimeSchedulerPort>>,
    /// The selected provider driver.
    pub driver: Arc<dyn ManagedRuntimeProviderDriverPort>,
    /// Where its compute is placed.
    pub placement: ManagedRuntimeProviderPlacement,
    /// Configuration interpreted only by the driver. Never secrets.
    pub provider_config: serde_json::Map<String, serde_json::Value>,
}

impl std::fmt::Debug for ManagedRuntimeProviderHostOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeProviderHostOptions")
            .field("owner_id", &self.owner_id)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

/// `createManagedRuntimeProviderHost`.
#[derive(Clone)]
pub struct ManagedRuntimeProviderHost {
    registry: ManagedRuntimeProviderRegistry,
    provider: String,
    options: ManagedRuntimeProviderHostOptions,
    decorate: Option<ResourcesHook>,
}

impl std::fmt::Debug for ManagedRuntimeProviderHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeProviderHost")
            .field("provider", &self.provider)
            .field("options", &self.options)
            .field("decorate", &self.decorate.is_some())
            .finish_non_exhaustive()
    }
}

impl ManagedRuntimeProviderHost {
    /// Registers the driver (so an empty provider id fails here, with the registry's text).
    pub fn new(options: ManagedRuntimeProviderHostOptions) -> Result<Self, PortError> {
        let registry = ManagedRuntimeProviderRegistry::new(vec![Arc::clone(&options.driver)])?;
        let provider = options.driver.descriptor().provider;
        Ok(Self {
            registry,
            provider,
            options,
            decorate: None,
        })
    }

    /// Passes every run's selected resources through `hook` first.
    pub fn with_resources_hook(mut self, hook: ResourcesHook) -> Self {
        self.decorate = Some(hook);
        self
    }

    /// Admits the provider for this run, then runs `input` unchanged through a fresh host
    /// built from the selected ports. Admission failures reject, like host pre-flight.
    pub async fn run(
        &self,
        input: ManagedRuntimeRunInput,
    ) -> Result<ManagedRuntimeRunResult, PortError> {
        let began = Instant::now();
        let selection = self
            .registry
            .prepare(PrepareProviderInput {
                provider: self.provider.clone(),
                placement: self.options.placement,
                scope: input.scope.clone(),
                profile: admission_profile(&input.profile, input.session.as_ref()),
                provider_config: self.options.provider_config.clone(),
            })
            .await;
        if let Some(observer) = &input.observer {
            // No fence is held yet: admission errors cannot contain a token.
            let outcome = match &selection {
                Ok(selection) => StepOutcome::Done(StepFacts::Admitted {
                    provider: selection.descriptor.provider.clone(),
                    plan: Box::new(selection.plan.clone()),
                }),
                Err(error) => StepOutcome::Failed(error.clone()),
            };
            observer.step(StepEvent {
                step: RunStep::Admission,
                elapsed: began.elapsed(),
                outcome,
            });
        }
        let resources = match &self.decorate {
            Some(decorate) => decorate(selection?.resources),
            None => selection?.resources,
        };
        let host = ManagedRuntimeHost::new(ManagedRuntimeHostDependencies {
            owner_id: self.options.owner_id.clone(),
            lease_ttl_ms: self.options.lease_ttl_ms,
            heartbeat_interval_ms: self.options.heartbeat_interval_ms,
            session_input_sync_interval_ms: None,
            fences: Arc::clone(&self.options.fences),
            sandbox: resources.sandbox,
            workspace: resources.workspace,
            outputs: resources.outputs,
            harness_driver: resources.harness_driver,
            orphans: Arc::clone(&self.options.orphans),
            scheduler: self.options.scheduler.clone(),
            runtime_checkpoint: resources.runtime_checkpoint,
            credential_egress: resources.credential_egress,
            session_inputs: resources.session_inputs,
        })?;
        host.run(input).await
    }
}

/// The profile admission sees: egress `required` when the session mounts a GitHub repository.
pub fn admission_profile(
    profile: &ManagedRuntimeProfile,
    session: Option<&RuntimeSessionSnapshot>,
) -> ManagedRuntimeProfile {
    let mounts_repository = session.is_some_and(|session| {
        session
            .resources
            .iter()
            .any(|resource| resource.resource_type == GITHUB_REPOSITORY)
    });
    let mut admission = profile.clone();
    if mounts_repository {
        admission.credential_egress = Some(CredentialEgressProfile {
            requirement: CredentialEgressRequirement::Required,
        });
    }
    admission
}
