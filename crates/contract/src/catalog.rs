//! The conformance catalog's row: what one provider composition guarantees under the
//! managed runtime host, as data (OpenMA's `ManagedRuntimeProviderConformance`, wire
//! compatible: camelCase keys, the TypeScript literals).
//!
//! The rows themselves live with whoever makes the claim: OpenMA's twelve in
//! `omabox_host::catalog`, each omabox backend's in its own crate (checked against its live
//! driver by the testkit); the binary assembles the catalog it shows. What this must never
//! do: infer a row from generic sandbox capabilities — a row is a claim tests hold a backend
//! to.

use crate::{HarnessDriverType, RuntimeCheckpointKind, WorkspaceStrategy};
use serde::{Deserialize, Serialize};

/// Whether a provider runs under the managed runtime host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ConformanceStatus {
    /// A complete managed-runtime composition.
    #[serde(rename = "managed-runtime")]
    ManagedRuntime,
    /// Only a legacy tool-sandbox adapter.
    #[serde(rename = "sandbox-port-only")]
    SandboxPortOnly,
}

/// Who fences the lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogLease {
    /// The host's fence port.
    #[serde(rename = "host-fenced")]
    HostFenced,
    /// Only the provider's own lease.
    #[serde(rename = "provider-only")]
    ProviderOnly,
    /// None.
    #[serde(rename = "unavailable")]
    Unavailable,
}

/// Suspend/resume support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogSuspendResume {
    /// Supported.
    #[serde(rename = "supported")]
    Supported,
    /// Not supported.
    #[serde(rename = "unsupported")]
    Unsupported,
    /// Depends on the provider's configuration.
    #[serde(rename = "provider-specific")]
    ProviderSpecific,
}

/// Hard terminate support.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogHardTerminate {
    /// Terminate destroys the runtime.
    #[serde(rename = "supported")]
    Supported,
    /// Depends on the provider.
    #[serde(rename = "provider-specific")]
    ProviderSpecific,
    /// None.
    #[serde(rename = "unavailable")]
    Unavailable,
}

/// Who reaps orphans.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogOrphanReap {
    /// The host's orphan queue and reconciler.
    #[serde(rename = "host-managed")]
    HostManaged,
    /// The provider's own janitor.
    #[serde(rename = "provider-specific")]
    ProviderSpecific,
    /// None.
    #[serde(rename = "unavailable")]
    Unavailable,
}

/// Durability of a workspace or of outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogDurability {
    /// Durable.
    #[serde(rename = "durable")]
    Durable,
    /// May be lost.
    #[serde(rename = "best_effort")]
    BestEffort,
    /// None.
    #[serde(rename = "unavailable")]
    Unavailable,
}

/// Output strategies a catalog row may claim (the catalog's type admits only these two).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CatalogOutputStrategy {
    /// A durable mount.
    #[serde(rename = "durable_mount")]
    DurableMount,
    /// Collected after the harness.
    #[serde(rename = "final_collect")]
    FinalCollect,
}

/// Lifecycle guarantees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CatalogLifecycle {
    /// Lease fencing.
    pub lease: CatalogLease,
    /// Suspend/resume.
    pub suspend_resume: CatalogSuspendResume,
    /// Hard terminate.
    pub hard_terminate: CatalogHardTerminate,
    /// Orphan reaping.
    pub orphan_reap: CatalogOrphanReap,
}

/// Workspace guarantees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogWorkspace {
    /// Strategies.
    pub strategies: Vec<WorkspaceStrategy>,
    /// Durability.
    pub durability: CatalogDurability,
}

/// Session output guarantees.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogOutputs {
    /// Strategies.
    pub strategies: Vec<CatalogOutputStrategy>,
    /// Durability.
    pub durability: CatalogDurability,
}

/// Facts about the provider's sandbox port, as stable snake_case labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxPortFacts {
    /// What the provider offers.
    pub available: Vec<String>,
    /// What it does not.
    pub unavailable: Vec<String>,
}

/// One row of the conformance catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagedRuntimeProviderConformance {
    /// Provider id.
    pub id: String,
    /// True for a complete managed-runtime composition.
    pub managed_runtime: bool,
    /// Status.
    pub status: ConformanceStatus,
    /// Harness lanes.
    pub driver_lanes: Vec<HarnessDriverType>,
    /// Lifecycle guarantees.
    pub lifecycle: CatalogLifecycle,
    /// Workspace guarantees.
    pub workspace: CatalogWorkspace,
    /// Output guarantees.
    pub outputs: CatalogOutputs,
    /// Runtime checkpoint kinds.
    pub runtime_checkpoints: Vec<RuntimeCheckpointKind>,
    /// Sandbox port facts.
    pub sandbox_port_facts: SandboxPortFacts,
    /// Why the row looks the way it does (free text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A managed-runtime row with the values every OpenMA row shares: host-fenced lease,
/// supported hard terminate, host-managed orphan reaping, durable `final_collect` outputs and
/// no runtime checkpoints.
// One positional argument per varying column keeps each row readable as a table line.
#[allow(clippy::too_many_arguments)]
pub fn managed_runtime_row(
    id: &str,
    driver_lanes: &[HarnessDriverType],
    suspend_resume: CatalogSuspendResume,
    workspace_strategies: &[WorkspaceStrategy],
    workspace_durability: CatalogDurability,
    available: &[&str],
    unavailable: &[&str],
    reason: Option<&str>,
) -> ManagedRuntimeProviderConformance {
    let labels = |facts: &[&str]| facts.iter().map(|fact| (*fact).to_owned()).collect();
    ManagedRuntimeProviderConformance {
        id: id.to_owned(),
        managed_runtime: true,
        status: ConformanceStatus::ManagedRuntime,
        driver_lanes: driver_lanes.to_vec(),
        lifecycle: CatalogLifecycle {
            lease: CatalogLease::HostFenced,
            suspend_resume,
            hard_terminate: CatalogHardTerminate::Supported,
            orphan_reap: CatalogOrphanReap::HostManaged,
        },
        workspace: CatalogWorkspace {
            strategies: workspace_strategies.to_vec(),
            durability: workspace_durability,
        },
        outputs: CatalogOutputs {
            strategies: vec![CatalogOutputStrategy::FinalCollect],
            durability: CatalogDurability::Durable,
        },
        runtime_checkpoints: Vec::new(),
        sandbox_port_facts: SandboxPortFacts {
            available: labels(available),
            unavailable: labels(unavailable),
        },
        reason: reason.map(str::to_owned),
    }
}
