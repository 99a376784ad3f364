//! The backend under test, the ports around it, and the per-case helpers.

use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AcquireSandboxInput, HarnessDriverDeclaration, ManagedRuntimePlan,
    ManagedSandboxLease, ManagedSandboxPort, MaterializeWorkspaceInput, OutputAbortReason,
    OutputStrategy, PortError, PrepareOutputsInput, RuntimeProcessDeclaration,
    RuntimeResourceFence, RuntimeResourceScope, SecretString, SessionOutputBinding,
    SessionOutputPort, TerminationReason, WorkspaceBinding, WorkspacePersistencePort,
    WorkspaceStrategy,
};
use omabox_persistence::{FilesystemSessionOutputPort, FilesystemWorkspacePort};
use omabox_sandbox::managed::{
    AcquisitionContext, ManagedSandboxProvider, ManagedSandboxProviderCapabilities,
    ProvidedSandbox, ProviderManagedRuntimeDriver, ProviderManagedRuntimeDriverOptions,
};
use omabox_sandbox::{SandboxPort, SandboxRuntimeStatus};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A fresh provider instance per call (a second call stands for "a fresh process").
pub type ProviderFactory =
    Arc<dyn Fn() -> Result<Arc<dyn ManagedSandboxProvider>, PortError> + Send + Sync>;

/// What a backend's test file hands the suite.
#[derive(Clone)]
pub struct BackendUnderTest {
    /// The provider id (also the catalog row id).
    pub name: String,
    /// Makes provider instances.
    pub provider: ProviderFactory,
    /// How a shell command inside the sandbox names `/workspace` (`/workspace`, or `$PWD`
    /// for a backend whose commands see host paths).
    pub workspace_dir: String,
    /// How a shell command inside the sandbox names `/mnt/session/outputs`.
    pub outputs_dir: String,
}

impl std::fmt::Debug for BackendUnderTest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendUnderTest")
            .field("name", &self.name)
            .field("workspace_dir", &self.workspace_dir)
            .field("outputs_dir", &self.outputs_dir)
            .finish_non_exhaustive()
    }
}

/// A provider decorator that remembers every runtime it created, so a case can check that
/// none is left running (and that a failed acquire left nothing behind).
pub struct TrackingProvider {
    inner: Arc<dyn ManagedSandboxProvider>,
    created: Mutex<Vec<ManagedSandboxLease>>,
}

impl std::fmt::Debug for TrackingProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackingProvider")
            .field("provider", &self.inner.name())
            .field("created", &self.created())
            .finish()
    }
}

impl TrackingProvider {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ManagedSandboxProvider>) -> Self {
        Self {
            inner,
            created: Mutex::new(Vec::new()),
        }
    }

    /// Leases of every runtime created so far.
    pub fn created(&self) -> Vec<ManagedSandboxLease> {
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The wrapped provider.
    pub fn inner(&self) -> &Arc<dyn ManagedSandboxProvider> {
        &self.inner
    }
}

impl TrackingProvider {
    fn track(&self, provided: &ProvidedSandbox) {
        self.created
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ManagedSandboxLease {
                provider: self.inner.name().to_owned(),
                runtime_id: provided.runtime_id.clone(),
                metadata: (!provided.metadata.is_empty()).then(|| provided.metadata.clone()),
            });
    }
}

#[async_trait]
impl ManagedSandboxProvider for TrackingProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn capabilities(&self) -> ManagedSandboxProviderCapabilities {
        self.inner.capabilities()
    }

    async fn create(&self, acquisition: AcquisitionContext) -> Result<ProvidedSandbox, PortError> {
        let provided = self.inner.create(acquisition).await?;
        self.track(&provided);
        Ok(provided)
    }

    async fn attach(&self, lease: &ManagedSandboxLease) -> Result<Arc<dyn SandboxPort>, PortError> {
        self.inner.attach(lease).await
    }

    async fn reap(&self, lease: &ManagedSandboxLease) -> Result<(), PortError> {
        self.inner.reap(lease).await
    }

    async fn status(&self, lease: &ManagedSandboxLease) -> Result<SandboxRuntimeStatus, PortError> {
        self.inner.status(lease).await
    }

    async fn capture_processes(
        &self,
        lease: &ManagedSandboxLease,
        session_id: &str,
    ) -> Result<String, PortError> {
        self.inner.capture_processes(lease, session_id).await
    }

    async fn restore_processes(
        &self,
        checkpoint_id: &str,
        acquisition: AcquisitionContext,
    ) -> Result<ProvidedSandbox, PortError> {
        let provided = self
            .inner
            .restore_processes(checkpoint_id, acquisition)
            .await?;
        self.track(&provided);
        Ok(provided)
    }

    async fn remove_processes(&self, checkpoint_id: &str) -> Result<(), PortError> {
        self.inner.remove_processes(checkpoint_id).await
    }
}

/// A runtime acquired through the managed port, with the bindings it was acquired with.
#[derive(Debug, Clone)]
pub struct Acquired {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence used (its token is [`Subject::token`]).
    pub fence: RuntimeResourceFence,
    /// The lease.
    pub lease: ManagedSandboxLease,
    /// The workspace binding.
    pub workspace: WorkspaceBinding,
    /// The outputs binding.
    pub outputs: SessionOutputBinding,
}

