//! The provider registry: admits a provider driver against a profile, descriptor first (before
//! any allocation), then its live ports (after `create`).
//!
//! `prepare` runs the thirteen steps of the contract's admission table in order, each with its
//! exact error text:
//!
//! ```text
//!  1 provider registered            6 supervised lane has a driver or a transport
//!  2 placement advertised           7 project a transport into the supervised lane
//!  3 plan from the descriptor       8 plan from the live ports (queried in parallel)
//!  4 egress enforcement (descr.)    9 live plan == advertised plan (drift)
//!  5 driver.create                 10 checkpoint port  11 egress port  12 egress enforced
//!                                  13 {descriptor, live plan, resources}
//! ```
//!
//! Nothing is cleaned up when steps 6–12 fail: `create` only returns ports, and compute is
//! allocated later by `sandbox.acquire`.

use crate::plan::resolve_managed_runtime_plan;
use crate::router::compose_sandbox_harness_drivers;
use crate::supervisor_driver::SupervisedSandboxHarnessDriver;
use omabox_contract::{
    CredentialEgressEnforcement, CredentialEgressRequirement, HarnessDriverType,
    ManagedRuntimePlan, ManagedRuntimeProfile, ManagedRuntimeProviderCreateInput,
    ManagedRuntimeProviderDriverDescriptor, ManagedRuntimeProviderDriverPort,
    ManagedRuntimeProviderPlacement, ManagedRuntimeProviderResources,
    ManagedRuntimeResourceCapabilities, PortError, RuntimeResourceScope, SandboxHarnessDriverPort,
};
use std::sync::Arc;

/// Input of [`ManagedRuntimeProviderRegistry::prepare`].
#[derive(Debug, Clone)]
pub struct PrepareProviderInput {
    /// The provider id to select.
    pub provider: String,
    /// The requested placement.
    pub placement: ManagedRuntimeProviderPlacement,
    /// The work item (its environment id is passed to `create`).
    pub scope: RuntimeResourceScope,
    /// The admission profile.
    pub profile: ManagedRuntimeProfile,
    /// Adapter configuration, interpreted only by the driver. Never secrets.
    pub provider_config: serde_json::Map<String, serde_json::Value>,
}

/// An admitted provider: its descriptor, the plan resolved from its live ports, and the
/// (projected) resource ports.
#[derive(Debug, Clone)]
pub struct ManagedRuntimeProviderSelection {
    /// The descriptor read at step 2.
    pub descriptor: ManagedRuntimeProviderDriverDescriptor,
    /// The plan resolved against the live ports.
    pub plan: ManagedRuntimePlan,
    /// The ports, with a supervisor transport projected into the supervised lane.
    pub resources: ManagedRuntimeProviderResources,
}

/// `createManagedRuntimeProviderRegistry`: drivers by provider id, in registration order.
#[derive(Clone)]
pub struct ManagedRuntimeProviderRegistry {
    drivers: Vec<(String, Arc<dyn ManagedRuntimeProviderDriverPort>)>,
}

