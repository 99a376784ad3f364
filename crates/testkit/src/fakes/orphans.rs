//! [`FakeOrphans`]: a `RuntimeOrphanPort` with the reference in-memory semantics
//! (`omabox_store::MemoryOrphanStore`: upsert by id keeping attempts, list in id order,
//! `failed` counts an attempt, `resolve` deletes) behind scriptable steps, so a test can make
//! `enqueue` fail while the others keep working.

use super::log::{CallLog, names};
use super::step::Step;
use async_trait::async_trait;
use omabox_contract::{
    EnqueueRuntimeOrphanInput, PortError, RuntimeOrphanPort, RuntimeOrphanRecord,
};
use omabox_store::MemoryOrphanStore;
use std::sync::Arc;

/// Input of `failed`.
#[derive(Debug, Clone)]
pub struct OrphanFailedCall {
    /// The record.
    pub id: String,
    /// The reap error.
    pub error: PortError,
}

/// A scripted orphan queue over an in-memory store.
#[derive(Debug)]
pub struct FakeOrphans {
    log: CallLog,
    /// The backing queue.
    pub store: Arc<MemoryOrphanStore>,
    /// `enqueue`.
    pub enqueue: Step<EnqueueRuntimeOrphanInput, ()>,
    /// `list`.
    pub list: Step<usize, Vec<RuntimeOrphanRecord>>,
    /// `failed`.
    pub failed: Step<OrphanFailedCall, ()>,
    /// `resolve`.
    pub resolve: Step<String, ()>,
}

impl FakeOrphans {
    /// An empty queue.
    pub fn new(log: CallLog) -> Self {
        let store = Arc::new(MemoryOrphanStore::new());
        Self {
            log,
            enqueue: Step::new({
                let store = Arc::clone(&store);
                move |input| {
                    let store = Arc::clone(&store);
                    async move { store.enqueue(input).await }
                }
            }),
            list: Step::new({
                let store = Arc::clone(&store);
                move |limit| {
                    let store = Arc::clone(&store);
                    async move { store.list(limit).await }
                }
            }),
            failed: Step::new({
                let store = Arc::clone(&store);
                move |call: OrphanFailedCall| {
                    let store = Arc::clone(&store);
                    async move { store.failed(&call.id, &call.error).await }
                }
            }),
            resolve: Step::new({
                let store = Arc::clone(&store);
                move |id: String| {
                    let store = Arc::clone(&store);
                    async move { store.resolve(&id).await }
                }
            }),
            store,
        }
    }

    /// Every queued record, in id order.
    pub fn records(&self) -> Vec<RuntimeOrphanRecord> {
        self.store.snapshot()
    }
}

#[async_trait]
impl RuntimeOrphanPort for FakeOrphans {
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
        self.log.push(format!("{}.enqueue", names::ORPHANS));
        self.enqueue.invoke(input).await
    }

    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError> {
        self.log.push(format!("{}.list", names::ORPHANS));
        self.list.invoke(limit).await
    }

    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
        self.log.push(format!("{}.failed", names::ORPHANS));
        self.failed
            .invoke(OrphanFailedCall {
                id: id.to_owned(),
                error: error.clone(),
            })
            .await
    }

    async fn resolve(&self, id: &str) -> Result<(), PortError> {
        self.log.push(format!("{}.resolve", names::ORPHANS));
        self.resolve.invoke(id.to_owned()).await
    }
}
