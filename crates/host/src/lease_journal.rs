//! Finding every sandbox after a host died: the lease-journal decorator and the reaper of
//! abandoned leases (omabox extension; OpenMA has neither — see
//! `omabox_contract::journal`).
//!
//! The contract enqueues an orphan only when `terminate` fails, so a host killed mid-run
//! (kill -9, power loss) leaves compute nobody can find. [`JournaledSandbox`] wraps any
//! [`ManagedSandboxPort`] so that every lease is journaled durably the moment `acquire`
//! returns it and forgotten once the compute is destroyed; [`AbandonedLeaseReaper`] reaps the
//! journaled leases whose fence is no longer held by their generation:
//!
//! ```text
//!   acquire ─► journal.record ─► … ─► terminate ok ─► journal.forget
//!        host dies ─► fence expires ─► journal.abandoned ─► [revoke the claim's session
//!        tokens] ─► reap(lease_lost) ─► forget
//! ```
//!
//! Invariants:
//! - **No unrecorded sandbox leaves `acquire`.** If the journal cannot record a lease, the
//!   just-acquired compute is terminated (best-effort, reason `failed`) and `acquire` fails;
//!   the host then resolves `failed` as for any acquire failure. The one window left is a
//!   crash between the provider's allocation and the journal write, which no decorator can
//!   close without the runtime id in advance.
//! - **Forgetting never fails teardown.** `terminate`/`reap` succeed when the provider did;
//!   a failed `forget` is logged and the leftover entry is reaped again later, harmlessly
//!   (reap is idempotent).
//! - **A suspended runtime is forgotten.** Suspend is for `retained_runtime`: the host keeps
//!   a published retained runtime alive on purpose, so its lease must not be reaped when the
//!   fence is released. (A crash between suspend and publish therefore leaves that runtime
//!   unjournaled.)
//! - **Reaping is token-free and repeatable.** The journal holds no token, the reaper presents
//!   none, and a failed reap keeps the entry for the next pass.
//! - Compute that does not come from `acquire` (a runtime-checkpoint restore) is not seen by
//!   this decorator.
//!
//! Reaping an abandoned lease is safe because a fence that expired, was released or was
//! taken over can neither renew nor publish: that generation's compute can only end
//! `lease_lost`.

use crate::reconciler::SandboxPortResolver;
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, AcquireSandboxInput, LeaseJournalEntry, ManagedSandboxLease, ManagedSandboxPort,
    PortError, RuntimeLeaseJournalPort, RuntimeResourceFence, RuntimeResourceScope,
    SandboxHeartbeatResult, SandboxObservation, SandboxResourceCapabilities, SessionTokenPort,
    TerminationReason,
};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// `Number.MAX_SAFE_INTEGER`.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Milliseconds since the Unix epoch: when a lease was acquired.
pub type NowMs = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A [`ManagedSandboxPort`] that journals every lease it hands out (see the module doc).
#[derive(Clone)]
pub struct JournaledSandbox {
    inner: Arc<dyn ManagedSandboxPort>,
    journal: Arc<dyn RuntimeLeaseJournalPort>,
    now_ms: NowMs,
}

impl std::fmt::Debug for JournaledSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JournaledSandbox").finish_non_exhaustive()
    }
}

impl JournaledSandbox {
    /// Journals the leases of `inner` in `journal`, stamped with the system clock.
    pub fn new(
        inner: Arc<dyn ManagedSandboxPort>,
        journal: Arc<dyn RuntimeLeaseJournalPort>,
    ) -> Self {
        Self {
            inner,
            journal,
            now_ms: Arc::new(system_now_ms),
        }
    }

    /// Stamps `acquiredAt` from `now_ms` instead (tests).
    pub fn with_clock(mut self, now_ms: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        self.now_ms = Arc::new(now_ms);
        self
    }

