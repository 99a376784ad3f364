//! [`ProviderManagedRuntime`]: `ManagedSandboxPort` over a [`ManagedSandboxProvider`].
//!
//! ```text
//!   acquire: throwIfAborted ─► provider.create ─► readiness probe (marker) ─► lease
//!                                   └── any failure after create: destroy + reap (best
//!                                       effort), then the ORIGINAL error
//!   heartbeat: terminated | unknown | error | status ≠ running ─► lost, else alive
//!   terminate / reap: once per runtime id (destroy the live handle, then provider.reap)
//!   inspect:   terminated ─► stopped; provider.status; any error ─► unknown
//! ```
//!
//! The live tool sandboxes stay in this value (a map from runtime id); the lease carries only
//! `{provider, runtimeId, metadata}` with the provider's non-secret identity data, so
//! `reap` works from a serialized lease in a fresh process.
//!
//! Not implemented (and not advertised): suspend/resume. `process` runtime checkpoints are
//! advertised when the provider captures processes; the port is `checkpoint.rs`'s, which
//! restores through [`ProviderManagedRuntime::admit`] as acquire does. Credential
//! egress is the provider's own port, composed by the driver
//! (`ProviderManagedRuntimeDriver::with_credential_egress`); without one, an acquire that
//! carries a binding is refused. `sandbox_active_seconds` is not recorded yet: the place for it is
//! [`ProviderManagedRuntime::destroy`] (the one path terminate and reap share), once the
//! runtime observes a start it can carry in the lease.

use super::provider::{
    AcquisitionContext, HOST_PATH_METADATA_KEY, ManagedSandboxProvider, ProvidedSandbox,
};
use crate::port::SandboxPort;
use crate::readiness::{DEFAULT_READINESS_TIMEOUT, verify_runtime_environment};
use crate::runtime::SandboxRuntimeStatus;
use async_trait::async_trait;
use omabox_contract::MetaValue;
use omabox_contract::{
    AbortSignal, AcquireSandboxInput, HardTerminate, ManagedRuntimePlan, ManagedSandboxLease,
    ManagedSandboxPort, Meta, PortError, RuntimeCheckpointKind, RuntimeResourceFence,
    RuntimeResourceScope, SandboxHeartbeatResult, SandboxObservation, SandboxResourceCapabilities,
    SandboxState, SessionOutputBinding, SuspendResume, TerminationReason, UsageKind,
    UsageLedgerPort, UsageRecord, WorkspaceBinding,
};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Lease metadata key: when acquire observed the runtime start (ms since the epoch). Read back
/// at terminate/reap, possibly by another process, to record `sandbox_active_seconds`.
pub const STARTED_AT_METADATA_KEY: &str = "omabox.startedAtMs";

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// JS `toISOString` of a millisecond timestamp.
fn iso_ms(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|at| {
            at.format(time::macros::format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
            ))
            .ok()
        })
        .unwrap_or_default()
}

/// Options of a [`ProviderManagedRuntime`].
#[derive(Clone)]
pub struct ProviderManagedRuntimeOptions {
    /// The backend.
    pub provider: Arc<dyn ManagedSandboxProvider>,
    /// How long the readiness probe may take (default 10 s).
    pub readiness_timeout: Duration,
}

impl ProviderManagedRuntimeOptions {
    /// Options with the default readiness timeout.
    pub fn new(provider: Arc<dyn ManagedSandboxProvider>) -> Self {
        Self {
            provider,
            readiness_timeout: DEFAULT_READINESS_TIMEOUT,
        }
    }
}

impl std::fmt::Debug for ProviderManagedRuntimeOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderManagedRuntimeOptions")
            .field("provider", &self.provider.name())
            .field("readiness_timeout", &self.readiness_timeout)
            .finish()
    }
}

#[derive(Default)]
struct RuntimeTable {
    live: HashMap<String, Arc<dyn SandboxPort>>,
    terminated: HashSet<String>,
}

/// When a runtime's usage interval ends.
#[derive(Debug, Clone, Copy)]
enum Stop {
    /// Now: it was running until this teardown.
    Now,
    /// It was found already stopped: at its last sign of life when known, else now.
    Estimated(Option<u64>),
}

