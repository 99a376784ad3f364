//! `DefaultSandboxOrchestrator`: provider-agnostic provisioning of a session sandbox.
//!
//! It wires vault outbound context, workspace backup context and restore, memory mounts and
//! the Session outputs mount by probing capabilities; it never branches on a provider name.
//!
//! `provision` order (OpenMA `packages/sandbox/src/orchestrator.ts`):
//!
//! 1. outbound context: failure is a warning (outbound TLS through the vault may not work);
//! 2. backup context when an environment id is given and the managed workspace lifecycle is
//!    supported (failure fails provisioning); then, when `restoreOnWarm` and a backups
//!    service is configured, restore the explicit handle or the latest backup: any failure
//!    is a warning and the session proceeds with an empty workspace;
//! 3. memory mounts, in order: the first failure fails provisioning with
//!    `"mountMemoryStore <name> failed: <msg>"`;
//! 4. the Session outputs mount when asked and supported: failure is a warning.
//!
//! Deviations from the TypeScript original, made because a silent skip hides a
//! misconfiguration: a backups-service lookup or restore that *throws* is a warning like
//! `ok: false` (the reference describes restore failure as "warn and continue empty"), and
//! requested mounts the sandbox cannot provide are reported as warnings instead of being
//! skipped silently.

use crate::port::{
    MemoryMountRequest, OutboundContext, SandboxPort, SessionOutputMountRequest,
    WorkspaceBackupHandle, WorkspaceRestoreResult,
};
use crate::probe::{supports_session_output_mount, supports_workspace_backup};
use async_trait::async_trait;
use omabox_contract::PortError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// What a sandbox can do for provisioning, as data (routes gate session creation on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCapabilities {
    /// Memory mounts are available (read-only enforcement is the backend's documented
    /// behaviour; there is no finer probe).
    pub enforce_read_only_memory: bool,
    /// The Session outputs mount is supported.
    pub has_session_outputs: bool,
    /// Vault outbound wiring is available.
    pub has_vault_outbound: bool,
    /// A backups service is configured and the sandbox can back up natively or read bytes.
    pub has_workspace_backup: bool,
}

/// `{sessionId, tenantId}`: who a backup belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupOwner {
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
}

/// Durable workspace backups kept by the host (for example tarballs in a blob store).
#[async_trait]
pub trait WorkspaceBackupService: Send + Sync {
    /// Snapshots the sandbox's workspace; `None` when this provider cannot be backed up.
    async fn snapshot(
        &self,
        owner: &BackupOwner,
        sandbox: &dyn SandboxPort,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError>;

    /// Restores `handle` into the sandbox's `/workspace` before the first exec. A missing,
    /// expired or corrupt backup is `ok: false`.
    async fn restore(
        &self,
        owner: &BackupOwner,
        sandbox: &dyn SandboxPort,
        handle: &WorkspaceBackupHandle,
    ) -> Result<WorkspaceRestoreResult, PortError>;

    /// The session's latest backup, if any.
    async fn latest(&self, owner: &BackupOwner)
    -> Result<Option<WorkspaceBackupHandle>, PortError>;
}

/// `backup` of [`ProvisionInput`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionBackup {
    /// Restore before the first exec.
    pub restore_on_warm: bool,
    /// Restore this handle instead of looking up the latest backup.
    pub handle: Option<WorkspaceBackupHandle>,
}

/// `{sessionId, tenantId, environmentId?, memoryMounts?, mountOutputs?, backup?}`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionInput {
    /// Session.
    pub session_id: String,
    /// Tenant.
    pub tenant_id: String,
    /// Environment, for per-environment backups.
    pub environment_id: Option<String>,
    /// Memory stores to mount at `/mnt/memory/<storeName>/`.
    pub memory_mounts: Vec<MemoryMountRequest>,
    /// Mount `/mnt/session/outputs/`.
    pub mount_outputs: bool,
    /// Backup restore settings.
    pub backup: Option<ProvisionBackup>,
}

/// The non-fatal problems met while provisioning, in order (each was also logged).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProvisionReport {
    /// Human-readable warnings.
    pub warnings: Vec<String>,
}

impl ProvisionReport {
    fn warn(&mut self, message: String) {
        tracing::warn!(target: "omabox_sandbox::orchestrator", "{message}");
        self.warnings.push(message);
    }
}

/// The default orchestrator: provider-agnostic plumbing only.
#[derive(Clone, Default)]
pub struct DefaultSandboxOrchestrator {
    backups: Option<Arc<dyn WorkspaceBackupService>>,
}

impl fmt::Debug for DefaultSandboxOrchestrator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DefaultSandboxOrchestrator")
            .field("backups", &self.backups.is_some())
            .finish()
    }
}

impl DefaultSandboxOrchestrator {
    /// An orchestrator with an optional backups service.
    pub fn new(backups: Option<Arc<dyn WorkspaceBackupService>>) -> Self {
        Self { backups }
    }

    /// Probes what provisioning can do on `sandbox`.
    pub fn capabilities(&self, sandbox: &dyn SandboxPort) -> SandboxCapabilities {
        SandboxCapabilities {
            enforce_read_only_memory: sandbox.as_memory_mount().is_some(),
            has_session_outputs: supports_session_output_mount(sandbox),
            has_vault_outbound: sandbox.as_outbound_context().is_some(),
            has_workspace_backup: self.backups.is_some()
                && (supports_workspace_backup(sandbox) || sandbox.as_file_bytes().is_some()),
        }
    }

