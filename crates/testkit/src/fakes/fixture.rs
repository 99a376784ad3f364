//! [`Fixture`]: every fake wired into `ManagedRuntimeHostDependencies`.
//!
//! [`Fixture::fault_matrix`] is the fixture of the reference's fault matrix (§8.1): scope
//! `workspace_fault/environment_fault/session_fault/work_fault`, owner `fault-owner`,
//! generation 1, token `fault-secret`, lease TTL 90 s, heartbeat 30 s, a scheduler that blocks
//! until aborted, a durable/durable/checkpoint-disabled `ama_worker` profile running
//! `community-worker`, and fakes whose defaults all succeed. Tests change one step of one fake
//! (fault injection), or swap the whole spec with [`Fixture::new`].
//!
//! Optional ports (runtime checkpoint, credential egress, Session inputs) are absent until a
//! test adds them, exactly like the optional dependencies of the host.

use super::checkpoint::FakeRuntimeCheckpoint;
use super::egress::{FakeCredentialEgress, enforced_binding};
use super::fence::FakeFence;
use super::harness::FakeHarness;
use super::log::CallLog;
use super::observer::RecordingObserver;
use super::orphans::FakeOrphans;
use super::outputs::FakeOutputs;
use super::sandbox::FakeSandbox;
use super::scheduler::FakeScheduler;
use super::session_inputs::FakeSessionInputs;
use super::workspace::FakeWorkspace;
use omabox_contract::{
    CredentialEgressBinding, HarnessDriverDeclaration, HarnessIdentity, ManagedRuntimeProfile,
    ManagedSandboxLease, OutputRequirement, OutputsProfile, PortError,
    RuntimeCheckpointRequirement, RuntimeProcessDeclaration, RuntimeResourceFence,
    RuntimeResourceScope, RuntimeSessionResourceSnapshot, RuntimeSessionSnapshot, SecretString,
    SupervisorProtocol, WorkspaceProfile, WorkspaceRequirement,
};
use omabox_host::runtime_host::{
    ManagedRuntimeHost, ManagedRuntimeHostDependencies, ManagedRuntimeRunInput,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// The identity values a fixture grants.
#[derive(Debug, Clone)]
pub struct FixtureSpec {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// Who claims it.
    pub owner_id: String,
    /// The granted generation.
    pub generation: u64,
    /// The granted token.
    pub token: String,
    /// The granted expiry.
    pub expires_at: String,
    /// The lease `sandbox.acquire` returns.
    pub lease: ManagedSandboxLease,
    /// The binding `credentialEgress.prepare` returns.
    pub egress_binding: CredentialEgressBinding,
}

impl FixtureSpec {
    /// The fault-matrix values.
    pub fn fault_matrix() -> Self {
        Self {
            scope: RuntimeResourceScope::new(
                "workspace_fault",
                "environment_fault",
                "session_fault",
                "work_fault",
            ),
            owner_id: "fault-owner".into(),
            generation: 1,
            token: "fault-secret".into(),
            expires_at: "2026-09-03T12:00:00.000Z".into(),
            lease: lease("fake", "runtime-fault"),
            egress_binding: enforced_binding("egress_1"),
        }
    }

    /// The fence these values describe.
    pub fn fence(&self) -> RuntimeResourceFence {
        RuntimeResourceFence {
            workspace_id: self.scope.workspace_id.clone(),
            environment_id: self.scope.environment_id.clone(),
            session_id: self.scope.session_id.clone(),
            work_id: self.scope.work_id.clone(),
            owner_id: self.owner_id.clone(),
            generation: self.generation,
            token: SecretString::new(self.token.clone()),
            expires_at: self.expires_at.clone(),
        }
    }
}

/// A lease without metadata.
pub fn lease(provider: &str, runtime_id: &str) -> ManagedSandboxLease {
    ManagedSandboxLease {
        provider: provider.to_owned(),
        runtime_id: runtime_id.to_owned(),
        metadata: None,
    }
}

/// An `ama_worker` driver running `command`.
pub fn ama_worker(command: &str) -> HarnessDriverDeclaration {
    HarnessDriverDeclaration::AmaWorker {
        process: RuntimeProcessDeclaration::command(command),
    }
}

/// The supervised driver of the credential-egress tests (`supervisor`, harness `pi`/`1`).
pub fn supervised_driver() -> HarnessDriverDeclaration {
    HarnessDriverDeclaration::OpenmaSupervised {
        protocol: SupervisorProtocol::V1,
        supervisor: RuntimeProcessDeclaration::command("supervisor"),
        harness: HarnessIdentity {
            id: "pi".into(),
            version: "1".into(),
        },
        ready_timeout_ms: 1_000,
        heartbeat_timeout_ms: 1_000,
        drain_timeout_ms: 1_000,
    }
}

/// A profile from its four requirements (no egress key).
pub fn profile(
    workspace: WorkspaceRequirement,
    outputs: OutputRequirement,
    runtime_checkpoint: RuntimeCheckpointRequirement,
    driver: HarnessDriverDeclaration,
) -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        workspace: WorkspaceProfile {
            requirement: workspace,
            preferred_strategies: None,
        },
        outputs: OutputsProfile {
            requirement: outputs,
            preferred_strategies: None,
        },
        runtime_checkpoint,
        credential_egress: None,
        driver,
    }
}