/// One case's world: a temporary data directory, the filesystem persistence ports, and a
/// driver over the (tracked) backend.
pub struct Subject {
    /// The backend.
    pub backend: BackendUnderTest,
    /// The data directory (removed on drop).
    pub data: tempfile::TempDir,
    /// Workspace persistence.
    pub workspace: Arc<FilesystemWorkspacePort>,
    /// Outputs persistence.
    pub outputs: Arc<FilesystemSessionOutputPort>,
    /// The driver every case uses first.
    pub driver: ProviderManagedRuntimeDriver,
    /// The fence token of every fence this subject makes (must never leak).
    pub token: String,
    trackers: Mutex<Vec<Arc<TrackingProvider>>>,
}

impl std::fmt::Debug for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subject")
            .field("backend", &self.backend)
            .field("data", &self.data.path())
            .finish_non_exhaustive()
    }
}

static NEXT: AtomicU64 = AtomicU64::new(1);

fn unique(prefix: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or_default();
    format!(
        "{prefix}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::SeqCst)
    )
}

impl Subject {
    /// Sets up the ports in a fresh data directory and the first driver. Panics (test
    /// setup) when the backend cannot even build a provider.
    pub async fn new(backend: BackendUnderTest) -> Self {
        let data = tempfile::tempdir().expect("temporary data directory");
        let workspace =
            Arc::new(FilesystemWorkspacePort::new(data.path()).expect("workspace port"));
        let outputs =
            Arc::new(FilesystemSessionOutputPort::new(data.path()).expect("outputs port"));
        let token = unique("conformance-fence-secret");
        let trackers = Mutex::new(Vec::new());
        let tracker = Arc::new(TrackingProvider::new(
            (backend.provider)().expect("backend provider"),
        ));
        trackers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&tracker));
        let driver = build_driver(tracker, &workspace, &outputs).await;
        Self {
            backend,
            data,
            workspace,
            outputs,
            driver,
            token,
            trackers,
        }
    }

    /// A second driver over a fresh provider instance and a fresh runtime table, sharing
    /// only the data directory: what another process would build.
    pub async fn fresh_driver(&self) -> ProviderManagedRuntimeDriver {
        let tracker = Arc::new(TrackingProvider::new(
            (self.backend.provider)().expect("backend provider"),
        ));
        self.trackers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&tracker));
        build_driver(tracker, &self.workspace, &self.outputs).await
    }

    /// Like [`Subject::fresh_driver`], with harness output forwarded to `sink`.
    pub async fn driver_with_output(
        &self,
        sink: Arc<dyn omabox_sandbox::managed::HarnessOutputSink>,
    ) -> ProviderManagedRuntimeDriver {
        let tracker = Arc::new(TrackingProvider::new(
            (self.backend.provider)().expect("backend provider"),
        ));
        self.trackers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Arc::clone(&tracker));
        let mut options = ProviderManagedRuntimeDriverOptions::new(
            tracker,
            Arc::clone(&self.workspace) as Arc<dyn WorkspacePersistencePort>,
            Arc::clone(&self.outputs) as Arc<dyn SessionOutputPort>,
        );
        options.harness_output = Some(sink);
        ProviderManagedRuntimeDriver::new(options)
            .await
            .expect("provider managed runtime driver")
    }

    /// Every runtime the subject's providers created.
    pub fn created(&self) -> Vec<ManagedSandboxLease> {
        self.trackers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .flat_map(|tracker| tracker.created())
            .collect()
    }

    /// The provider as the backend made it (no tracking), for out-of-band observation.
    pub fn observer(&self) -> Arc<dyn ManagedSandboxProvider> {
        let trackers = self.trackers.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(trackers[0].inner())
    }

    /// Fails the case if any runtime a provider of this subject created is still running.
    pub async fn assert_nothing_left(&self) {
        let observer = self.observer();
        for lease in self.created() {
            let status = observer.status(&lease).await;
            assert!(
                !matches!(status, Ok(SandboxRuntimeStatus::Running)),
                "{}: runtime {} was left running",
                self.backend.name,
                lease.runtime_id
            );
        }
    }

    /// A fresh work item.
    pub fn scope(&self) -> RuntimeResourceScope {
        RuntimeResourceScope::new(
            "conformance-ws",
            "conformance-env",
            "conformance-session",
            unique("work"),
        )
    }

    /// A fence for `scope` at `generation` carrying [`Subject::token`].
    pub fn fence(&self, scope: &RuntimeResourceScope, generation: u64) -> RuntimeResourceFence {
        RuntimeResourceFence {
            workspace_id: scope.workspace_id.clone(),
            environment_id: scope.environment_id.clone(),
            session_id: scope.session_id.clone(),
            work_id: scope.work_id.clone(),
            owner_id: "conformance-host".into(),
            generation,
            token: SecretString::new(self.token.clone()),
            expires_at: "2999-01-01T00:00:00.000Z".into(),
        }
    }

    /// `sh -c <script>` with `$WS` and `$OUT` naming the two mounts as this backend's
    /// commands see them.
    pub fn shell(&self, script: &str) -> RuntimeProcessDeclaration {
        RuntimeProcessDeclaration {
            command: "sh".into(),
            args: Some(vec!["-c".into(), self.script(script)]),
            cwd: None,
            env: None,
        }
    }

    /// `script` with the `$WS`/`$OUT` prelude, for `exec`.
    pub fn script(&self, script: &str) -> String {
        format!(
            "WS=\"{}\"; OUT=\"{}\"; {script}",
            self.backend.workspace_dir, self.backend.outputs_dir
        )
    }

    /// An `ama_worker` plan running `process` with checkpoint_restore and final_collect.
    pub fn plan(&self, process: RuntimeProcessDeclaration) -> ManagedRuntimePlan {
        ManagedRuntimePlan {
            workspace_strategy: WorkspaceStrategy::CheckpointRestore,
            output_strategy: Some(OutputStrategy::FinalCollect),
            runtime_checkpoint: None,
            driver: HarnessDriverDeclaration::AmaWorker { process },
        }
    }

    /// Materializes a workspace and prepares outputs for `fence`.
    pub async fn bindings(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
    ) -> (WorkspaceBinding, SessionOutputBinding) {
        let workspace = self
            .workspace
            .materialize(MaterializeWorkspaceInput {
                scope: scope.clone(),
                fence: fence.clone(),
                strategy: WorkspaceStrategy::CheckpointRestore,
                active_checkpoint: None,
                idempotency_key: format!(
                    "{}:{}:workspace-materialize",
                    scope.work_id, fence.generation
                ),
                signal: AbortSignal::never(),
            })
            .await
            .expect("materialize workspace");
        let outputs = self
            .outputs
            .prepare(PrepareOutputsInput {
                scope: scope.clone(),
                fence: fence.clone(),
                strategy: OutputStrategy::FinalCollect,
                idempotency_key: format!("{}:{}:outputs-prepare", scope.work_id, fence.generation),
                signal: AbortSignal::never(),
            })
            .await
            .expect("prepare outputs");
        (workspace, outputs)
    }

    /// Acquires a runtime through `driver` for a plan running `process`.
    pub async fn acquire_on(
        &self,
        driver: &ProviderManagedRuntimeDriver,
        process: RuntimeProcessDeclaration,
        signal: AbortSignal,
    ) -> Result<Acquired, PortError> {
        let scope = self.scope();
        let fence = self.fence(&scope, 1);
        let (workspace, outputs) = self.bindings(&scope, &fence).await;
        let acquired = driver
            .runtime()
            .acquire(AcquireSandboxInput {
                scope: scope.clone(),
                fence: fence.clone(),
                plan: self.plan(process),
                workspace: workspace.clone(),
                outputs: Some(outputs.clone()),
                credential_egress: None,
                signal,
            })
            .await;
        match acquired {
            Ok(lease) => Ok(Acquired {
                scope,
                fence,
                lease,
                workspace,
                outputs,
            }),
            Err(error) => {
                let _ = self.workspace.release(&scope, &fence, &workspace).await;
                let _ = self
                    .outputs
                    .abort(&scope, &fence, &outputs, OutputAbortReason::Failed)
                    .await;
                Err(error)
            }
        }
    }

    /// Acquires a runtime whose harness is `sh` (always present).
    pub async fn acquire(&self) -> Acquired {
        self.acquire_on(&self.driver, self.shell("true"), AbortSignal::never())
            .await
            .expect("acquire")
    }

    /// The live tool sandbox of `acquired`.
    pub async fn sandbox(&self, acquired: &Acquired) -> Arc<dyn SandboxPort> {
        self.driver
            .runtime()
            .sandbox(&acquired.lease)
            .await
            .expect("live tool sandbox")
    }

    /// Terminates the runtime and releases the bindings.
    pub async fn finish(&self, acquired: &Acquired) {
        self.driver
            .runtime()
            .terminate(
                &acquired.scope,
                &acquired.fence,
                &acquired.lease,
                TerminationReason::Completed,
            )
            .await
            .expect("terminate");
        let _ = self
            .workspace
            .release(&acquired.scope, &acquired.fence, &acquired.workspace)
            .await;
        let _ = self
            .outputs
            .abort(
                &acquired.scope,
                &acquired.fence,
                &acquired.outputs,
                OutputAbortReason::Failed,
            )
            .await;
    }
}

async fn build_driver(
    tracker: Arc<TrackingProvider>,
    workspace: &Arc<FilesystemWorkspacePort>,
    outputs: &Arc<FilesystemSessionOutputPort>,
) -> ProviderManagedRuntimeDriver {
    let mut options = ProviderManagedRuntimeDriverOptions::new(
        tracker,
        Arc::clone(workspace) as Arc<dyn WorkspacePersistencePort>,
        Arc::clone(outputs) as Arc<dyn SessionOutputPort>,
    );
    options.readiness_timeout = Some(Duration::from_secs(10));
    ProviderManagedRuntimeDriver::new(options)
        .await
        .expect("provider managed runtime driver")
}
