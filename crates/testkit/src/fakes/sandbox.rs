//! [`FakeSandbox`]: a scripted `ManagedSandboxPort`.
//!
//! Defaults: capabilities `{suspendResume: unsupported, hardTerminate: supported,
//! runtimeCheckpoints: []}`; `acquire` → the fixture's lease; `heartbeat` → alive; `suspend`
//! → the lease it was given; `terminate`, `reap` → ok; `inspect` → running.

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AcquireSandboxInput, HardTerminate, ManagedSandboxLease, ManagedSandboxPort,
    PortError, RuntimeResourceFence, RuntimeResourceScope, SandboxHeartbeatResult,
    SandboxObservation, SandboxResourceCapabilities, SandboxState, SuspendResume,
    TerminationReason,
};

/// Input of `heartbeat`.
#[derive(Debug, Clone)]
pub struct HeartbeatCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The lease.
    pub lease: ManagedSandboxLease,
}

/// Input of `suspend`.
#[derive(Debug, Clone)]
pub struct SuspendCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The lease.
    pub lease: ManagedSandboxLease,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of `terminate`.
#[derive(Debug, Clone)]
pub struct TerminateCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The lease.
    pub lease: ManagedSandboxLease,
    /// Why.
    pub reason: TerminationReason,
}

/// Input of `reap`.
#[derive(Debug, Clone, PartialEq)]
pub struct ReapCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The lease.
    pub lease: ManagedSandboxLease,
    /// Why.
    pub reason: TerminationReason,
}

impl WithSignal for AcquireSandboxInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for SuspendCall {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// The fault-matrix sandbox capabilities.
pub fn default_sandbox_capabilities() -> SandboxResourceCapabilities {
    SandboxResourceCapabilities {
        suspend_resume: SuspendResume::Unsupported,
        hard_terminate: HardTerminate::Supported,
        runtime_checkpoints: Vec::new(),
    }
}

/// A scripted compute lifecycle port.
#[derive(Debug)]
pub struct FakeSandbox {
    log: CallLog,
    /// `capabilities`.
    pub capabilities: Step<RuntimeResourceScope, SandboxResourceCapabilities>,
    /// `acquire`.
    pub acquire: Step<AcquireSandboxInput, ManagedSandboxLease>,
    /// `heartbeat`.
    pub heartbeat: Step<HeartbeatCall, SandboxHeartbeatResult>,
    /// `suspend`.
    pub suspend: Step<SuspendCall, ManagedSandboxLease>,
    /// `terminate`.
    pub terminate: Step<TerminateCall, ()>,
    /// `reap`.
    pub reap: Step<ReapCall, ()>,
    /// `inspect`.
    pub inspect: Step<ManagedSandboxLease, SandboxObservation>,
}

impl FakeSandbox {
    /// A sandbox port whose `acquire` returns `lease`.
    pub fn new(log: CallLog, lease: ManagedSandboxLease) -> Self {
        Self {
            log,
            capabilities: Step::new(|_| async { Ok(default_sandbox_capabilities()) }),
            acquire: Step::new(move |_| {
                let lease = lease.clone();
                async move { Ok(lease) }
            }),
            heartbeat: Step::new(|_| async { Ok(SandboxHeartbeatResult::Alive) }),
            suspend: Step::new(|call: SuspendCall| async move { Ok(call.lease) }),
            terminate: Step::new(|_| async { Ok(()) }),
            reap: Step::new(|_| async { Ok(()) }),
            inspect: Step::new(|_| async {
                Ok(SandboxObservation {
                    state: SandboxState::Running,
                })
            }),
        }
    }

    /// Makes `capabilities` advertise `runtime_checkpoints` (and suspend support when asked).
    pub fn advertises(
        &self,
        suspend_resume: SuspendResume,
        runtime_checkpoints: Vec<omabox_contract::RuntimeCheckpointKind>,
    ) {
        self.capabilities.returns(SandboxResourceCapabilities {
            suspend_resume,
            hard_terminate: HardTerminate::Supported,
            runtime_checkpoints,
        });
    }
}

#[async_trait]
impl ManagedSandboxPort for FakeSandbox {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        self.log.push(format!("{}.capabilities", names::SANDBOX));
        self.capabilities.invoke(scope.clone()).await
    }

    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        self.log.push(format!("{}.acquire", names::SANDBOX));
        self.acquire.invoke(input).await
    }

    async fn heartbeat(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        self.log.push(format!("{}.heartbeat", names::SANDBOX));
        self.heartbeat
            .invoke(HeartbeatCall {
                scope: scope.clone(),
                fence: fence.clone(),
                lease: lease.clone(),
            })
            .await
    }

    async fn suspend(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        self.log.push(format!("{}.suspend", names::SANDBOX));
        self.suspend
            .invoke(SuspendCall {
                scope: scope.clone(),
                fence: fence.clone(),
                lease: lease.clone(),
                signal,
            })
            .await
    }

    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.log
            .push(format!("{}.terminate:{reason}", names::SANDBOX));
        self.terminate
            .invoke(TerminateCall {
                scope: scope.clone(),
                fence: fence.clone(),
                lease: lease.clone(),
                reason,
            })
            .await
    }

    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.reap:{reason}", names::SANDBOX));
        self.reap
            .invoke(ReapCall {
                scope: scope.clone(),
                lease: lease.clone(),
                reason,
            })
            .await
    }

    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        self.log.push(format!("{}.inspect", names::SANDBOX));
        self.inspect.invoke(lease.clone()).await
    }
}
