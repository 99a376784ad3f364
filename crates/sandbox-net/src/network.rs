//! A sandbox's way out: the DNS stub, the admitting relay and the gateway, bound by the host
//! inside the sandbox's routeless network namespace (see [`crate::netns`]) and served by the
//! host's tokio runtime. Any backend whose sandbox has such a namespace (a linux sandbox, a
//! docker container under network `none`) and whose init the host can open a pidfd of
//! uses it.
//!
//! What the sandbox sees, for every config but `none`:
//! - `/etc/resolv.conf` names `127.0.0.1`; the host's DNS stub answers there (port 53, UDP
//!   and TCP),
//!   only for names the policy answers, each with a synthetic loopback address of its own
//!   (`127.64.0.0/10`, no AAAA);
//! - a connection to a synthetic address on any port lands on the host's catch-all listener
//!   (an sk_lookup program, see [`crate::sk_lookup`]), and one to any loopback address on a
//!   listened port (80 and 443, every port a host entry names, `UNRESTRICTED_PORTS` under
//!   `unrestricted`) on a host listener `0.0.0.0:<port>`; the relay admits it by the name it
//!   asks for (TLS SNI, HTTP Host, or the name its synthetic address was handed out for) on
//!   the dialed port, and connects out from the host;
//! - `127.0.0.1:<gateway port>` reaches the omabox gateway (hosted inference, MCP proxy);
//!   the gateway's host name, when it has one, resolves to `127.0.0.1` there.
//!
//! Nothing else leads anywhere: the namespace has no route, no other interface, and the
//! sandbox cannot bind below port 1024 there nor change the namespace (it has no
//! CAP_NET_ADMIN over it; the backend makes sure of both). The relay refuses the host's
//! own addresses (every address of the host's interfaces when the network started), the
//! ranges the backend adds ([`NetworkSetup::denied`]) and the contract's never-reachable
//! ones.
//!
//! Ownership: every socket in the namespace belongs to a task of this object's [`JoinSet`];
//! dropping it aborts them all and closes every listener and relayed connection, so the
//! namespace dies with the sandbox's processes.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use omabox_contract::networking::{NetworkPolicy, NetworkingError};
use omabox_egress::{
    AddressRange, AddressRules, DnsStub, Gateway, LocalAddress, Relay, RelayConfig, ResolvedNames,
    Resolver, SyntheticAddresses,
};
use tokio::task::AbortHandle;

use crate::{netns, sk_lookup};

/// Where the stub listens inside the sandbox (`/etc/resolv.conf` names it).
pub const DNS_STUB: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 53);
/// A second loopback address, so `AI_ADDRCONFIG` lookups answer IPv4 (see
/// `netns::loopback_alias`).
pub const LOOPBACK_ALIAS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 2);
/// The catch-all listener the sk_lookup redirect hands connections to (a loopback address
/// of its own, a privileged port the sandbox cannot take).
const CATCH_ALL: SocketAddr = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 3)), 1);
/// Names the stub hands synthetic addresses for, per sandbox, at most.
const SYNTHETIC_NAMES: usize = 4096;
/// Connections one sandbox has through the relay at once at most (each holds two host fds);
/// one more is closed at accept. A sandbox with a memory limit gets fewer: what its limit
/// covers at the relay's worst case per connection (see [`relay_config`]).
const MAX_CONNECTIONS: usize = 256;
/// How long the relay remembers what the stub answered.
const ANSWER_MEMORY: Duration = Duration::from_secs(600);

/// Why a sandbox's network could not be set up or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NetworkError {
    /// The config does not compile (a bad host entry).
    #[error("networking: {0}")]
    Policy(#[from] NetworkingError),
    /// Not called from within a tokio runtime (the relay's tasks need one).
    #[error("the sandbox network needs a tokio runtime")]
    NoRuntime,
    /// The sandbox was started under `none`: there is no network to change.
    #[error(
        "the sandbox was started with networking none; start it with another config to change its network later"
    )]
    NotStarted,
    /// The sandbox's init could not be opened (it died).
    #[error("opening the sandbox's init")]
    Sandbox(#[source] io::Error),
    /// Binding a socket inside the sandbox's namespace failed.
    #[error("binding {what} {addr} inside the sandbox's network namespace")]
    Bind {
        /// Which socket.
        what: &'static str,
        /// Where.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: io::Error,
    },
}