    /// Forgets a destroyed runtime; a failure is logged, never returned (module doc).
    async fn forget(&self, scope: &RuntimeResourceScope, lease: &ManagedSandboxLease) {
        if let Err(error) = self.journal.forget(scope, lease).await {
            tracing::warn!(
                %error,
                provider = %lease.provider,
                runtime_id = %lease.runtime_id,
                "forgetting a destroyed runtime's journal entry failed; it will be reaped again"
            );
        }
    }
}

#[async_trait]
impl ManagedSandboxPort for JournaledSandbox {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxResourceCapabilities, PortError> {
        self.inner.capabilities(scope).await
    }

    async fn acquire(&self, input: AcquireSandboxInput) -> Result<ManagedSandboxLease, PortError> {
        let scope = input.scope.clone();
        let fence = input.fence.clone();
        let lease = self.inner.acquire(input).await?;
        let entry = LeaseJournalEntry {
            scope: scope.clone(),
            generation: fence.generation,
            owner_id: fence.owner_id.clone(),
            lease: lease.clone(),
            acquired_at: iso_millis((self.now_ms)()),
        };
        let Err(error) = self.journal.record(entry).await else {
            return Ok(lease);
        };
        Err(self
            .discard_unjournaled(&scope, &fence, &lease, &error)
            .await)
    }

    async fn heartbeat(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
    ) -> Result<SandboxHeartbeatResult, PortError> {
        self.inner.heartbeat(scope, fence, lease).await
    }

    async fn suspend(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<ManagedSandboxLease, PortError> {
        let suspended = self.inner.suspend(scope, fence, lease, signal).await?;
        // A retained runtime outlives its fence on purpose: never reap it as abandoned.
        self.forget(scope, lease).await;
        if suspended.runtime_id != lease.runtime_id {
            self.forget(scope, &suspended).await;
        }
        Ok(suspended)
    }

    async fn terminate(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.inner.terminate(scope, fence, lease, reason).await?;
        self.forget(scope, lease).await;
        Ok(())
    }

    async fn reap(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.inner.reap(scope, lease, reason).await?;
        self.forget(scope, lease).await;
        Ok(())
    }

    async fn inspect(&self, lease: &ManagedSandboxLease) -> Result<SandboxObservation, PortError> {
        self.inner.inspect(lease).await
    }
}

impl JournaledSandbox {
    /// The journal refused a fresh lease: terminate that compute (best-effort) so nothing
    /// unrecorded is left, and return the error `acquire` fails with (token redacted).
    async fn discard_unjournaled(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        lease: &ManagedSandboxLease,
        error: &PortError,
    ) -> PortError {
        let token = fence.token.expose();
        let error = error.redacted(token);
        let runtime_id = &lease.runtime_id;
        match self
            .inner
            .terminate(scope, fence, lease, TerminationReason::Failed)
            .await
        {
            Ok(()) => {
                tracing::warn!(%error, %runtime_id, "lease journal failed; sandbox terminated");
                PortError::new(format!(
                    "Sandbox lease {runtime_id} could not be journaled, so it was terminated: \
                     {error}"
                ))
            }
            Err(terminate) => {
                let terminate = terminate.redacted(token);
                tracing::error!(
                    %error, %terminate, %runtime_id, provider = %lease.provider,
                    "lease journal failed and terminating the sandbox failed too"
                );
                PortError::new(format!(
                    "Sandbox lease {runtime_id} could not be journaled ({error}), and \
                     terminating it failed: {terminate}"
                ))
            }
        }
    }
}

/// One abandoned lease a pass could not reap (or could not forget after reaping).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbandonedLeaseFailure {
    /// The journal id (`runtimeOrphanId` form).
    pub id: String,
    /// The lease's provider.
    pub provider: String,
    /// The lease's runtime id.
    pub runtime_id: String,
    /// What failed. Never a token: the journal holds none and the reaper presents none.
    pub error: String,
}

