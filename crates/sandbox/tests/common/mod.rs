//! A hand-written recording sandbox with per-capability switches and fault injection.
#![allow(dead_code)]

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Shared call log; tests wait for an entry instead of sleeping.
#[derive(Debug, Clone, Default)]
pub struct Log {
    entries: Arc<Mutex<Vec<String>>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Log {
    pub fn push(&self, entry: impl Into<String>) {
        self.entries.lock().unwrap().push(entry.into());
        self.changed.notify_waiters();
    }
    pub fn entries(&self) -> Vec<String> {
        self.entries.lock().unwrap().clone()
    }
    /// Resolves once an entry satisfies `found` (at once if one already does).
    pub async fn wait_until(&self, found: impl Fn(&str) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the check, so a push between check and await is not missed.
            changed.as_mut().enable();
            if self.entries().iter().any(|entry| found(entry)) {
                return;
            }
            changed.await;
        }
    }
    pub fn names(&self) -> Vec<String> {
        self.entries()
            .into_iter()
            .map(|entry| entry.split(' ').next().unwrap_or_default().to_owned())
            .collect()
    }
}

/// Which optional capabilities the fake exposes.
#[derive(Debug, Clone, Default)]
pub struct Caps {
    pub duplex: bool,
    pub process: bool,
    pub file_bytes: bool,
    pub env_vars: bool,
    pub command_secrets: bool,
    pub outbound: bool,
    pub memory: bool,
    /// `Some(None)`: the mount is present but reports null capabilities.
    pub outputs: Option<Option<SessionOutputMountCapabilities>>,
    pub backup: bool,
    pub lifecycle: bool,
    pub destroy: bool,
    pub activity: bool,
    pub runtime: bool,
}

impl Caps {
    pub fn all() -> Self {
        Self {
            duplex: true,
            process: true,
            file_bytes: true,
            env_vars: true,
            command_secrets: true,
            outbound: true,
            memory: true,
            outputs: Some(Some(SessionOutputMountCapabilities {
                durability: SessionOutputMountDurability::Durable,
            })),
            backup: true,
            lifecycle: true,
            destroy: true,
            activity: true,
            runtime: true,
        }
    }
}

#[derive(Debug, Default)]
pub struct FakeSandbox {
    pub caps: Caps,
    pub log: Log,
    /// Method names that fail with "<name> boom".
    pub failures: Mutex<BTreeSet<String>>,
    /// Method names whose call never completes.
    pub hangs: Mutex<BTreeSet<String>>,
}

impl FakeSandbox {
    pub fn new(caps: Caps) -> Self {
        Self {
            caps,
            ..Self::default()
        }
    }

    pub fn failing(self, name: &str) -> Self {
        self.failures.lock().unwrap().insert(name.to_owned());
        self
    }

    pub fn hanging(self, name: &str) -> Self {
        self.hangs.lock().unwrap().insert(name.to_owned());
        self
    }

    async fn call(&self, name: &str, detail: impl std::fmt::Display) -> Result<(), PortError> {
        let detail = detail.to_string();
        if detail.is_empty() {
            self.log.push(name);
        } else {
            self.log.push(format!("{name} {detail}"));
        }
        if self.hangs.lock().unwrap().contains(name) {
            std::future::pending::<()>().await;
        }
        if self.failures.lock().unwrap().contains(name) {
            return Err(PortError::new(format!("{name} boom")));
        }
        Ok(())
    }
}

