//! `MemoryOrphanStore`: the reference `MemoryRuntimeOrphanPort`.

use async_trait::async_trait;
use omabox_contract::{
    EnqueueRuntimeOrphanInput, PortError, RuntimeOrphanPort, RuntimeOrphanRecord, runtime_orphan_id,
};
use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};

/// An in-memory [`RuntimeOrphanPort`]: records by id, listed in id order.
#[derive(Debug, Default)]
pub struct MemoryOrphanStore {
    records: Mutex<BTreeMap<String, RuntimeOrphanRecord>>,
}

impl MemoryOrphanStore {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of every queued record, in id order (test helper).
    pub fn snapshot(&self) -> Vec<RuntimeOrphanRecord> {
        self.lock().values().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, RuntimeOrphanRecord>> {
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl RuntimeOrphanPort for MemoryOrphanStore {
    async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
        let id = runtime_orphan_id(&input.scope, input.generation, &input.sandbox);
        let mut records = self.lock();
        let attempts = records.get(&id).map_or(0, |existing| existing.attempts);
        records.insert(
            id.clone(),
            RuntimeOrphanRecord {
                id,
                scope: input.scope,
                generation: input.generation,
                owner_id: input.owner_id,
                sandbox: input.sandbox,
                reason: input.reason,
                attempts,
                last_error: input.error.message().to_owned(),
            },
        );
        Ok(())
    }

    async fn list(&self, limit: usize) -> Result<Vec<RuntimeOrphanRecord>, PortError> {
        Ok(self.lock().values().take(limit).cloned().collect())
    }

    async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
        if let Some(record) = self.lock().get_mut(id) {
            record.attempts = record.attempts.saturating_add(1);
            record.last_error = error.message().to_owned();
        }
        Ok(())
    }

    async fn resolve(&self, id: &str) -> Result<(), PortError> {
        self.lock().remove(id);
        Ok(())
    }
}