/// A Session resource of `resource_type` with string fields.
pub fn resource(resource_type: &str, fields: &[(&str, &str)]) -> RuntimeSessionResourceSnapshot {
    RuntimeSessionResourceSnapshot::new(
        resource_type,
        fields
            .iter()
            .map(|(key, value)| ((*key).to_owned(), serde_json::Value::from(*value)))
            .collect(),
    )
}

/// A Session snapshot of `scope`'s session with `metadata` and `resources`.
pub fn session(
    scope: &RuntimeResourceScope,
    metadata: &[(&str, &str)],
    resources: Vec<RuntimeSessionResourceSnapshot>,
) -> RuntimeSessionSnapshot {
    RuntimeSessionSnapshot {
        id: scope.session_id.clone(),
        environment_id: scope.environment_id.clone(),
        metadata: metadata
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect::<BTreeMap<_, _>>(),
        resources,
    }
}

/// Every fake, sharing one [`CallLog`], plus the host settings.
#[derive(Debug)]
pub struct Fixture {
    /// Every call, in order.
    pub log: CallLog,
    /// The identity values.
    pub spec: FixtureSpec,
    /// The profile [`Fixture::input`] runs.
    pub profile: ManagedRuntimeProfile,
    /// `ownerId`.
    pub owner_id: String,
    /// `leaseTtlMs`.
    pub lease_ttl_ms: u64,
    /// `heartbeatIntervalMs`.
    pub heartbeat_interval_ms: u64,
    /// `sessionInputSyncIntervalMs`.
    pub session_input_sync_interval_ms: Option<u64>,
    /// The fence port.
    pub fences: Arc<FakeFence>,
    /// The sandbox port.
    pub sandbox: Arc<FakeSandbox>,
    /// The workspace port.
    pub workspace: Arc<FakeWorkspace>,
    /// The outputs port.
    pub outputs: Arc<FakeOutputs>,
    /// The harness driver.
    pub harness: Arc<FakeHarness>,
    /// The orphan queue.
    pub orphans: Arc<FakeOrphans>,
    /// The scheduler; `None` uses the host's default timer.
    pub scheduler: Option<Arc<FakeScheduler>>,
    /// The optional runtime checkpoint port.
    pub runtime_checkpoint: Option<Arc<FakeRuntimeCheckpoint>>,
    /// The optional credential egress port.
    pub credential_egress: Option<Arc<FakeCredentialEgress>>,
    /// The optional Session-input materializer.
    pub session_inputs: Option<Arc<FakeSessionInputs>>,
    /// The run observer [`Fixture::input`] attaches.
    pub observer: Arc<RecordingObserver>,
}

impl Fixture {
    /// The fault-matrix fixture.
    pub fn fault_matrix() -> Self {
        Self::new(FixtureSpec::fault_matrix())
    }

