//! The `local` row of the conformance catalog: what this backend claims under the managed
//! runtime host. It is data here, next to the provider it describes, because the host may not name a backend.
//!
//! The testkit checks the claim against the live driver (`testkit/tests/omabox_catalog.rs`):
//! lanes, workspace strategies, outputs, suspend/resume and runtime checkpoints must equal
//! what the driver's descriptor and ports report.

use crate::managed::LOCAL_PROVIDER;
use omabox_contract::HarnessDriverType::{AmaWorker, OpenmaSupervised};
use omabox_contract::WorkspaceStrategy::{CheckpointRestore, Ephemeral};
use omabox_contract::catalog::{
    CatalogDurability, CatalogSuspendResume, ManagedRuntimeProviderConformance, managed_runtime_row,
};

/// This backend's catalog row.
pub fn conformance_row() -> ManagedRuntimeProviderConformance {
    managed_runtime_row(
        LOCAL_PROVIDER,
        &[AmaWorker, OpenmaSupervised],
        CatalogSuspendResume::Unsupported,
        &[CheckpointRestore, Ephemeral],
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
    )
}