#[async_trait]
impl SandboxPort for FakeSandbox {
    async fn exec(&self, command: &str, _timeout_ms: Option<u64>) -> Result<String, PortError> {
        self.call("exec", command).await?;
        Ok(format!("ran {command}"))
    }
    async fn read_file(&self, path: &str) -> Result<String, PortError> {
        self.call("readFile", path).await?;
        Ok(String::new())
    }
    async fn write_file(&self, path: &str, _content: &str) -> Result<String, PortError> {
        self.call("writeFile", path).await?;
        Ok(path.to_owned())
    }
    fn as_duplex_process(&self) -> Option<&dyn SandboxDuplexProcessPort> {
        self.caps.duplex.then_some(self as _)
    }
    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        self.caps.process.then_some(self as _)
    }
    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        self.caps.file_bytes.then_some(self as _)
    }
    fn as_env_vars(&self) -> Option<&dyn SandboxEnvVarsPort> {
        self.caps.env_vars.then_some(self as _)
    }
    fn as_command_secrets(&self) -> Option<&dyn SandboxCommandSecretsPort> {
        self.caps.command_secrets.then_some(self as _)
    }
    fn as_outbound_context(&self) -> Option<&dyn SandboxOutboundContextPort> {
        self.caps.outbound.then_some(self as _)
    }
    fn as_memory_mount(&self) -> Option<&dyn SandboxMemoryMountPort> {
        self.caps.memory.then_some(self as _)
    }
    fn as_session_output_mount(&self) -> Option<&dyn SandboxSessionOutputMountPort> {
        self.caps.outputs.is_some().then_some(self as _)
    }
    fn as_workspace_backup(&self) -> Option<&dyn SandboxWorkspaceBackupPort> {
        self.caps.backup.then_some(self as _)
    }
    fn as_managed_workspace_lifecycle(&self) -> Option<&dyn SandboxManagedWorkspaceLifecyclePort> {
        self.caps.lifecycle.then_some(self as _)
    }
    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        self.caps.destroy.then_some(self as _)
    }
    fn as_activity_timeout(&self) -> Option<&dyn SandboxActivityTimeoutPort> {
        self.caps.activity.then_some(self as _)
    }
    fn as_runtime(&self) -> Option<&dyn SandboxRuntimePort> {
        self.caps.runtime.then_some(self as _)
    }
}

#[async_trait]
impl SandboxDuplexProcessPort for FakeSandbox {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        self.call("spawnDuplexProcess", &spec.command).await?;
        Err(PortError::new("fake has no real processes"))
    }
}

/// A background process that records kills.
pub struct FakeProcess {
    pub log: Log,
}

#[async_trait]
impl SandboxProcessControl for FakeProcess {
    async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError> {
        self.log.push(format!("kill {}", signal.as_str()));
        Ok(())
    }
    async fn logs(&self) -> Result<ProcessLogs, PortError> {
        Ok(ProcessLogs::default())
    }
    async fn status(&self) -> Result<ProcessStatus, PortError> {
        Ok(ProcessStatus::Running)
    }
}

#[async_trait]
impl SandboxProcessPort for FakeSandbox {
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError> {
        self.call("startProcess", command).await?;
        Ok(ProcessHandle::new(
            "proc_1",
            1,
            Arc::new(FakeProcess {
                log: self.log.clone(),
            }),
        ))
    }
}

#[async_trait]
impl SandboxFileBytesPort for FakeSandbox {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        self.call("readFileBytes", path).await?;
        Ok(Vec::new())
    }
    async fn write_file_bytes(&self, path: &str, _bytes: &[u8]) -> Result<String, PortError> {
        self.call("writeFileBytes", path).await?;
        Ok(path.to_owned())
    }
}

#[async_trait]
impl SandboxEnvVarsPort for FakeSandbox {
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError> {
        self.call(
            "setEnvVars",
            vars.keys().cloned().collect::<Vec<_>>().join(","),
        )
        .await
    }
}

impl SandboxCommandSecretsPort for FakeSandbox {
    fn register_command_secrets(&self, command_prefix: &str, _secrets: BTreeMap<String, String>) {
        self.log
            .push(format!("registerCommandSecrets {command_prefix}"));
    }
}

#[async_trait]
impl SandboxOutboundContextPort for FakeSandbox {
    async fn set_outbound_context(&self, context: OutboundContext) -> Result<(), PortError> {
        self.call(
            "setOutboundContext",
            format!("{}/{}", context.tenant_id, context.session_id),
        )
        .await
    }
}

