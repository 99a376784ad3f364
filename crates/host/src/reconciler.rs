//! The orphan reconciler: retries the reap of compute whose terminate failed.
//!
//! An orphan record holds the serialized lease and never a fence token, so a reap works from a
//! fresh process with no in-memory handle. One pass (`run_once`) lists up to `limit` records
//! and, for each, reaps then resolves it; any failure counts an attempt on the record
//! (`failed`) and leaves it queued for the next pass.
//!
//! The sandbox port is either fixed (the contract's `{orphans, sandbox}` form) or resolved per
//! record from its lease's provider, for a process that serves several backends. A record whose
//! provider has no registered backend stays queued with the error "No sandbox backend is
//! registered for provider <p>".

use omabox_contract::{ManagedSandboxPort, PortError, RuntimeOrphanPort, RuntimeOrphanRecord};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// `Number.MAX_SAFE_INTEGER`.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Finds the sandbox port that can reap a lease of the given provider.
pub type SandboxPortResolver =
    Arc<dyn Fn(&str) -> Option<Arc<dyn ManagedSandboxPort>> + Send + Sync>;

/// Outcome of one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReconcileSummary {
    /// Records listed.
    pub inspected: u64,
    /// Records reaped and resolved.
    pub resolved: u64,
    /// Records left queued: `inspected - resolved` for [`ManagedRuntimeOrphanReconciler::
    /// run_once`] (the reference's figure); everything still queued for
    /// [`ManagedRuntimeOrphanReconciler::run_all`].
    pub remaining: u64,
}

#[derive(Clone)]
enum SandboxSource {
    Fixed(Arc<dyn ManagedSandboxPort>),
    ByProvider(SandboxPortResolver),
}

/// `createManagedRuntimeOrphanReconciler`.
#[derive(Clone)]
pub struct ManagedRuntimeOrphanReconciler {
    orphans: Arc<dyn RuntimeOrphanPort>,
    sandbox: SandboxSource,
}

impl std::fmt::Debug for ManagedRuntimeOrphanReconciler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sandbox = match self.sandbox {
            SandboxSource::Fixed(_) => "fixed",
            SandboxSource::ByProvider(_) => "by provider",
        };
        f.debug_struct("ManagedRuntimeOrphanReconciler")
            .field("sandbox", &sandbox)
            .finish_non_exhaustive()
    }
}

/// Validates a limit given as a JSON number (as the TypeScript original receives it): a
/// positive safe integer, else "Runtime orphan reconcile limit must be a positive integer".
pub fn reconcile_limit_from_json(limit: &serde_json::Value) -> Result<u64, PortError> {
    let limit = limit.as_number().and_then(|number| {
        number.as_u64().or_else(|| {
            let float = number.as_f64()?;
            // Integral and within u64 range; the safe-integer bound is checked below.
            (float.fract() == 0.0 && float >= 0.0 && float <= MAX_SAFE_INTEGER as f64)
                .then_some(float as u64)
        })
    });
    match limit {
        Some(limit) if (1..=MAX_SAFE_INTEGER).contains(&limit) => Ok(limit),
        _ => Err(invalid_limit()),
    }
}

fn invalid_limit() -> PortError {
    PortError::new("Runtime orphan reconcile limit must be a positive integer")
}

impl ManagedRuntimeOrphanReconciler {
    /// Reaps every orphan through one sandbox port.
    pub fn new(orphans: Arc<dyn RuntimeOrphanPort>, sandbox: Arc<dyn ManagedSandboxPort>) -> Self {
        Self {
            orphans,
            sandbox: SandboxSource::Fixed(sandbox),
        }
    }

    /// Reaps each orphan through the port `resolver` returns for its lease's provider.
    pub fn with_resolver(
        orphans: Arc<dyn RuntimeOrphanPort>,
        resolver: SandboxPortResolver,
    ) -> Self {
        Self {
            orphans,
            sandbox: SandboxSource::ByProvider(resolver),
        }
    }

    /// One pass over up to `limit` orphans. `limit` must be a positive safe integer. Fails
    /// only when the orphan port itself fails (`list`, or recording a failure).
    pub async fn run_once(&self, limit: u64) -> Result<ReconcileSummary, PortError> {
        if limit == 0 || limit > MAX_SAFE_INTEGER {
            return Err(invalid_limit());
        }
        let pending = self
            .orphans
            .list(usize::try_from(limit).unwrap_or(usize::MAX))
            .await?;
        let mut resolved = 0u64;
        for orphan in &pending {
            match self.reap(orphan).await {
                Ok(()) => resolved += 1,
                Err(error) => self.orphans.failed(&orphan.id, &error).await?,
            }
        }
        let inspected = pending.len() as u64;
        Ok(ReconcileSummary {
            inspected,
            resolved,
            remaining: inspected - resolved,
        })
    }

