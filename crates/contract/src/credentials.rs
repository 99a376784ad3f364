//! Session tokens and vault secrets: omabox extensions for the control-plane credential
//! classes of the contract ("Credentials and the inference proxy").
//!
//! NOT FOUND in the reference as ports: OpenMA's control plane keeps these in its own
//! database. omabox needs them as ports so the host (which issues and revokes session tokens
//! around a claim) and the HTTP proxy (which verifies them and substitutes vault secrets)
//! share one store without knowing each other.
//!
//! Invariants: a token or secret value is a [`SecretString`]; stores keep only a hash of a
//! token; no claim, error text or log line carries a token or a secret value.

use crate::{PortError, RuntimeResourceScope, SecretString};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// What a valid session token proves: the claim it was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionTokenClaims {
    /// The work item (its `sessionId` is the session the token may act for).
    pub scope: RuntimeResourceScope,
    /// The fence generation it was issued to.
    pub generation: u64,
    /// ISO-8601 expiry.
    pub expires_at: String,
}

/// Input of [`SessionTokenPort::issue`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueSessionTokenInput {
    /// The claimed work item.
    pub scope: RuntimeResourceScope,
    /// Its fence generation.
    pub generation: u64,
    /// Time to live in milliseconds.
    pub ttl_ms: u64,
}

/// Short-lived bearer tokens bound to (session, work generation): the Work `sessions_token`
/// of the contract. Issued by the host when it claims a work item, rotated on reclaim (a new
/// generation's token invalidates every older one of the same work item), extended when the
/// claim's fence is renewed, revoked at cleanup or when the claim is reaped.
#[async_trait]
pub trait SessionTokenPort: Send + Sync {
    /// Issues a fresh token for a claim and revokes every token of older generations of the
    /// same work item.
    async fn issue(&self, input: IssueSessionTokenInput) -> Result<SecretString, PortError>;

    /// The claims of a live token; `None` when unknown, revoked or expired.
    async fn verify(&self, token: &str) -> Result<Option<SessionTokenClaims>, PortError>;

    /// Revokes the tokens of one claim. Idempotent.
    async fn revoke(&self, scope: &RuntimeResourceScope, generation: u64) -> Result<(), PortError>;

    /// Sets the expiry of the live (unrevoked, unexpired) tokens of one claim to `ttl_ms`
    /// from now: called when the claim's fence is renewed, so a token lives as long as its
    /// fence and no longer. A claim without live tokens is left as it is (an expired or
    /// revoked token never comes back). Idempotent.
    async fn extend(
        &self,
        scope: &RuntimeResourceScope,
        generation: u64,
        ttl_ms: u64,
    ) -> Result<(), PortError>;
}

/// A vault: named secrets the control plane substitutes on the sandbox's behalf (MCP
/// credentials, egress credentials). Values are never returned to a sandbox, logged, or put
/// in an error text.
#[async_trait]
pub trait VaultSecretPort: Send + Sync {
    /// The value of `name`, if stored.
    async fn get(&self, name: &str) -> Result<Option<SecretString>, PortError>;
    /// Stores (or replaces) `name`.
    async fn put(&self, name: &str, value: SecretString) -> Result<(), PortError>;
    /// Deletes `name`. Idempotent.
    async fn delete(&self, name: &str) -> Result<(), PortError>;
    /// The stored names (never values).
    async fn names(&self) -> Result<Vec<String>, PortError>;
}
