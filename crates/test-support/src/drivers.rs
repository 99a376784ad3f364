//! Fakes for provider admission and the harness driver lanes: capability-only resource ports,
//! a static harness driver, a scripted supervisor transport, and a provider driver.
//!
//! Capability-only ports answer their capability query (and, for the sandbox, a recorded
//! `reap`); every other method fails with "<Fake> does not implement <method>" instead of
//! pretending to work, so a test that strays past admission fails loudly.

use async_trait::async_trait;
use futures::StreamExt;
use omabox_contract::{
    AbortSignal, AcquireSandboxInput, AttachOutputsInput, AttachWorkspaceInput,
    CheckpointWorkspaceInput, CollectOutputsInput, CreateRuntimeCheckpointInput,
    CredentialEgressBinding, CredentialEgressCapabilities, CredentialEgressEnforcement,
    CredentialEgressMode, CredentialEgressPort, CredentialEgressProtocol, FinalizeOutputsInput,
    HardTerminate, HarnessDriverType, HarnessSupervisorChannel, HarnessSupervisorCommand,
    HarnessSupervisorEvent, HarnessSupervisorEventStream, HarnessSupervisorTransportPort,
    ManagedRuntimeProviderCreateInput, ManagedRuntimeProviderDriverDescriptor,
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderPlacement,
    ManagedRuntimeProviderResources, ManagedRuntimeResourceCapabilities, ManagedSandboxLease,
    ManagedSandboxPort, ManagedWorkExecutionResult, MaterializeWorkspaceInput, OpenSupervisorInput,
    OutputAbortReason, OutputDurability, OutputStrategy, PortError, PrepareCredentialEgressInput,
    PrepareOutputsInput, RunHarnessInput, RuntimeCheckpointPort, RuntimeCheckpointRef,
    RuntimeResourceFence, RuntimeResourceScope, SandboxHarnessDriverCapabilities,
    SandboxHarnessDriverPort, SandboxHeartbeatResult, SandboxObservation,
    SandboxResourceCapabilities, SessionOutputBinding, SessionOutputCapabilities,
    SessionOutputCapability, SessionOutputEntryCandidate, SessionOutputManifestCandidate,
    SessionOutputPort, SuspendResume, TerminationReason, WorkspaceBinding,
    WorkspaceCheckpointCandidate, WorkspacePersistenceCapabilities, WorkspacePersistencePort,
    WorkspaceStrategy,
};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn not_implemented(fake: &str, method: &str) -> PortError {
    PortError::new(format!("{fake} does not implement {method}"))
}

// ---------------------------------------------------------------------------------------------
// Capability-only resource ports
// ---------------------------------------------------------------------------------------------

/// A reap as recorded by [`CapabilityOnlySandbox`].
pub type RecordedReap = (RuntimeResourceScope, ManagedSandboxLease, TerminationReason);

/// A sandbox port that answers `capabilities` and records `reap`s (optionally failing them).
#[derive(Debug)]
pub struct CapabilityOnlySandbox {
    capabilities: SandboxResourceCapabilities,
    reaps: Mutex<Vec<RecordedReap>>,
    reap_failure: Mutex<Option<PortError>>,
}

impl Default for CapabilityOnlySandbox {
    /// `{suspendResume: unsupported, hardTerminate: supported, runtimeCheckpoints: []}`.
    fn default() -> Self {
        Self::new(SandboxResourceCapabilities {
            suspend_resume: SuspendResume::Unsupported,
            hard_terminate: HardTerminate::Supported,
            runtime_checkpoints: Vec::new(),
        })
    }
}

impl CapabilityOnlySandbox {
    /// A sandbox advertising `capabilities`.
    pub fn new(capabilities: SandboxResourceCapabilities) -> Self {
        Self {
            capabilities,
            reaps: Mutex::new(Vec::new()),
            reap_failure: Mutex::new(None),
        }
    }

    /// Makes every later `reap` fail with `error` (after recording it).
    pub fn fail_reap(&self, error: PortError) {
        *lock(&self.reap_failure) = Some(error);
    }

    /// The reaps seen so far.
    pub fn reaps(&self) -> Vec<RecordedReap> {
        lock(&self.reaps).clone()
    }
}