    /// Wires a fresh sandbox before the first message reaches the harness. See the module
    /// doc for the order and which failures are fatal.
    pub async fn provision(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
    ) -> Result<ProvisionReport, PortError> {
        let mut report = ProvisionReport::default();
        self.set_outbound_context(sandbox, input, &mut report).await;
        self.set_backup_context(sandbox, input).await?;
        self.restore_on_warm(sandbox, input, &mut report).await;
        self.mount_memory_stores(sandbox, input, &mut report)
            .await?;
        self.mount_session_outputs(sandbox, input, &mut report)
            .await;
        Ok(report)
    }

    async fn set_outbound_context(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
        report: &mut ProvisionReport,
    ) {
        let Some(outbound) = sandbox.as_outbound_context() else {
            return;
        };
        let context = OutboundContext {
            tenant_id: input.tenant_id.clone(),
            session_id: input.session_id.clone(),
        };
        if let Err(error) = outbound.set_outbound_context(context).await {
            report.warn(format!(
                "[sandbox-orchestrator] setOutboundContext failed: {} — outbound TLS through \
                 oma-vault may not work",
                error.message()
            ));
        }
    }

    async fn set_backup_context(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
    ) -> Result<(), PortError> {
        let (Some(environment_id), Some(lifecycle)) = (
            input.environment_id.as_ref(),
            sandbox.as_managed_workspace_lifecycle(),
        ) else {
            return Ok(());
        };
        lifecycle
            .set_backup_context(crate::port::BackupContext {
                tenant_id: input.tenant_id.clone(),
                environment_id: environment_id.clone(),
                session_id: input.session_id.clone(),
            })
            .await
    }

    async fn restore_on_warm(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
        report: &mut ProvisionReport,
    ) {
        let (Some(backup), Some(backups)) = (input.backup.as_ref(), self.backups.as_ref()) else {
            return;
        };
        if !backup.restore_on_warm {
            return;
        }
        let owner = BackupOwner {
            session_id: input.session_id.clone(),
            tenant_id: input.tenant_id.clone(),
        };
        let handle = match &backup.handle {
            Some(handle) => handle.clone(),
            None => match backups.latest(&owner).await {
                Ok(Some(handle)) => handle,
                Ok(None) => return,
                Err(error) => {
                    report.warn(format!(
                        "[sandbox-orchestrator] restore failed ({}) — proceeding with empty \
                         workspace",
                        error.message()
                    ));
                    return;
                }
            },
        };
        let failure = match backups.restore(&owner, sandbox, &handle).await {
            Ok(WorkspaceRestoreResult { ok: true, .. }) => return,
            Ok(WorkspaceRestoreResult { error, .. }) => {
                error.unwrap_or_else(|| "unknown".to_owned())
            }
            Err(error) => error.message().to_owned(),
        };
        report.warn(format!(
            "[sandbox-orchestrator] restore failed ({failure}) — proceeding with empty workspace"
        ));
    }

    async fn mount_memory_stores(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
        report: &mut ProvisionReport,
    ) -> Result<(), PortError> {
        if input.memory_mounts.is_empty() {
            return Ok(());
        }
        let Some(memory) = sandbox.as_memory_mount() else {
            report.warn(format!(
                "[sandbox-orchestrator] {} memory mount(s) requested but this sandbox cannot \
                 mount memory stores; skipped",
                input.memory_mounts.len()
            ));
            return Ok(());
        };
        for mount in &input.memory_mounts {
            memory
                .mount_memory_store(mount.clone())
                .await
                .map_err(|error| {
                    PortError::with_kind(
                        error.kind(),
                        format!(
                            "mountMemoryStore {} failed: {}",
                            mount.store_name,
                            error.message()
                        ),
                    )
                })?;
        }
        Ok(())
    }

    async fn mount_session_outputs(
        &self,
        sandbox: &dyn SandboxPort,
        input: &ProvisionInput,
        report: &mut ProvisionReport,
    ) {
        if !input.mount_outputs {
            return;
        }
        let mount = sandbox
            .as_session_output_mount()
            .filter(|_| supports_session_output_mount(sandbox));
        let Some(mount) = mount else {
            report.warn(
                "[sandbox-orchestrator] Session outputs mount requested but this sandbox does \
                 not support it; skipped"
                    .to_owned(),
            );
            return;
        };
        let request = SessionOutputMountRequest {
            tenant_id: input.tenant_id.clone(),
            session_id: input.session_id.clone(),
        };
        if let Err(error) = mount.mount_session_outputs(request).await {
            report.warn(format!(
                "[sandbox-orchestrator] mountSessionOutputs failed: {}",
                error.message()
            ));
        }
    }

    /// Snapshots the workspace: the adapter's own snapshot when it manages its workspace
    /// (returns `None`: the adapter recorded the backup itself), else the backups service,
    /// else `None`. An adapter snapshot failure is logged and falls back to the service.
    pub async fn snapshot_workspace_now(
        &self,
        sandbox: &dyn SandboxPort,
        owner: &BackupOwner,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
        if let Some(lifecycle) = sandbox.as_managed_workspace_lifecycle() {
            match lifecycle.snapshot_workspace_now().await {
                Ok(()) => return Ok(None),
                Err(error) => tracing::warn!(
                    target: "omabox_sandbox::orchestrator",
                    "[sandbox-orchestrator] adapter snapshotWorkspaceNow failed: {}",
                    error.message()
                ),
            }
        }
        match &self.backups {
            Some(backups) => backups.snapshot(owner, sandbox).await,
            None => Ok(None),
        }
    }

    /// Tells a sleepy sandbox it is still in use; nothing when it has no such hook.
    pub async fn renew_activity_timeout(&self, sandbox: &dyn SandboxPort) -> Result<(), PortError> {
        match sandbox.as_activity_timeout() {
            Some(activity) => activity.renew_activity_timeout().await,
            None => Ok(()),
        }
    }
}
