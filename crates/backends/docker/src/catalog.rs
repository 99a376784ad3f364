//! The `docker` row of the conformance catalog: what this backend claims under the managed
//! runtime host. Data here, next to the provider it describes (the host may not name a
//! backend); the testkit checks it against the live driver
//! (`testkit/tests/omabox_catalog.rs`).

use crate::port::PROVIDER;
use omabox_contract::HarnessDriverType::{AmaWorker, OpenmaSupervised};
use omabox_contract::WorkspaceStrategy::{CheckpointRestore, Ephemeral};
use omabox_contract::catalog::{
    CatalogDurability, CatalogSuspendResume, ManagedRuntimeProviderConformance, managed_runtime_row,
};

/// This backend's catalog row.
pub fn conformance_row() -> ManagedRuntimeProviderConformance {
    managed_runtime_row(
        PROVIDER,
        &[AmaWorker, OpenmaSupervised],
        CatalogSuspendResume::Unsupported,
        &[CheckpointRestore, Ephemeral],
        CatalogDurability::Durable,
        &[
            "container_isolation",
            "agent_as_init",
            "duplex_process",
            "workspace_file_io",
            "workspace_file_bytes",
            "host_directory_workspace_bind",
            "content_addressed_workspace_checkpoint",
            "container_name_reap",
            "dead_host_label_reap",
            "network_egress_policy",
            "credential_egress_https",
        ],
        &[
            "provider_suspend_resume",
            "process_memory_checkpoint",
            "network_egress_policy_remote_engine",
            "credential_egress_http_tcp",
            "user_namespace",
        ],
        Some(
            "Containers of the Docker Engine at DOCKER_HOST (omabox-agent as PID 1); attach \
             only from the creating process. Networking none/limited/unrestricted and the \
             gateway: enforced by name on the host (DNS stub and relay bound in the \
             container's own network-none namespace), for a local engine only (a remote one \
             refuses any config but none); credential egress enforced for HTTPS when the \
             driver is given rules (omabox run --credential), as on linux.",
        ),
    )
}