#[async_trait]
impl ManagedSandboxPort for CapabilityOnlySandbox {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        Ok(self.capabilities.clone())
    }
    async fn acquire(&self, _input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        Err(not_implemented("CapabilityOnlySandbox", "acquire"))
    }
    async fn heartbeat(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        Err(not_implemented("CapabilityOnlySandbox", "heartbeat"))
    }
    async fn suspend(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _lease: &ManagedSandboxLease,
        _signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        Err(not_implemented("CapabilityOnlySandbox", "suspend"))
    }
    async fn terminate(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _lease: &ManagedSandboxLease,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlySandbox", "terminate"))
    }
    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        lock(&self.reaps).push((scope.clone(), lease.clone(), reason));
        match lock(&self.reap_failure).clone() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
    async fn inspect(&self, _lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        Err(not_implemented("CapabilityOnlySandbox", "inspect"))
    }
}

/// A workspace port that only answers `capabilities`.
#[derive(Debug, Clone)]
pub struct CapabilityOnlyWorkspace {
    /// The advertised strategies.
    pub strategies: Vec<WorkspaceStrategy>,
}

#[async_trait]
impl WorkspacePersistencePort for CapabilityOnlyWorkspace {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<WorkspacePersistenceCapabilities, PortError> {
        Ok(WorkspacePersistenceCapabilities {
            strategies: self.strategies.clone(),
        })
    }
    async fn materialize(
        &self,
        _input: MaterializeWorkspaceInput,
    ) -> Result<WorkspaceBinding, PortError> {
        Err(not_implemented("CapabilityOnlyWorkspace", "materialize"))
    }
    async fn attach(&self, _input: AttachWorkspaceInput) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyWorkspace", "attach"))
    }
    async fn checkpoint(
        &self,
        _input: CheckpointWorkspaceInput,
    ) -> Result<WorkspaceCheckpointCandidate, PortError> {
        Err(not_implemented("CapabilityOnlyWorkspace", "checkpoint"))
    }
    async fn release(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &WorkspaceBinding,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyWorkspace", "release"))
    }
}

/// An outputs port that only answers `capabilities`.
#[derive(Debug, Clone)]
pub struct CapabilityOnlyOutputs {
    /// The advertised strategies.
    pub strategies: Vec<SessionOutputCapability>,
}

#[async_trait]
impl SessionOutputPort for CapabilityOnlyOutputs {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SessionOutputCapabilities, PortError> {
        Ok(SessionOutputCapabilities {
            strategies: self.strategies.clone(),
        })
    }
    async fn prepare(
        &self,
        _input: PrepareOutputsInput,
    ) -> Result<SessionOutputBinding, PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "prepare"))
    }
    async fn attach(&self, _input: AttachOutputsInput) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "attach"))
    }
    async fn collect(
        &self,
        _input: CollectOutputsInput,
    ) -> Result<Vec<SessionOutputEntryCandidate>, PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "collect"))
    }
    async fn finalize(
        &self,
        _input: FinalizeOutputsInput,
    ) -> Result<SessionOutputManifestCandidate, PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "finalize"))
    }
    async fn release(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &SessionOutputBinding,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "release"))
    }
    async fn abort(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &SessionOutputBinding,
        _reason: OutputAbortReason,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyOutputs", "abort"))
    }
}

/// A credential egress port that only answers `capabilities`.
#[derive(Debug, Clone)]
pub struct CapabilityOnlyEgress {
    /// The advertised capabilities.
    pub capabilities: CredentialEgressCapabilities,
}

#[async_trait]
impl CredentialEgressPort for CapabilityOnlyEgress {
    async fn capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<CredentialEgressCapabilities, PortError> {
        Ok(self.capabilities.clone())
    }
    async fn prepare(
        &self,
        _input: PrepareCredentialEgressInput,
    ) -> Result<Option<CredentialEgressBinding>, PortError> {
        Err(not_implemented("CapabilityOnlyEgress", "prepare"))
    }
    async fn attach(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &CredentialEgressBinding,
        _sandbox: &ManagedSandboxLease,
        _signal: AbortSignal,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyEgress", "attach"))
    }
    async fn revoke(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &CredentialEgressBinding,
        _reason: TerminationReason,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyEgress", "revoke"))
    }
    async fn release(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _binding: &CredentialEgressBinding,
    ) -> Result<(), PortError> {
        Err(not_implemented("CapabilityOnlyEgress", "release"))
    }
}

/// A runtime checkpoint port whose presence is all that matters (admission checks it exists).
#[derive(Debug, Clone, Copy, Default)]
pub struct UnusedRuntimeCheckpoint;

#[async_trait]
impl RuntimeCheckpointPort for UnusedRuntimeCheckpoint {
    async fn create(
        &self,
        _input: CreateRuntimeCheckpointInput,
    ) -> Result<RuntimeCheckpointRef, PortError> {
        Err(not_implemented("UnusedRuntimeCheckpoint", "create"))
    }
    async fn restore(
        &self,
        _scope: &RuntimeResourceScope,
        _fence: &RuntimeResourceFence,
        _checkpoint: &RuntimeCheckpointRef,
    ) -> Result<ManagedSandboxLease, PortError> {
        Err(not_implemented("UnusedRuntimeCheckpoint", "restore"))
    }
}

