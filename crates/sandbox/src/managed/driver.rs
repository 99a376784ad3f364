//! [`ProviderManagedRuntimeDriver`]: a provider of tool sandboxes as a
//! `ManagedRuntimeProviderDriverPort`, with a descriptor computed from what is implemented.
//!
//! | descriptor field        | value                                                        |
//! |-------------------------|--------------------------------------------------------------|
//! | placements              | `in_process`                                                 |
//! | sandbox                 | suspendResume `unsupported`, hardTerminate `supported`, runtimeCheckpoints `[process]` iff the provider captures processes, else `[]` |
//! | workspace strategies    | whatever the workspace port reports (read once at build)     |
//! | outputs                 | whatever the outputs port reports (read once at build)       |
//! | harness lanes           | `ama_worker`, `openma_supervised` iff the provider's sandboxes have duplex processes, else none |
//! | credential egress       | `unsupported` (fail closed; no egress port) unless the backend composes its port with `with_credential_egress` |
//!
//! `create` returns the same ports every time (one [`ProviderManagedRuntime`] per driver, so
//! leases it acquired stay reachable), except for a plan with `process` runtime checkpoints:
//! then the run gets its own checkpoint port and the workspace and outputs ports that record
//! its bindings for it (`checkpoint.rs`), and rejects every placement but `in_process` with
//! "<provider> does not support <placement> placement".

use super::checkpoint::ProviderRuntimeCheckpoint;
use super::harness::{
    DirectAmaWorkerDriver, HarnessEnvSource, HarnessOutputSink, SandboxSupervisorTransport,
};
use super::provider::ManagedSandboxProvider;
use super::runtime::{ProviderManagedRuntime, ProviderManagedRuntimeOptions};
use async_trait::async_trait;
use omabox_contract::{
    CredentialEgressCapabilities, CredentialEgressPort, HarnessDriverType,
    ManagedRuntimeProviderCreateInput, ManagedRuntimeProviderDriverDescriptor,
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderPlacement,
    ManagedRuntimeProviderResources, ManagedRuntimeResourceCapabilities, ManagedSandboxPort,
    PortError, RuntimeCheckpointKind, RuntimeResourceScope, SandboxHarnessDriverCapabilities,
    SandboxHarnessDriverPort, SessionInputMaterializerPort, SessionOutputPort,
    WorkspacePersistencePort,
};
use std::sync::Arc;
use std::time::Duration;

/// The version written into descriptors.
pub const DRIVER_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The scope the capability queries at build time use. Omabox's persistence ports answer
/// the same for every scope; a port whose answer depends on the scope is caught by the
/// registry's drift check at admission.
fn descriptor_probe_scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new(
        "omabox-descriptor",
        "omabox-descriptor",
        "omabox-descriptor",
        "omabox-descriptor",
    )
}

/// Everything a [`ProviderManagedRuntimeDriver`] is built from.
#[derive(Clone)]
pub struct ProviderManagedRuntimeDriverOptions {
    /// The backend.
    pub provider: Arc<dyn ManagedSandboxProvider>,
    /// `/workspace` persistence (its `hostPath` binding is bound by the provider).
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// `/mnt/session/outputs` persistence (its `hostPath` binding is bound by the provider).
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Readiness probe timeout (default 10 s).
    pub readiness_timeout: Option<Duration>,
    /// Where harness stdout/stderr go as they arrive (`ama_worker` both streams; the
    /// supervisor's stderr only, its stdout being the protocol).
    pub harness_output: Option<Arc<dyn HarnessOutputSink>>,
}

impl std::fmt::Debug for ProviderManagedRuntimeDriverOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderManagedRuntimeDriverOptions")
            .field("provider", &self.provider.name())
            .field("readiness_timeout", &self.readiness_timeout)
            .field("harness_output", &self.harness_output.is_some())
            .finish_non_exhaustive()
    }
}

impl ProviderManagedRuntimeDriverOptions {
    /// Options with the defaults.
    pub fn new(
        provider: Arc<dyn ManagedSandboxProvider>,
        workspace: Arc<dyn WorkspacePersistencePort>,
        outputs: Arc<dyn SessionOutputPort>,
    ) -> Self {
        Self {
            provider,
            workspace,
            outputs,
            readiness_timeout: None,
            harness_output: None,
        }
    }
}

