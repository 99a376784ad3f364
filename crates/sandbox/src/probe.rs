//! The `supports*` guards: presence probes over a sandbox's optional capabilities.
//!
//! A host must use these (or the `as_*` accessors) before calling an optional capability,
//! and must never treat an absent capability as success.
//!
//! Half a capability cannot be expressed. The TypeScript guard `supportsWorkspaceBackup`
//! rejects an object with only `createWorkspaceBackup`; in Rust such a port does not compile:
//!
//! ```compile_fail
//! use omabox_sandbox::*;
//! struct CreateOnly;
//! #[async_trait::async_trait]
//! impl SandboxWorkspaceBackupPort for CreateOnly {
//!     async fn create_workspace_backup(
//!         &self,
//!         _: WorkspaceBackupRequest,
//!     ) -> Result<Option<WorkspaceBackupHandle>, omabox_contract::PortError> {
//!         Ok(None)
//!     }
//! }
//! ```
//!
//! With both halves it does, and the probe sees it:
//!
//! ```
//! use omabox_sandbox::*;
//! use omabox_contract::PortError;
//! struct Backups;
//! #[async_trait::async_trait]
//! impl SandboxWorkspaceBackupPort for Backups {
//!     async fn create_workspace_backup(
//!         &self,
//!         _: WorkspaceBackupRequest,
//!     ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
//!         Ok(None)
//!     }
//!     async fn restore_workspace_backup(
//!         &self,
//!         _: WorkspaceBackupHandle,
//!     ) -> Result<WorkspaceRestoreResult, PortError> {
//!         Ok(WorkspaceRestoreResult { ok: true, error: None })
//!     }
//! }
//! #[async_trait::async_trait]
//! impl SandboxPort for Backups {
//!     async fn exec(&self, _: &str, _: Option<u64>) -> Result<String, PortError> { Ok(String::new()) }
//!     async fn read_file(&self, _: &str) -> Result<String, PortError> { Ok(String::new()) }
//!     async fn write_file(&self, p: &str, _: &str) -> Result<String, PortError> { Ok(p.into()) }
//!     fn as_workspace_backup(&self) -> Option<&dyn SandboxWorkspaceBackupPort> { Some(self) }
//! }
//! assert!(supports_workspace_backup(&Backups));
//! ```
//!
//! Likewise a managed workspace lifecycle without `snapshot_workspace_now`, or a Session
//! outputs mount without `session_output_mount_capabilities`:
//!
//! ```compile_fail
//! use omabox_sandbox::*;
//! struct ContextOnly;
//! #[async_trait::async_trait]
//! impl SandboxManagedWorkspaceLifecyclePort for ContextOnly {
//!     async fn set_backup_context(&self, _: BackupContext) -> Result<(), omabox_contract::PortError> {
//!         Ok(())
//!     }
//! }
//! ```
//!
//! ```compile_fail
//! use omabox_sandbox::*;
//! struct MountOnly;
//! #[async_trait::async_trait]
//! impl SandboxSessionOutputMountPort for MountOnly {
//!     async fn mount_session_outputs(
//!         &self,
//!         _: SessionOutputMountRequest,
//!     ) -> Result<(), omabox_contract::PortError> {
//!         Ok(())
//!     }
//! }
//! ```

use crate::port::SandboxPort;

/// `supportsDuplexProcess`: live stdio processes are available.
pub fn supports_duplex_process<S: SandboxPort + ?Sized>(sandbox: &S) -> bool {
    sandbox.as_duplex_process().is_some()
}

/// `supportsSandboxRuntime`: the runtime lifecycle port is available.
pub fn supports_sandbox_runtime<S: SandboxPort + ?Sized>(sandbox: &S) -> bool {
    sandbox.as_runtime().is_some()
}

/// `supportsWorkspaceBackup`: both create and restore are available (the trait carries both,
/// so presence of the port is presence of both).
pub fn supports_workspace_backup<S: SandboxPort + ?Sized>(sandbox: &S) -> bool {
    sandbox.as_workspace_backup().is_some()
}

/// `supportsManagedWorkspaceLifecycle`: both `set_backup_context` and
/// `snapshot_workspace_now` are available.
pub fn supports_managed_workspace_lifecycle<S: SandboxPort + ?Sized>(sandbox: &S) -> bool {
    sandbox.as_managed_workspace_lifecycle().is_some()
}

/// `supportsSessionOutputMount`: the mount is present *and* this instance reports non-null
/// mount capabilities.
pub fn supports_session_output_mount<S: SandboxPort + ?Sized>(sandbox: &S) -> bool {
    sandbox
        .as_session_output_mount()
        .and_then(|mount| mount.session_output_mount_capabilities())
        .is_some()
}
