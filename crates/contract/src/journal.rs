//! omabox extensions: the durable lease journal and the usage ledger.
//!
//! **Neither port exists in OpenMA.** The reference has no lease journal (NOT FOUND in the
//! reference; designed the way a user of the contract would expect), and its usage ledger is
//! `UsageStore.recordUsage` inside the hosted control plane, with no port a sandbox backend
//! could call. Both are omabox's own, kept small and token-free like the orphan queue.
//!
//! # Why a lease journal
//!
//! The contract enqueues an orphan only when `terminate` *fails*. A host that dies between
//! `acquire` and `terminate` (kill -9, power loss) enqueues nothing, and its sandbox would be
//! found by nobody. So every lease is journaled as soon as `acquire` returns it and forgotten
//! once its compute is destroyed; an entry whose fence is no longer held by its generation is
//! *abandoned* and can be reaped exactly like an orphan:
//!
//! ```text
//!   acquire ──► record(entry) ──► … ──► terminate ok ──► forget
//!                    │
//!                    └── host dies ──► fence expires ──► abandoned() ──► reap ──► forget
//! ```
//!
//! Reaping an abandoned lease is safe: a fence that expired, was released or was taken over
//! can no longer renew or publish (the fence port refuses a non-current fence), so the
//! compute of that generation can only ever end `lease_lost`.
//!
//! # Usage ledger
//!
//! `sandbox_active_seconds` (and the other two kinds of the reference) in whole seconds,
//! clamped to [`MAX_USAGE_SECONDS_PER_RECORD`] per record, idempotent per
//! `(kind, provider, runtimeId)` so a `terminate` followed by a `reap` of the same runtime
//! counts once. It is written only by a backend that really observed a start and a stop (the
//! reference: "other backends leave the kind absent rather than writing a guessed
//! duration"), best-effort: a ledger failure must never fail or delay teardown.
//!
//! Invariant of both ports: **no fence token**. Neither record has a field for one, and
//! neither port takes a fence.

use crate::{ManagedSandboxLease, PortError, RuntimeResourceScope, runtime_orphan_id};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// One journaled lease: compute that `acquire` returned and nobody has destroyed yet.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseJournalEntry {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence generation that acquired the compute.
    pub generation: u64,
    /// The owner that acquired it.
    pub owner_id: String,
    /// The lease as `acquire` returned it (JSON-safe: no handle, token or secret).
    pub lease: ManagedSandboxLease,
    /// When `acquire` returned, ISO-8601 (`Date#toISOString` form).
    pub acquired_at: String,
}

impl LeaseJournalEntry {
    /// The journal key: [`runtime_orphan_id`] of `(scope, generation, lease)`, so an entry
    /// and an orphan of the same compute share one id.
    pub fn id(&self) -> String {
        runtime_orphan_id(&self.scope, self.generation, &self.lease)
    }
}

/// The durable journal of live leases (omabox extension; see the module doc).
///
/// An implementation needs the fence state of the same store to answer
/// [`abandoned`](RuntimeLeaseJournalPort::abandoned): both live in one database (or one
/// in-memory twin), and "held" is decided with the same clock the fence port uses.
#[async_trait]
pub trait RuntimeLeaseJournalPort: Send + Sync {
    /// Records a lease right after `acquire` returned it. Upserts by [`LeaseJournalEntry::id`]:
    /// a second record of the same compute replaces owner and lease (a suspend may have
    /// changed its metadata) and keeps the first `acquiredAt`, the observed start.
    async fn record(&self, entry: LeaseJournalEntry) -> Result<(), PortError>;

    /// Forgets the runtime of `lease` in `scope` once it was destroyed (`terminate` or `reap`
    /// succeeded), whatever generation journaled it: `reap` carries no generation, and a
    /// destroyed runtime needs no entry of any generation. Unknown lease: no-op.
    async fn forget(
        &self,
        scope: &RuntimeResourceScope,
        lease: &ManagedSandboxLease,
    ) -> Result<(), PortError>;