    /// omabox extension: passes of up to `page` orphans until every queued orphan was tried
    /// once in this call (or `max` were inspected), so a pass's page size never leaves dead
    /// compute for a later call. A failing orphan counts its attempt (`failed`) and is not
    /// retried in the same call; the next pass lists past it. `remaining` is what is still
    /// queued afterwards, counted in the queue. Fails only when the orphan port fails.
    pub async fn run_all(
        &self,
        page: u64,
        max: Option<u64>,
    ) -> Result<ReconcileSummary, PortError> {
        if page == 0 || page > MAX_SAFE_INTEGER {
            return Err(invalid_limit());
        }
        let (mut inspected, mut resolved) = (0u64, 0u64);
        let mut tried = std::collections::HashSet::new();
        loop {
            let budget = max.map_or(page, |max| page.min(max - inspected));
            if budget == 0 {
                break;
            }
            let listed = self
                .orphans
                .list(usize::try_from(tried.len() as u64 + budget).unwrap_or(usize::MAX))
                .await?;
            let fresh: Vec<RuntimeOrphanRecord> = listed
                .into_iter()
                .filter(|orphan| !tried.contains(&orphan.id))
                .take(usize::try_from(budget).unwrap_or(usize::MAX))
                .collect();
            if fresh.is_empty() {
                break;
            }
            for orphan in &fresh {
                tried.insert(orphan.id.clone());
                inspected += 1;
                match self.reap(orphan).await {
                    Ok(()) => resolved += 1,
                    Err(error) => self.orphans.failed(&orphan.id, &error).await?,
                }
            }
        }
        let remaining = self.orphans.list(usize::MAX).await?.len() as u64;
        Ok(ReconcileSummary {
            inspected,
            resolved,
            remaining,
        })
    }

    async fn reap(&self, orphan: &RuntimeOrphanRecord) -> Result<(), PortError> {
        let sandbox = match &self.sandbox {
            SandboxSource::Fixed(sandbox) => Arc::clone(sandbox),
            SandboxSource::ByProvider(resolve) => {
                resolve(&orphan.sandbox.provider).ok_or_else(|| {
                    PortError::new(format!(
                        "No sandbox backend is registered for provider {}",
                        orphan.sandbox.provider
                    ))
                })?
            }
        };
        sandbox
            .reap(&orphan.scope, &orphan.sandbox, orphan.reason)
            .await?;
        self.orphans.resolve(&orphan.id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::{
        EnqueueRuntimeOrphanInput, ManagedSandboxLease, RuntimeResourceScope, TerminationReason,
        runtime_orphan_id,
    };
    use omabox_test_support::drivers::CapabilityOnlySandbox;
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    /// The contract's in-memory orphan queue (`MemoryRuntimeOrphanPort`).
    #[derive(Default)]
    struct MemoryOrphans {
        records: Mutex<BTreeMap<String, RuntimeOrphanRecord>>,
    }

    #[async_trait::async_trait]
    impl RuntimeOrphanPort for MemoryOrphans {
        async fn enqueue(&self, input: EnqueueRuntimeOrphanInput) -> Result<(), PortError> {
            let id = runtime_orphan_id(&input.scope, input.generation, &input.sandbox);
            let mut records = self.records.lock().unwrap();
            let attempts = records.get(&id).map_or(0, |record| record.attempts);
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
            Ok(self
                .records
                .lock()
                .unwrap()
                .values()
                .take(limit)
                .cloned()
                .collect())
        }
        async fn failed(&self, id: &str, error: &PortError) -> Result<(), PortError> {
            if let Some(record) = self.records.lock().unwrap().get_mut(id) {
                record.attempts += 1;
                record.last_error = error.message().to_owned();
            }
            Ok(())
        }
        async fn resolve(&self, id: &str) -> Result<(), PortError> {
            self.records.lock().unwrap().remove(id);
            Ok(())
        }
    }

    fn scope() -> RuntimeResourceScope {
        RuntimeResourceScope::new(
            "workspace_fault",
            "environment_fault",
            "session_fault",
            "work_fault",
        )
    }

    fn lease(provider: &str) -> ManagedSandboxLease {
        ManagedSandboxLease {
            provider: provider.into(),
            runtime_id: "runtime-fault".into(),
            metadata: None,
        }
    }

    async fn queue_with(providers: &[&str]) -> Arc<MemoryOrphans> {
        let orphans = Arc::new(MemoryOrphans::default());
        for provider in providers {
            orphans
                .enqueue(EnqueueRuntimeOrphanInput {
                    scope: scope(),
                    generation: 1,
                    owner_id: "fault-owner".into(),
                    sandbox: lease(provider),
                    reason: TerminationReason::Completed,
                    error: PortError::new("provider control plane unavailable"),
                })
                .await
                .unwrap();
        }
        orphans
    }

    #[tokio::test]
    async fn reaps_and_resolves_a_queued_orphan() {
        let orphans = queue_with(&["fake"]).await;
        let sandbox = Arc::new(CapabilityOnlySandbox::default());
        let reconciler = ManagedRuntimeOrphanReconciler::new(orphans.clone(), sandbox.clone());
        let summary = reconciler.run_once(10).await.unwrap();
        assert_eq!(
            summary,
            ReconcileSummary {
                inspected: 1,
                resolved: 1,
                remaining: 0
            }
        );
        assert_eq!(
            sandbox.reaps(),
            vec![(scope(), lease("fake"), TerminationReason::Completed)]
        );
        assert!(orphans.list(10).await.unwrap().is_empty());
        assert_eq!(
            serde_json::to_string(&summary).unwrap(),
            r#"{"inspected":1,"resolved":1,"remaining":0}"#
        );
    }

    #[tokio::test]
    async fn retains_an_orphan_and_increments_its_attempt_when_reconciliation_still_fails() {
        let orphans = queue_with(&["fake"]).await;
        let sandbox = Arc::new(CapabilityOnlySandbox::default());
        sandbox.fail_reap(PortError::new("still partitioned"));
        let reconciler = ManagedRuntimeOrphanReconciler::new(orphans.clone(), sandbox);
        let summary = reconciler.run_once(10).await.unwrap();
        assert_eq!(
            (summary.inspected, summary.resolved, summary.remaining),
            (1, 0, 1)
        );
        let records = orphans.list(10).await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].attempts, 1);
        assert_eq!(records[0].last_error, "still partitioned");
    }

