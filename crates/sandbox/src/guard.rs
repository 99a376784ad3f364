//! `withSandboxExecutionGuard`: bind a sandbox to its parent execution's authority.
//!
//! Every call that can reach provider state is checked before *and* after the provider call,
//! and races the abort signal: a result that arrives after the fence was lost is never
//! handed to the caller. Exempt (pure or local): `runtime_handle`, `runtime_capabilities`,
//! `status`, `session_output_mount_capabilities`, `register_command_secrets`, and the `as_*`
//! capability accessors. Background processes started through the guard are sent `SIGTERM`
//! when the signal aborts (while the guard is alive), so a stale handle cannot keep mutating
//! the workspace.
//!
//! Starting a process (background or duplex) is not raced against the abort, because dropping
//! a half-finished start could leave a process running with no handle; a process whose start
//! is fenced by the after-check is killed before the error is returned.
//!
//! The guard exposes exactly the capabilities of the sandbox it wraps.

use crate::port::*;
use crate::process::{
    DuplexKillSignal, ProcessHandle, ProcessSignal, SandboxDuplexProcess, SandboxDuplexProcessPort,
    SandboxDuplexProcessSpec, SandboxProcessPort,
};
use crate::runtime::{
    SandboxCheckpointHandle, SandboxCheckpointKind, SandboxRuntimeCapabilities,
    SandboxRuntimeHandle, SandboxRuntimePort, SandboxRuntimeStatus,
};
use async_trait::async_trait;
use omabox_contract::{AbortSignal, PortError};
use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use tokio_util::sync::{CancellationToken, DropGuard};

const FENCED: &str = "sandbox execution fence is no longer valid";
const ABORTED: &str = "sandbox execution was aborted";

/// `SandboxExecutionFencedError`: the execution this sandbox was bound to lost its authority.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SandboxExecutionFencedError {
    message: String,
}

impl SandboxExecutionFencedError {
    /// The default: "sandbox execution fence is no longer valid".
    pub fn invalid() -> Self {
        Self {
            message: FENCED.to_owned(),
        }
    }

    fn aborted(signal: &AbortSignal) -> Self {
        let message = signal
            .reason()
            .map(|reason| reason.message().to_owned())
            .filter(|message| !message.is_empty())
            .unwrap_or_else(|| ABORTED.to_owned());
        Self { message }
    }
}

impl From<SandboxExecutionFencedError> for PortError {
    fn from(error: SandboxExecutionFencedError) -> Self {
        PortError::new(error.message)
    }
}

/// `{signal?, isValid?}`: the authority a guarded sandbox checks.
#[derive(Clone, Default)]
pub struct SandboxExecutionGuardOptions {
    /// Aborts every pending and later call.
    pub signal: Option<AbortSignal>,
    /// A fast validity check (lease expiry, revocation); `false` fences the call.
    pub is_valid: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl fmt::Debug for SandboxExecutionGuardOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxExecutionGuardOptions")
            .field("signal", &self.signal)
            .field("is_valid", &self.is_valid.is_some())
            .finish()
    }
}

/// A sandbox wrapped by an execution guard.
pub struct SandboxExecutionGuard {
    inner: Arc<dyn SandboxPort>,
    options: SandboxExecutionGuardOptions,
    // Cancelled when the guard is dropped, so process watchers never outlive it.
    watchers: CancellationToken,
    _stop_watchers: DropGuard,
}

impl fmt::Debug for SandboxExecutionGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SandboxExecutionGuard")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Wraps `sandbox` so every provider call checks `options`.
pub fn with_sandbox_execution_guard(
    sandbox: Arc<dyn SandboxPort>,
    options: SandboxExecutionGuardOptions,
) -> SandboxExecutionGuard {
    SandboxExecutionGuard::new(sandbox, options)
}

impl SandboxExecutionGuard {
    /// Wraps `sandbox` so every provider call checks `options`.
    pub fn new(sandbox: Arc<dyn SandboxPort>, options: SandboxExecutionGuardOptions) -> Self {
        let watchers = CancellationToken::new();
        Self {
            inner: sandbox,
            options,
            _stop_watchers: watchers.clone().drop_guard(),
            watchers,
        }
    }

    /// The wrapped sandbox (unguarded).
    pub fn inner(&self) -> &Arc<dyn SandboxPort> {
        &self.inner
    }

    fn assert_valid(&self) -> Result<(), PortError> {
        if let Some(signal) = &self.options.signal
            && signal.is_aborted()
        {
            return Err(SandboxExecutionFencedError::aborted(signal).into());
        }
        if let Some(is_valid) = &self.options.is_valid
            && !is_valid()
        {
            return Err(SandboxExecutionFencedError::invalid().into());
        }
        Ok(())
    }

    async fn invoke<T>(
        &self,
        operation: impl Future<Output = Result<T, PortError>>,
    ) -> Result<T, PortError> {
        self.assert_valid()?;
        let result = match &self.options.signal {
            None => operation.await,
            Some(signal) => {
                tokio::select! {
                    biased;
                    _ = signal.token().cancelled() => {
                        Err(SandboxExecutionFencedError::aborted(signal).into())
                    }
                    result = operation => result,
                }
            }
        }?;
        self.assert_valid()?;
        Ok(result)
    }