    /// Up to `limit` entries, ordered by id.
    async fn list(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError>;

    /// Up to `limit` entries whose fence is no longer held by their generation, ordered by
    /// id: the work item's latest generation differs (taken over), or it has no active fence
    /// (released, or never acquired in this store), or the active fence has expired
    /// (`expiresAt <= now`). Entries of a fence still held are never returned.
    async fn abandoned(&self, limit: usize) -> Result<Vec<LeaseJournalEntry>, PortError>;
}

/// The most seconds one usage record may carry: 24 hours.
pub const MAX_USAGE_SECONDS_PER_RECORD: u64 = 86_400;

/// What a usage record measures: the reference's `UsageStore` kinds (exact literals), plus
/// omabox's own estimate, which is never one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageKind {
    /// A Session was alive.
    SessionAliveSeconds,
    /// A sandbox ran (from its observed start to its observed stop).
    SandboxActiveSeconds,
    /// A browser was open.
    BrowserActiveSeconds,
    /// omabox only, never a contract kind: a sandbox ran from its observed start to an
    /// *estimated* stop (its host crashed; the stop is its last sign of life). The contract
    /// forbids a guessed `sandbox_active_seconds` ("other backends leave the kind absent
    /// rather than writing a guessed duration"), so the estimate has a name of its own and a
    /// billing reader of `sandbox_active_seconds` never sees it. At most one of the two
    /// sandbox kinds is recorded per runtime.
    SandboxActiveSecondsEstimated,
}

impl UsageKind {
    /// The wire literal.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageKind::SessionAliveSeconds => "session_alive_seconds",
            UsageKind::SandboxActiveSeconds => "sandbox_active_seconds",
            UsageKind::BrowserActiveSeconds => "browser_active_seconds",
            UsageKind::SandboxActiveSecondsEstimated => "sandbox_active_seconds_estimated",
        }
    }

    /// True for the reference's kinds; false for omabox's estimate.
    pub fn is_contract_kind(self) -> bool {
        self != UsageKind::SandboxActiveSecondsEstimated
    }

    /// The kind a runtime may not also have a record of: the two sandbox kinds exclude each
    /// other (a runtime's stop is observed or estimated, never both).
    pub fn excludes(self) -> Option<UsageKind> {
        match self {
            UsageKind::SandboxActiveSeconds => Some(UsageKind::SandboxActiveSecondsEstimated),
            UsageKind::SandboxActiveSecondsEstimated => Some(UsageKind::SandboxActiveSeconds),
            UsageKind::SessionAliveSeconds | UsageKind::BrowserActiveSeconds => None,
        }
    }

    /// The kind of a wire literal, if it is one.
    pub fn parse(literal: &str) -> Option<Self> {
        match literal {
            "session_alive_seconds" => Some(UsageKind::SessionAliveSeconds),
            "sandbox_active_seconds" => Some(UsageKind::SandboxActiveSeconds),
            "browser_active_seconds" => Some(UsageKind::BrowserActiveSeconds),
            "sandbox_active_seconds_estimated" => Some(UsageKind::SandboxActiveSecondsEstimated),
            _ => None,
        }
    }
}

impl std::fmt::Display for UsageKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One measured interval of one runtime.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageRecord {
    /// What was measured.
    pub kind: UsageKind,
    /// The work item the runtime served.
    pub scope: RuntimeResourceScope,
    /// The provider of the runtime.
    pub provider: String,
    /// The provider's runtime id.
    pub runtime_id: String,
    /// Whole seconds, at most [`MAX_USAGE_SECONDS_PER_RECORD`] (the ledger clamps).
    pub seconds: u64,
    /// Observed start, ISO-8601.
    pub started_at: String,
    /// Observed stop, ISO-8601.
    pub stopped_at: String,
    /// `stopped_at` is an estimate, not an observation: the runtime was found already dead
    /// (its host crashed), and the stop is the last moment it was known alive, or — when not
    /// even that is known — the moment it was found dead (an upper bound). True exactly for
    /// [`UsageKind::SandboxActiveSecondsEstimated`]; a contract kind is never estimated.
    #[serde(default)]
    pub stop_estimated: bool,
}

impl UsageRecord {
    /// Whole seconds between two millisecond timestamps (rounded down; zero if the clock went
    /// backwards), clamped to [`MAX_USAGE_SECONDS_PER_RECORD`].
    pub fn seconds_between(started_ms: u64, stopped_ms: u64) -> u64 {
        (stopped_ms.saturating_sub(started_ms) / 1_000).min(MAX_USAGE_SECONDS_PER_RECORD)
    }

