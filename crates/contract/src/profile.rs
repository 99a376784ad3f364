//! What a work item asks for (profile) and what admission chose (plan).

use crate::capabilities::wire_enum;
use crate::{HarnessDriverType, OutputStrategy, RuntimeCheckpointKind, WorkspaceStrategy};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A process to run inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuntimeProcessDeclaration {
    /// Executable: absolute, or looked up on PATH.
    pub command: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Working directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Extra environment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env: Option<BTreeMap<String, String>>,
}

impl RuntimeProcessDeclaration {
    /// A process with only a command.
    pub fn command(command: impl Into<String>) -> Self {
        Self {
            command: command.into(),
            args: None,
            cwd: None,
            env: None,
        }
    }
}

/// The one supervisor protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SupervisorProtocol {
    /// `openma-harness-supervisor-v1`.
    #[serde(rename = "openma-harness-supervisor-v1")]
    V1,
}

/// The literal supervisor protocol name.
pub const SUPERVISOR_PROTOCOL_V1: &str = "openma-harness-supervisor-v1";

/// `{id, version}` of a supervised harness.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessIdentity {
    /// Harness id.
    pub id: String,
    /// Harness version.
    pub version: String,
}

/// How the harness runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HarnessDriverDeclaration {
    /// An unmodified AMA worker.
    AmaWorker {
        /// The worker process.
        process: RuntimeProcessDeclaration,
    },
    /// A supervisor speaking the JSON-Lines supervisor protocol.
    #[serde(rename_all = "camelCase")]
    OpenmaSupervised {
        /// Always `openma-harness-supervisor-v1`.
        protocol: SupervisorProtocol,
        /// The supervisor process.
        supervisor: RuntimeProcessDeclaration,
        /// The harness it supervises.
        harness: HarnessIdentity,
        /// Deadline for each event until `ready`.
        ready_timeout_ms: i64,
        /// Deadline for each event while the harness runs.
        heartbeat_timeout_ms: i64,
        /// Deadline for each event while draining.
        drain_timeout_ms: i64,
    },
}

impl HarnessDriverDeclaration {
    /// The lane.
    pub fn driver_type(&self) -> HarnessDriverType {
        match self {
            HarnessDriverDeclaration::AmaWorker { .. } => HarnessDriverType::AmaWorker,
            HarnessDriverDeclaration::OpenmaSupervised { .. } => {
                HarnessDriverType::OpenmaSupervised
            }
        }
    }

    /// The process the harness executable check probes: the worker, or the supervisor.
    pub fn entry_process(&self) -> &RuntimeProcessDeclaration {
        match self {
            HarnessDriverDeclaration::AmaWorker { process } => process,
            HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } => supervisor,
        }
    }
}

wire_enum! {
    /// How much the workspace must survive.
    WorkspaceRequirement {
        /// Survives any loss of compute.
        Durable = "durable",
        /// May live in retained compute.
        Continuable = "continuable",
        /// Nothing needs to survive.
        Ephemeral = "ephemeral",
    }
}

wire_enum! {
    /// How much Session outputs must survive.
    OutputRequirement {
        /// Durable outputs only.
        Durable = "durable",
        /// Any output strategy.
        BestEffort = "best_effort",
        /// No outputs.
        Disabled = "disabled",
    }
}

wire_enum! {
    /// Whether a runtime checkpoint is wanted.
    RuntimeCheckpointRequirement {
        /// Fail without one.
        Required = "required",
        /// Use one when available.
        Optional = "optional",
        /// Never.
        Disabled = "disabled",
    }
}

wire_enum! {
    /// Credential egress requirement of a profile.
    CredentialEgressRequirement {
        /// Only enforced egress is acceptable.
        Required = "required",
        /// Any egress port is used when present.
        BestEffort = "best_effort",
        /// No credential egress.
        Disabled = "disabled",
    }
}

/// Workspace part of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceProfile {
    /// Requirement.
    pub requirement: WorkspaceRequirement,
    /// Preference order (filtered to the eligible set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_strategies: Option<Vec<WorkspaceStrategy>>,
}

/// Outputs part of a profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutputsProfile {
    /// Requirement.
    pub requirement: OutputRequirement,
    /// Preference order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preferred_strategies: Option<Vec<OutputStrategy>>,
}

/// Credential egress part of a profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CredentialEgressProfile {
    /// Requirement.
    pub requirement: CredentialEgressRequirement,
}

/// What a work item requires of its composition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRuntimeProfile {
    /// Workspace requirement.
    pub workspace: WorkspaceProfile,
    /// Outputs requirement.
    pub outputs: OutputsProfile,
    /// Runtime checkpoint requirement.
    pub runtime_checkpoint: RuntimeCheckpointRequirement,
    /// Credential egress requirement; absent ≡ disabled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential_egress: Option<CredentialEgressProfile>,
    /// How the harness runs.
    pub driver: HarnessDriverDeclaration,
}

impl ManagedRuntimeProfile {
    /// The egress requirement, absent read as disabled.
    pub fn credential_egress_requirement(&self) -> CredentialEgressRequirement {
        self.credential_egress
            .map(|egress| egress.requirement)
            .unwrap_or(CredentialEgressRequirement::Disabled)
    }
}

/// The strategies admission chose for one run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRuntimePlan {
    /// Workspace strategy.
    pub workspace_strategy: WorkspaceStrategy,
    /// Output strategy, or null when outputs are disabled.
    pub output_strategy: Option<OutputStrategy>,
    /// Runtime checkpoint kind, or null.
    pub runtime_checkpoint: Option<RuntimeCheckpointKind>,
    /// The harness declaration (the profile's).
    pub driver: HarnessDriverDeclaration,
}
