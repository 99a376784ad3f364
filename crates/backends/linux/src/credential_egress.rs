//! The linux backend's `CredentialEgressPort`: `omabox-sandbox-net`'s [`CredentialEgress`]
//! over this backend's live sandboxes. A linux sandbox trusts a binding's CA through
//! [`SANDBOX_CA_FILE`] (the host bundle plus that CA) named by the CA variables
//! ([`LinuxSandboxPort::attach_credentials`]); the rest (bindings, vault reads, revoke,
//! release) is the shared port's. Must never hand the sandbox a secret or the CA's key.

use std::sync::Arc;

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_egress::intercept::Credentials;

use crate::port::LinuxSandboxPort;
pub use crate::port::SANDBOX_CA_FILE;
pub use omabox_sandbox_net::credential_egress::{
    AuthScheme, CredentialEgress, CredentialTarget, EgressCredential, LiveSandboxes,
};

#[async_trait]
impl CredentialTarget for LinuxSandboxPort {
    async fn attach_credentials(&self, credentials: Arc<Credentials>) -> Result<(), PortError> {
        LinuxSandboxPort::attach_credentials(self, credentials).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_ca_variables_are_the_mechanisms() {
        assert_eq!(
            omabox_linux_sandbox::plan::CA_ENV,
            &omabox_sandbox_net::credential_egress::CA_ENV[..]
        );
    }
}