/// The managed compute lifecycle over a provider of tool sandboxes.
pub struct ProviderManagedRuntime {
    provider: Arc<dyn ManagedSandboxProvider>,
    readiness_timeout: Duration,
    table: Mutex<RuntimeTable>,
    usage: OnceLock<Arc<dyn UsageLedgerPort>>,
    credential_egress: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for ProviderManagedRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let table = self.table();
        f.debug_struct("ProviderManagedRuntime")
            .field("provider", &self.provider.name())
            .field("live", &table.live.keys().collect::<Vec<_>>())
            .field("terminated", &table.terminated.len())
            .finish()
    }
}

/// The `hostPath` a binding's metadata names.
fn host_path(metadata: Option<&Meta>) -> Option<PathBuf> {
    metadata
        .and_then(|meta| meta.get(HOST_PATH_METADATA_KEY))
        .and_then(|value| value.as_str())
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
}

impl ProviderManagedRuntime {
    /// A runtime over `options.provider`.
    pub fn new(options: ProviderManagedRuntimeOptions) -> Self {
        Self {
            provider: options.provider,
            readiness_timeout: options.readiness_timeout,
            table: Mutex::new(RuntimeTable::default()),
            usage: OnceLock::new(),
            credential_egress: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Accepts acquires that carry a credential egress binding: the driver composed an
    /// egress port that attaches it after the acquire.
    pub fn accept_credential_egress(&self) {
        self.credential_egress
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Records `sandbox_active_seconds` into `ledger` whenever terminate or reap stops a
    /// runtime whose lease carries its observed start (a runtime found already dead gets
    /// omabox's `sandbox_active_seconds_estimated` instead: its stop is not observed). Set it only for providers whose
    /// terminate/reap really stop the runtime (the contract: "emitted only if the backend
    /// actually records a start and stop"). A second call is ignored.
    pub fn record_usage_into(&self, ledger: Arc<dyn UsageLedgerPort>) {
        let _ = self.usage.set(ledger);
    }

    /// How a runtime this process does not hold (a reap of a crashed host's lease) stopped:
    /// still running means it stops now; already stopped means the stop is an estimate — the
    /// provider's last sign of life, or now as an upper bound.
    async fn observed_stop(&self, lease: &ManagedSandboxLease) -> Stop {
        match self.provider.status(lease).await {
            Ok(SandboxRuntimeStatus::Stopped) => {
                Stop::Estimated(self.provider.last_alive_ms(lease).await)
            }
            _ => Stop::Now,
        }
    }

    /// Best effort: a ledger failure is logged and never fails or delays teardown further.
    async fn record_active_seconds(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        stop: Stop,
    ) {
        let Some(ledger) = self.usage.get() else {
            return;
        };
        let started_ms = lease
            .metadata
            .as_ref()
            .and_then(|meta| meta.get(STARTED_AT_METADATA_KEY))
            .and_then(|value| match value {
                MetaValue::Number(number) => number.as_u64(),
                _ => None,
            });
        let Some(started_ms) = started_ms else {
            return;
        };
        let now = now_ms();
        let (stopped_ms, stop_estimated) = match stop {
            Stop::Now => (now, false),
            Stop::Estimated(last_alive) => (
                last_alive.map_or(now, |last| last.clamp(started_ms, now)),
                true,
            ),
        };
        let record = UsageRecord {
            // A guessed stop is never the contract's kind (which must then stay absent).
            kind: if stop_estimated {
                UsageKind::SandboxActiveSecondsEstimated
            } else {
                UsageKind::SandboxActiveSeconds
            },
            scope: scope.clone(),
            provider: lease.provider.clone(),
            runtime_id: lease.runtime_id.clone(),
            seconds: UsageRecord::seconds_between(started_ms, stopped_ms),
            started_at: iso_ms(started_ms),
            stopped_at: iso_ms(stopped_ms),
            stop_estimated,
        };
        if let Err(error) = ledger.record_usage(record).await {
            tracing::warn!(provider = %lease.provider, runtime = %lease.runtime_id, %error, "recording sandbox_active_seconds failed");
        }
    }

    /// The provider id.
    pub fn provider_name(&self) -> &str {
        self.provider.name()
    }

    /// The provider.
    pub fn provider(&self) -> &Arc<dyn ManagedSandboxProvider> {
        &self.provider
    }

    fn table(&self) -> MutexGuard<'_, RuntimeTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails with "Incompatible sandbox lease provider: <p>" for another provider's lease.
    pub fn check_provider(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        if lease.provider != self.provider.name() || lease.runtime_id.is_empty() {
            return Err(PortError::new(format!(
                "Incompatible sandbox lease provider: {}",
                lease.provider
            )));
        }
        Ok(())
    }

    /// The live tool sandbox of `lease`: this runtime's handle, or the provider's
    /// reconnection. Fails for another provider's lease and for a terminated runtime.
    pub async fn sandbox(
        &self,
        lease: &ManagedSandboxLease,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        self.check_provider(lease)?;
        {
            let table = self.table();
            if table.terminated.contains(&lease.runtime_id) {
                return Err(PortError::new(format!(
                    "{} runtime {} was terminated",
                    self.provider.name(),
                    lease.runtime_id
                )));
            }
            if let Some(sandbox) = table.live.get(&lease.runtime_id) {
                return Ok(Arc::clone(sandbox));
            }
        }
        let sandbox = self.provider.attach(lease).await?;
        self.table()
            .live
            .insert(lease.runtime_id.clone(), Arc::clone(&sandbox));
        Ok(sandbox)
    }

    fn acquisition(&self, input: &AcquireSandboxInput) -> Result<AcquisitionContext, PortError> {
        if input.credential_egress.is_some()
            && !self
                .credential_egress
                .load(std::sync::atomic::Ordering::SeqCst)
        {
            return Err(PortError::capability(format!(
                "{} does not support credential egress",
                self.provider.name()
            )));
        }
        self.bind(
            &input.scope,
            input.fence.generation,
            &input.plan,
            &input.workspace,
            input.outputs.as_ref(),
            &input.signal,
        )
    }

    /// The acquisition context of a runtime binding `workspace` and `outputs` (host
    /// directory bindings only).
    pub(crate) fn bind(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        plan: &ManagedRuntimePlan,
        workspace: &WorkspaceBinding,
        outputs: Option<&SessionOutputBinding>,
        signal: &AbortSignal,
    ) -> Result<AcquisitionContext, PortError> {
        let workspace_host_path = host_path(workspace.metadata.as_ref()).ok_or_else(|| {
            PortError::new(format!(
                "{} binds host directories only: workspace binding {} has no hostPath",
                self.provider.name(),
                workspace.binding_id
            ))
        })?;
        let outputs_host_path = match outputs {
            None => None,
            Some(outputs) => Some(host_path(outputs.metadata.as_ref()).ok_or_else(|| {
                PortError::new(format!(
                    "{} binds host directories only: outputs binding {} has no hostPath",
                    self.provider.name(),
                    outputs.binding_id
                ))
            })?),
        };
        Ok(AcquisitionContext {
            scope: scope.clone(),
            generation,
            plan: plan.clone(),
            workspace: workspace.clone(),
            outputs: outputs.cloned(),
            workspace_host_path,
            outputs_host_path,
            signal: signal.clone(),
        })
    }

    /// Destroys the runtime of `lease` once: the live handle's destroy (when it has one),
    /// then `provider.reap`. The one teardown path of terminate and reap.
    async fn destroy(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError> {
        if self.table().terminated.contains(&lease.runtime_id) {
            return Ok(());
        }
        let live = self.table().live.get(&lease.runtime_id).cloned();
        let stop = if live.is_none() && self.usage.get().is_some() {
            self.observed_stop(lease).await
        } else {
            Stop::Now
        };
        if let Some(destroy) = live.as_deref().and_then(|sandbox| sandbox.as_destroy()) {
            destroy.destroy().await?;
        }
        self.provider.reap(lease).await?;
        {
            let mut table = self.table();
            table.live.remove(&lease.runtime_id);
            table.terminated.insert(lease.runtime_id.clone());
        }
        self.record_active_seconds(scope, lease, stop).await;
        Ok(())
    }

    /// Publishes a runtime the provider made (created or restored) as a lease once it is
    /// ready; a runtime that is not is destroyed (best effort) and the original error
    /// returned.
    pub(crate) async fn admit(
        &self,
        provided: ProvidedSandbox,
        plan: &ManagedRuntimePlan,
        signal: &AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        let command = plan.driver.entry_process().command.clone();
        let mut metadata = provided.metadata.clone();
        if self.usage.get().is_some() {
            metadata.insert(STARTED_AT_METADATA_KEY.into(), now_ms().into());
        }
        let lease = ManagedSandboxLease {
            provider: self.provider.name().to_owned(),
            runtime_id: provided.runtime_id.clone(),
            metadata: (!metadata.is_empty()).then_some(metadata),
        };
        let checked = if provided.runtime_id.is_empty() {
            Err(PortError::new(format!(
                "Sandbox provider returned an incompatible runtime for {}",
                self.provider.name()
            )))
        } else {
            self.ready(&provided.sandbox, &command, signal).await
        };
        if let Err(error) = checked {
            self.discard(&provided.sandbox, &lease).await;
            return Err(error);
        }
        self.table()
            .live
            .insert(lease.runtime_id.clone(), Arc::clone(&provided.sandbox));
        Ok(lease)
    }

    /// Best-effort teardown after a failed acquire; errors are logged, never returned.
    async fn discard(&self, sandbox: &Arc<dyn SandboxPort>, lease: &ManagedSandboxLease) {
        if let Some(destroy) = sandbox.as_destroy()
            && let Err(error) = destroy.destroy().await
        {
            tracing::warn!(provider = %lease.provider, runtime = %lease.runtime_id, %error, "destroy after a failed acquire failed");
        }
        if let Err(error) = self.provider.reap(lease).await {
            tracing::warn!(provider = %lease.provider, runtime = %lease.runtime_id, %error, "reap after a failed acquire failed");
        }
    }

    async fn ready(
        &self,
        sandbox: &Arc<dyn SandboxPort>,
        command: &str,
        signal: &AbortSignal,
    ) -> Result<(), PortError> {
        signal
            .race(verify_runtime_environment(
                sandbox.as_ref(),
                command,
                Some(self.readiness_timeout),
            ))
            .await?;
        signal.throw_if_aborted()
    }
}

#[async_trait]
impl ManagedSandboxPort for ProviderManagedRuntime {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        Ok(SandboxResourceCapabilities {
            suspend_resume: SuspendResume::Unsupported,
            hard_terminate: HardTerminate::Supported,
            runtime_checkpoints: if self.provider.capabilities().process_checkpoints {
                vec![RuntimeCheckpointKind::Process]
            } else {
                Vec::new()
            },
        })
    }

    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        input.signal.throw_if_aborted()?;
        let acquisition = self.acquisition(&input)?;
        let provided = self.provider.create(acquisition).await?;
        self.admit(provided, &input.plan, &input.signal).await
    }

    async fn heartbeat(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        self.check_provider(lease)?;
        if self.table().terminated.contains(&lease.runtime_id) {
            return Ok(SandboxHeartbeatResult::Lost);
        }
        Ok(match self.provider.status(lease).await {
            Ok(SandboxRuntimeStatus::Running) => SandboxHeartbeatResult::Alive,
            Ok(_) | Err(_) => SandboxHeartbeatResult::Lost,
        })
    }

    async fn suspend(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _lease: &ManagedSandboxLease,
        _signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        Err(PortError::new(format!(
            "{} does not support suspend/resume",
            self.provider.name()
        )))
    }

    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.check_provider(lease)?;
        self.destroy(scope, lease).await
    }

    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.check_provider(lease)?;
        self.destroy(scope, lease).await
    }

    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        if self.check_provider(lease).is_err() {
            return Ok(SandboxObservation {
                state: SandboxState::Unknown,
            });
        }
        if self.table().terminated.contains(&lease.runtime_id) {
            return Ok(SandboxObservation {
                state: SandboxState::Stopped,
            });
        }
        let state = match self.provider.status(lease).await {
            Ok(SandboxRuntimeStatus::Running) => SandboxState::Running,
            Ok(SandboxRuntimeStatus::Suspended) => SandboxState::Suspended,
            Ok(SandboxRuntimeStatus::Stopped) => SandboxState::Stopped,
            Ok(SandboxRuntimeStatus::Unknown) | Err(_) => SandboxState::Unknown,
        };
        Ok(SandboxObservation { state })
    }
}