/// A managed-runtime provider driver over a [`ManagedSandboxProvider`].
#[derive(Clone)]
pub struct ProviderManagedRuntimeDriver {
    descriptor: ManagedRuntimeProviderDriverDescriptor,
    runtime: Arc<ProviderManagedRuntime>,
    workspace: Arc<dyn WorkspacePersistencePort>,
    outputs: Arc<dyn SessionOutputPort>,
    harness: Arc<DirectAmaWorkerDriver>,
    /// Replaces the `ama_worker` lane's driver (`with_harness_driver`).
    harness_override: Option<Arc<dyn SandboxHarnessDriverPort>>,
    packages: Option<crate::packages::EnvironmentPackages>,
    transport: Option<Arc<SandboxSupervisorTransport>>,
    credential_egress: Option<Arc<dyn CredentialEgressPort>>,
    session_inputs: Option<Arc<dyn SessionInputMaterializerPort>>,
}

impl std::fmt::Debug for ProviderManagedRuntimeDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderManagedRuntimeDriver")
            .field("descriptor", &self.descriptor)
            .field("runtime", &self.runtime)
            .finish_non_exhaustive()
    }
}

impl ProviderManagedRuntimeDriver {
    /// Builds the driver, reading the persistence ports' capabilities once for the
    /// descriptor.
    pub async fn new(options: ProviderManagedRuntimeDriverOptions) -> Result<Self, PortError> {
        let ProviderManagedRuntimeDriverOptions {
            provider,
            workspace,
            outputs,
            readiness_timeout,
            harness_output,
        } = options;
        let mut runtime_options = ProviderManagedRuntimeOptions::new(Arc::clone(&provider));
        if let Some(timeout) = readiness_timeout {
            runtime_options.readiness_timeout = timeout;
        }
        let runtime = Arc::new(ProviderManagedRuntime::new(runtime_options));
        let duplex = provider.capabilities().duplex_process;
        let scope = descriptor_probe_scope();
        let (sandbox_caps, workspace_caps, outputs_caps) = futures::try_join!(
            runtime.capabilities(&scope),
            workspace.capabilities(&scope),
            outputs.capabilities(&scope),
        )?;
        let lanes = if duplex {
            vec![
                HarnessDriverType::AmaWorker,
                HarnessDriverType::OpenmaSupervised,
            ]
        } else {
            Vec::new()
        };
        let descriptor = ManagedRuntimeProviderDriverDescriptor {
            provider: provider.name().to_owned(),
            version: DRIVER_VERSION.to_owned(),
            placements: vec![ManagedRuntimeProviderPlacement::InProcess],
            capabilities: ManagedRuntimeResourceCapabilities {
                sandbox: sandbox_caps,
                workspace: workspace_caps,
                outputs: outputs_caps,
                harness: SandboxHarnessDriverCapabilities { drivers: lanes },
            },
            credential_egress: CredentialEgressCapabilities::unsupported(),
        };
        let harness = Arc::new(DirectAmaWorkerDriver::new(
            Arc::clone(&runtime),
            harness_output.clone(),
        ));
        let transport = duplex.then(|| {
            Arc::new(SandboxSupervisorTransport::new(
                Arc::clone(&runtime),
                harness_output,
            ))
        });
        Ok(Self {
            descriptor,
            runtime,
            workspace,
            outputs,
            harness,
            harness_override: None,
            packages: None,
            transport,
            credential_egress: None,
            session_inputs: None,
        })
    }

    /// Composes the provider's credential egress port: the descriptor advertises
    /// `capabilities` (what the port proves), `resources` hands out the port, and acquires
    /// carrying a binding are accepted (the port attaches it to the lease afterwards).
    pub fn with_credential_egress(
        mut self,
        port: Arc<dyn CredentialEgressPort>,
        capabilities: CredentialEgressCapabilities,
    ) -> Self {
        self.descriptor.credential_egress = capabilities;
        self.runtime.accept_credential_egress();
        self.credential_egress = Some(port);
        self
    }

    /// Merges `source`'s variables over the declared env of every harness process this
    /// driver spawns, on both lanes, at spawn time (see [`HarnessEnvSource`]). Set it before
    /// the driver is admitted: `create` hands out the lanes as they are then.
    pub fn with_harness_env(mut self, source: Arc<dyn HarnessEnvSource>) -> Self {
        self.harness = Arc::new(
            DirectAmaWorkerDriver::clone(&self.harness).with_harness_env(Arc::clone(&source)),
        );
        self.transport = self.transport.map(|transport| {
            Arc::new(SandboxSupervisorTransport::clone(&transport).with_harness_env(source))
        });
        self
    }

