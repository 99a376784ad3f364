//! The conformance catalog: which provider compositions run under the managed runtime host,
//! and what each one guarantees, as data.
//!
//! [`openma_rows`] holds the twelve rows of OpenMA's `MANAGED_RUNTIME_PROVIDER_CONFORMANCE`
//! in their original order and with their original values (the free-text reasons are
//! paraphrased). omabox's own backends' rows are [`omabox_rows`] (data here, because backends
//! must not depend on the host); [`ConformanceCatalog::omabox`] appends them, and
//! [`ConformanceCatalog::extend`] refuses a duplicate id, so the OpenMA rows are never edited
//! in place.
//!
//! A row is a claim that tests hold a backend to: the catalog row, the driver descriptor and
//! the live ports are checked against each other. Nothing here is inferred from generic
//! sandbox capabilities.

use omabox_contract::{HarnessDriverType, PortError, RuntimeCheckpointKind, WorkspaceStrategy};
use serde::{Deserialize, Serialize};
use std::sync::LazyLock;

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

/// An ordered catalog with unique ids.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConformanceCatalog {
    rows: Vec<ManagedRuntimeProviderConformance>,
}

impl ConformanceCatalog {
    /// The twelve OpenMA rows.
    pub fn openma() -> Self {
        Self {
            rows: openma_rows(),
        }
    }

    /// The twelve OpenMA rows followed by omabox's own ([`omabox_rows`]).
    pub fn omabox() -> Self {
        let mut rows = openma_rows();
        rows.extend(omabox_rows());
        Self { rows }
    }

    /// Appends `rows` after the existing ones. Fails with "Duplicate managed runtime provider:
    /// <id>" (omabox-specific text) and leaves the catalog unchanged when an id repeats.
    pub fn extend(
        &mut self,
        rows: impl IntoIterator<Item = ManagedRuntimeProviderConformance>,
    ) -> Result<(), PortError> {
        let mut next = self.rows.clone();
        for row in rows {
            if next.iter().any(|existing| existing.id == row.id) {
                return Err(PortError::new(format!(
                    "Duplicate managed runtime provider: {}",
                    row.id
                )));
            }
            next.push(row);
        }
        self.rows = next;
        Ok(())
    }

    /// The rows in catalog order.
    pub fn rows(&self) -> &[ManagedRuntimeProviderConformance] {
        &self.rows
    }

    /// `getManagedRuntimeProviderConformance`: the row, or "Unknown managed runtime provider:
    /// <id>".
    pub fn get(&self, id: &str) -> Result<&ManagedRuntimeProviderConformance, PortError> {
        self.rows
            .iter()
            .find(|row| row.id == id)
            .ok_or_else(|| PortError::new(format!("Unknown managed runtime provider: {id}")))
    }

    /// `requireManagedRuntimeProvider`: the row of a managed-runtime composition.
    ///
    /// The TypeScript original only narrows the type; every OpenMA row is managed, so the
    /// extra check below (fail closed on a `sandbox-port-only` row, text "<id> is not a
    /// managed runtime provider") only matters for rows appended later.
    pub fn require(&self, id: &str) -> Result<&ManagedRuntimeProviderConformance, PortError> {
        let row = self.get(id)?;
        if !row.managed_runtime || row.status != ConformanceStatus::ManagedRuntime {
            return Err(PortError::new(format!(
                "{id} is not a managed runtime provider"
            )));
        }
        Ok(row)
    }
}

/// `MANAGED_RUNTIME_PROVIDER_CONFORMANCE`: the twelve OpenMA rows, in order.
pub static MANAGED_RUNTIME_PROVIDER_CONFORMANCE: LazyLock<Vec<ManagedRuntimeProviderConformance>> =
    LazyLock::new(openma_rows);

/// Looks `id` up in the OpenMA rows; fails with "Unknown managed runtime provider: <id>".
pub fn get_managed_runtime_provider_conformance(
    id: &str,
) -> Result<&'static ManagedRuntimeProviderConformance, PortError> {
    MANAGED_RUNTIME_PROVIDER_CONFORMANCE
        .iter()
        .find(|row| row.id == id)
        .ok_or_else(|| PortError::new(format!("Unknown managed runtime provider: {id}")))
}

