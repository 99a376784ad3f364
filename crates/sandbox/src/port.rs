//! `SandboxPort` and its optional capability ports.
//!
//! The required surface is three calls: [`SandboxPort::exec`], [`SandboxPort::read_file`] and
//! [`SandboxPort::write_file`]. Everything else the TypeScript port marks optional (`method?`)
//! is a separate trait here, reached through an `as_*` accessor on [`SandboxPort`] whose
//! default is `None`. A backend opts into a capability by implementing the trait *completely*
//! and overriding the accessor to return `Some(self)`; half a capability cannot be expressed
//! (the TypeScript guards have to check that both `createWorkspaceBackup` and
//! `restoreWorkspaceBackup` exist; here the trait has both or the accessor is `None`).
//!
//! A capability a backend cannot honestly provide stays `None`. A capability method that
//! always fails with "unsupported" is a contract violation: hosts treat `Some` as "works".

use crate::process::{SandboxDuplexProcessPort, SandboxProcessPort};
use crate::runtime::SandboxRuntimePort;
use async_trait::async_trait;
use omabox_contract::PortError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The tool sandbox: a place where the harness's tools run commands and touch files.
///
/// Paths are sandbox paths (`/workspace/...`, `/mnt/session/outputs/...`); how they map to
/// storage is the backend's business.
#[async_trait]
pub trait SandboxPort: Send + Sync {
    /// Runs `command` through the sandbox's shell and returns its combined output.
    ///
    /// Output convention (shared by every backend, parsed by harness tools): stdout, then
    /// `"\n" + stderr` when stderr is non-empty, trailing whitespace trimmed; when the command
    /// did not exit with status 0 a final line `"\n[exit <n>]"` is appended. (The local
    /// subprocess adapter writes `"[exit exit=<n>]"` or `"[exit signal=<SIG>]"` there; readers
    /// match on the `[exit ` prefix.) A non-zero exit is *output*, not an error: `Err` means
    /// the sandbox could not run the command at all.
    ///
    /// `timeout_ms` bounds the command; `None` means the backend's default.
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError>;

    /// Reads a UTF-8 text file.
    async fn read_file(&self, path: &str) -> Result<String, PortError>;

    /// Writes a UTF-8 text file, creating parent directories, and returns the resolved path.
    async fn write_file(&self, path: &str, content: &str) -> Result<String, PortError>;

    /// Live processes with streaming stdin/stdout/stderr (`spawnDuplexProcess`).
    fn as_duplex_process(&self) -> Option<&dyn SandboxDuplexProcessPort> {
        None
    }

    /// Background processes with logs and status (`startProcess`).
    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        None
    }

    /// Binary-safe file access (`readFileBytes` / `writeFileBytes`).
    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        None
    }

    /// Environment variables merged into every later exec (`setEnvVars`).
    fn as_env_vars(&self) -> Option<&dyn SandboxEnvVarsPort> {
        None
    }

    /// Secrets injected only into commands with a given prefix (`registerCommandSecrets`).
    fn as_command_secrets(&self) -> Option<&dyn SandboxCommandSecretsPort> {
        None
    }

    /// Vault outbound proxy wiring (`setOutboundContext`).
    fn as_outbound_context(&self) -> Option<&dyn SandboxOutboundContextPort> {
        None
    }

    /// Memory store mounts at `/mnt/memory/<storeName>/` (`mountMemoryStore`).
    fn as_memory_mount(&self) -> Option<&dyn SandboxMemoryMountPort> {
        None
    }

    /// The Session outputs mount at `/mnt/session/outputs/` (`mountSessionOutputs`).
    fn as_session_output_mount(&self) -> Option<&dyn SandboxSessionOutputMountPort> {
        None
    }

    /// Provider-native workspace backup and restore.
    fn as_workspace_backup(&self) -> Option<&dyn SandboxWorkspaceBackupPort> {
        None
    }

    /// Host-managed workspace lifecycle (`setBackupContext` + `snapshotWorkspaceNow`).
    fn as_managed_workspace_lifecycle(&self) -> Option<&dyn SandboxManagedWorkspaceLifecyclePort> {
        None
    }

    /// Explicit teardown (`destroy`).
    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        None
    }

    /// The older keep-alive hook (`renewActivityTimeout`).
    fn as_activity_timeout(&self) -> Option<&dyn SandboxActivityTimeoutPort> {
        None
    }

    /// Runtime lifecycle: lease, status, suspend, resume, checkpoint.
    fn as_runtime(&self) -> Option<&dyn SandboxRuntimePort> {
        None
    }
}

/// Binary-safe file access.
#[async_trait]
pub trait SandboxFileBytesPort: Send + Sync {
    /// Reads a file's exact bytes.
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError>;

    /// Writes exact bytes, creating parent directories; returns the resolved path.
    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError>;
}

