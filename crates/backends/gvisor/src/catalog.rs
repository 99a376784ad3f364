//! The `gvisor` row of the conformance catalog: what this backend claims under the managed
//! runtime host. Data here, next to the provider it describes (the host may not name a
//! backend); the testkit checks it against the live driver
//! (`testkit/tests/omabox_catalog.rs`).

use crate::PROVIDER;
use omabox_contract::HarnessDriverType::{AmaWorker, OpenmaSupervised};
use omabox_contract::RuntimeCheckpointKind;
use omabox_contract::WorkspaceStrategy::{CheckpointRestore, Ephemeral};
use omabox_contract::catalog::{
    CatalogDurability, CatalogSuspendResume, ManagedRuntimeProviderConformance, managed_runtime_row,
};

/// This backend's catalog row.
pub fn conformance_row() -> ManagedRuntimeProviderConformance {
    let mut row = managed_runtime_row(
        PROVIDER,
        &[AmaWorker, OpenmaSupervised],
        CatalogSuspendResume::Unsupported,
        &[CheckpointRestore, Ephemeral],
        CatalogDurability::Durable,
        &[
            "gvisor_isolation",
            "agent_as_init",
            "duplex_process",
            "workspace_file_io",
            "workspace_file_bytes",
            "host_directory_workspace_bind",
            "content_addressed_workspace_checkpoint",
            "dead_host_directory_reap",
            "network_egress_policy",
            "credential_egress_https",
            "image_root_in_memory_overlay",
            "process_memory_checkpoint",
        ],
        &[
            "provider_suspend_resume",
            "credential_egress_http_tcp",
            "pids_limit",
        ],
        Some(
            "Sandboxes under gVisor's runsc (ptrace platform; omabox's agent as the \
             container's process over its stdio), the host's /usr read-only under a \
             generated /etc, or an image's rootfs under a writable overlay in the sandbox's \
             memory; attach only from the creating process. Networking \
             none/limited/unrestricted and the gateway: enforced by name on the host (DNS \
             stub and relay bound in the sandbox's own network namespace, runsc with \
             --network host inside it); credential egress enforced for HTTPS when the \
             driver is given rules, as on linux. Process runtime checkpoints: the next run \
             of a work item restores the previous run's processes and memory (runsc \
             checkpoint/restore; consumed once, expired after a day); the lease itself \
             does not suspend.",
        ),
    );
    row.runtime_checkpoints = vec![RuntimeCheckpointKind::Process];
    row
}
