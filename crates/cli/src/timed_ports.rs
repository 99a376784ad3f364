//! `TimelinePorts`: decorators that time every port call of the host's transaction and
//! record it on a [`Timeline`]. They change nothing: each forwards its call unchanged and
//! returns the inner port's answer unchanged, so the host runs exactly as without them.
//!
//! The workspace decorator wraps the concrete [`FilesystemWorkspacePort`] (not the trait
//! object) to report what a restore and a checkpoint did (files, bytes, hashed, stored).
//!
//! What these must never do: record a fence token (they record generations, ids, counts and
//! error texts, and the host redacts tokens from errors before they reach a step's caller —
//! the port errors seen here come from omabox's own ports, which never format a token).

use crate::timeline::{Timeline, human_bytes, plural};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, AcquireSandboxInput,
    AttachOutputsInput, AttachWorkspaceInput, CheckpointWorkspaceInput, CollectOutputsInput,
    EnqueueRuntimeOrphanInput, FinalizeOutputsInput, ManagedSandboxLease, ManagedSandboxPort,
    ManagedWorkExecutionResult, MaterializeWorkspaceInput, OutputAbortReason, PortError,
    PrepareOutputsInput, PublishRuntimeResourcesInput, PublishRuntimeResourcesResult,
    RenewRuntimeFenceResult, RunHarnessInput, RuntimeOrphanPort, RuntimeOrphanRecord,
    RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourceScope,
    SandboxHarnessDriverCapabilities, SandboxHarnessDriverPort, SandboxHeartbeatResult,
    SandboxObservation, SandboxResourceCapabilities, SessionOutputBinding,
    SessionOutputCapabilities, SessionOutputEntryCandidate, SessionOutputManifestCandidate,
    SessionOutputPort, TerminationReason, WorkspaceBinding, WorkspaceCheckpointCandidate,
    WorkspacePersistenceCapabilities, WorkspacePersistencePort,
};
use omabox_persistence::FilesystemWorkspacePort;
use std::sync::Arc;
use std::time::Instant;

fn error_detail(error: &PortError) -> String {
    error.message().to_owned()
}

/// The fence port, timed: claim, renewals (counted only), publish, release.
pub struct TimedFences {
    inner: Arc<dyn RuntimeResourceFencePort>,
    timeline: Arc<Timeline>,
}

impl TimedFences {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<dyn RuntimeResourceFencePort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }
}

#[async_trait]
impl RuntimeResourceFencePort for TimedFences {
    async fn acquire(
        &self,
        input: AcquireRuntimeFenceInput,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        let began = Instant::now();
        let result = self.inner.acquire(input).await;
        match &result {
            Ok(AcquireRuntimeFenceResult::Acquired { fence, publication }) => {
                let from = match publication {
                    Some(publication) => format!(
                        "; last published revision {} (generation {})",
                        publication.revision, publication.generation
                    ),
                    None => "; nothing published yet".to_owned(),
                };
                self.timeline.facts_mut(|facts| {
                    facts.generation = Some(fence.generation);
                    facts.restored_revision = publication.as_ref().map(|p| p.revision);
                });
                self.timeline.event(
                    "fence.acquire",
                    began,
                    "fence claimed",
                    format!("generation {}{from}", fence.generation),
                    true,
                );
            }
            Ok(AcquireRuntimeFenceResult::Conflict { expires_at }) => self.timeline.event(
                "fence.acquire",
                began,
                "fence held elsewhere",
                format!(
                    "another owner holds the work item until {}",
                    expires_at.as_deref().unwrap_or("(unknown)")
                ),
                false,
            ),
            Err(error) => self.timeline.event(
                "fence.acquire",
                began,
                "fence claim failed",
                error_detail(error),
                false,
            ),
        }
        result
    }

    async fn is_current(&self, fence: &RuntimeResourceFence) -> Result<bool, PortError> {
        let began = Instant::now();
        let result = self.inner.is_current(fence).await;
        self.timeline.count("fence.is_current", began.elapsed());
        result
    }

