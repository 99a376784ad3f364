//! Provider drivers: the swappable backend a registry admits against a profile.

use crate::capabilities::wire_enum;
use crate::{
    CredentialEgressCapabilities, CredentialEgressPort, HarnessSupervisorTransportPort,
    ManagedRuntimePlan, ManagedRuntimeProfile, ManagedRuntimeResourceCapabilities,
    ManagedSandboxPort, PortError, RuntimeCheckpointPort, SandboxHarnessDriverPort,
    SessionInputMaterializerPort, SessionOutputPort, WorkspacePersistencePort,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

wire_enum! {
    /// Where a driver's compute is placed relative to the host.
    ManagedRuntimeProviderPlacement {
        /// Inside the host process.
        InProcess = "in_process",
        /// Behind a driver service.
        DriverService = "driver_service",
        /// On the provider's own platform.
        ProviderNative = "provider_native",
    }
}

/// Static admission facts of a driver: no allocation needed to read them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRuntimeProviderDriverDescriptor {
    /// Stable provider id.
    pub provider: String,
    /// Adapter version.
    pub version: String,
    /// Placements the driver implements.
    pub placements: Vec<ManagedRuntimeProviderPlacement>,
    /// Advertised capabilities (checked against the live ports at admission).
    pub capabilities: ManagedRuntimeResourceCapabilities,
    /// Credential egress facts.
    pub credential_egress: CredentialEgressCapabilities,
}

/// The only objects a driver may expose: ports, never SDK clients or live handles.
#[derive(Clone)]
pub struct ManagedRuntimeProviderResources {
    /// Compute lifecycle.
    pub sandbox: Arc<dyn ManagedSandboxPort>,
    /// Workspace persistence.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// Session outputs.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Harness driver.
    pub harness_driver: Arc<dyn SandboxHarnessDriverPort>,
    /// Supervisor transport, when the supervised lane runs over a generic channel.
    pub supervisor_transport: Option<Arc<dyn HarnessSupervisorTransportPort>>,
    /// Runtime checkpoints.
    pub runtime_checkpoint: Option<Arc<dyn RuntimeCheckpointPort>>,
    /// Credential egress.
    pub credential_egress: Option<Arc<dyn CredentialEgressPort>>,
    /// Session input materializer.
    pub session_inputs: Option<Arc<dyn SessionInputMaterializerPort>>,
}

impl std::fmt::Debug for ManagedRuntimeProviderResources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeProviderResources")
            .field("supervisor_transport", &self.supervisor_transport.is_some())
            .field("runtime_checkpoint", &self.runtime_checkpoint.is_some())
            .field("credential_egress", &self.credential_egress.is_some())
            .field("session_inputs", &self.session_inputs.is_some())
            .finish_non_exhaustive()
    }
}

/// Input of [`ManagedRuntimeProviderDriverPort::create`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRuntimeProviderCreateInput {
    /// The environment.
    pub environment_id: String,
    /// Requested placement.
    pub placement: ManagedRuntimeProviderPlacement,
    /// The profile.
    pub profile: ManagedRuntimeProfile,
    /// The plan admitted against the descriptor.
    pub plan: ManagedRuntimePlan,
    /// Adapter configuration only, never secrets.
    pub provider_config: serde_json::Map<String, serde_json::Value>,
}

/// A swappable managed-runtime backend.
#[async_trait]
pub trait ManagedRuntimeProviderDriverPort: Send + Sync {
    /// Static facts (synchronous, no allocation).
    fn descriptor(&self) -> ManagedRuntimeProviderDriverDescriptor;

    /// Returns ports only. Rejects placements the descriptor does not list. Compute is
    /// allocated later, by `sandbox.acquire`.
    async fn create(
        &self,
        input: ManagedRuntimeProviderCreateInput,
    ) -> Result<ManagedRuntimeProviderResources, PortError>;
}
