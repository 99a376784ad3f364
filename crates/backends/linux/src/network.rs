//! A linux sandbox's network: `omabox-sandbox-net`'s [`SandboxNetwork`] (the DNS stub, the
//! admitting relay's listeners, the sk_lookup catch-all and the gateway, bound by the host
//! inside the sandbox's routeless namespace) started from the plan's [`Networking`]. This
//! module only turns that config into the network's setup; it must never bind anything
//! itself.

use omabox_contract::networking::NetworkPolicy;
use omabox_linux_sandbox::plan::Networking;

pub use omabox_sandbox_net::network::{DNS_STUB, LOOPBACK_ALIAS};
pub use omabox_sandbox_net::{GatewayAccess, NetworkError, NetworkSetup, SandboxNetwork};

/// The name rules `networking` compiles to.
pub fn policy(networking: &Networking) -> Result<NetworkPolicy, NetworkError> {
    let mcp: Vec<&str> = networking.mcp_hosts.iter().map(String::as_str).collect();
    Ok(NetworkPolicy::compile(&networking.config, &mcp)?)
}

/// What the network of a sandbox with `networking` and memory limit `memory_limit` is
/// started with.
pub fn setup(
    networking: &Networking,
    memory_limit: Option<u64>,
) -> Result<NetworkSetup, NetworkError> {
    Ok(NetworkSetup {
        policy: policy(networking)?,
        gateway: networking.gateway.map(|upstream| GatewayAccess {
            upstream,
            name: networking.gateway_name.clone(),
        }),
        memory_limit,
        denied: Vec::new(),
    })
}
