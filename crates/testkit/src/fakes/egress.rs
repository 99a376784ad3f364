//! [`FakeCredentialEgress`]: a scripted `CredentialEgressPort`.
//!
//! Defaults: capabilities `{enforced, live, [http, https]}`; `prepare` → the fixture's
//! binding; `attach`, `revoke`, `release` → ok.

use super::log::{CallLog, names};
use super::step::{Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{
    AbortSignal, CredentialEgressBinding, CredentialEgressBindingEnforcement,
    CredentialEgressCapabilities, CredentialEgressEnforcement, CredentialEgressMode,
    CredentialEgressPort, CredentialEgressProtocol, ManagedSandboxLease, PortError,
    PrepareCredentialEgressInput, RuntimeResourceFence, RuntimeResourceScope, TerminationReason,
};

/// Input of `attach`.
#[derive(Debug, Clone)]
pub struct EgressAttachCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: CredentialEgressBinding,
    /// The sandbox.
    pub sandbox: ManagedSandboxLease,
    /// Cancellation.
    pub signal: AbortSignal,
}

/// Input of `revoke`.
#[derive(Debug, Clone)]
pub struct EgressRevokeCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: CredentialEgressBinding,
    /// Why.
    pub reason: TerminationReason,
}

/// Input of `release`.
#[derive(Debug, Clone)]
pub struct EgressReleaseCall {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// The fence presented.
    pub fence: RuntimeResourceFence,
    /// The binding.
    pub binding: CredentialEgressBinding,
}

impl WithSignal for PrepareCredentialEgressInput {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

impl WithSignal for EgressAttachCall {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// An enforced, live binding.
pub fn enforced_binding(binding_id: &str) -> CredentialEgressBinding {
    CredentialEgressBinding {
        binding_id: binding_id.to_owned(),
        enforcement: CredentialEgressBindingEnforcement::Enforced,
        credential_mode: CredentialEgressMode::Live,
    }
}

/// Capabilities with the given enforcement, live mode, HTTP and HTTPS.
pub fn egress_capabilities(
    enforcement: CredentialEgressEnforcement,
) -> CredentialEgressCapabilities {
    CredentialEgressCapabilities {
        enforcement,
        credential_mode: CredentialEgressMode::Live,
        intercepted_protocols: vec![
            CredentialEgressProtocol::Http,
            CredentialEgressProtocol::Https,
        ],
    }
}

/// A scripted credential egress port.
#[derive(Debug)]
pub struct FakeCredentialEgress {
    log: CallLog,
    /// `capabilities`.
    pub capabilities: Step<RuntimeResourceScope, CredentialEgressCapabilities>,
    /// `prepare`.
    pub prepare: Step<PrepareCredentialEgressInput, Option<CredentialEgressBinding>>,
    /// `attach`.
    pub attach: Step<EgressAttachCall, ()>,
    /// `revoke`.
    pub revoke: Step<EgressRevokeCall, ()>,
    /// `release`.
    pub release: Step<EgressReleaseCall, ()>,
}

impl FakeCredentialEgress {
    /// An enforced port that prepares `binding`.
    pub fn new(log: CallLog, binding: CredentialEgressBinding) -> Self {
        Self {
            log,
            capabilities: Step::new(|_| async {
                Ok(egress_capabilities(CredentialEgressEnforcement::Enforced))
            }),
            prepare: Step::new(move |_| {
                let binding = binding.clone();
                async move { Ok(Some(binding)) }
            }),
            attach: Step::new(|_| async { Ok(()) }),
            revoke: Step::new(|_| async { Ok(()) }),
            release: Step::new(|_| async { Ok(()) }),
        }
    }
}

#[async_trait]
impl CredentialEgressPort for FakeCredentialEgress {
    async fn capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<CredentialEgressCapabilities, PortError> {
        self.log.push(format!("{}.capabilities", names::EGRESS));
        self.capabilities.invoke(scope.clone()).await
    }

    async fn prepare(
        &self,
        input: PrepareCredentialEgressInput,
    ) -> Result<Option<CredentialEgressBinding>, PortError> {
        self.log.push(format!("{}.prepare", names::EGRESS));
        self.prepare.invoke(input).await
    }

    async fn attach(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        sandbox: &ManagedSandboxLease,
        signal: AbortSignal,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.attach", names::EGRESS));
        self.attach
            .invoke(EgressAttachCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
                sandbox: sandbox.clone(),
                signal,
            })
            .await
    }

    async fn revoke(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
        reason: TerminationReason,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.revoke:{reason}", names::EGRESS));
        self.revoke
            .invoke(EgressRevokeCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
                reason,
            })
            .await
    }

    async fn release(
        &self,
        scope: &RuntimeResourceScope,
        fence: &RuntimeResourceFence,
        binding: &CredentialEgressBinding,
    ) -> Result<(), PortError> {
        self.log.push(format!("{}.release", names::EGRESS));
        self.release
            .invoke(EgressReleaseCall {
                scope: scope.clone(),
                fence: fence.clone(),
                binding: binding.clone(),
            })
            .await
    }
}