    async fn renew(
        &self,
        fence: &RuntimeResourceFence,
        ttl_ms: u64,
    ) -> Result<RenewRuntimeFenceResult, PortError> {
        let began = Instant::now();
        let result = self.inner.renew(fence, ttl_ms).await;
        match &result {
            Ok(RenewRuntimeFenceResult::Renewed { .. }) => {
                self.timeline.count("fence.renew", began.elapsed());
            }
            Ok(RenewRuntimeFenceResult::Lost) => self.timeline.event(
                "fence.renew",
                began,
                "fence lost",
                "renewal refused: the fence is no longer current",
                false,
            ),
            Err(error) => self.timeline.event(
                "fence.renew",
                began,
                "fence renewal failed",
                error_detail(error),
                false,
            ),
        }
        result
    }

    async fn publish(
        &self,
        input: PublishRuntimeResourcesInput,
    ) -> Result<PublishRuntimeResourcesResult, PortError> {
        let began = Instant::now();
        let result = self.inner.publish(input).await;
        match &result {
            Ok(PublishRuntimeResourcesResult::Published { revision }) => {
                self.timeline
                    .facts_mut(|facts| facts.published_revision = Some(*revision));
                self.timeline.event(
                    "fence.publish",
                    began,
                    "published",
                    format!("revision {revision}"),
                    true,
                );
            }
            Ok(PublishRuntimeResourcesResult::Lost) => self.timeline.event(
                "fence.publish",
                began,
                "publish refused",
                "the fence is no longer current",
                false,
            ),
            Err(error) => self.timeline.event(
                "fence.publish",
                began,
                "publish failed",
                error_detail(error),
                false,
            ),
        }
        result
    }

    async fn release(
        &self,
        fence: &RuntimeResourceFence,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.release(fence, reason).await;
        let detail = match &result {
            Ok(()) => format!("generation {} ({reason})", fence.generation),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "fence.release",
            began,
            "fence released",
            detail,
            result.is_ok(),
        );
        result
    }
}

/// The sandbox port, timed: acquire, terminate, reap (heartbeats counted only).
pub struct TimedSandbox {
    inner: Arc<dyn ManagedSandboxPort>,
    timeline: Arc<Timeline>,
}

impl TimedSandbox {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<dyn ManagedSandboxPort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }
}

#[async_trait]
impl ManagedSandboxPort for TimedSandbox {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        let began = Instant::now();
        let result = self.inner.acquire(input).await;
        match &result {
            Ok(lease) => {
                self.timeline
                    .facts_mut(|facts| facts.runtime_id = Some(lease.runtime_id.clone()));
                self.timeline.event(
                    "sandbox.acquire",
                    began,
                    "sandbox acquired",
                    format!(
                        "{} {} in {} ms",
                        lease.provider,
                        lease.runtime_id,
                        began.elapsed().as_millis()
                    ),
                    true,
                );
            }
            Err(error) => self.timeline.event(
                "sandbox.acquire",
                began,
                "sandbox acquire failed",
                error_detail(error),
                false,
            ),
        }
        result
    }

    async fn heartbeat(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        let began = Instant::now();
        let result = self.inner.heartbeat(scope, fence, lease).await;
        match &result {
            Ok(SandboxHeartbeatResult::Alive) => {
                self.timeline.count("sandbox.heartbeat", began.elapsed());
            }
            Ok(SandboxHeartbeatResult::Lost) => self.timeline.event(
                "sandbox.heartbeat",
                began,
                "sandbox lost",
                format!("{} is no longer running", lease.runtime_id),
                false,
            ),
            Err(error) => self.timeline.event(
                "sandbox.heartbeat",
                began,
                "sandbox heartbeat failed",
                error_detail(error),
                false,
            ),
        }
        result
    }

    async fn suspend(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        let began = Instant::now();
        let result = self.inner.suspend(scope, fence, lease, signal).await;
        let detail = match &result {
            Ok(lease) => lease.runtime_id.clone(),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "sandbox.suspend",
            began,
            "sandbox suspended",
            detail,
            result.is_ok(),
        );
        result
    }

    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.terminate(scope, fence, lease, reason).await;
        let detail = match &result {
            Ok(()) => format!("{} ({reason})", lease.runtime_id),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "sandbox.terminate",
            began,
            "sandbox terminated",
            detail,
            result.is_ok(),
        );
        result
    }

    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.reap(scope, lease, reason).await;
        let detail = match &result {
            Ok(()) => lease.runtime_id.clone(),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "sandbox.reap",
            began,
            "sandbox reaped",
            detail,
            result.is_ok(),
        );
        result
    }

    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        let began = Instant::now();
        let result = self.inner.inspect(lease).await;
        self.timeline.count("sandbox.inspect", began.elapsed());
        result
    }
}

