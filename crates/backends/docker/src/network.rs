//! A container's way out under every networking config but `none`: the container keeps
//! network mode `none` (its own network namespace, loopback only, no route), and the host
//! binds `omabox-sandbox-net`'s [`SandboxNetwork`] inside that namespace, exactly as the
//! linux backend does for its sandboxes: the DNS stub at `127.0.0.1:53` (the engine writes
//! the container's `/etc/resolv.conf` to name it), one relay listener per admitted port,
//! the sk_lookup catch-all, the gateway at `127.0.0.1:<port>`. Every connection is decided
//! and made by the host.
//!
//! That needs the container's namespace on this machine: the engine must be local (a unix
//! socket) and its container's PID 1 a process of this host's pid namespace, checked by
//! its cgroup naming the container ([`container_pidfd`]). A remote engine
//! (`tcp://`, `http://`) is refused for such a config ([`DockerError::RemoteNetwork`]).
//!
//! What keeps the container from going around it (see [`crate::container::container_body`]):
//! no `NET_ADMIN` or `NET_RAW` capability (no route, address, firewall rule or raw socket
//! of its own), and `net.ipv4.ip_unprivileged_port_start=1024` (docker's default is 0),
//! so without `NET_BIND_SERVICE` it cannot take port 53, 80, 443 or the catch-all's port
//! before the host does. Must never run anything in the container, nor read a path the
//! container controls on the host.

use std::io::Read as _;
use std::net::IpAddr;
use std::sync::Arc;

use omabox_contract::networking::{NetworkPolicy, NetworkingConfig, NetworkingError};
use omabox_egress::{AddressRange, Resolver};
use omabox_sandbox_net::{GatewayAccess, NetworkSetup, SandboxNetwork, netns};

use crate::engine::Engine;
use crate::error::DockerError;

/// What a container may reach: the Environment's `networking` config, the session's MCP
/// hosts and the omabox gateway. The default is `none`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerNetwork {
    /// The Environment's `networking` object.
    pub config: NetworkingConfig,
    /// Host entries (`HOST[:PORT]`) of the session's MCP servers, opened by
    /// `allow_mcp_servers`.
    pub mcp_hosts: Vec<String>,
    /// The gateway the container reaches at `127.0.0.1:<its port>` under every config
    /// but `none`.
    pub gateway: Option<GatewayAccess>,
}

impl Default for DockerNetwork {
    fn default() -> Self {
        Self {
            config: NetworkingConfig::None,
            mcp_hosts: Vec::new(),
            gateway: None,
        }
    }
}