/// Like [`get_managed_runtime_provider_conformance`], for a managed-runtime row only (see
/// [`ConformanceCatalog::require`]).
pub fn require_managed_runtime_provider(
    id: &str,
) -> Result<&'static ManagedRuntimeProviderConformance, PortError> {
    let row = get_managed_runtime_provider_conformance(id)?;
    if !row.managed_runtime || row.status != ConformanceStatus::ManagedRuntime {
        return Err(PortError::new(format!(
            "{id} is not a managed runtime provider"
        )));
    }
    Ok(row)
}

/// omabox's own rows (`linux`, then `local`), appended after the OpenMA rows by
/// [`ConformanceCatalog::omabox`]. Each is a claim the testkit checks against the live
/// driver (`tests/omabox_catalog.rs`): lanes, workspace strategies, outputs, suspend/resume
/// and runtime checkpoints must equal what the driver's descriptor and ports report.
pub fn omabox_rows() -> Vec<ManagedRuntimeProviderConformance> {
    use HarnessDriverType::{AmaWorker, OpenmaSupervised};
    use WorkspaceStrategy::{CheckpointRestore, Ephemeral};
    const BOTH: &[HarnessDriverType] = &[AmaWorker, OpenmaSupervised];
    const STRATEGIES: &[WorkspaceStrategy] = &[CheckpointRestore, Ephemeral];
    vec![
        managed_row(
            "linux",
            BOTH,
            CatalogSuspendResume::Unsupported,
            STRATEGIES,
            CatalogDurability::Durable,
            &[
                "namespace_isolation",
                "agent_as_init",
                "duplex_process",
                "workspace_file_io",
                "workspace_file_bytes",
                "host_directory_workspace_bind",
                "content_addressed_workspace_checkpoint",
                "serialized_identity_reap",
                "loopback_only_network",
            ],
            &[
                "provider_suspend_resume",
                "process_memory_checkpoint",
                "credential_egress",
                "network_egress_policy",
            ],
            Some(
                "omabox's namespace sandbox with its agent as PID 1; /workspace and \
                 /mnt/session/outputs are host directories bound from the persistence ports; \
                 leases carry the serialized sandbox identity so a fresh process can reap them.",
            ),
        ),
        managed_row(
            "local",
            BOTH,
            CatalogSuspendResume::Unsupported,
            STRATEGIES,
            CatalogDurability::Durable,
            &[
                "duplex_process",
                "workspace_file_io",
                "workspace_file_bytes",
                "host_directory_workspace_bind",
                "content_addressed_workspace_checkpoint",
            ],
            &[
                "isolation",
                "cross_process_reap",
                "provider_suspend_resume",
                "process_memory_checkpoint",
                "credential_egress",
            ],
            Some(
                "Test mode only: host subprocesses without isolation; runtimes live in the \
                 host process, so a lease from another process cannot be reaped.",
            ),
        ),
    ]
}