// ---------------------------------------------------------------------------------------------
// Harness driver
// ---------------------------------------------------------------------------------------------

/// A harness driver advertising fixed lanes; `run` records the lane it was asked to run and
/// returns the configured outcome.
#[derive(Debug)]
pub struct StaticHarnessDriver {
    lanes: Vec<HarnessDriverType>,
    outcome: Result<ManagedWorkExecutionResult, PortError>,
    capability_queries: AtomicUsize,
    runs: Mutex<Vec<HarnessDriverType>>,
}

impl StaticHarnessDriver {
    /// A driver of `lanes` whose runs complete.
    pub fn new(lanes: &[HarnessDriverType]) -> Self {
        Self::with_outcome(lanes, Ok(ManagedWorkExecutionResult::Completed))
    }

    /// A driver of `lanes` whose runs end with `outcome`.
    pub fn with_outcome(
        lanes: &[HarnessDriverType],
        outcome: Result<ManagedWorkExecutionResult, PortError>,
    ) -> Self {
        Self {
            lanes: lanes.to_vec(),
            outcome,
            capability_queries: AtomicUsize::new(0),
            runs: Mutex::new(Vec::new()),
        }
    }

    /// Lanes this driver was asked to run, in order.
    pub fn runs(&self) -> Vec<HarnessDriverType> {
        lock(&self.runs).clone()
    }

    /// How many times `driver_capabilities` was called.
    pub fn capability_queries(&self) -> usize {
        self.capability_queries.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for StaticHarnessDriver {
    async fn driver_capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        self.capability_queries.fetch_add(1, Ordering::SeqCst);
        Ok(SandboxHarnessDriverCapabilities {
            drivers: self.lanes.clone(),
        })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        lock(&self.runs).push(input.driver.driver_type());
        self.outcome.clone()
    }
}

// ---------------------------------------------------------------------------------------------
// Scripted supervisor transport
// ---------------------------------------------------------------------------------------------

/// What the scripted event stream does after its last scripted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScriptEnd {
    /// The stream ends (the supervisor closed stdout).
    Close,
    /// The stream stays open until the consumer's signal aborts, then ends.
    WaitForAbort,
}

/// Everything a [`ScriptedSupervisorTransport`] saw, shared with the test.
#[derive(Debug, Default)]
pub struct SupervisorRecorder {
    opens: AtomicUsize,
    closes: AtomicUsize,
    commands: Mutex<Vec<HarnessSupervisorCommand>>,
    yielded: tokio::sync::watch::Sender<usize>,
}

impl SupervisorRecorder {
    /// How many channels were opened.
    pub fn opens(&self) -> usize {
        self.opens.load(Ordering::SeqCst)
    }

    /// How many times `close` was called.
    pub fn closes(&self) -> usize {
        self.closes.load(Ordering::SeqCst)
    }

    /// Every command `send` received (including ones whose delivery failed), in order.
    pub fn commands(&self) -> Vec<HarnessSupervisorCommand> {
        lock(&self.commands).clone()
    }

    /// Resolves once the stream has handed out at least `count` scripted items.
    pub async fn wait_for_yielded(&self, count: usize) {
        let mut receiver = self.yielded.subscribe();
        let _ = receiver.wait_for(|yielded| *yielded >= count).await;
    }
}

/// A supervisor transport whose channels replay a script and record every command.
#[derive(Debug, Clone)]
pub struct ScriptedSupervisorTransport {
    events: Vec<Result<HarnessSupervisorEvent, PortError>>,
    end: ScriptEnd,
    open_failure: Option<PortError>,
    send_failures: Vec<(&'static str, PortError)>,
    close_failure: Option<PortError>,
    recorder: Arc<SupervisorRecorder>,
}

impl ScriptedSupervisorTransport {
    /// Channels that yield `events` and then close.
    pub fn new(events: Vec<HarnessSupervisorEvent>) -> Self {
        Self::from_results(events.into_iter().map(Ok).collect())
    }

    /// Channels that yield `events` (an `Err` item ends the stream with that error).
    pub fn from_results(events: Vec<Result<HarnessSupervisorEvent, PortError>>) -> Self {
        Self {
            events,
            end: ScriptEnd::Close,
            open_failure: None,
            send_failures: Vec::new(),
            close_failure: None,
            recorder: Arc::new(SupervisorRecorder::default()),
        }
    }

