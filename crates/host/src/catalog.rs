//! The conformance catalog: which provider compositions run under the managed runtime host,
//! and what each one guarantees, as data.
//!
//! [`openma_rows`] holds the twelve rows of OpenMA's `MANAGED_RUNTIME_PROVIDER_CONFORMANCE`
//! in their original order and with their original values (the free-text reasons are
//! paraphrased). The row type is the contract's (`omabox_contract::catalog`); omabox's own
//! backends' rows live in their crates (the host may not name a backend) and the binary
//! appends them with [`ConformanceCatalog::extend`], which refuses a duplicate id, so the
//! OpenMA rows are never edited in place. [`ConformanceCatalog`] is the one lookup API; the
//! reference's free functions look up the OpenMA catalog through it.
//!
//! A row is a claim that tests hold a backend to: the catalog row, the driver descriptor and
//! the live ports are checked against each other. Nothing here is inferred from generic
//! sandbox capabilities.

pub use omabox_contract::catalog::{
    CatalogDurability, CatalogHardTerminate, CatalogLease, CatalogLifecycle, CatalogOrphanReap,
    CatalogOutputStrategy, CatalogOutputs, CatalogSuspendResume, CatalogWorkspace,
    ConformanceStatus, ManagedRuntimeProviderConformance, SandboxPortFacts, managed_runtime_row,
};
use omabox_contract::{HarnessDriverType, PortError, WorkspaceStrategy};
use std::sync::LazyLock;

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

/// A catalog reads as its rows, in order (as the TypeScript array does).
impl std::ops::Deref for ConformanceCatalog {
    type Target = [ManagedRuntimeProviderConformance];

    fn deref(&self) -> &Self::Target {
        &self.rows
    }
}

/// `MANAGED_RUNTIME_PROVIDER_CONFORMANCE`: the twelve OpenMA rows, in order.
pub static MANAGED_RUNTIME_PROVIDER_CONFORMANCE: LazyLock<ConformanceCatalog> =
    LazyLock::new(ConformanceCatalog::openma);

/// `getManagedRuntimeProviderConformance`: [`ConformanceCatalog::get`] on the OpenMA rows.
pub fn get_managed_runtime_provider_conformance(
    id: &str,
) -> Result<&'static ManagedRuntimeProviderConformance, PortError> {
    MANAGED_RUNTIME_PROVIDER_CONFORMANCE.get(id)
}

/// `requireManagedRuntimeProvider`: [`ConformanceCatalog::require`] on the OpenMA rows.
pub fn require_managed_runtime_provider(
    id: &str,
) -> Result<&'static ManagedRuntimeProviderConformance, PortError> {
    MANAGED_RUNTIME_PROVIDER_CONFORMANCE.require(id)
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
        managed_runtime_row(
            "node-docker",
            BOTH,
            Unsupported,
            &[CheckpointRestore],
            Durable,
            &["duplex_process", "workspace_file_io"],
            &["provider_suspend_resume"],
            None,
        ),
        managed_runtime_row(
            "cloudflare",
            BOTH,
            Unsupported,
            &[CheckpointRestore],
            Durable,
            &["duplex_process", "workspace_backup", "session_output_mount"],
            &["runtime_scoped_resume", "process_memory_checkpoint"],
            None,
        ),
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        managed_runtime_row(
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
        let json = serde_json::to_string(MANAGED_RUNTIME_PROVIDER_CONFORMANCE.rows()).unwrap();
        let back: Vec<ManagedRuntimeProviderConformance> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, MANAGED_RUNTIME_PROVIDER_CONFORMANCE.rows());
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
}