/// Outcome of [`AbandonedLeaseReaper::run_once`] or [`AbandonedLeaseReaper::run_all`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AbandonedLeaseSummary {
    /// Abandoned entries listed (each once).
    pub inspected: u64,
    /// Entries reaped and forgotten.
    pub reaped: u64,
    /// Abandoned entries still in the journal afterwards, counted there (not `inspected -
    /// reaped`: a limited pass leaves the entries it never listed, and a host may have died
    /// meanwhile).
    pub remaining: u64,
    /// Why each entry that failed is still there.
    pub errors: Vec<AbandonedLeaseFailure>,
}

/// Reaps the journaled leases whose fence is no longer held (see the module doc), and revokes
/// the session tokens of the claims it reaps.
#[derive(Clone)]
pub struct AbandonedLeaseReaper {
    journal: Arc<dyn RuntimeLeaseJournalPort>,
    resolver: SandboxPortResolver,
    tokens: Option<Arc<dyn SessionTokenPort>>,
}

impl std::fmt::Debug for AbandonedLeaseReaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbandonedLeaseReaper")
            .finish_non_exhaustive()
    }
}

impl AbandonedLeaseReaper {
    /// Reaps each abandoned lease through the port `resolver` returns for its provider (the
    /// bare backend port or a [`JournaledSandbox`]; either forgets the entry).
    pub fn new(journal: Arc<dyn RuntimeLeaseJournalPort>, resolver: SandboxPortResolver) -> Self {
        Self {
            journal,
            resolver,
            tokens: None,
        }
    }

    /// Also revokes, before reaping each lease, the session tokens of its claim (scope,
    /// generation): a dead host's token dies with its reaped lease. A failed revoke keeps
    /// the entry for the next pass.
    pub fn with_session_tokens(mut self, tokens: Arc<dyn SessionTokenPort>) -> Self {
        self.tokens = Some(tokens);
        self
    }

    /// One pass over up to `limit` abandoned leases: each is reaped with `lease_lost` and
    /// then forgotten; a failure leaves it journaled for the next pass and is reported in the
    /// summary. `limit` must be a positive safe integer. Fails only when listing the journal
    /// fails. Safe to repeat, and to run while hosts are running: held leases are never
    /// listed.
    pub async fn run_once(&self, limit: u64) -> Result<AbandonedLeaseSummary, PortError> {
        check_limit(limit)?;
        let abandoned = self
            .journal
            .abandoned(usize::try_from(limit).unwrap_or(usize::MAX))
            .await?;
        let mut summary = AbandonedLeaseSummary::default();
        self.reap_all_of(&abandoned, &mut summary).await;
        summary.remaining = self.count_abandoned().await?;
        Ok(summary)
    }

    /// Passes of up to `page` entries until nothing reapable is left (every abandoned entry
    /// was reaped or failed once in this call) or `max` entries were inspected: a dead host
    /// never waits for a second `omabox reap` because it was the 101st. An entry that fails
    /// is tried once per call and reported; the next pass lists past it (the journal is
    /// ordered by id, so the failures come first and the page grows by them). `remaining`
    /// is counted in the journal afterwards. Fails only when listing the journal fails.
    pub async fn run_all(
        &self,
        page: u64,
        max: Option<u64>,
    ) -> Result<AbandonedLeaseSummary, PortError> {
        check_limit(page)?;
        let mut summary = AbandonedLeaseSummary::default();
        let mut tried = std::collections::HashSet::new();
        loop {
            let budget = max.map_or(page, |max| page.min(max - summary.inspected));
            if budget == 0 {
                break;
            }
            let listed = self
                .journal
                .abandoned(usize::try_from(tried.len() as u64 + budget).unwrap_or(usize::MAX))
                .await?;
            let fresh: Vec<LeaseJournalEntry> = listed
                .into_iter()
                .filter(|entry| !tried.contains(&entry.id()))
                .take(usize::try_from(budget).unwrap_or(usize::MAX))
                .collect();
            if fresh.is_empty() {
                break;
            }
            tried.extend(fresh.iter().map(LeaseJournalEntry::id));
            self.reap_all_of(&fresh, &mut summary).await;
        }
        summary.remaining = self.count_abandoned().await?;
        Ok(summary)
    }