/// Environment variables for later execs.
#[async_trait]
pub trait SandboxEnvVarsPort: Send + Sync {
    /// Merges `vars` into the environment of every later exec and process (later calls win
    /// per key).
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError>;
}

/// Per-command secrets.
pub trait SandboxCommandSecretsPort: Send + Sync {
    /// Registers `secrets` as environment variables for commands whose text starts with
    /// `command_prefix`. Synchronous and local: it never reaches provider state, so the
    /// execution guard lets it through.
    fn register_command_secrets(&self, command_prefix: &str, secrets: BTreeMap<String, String>);
}

/// `{tenantId, sessionId}` for the vault outbound proxy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OutboundContext {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
}

/// Vault outbound wiring.
#[async_trait]
pub trait SandboxOutboundContextPort: Send + Sync {
    /// Installs the outbound proxy for this tenant and session. A backend with no vault
    /// configured treats this as a no-op.
    async fn set_outbound_context(&self, context: OutboundContext) -> Result<(), PortError>;
}

/// `{storeName, storeId, readOnly}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryMountRequest {
    /// Name under `/mnt/memory/`.
    pub store_name: String,
    /// The memory store's id.
    pub store_id: String,
    /// Whether writes must be refused.
    pub read_only: bool,
}

/// Memory store mounts.
#[async_trait]
pub trait SandboxMemoryMountPort: Send + Sync {
    /// Binds a memory store at `/mnt/memory/<storeName>/`.
    async fn mount_memory_store(&self, request: MemoryMountRequest) -> Result<(), PortError>;
}

/// `{tenantId, sessionId}` scoping the outputs mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionOutputMountRequest {
    /// Tenant.
    pub tenant_id: String,
    /// Session.
    pub session_id: String,
}

/// How durable the outputs mount is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionOutputMountDurability {
    /// Writes reach durable storage.
    Durable,
}

/// `{durability: "durable"}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOutputMountCapabilities {
    /// Durability.
    pub durability: SessionOutputMountDurability,
}

/// The Session outputs mount.
#[async_trait]
pub trait SandboxSessionOutputMountPort: Send + Sync {
    /// What the mount guarantees, or `None` when it is not configured on this instance (for
    /// example no outputs root). `None` means the mount is unsupported, whatever
    /// [`mount_session_outputs`](Self::mount_session_outputs) would do. Pure: the execution
    /// guard lets it through.
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities>;

    /// Mounts `/mnt/session/outputs/` for this tenant and session.
    async fn mount_session_outputs(
        &self,
        request: SessionOutputMountRequest,
    ) -> Result<(), PortError>;
}

/// `{name?, ttlSec}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceBackupRequest {
    /// Optional backup name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Retention in seconds.
    pub ttl_sec: u64,
}

/// `{id, dir, localBucket?}`: a provider backup, opaque to callers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceBackupHandle {
    /// Backup id; its format is the provider's.
    pub id: String,
    /// The directory that was backed up (provider hint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<String>,
    /// Provider hint (Cloudflare: the backup lives in a local bucket).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_bucket: Option<bool>,
}

/// `{ok, error?}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkspaceRestoreResult {
    /// True when the workspace now holds the backup.
    pub ok: bool,
    /// Why not, when `ok` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Provider-native workspace backup. Both halves or neither.
#[async_trait]
pub trait SandboxWorkspaceBackupPort: Send + Sync {
    /// Backs up the workspace; `None` when there was nothing the provider could back up.
    async fn create_workspace_backup(
        &self,
        request: WorkspaceBackupRequest,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError>;

    /// Restores a backup made by the same provider. A missing, expired or corrupt backup is
    /// `ok: false`, not an error.
    async fn restore_workspace_backup(
        &self,
        handle: WorkspaceBackupHandle,
    ) -> Result<WorkspaceRestoreResult, PortError>;
}

/// `{tenantId, environmentId, sessionId}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupContext {
    /// Tenant.
    pub tenant_id: String,
    /// Environment (backups are scoped per environment).
    pub environment_id: String,
    /// Session.
    pub session_id: String,
}

/// A workspace whose backups the provider manages itself. Both halves or neither.
#[async_trait]
pub trait SandboxManagedWorkspaceLifecyclePort: Send + Sync {
    /// Tells the provider where this workspace's backups belong. Called before the first exec.
    async fn set_backup_context(&self, context: BackupContext) -> Result<(), PortError>;

    /// Snapshots the workspace now; the provider records the backup itself.
    async fn snapshot_workspace_now(&self) -> Result<(), PortError>;
}

/// Explicit teardown.
#[async_trait]
pub trait SandboxDestroyPort: Send + Sync {
    /// Kills everything the sandbox started and releases its resources. Idempotent.
    async fn destroy(&self) -> Result<(), PortError>;
}

/// The older keep-alive hook.
#[async_trait]
pub trait SandboxActivityTimeoutPort: Send + Sync {
    /// Resets the provider's idle timer.
    async fn renew_activity_timeout(&self) -> Result<(), PortError>;
}