impl std::fmt::Debug for ManagedRuntimeProviderRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeProviderRegistry")
            .field(
                "providers",
                &self.drivers.iter().map(|(id, _)| id).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl ManagedRuntimeProviderRegistry {
    /// Reads each driver's descriptor once and registers it under its provider id.
    ///
    /// Fails with TypeError "Managed Runtime provider id must not be empty" or Error
    /// "Duplicate Managed Runtime provider: <id>".
    pub fn new(drivers: Vec<Arc<dyn ManagedRuntimeProviderDriverPort>>) -> Result<Self, PortError> {
        let mut registered: Vec<(String, Arc<dyn ManagedRuntimeProviderDriverPort>)> =
            Vec::with_capacity(drivers.len());
        for driver in drivers {
            let provider = driver.descriptor().provider;
            if provider.is_empty() {
                return Err(PortError::invalid_argument(
                    "Managed Runtime provider id must not be empty",
                ));
            }
            if registered.iter().any(|(id, _)| *id == provider) {
                return Err(PortError::new(format!(
                    "Duplicate Managed Runtime provider: {provider}"
                )));
            }
            registered.push((provider, driver));
        }
        Ok(Self {
            drivers: registered,
        })
    }

    /// A fresh descriptor of every driver, in registration order.
    pub fn descriptors(&self) -> Vec<ManagedRuntimeProviderDriverDescriptor> {
        self.drivers
            .iter()
            .map(|(_, driver)| driver.descriptor())
            .collect()
    }

    /// Admits `input.profile` against the selected provider, creates its ports and checks
    /// them against what it advertised.
    pub async fn prepare(
        &self,
        input: PrepareProviderInput,
    ) -> Result<ManagedRuntimeProviderSelection, PortError> {
        let PrepareProviderInput {
            provider,
            placement,
            scope,
            profile,
            provider_config,
        } = input;

        // 1. The provider is registered.
        let driver = self
            .drivers
            .iter()
            .find(|(id, _)| *id == provider)
            .map(|(_, driver)| Arc::clone(driver))
            .ok_or_else(|| {
                PortError::new(format!("Unknown Managed Runtime provider: {provider}"))
            })?;

        // 2. The placement is advertised (fresh descriptor).
        let descriptor = driver.descriptor();
        if !descriptor.placements.contains(&placement) {
            return Err(PortError::capability(format!(
                "{} does not support {placement} placement",
                descriptor.provider
            )));
        }

        // 3. The profile is admissible against the descriptor, before any allocation.
        let advertised_plan = resolve_managed_runtime_plan(&profile, &descriptor.capabilities)?;

        // 4. Required credential egress is advertised as enforced.
        let egress_required =
            profile.credential_egress_requirement() == CredentialEgressRequirement::Required;
        if egress_required
            && descriptor.credential_egress.enforcement != CredentialEgressEnforcement::Enforced
        {
            return Err(PortError::capability(
                "The selected composition cannot enforce credential egress",
            ));
        }

        // 5. The driver returns its ports.
        let created = driver
            .create(ManagedRuntimeProviderCreateInput {
                environment_id: scope.environment_id.clone(),
                placement,
                profile: profile.clone(),
                plan: advertised_plan.clone(),
                provider_config,
            })
            .await?;

        // 6. An advertised supervised lane has a driver or a transport.
        let created_lanes = created.harness_driver.driver_capabilities(&scope).await?;
        let created_supervised = created_lanes
            .drivers
            .contains(&HarnessDriverType::OpenmaSupervised);
        if descriptor
            .capabilities
            .harness
            .drivers
            .contains(&HarnessDriverType::OpenmaSupervised)
            && !created_supervised
            && created.supervisor_transport.is_none()
        {
            return Err(PortError::capability(format!(
                "{} advertises openma_supervised without a HarnessSupervisorTransportPort",
                descriptor.provider
            )));
        }

        // 7. Project a supervisor transport into the supervised lane (even when the
        //    descriptor did not advertise it: the live ports decide).
        let resources = match &created.supervisor_transport {
            Some(transport) if !created_supervised => {
                let supervised: Arc<dyn SandboxHarnessDriverPort> =
                    Arc::new(SupervisedSandboxHarnessDriver::new(Arc::clone(transport)));
                ManagedRuntimeProviderResources {
                    harness_driver: Arc::new(compose_sandbox_harness_drivers(vec![
                        Arc::clone(&created.harness_driver),
                        supervised,
                    ])),
                    ..created
                }
            }
            _ => created,
        };

        // 8. The plan from the live ports, queried in parallel.
        let (sandbox, workspace, outputs, harness) = futures::try_join!(
            resources.sandbox.capabilities(&scope),
            resources.workspace.capabilities(&scope),
            resources.outputs.capabilities(&scope),
            resources.harness_driver.driver_capabilities(&scope),
        )?;
        let plan = resolve_managed_runtime_plan(
            &profile,
            &ManagedRuntimeResourceCapabilities {
                sandbox,
                workspace,
                outputs,
                harness,
            },
        )?;

        // 9. The live plan is the advertised plan (the driver is not compared).
        if plan.workspace_strategy != advertised_plan.workspace_strategy
            || plan.output_strategy != advertised_plan.output_strategy
            || plan.runtime_checkpoint != advertised_plan.runtime_checkpoint
        {
            return Err(PortError::capability(format!(
                "{} resource Ports drifted from the advertised capability plan",
                descriptor.provider
            )));
        }

        // 10. A planned runtime checkpoint has its port.
        if plan.runtime_checkpoint.is_some() && resources.runtime_checkpoint.is_none() {
            return Err(PortError::capability(format!(
                "{} advertises runtime checkpoints without a RuntimeCheckpointPort",
                descriptor.provider
            )));
        }

        if egress_required {
            // 11. Required egress has its port …
            let Some(egress) = resources.credential_egress.as_ref() else {
                return Err(PortError::capability(format!(
                    "{} advertises enforced credential egress without a CredentialEgressPort",
                    descriptor.provider
                )));
            };
            // 12. … and the port enforces it.
            if egress.capabilities(&scope).await?.enforcement
                != CredentialEgressEnforcement::Enforced
            {
                return Err(PortError::capability(format!(
                    "{} resource Port cannot enforce credential egress",
                    descriptor.provider
                )));
            }
        }

        // 13.
        Ok(ManagedRuntimeProviderSelection {
            descriptor,
            plan,
            resources,
        })
    }
}

#[cfg(test)]
mod tests {
    //! Steps of the admission table not covered by the ported TypeScript cases
    //! (`crates/testkit/tests/provider_driver_registry.rs`).

    use super::*;
    use omabox_contract::{
        CredentialEgressProfile, ErrorKind, HarnessDriverDeclaration, HarnessSupervisorEvent,
        OutputRequirement, OutputStrategy, OutputsProfile, RuntimeCheckpointRequirement,
        RuntimeProcessDeclaration, WorkspaceProfile, WorkspaceRequirement, WorkspaceStrategy,
    };
    use omabox_test_support::drivers::{
        FakeProviderDriver, ScriptedSupervisorTransport, StaticHarnessDriver, provider_descriptor,
        provider_resources,
    };

    fn scope() -> RuntimeResourceScope {
        RuntimeResourceScope::new("workspace_1", "environment_1", "session_1", "work_1")
    }

    fn profile(egress: Option<CredentialEgressRequirement>) -> ManagedRuntimeProfile {
        ManagedRuntimeProfile {
            workspace: WorkspaceProfile {
                requirement: WorkspaceRequirement::Durable,
                preferred_strategies: None,
            },
            outputs: OutputsProfile {
                requirement: OutputRequirement::Durable,
                preferred_strategies: None,
            },
            runtime_checkpoint: RuntimeCheckpointRequirement::Disabled,
            credential_egress: egress.map(|requirement| CredentialEgressProfile { requirement }),
            driver: HarnessDriverDeclaration::AmaWorker {
                process: RuntimeProcessDeclaration::command("managed-agent-worker"),
            },
        }
    }

    fn prepare_input(provider: &str, profile: ManagedRuntimeProfile) -> PrepareProviderInput {
        let mut provider_config = serde_json::Map::new();
        provider_config.insert("region".into(), serde_json::json!("eu"));
        PrepareProviderInput {
            provider: provider.into(),
            placement: ManagedRuntimeProviderPlacement::InProcess,
            scope: scope(),
            profile,
            provider_config,
        }
    }

    #[tokio::test]
    async fn checks_advertised_egress_enforcement_before_allocation() {
        let mut descriptor = provider_descriptor("advisory");
        descriptor.credential_egress.enforcement = CredentialEgressEnforcement::Advisory;
        let driver = Arc::new(FakeProviderDriver::returning(
            descriptor,
            provider_resources(),
        ));
        let registry = ManagedRuntimeProviderRegistry::new(vec![driver.clone()]).unwrap();
        let error = registry
            .prepare(prepare_input(
                "advisory",
                profile(Some(CredentialEgressRequirement::Required)),
            ))
            .await
            .unwrap_err();
        assert_eq!(
            error.message(),
            "The selected composition cannot enforce credential egress"
        );
        assert_eq!(error.kind(), ErrorKind::Capability);
        assert!(driver.creates().is_empty());

        // best_effort and absent egress never require enforcement.
        for egress in [Some(CredentialEgressRequirement::BestEffort), None] {
            registry
                .prepare(prepare_input("advisory", profile(egress)))
                .await
                .expect("admitted");
        }
    }

    #[tokio::test]
    async fn passes_the_advertised_plan_and_configuration_to_create() {
        let driver = Arc::new(FakeProviderDriver::returning(
            provider_descriptor("known"),
            provider_resources(),
        ));
        let registry = ManagedRuntimeProviderRegistry::new(vec![driver.clone()]).unwrap();
        let reads_after_construction = driver.descriptor_reads();
        assert_eq!(reads_after_construction, 1);
        let selection = registry
            .prepare(prepare_input("known", profile(None)))
            .await
            .unwrap();
        let creates = driver.creates();
        assert_eq!(creates.len(), 1);
        assert_eq!(creates[0].environment_id, "environment_1");
        assert_eq!(
            creates[0].placement,
            ManagedRuntimeProviderPlacement::InProcess
        );
        assert_eq!(
            creates[0].plan.workspace_strategy,
            WorkspaceStrategy::CheckpointRestore
        );
        assert_eq!(
            creates[0].plan.output_strategy,
            Some(OutputStrategy::FinalCollect)
        );
        assert_eq!(creates[0].provider_config["region"], "eu");
        assert_eq!(selection.plan, creates[0].plan);
        assert_eq!(selection.descriptor, provider_descriptor("known"));
        // prepare reads a fresh descriptor.
        assert_eq!(driver.descriptor_reads(), reads_after_construction + 1);
    }

    #[tokio::test]
    async fn projects_a_transport_even_when_the_descriptor_does_not_advertise_the_supervised_lane()
    {
        let mut resources = provider_resources();
        resources.supervisor_transport = Some(Arc::new(ScriptedSupervisorTransport::new(vec![
            HarnessSupervisorEvent::Drained,
        ])));
        let registry = ManagedRuntimeProviderRegistry::new(vec![Arc::new(
            FakeProviderDriver::returning(provider_descriptor("plain"), resources),
        )])
        .unwrap();
        let selection = registry
            .prepare(prepare_input("plain", profile(None)))
            .await
            .unwrap();
        assert_eq!(
            selection
                .resources
                .harness_driver
                .driver_capabilities(&scope())
                .await
                .unwrap()
                .drivers,
            vec![
                HarnessDriverType::AmaWorker,
                HarnessDriverType::OpenmaSupervised
            ]
        );
    }

    #[tokio::test]
    async fn keeps_a_native_supervised_driver_instead_of_projecting_the_transport() {
        let native = Arc::new(StaticHarnessDriver::new(&[
            HarnessDriverType::AmaWorker,
            HarnessDriverType::OpenmaSupervised,
        ]));
        let mut resources = provider_resources();
        resources.harness_driver = native.clone();
        resources.supervisor_transport =
            Some(Arc::new(ScriptedSupervisorTransport::new(Vec::new())));
        let mut descriptor = provider_descriptor("native");
        descriptor.capabilities.harness.drivers = vec![
            HarnessDriverType::AmaWorker,
            HarnessDriverType::OpenmaSupervised,
        ];
        let registry = ManagedRuntimeProviderRegistry::new(vec![Arc::new(
            FakeProviderDriver::returning(descriptor, resources),
        )])
        .unwrap();
        let selection = registry
            .prepare(prepare_input("native", profile(None)))
            .await
            .unwrap();
        let kept: Arc<dyn SandboxHarnessDriverPort> = native;
        assert!(Arc::ptr_eq(&selection.resources.harness_driver, &kept));
    }

    #[tokio::test]
    async fn propagates_the_driver_create_error() {
        let registry = ManagedRuntimeProviderRegistry::new(vec![Arc::new(
            FakeProviderDriver::new(provider_descriptor("failing"), |_| {
                Err(PortError::new("quota exceeded"))
            }),
        )])
        .unwrap();
        assert_eq!(
            registry
                .prepare(prepare_input("failing", profile(None)))
                .await
                .unwrap_err()
                .message(),
            "quota exceeded"
        );
    }

    #[tokio::test]
    async fn lists_descriptors_in_registration_order() {
        let registry = ManagedRuntimeProviderRegistry::new(vec![
            Arc::new(FakeProviderDriver::returning(
                provider_descriptor("b"),
                provider_resources(),
            )),
            Arc::new(FakeProviderDriver::returning(
                provider_descriptor("a"),
                provider_resources(),
            )),
        ])
        .unwrap();
        let ids: Vec<String> = registry
            .descriptors()
            .into_iter()
            .map(|descriptor| descriptor.provider)
            .collect();
        assert_eq!(ids, ["b", "a"]);
    }
}