/// The omabox gateway (hosted inference, MCP proxy) as a sandbox reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayAccess {
    /// Where the gateway listens, as the host connects to it. The sandbox reaches it at
    /// `127.0.0.1` on the same port.
    pub upstream: SocketAddr,
    /// The host name the sandbox knows the gateway by (the host of its URL, when that is a
    /// name): the DNS stub answers it with `127.0.0.1`, so a URL naming it works inside.
    pub name: Option<String>,
}

impl GatewayAccess {
    /// The address the sandbox dials for the gateway (`127.0.0.1:<gateway port>`).
    pub fn in_sandbox(&self) -> SocketAddr {
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, self.upstream.port()))
    }
}

/// What one sandbox's network is started with.
#[derive(Debug, Clone)]
pub struct NetworkSetup {
    /// The policy in force at start ([`SandboxNetwork::set_policy`] changes it later).
    pub policy: NetworkPolicy,
    /// The gateway, when the sandbox may reach it (fixed at start).
    pub gateway: Option<GatewayAccess>,
    /// The sandbox's memory limit: it bounds what the relay holds for it (see
    /// [`relay_config`]).
    pub memory_limit: Option<u64>,
    /// Address ranges the relay and the stub refuse beyond the host's own addresses and
    /// the never-reachable ones (a docker engine's networks: other containers).
    pub denied: Vec<AddressRange>,
}

/// The host side of one sandbox's network. Dropping it closes everything it bound.
pub struct SandboxNetwork {
    pidfd: OwnedFd,
    runtime: tokio::runtime::Handle,
    relay: Arc<Relay>,
    stub: Arc<DnsStub>,
    gateway: Option<u16>,
    state: Mutex<State>,
}

struct State {
    /// The relay's listeners by port (the catch-all's port included).
    listeners: BTreeMap<u16, AbortHandle>,
    /// Every port of the synthetic addresses to the catch-all listener, when the kernel
    /// allows it (see [`crate::sk_lookup`]).
    redirect: Option<sk_lookup::Redirect>,
    /// Every task serving a socket of the namespace.
    tasks: tokio::task::JoinSet<()>,
}

