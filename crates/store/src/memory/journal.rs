//! `MemoryLeaseJournal` and `MemoryUsageLedger`: the in-memory twins of the SQLite lease
//! journal and usage ledger (omabox extensions; no reference twin exists).

use super::fence::MemoryFenceStore;
use async_trait::async_trait;
use omabox_contract::{
    LeaseJournalEntry, ManagedSandboxLease, PortError, RuntimeLeaseJournalPort,
    RuntimeResourceScope, UsageKind, UsageLedgerPort, UsageRecord,
};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every mutation is a single insert or remove, so a poisoned map is still consistent.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// An in-memory [`RuntimeLeaseJournalPort`]: entries by id, listed in id order.
///
/// It answers `abandoned` from the [`MemoryFenceStore`] it was given (the twin of the SQLite
/// join on the fence table), with that store's clock.
pub struct MemoryLeaseJournal {
    entries: Mutex<BTreeMap<String, LeaseJournalEntry>>,
    fences: Arc<MemoryFenceStore>,
}

impl MemoryLeaseJournal {
    /// An empty journal whose fence state is `fences`.
    pub fn new(fences: Arc<MemoryFenceStore>) -> Self {
        Self {
            entries: Mutex::new(BTreeMap::new()),
            fences,
        }
    }
}

impl fmt::Debug for MemoryLeaseJournal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryLeaseJournal")
            .field("entries", &lock(&self.entries).len())
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl RuntimeLeaseJournalPort for MemoryLeaseJournal {
    async fn record(&self, entry: LeaseJournalEntry) -> Result<(), PortError> {
        let mut entries = lock(&self.entries);
        let id = entry.id();
        match entries.get_mut(&id) {
            // Same compute again: keep the observed start.
            Some(existing) => {
                existing.owner_id = entry.owner_id;
                existing.lease = entry.lease;
            }
            None => {
                entries.insert(id, entry);
            }
        }
        Ok(())
    }

    async fn forget(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError> {
        lock(&self.entries).retain(|_, entry| {
            !(entry.scope == *scope
                && entry.lease.provider == lease.provider
                && entry.lease.runtime_id == lease.runtime_id)
        });
        Ok(())
    }

    async fn list(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        Ok(lock(&self.entries).values().take(limit).cloned().collect())
    }

    async fn abandoned(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError> {
        let entries: Vec<LeaseJournalEntry> = lock(&self.entries).values().cloned().collect();
        Ok(entries
            .into_iter()
            .filter(|entry| !self.fences.held_by(&entry.scope, entry.generation))
            .take(limit)
            .collect())
    }
}

/// An in-memory [`UsageLedgerPort`]: records in the order they were recorded, at most one per
/// `(kind, provider, runtimeId)`, and at most one of the two sandbox kinds per runtime.
#[derive(Debug, Default)]
pub struct MemoryUsageLedger {
    records: Mutex<Vec<UsageRecord>>,
}

impl MemoryUsageLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }
}

fn same_runtime(a: &UsageRecord, kind: UsageKind, provider: &str, runtime_id: &str) -> bool {
    a.kind == kind && a.provider == provider && a.runtime_id == runtime_id
}

#[async_trait]
impl UsageLedgerPort for MemoryUsageLedger {
    async fn record_usage(&self, record: UsageRecord) -> Result<(), PortError> {
        let mut records = lock(&self.records);
        let kinds = [Some(record.kind), record.kind.excludes()];
        if !records.iter().any(|existing| {
            kinds
                .iter()
                .flatten()
                .any(|kind| same_runtime(existing, *kind, &record.provider, &record.runtime_id))
        }) {
            records.push(record.clamped());
        }
        Ok(())
    }

    async fn usage(&self, session_id: &str) -> Result<Vec<UsageRecord>, PortError> {
        Ok(lock(&self.records)
            .iter()
            .filter(|record| record.scope.session_id == session_id)
            .cloned()
            .collect())
    }

    async fn list(&self, limit: usize) -> Result<Vec<UsageRecord>, PortError> {
        Ok(lock(&self.records).iter().take(limit).cloned().collect())
    }
}