    #[tokio::test]
    async fn rejects_unsafe_orphan_reconciliation_limits() {
        let orphans = queue_with(&[]).await;
        let reconciler = ManagedRuntimeOrphanReconciler::new(
            orphans,
            Arc::new(CapabilityOnlySandbox::default()),
        );
        let text = "Runtime orphan reconcile limit must be a positive integer";
        assert_eq!(reconciler.run_once(0).await.unwrap_err().message(), text);
        assert_eq!(
            reconciler.run_once(1 << 53).await.unwrap_err().message(),
            text
        );
        for limit in [
            serde_json::json!(0),
            serde_json::json!(1.5),
            serde_json::json!(-1),
            serde_json::json!("3"),
            serde_json::json!(9007199254740992u64),
        ] {
            assert_eq!(
                reconcile_limit_from_json(&limit).unwrap_err().message(),
                text,
                "{limit}"
            );
        }
        assert_eq!(
            reconcile_limit_from_json(&serde_json::json!(10)).unwrap(),
            10
        );
        assert_eq!(
            reconcile_limit_from_json(&serde_json::json!(2.0)).unwrap(),
            2
        );
    }

    #[tokio::test]
    async fn lists_at_most_the_limit() {
        let orphans = Arc::new(MemoryOrphans::default());
        for runtime in ["a", "b", "c"] {
            orphans
                .enqueue(EnqueueRuntimeOrphanInput {
                    scope: scope(),
                    generation: 1,
                    owner_id: "o".into(),
                    sandbox: ManagedSandboxLease {
                        provider: "fake".into(),
                        runtime_id: runtime.into(),
                        metadata: None,
                    },
                    reason: TerminationReason::Failed,
                    error: PortError::new("x"),
                })
                .await
                .unwrap();
        }
        let sandbox = Arc::new(CapabilityOnlySandbox::default());
        let reconciler = ManagedRuntimeOrphanReconciler::new(orphans.clone(), sandbox.clone());
        let summary = reconciler.run_once(2).await.unwrap();
        assert_eq!(
            (summary.inspected, summary.resolved, summary.remaining),
            (2, 2, 0)
        );
        assert_eq!(orphans.list(10).await.unwrap().len(), 1);
    }

    #[tokio::test]
    async fn keeps_an_orphan_of_an_unregistered_provider_queued_with_a_clear_error() {
        let orphans = queue_with(&["linux", "unknown-backend"]).await;
        let linux = Arc::new(CapabilityOnlySandbox::default());
        let resolver: SandboxPortResolver = {
            let linux = linux.clone();
            Arc::new(move |provider: &str| {
                (provider == "linux").then(|| linux.clone() as Arc<dyn ManagedSandboxPort>)
            })
        };
        let reconciler = ManagedRuntimeOrphanReconciler::with_resolver(orphans.clone(), resolver);
        let summary = reconciler.run_once(10).await.unwrap();
        assert_eq!(
            (summary.inspected, summary.resolved, summary.remaining),
            (2, 1, 1)
        );
        assert_eq!(linux.reaps().len(), 1);
        let records = orphans.list(10).await.unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].sandbox.provider, "unknown-backend");
        assert_eq!(records[0].attempts, 1);
        assert_eq!(
            records[0].last_error,
            "No sandbox backend is registered for provider unknown-backend"
        );
    }
}