impl std::fmt::Debug for SandboxNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxNetwork")
            .field("policy", &self.relay.policy())
            .field("ports", &self.ports())
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl SandboxNetwork {
    /// Binds the stub, the relay's listeners and the gateway's inside the network namespace
    /// of the process `pidfd` refers to (the sandbox's init; or `pidfd` is the namespace's
    /// own fd, [`netns::create`]), and serves them on the
    /// current tokio runtime. `resolver` is the host's (tests give their own).
    pub fn start(
        pidfd: OwnedFd,
        setup: NetworkSetup,
        resolver: Arc<dyn Resolver>,
    ) -> Result<Self, NetworkError> {
        let NetworkSetup {
            policy,
            gateway,
            memory_limit,
            denied,
        } = setup;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| NetworkError::NoRuntime)?;
        let rules = AddressRules::default().deny(host_addresses()).deny(denied);
        let names = Arc::new(ResolvedNames::new(ANSWER_MEMORY, SYNTHETIC_NAMES));
        let mut stub = DnsStub::new(policy.clone(), Arc::clone(&resolver), rules.clone())
            .with_resolved_names(Arc::clone(&names))
            .with_synthetic(Arc::new(SyntheticAddresses::new(SYNTHETIC_NAMES)));
        if let Some(name) = gateway.as_ref().and_then(|g| g.name.as_ref()) {
            stub = stub.with_pinned(name, std::net::Ipv4Addr::LOCALHOST);
        }
        let config = relay_config(memory_limit);
        let mut relay =
            Relay::new(policy.clone(), resolver, rules, config).with_resolved_names(names);
        if let Some(gateway) = &gateway {
            relay = relay.with_gateway(Gateway {
                dialed: gateway.in_sandbox(),
                upstream: gateway.upstream,
            });
        }
        let network = Self {
            pidfd,
            runtime,
            relay: Arc::new(relay),
            stub: Arc::new(stub),
            gateway: gateway.map(|g| g.upstream.port()),
            state: Mutex::new(State {
                listeners: BTreeMap::new(),
                redirect: None,
                tasks: tokio::task::JoinSet::new(),
            }),
        };
        network.open(&policy)?;
        Ok(network)
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        self.relay.policy()
    }

    /// The ports the relay listens on inside the sandbox (the gateway's included).
    pub fn ports(&self) -> Vec<u16> {
        self.lock().listeners.keys().copied().collect()
    }

    /// Whether every port of a synthetic address leads to the relay (the sk_lookup
    /// redirect is attached); otherwise only [`ports`](Self::ports) do.
    pub fn reaches_every_port(&self) -> bool {
        self.lock().redirect.is_some()
    }

    /// Changes what the live sandbox may reach: every connection and question from now on
    /// is decided by `policy` (connections already relayed keep going). A
    /// port the new policy admits gets its listener now; a listener for a port it no
    /// longer admits stays but admits nothing there. The gateway is fixed at start.
    pub fn set_policy(&self, policy: NetworkPolicy) -> Result<(), NetworkError> {
        self.listen(&policy)?;
        self.relay.set_policy(policy.clone());
        self.stub.set_policy(policy);
        Ok(())
    }

    /// Intercepts the names `credentials` binds from the next connection on (`None`: stop).
    pub fn set_credentials(&self, credentials: Option<Arc<omabox_egress::intercept::Credentials>>) {
        self.relay.set_credentials(credentials);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// First start: the loopback alias, the stub's socket and the policy's listeners, made
    /// in one visit of the namespace.
    fn open(&self, policy: &NetworkPolicy) -> Result<(), NetworkError> {
        let ports = self.missing_ports(policy);
        let (udp, tcp, catch_all) = netns::in_netns(self.pidfd.as_fd(), move || {
            let alias =
                netns::loopback_alias(LOOPBACK_ALIAS).map_err(|source| NetworkError::Bind {
                    what: "a loopback address",
                    addr: SocketAddr::from((LOOPBACK_ALIAS, 0)),
                    source,
                });
            let stub = |source| NetworkError::Bind {
                what: "the DNS stub",
                addr: DNS_STUB,
                source,
            };
            let sockets = alias.and_then(|()| {
                let udp = std::net::UdpSocket::bind(DNS_STUB).map_err(stub)?;
                let tcp = std::net::TcpListener::bind(DNS_STUB).map_err(stub)?;
                Ok((udp, tcp))
            });
            Ok((sockets, bind_listeners(&ports), catch_all()))
        })
        .map_err(NetworkError::Sandbox)?;
        let (udp, dns_tcp) = udp?;
        // The stub's TCP connections are host sockets too: the relay's sandbox-side buffers.
        RelayConfig::default()
            .buffers
            .apply_sandbox_side(&dns_tcp)
            .map_err(|source| NetworkError::Bind {
                what: "the DNS stub",
                addr: DNS_STUB,
                source,
            })?;
        let catch_all = match catch_all {
            Ok((listener, redirect)) => {
                self.lock().redirect = Some(redirect);
                vec![(CATCH_ALL.port(), listener)]
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    "no sk_lookup redirect: the sandbox reaches only the listened ports"
                );
                Vec::new()
            }
        };
        let bind = |source| NetworkError::Bind {
            what: "the DNS stub",
            addr: DNS_STUB,
            source,
        };
        udp.set_nonblocking(true).map_err(bind)?;
        dns_tcp.set_nonblocking(true).map_err(bind)?;
        let _entered = self.runtime.enter();
        let socket = tokio::net::UdpSocket::from_std(udp).map_err(bind)?;
        let dns_tcp = tokio::net::TcpListener::from_std(dns_tcp).map_err(bind)?;
        let (stub, tcp_stub) = (Arc::clone(&self.stub), Arc::clone(&self.stub));
        let mut state = self.lock();
        state.tasks.spawn_on(
            async move { log_end("dns stub", stub.serve(socket).await) },
            &self.runtime,
        );
        state.tasks.spawn_on(
            async move { log_end("dns stub (tcp)", tcp_stub.serve_tcp(dns_tcp).await) },
            &self.runtime,
        );
        drop(state);
        self.serve_listeners(catch_all)?;
        self.serve_listeners(tcp?)
    }

    /// A listener for every port `policy` admits (and the gateway's) that has none yet.
    fn listen(&self, policy: &NetworkPolicy) -> Result<(), NetworkError> {
        let ports = self.missing_ports(policy);
        if ports.is_empty() {
            return Ok(());
        }
        let listeners = netns::in_netns(self.pidfd.as_fd(), move || Ok(bind_listeners(&ports)))
            .map_err(NetworkError::Sandbox)??;
        self.serve_listeners(listeners)
    }

    fn missing_ports(&self, policy: &NetworkPolicy) -> Vec<u16> {
        let mut ports = policy.ports();
        ports.extend(self.gateway);
        let state = self.lock();
        ports
            .into_iter()
            .filter(|p| !state.listeners.contains_key(p))
            .collect()
    }

    fn serve_listeners(
        &self,
        listeners: Vec<(u16, std::net::TcpListener)>,
    ) -> Result<(), NetworkError> {
        let mut state = self.lock();
        for (port, listener) in listeners {
            let addr = SocketAddr::from(([0, 0, 0, 0], port));
            let bind = |source| NetworkError::Bind {
                what: "a relay listener",
                addr,
                source,
            };
            listener.set_nonblocking(true).map_err(bind)?;
            let _entered = self.runtime.enter();
            let listener = tokio::net::TcpListener::from_std(listener).map_err(bind)?;
            let relay = Arc::clone(&self.relay);
            let task = state.tasks.spawn_on(
                async move { log_end("relay", relay.serve(listener, Arc::new(LocalAddress)).await) },
                &self.runtime,
            );
            state.listeners.insert(port, task);
        }
        Ok(())
    }
}