impl DockerNetwork {
    /// `config` with no MCP hosts and no gateway.
    pub fn new(config: NetworkingConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Whether the host serves a network in the container (every config but `none`).
    pub fn reaches_out(&self) -> bool {
        self.config != NetworkingConfig::None
    }

    /// The name rules this config compiles to.
    pub fn policy(&self) -> Result<NetworkPolicy, NetworkingError> {
        let mcp: Vec<&str> = self.mcp_hosts.iter().map(String::as_str).collect();
        NetworkPolicy::compile(&self.config, &mcp)
    }
}

/// Whether the engine at `host` runs its containers on this machine (a unix socket).
pub fn engine_is_local(host: &str) -> bool {
    host.starts_with("unix://")
}

/// Refuses `network` for the engine at `host` before anything is created: a config that
/// does not compile, or one that reaches out on an engine that is not local.
pub fn check(engine: &Engine, network: &DockerNetwork) -> Result<(), DockerError> {
    network.policy().map_err(DockerError::Networking)?;
    if network.reaches_out() && !engine_is_local(engine.host()) {
        return Err(DockerError::RemoteNetwork {
            host: engine.host().to_owned(),
        });
    }
    Ok(())
}

/// Starts the host side of `container`'s network, bound inside its namespace. The
/// container must be running and nothing but its agent may have run in it yet.
pub async fn start(
    engine: &Engine,
    container: &str,
    network: &DockerNetwork,
    memory_limit: u64,
    resolver: Arc<dyn Resolver>,
) -> Result<SandboxNetwork, DockerError> {
    let policy = network.policy().map_err(DockerError::Networking)?;
    let inspected = engine
        .docker()
        .inspect_container(container, None)
        .await
        .map_err(|source| DockerError::Engine {
            op: "inspect the container",
            target: container.to_owned(),
            source,
        })?;
    let pid = inspected
        .state
        .and_then(|state| state.pid)
        .and_then(|pid| i32::try_from(pid).ok())
        .unwrap_or(0);
    let full_id = inspected.id.unwrap_or_else(|| container.to_owned());
    let pidfd = container_pidfd(pid, &full_id).map_err(|source| DockerError::Namespace {
        id: container.to_owned(),
        source,
    })?;
    let setup = NetworkSetup {
        policy,
        gateway: network.gateway.clone(),
        memory_limit: Some(memory_limit),
        denied: engine_subnets(engine).await?,
    };
    SandboxNetwork::start(pidfd, setup, resolver).map_err(DockerError::Network)
}

/// A pidfd for `pid`, checked to be a process of container `id`: its cgroup (one line of
/// `/proc/<pid>/cgroup`, read capped) names the container's full id. A pid of another pid
/// namespace (an engine in a VM or another namespace) names some other process of this
/// host, whose cgroup does not.
pub fn container_pidfd(pid: i32, id: &str) -> std::io::Result<std::os::fd::OwnedFd> {
    // A full id is 64 hex digits; anything else could match a prefix of another's.
    if id.len() != 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the engine named no full container id",
        ));
    }
    netns::pidfd_of(pid, |pid| {
        let mut text = String::new();
        std::fs::File::open(format!("/proc/{pid}/cgroup"))?
            .take(64 * 1024)
            .read_to_string(&mut text)?;
        Ok(text.lines().any(|line| line.contains(id)))
    })
}

/// Every subnet of the engine's networks (a bridge's other containers, its gateway):
/// a name resolving there must not lead a container to them.
async fn engine_subnets(engine: &Engine) -> Result<Vec<AddressRange>, DockerError> {
    let networks = engine
        .docker()
        .list_networks(None)
        .await
        .map_err(|source| DockerError::Engine {
            op: "list the networks of",
            target: engine.host().to_owned(),
            source,
        })?;
    Ok(networks
        .into_iter()
        .filter_map(|n| n.ipam?.config)
        .flatten()
        .filter_map(|c| c.subnet.as_deref().and_then(parse_subnet))
        .collect())
}

/// `a.b.c.d/n` or `x::/n`.
fn parse_subnet(text: &str) -> Option<AddressRange> {
    let (address, prefix) = text.split_once('/')?;
    AddressRange::new(address.parse::<IpAddr>().ok()?, prefix.parse().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_subnets_are_parsed_and_bad_ones_skipped() {
        let bridge = parse_subnet("172.17.0.0/16").unwrap();
        assert!(bridge.contains("172.17.0.5".parse().unwrap()));
        assert!(!bridge.contains("172.18.0.5".parse().unwrap()));
        assert!(parse_subnet("fd00::/64").is_some());
        assert!(parse_subnet("172.17.0.0/33").is_none());
        assert!(parse_subnet("172.17.0.0").is_none());
        assert!(parse_subnet("bridge/16").is_none());
    }

    #[test]
    fn only_a_unix_socket_is_a_local_engine() {
        assert!(engine_is_local("unix:///var/run/docker.sock"));
        assert!(!engine_is_local("tcp://10.0.0.2:2375"));
        assert!(!engine_is_local("http://127.0.0.1:2375"));
    }

    #[test]
    fn a_process_is_not_taken_for_a_container_it_is_not_in() {
        let me = std::process::id() as i32;
        let id = "a".repeat(64);
        let refused = container_pidfd(me, &id).unwrap_err();
        assert_eq!(refused.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            container_pidfd(me, "abc").unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
    }
}
