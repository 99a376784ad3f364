//! A gvisor sandbox's way out under every networking config but `none`, as the linux and
//! docker backends have it: omabox makes the sandbox a network namespace of its own
//! (`omabox_sandbox_net::netns::create`: loopback only, no route, owned by the host's user
//! namespace) and binds `omabox-sandbox-net`'s [`SandboxNetwork`] in it before anything
//! runs there (the DNS stub at `127.0.0.1:53`, which the root's `/etc/resolv.conf` names,
//! the relay's listeners, the sk_lookup catch-all, the gateway at `127.0.0.1:<port>`); then
//! runsc runs in that namespace with `--network host`, so gVisor's sockets are host sockets
//! of that namespace. Every connection is decided and made by the host.
//!
//! Under `none` runsc keeps `--network none`: gVisor's own stack, loopback only.
//!
//! What keeps the sandbox from going around it: the namespace has no interface but
//! loopback and no route; gVisor's host-network mode passes socket calls, not interface,
//! route or firewall changes, to the host (its netlink is read-only there), and no raw
//! sockets (no `--net-raw`). The host binds its listeners before anything runs in the
//! namespace, and gVisor's kernel runs in a user namespace of its own (`bundle::config`),
//! so it holds no capability over the network namespace and binds no port below 1024
//! there (a port ≥ 1024 a later policy admits may find the sandbox's own listener: it then
//! reaches itself, never another). Must never decide a policy (the config says it) nor run
//! anything in the sandbox.

use std::os::fd::OwnedFd;
use std::sync::Arc;

use omabox_contract::networking::{NetworkPolicy, NetworkingConfig, NetworkingError};
use omabox_egress::Resolver;
use omabox_sandbox_net::{GatewayAccess, NetworkSetup, SandboxNetwork, netns};

use crate::GvisorError;

/// What a gvisor sandbox may reach: the Environment's `networking` config, the session's
/// MCP hosts and the omabox gateway. The default is `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GvisorNetwork {
    /// The Environment's `networking` object.
    pub config: NetworkingConfig,
    /// Host entries (`HOST[:PORT]`) of the session's MCP servers, opened by
    /// `allow_mcp_servers`.
    pub mcp_hosts: Vec<String>,
    /// The gateway the sandbox reaches at `127.0.0.1:<its port>` under every config but
    /// `none`.
    pub gateway: Option<GatewayAccess>,
}

impl Default for GvisorNetwork {
    fn default() -> Self {
        Self::new(NetworkingConfig::None)
    }
}

impl GvisorNetwork {
    /// `config` with no MCP hosts and no gateway.
    pub fn new(config: NetworkingConfig) -> Self {
        Self {
            config,
            mcp_hosts: Vec::new(),
            gateway: None,
        }
    }

    /// Whether the host serves a network in the sandbox (every config but `none`).
    pub fn reaches_out(&self) -> bool {
        self.config != NetworkingConfig::None
    }

    /// The name rules this config compiles to.
    pub fn policy(&self) -> Result<NetworkPolicy, NetworkingError> {
        let mcp: Vec<&str> = self.mcp_hosts.iter().map(String::as_str).collect();
        NetworkPolicy::compile(&self.config, &mcp)
    }
}

/// A sandbox's own network namespace and the host side of its network, bound there.
/// Dropping it closes every socket the host bound there; the namespace goes with its last
/// process.
#[derive(Debug)]
pub(crate) struct OwnNetwork {
    pub(crate) netns: OwnedFd,
    pub(crate) served: SandboxNetwork,
}

/// Makes the namespace and serves `network` in it (before any process of the sandbox runs).
pub(crate) fn start(
    network: &GvisorNetwork,
    memory_limit: Option<u64>,
    resolver: Arc<dyn Resolver>,
) -> Result<OwnNetwork, GvisorError> {
    let policy = network.policy().map_err(GvisorError::Networking)?;
    let netns = netns::create().map_err(|source| GvisorError::Io {
        what: "creating the sandbox's network namespace".into(),
        source,
    })?;
    let handle = netns.try_clone().map_err(|source| GvisorError::Io {
        what: "keeping the sandbox's network namespace".into(),
        source,
    })?;
    let setup = NetworkSetup {
        policy,
        gateway: network.gateway.clone(),
        memory_limit,
        denied: Vec::new(),
    };
    let served = SandboxNetwork::start(handle, setup, resolver).map_err(GvisorError::Network)?;
    Ok(OwnNetwork { netns, served })
}