    fn capability_gone(name: &str) -> PortError {
        PortError::new(format!(
            "sandbox capability {name} disappeared after it was probed"
        ))
    }

    fn kill_on_abort(&self, handle: &ProcessHandle) {
        let Some(signal) = self.options.signal.clone() else {
            return;
        };
        let handle = handle.clone();
        let watchers = self.watchers.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = signal.token().cancelled() => {
                    let _ = handle.kill(ProcessSignal::Term).await;
                }
                () = watchers.cancelled() => {}
            }
        });
    }
}

#[async_trait]
impl SandboxPort for SandboxExecutionGuard {
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError> {
        self.invoke(self.inner.exec(command, timeout_ms)).await
    }

    async fn read_file(&self, path: &str) -> Result<String, PortError> {
        self.invoke(self.inner.read_file(path)).await
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<String, PortError> {
        self.invoke(self.inner.write_file(path, content)).await
    }

    fn as_duplex_process(&self) -> Option<&dyn SandboxDuplexProcessPort> {
        self.inner.as_duplex_process().map(|_| self as _)
    }

    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        self.inner.as_process().map(|_| self as _)
    }

    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        self.inner.as_file_bytes().map(|_| self as _)
    }

    fn as_env_vars(&self) -> Option<&dyn SandboxEnvVarsPort> {
        self.inner.as_env_vars().map(|_| self as _)
    }

    fn as_command_secrets(&self) -> Option<&dyn SandboxCommandSecretsPort> {
        // Local registration only: passed through unguarded.
        self.inner.as_command_secrets()
    }

    fn as_outbound_context(&self) -> Option<&dyn SandboxOutboundContextPort> {
        self.inner.as_outbound_context().map(|_| self as _)
    }

    fn as_memory_mount(&self) -> Option<&dyn SandboxMemoryMountPort> {
        self.inner.as_memory_mount().map(|_| self as _)
    }

    fn as_session_output_mount(&self) -> Option<&dyn SandboxSessionOutputMountPort> {
        self.inner.as_session_output_mount().map(|_| self as _)
    }

    fn as_workspace_backup(&self) -> Option<&dyn SandboxWorkspaceBackupPort> {
        self.inner.as_workspace_backup().map(|_| self as _)
    }

    fn as_managed_workspace_lifecycle(&self) -> Option<&dyn SandboxManagedWorkspaceLifecyclePort> {
        self.inner
            .as_managed_workspace_lifecycle()
            .map(|_| self as _)
    }

    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        self.inner.as_destroy().map(|_| self as _)
    }

    fn as_activity_timeout(&self) -> Option<&dyn SandboxActivityTimeoutPort> {
        self.inner.as_activity_timeout().map(|_| self as _)
    }

    fn as_runtime(&self) -> Option<&dyn SandboxRuntimePort> {
        self.inner.as_runtime().map(|_| self as _)
    }
}

#[async_trait]
impl SandboxDuplexProcessPort for SandboxExecutionGuard {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        let port = self
            .inner
            .as_duplex_process()
            .ok_or_else(|| Self::capability_gone("spawnDuplexProcess"))?;
        self.assert_valid()?;
        let process = port.spawn_duplex_process(spec).await?;
        if let Err(error) = self.assert_valid() {
            // The caller never sees this process: do not leave it running.
            let _ = process.kill(DuplexKillSignal::Kill).await;
            return Err(error);
        }
        Ok(process)
    }
}

#[async_trait]
impl SandboxProcessPort for SandboxExecutionGuard {
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError> {
        let port = self
            .inner
            .as_process()
            .ok_or_else(|| Self::capability_gone("startProcess"))?;
        // Not raced against the abort: dropping a half-finished start could leave a process
        // running with no handle. A process whose result is fenced is killed instead.
        self.assert_valid()?;
        let handle = port.start_process(command).await?;
        self.kill_on_abort(&handle);
        if let Err(error) = self.assert_valid() {
            let _ = handle.kill(ProcessSignal::Term).await;
            return Err(error);
        }
        Ok(handle)
    }
}

#[async_trait]
impl SandboxFileBytesPort for SandboxExecutionGuard {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        let port = self
            .inner
            .as_file_bytes()
            .ok_or_else(|| Self::capability_gone("readFileBytes"))?;
        self.invoke(port.read_file_bytes(path)).await
    }

    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError> {
        let port = self
            .inner
            .as_file_bytes()
            .ok_or_else(|| Self::capability_gone("writeFileBytes"))?;
        self.invoke(port.write_file_bytes(path, bytes)).await
    }
}

#[async_trait]
impl SandboxEnvVarsPort for SandboxExecutionGuard {
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError> {
        let port = self
            .inner
            .as_env_vars()
            .ok_or_else(|| Self::capability_gone("setEnvVars"))?;
        self.invoke(port.set_env_vars(vars)).await
    }
}