    /// A fixture granting `spec`'s identity, with the fault-matrix profile and defaults.
    pub fn new(spec: FixtureSpec) -> Self {
        let log = CallLog::new();
        Self {
            profile: profile(
                WorkspaceRequirement::Durable,
                OutputRequirement::Durable,
                RuntimeCheckpointRequirement::Disabled,
                ama_worker("community-worker"),
            ),
            owner_id: spec.owner_id.clone(),
            lease_ttl_ms: 90_000,
            heartbeat_interval_ms: 30_000,
            session_input_sync_interval_ms: None,
            fences: Arc::new(FakeFence::new(log.clone(), spec.fence())),
            sandbox: Arc::new(FakeSandbox::new(log.clone(), spec.lease.clone())),
            workspace: Arc::new(FakeWorkspace::new(log.clone())),
            outputs: Arc::new(FakeOutputs::new(log.clone())),
            harness: Arc::new(FakeHarness::new(log.clone())),
            orphans: Arc::new(FakeOrphans::new(log.clone())),
            scheduler: Some(Arc::new(FakeScheduler::new(log.clone()))),
            runtime_checkpoint: None,
            credential_egress: None,
            session_inputs: None,
            observer: Arc::new(RecordingObserver::default()),
            log,
            spec,
        }
    }

    /// The work item.
    pub fn scope(&self) -> RuntimeResourceScope {
        self.spec.scope.clone()
    }

    /// The fence the fixture grants.
    pub fn fence(&self) -> RuntimeResourceFence {
        self.spec.fence()
    }

    /// The fence token, for leak checks.
    pub fn token(&self) -> &str {
        &self.spec.token
    }

    /// Adds a compatible runtime checkpoint port.
    pub fn with_runtime_checkpoint(&mut self) -> Arc<FakeRuntimeCheckpoint> {
        let port = Arc::new(FakeRuntimeCheckpoint::new(self.log.clone()));
        self.runtime_checkpoint = Some(Arc::clone(&port));
        port
    }

    /// Adds an enforced credential egress port.
    pub fn with_credential_egress(&mut self) -> Arc<FakeCredentialEgress> {
        let port = Arc::new(FakeCredentialEgress::new(
            self.log.clone(),
            self.spec.egress_binding.clone(),
        ));
        self.credential_egress = Some(Arc::clone(&port));
        port
    }

    /// Adds a Session-input materializer.
    pub fn with_session_inputs(&mut self) -> Arc<FakeSessionInputs> {
        let port = Arc::new(FakeSessionInputs::new(self.log.clone()));
        self.session_inputs = Some(Arc::clone(&port));
        port
    }

    /// Removes the fake scheduler: the host uses its default timer.
    pub fn without_scheduler(&mut self) {
        self.scheduler = None;
    }

    /// The host's dependencies.
    pub fn dependencies(&self) -> ManagedRuntimeHostDependencies {
        ManagedRuntimeHostDependencies {
            owner_id: self.owner_id.clone(),
            lease_ttl_ms: self.lease_ttl_ms,
            heartbeat_interval_ms: self.heartbeat_interval_ms,
            session_input_sync_interval_ms: self.session_input_sync_interval_ms,
            fences: self.fences.clone(),
            sandbox: self.sandbox.clone(),
            workspace: self.workspace.clone(),
            outputs: self.outputs.clone(),
            harness_driver: self.harness.clone(),
            orphans: self.orphans.clone(),
            scheduler: self.scheduler.clone().map(|scheduler| scheduler as _),
            runtime_checkpoint: self.runtime_checkpoint.clone().map(|port| port as _),
            credential_egress: self.credential_egress.clone().map(|port| port as _),
            session_inputs: self.session_inputs.clone().map(|port| port as _),
        }
    }

    /// A host over [`Fixture::dependencies`].
    pub fn host(&self) -> Result<ManagedRuntimeHost, PortError> {
        ManagedRuntimeHost::new(self.dependencies())
    }

    /// A run of [`Fixture::profile`] for the fixture's scope, observed by
    /// [`Fixture::observer`].
    pub fn input(&self) -> ManagedRuntimeRunInput {
        let mut input = ManagedRuntimeRunInput::new(self.scope(), self.profile.clone());
        input.observer = Some(Arc::clone(&self.observer) as _);
        input
    }
}