    /// Runs the `ama_worker` lane with `driver` instead of [`DirectAmaWorkerDriver`] (for
    /// example the ACP harness, which speaks a protocol to the declared process). The
    /// descriptor is unchanged: the replacement must serve the same lane over the same
    /// runtime's duplex processes. `with_harness_env` does not reach the replacement: give
    /// it its own env source.
    pub fn with_harness_driver(mut self, driver: Arc<dyn SandboxHarnessDriverPort>) -> Self {
        self.harness_override = Some(driver);
        self
    }

    /// Installs `packages` (`Environment.config.packages`) in the lease's sandbox before the
    /// harness process of either lane starts: the `ama_worker` lane's driver
    /// ([`crate::packages::PackagesHarnessDriver`]) and the supervisor transport the host
    /// projects into the `openma_supervised` lane
    /// ([`crate::packages::PackagesSupervisorTransport`]).
    pub fn with_environment_packages(
        mut self,
        packages: crate::packages::EnvironmentPackages,
    ) -> Self {
        self.packages = Some(packages);
        self
    }

    /// Hands out `materializer` as the Session input materializer (for example
    /// [`crate::session_inputs::SandboxSessionInputs`] over [`Self::runtime`]).
    pub fn with_session_inputs(
        mut self,
        materializer: Arc<dyn SessionInputMaterializerPort>,
    ) -> Self {
        self.session_inputs = Some(materializer);
        self
    }

    /// The managed runtime behind the ports (for tools that need the live tool sandbox of a
    /// lease, like the conformance suite).
    pub fn runtime(&self) -> &Arc<ProviderManagedRuntime> {
        &self.runtime
    }

    /// Whether the provider's runtimes are captured with their processes (the descriptor
    /// then advertises `process` runtime checkpoints).
    fn provider_checkpoints(&self) -> bool {
        self.runtime.provider().capabilities().process_checkpoints
    }

    /// The ports `create` returns, without a runtime checkpoint port (`create` adds one,
    /// made for its run, when the plan asks for `process` checkpoints).
    pub fn resources(&self) -> ManagedRuntimeProviderResources {
        ManagedRuntimeProviderResources {
            sandbox: Arc::clone(&self.runtime) as Arc<dyn ManagedSandboxPort>,
            workspace: Arc::clone(&self.workspace),
            outputs: Arc::clone(&self.outputs),
            harness_driver: {
                let lane: Arc<dyn SandboxHarnessDriverPort> = match &self.harness_override {
                    Some(driver) => Arc::clone(driver),
                    None => Arc::clone(&self.harness) as _,
                };
                match &self.packages {
                    Some(packages) => Arc::new(crate::packages::PackagesHarnessDriver::new(
                        lane,
                        Arc::clone(&self.runtime),
                        packages.clone(),
                    )),
                    None => lane,
                }
            },
            supervisor_transport: self.transport.clone().map(|transport| {
                let transport: Arc<dyn omabox_contract::HarnessSupervisorTransportPort> = transport;
                match &self.packages {
                    Some(packages) => Arc::new(crate::packages::PackagesSupervisorTransport::new(
                        transport,
                        Arc::clone(&self.runtime),
                        packages.clone(),
                    )) as _,
                    None => transport,
                }
            }),
            runtime_checkpoint: None,
            credential_egress: self.credential_egress.clone(),
            session_inputs: self.session_inputs.clone(),
        }
    }
}

#[async_trait]
impl ManagedRuntimeProviderDriverPort for ProviderManagedRuntimeDriver {
    fn descriptor(&self) -> ManagedRuntimeProviderDriverDescriptor {
        self.descriptor.clone()
    }

    async fn create(
        &self,
        input: ManagedRuntimeProviderCreateInput,
    ) -> Result<ManagedRuntimeProviderResources, PortError> {
        if !self.descriptor.placements.contains(&input.placement) {
            return Err(PortError::capability(format!(
                "{} does not support {} placement",
                self.descriptor.provider, input.placement
            )));
        }
        let mut resources = self.resources();
        if input.plan.runtime_checkpoint == Some(RuntimeCheckpointKind::Process)
            && self.provider_checkpoints()
        {
            let (port, workspace, outputs) = ProviderRuntimeCheckpoint::for_run(
                Arc::clone(&self.runtime),
                input.plan,
                resources.workspace,
                resources.outputs,
            );
            resources.runtime_checkpoint = Some(port);
            resources.workspace = workspace;
            resources.outputs = outputs;
        }
        Ok(resources)
    }
}
