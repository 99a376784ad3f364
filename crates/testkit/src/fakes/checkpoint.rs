//! [`FakeRuntimeCheckpoint`]: a scripted `RuntimeCheckpointPort`.
//!
//! Defaults: `create` echoes a compatible ref (id `checkpoint_1`, every identity field taken
//! from the input, as the fault matrix's compatible provider does); `restore` → a lease
//! `{fake, runtime-restored}`.

use super::log::{CallLog, names};
use super::step::Step;
use async_trait::async_trait;
use omabox_contract::{
    CreateRuntimeCheckpointInput, ManagedSandboxLease, PortError, RuntimeCheckpointPort,
    RuntimeCheckpointRef, RuntimeResourceFence, RuntimeResourceScope,
};

/// Input of `restore`.
#[derive(Debug, Clone)]
pub struct RestoreCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The ref to restore.
    pub checkpoint: RuntimeCheckpointRef,
}

/// The ref a compatible provider returns for `input`, with the given id.
pub fn compatible_ref(
    input: &CreateRuntimeCheckpointInput,
    checkpoint_id: &str,
) -> RuntimeCheckpointRef {
    RuntimeCheckpointRef {
        provider: input.sandbox.provider.clone(),
        checkpoint_id: checkpoint_id.to_owned(),
        kind: input.kind,
        source_runtime_id: input.sandbox.runtime_id.clone(),
        session_id: input.scope.session_id.clone(),
        work_generation: input.fence.generation,
        workspace_revision: input.workspace_revision,
        harness_version: input.harness_version.clone(),
        runtime_identity: input.runtime_identity.clone(),
    }
}

/// A scripted runtime checkpoint port.
#[derive(Debug)]
pub struct FakeRuntimeCheckpoint {
    log: CallLog,
    /// `create`.
    pub create: Step<CreateRuntimeCheckpointInput, RuntimeCheckpointRef>,
    /// `restore`.
    pub restore: Step<RestoreCall, ManagedSandboxLease>,
}

impl FakeRuntimeCheckpoint {
    /// A compatible provider.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            create: Step::new(|input: CreateRuntimeCheckpointInput| async move {
                Ok(compatible_ref(&input, "checkpoint_1"))
            }),
            restore: Step::new(|_| async {
                Ok(ManagedSandboxLease {
                    provider: "fake".into(),
                    runtime_id: "runtime-restored".into(),
                    metadata: None,
                })
            }),
        }
    }
}

#[async_trait]
impl RuntimeCheckpointPort for FakeRuntimeCheckpoint {
    async fn create(
        &self,
        input: CreateRuntimeCheckpointInput,
    ) -> Result<RuntimeCheckpointRef, PortError> {
        self.log
            .push(format!("{}.create", names::RUNTIME_CHECKPOINT));
        self.create.invoke(input).await
    }

    async fn restore(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        checkpoint: &RuntimeCheckpointRef,
    ) -> Result<ManagedSandboxLease, PortError> {
        self.log
            .push(format!("{}.restore", names::RUNTIME_CHECKPOINT));
        self.restore
            .invoke(RestoreCall {
                scope: scope.clone(),
                fence: fence.clone(),
                checkpoint: checkpoint.clone(),
            })
            .await
    }
}
