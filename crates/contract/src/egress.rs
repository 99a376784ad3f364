//! `CredentialEgressPort`: vault credentials injected on an enforced egress path.
//!
//! The binding is opaque and not a secret; plaintext vault material is never a field here.

use crate::capabilities::wire_enum;
use crate::{
    AbortSignal, ManagedSandboxLease, PortError, RuntimeResourceFence, RuntimeResourceScope,
    TerminationReason,
};
use async_trait::async_trait;
use serde::{Deserialize, Serialize};

wire_enum! {
    /// How strongly a port enforces credential egress.
    CredentialEgressEnforcement {
        /// A deny-by-default path the guest cannot bypass.
        Enforced = "enforced",
        /// Proxy settings the guest could ignore.
        Advisory = "advisory",
        /// No egress support.
        Unsupported = "unsupported",
    }
}

wire_enum! {
    /// When credentials are resolved.
    CredentialEgressMode {
        /// On every request.
        Live = "live",
        /// Once at prepare.
        Snapshot = "snapshot",
    }
}

wire_enum! {
    /// Protocols the egress path intercepts.
    CredentialEgressProtocol {
        /// Plain HTTP.
        Http = "http",
        /// HTTPS.
        Https = "https",
        /// Raw TCP.
        Tcp = "tcp",
    }
}

/// What an egress port can do.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialEgressCapabilities {
    /// Enforcement level.
    pub enforcement: CredentialEgressEnforcement,
    /// Credential mode.
    pub credential_mode: CredentialEgressMode,
    /// Intercepted protocols.
    pub intercepted_protocols: Vec<CredentialEgressProtocol>,
}

impl CredentialEgressCapabilities {
    /// The fail-closed default: no egress.
    pub fn unsupported() -> Self {
        Self {
            enforcement: CredentialEgressEnforcement::Unsupported,
            credential_mode: CredentialEgressMode::Snapshot,
            intercepted_protocols: Vec::new(),
        }
    }
}

/// Enforcement of a prepared binding: never `unsupported`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialEgressBindingEnforcement {
    /// Enforced.
    Enforced,
    /// Advisory.
    Advisory,
}

/// A transient, non-secret egress binding. Never persisted in a lease or checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialEgressBinding {
    /// Binding id.
    pub binding_id: String,
    /// Enforcement.
    pub enforcement: CredentialEgressBindingEnforcement,
    /// Credential mode.
    pub credential_mode: CredentialEgressMode,
}

/// Requirement passed to prepare: `disabled` never reaches the port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CredentialEgressPrepareRequirement {
    /// Only enforced is acceptable.
    Required,
    /// Anything the port can do.
    BestEffort,
}

/// Input of [`CredentialEgressPort::prepare`].
#[derive(Debug, Clone)]
pub struct PrepareCredentialEgressInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence held.
    pub fence: RuntimeResourceFence,
    /// Requirement.
    pub requirement: CredentialEgressPrepareRequirement,
    /// `<workId>:<generation>:credential-egress-prepare`.
    pub idempotency_key: String,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Credential egress. Call order: prepare (before acquire) → attach → revoke (before
/// terminate) → release.
#[async_trait]
pub trait CredentialEgressPort: Send + Sync {
    /// What this port can enforce.
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<CredentialEgressCapabilities, PortError>;

    /// Prepares a binding, or `None` when egress cannot be provided.
    async fn prepare(
        &self,
        input: PrepareCredentialEgressInput,
    ) -> Result<Option<CredentialEgressBinding>, PortError>;

    /// Binds the egress path to acquired compute.
    async fn attach(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        sandbox: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<(), PortError>;

    /// Revokes the binding before compute stops or is retained.
    async fn revoke(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        reason: TerminationReason,
    ) -> Result<(), PortError>;

    /// Idempotent cleanup after revoke.
    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
    ) -> Result<(), PortError>;
}