/// The workspace port, timed, with restore and checkpoint statistics.
#[derive(Debug)]
pub struct TimedWorkspace {
    inner: Arc<FilesystemWorkspacePort>,
    timeline: Arc<Timeline>,
}

impl TimedWorkspace {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<FilesystemWorkspacePort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }
}

#[async_trait]
impl WorkspacePersistencePort for TimedWorkspace {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn materialize(
        &self,
        input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError> {
        let began = Instant::now();
        let from = input.active_checkpoint.as_ref().map(|c| short_id(&c.id));
        let result = self.inner.materialize_with_report(&input).await;
        match result {
            Ok((binding, report)) => {
                let detail = match (report, from) {
                    (Some(report), Some(from)) => format!(
                        "restored {} ({}) from {from}",
                        plural(report.files, "file"),
                        human_bytes(report.bytes)
                    ),
                    (Some(report), None) => format!(
                        "seeded {} ({}) from --workspace",
                        plural(report.files, "file"),
                        human_bytes(report.bytes)
                    ),
                    (None, _) => "empty (new session)".to_owned(),
                };
                self.timeline.event(
                    "workspace.materialize",
                    began,
                    "workspace materialized",
                    detail,
                    true,
                );
                Ok(binding)
            }
            Err(error) => {
                let error = PortError::from(error);
                self.timeline.event(
                    "workspace.materialize",
                    began,
                    "workspace restore failed",
                    error_detail(&error),
                    false,
                );
                Err(error)
            }
        }
    }

    async fn attach(&self, input: AttachWorkspaceInput) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.attach(input).await;
        let detail = match &result {
            Ok(()) => "bound at /workspace".to_owned(),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "workspace.attach",
            began,
            "workspace attached",
            detail,
            result.is_ok(),
        );
        result
    }

    async fn checkpoint(
        &self,
        input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        let began = Instant::now();
        match self.inner.checkpoint_with_report(&input).await {
            Ok((candidate, report)) => {
                self.timeline.event(
                    "workspace.checkpoint",
                    began,
                    "workspace checkpointed",
                    format!(
                        "{}: {} ({}), {} hashed, {} new ({})",
                        short_id(&candidate.id),
                        plural(report.files, "file"),
                        human_bytes(report.bytes),
                        report.files_hashed,
                        plural(report.blobs_stored, "blob"),
                        human_bytes(report.bytes_stored)
                    ),
                    true,
                );
                Ok(candidate)
            }
            Err(error) => {
                let error = PortError::from(error);
                self.timeline.event(
                    "workspace.checkpoint",
                    began,
                    "workspace checkpoint failed",
                    error_detail(&error),
                    false,
                );
                Err(error)
            }
        }
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.release(scope, fence, binding).await;
        let detail = match &result {
            Ok(()) => "binding removed (the checkpoint keeps it)".to_owned(),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "workspace.release",
            began,
            "workspace released",
            detail,
            result.is_ok(),
        );
        result
    }
}

/// The outputs port, timed.
pub struct TimedOutputs {
    inner: Arc<dyn SessionOutputPort>,
    timeline: Arc<Timeline>,
}

impl TimedOutputs {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<dyn SessionOutputPort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }

    fn failed(&self, step: &'static str, began: Instant, label: &str, error: &PortError) {
        self.timeline
            .event(step, began, label, error_detail(error), false);
    }
}

#[async_trait]
impl SessionOutputPort for TimedOutputs {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn prepare(&self, input: PrepareOutputsInput) -> Result<SessionOutputBinding, PortError> {
        let began = Instant::now();
        let result = self.inner.prepare(input).await;
        match &result {
            Ok(binding) => self.timeline.event(
                "outputs.prepare",
                began,
                "outputs prepared",
                format!(
                    "{} at {}",
                    short_id(&binding.binding_id),
                    binding.mount_path
                ),
                true,
            ),
            Err(error) => self.failed("outputs.prepare", began, "outputs prepare failed", error),
        }
        result
    }