/// The relay's limits for a sandbox whose memory limit is `memory_limit`: its host-side
/// socket buffers and pipes are fixed (`SocketBuffers`), and it serves at most as many
/// connections as the limit covers at their worst case each, so the relay never holds more
/// for a sandbox than the sandbox may hold itself (the kernel charges none of it to the
/// sandbox); [`MAX_CONNECTIONS`] at most, and for a sandbox without a limit.
fn relay_config(memory_limit: Option<u64>) -> RelayConfig {
    let config = RelayConfig::default();
    let max_connections = memory_limit
        .map_or(MAX_CONNECTIONS, |limit| {
            config.buffers.connections_within(limit)
        })
        .min(MAX_CONNECTIONS);
    RelayConfig {
        max_connections,
        ..config
    }
}

/// The catch-all listener and the sk_lookup redirect sending it every TCP connection to a
/// synthetic address, any port (on the thread inside the namespace).
fn catch_all() -> std::io::Result<(std::net::TcpListener, sk_lookup::Redirect)> {
    let listener = std::net::TcpListener::bind(CATCH_ALL)?;
    let netns = OwnedFd::from(std::fs::File::open("/proc/thread-self/ns/net")?);
    let redirect = sk_lookup::Redirect::attach(&netns, &listener)?;
    Ok((listener, redirect))
}

/// Binds `0.0.0.0:<port>` for each port (on the thread inside the namespace).
fn bind_listeners(ports: &[u16]) -> Result<Vec<(u16, std::net::TcpListener)>, NetworkError> {
    ports
        .iter()
        .map(|&port| {
            let addr = SocketAddr::from(([0, 0, 0, 0], port));
            std::net::TcpListener::bind(addr)
                .map(|l| (port, l))
                .map_err(|source| NetworkError::Bind {
                    what: "a relay listener",
                    addr,
                    source,
                })
        })
        .collect()
}

impl Drop for SandboxNetwork {
    fn drop(&mut self) {
        // Aborting the tasks drops their sockets (and the relayed connections each
        // listener's task owns).
        self.lock().tasks.abort_all();
    }
}

fn log_end(what: &str, ended: io::Result<()>) {
    if let Err(e) = ended {
        tracing::warn!(error = %e, "sandbox {what} stopped");
    }
}

/// Every address of the host's interfaces: a name resolving to one of them must not lead
/// a sandbox to the host's own services.
fn host_addresses() -> Vec<AddressRange> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        tracing::warn!("listing the host's addresses failed; only the fixed rules apply");
        return Vec::new();
    };
    addrs
        .filter_map(|ifa| {
            let addr = ifa.address?;
            if let Some(v4) = addr.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                addr.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .map(AddressRange::single)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandboxs_memory_limit_caps_its_relayed_connections() {
        assert_eq!(relay_config(Some(64 << 20)).max_connections, 22);
        assert_eq!(relay_config(Some(512 << 20)).max_connections, 178);
        assert_eq!(relay_config(Some(8 << 30)).max_connections, MAX_CONNECTIONS);
        assert_eq!(relay_config(None).max_connections, MAX_CONNECTIONS);
        assert_eq!(relay_config(Some(1 << 20)).max_connections, 1);
    }

    #[test]
    fn the_hosts_own_addresses_are_listed() {
        let ranges = host_addresses();
        assert!(
            ranges
                .iter()
                .any(|r| r.contains("127.0.0.1".parse().unwrap())),
            "{ranges:?}"
        );
    }
}