/// A managed-runtime row with the values every OpenMA row shares: host-fenced lease,
/// supported hard terminate, host-managed orphan reaping, durable `final_collect` outputs and
/// no runtime checkpoints.
// One positional argument per varying column keeps each row readable as a table line.
#[allow(clippy::too_many_arguments)]
fn managed_row(
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

/// The twelve OpenMA rows, in catalog order.
pub fn openma_rows() -> Vec<ManagedRuntimeProviderConformance> {
    use CatalogDurability::{BestEffort, Durable};
    use CatalogSuspendResume::{Supported, Unsupported};
    use HarnessDriverType::{AmaWorker, OpenmaSupervised};
    use WorkspaceStrategy::{CheckpointRestore, RetainedRuntime};
    const BOTH: &[HarnessDriverType] = &[AmaWorker, OpenmaSupervised];
    const WORKER: &[HarnessDriverType] = &[AmaWorker];
    vec![
        managed_row(
            "node-docker",
            BOTH,
            Unsupported,
            &[CheckpointRestore],
            Durable,
            &["duplex_process", "workspace_file_io"],
            &["provider_suspend_resume"],
            None,
        ),
        managed_row(
            "cloudflare",
            BOTH,
            Unsupported,
            &[CheckpointRestore],
            Durable,
            &["duplex_process", "workspace_backup", "session_output_mount"],
            &["runtime_scoped_resume", "process_memory_checkpoint"],
            None,
        ),
        managed_row(
            "cloudflare-bridge",
            WORKER,
            Unsupported,
            &[CheckpointRestore],
            Durable,
            &[
                "http_bridge",
                "argv_sse_process",
                "workspace_file_io",
                "workspace_tar_checkpoint",
            ],
            &[
                "interactive_stdin_without_pty",
                "provider_lease",
                "process_memory_checkpoint",
            ],
            Some(
                "Node talks to an operator-deployed official Cloudflare Sandbox Bridge while \
                 OpenMA keeps Work/fencing authority.",
            ),
        ),
        managed_row(
            "e2b",
            BOTH,
            Supported,
            &[RetainedRuntime, CheckpointRestore],
            Durable,
            &[
                "duplex_process",
                "provider_suspend_resume",
                "provider_memory_snapshot",
            ],
            &["process_memory_checkpoint"],
            None,
        ),
        managed_row(
            "daytona",
            BOTH,
            Supported,
            &[RetainedRuntime, CheckpointRestore],
            Durable,
            &[
                "provider_activity_lease",
                "stable_name_with_ownership_labels",
                "workspace_file_io",
                "retained_filesystem_stop_start",
                "portable_filesystem_snapshot",
                "duplex_session_process",
            ],
            &["process_memory_checkpoint", "durable_output_mount"],
            Some(
                "Follows Daytona's stable-name, ownership-label, stop/start, snapshot, \
                 activity-renewal and conflict-recovery lifecycle.",
            ),
        ),
        managed_row(
            "litebox",
            BOTH,
            Supported,
            &[RetainedRuntime],
            BestEffort,
            &[
                "stable_get_or_create",
                "detached_retained_filesystem",
                "duplex_process",
                "workspace_file_io",
                "native_network_allowlist",
                "native_secret_substitution",
            ],
            &["portable_workspace_checkpoint", "process_memory_checkpoint"],
            Some(
                "Official low-level BoxLite runtime API; host-local retained boxes are \
                 continuable but not advertised as portable durable checkpoints.",
            ),
        ),
        managed_row(
            "boxrun",
            BOTH,
            Supported,
            &[RetainedRuntime],
            BestEffort,
            &[
                "official_boxlite_rest_client",
                "stable_get_or_create",
                "detached_retained_filesystem",
                "duplex_process",
                "workspace_file_io",
            ],
            &["portable_workspace_checkpoint", "process_memory_checkpoint"],
            Some(
                "Uses BoxLite's official REST client instead of the legacy hand-written HTTP \
                 adapter; retained storage stays provider-local.",
            ),
        ),
        managed_row(
            "blaxel",
            BOTH,
            Supported,
            &[RetainedRuntime],
            BestEffort,
            &[
                "stable_name_external_id_and_ownership_labels",
                "archive_unarchive_retained_filesystem",
                "duplex_named_process",
                "workspace_file_io",
                "native_proxy_firewall_and_secret_injection",
                "optional_persistent_volume",
            ],
            &["portable_workspace_checkpoint", "process_memory_checkpoint"],
            Some(
                "Pre-claim readiness, stable Session identity, archive/unarchive, named \
                 processes, native network, janitor lifecycle.",
            ),
        ),
        managed_row(
            "sprites",
            BOTH,
            Supported,
            &[RetainedRuntime],
            Durable,
            &[
                "stable_name_and_ownership_labels",
                "persistent_ext4_filesystem",
                "automatic_pause_and_wake",
                "duplex_process",
                "workspace_file_io",
                "native_network_policy",
            ],
            &["portable_workspace_checkpoint", "process_memory_checkpoint"],
            Some(
                "Stable identity, provider-persistent ext4, auto pause/wake, native streams, \
                 network policy, owner-validated deletion; provider-local state is not a \
                 portable checkpoint.",
            ),
        ),
        managed_row(
            "vercel",
            WORKER,
            Supported,
            &[RetainedRuntime],
            Durable,
            &[
                "stable_name_and_ownership_tags",
                "persistent_filesystem_with_automatic_snapshot_restore",
                "detached_process_logs",
                "workspace_file_io",
                "deny_by_default_network_policy",
                "path_scoped_header_transform_and_forward_proxy",
            ],
            &[
                "streaming_process_stdin",
                "portable_workspace_checkpoint",
                "process_memory_checkpoint",
            ],
            Some(
                "Persistent named-sandbox lifecycle, deny-by-default firewall reapplied before \
                 readiness, provider-side credential transforms/forwarding, owner-validated \
                 hard delete; snapshots remain retained-runtime state.",
            ),
        ),
        managed_row(
            "modal",
            BOTH,
            Supported,
            &[RetainedRuntime],
            Durable,
            &[
                "stable_name_and_ownership_tags",
                "session_scoped_volume_v2_subpath",
                "volume_sync_before_detach",
                "duplex_process",
                "workspace_file_io",
                "native_domain_and_cidr_allowlist",
                "compute_recreate_over_durable_volume",
            ],
            &[
                "portable_workspace_checkpoint",
                "stable_process_memory_checkpoint",
            ],
            Some(
                "Pre-created Volume v2 Session subpath mounted at /workspace, synced before \
                 detach, compute recreated over it; memory preview is not claimed as a \
                 checkpoint.",
            ),
        ),
        managed_row(
            "superserve",
            BOTH,
            Supported,
            &[RetainedRuntime],
            Durable,
            &[
                "stable_name_and_ownership_metadata",
                "pause_resume_preserves_processes_and_files",
                "transparent_token_rotation_and_auto_resume",
                "duplex_process",
                "workspace_file_io",
                "deny_by_default_network_policy",
                "provider_side_secret_proxy_and_audit",
            ],
            &[
                "portable_workspace_checkpoint",
                "stable_process_memory_checkpoint",
            ],
            Some(
                "Official SDK pause/resume, token-rotating reconnect, full-duplex commands, \
                 provider-side secret substitution, strict egress, owner-validated idempotent \
                 deletion.",
            ),
        ),
    ]
}

/// A fixed-width text table of the key columns, one row per provider, for `omabox catalog`.
pub fn render_table(rows: &[ManagedRuntimeProviderConformance]) -> String {
    fn join<T: Serialize>(values: &[T]) -> String {
        let labels: Vec<String> = values
            .iter()
            .map(|value| match serde_json::to_value(value) {
                Ok(serde_json::Value::String(label)) => label,
                Ok(other) => other.to_string(),
                Err(_) => String::from("?"),
            })
            .collect();
        if labels.is_empty() {
            String::from("-")
        } else {
            labels.join(",")
        }
    }
    fn label<T: Serialize>(value: &T) -> String {
        join(std::slice::from_ref(value))
    }

    let header = [
        "PROVIDER",
        "STATUS",
        "LANES",
        "LEASE",
        "SUSPEND",
        "TERMINATE",
        "ORPHANS",
        "WORKSPACE",
        "WS-DURABILITY",
        "OUTPUTS",
        "OUT-DURABILITY",
        "CHECKPOINTS",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|cell| (*cell).to_owned()).collect()];
    for row in rows {
        table.push(vec![
            row.id.clone(),
            label(&row.status),
            join(&row.driver_lanes),
            label(&row.lifecycle.lease),
            label(&row.lifecycle.suspend_resume),
            label(&row.lifecycle.hard_terminate),
            label(&row.lifecycle.orphan_reap),
            join(&row.workspace.strategies),
            label(&row.workspace.durability),
            join(&row.outputs.strategies),
            label(&row.outputs.durability),
            join(&row.runtime_checkpoints),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            table
                .iter()
                .map(|cells| cells[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in &table {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_with_camel_case_keys_and_exact_literals() {
        let row = get_managed_runtime_provider_conformance("litebox").unwrap();
        let json = serde_json::to_value(row).unwrap();
        assert_eq!(json["managedRuntime"], true);
        assert_eq!(json["status"], "managed-runtime");
        assert_eq!(
            json["driverLanes"],
            serde_json::json!(["ama_worker", "openma_supervised"])
        );
        assert_eq!(
            json["lifecycle"],
            serde_json::json!({
                "lease": "host-fenced",
                "suspendResume": "supported",
                "hardTerminate": "supported",
                "orphanReap": "host-managed",
            })
        );
        assert_eq!(
            json["workspace"],
            serde_json::json!({"strategies": ["retained_runtime"], "durability": "best_effort"})
        );
        assert_eq!(
            json["outputs"],
            serde_json::json!({"strategies": ["final_collect"], "durability": "durable"})
        );
        assert_eq!(json["runtimeCheckpoints"], serde_json::json!([]));
        assert!(json["sandboxPortFacts"]["available"].is_array());
        assert!(json["reason"].is_string());
        let node =
            serde_json::to_value(get_managed_runtime_provider_conformance("node-docker").unwrap())
                .unwrap();
        assert!(node.get("reason").is_none(), "absent reason stays absent");
    }

    #[test]
    fn json_round_trips_every_row() {
        let json = serde_json::to_string(&*MANAGED_RUNTIME_PROVIDER_CONFORMANCE).unwrap();
        let back: Vec<ManagedRuntimeProviderConformance> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, *MANAGED_RUNTIME_PROVIDER_CONFORMANCE);
    }

    #[test]
    fn extend_appends_after_the_openma_rows_and_refuses_duplicates() {
        let mut catalog = ConformanceCatalog::openma();
        let mut local = catalog.get("node-docker").unwrap().clone();
        local.id = "local".into();
        local.status = ConformanceStatus::SandboxPortOnly;
        local.managed_runtime = false;
        catalog.extend([local]).unwrap();
        assert_eq!(catalog.rows().len(), 13);
        assert_eq!(catalog.rows()[12].id, "local");
        assert_eq!(catalog.rows()[..12], openma_rows()[..]);
        assert_eq!(
            catalog.require("local").unwrap_err().message(),
            "local is not a managed runtime provider"
        );
        let duplicate = catalog.get("e2b").unwrap().clone();
        assert_eq!(
            catalog.extend([duplicate]).unwrap_err().message(),
            "Duplicate managed runtime provider: e2b"
        );
        assert_eq!(catalog.rows().len(), 13);
        assert_eq!(
            catalog.get("nope").unwrap_err().message(),
            "Unknown managed runtime provider: nope"
        );
    }

    #[test]
    fn table_has_a_header_and_one_aligned_line_per_row() {
        let table = render_table(&MANAGED_RUNTIME_PROVIDER_CONFORMANCE);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 13);
        assert!(lines[0].starts_with("PROVIDER"));
        assert!(lines[1].starts_with("node-docker"));
        assert!(lines[1].contains("ama_worker,openma_supervised"));
        assert!(lines[3].starts_with("cloudflare-bridge"));
        let status_column = lines[0].find("STATUS").unwrap();
        for line in &lines[1..] {
            assert_eq!(&line[status_column..status_column + 15], "managed-runtime");
        }
    }

    #[test]
    fn the_omabox_catalog_appends_linux_and_local_after_the_openma_rows() {
        let catalog = ConformanceCatalog::omabox();
        let ids: Vec<&str> = catalog.rows().iter().map(|row| row.id.as_str()).collect();
        assert_eq!(ids.len(), 14);
        assert_eq!(&ids[12..], ["linux", "local"]);
        assert_eq!(catalog.rows()[..12], openma_rows()[..]);
        for id in ["linux", "local"] {
            let row = catalog.require(id).unwrap();
            assert_eq!(
                row.lifecycle.suspend_resume,
                CatalogSuspendResume::Unsupported
            );
            assert!(row.runtime_checkpoints.is_empty());
        }
    }
}
