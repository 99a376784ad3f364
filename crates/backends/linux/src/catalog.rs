//! The `linux` row of the conformance catalog: what this backend claims under the managed
//! runtime host. It is data here, next to the provider it describes, because the host may not name a backend.
//!
//! The testkit checks the claim against the live driver (`testkit/tests/omabox_catalog.rs`):
//! lanes, workspace strategies, outputs, suspend/resume and runtime checkpoints must equal
//! what the driver's descriptor and ports report.

use crate::managed::LINUX_PROVIDER;
use omabox_contract::HarnessDriverType::{AmaWorker, OpenmaSupervised};
use omabox_contract::WorkspaceStrategy::{CheckpointRestore, Ephemeral};
use omabox_contract::catalog::{
    CatalogDurability, CatalogSuspendResume, ManagedRuntimeProviderConformance, managed_runtime_row,
};

/// This backend's catalog row.
pub fn conformance_row() -> ManagedRuntimeProviderConformance {
    managed_runtime_row(
        LINUX_PROVIDER,
        &[AmaWorker, OpenmaSupervised],
        CatalogSuspendResume::Unsupported,
        &[CheckpointRestore, Ephemeral],
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
            "network_egress_policy",
            "credential_egress_https",
        ],
        &[
            "provider_suspend_resume",
            "process_memory_checkpoint",
            "credential_egress_http_tcp",
        ],
        Some(
            "omabox's namespace sandbox with its agent as PID 1; /workspace and \
             /mnt/session/outputs are host directories bound from the persistence ports; \
             leases carry the serialized sandbox identity so a fresh process can reap them; \
             networking none/limited/unrestricted is enforced by name on the host (DNS stub \
             and relay bound in the sandbox's routeless namespace); credential egress is \
             enforced for HTTPS when the driver is given rules (omabox run --credential): \
             TLS terminated with a per-binding CA, vault secrets injected on the host.",
        ),
    )
}
