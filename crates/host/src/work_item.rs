//! One work item, composed: the policy that turns a session into a fenced work item, and the
//! runner that admits a provider and runs the transaction with omabox's decorations. Every
//! front end (`omabox run` today, `omabox serve` over HTTP later) runs work items through
//! [`WorkItemRunner`]; it only parses its input and renders the run's observer events.
//!
//! ```text
//!   session ──► scope local/default/<session>/main, policy (owner, TTLs, heartbeat)
//!   WorkItemRunner::run(input + observer)
//!     ├─ fences  = SessionTokenFence(fences)       (a token per claim, when configured)
//!     ├─ admission through the provider host        (observer: `admission`)
//!     ├─ resources.sandbox = JournaledSandbox(…)   (when a lease journal is configured)
//!     └─ ManagedRuntimeHost::run                    (observer: every named step, redacted)
//! ```
//!
//! # Work items and sessions (a design decision)
//!
//! The fence and the publication belong to a work item (workspace, environment, session,
//! work id). Every run of a session uses the same work item, `local/default/<session>/main`:
//! each run is a new *generation* of it, and the fence hands each generation the last
//! publication, whichever generation made it. So a run continues exactly where the last
//! successful run of its session published, a failed or cancelled run publishes nothing, and
//! two runs of one session can never overlap (the second gets `conflict` with the first's
//! fence expiry). A fresh work id per run would instead start every run from nothing.
//!
//! # Ownership and lifetimes
//!
//! The fence owner id is `<hostname>:<pid>:<random>` ([`owner_id`]), unique per process: a
//! store gives a re-entrant claim only to the holder of the token, so nothing is gained by
//! reusing owner ids. The fence TTL defaults to 30 s, renewed every 5 s (a third of a shorter
//! TTL). The session token lives max(fence TTL × 10, 1 h), fixed at issue: it only bounds a
//! host that died without releasing.
//!
//! What this module must never do: hold or log a token (the session token goes from the
//! token port to the sink only; the fence token stays inside the transaction), or name a
//! backend.

use crate::lease_journal::JournaledSandbox;
use crate::provider_host::{ManagedRuntimeProviderHost, ManagedRuntimeProviderHostOptions};
use crate::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use crate::session_tokens::{SessionTokenFence, SessionTokenSink};
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderPlacement, PortError,
    RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeResourceFencePort, RuntimeResourceScope,
    SessionTokenPort,
};
use std::sync::Arc;

/// The tenant workspace id of local work items.
pub const WORKSPACE_ID: &str = "local";
/// The environment id of local work items.
pub const ENVIRONMENT_ID: &str = "default";
/// The work id every run of a session uses (see the module doc).
pub const WORK_ID: &str = "main";
/// Default fence time to live.
pub const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
/// Default heartbeat cadence.
pub const DEFAULT_HEARTBEAT_MS: u64 = 5_000;
/// The floor of the session-token TTL.
pub const MIN_SESSION_TOKEN_TTL_MS: u64 = 60 * 60 * 1000;

/// The work item of `session`: `local/default/<session>/main`.
pub fn session_scope(session: impl Into<String>) -> RuntimeResourceScope {
    RuntimeResourceScope::new(WORKSPACE_ID, ENVIRONMENT_ID, session, WORK_ID)
}

/// `<hostname>:<pid>:<nonce>`: an owner id unique to one process (the caller supplies the
/// host name and a random nonce; this crate does no I/O).
pub fn owner_id(hostname: &str, pid: u32, nonce: u32) -> String {
    let hostname = hostname.trim();
    let hostname = if hostname.is_empty() {
        "localhost"
    } else {
        hostname
    };
    format!("{hostname}:{pid}:{nonce:08x}")
}

/// The session-token TTL of a work item with fence TTL `lease_ttl_ms`:
/// max(lease TTL × 10, 1 h).
pub fn session_token_ttl_ms(lease_ttl_ms: u64) -> u64 {
    lease_ttl_ms
        .saturating_mul(10)
        .max(MIN_SESSION_TOKEN_TTL_MS)
}

/// Who owns a work item's fence and how long its claims live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkItemPolicy {
    /// The fence owner id.
    pub owner_id: String,
    /// Fence time to live.
    pub lease_ttl_ms: u64,
    /// Heartbeat cadence (renewal of the fence, heartbeat of the sandbox).
    pub heartbeat_interval_ms: u64,
    /// The session token's TTL, fixed at issue.
    pub session_token_ttl_ms: u64,
}

impl WorkItemPolicy {
    /// The policy of `owner_id` with fence TTL `lease_ttl_ms` (default
    /// [`DEFAULT_LEASE_TTL_MS`]); the heartbeat and the token TTL follow from it.
    pub fn new(owner_id: impl Into<String>, lease_ttl_ms: Option<u64>) -> Self {
        let lease_ttl_ms = lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS);
        Self {
            owner_id: owner_id.into(),
            lease_ttl_ms,
            heartbeat_interval_ms: DEFAULT_HEARTBEAT_MS.min((lease_ttl_ms / 3).max(1)),
            session_token_ttl_ms: session_token_ttl_ms(lease_ttl_ms),
        }
    }
}