    async fn attach(&self, input: AttachOutputsInput) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.attach(input).await;
        match &result {
            Ok(()) => self.timeline.count("outputs.attach", began.elapsed()),
            Err(error) => self.failed("outputs.attach", began, "outputs attach failed", error),
        }
        result
    }

    async fn collect(
        &self,
        input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError> {
        let began = Instant::now();
        let result = self.inner.collect(input).await;
        match &result {
            Ok(entries) => {
                let bytes: u64 = entries.iter().map(|entry| entry.size).sum();
                let mut names: Vec<&str> = entries
                    .iter()
                    .take(3)
                    .map(|entry| entry.logical_path.as_str())
                    .collect();
                if entries.len() > 3 {
                    names.push("…");
                }
                self.timeline.event(
                    "outputs.collect",
                    began,
                    "outputs collected",
                    format!(
                        "{} ({}){}",
                        plural(entries.len() as u64, "entry").replace("entrys", "entries"),
                        human_bytes(bytes),
                        if names.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", names.join(", "))
                        }
                    ),
                    true,
                );
            }
            Err(error) => self.failed("outputs.collect", began, "outputs collect failed", error),
        }
        result
    }

    async fn finalize(
        &self,
        input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError> {
        let began = Instant::now();
        let result = self.inner.finalize(input).await;
        match &result {
            Ok(manifest) => self.timeline.event(
                "outputs.finalize",
                began,
                "outputs finalized",
                format!("manifest {}", short_id(&manifest.id)),
                true,
            ),
            Err(error) => self.failed("outputs.finalize", began, "outputs finalize failed", error),
        }
        result
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.release(scope, fence, binding).await;
        match &result {
            Ok(()) => self.timeline.event(
                "outputs.release",
                began,
                "outputs released",
                "published manifest kept, staging removed",
                true,
            ),
            Err(error) => self.failed("outputs.release", began, "outputs release failed", error),
        }
        result
    }

    async fn abort(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &SessionOutputBinding,
        reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        let began = Instant::now();
        let result = self.inner.abort(scope, fence, binding, reason).await;
        let detail = match &result {
            Ok(()) => format!(
                "nothing published ({})",
                match reason {
                    OutputAbortReason::Failed => "failed",
                    OutputAbortReason::LeaseLost => "lease_lost",
                }
            ),
            Err(error) => error_detail(error),
        };
        self.timeline.event(
            "outputs.abort",
            began,
            "outputs aborted",
            detail,
            result.is_ok(),
        );
        result
    }
}

/// The harness driver, timed: one event when the harness ends.
pub struct TimedHarness {
    inner: Arc<dyn SandboxHarnessDriverPort>,
    timeline: Arc<Timeline>,
}

impl TimedHarness {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<dyn SandboxHarnessDriverPort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for TimedHarness {
    async fn driver_capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        self.inner.driver_capabilities(scope).await
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        let began = Instant::now();
        let lane = input.driver.driver_type();
        let result = self.inner.run(input).await;
        let (label, detail, ok) = match &result {
            Ok(ManagedWorkExecutionResult::Completed) => (
                "harness exited",
                format!("{lane}: completed (exit 0)"),
                true,
            ),
            Ok(ManagedWorkExecutionResult::Aborted) => {
                ("harness stopped", format!("{lane}: aborted"), false)
            }
            Err(error) => (
                "harness failed",
                format!("{lane}: {}", error.message()),
                false,
            ),
        };
        self.timeline.event("harness.run", began, label, detail, ok);
        result
    }
}

/// The orphan queue, timed: an enqueue means a terminate failed, worth a line.
pub struct TimedOrphans {
    inner: Arc<dyn RuntimeOrphanPort>,
    timeline: Arc<Timeline>,
}

impl TimedOrphans {
    /// Times `inner` on `timeline`.
    pub fn new(inner: Arc<dyn RuntimeOrphanPort>, timeline: Arc<Timeline>) -> Self {
        Self { inner, timeline }
    }
}

#[async_trait]
impl RuntimeOrphanPort for TimedOrphans {
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
        let began = Instant::now();
        let runtime_id = input.sandbox.runtime_id.clone();
        let result = self.inner.enqueue(input).await;
        self.timeline.event(
            "orphans.enqueue",
            began,
            "orphan queued",
            format!("{runtime_id}: terminate failed; `omabox reap` retries it"),
            false,
        );
        result
    }

    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError> {
        self.inner.list(limit).await
    }

    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
        self.inner.failed(id, error).await
    }

    async fn resolve(&self, id: &str) -> Result<(), PortError> {
        self.inner.resolve(id).await
    }
}

/// `wcp_0123456789abcdef…` → `wcp_0123456789ab`.
fn short_id(id: &str) -> String {
    id.chars().take(16).collect()
}