    /// What the stream does after the script.
    pub fn ending(mut self, end: ScriptEnd) -> Self {
        self.end = end;
        self
    }

    /// `open` fails with `error`.
    pub fn failing_open(mut self, error: PortError) -> Self {
        self.open_failure = Some(error);
        self
    }

    /// Sending a command of `command_type` (its `"type"` literal) fails with `error`.
    pub fn failing_send(mut self, command_type: &'static str, error: PortError) -> Self {
        self.send_failures.push((command_type, error));
        self
    }

    /// `close` fails with `error` (after being counted).
    pub fn failing_close(mut self, error: PortError) -> Self {
        self.close_failure = Some(error);
        self
    }

    /// The shared recorder.
    pub fn recorder(&self) -> Arc<SupervisorRecorder> {
        Arc::clone(&self.recorder)
    }
}

#[async_trait]
impl HarnessSupervisorTransportPort for ScriptedSupervisorTransport {
    async fn open(
        &self,
        _input: OpenSupervisorInput,
    ) -> Result<Box<dyn HarnessSupervisorChannel>, PortError> {
        self.recorder.opens.fetch_add(1, Ordering::SeqCst);
        if let Some(error) = &self.open_failure {
            return Err(error.clone());
        }
        Ok(Box::new(ScriptedSupervisorChannel {
            script: Mutex::new(Some(self.clone())),
        }))
    }
}

/// A channel opened by [`ScriptedSupervisorTransport`].
#[derive(Debug)]
pub struct ScriptedSupervisorChannel {
    script: Mutex<Option<ScriptedSupervisorTransport>>,
}

impl ScriptedSupervisorChannel {
    fn transport(&self) -> Result<ScriptedSupervisorTransport, PortError> {
        lock(&self.script)
            .clone()
            .ok_or_else(|| PortError::new("scripted channel has no script"))
    }
}

fn command_type(command: &HarnessSupervisorCommand) -> &'static str {
    match command {
        HarnessSupervisorCommand::Start { .. } => "start",
        HarnessSupervisorCommand::Drain => "drain",
        HarnessSupervisorCommand::CheckpointCommit { .. } => "checkpoint.commit",
        HarnessSupervisorCommand::CheckpointReject { .. } => "checkpoint.reject",
        HarnessSupervisorCommand::Stop { .. } => "stop",
    }
}

#[async_trait]
impl HarnessSupervisorChannel for ScriptedSupervisorChannel {
    async fn send(&self, command: HarnessSupervisorCommand) -> Result<(), PortError> {
        let transport = self.transport()?;
        let kind = command_type(&command);
        lock(&transport.recorder.commands).push(command);
        match transport
            .send_failures
            .iter()
            .find(|(failing, _)| *failing == kind)
        {
            Some((_, error)) => Err(error.clone()),
            None => Ok(()),
        }
    }

    async fn events(&self, signal: AbortSignal) -> Result<HarnessSupervisorEventStream, PortError> {
        let transport = self.transport()?;
        let recorder = Arc::clone(&transport.recorder);
        let end = transport.end;
        let items = transport
            .events
            .into_iter()
            .enumerate()
            .map(move |(index, item)| {
                recorder.yielded.send_replace(index + 1);
                item
            });
        let scripted = futures::stream::iter(items);
        let tail = futures::stream::once(async move {
            if end == ScriptEnd::WaitForAbort {
                signal.aborted().await;
            }
        })
        .filter_map(|()| std::future::ready(None::<Result<HarnessSupervisorEvent, PortError>>));
        Ok(Box::pin(scripted.chain(tail)))
    }

    async fn close(&self) -> Result<(), PortError> {
        let transport = self.transport()?;
        transport.recorder.closes.fetch_add(1, Ordering::SeqCst);
        match transport.close_failure {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Provider driver
// ---------------------------------------------------------------------------------------------

/// The `create` behaviour of a [`FakeProviderDriver`].
pub type CreateResources = Arc<
    dyn Fn(&ManagedRuntimeProviderCreateInput) -> Result<ManagedRuntimeProviderResources, PortError>
        + Send
        + Sync,
>;

/// A provider driver with a fixed descriptor and scripted `create`; counts and records creates.
pub struct FakeProviderDriver {
    descriptor: ManagedRuntimeProviderDriverDescriptor,
    create: CreateResources,
    creates: Mutex<Vec<ManagedRuntimeProviderCreateInput>>,
    descriptor_reads: AtomicUsize,
}

impl std::fmt::Debug for FakeProviderDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeProviderDriver")
            .field("provider", &self.descriptor.provider)
            .finish_non_exhaustive()
    }
}

impl FakeProviderDriver {
    /// A driver advertising `descriptor` whose `create` runs `create`.
    pub fn new(
        descriptor: ManagedRuntimeProviderDriverDescriptor,
        create: impl Fn(
            &ManagedRuntimeProviderCreateInput,
        ) -> Result<ManagedRuntimeProviderResources, PortError>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            descriptor,
            create: Arc::new(create),
            creates: Mutex::new(Vec::new()),
            descriptor_reads: AtomicUsize::new(0),
        }
    }