/// Issues a session token per claim (see [`crate::session_tokens`]).
#[derive(Clone)]
pub struct SessionTokenIssuer {
    /// The token store.
    pub tokens: Arc<dyn SessionTokenPort>,
    /// Where each claim's token goes (the harness-env projection).
    pub sink: Arc<dyn SessionTokenSink>,
}

impl std::fmt::Debug for SessionTokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTokenIssuer").finish_non_exhaustive()
    }
}

/// The ports a runner composes.
#[derive(Clone)]
pub struct WorkItemPorts {
    /// The backend's provider driver.
    pub driver: Arc<dyn ManagedRuntimeProviderDriverPort>,
    /// The fence control plane.
    pub fences: Arc<dyn RuntimeResourceFencePort>,
    /// The orphan queue.
    pub orphans: Arc<dyn RuntimeOrphanPort>,
    /// Journals every lease so a dead host's sandboxes can be reaped.
    pub lease_journal: Option<Arc<dyn RuntimeLeaseJournalPort>>,
    /// Issues a session token per claim.
    pub session_tokens: Option<SessionTokenIssuer>,
}

impl std::fmt::Debug for WorkItemPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItemPorts")
            .field("lease_journal", &self.lease_journal.is_some())
            .field("session_tokens", &self.session_tokens.is_some())
            .finish_non_exhaustive()
    }
}

/// Runs work items of one provider under one policy. Cheap to clone; runs are independent.
#[derive(Clone)]
pub struct WorkItemRunner {
    host: ManagedRuntimeProviderHost,
    policy: WorkItemPolicy,
}

impl std::fmt::Debug for WorkItemRunner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkItemRunner")
            .field("host", &self.host)
            .field("policy", &self.policy)
            .finish()
    }
}

impl WorkItemRunner {
    /// Composes `ports` under `policy`. Fails as the provider host does (an invalid driver).
    pub fn new(policy: WorkItemPolicy, ports: WorkItemPorts) -> Result<Self, PortError> {
        let fences = match ports.session_tokens {
            Some(issuer) => Arc::new(
                SessionTokenFence::new(ports.fences, issuer.tokens, issuer.sink)
                    .with_ttl_ms(policy.session_token_ttl_ms),
            ) as Arc<dyn RuntimeResourceFencePort>,
            None => ports.fences,
        };
        let mut host = ManagedRuntimeProviderHost::new(ManagedRuntimeProviderHostOptions {
            owner_id: policy.owner_id.clone(),
            lease_ttl_ms: policy.lease_ttl_ms,
            heartbeat_interval_ms: policy.heartbeat_interval_ms,
            fences,
            orphans: ports.orphans,
            scheduler: None,
            driver: ports.driver,
            placement: ManagedRuntimeProviderPlacement::InProcess,
            provider_config: serde_json::Map::new(),
        })?;
        if let Some(journal) = ports.lease_journal {
            host = host.with_resources_hook(Arc::new(move |mut resources| {
                resources.sandbox = Arc::new(JournaledSandbox::new(
                    resources.sandbox,
                    Arc::clone(&journal),
                ));
                resources
            }));
        }
        Ok(Self { host, policy })
    }

    /// The policy every run of this runner follows.
    pub fn policy(&self) -> &WorkItemPolicy {
        &self.policy
    }

    /// Admits the provider for `input` and runs it through the fenced transaction; the
    /// input's observer sees `admission` and then every step. Rejections are as
    /// [`ManagedRuntimeProviderHost::run`]'s.
    pub async fn run(
        &self,
        input: ManagedRuntimeRunInput,
    ) -> Result<ManagedRuntimeRunResult, PortError> {
        self.host.run(input).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_one_work_item() {
        let scope = session_scope("s1");
        assert_eq!(
            (
                scope.workspace_id.as_str(),
                scope.environment_id.as_str(),
                scope.session_id.as_str(),
                scope.work_id.as_str()
            ),
            ("local", "default", "s1", "main")
        );
    }

    #[test]
    fn the_policy_follows_the_fence_ttl() {
        let default = WorkItemPolicy::new("me", None);
        assert_eq!(default.lease_ttl_ms, 30_000);
        assert_eq!(default.heartbeat_interval_ms, 5_000);
        assert_eq!(default.session_token_ttl_ms, MIN_SESSION_TOKEN_TTL_MS);
        let short = WorkItemPolicy::new("me", Some(300));
        assert_eq!(short.heartbeat_interval_ms, 100);
        let long = WorkItemPolicy::new("me", Some(2 * 60 * 60 * 1000));
        assert_eq!(long.heartbeat_interval_ms, 5_000);
        assert_eq!(long.session_token_ttl_ms, 20 * 60 * 60 * 1000);
        assert_eq!(WorkItemPolicy::new("me", Some(1)).heartbeat_interval_ms, 1);
    }

    #[test]
    fn owner_ids_name_host_process_and_nonce() {
        assert_eq!(owner_id("box\n", 42, 0xbeef), "box:42:0000beef");
        assert_eq!(owner_id("  ", 1, 1), "localhost:1:00000001");
    }
}