    /// Reaps each of `entries`, counting into `summary`.
    async fn reap_all_of(
        &self,
        entries: &[LeaseJournalEntry],
        summary: &mut AbandonedLeaseSummary,
    ) {
        summary.inspected += entries.len() as u64;
        for entry in entries {
            match self.reap(entry).await {
                Ok(()) => summary.reaped += 1,
                Err(error) => {
                    tracing::warn!(%error, id = %entry.id(), "abandoned lease not reaped");
                    summary.errors.push(AbandonedLeaseFailure {
                        id: entry.id(),
                        provider: entry.lease.provider.clone(),
                        runtime_id: entry.lease.runtime_id.clone(),
                        error: error.message().to_owned(),
                    });
                }
            }
        }
    }

    /// Abandoned entries in the journal now.
    async fn count_abandoned(&self) -> Result<u64, PortError> {
        Ok(self.journal.abandoned(usize::MAX).await?.len() as u64)
    }

    async fn reap(&self, entry: &LeaseJournalEntry) -> Result<(), PortError> {
        if let Some(tokens) = &self.tokens {
            tokens
                .revoke(&entry.scope, entry.generation)
                .await
                .map_err(|error| {
                    PortError::new(format!(
                        "Revoking the claim's session token failed: {error}"
                    ))
                })?;
        }
        let provider = &entry.lease.provider;
        let sandbox = (self.resolver)(provider).ok_or_else(|| {
            PortError::new(format!(
                "No sandbox backend is registered for provider {provider}"
            ))
        })?;
        sandbox
            .reap(&entry.scope, &entry.lease, TerminationReason::LeaseLost)
            .await?;
        self.journal
            .forget(&entry.scope, &entry.lease)
            .await
            .map_err(|error| {
                PortError::new(format!(
                    "Reaped, but forgetting the journal entry failed: {error}"
                ))
            })
    }
}

fn check_limit(limit: u64) -> Result<(), PortError> {
    if limit == 0 || limit > MAX_SAFE_INTEGER {
        return Err(PortError::new(
            "Abandoned lease reap limit must be a positive integer",
        ));
    }
    Ok(())
}

fn system_now_ms() -> u64 {
    // A clock before 1970 is a broken machine; stamp the epoch rather than panic.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// `new Date(ms).toISOString()`: `2026-12-02T14:39:12.123Z` (years past 9999 clamp).
fn iso_millis(ms: u64) -> String {
    const MAX_MS: u64 = 253_402_300_799_999;
    let format = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms.min(MAX_MS)) * 1_000_000)
        .ok()
        .and_then(|at| at.format(format).ok())
        .unwrap_or_else(|| "9999-12-31T23:59:59.999Z".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquired_at_renders_like_javascript() {
        assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_millis(1_796_222_352_123), "2026-12-02T14:39:12.123Z");
        assert_eq!(iso_millis(u64::MAX), "9999-12-31T23:59:59.999Z");
        assert!(system_now_ms() > 1_600_000_000_000);
    }

    #[test]
    fn the_summary_is_camel_case_json() {
        let summary = AbandonedLeaseSummary {
            inspected: 2,
            reaped: 1,
            remaining: 1,
            errors: vec![AbandonedLeaseFailure {
                id: r#"["w","e","s","k",1,"gone","r"]"#.into(),
                provider: "gone".into(),
                runtime_id: "r".into(),
                error: "No sandbox backend is registered for provider gone".into(),
            }],
        };
        assert_eq!(
            serde_json::to_value(&summary).unwrap(),
            serde_json::json!({
                "inspected": 2, "reaped": 1, "remaining": 1,
                "errors": [{
                    "id": r#"["w","e","s","k",1,"gone","r"]"#,
                    "provider": "gone",
                    "runtimeId": "r",
                    "error": "No sandbox backend is registered for provider gone",
                }],
            })
        );
    }
}