    /// This record as a ledger keeps it: `seconds` clamped to
    /// [`MAX_USAGE_SECONDS_PER_RECORD`], and a sandbox record whose stop was estimated under
    /// omabox's estimated kind (never the contract's `sandbox_active_seconds`; the estimated
    /// kind always says `stop_estimated`).
    pub fn clamped(mut self) -> Self {
        self.seconds = self.seconds.min(MAX_USAGE_SECONDS_PER_RECORD);
        if self.stop_estimated && self.kind == UsageKind::SandboxActiveSeconds {
            self.kind = UsageKind::SandboxActiveSecondsEstimated;
        }
        if self.kind == UsageKind::SandboxActiveSecondsEstimated {
            self.stop_estimated = true;
        }
        self
    }
}

/// The usage ledger (omabox extension; see the module doc).
///
/// Callers treat it as best-effort: a failed `record_usage` is logged, never propagated into
/// a teardown result.
#[async_trait]
pub trait UsageLedgerPort: Send + Sync {
    /// Records `record` with its seconds clamped to 24 h. Idempotent per
    /// `(kind, provider, runtimeId)`: the first record wins and later ones are ignored, so the
    /// stop observed first (terminate) is the one billed, and a retry (reap) adds nothing.
    async fn record_usage(&self, record: UsageRecord) -> Result<(), PortError>;

    /// Every record of a Session, in the order they were recorded.
    async fn usage(&self, session_id: &str) -> Result<Vec<UsageRecord>, PortError>;

    /// Up to `limit` records, in the order they were recorded.
    async fn list(&self, limit: usize) -> Result<Vec<UsageRecord>, PortError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> LeaseJournalEntry {
        LeaseJournalEntry {
            scope: RuntimeResourceScope::new("w", "e", "s", "k"),
            generation: 2,
            owner_id: "host-a".into(),
            lease: ManagedSandboxLease {
                provider: "linux".into(),
                runtime_id: "r1".into(),
                metadata: None,
            },
            acquired_at: "2026-12-02T14:39:12.000Z".into(),
        }
    }

    #[test]
    fn an_entry_shares_its_id_with_the_orphan_of_the_same_compute() {
        assert_eq!(entry().id(), r#"["w","e","s","k",2,"linux","r1"]"#);
    }

    #[test]
    fn entries_are_camel_case_and_carry_no_token() {
        let json = serde_json::to_string(&entry()).unwrap();
        assert_eq!(
            json,
            r#"{"scope":{"workspaceId":"w","environmentId":"e","sessionId":"s","workId":"k"},"generation":2,"ownerId":"host-a","lease":{"provider":"linux","runtimeId":"r1"},"acquiredAt":"2026-12-02T14:39:12.000Z"}"#
        );
        assert!(!json.to_lowercase().contains("token"));
    }

    #[test]
    fn usage_kinds_use_the_reference_literals() {
        for kind in [
            UsageKind::SessionAliveSeconds,
            UsageKind::SandboxActiveSeconds,
            UsageKind::BrowserActiveSeconds,
            UsageKind::SandboxActiveSecondsEstimated,
        ] {
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
            assert_eq!(UsageKind::parse(kind.as_str()), Some(kind));
        }
        assert_eq!(UsageKind::parse("sandbox_seconds"), None);
        // The estimate is omabox's own kind, excluding the contract's for one runtime.
        assert!(!UsageKind::SandboxActiveSecondsEstimated.is_contract_kind());
        assert!(UsageKind::SandboxActiveSeconds.is_contract_kind());
        assert_eq!(
            UsageKind::SandboxActiveSeconds.excludes(),
            Some(UsageKind::SandboxActiveSecondsEstimated)
        );
        assert_eq!(UsageKind::SessionAliveSeconds.excludes(), None);
    }

    #[test]
    fn seconds_are_whole_and_clamped_to_a_day() {
        assert_eq!(UsageRecord::seconds_between(1_000, 2_999), 1);
        assert_eq!(UsageRecord::seconds_between(5_000, 1_000), 0);
        assert_eq!(UsageRecord::seconds_between(0, u64::MAX), 86_400);
        let record = UsageRecord {
            kind: UsageKind::SandboxActiveSeconds,
            scope: RuntimeResourceScope::new("w", "e", "s", "k"),
            provider: "linux".into(),
            runtime_id: "r1".into(),
            seconds: 100_000,
            started_at: "a".into(),
            stopped_at: "b".into(),
            stop_estimated: false,
        };
        assert_eq!(record.clamped().seconds, MAX_USAGE_SECONDS_PER_RECORD);
    }
}