    /// A driver advertising `descriptor` whose `create` returns clones of `resources`.
    pub fn returning(
        descriptor: ManagedRuntimeProviderDriverDescriptor,
        resources: ManagedRuntimeProviderResources,
    ) -> Self {
        Self::new(descriptor, move |_| Ok(resources.clone()))
    }

    /// Inputs `create` received, in order.
    pub fn creates(&self) -> Vec<ManagedRuntimeProviderCreateInput> {
        lock(&self.creates).clone()
    }

    /// How many times `descriptor` was called.
    pub fn descriptor_reads(&self) -> usize {
        self.descriptor_reads.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl ManagedRuntimeProviderDriverPort for FakeProviderDriver {
    fn descriptor(&self) -> ManagedRuntimeProviderDriverDescriptor {
        self.descriptor_reads.fetch_add(1, Ordering::SeqCst);
        self.descriptor.clone()
    }

    async fn create(
        &self,
        input: ManagedRuntimeProviderCreateInput,
    ) -> Result<ManagedRuntimeProviderResources, PortError> {
        lock(&self.creates).push(input.clone());
        (self.create)(&input)
    }
}

// ---------------------------------------------------------------------------------------------
// Builders mirroring the registry test's `descriptor()` and `resources()` helpers
// ---------------------------------------------------------------------------------------------

/// Durable `final_collect` outputs.
pub fn durable_final_collect() -> Vec<SessionOutputCapability> {
    vec![SessionOutputCapability {
        strategy: OutputStrategy::FinalCollect,
        durability: OutputDurability::Durable,
    }]
}

/// Enforced live egress over http and https.
pub fn enforced_egress() -> CredentialEgressCapabilities {
    CredentialEgressCapabilities {
        enforcement: CredentialEgressEnforcement::Enforced,
        credential_mode: CredentialEgressMode::Live,
        intercepted_protocols: vec![
            CredentialEgressProtocol::Http,
            CredentialEgressProtocol::Https,
        ],
    }
}

/// The registry test's default descriptor: `in_process`; sandbox {unsupported, supported,
/// []}; workspace [checkpoint_restore]; outputs final_collect/durable; harness [ama_worker];
/// enforced live egress over http/https.
pub fn provider_descriptor(provider: &str) -> ManagedRuntimeProviderDriverDescriptor {
    ManagedRuntimeProviderDriverDescriptor {
        provider: provider.to_owned(),
        version: "1.0.0".to_owned(),
        placements: vec![ManagedRuntimeProviderPlacement::InProcess],
        capabilities: ManagedRuntimeResourceCapabilities {
            sandbox: SandboxResourceCapabilities {
                suspend_resume: SuspendResume::Unsupported,
                hard_terminate: HardTerminate::Supported,
                runtime_checkpoints: Vec::new(),
            },
            workspace: WorkspacePersistenceCapabilities {
                strategies: vec![WorkspaceStrategy::CheckpointRestore],
            },
            outputs: SessionOutputCapabilities {
                strategies: durable_final_collect(),
            },
            harness: SandboxHarnessDriverCapabilities {
                drivers: vec![HarnessDriverType::AmaWorker],
            },
        },
        credential_egress: enforced_egress(),
    }
}

/// The registry test's default resources, matching [`provider_descriptor`]: capability-only
/// ports, an `ama_worker` harness driver and an enforced egress port; no supervisor transport,
/// runtime checkpoint or session inputs.
pub fn provider_resources() -> ManagedRuntimeProviderResources {
    ManagedRuntimeProviderResources {
        sandbox: Arc::new(CapabilityOnlySandbox::default()),
        workspace: Arc::new(CapabilityOnlyWorkspace {
            strategies: vec![WorkspaceStrategy::CheckpointRestore],
        }),
        outputs: Arc::new(CapabilityOnlyOutputs {
            strategies: durable_final_collect(),
        }),
        harness_driver: Arc::new(StaticHarnessDriver::new(&[HarnessDriverType::AmaWorker])),
        supervisor_transport: None,
        runtime_checkpoint: None,
        credential_egress: Some(Arc::new(CapabilityOnlyEgress {
            capabilities: enforced_egress(),
        })),
        session_inputs: None,
    }
}