#[async_trait]
impl SandboxOutboundContextPort for SandboxExecutionGuard {
    async fn set_outbound_context(&self, context: OutboundContext) -> Result<(), PortError> {
        let port = self
            .inner
            .as_outbound_context()
            .ok_or_else(|| Self::capability_gone("setOutboundContext"))?;
        self.invoke(port.set_outbound_context(context)).await
    }
}

#[async_trait]
impl SandboxMemoryMountPort for SandboxExecutionGuard {
    async fn mount_memory_store(&self, request: MemoryMountRequest) -> Result<(), PortError> {
        let port = self
            .inner
            .as_memory_mount()
            .ok_or_else(|| Self::capability_gone("mountMemoryStore"))?;
        self.invoke(port.mount_memory_store(request)).await
    }
}

#[async_trait]
impl SandboxSessionOutputMountPort for SandboxExecutionGuard {
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities> {
        self.inner
            .as_session_output_mount()
            .and_then(|port| port.session_output_mount_capabilities())
    }

    async fn mount_session_outputs(
        &self,
        request: SessionOutputMountRequest,
    ) -> Result<(), PortError> {
        let port = self
            .inner
            .as_session_output_mount()
            .ok_or_else(|| Self::capability_gone("mountSessionOutputs"))?;
        self.invoke(port.mount_session_outputs(request)).await
    }
}

#[async_trait]
impl SandboxWorkspaceBackupPort for SandboxExecutionGuard {
    async fn create_workspace_backup(
        &self,
        request: WorkspaceBackupRequest,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
        let port = self
            .inner
            .as_workspace_backup()
            .ok_or_else(|| Self::capability_gone("createWorkspaceBackup"))?;
        self.invoke(port.create_workspace_backup(request)).await
    }

    async fn restore_workspace_backup(
        &self,
        handle: WorkspaceBackupHandle,
    ) -> Result<WorkspaceRestoreResult, PortError> {
        let port = self
            .inner
            .as_workspace_backup()
            .ok_or_else(|| Self::capability_gone("restoreWorkspaceBackup"))?;
        self.invoke(port.restore_workspace_backup(handle)).await
    }
}

#[async_trait]
impl SandboxManagedWorkspaceLifecyclePort for SandboxExecutionGuard {
    async fn set_backup_context(&self, context: BackupContext) -> Result<(), PortError> {
        let port = self
            .inner
            .as_managed_workspace_lifecycle()
            .ok_or_else(|| Self::capability_gone("setBackupContext"))?;
        self.invoke(port.set_backup_context(context)).await
    }

    async fn snapshot_workspace_now(&self) -> Result<(), PortError> {
        let port = self
            .inner
            .as_managed_workspace_lifecycle()
            .ok_or_else(|| Self::capability_gone("snapshotWorkspaceNow"))?;
        self.invoke(port.snapshot_workspace_now()).await
    }
}

#[async_trait]
impl SandboxDestroyPort for SandboxExecutionGuard {
    async fn destroy(&self) -> Result<(), PortError> {
        let port = self
            .inner
            .as_destroy()
            .ok_or_else(|| Self::capability_gone("destroy"))?;
        self.invoke(port.destroy()).await
    }
}

#[async_trait]
impl SandboxActivityTimeoutPort for SandboxExecutionGuard {
    async fn renew_activity_timeout(&self) -> Result<(), PortError> {
        let port = self
            .inner
            .as_activity_timeout()
            .ok_or_else(|| Self::capability_gone("renewActivityTimeout"))?;
        self.invoke(port.renew_activity_timeout()).await
    }
}

#[async_trait]
impl SandboxRuntimePort for SandboxExecutionGuard {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        match self.inner.as_runtime() {
            Some(runtime) => runtime.runtime_handle(),
            // Unreachable through `as_runtime`, which is `None` in this case.
            None => SandboxRuntimeHandle {
                provider: String::new(),
                runtime_id: String::new(),
            },
        }
    }

    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities {
        self.inner
            .as_runtime()
            .map(|runtime| runtime.runtime_capabilities())
            .unwrap_or_default()
    }

    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError> {
        let port = self
            .inner
            .as_runtime()
            .ok_or_else(|| Self::capability_gone("status"))?;
        port.status().await
    }

    async fn renew_lease(&self, ttl_ms: u64) -> Result<(), PortError> {
        let port = self
            .inner
            .as_runtime()
            .ok_or_else(|| Self::capability_gone("renewLease"))?;
        self.invoke(port.renew_lease(ttl_ms)).await
    }

    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        let port = self
            .inner
            .as_runtime()
            .ok_or_else(|| Self::capability_gone("suspend"))?;
        self.invoke(port.suspend(kind)).await
    }

    async fn resume(&self, handle: &SandboxCheckpointHandle) -> Result<(), PortError> {
        let port = self
            .inner
            .as_runtime()
            .ok_or_else(|| Self::capability_gone("resume"))?;
        self.invoke(port.resume(handle)).await
    }

    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        let port = self
            .inner
            .as_runtime()
            .ok_or_else(|| Self::capability_gone("checkpoint"))?;
        self.invoke(port.checkpoint(kind, name)).await
    }
}