#[async_trait]
impl SandboxMemoryMountPort for FakeSandbox {
    async fn mount_memory_store(&self, request: MemoryMountRequest) -> Result<(), PortError> {
        let name = format!("mountMemoryStore:{}", request.store_name);
        self.log.push(format!(
            "mountMemoryStore {} {} ro={}",
            request.store_name, request.store_id, request.read_only
        ));
        if self.failures.lock().unwrap().contains(&name) {
            return Err(PortError::new("disk on fire"));
        }
        Ok(())
    }
}

#[async_trait]
impl SandboxSessionOutputMountPort for FakeSandbox {
    fn session_output_mount_capabilities(&self) -> Option<SessionOutputMountCapabilities> {
        self.caps.outputs.flatten()
    }
    async fn mount_session_outputs(
        &self,
        request: SessionOutputMountRequest,
    ) -> Result<(), PortError> {
        self.call(
            "mountSessionOutputs",
            format!("{}/{}", request.tenant_id, request.session_id),
        )
        .await
    }
}

#[async_trait]
impl SandboxWorkspaceBackupPort for FakeSandbox {
    async fn create_workspace_backup(
        &self,
        request: WorkspaceBackupRequest,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
        self.call("createWorkspaceBackup", request.ttl_sec).await?;
        Ok(None)
    }
    async fn restore_workspace_backup(
        &self,
        handle: WorkspaceBackupHandle,
    ) -> Result<WorkspaceRestoreResult, PortError> {
        self.call("restoreWorkspaceBackup", &handle.id).await?;
        Ok(WorkspaceRestoreResult {
            ok: true,
            error: None,
        })
    }
}

#[async_trait]
impl SandboxManagedWorkspaceLifecyclePort for FakeSandbox {
    async fn set_backup_context(&self, context: BackupContext) -> Result<(), PortError> {
        self.call(
            "setBackupContext",
            format!(
                "{}/{}/{}",
                context.tenant_id, context.environment_id, context.session_id
            ),
        )
        .await
    }
    async fn snapshot_workspace_now(&self) -> Result<(), PortError> {
        self.call("snapshotWorkspaceNow", "").await
    }
}

#[async_trait]
impl SandboxDestroyPort for FakeSandbox {
    async fn destroy(&self) -> Result<(), PortError> {
        self.call("destroy", "").await
    }
}

#[async_trait]
impl SandboxActivityTimeoutPort for FakeSandbox {
    async fn renew_activity_timeout(&self) -> Result<(), PortError> {
        self.call("renewActivityTimeout", "").await
    }
}

#[async_trait]
impl SandboxRuntimePort for FakeSandbox {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        self.log.push("runtimeHandle");
        SandboxRuntimeHandle {
            provider: "fake".into(),
            runtime_id: "rt-1".into(),
        }
    }
    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities {
        self.log.push("runtimeCapabilities");
        SandboxRuntimeCapabilities {
            lease: true,
            suspend: vec![SandboxCheckpointKind::Filesystem],
            checkpoint: vec![],
        }
    }
    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError> {
        self.call("status", "").await?;
        Ok(SandboxRuntimeStatus::Running)
    }
    async fn renew_lease(&self, ttl_ms: u64) -> Result<(), PortError> {
        self.call("renewLease", ttl_ms).await
    }
    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        self.call("suspend", "").await?;
        Ok(SandboxCheckpointHandle {
            provider: "fake".into(),
            checkpoint_id: "cp".into(),
            source_runtime_id: "rt-1".into(),
            kind,
            scope: SandboxCheckpointScope::Runtime,
            metadata: None,
        })
    }
    async fn resume(&self, _handle: &SandboxCheckpointHandle) -> Result<(), PortError> {
        self.call("resume", "").await
    }
    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        _name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        self.call("checkpoint", "").await?;
        Ok(SandboxCheckpointHandle {
            provider: "fake".into(),
            checkpoint_id: "cp".into(),
            source_runtime_id: "rt-1".into(),
            kind,
            scope: SandboxCheckpointScope::Portable,
            metadata: None,
        })
    }
}
