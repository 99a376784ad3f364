//! [`FakeSessionInputs`]: a scripted `SessionInputMaterializerPort`.
//!
//! Defaults: `materialize` → ok; `synchronize` → ok (reference §8.0: the indexed tests'
//! materializers have no `synchronize`, which the newest host requires, so the fake's is a
//! no-op).

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, DownloadedSessionFile, MaterializeSessionInputsInput, PortError,
    SessionInputAccessPort, SessionInputLifecycleContext, SessionInputMaterializerPort,
};

/// Input of `synchronize`.
#[derive(Debug, Clone)]
pub struct SynchronizeCall {
    /// The lifecycle context.
    pub context: SessionInputLifecycleContext,
    /// `<workId>:<generation>:session-inputs-synchronize-<stage>`.
    pub idempotency_key: String,
}

impl WithSignal for MaterializeSessionInputsInput {
    fn signal(&self) -> AbortSignal {
        self.context.signal.clone()
    }
}

impl WithSignal for SynchronizeCall {
    fn signal(&self) -> AbortSignal {
        self.context.signal.clone()
    }
}

/// A scripted Session-input materializer.
#[derive(Debug)]
pub struct FakeSessionInputs {
    log: CallLog,
    /// `materialize`.
    pub materialize: Step<MaterializeSessionInputsInput, ()>,
    /// `synchronize`.
    pub synchronize: Step<SynchronizeCall, ()>,
}

impl FakeSessionInputs {
    /// A materializer whose calls succeed.
    pub fn new(log: CallLog) -> Self {
        Self {
            log,
            materialize: Step::new(|_| async { Ok(()) }),
            synchronize: Step::new(|_| async { Ok(()) }),
        }
    }
}

#[async_trait]
impl SessionInputMaterializerPort for FakeSessionInputs {
    async fn materialize(&self, input: MaterializeSessionInputsInput) -> Result<(), PortError> {
        self.log
            .push(format!("{}.materialize", names::SESSION_INPUTS));
        self.materialize.invoke(input).await
    }

    async fn synchronize(
        &self,
        context: SessionInputLifecycleContext,
        idempotency_key: String,
    ) -> Result<(), PortError> {
        self.log
            .push(format!("{}.synchronize", names::SESSION_INPUTS));
        self.synchronize
            .invoke(SynchronizeCall {
                context,
                idempotency_key,
            })
            .await
    }
}

/// A per-claim content accessor with no content: tests compare it by identity.
#[derive(Debug, Default)]
pub struct FakeSessionAccess;

#[async_trait]
impl SessionInputAccessPort for FakeSessionAccess {
    async fn download_file(
        &self,
        file_id: &str,
        _signal: AbortSignal,
    ) -> Result<DownloadedSessionFile, PortError> {
        Err(PortError::new(format!("no Session file {file_id}")))
    }
}
