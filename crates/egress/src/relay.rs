//! The admitting TCP relay: every connection a sandbox makes arrives here (the backend
//! redirects it) and goes out only if the *name* it asks for is admitted.
//!
//! For each connection, in order:
//! 1. [`sniff`] the name (TLS SNI, else HTTP `Host`). No name → closed, unless the relay
//!    shares the DNS stub's [`ResolvedNames`] and the stub recently answered an admitted
//!    name with the dialed address: then that name decides and that address is connected to.
//! 2. `policy.admits(name, port)`, the port being the original destination's → else closed
//!    (an HTTP client is told `403` when [`RelayConfig::http_forbidden`]).
//! 3. Resolve the name on the host ([`Resolver`]); keep the addresses [`AddressRules`]
//!    permits; none left → closed.
//! 4. Connect, replay the sniffed bytes unchanged, then copy both ways (`splice(2)` on
//!    linux) until both sides closed or nothing moved for [`RelayConfig::idle_timeout`].
//!
//! Every host-side socket and pipe has fixed buffers ([`RelayConfig::buffers`]), and at most
//! [`RelayConfig::max_connections`] connections are served at once, so what the relay holds
//! for a sandbox is bounded (see [`crate::buffers`]).
//!
//! One exception comes first: a connection to the [`Gateway`]'s address inside the sandbox
//! (the omabox gateway: hosted inference and MCP proxies) is forwarded unchanged to the
//! gateway's host address under every policy but `none`, without sniffing (the gateway may
//! speak TLS under any name).
//!
//! The resolved address, not the dialed one, is connected to. The address the sandbox
//! dialed (its original destination) decides nothing but the port: the relay connects to
//! an address the *host* resolved for the admitted name, trying the dialed address first
//! only when it is one of them (so a client keeps the address its own lookup chose). Hence:
//! - a sandbox that dials some address X with an allowed name's SNI reaches the allowed
//!   name's addresses, never X (unless X is one of them), and one that dials an allowed
//!   name's address with another name's SNI is decided on that other name;
//! - DNS rebinding cannot open a refused address: the address rules judge what the host
//!   resolved at connect time, not what the sandbox was told earlier;
//! - requiring the dialed address to be among the resolved ones would add no safety (the
//!   relay never connects to it otherwise) and would break names whose address sets rotate
//!   between the sandbox's lookup and the relay's (CDNs).
//!
//! Only the first bytes are read: what follows on an admitted connection (a second HTTP/1.1
//! request with another `Host`, an HTTP `Host` inside TLS that differs from the SNI) goes to
//! the same upstream address and is that server's business (domain fronting through a shared
//! front end is not prevented without terminating TLS, which the credential egress increment
//! does for bound hosts).
//!
//! Never logged: payload bytes. Logged (tracing, target `omabox_egress::relay`): name,
//! port, verdict, reason, upstream address.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use omabox_contract::networking::NetworkPolicy;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;

use crate::addresses::AddressRules;
use crate::buffers::SocketBuffers;
use crate::intercept::Credentials;
use crate::names::ResolvedNames;
use crate::original_dst::OriginalDestination;
use crate::resolve::Resolver;
use crate::sniff::{NoName, Protocol, SniffLimits, sniff};
use crate::synthetic::SyntheticAddresses;

/// The relay's limits.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// How the first bytes are read.
    pub sniff: SniffLimits,
    /// Time allowed for the host's lookup of an admitted name.
    pub resolve_timeout: Duration,
    /// Time allowed for each upstream connect attempt.
    pub connect_timeout: Duration,
    /// A relayed connection with no bytes moving either way this long is closed.
    pub idle_timeout: Duration,
    /// Connections served at once; one more is closed at accept. A sandbox's is what its
    /// memory budget covers ([`SocketBuffers::connections_within`]).
    pub max_connections: usize,
    /// The host-side buffers of each connection (see [`crate::buffers`]).
    pub buffers: SocketBuffers,
    /// Answer a refused HTTP request with `403 Forbidden` before closing.
    pub http_forbidden: bool,
    /// How long to wait for a name when the dialed address was recently answered by the
    /// DNS stub (a server-speaks-first protocol sends nothing: it is admitted by the
    /// answered name after this wait instead of the whole sniff timeout).
    pub answered_wait: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            sniff: SniffLimits::default(),
            resolve_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_connections: 1024,
            buffers: SocketBuffers::default(),
            http_forbidden: true,
            answered_wait: Duration::from_secs(1),
        }
    }
}

/// Why a connection was closed without an upstream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The first bytes named no destination.
    #[error("no name: {0}")]
    NoName(NoName),
    /// The policy does not admit the name on this port.
    #[error("not admitted by the policy")]
    NotAdmitted,
    /// The host could not resolve the admitted name.
    #[error("the name did not resolve")]
    Unresolved,
    /// Every address of the name is refused by the address rules.
    #[error("every address of the name is refused")]
    AddressRefused,
    /// No permitted address accepted a connection.
    #[error("no upstream accepted the connection")]
    UpstreamUnreachable,
    /// The relay already serves its maximum of connections.
    #[error("the relay is at its connection cap")]
    AtCapacity,
}

/// What became of one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted for a name a credential binding covers: TLS terminated, requests carried
    /// with the binding's header injected (see [`crate::intercept`]).
    Intercepted {
        /// The admitted name.
        name: String,
        /// The address connected to.
        upstream: SocketAddr,
    },
    /// Forwarded to the omabox gateway until one side closed (or went idle).
    Gateway {
        /// The gateway's host address.
        upstream: SocketAddr,
    },
    /// Admitted and relayed until one side closed (or went idle).
    Relayed {
        /// The admitted name.
        name: String,
        /// The address connected to.
        upstream: SocketAddr,
    },
    /// Closed without relaying anything.
    Refused {
        /// The sniffed name, if there was one.
        name: Option<String>,
        /// Why.
        reason: Refusal,
    },
}

/// The omabox gateway as a sandbox reaches it: connections to `dialed` (an address inside
/// the sandbox's namespace) go to `upstream` (where the gateway listens on the host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gateway {
    /// The address the sandbox connects to.
    pub dialed: SocketAddr,
    /// The gateway's own address, as the host connects to it.
    pub upstream: SocketAddr,
}

/// The relay. Share it in an [`Arc`]; [`Relay::set_policy`] changes what a live sandbox
/// may reach for every connection accepted afterwards.
pub struct Relay {
    policy: RwLock<Arc<NetworkPolicy>>,
    resolver: Arc<dyn Resolver>,
    addresses: AddressRules,
    config: RelayConfig,
    slots: Arc<Semaphore>,
    names: Option<Arc<ResolvedNames>>,
    gateway: Option<Gateway>,
    credentials: RwLock<Option<Arc<Credentials>>>,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("policy", &self.policy())
            .field("addresses", &self.addresses)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay applying `policy` and `addresses`, resolving with `resolver`.
    pub fn new(
        policy: NetworkPolicy,
        resolver: Arc<dyn Resolver>,
        addresses: AddressRules,
        config: RelayConfig,
    ) -> Self {
        Self {
            policy: RwLock::new(Arc::new(policy)),
            resolver,
            addresses,
            slots: Arc::new(Semaphore::new(config.max_connections)),
            config,
            names: None,
            gateway: None,
            credentials: RwLock::new(None),
        }
    }

    /// Intercepts TLS connections to the names `credentials` binds (see [`crate::intercept`])
    /// from the next connection on; `None` stops intercepting new connections (revoke the
    /// credentials themselves to cut the open ones).
    pub fn set_credentials(&self, credentials: Option<Arc<Credentials>>) {
        *self.credentials.write().unwrap_or_else(|e| e.into_inner()) = credentials;
    }

    fn credentials_for(&self, name: &str) -> Option<Arc<Credentials>> {
        self.credentials
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .filter(|c| c.binds(name))
            .cloned()
    }

    /// Forwards connections to `gateway.dialed` to `gateway.upstream` (see the module doc).
    pub fn with_gateway(mut self, gateway: Gateway) -> Self {
        self.gateway = Some(gateway);
        self
    }

    /// Admits a connection whose first bytes name nothing by the names the DNS stub
    /// recently answered its destination address for (see [`crate::names`]).
    pub fn with_resolved_names(mut self, names: Arc<ResolvedNames>) -> Self {
        self.names = Some(names);
        self
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the policy for connections accepted from now on (those already relayed
    /// keep going).
    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// Accepts connections on `listener` until it fails, each served on its own task, at
    /// most [`RelayConfig::max_connections`] at once. `destinations` names each one's
    /// original destination. The connections' tasks belong to this future: dropping it
    /// (aborting its task) closes every connection it accepted, so nothing of a sandbox's
    /// namespace outlives the owner of its listeners.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        destinations: Arc<dyn OriginalDestination>,
    ) -> io::Result<()> {
        // Accepted sockets inherit the listener's buffers (and the window they offer).
        self.config.buffers.apply_sandbox_side(&listener)?;
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (client, peer) = match listener.accept().await {
                Ok(accepted) => accepted,
                Err(e) if accept_error_is_transient(&e) => {
                    tracing::warn!(error = %e, "accept failed; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                Err(e) => return Err(e),
            };
            let original = match destinations.original_destination(&client) {
                Ok(original) => original,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "no original destination: closed");
                    continue;
                }
            };
            let Ok(slot) = Arc::clone(&self.slots).try_acquire_owned() else {
                log_refusal(None, original, &Refusal::AtCapacity);
                continue;
            };
            let relay = Arc::clone(&self);
            connections.spawn(async move {
                relay.handle(client, original).await;
                drop(slot);
            });
        }
    }

    /// Serves one accepted connection whose original destination was `original`.
    pub async fn handle(&self, mut client: TcpStream, original: SocketAddr) -> Verdict {
        // Also for a connection accepted elsewhere (its listener's buffers unknown).
        if let Err(e) = self.config.buffers.apply_sandbox_side(&client) {
            tracing::warn!(error = %e, "fixing the socket buffers failed: closed");
            return refused(None, original, Refusal::UpstreamUnreachable);
        }
        if let Some(gateway) = self.gateway.filter(|g| g.dialed == original) {
            return self.forward_to_gateway(client, gateway).await;
        }
        let mut limits = self.config.sniff;
        if self
            .names
            .as_ref()
            .is_some_and(|names| !names.names_for(original.ip()).is_empty())
        {
            limits.timeout = limits.timeout.min(self.config.answered_wait);
        }
        let sniffed = sniff(&mut client, limits).await;
        let requested = match sniffed.outcome {
            Ok(requested) => requested,
            // A request naming two hosts, or a `Host` that is no name (`allowed@evil`), is
            // refused, never admitted by the dialed address's answered name (a proxy-like
            // upstream would follow its target; a front end might route by the odd `Host`).
            Err(no_name @ (NoName::ConflictingAuthority | NoName::InvalidName)) => {
                if self.config.http_forbidden {
                    let _ = client.write_all(FORBIDDEN).await;
                    let _ = client.shutdown().await;
                }
                return refused(None, original, Refusal::NoName(no_name));
            }
            Err(no_name) => match self.admit_answered(original).await {
                Some(Ok((server, name))) => {
                    return self
                        .relay(client, server, original, name, &sniffed.bytes, "dns")
                        .await;
                }
                Some(Err((name, reason))) => return refused(Some(name), original, reason),
                None => return refused(None, original, Refusal::NoName(no_name)),
            },
        };
        let name = requested.name;
        let server = match self.admit(&name, original).await {
            Ok(server) => server,
            Err(reason) => {
                if requested.protocol == Protocol::Http
                    && self.config.http_forbidden
                    && reason == Refusal::NotAdmitted
                {
                    let _ = client.write_all(FORBIDDEN).await;
                    let _ = client.shutdown().await;
                }
                return refused(Some(name), original, reason);
            }
        };
        if requested.protocol == Protocol::Tls
            && let Some(credentials) = self.credentials_for(&name)
        {
            let (server, upstream) = server;
            tracing::info!(name = %name, port = original.port(), verdict = "intercepted", %upstream);
            if let Err(e) = credentials
                .intercept(client, sniffed.bytes, name.clone(), server)
                .await
            {
                tracing::debug!(name = %name, error = %e, "intercepted connection ended");
            }
            return Verdict::Intercepted { name, upstream };
        }
        let via = match requested.protocol {
            Protocol::Tls => "sni",
            Protocol::Http => "host",
        };
        self.relay(client, server, original, name, &sniffed.bytes, via)
            .await
    }

    /// The gateway exception: no sniffing, no name; closed under `none`.
    async fn forward_to_gateway(&self, mut client: TcpStream, gateway: Gateway) -> Verdict {
        if *self.policy() == NetworkPolicy::None {
            return refused(None, gateway.dialed, Refusal::NotAdmitted);
        }
        let connect = self
            .config
            .buffers
            .connect(gateway.upstream, self.config.connect_timeout);
        let Ok(mut server) = connect.await else {
            return refused(None, gateway.dialed, Refusal::UpstreamUnreachable);
        };
        tracing::debug!(verdict = "gateway", upstream = %gateway.upstream);
        let _ = server.set_nodelay(true);
        let _ = client.set_nodelay(true);
        if let Err(e) = relay_until_idle(&mut client, &mut server, &self.config).await {
            tracing::debug!(error = %e, "gateway relay ended");
        }
        Verdict::Gateway {
            upstream: gateway.upstream,
        }
    }

    /// Step 4: replay the sniffed bytes, then copy both ways.
    async fn relay(
        &self,
        mut client: TcpStream,
        upstream: (TcpStream, SocketAddr),
        original: SocketAddr,
        name: String,
        sniffed: &[u8],
        via: &'static str,
    ) -> Verdict {
        let (mut server, upstream_addr) = upstream;
        tracing::info!(
            name = %name,
            port = original.port(),
            verdict = "admitted",
            via,
            upstream = %upstream_addr,
        );
        if server.write_all(sniffed).await.is_ok() {
            let _ = server.set_nodelay(true);
            let _ = client.set_nodelay(true);
            if let Err(e) = relay_until_idle(&mut client, &mut server, &self.config).await {
                tracing::debug!(name = %name, error = %e, "relay ended");
            }
        }
        Verdict::Relayed {
            name,
            upstream: upstream_addr,
        }
    }

    /// A name-less connection: admitted when the DNS stub recently answered one of its
    /// admitted names with the dialed address, which is then connected to (it is the
    /// address the stub handed out; the rules are checked again). `None`: no such answer.
    async fn admit_answered(
        &self,
        original: SocketAddr,
    ) -> Option<Result<((TcpStream, SocketAddr), String), (String, Refusal)>> {
        let names = self.names.as_ref()?.names_for(original.ip());
        let first = names.first()?.clone();
        let policy = self.policy();
        let Some(name) = names
            .into_iter()
            .find(|n| policy.admits(n, original.port()))
        else {
            return Some(Err((first, Refusal::NotAdmitted)));
        };
        // A synthetic address leads nowhere: connect to the host's resolution of the name.
        if SyntheticAddresses::contains(original.ip()) {
            return Some(
                self.admit(&name, original)
                    .await
                    .map(|server| (server, name.clone()))
                    .map_err(|reason| (name, reason)),
            );
        }
        if !self.addresses.permits(original.ip()) {
            return Some(Err((name, Refusal::AddressRefused)));
        }
        let connect = self
            .config
            .buffers
            .connect(original, self.config.connect_timeout);
        match connect.await {
            Ok(stream) => Some(Ok(((stream, original), name))),
            Err(_) => Some(Err((name, Refusal::UpstreamUnreachable))),
        }
    }

    /// Steps 2 and 3: the policy, the host's lookup, the address rules, the connect.
    async fn admit(
        &self,
        name: &str,
        original: SocketAddr,
    ) -> Result<(TcpStream, SocketAddr), Refusal> {
        let port = original.port();
        if !self.policy().admits(name, port) {
            return Err(Refusal::NotAdmitted);
        }
        let resolved =
            tokio::time::timeout(self.config.resolve_timeout, self.resolver.resolve(name))
                .await
                .ok()
                .and_then(Result::ok)
                .filter(|addresses| !addresses.is_empty())
                .ok_or(Refusal::Unresolved)?;
        let candidates = connect_order(&resolved, &self.addresses, original.ip());
        if candidates.is_empty() {
            return Err(Refusal::AddressRefused);
        }
        for ip in candidates {
            let target = SocketAddr::new(ip, port);
            let connect = self
                .config
                .buffers
                .connect(target, self.config.connect_timeout);
            if let Ok(stream) = connect.await {
                return Ok((stream, target));
            }
        }
        Err(Refusal::UpstreamUnreachable)
    }
}

/// A connection reset before accept, or a momentary lack of descriptors or memory, must not
/// end the accept loop.
fn accept_error_is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::OutOfMemory
    ) || matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// The addresses to try: those the rules permit, the dialed one first if it is among them,
/// at most four.
fn connect_order(resolved: &[IpAddr], rules: &AddressRules, dialed: IpAddr) -> Vec<IpAddr> {
    let dialed = dialed.to_canonical();
    let mut order: Vec<IpAddr> = resolved
        .iter()
        .copied()
        .filter(|ip| rules.permits(*ip))
        .collect();
    if let Some(at) = order.iter().position(|ip| ip.to_canonical() == dialed) {
        let ip = order.remove(at);
        order.insert(0, ip);
    }
    order.truncate(4);
    order
}

const FORBIDDEN: &[u8] =
    b"HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n";

fn refused(name: Option<String>, original: SocketAddr, reason: Refusal) -> Verdict {
    log_refusal(name.as_deref(), original, &reason);
    Verdict::Refused { name, reason }
}

fn log_refusal(name: Option<&str>, original: SocketAddr, reason: &Refusal) {
    tracing::info!(
        name = name.unwrap_or("-"),
        port = original.port(),
        destination = %original.ip(),
        verdict = "denied",
        reason = %reason,
    );
}

/// Copies both ways until both directions closed, or until no byte moved for the idle
/// timeout, through buffers of `config.buffers.pipe` bytes per direction.
async fn relay_until_idle(
    client: &mut TcpStream,
    server: &mut TcpStream,
    config: &RelayConfig,
) -> io::Result<(u64, u64)> {
    let idle = config.idle_timeout;
    let activity = Activity::new();
    let touch = || activity.touch();
    #[cfg(target_os = "linux")]
    let copy = crate::splice::splice_bidirectional(client, server, config.buffers.pipe, &touch);
    #[cfg(not(target_os = "linux"))]
    let copy = portable::copy_bidirectional(client, server, config.buffers.pipe, &activity);
    tokio::pin!(copy);
    loop {
        let deadline = activity.last() + idle;
        tokio::select! {
            done = &mut copy => return done,
            () = tokio::time::sleep_until(deadline) => {
                if activity.last() + idle <= Instant::now() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "idle timeout"));
                }
            }
        }
    }
}

/// When bytes last moved, in milliseconds since `start`.
struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            last_ms: AtomicU64::new(0),
        }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    fn last(&self) -> Instant {
        self.start + Duration::from_millis(self.last_ms.load(Ordering::Relaxed))
    }
}

/// The copy where `splice(2)` is not available.
#[cfg(not(target_os = "linux"))]
mod portable {
    use std::io;
    use std::task::{Context, Poll};

    use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
    use tokio::net::TcpStream;

    use super::Activity;

    pub(super) async fn copy_bidirectional(
        client: &mut TcpStream,
        server: &mut TcpStream,
        buffer: u32,
        activity: &Activity,
    ) -> io::Result<(u64, u64)> {
        let buffer = buffer as usize;
        let mut client = Tracked {
            inner: client,
            activity,
        };
        let mut server = Tracked {
            inner: server,
            activity,
        };
        tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, buffer, buffer).await
    }

    /// A stream that records reads in an [`Activity`].
    struct Tracked<'a, S> {
        inner: S,
        activity: &'a Activity,
    }

    impl<S: AsyncRead + Unpin> AsyncRead for Tracked<'_, S> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            let this = &mut *self;
            let poll = std::pin::Pin::new(&mut this.inner).poll_read(cx, buf);
            if buf.filled().len() > before {
                this.activity.touch();
            }
            poll
        }
    }

    impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<'_, S> {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
        }

        fn poll_flush(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_flush(cx)
        }

        fn poll_shutdown(
            mut self: std::pin::Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<io::Result<()>> {
            std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_dialed_address_goes_first_only_when_the_host_resolved_it() {
        let rules = AddressRules::default();
        let resolved = [ip("192.0.2.1"), ip("192.0.2.2"), ip("127.0.0.1")];
        assert_eq!(
            connect_order(&resolved, &rules, ip("192.0.2.2")),
            [ip("192.0.2.2"), ip("192.0.2.1")]
        );
        assert_eq!(
            connect_order(&resolved, &rules, ip("::ffff:192.0.2.2")),
            [ip("192.0.2.2"), ip("192.0.2.1")]
        );
        // A dialed address the host did not resolve is never tried.
        assert_eq!(
            connect_order(&resolved, &rules, ip("198.51.100.9")),
            [ip("192.0.2.1"), ip("192.0.2.2")]
        );
        // Nor is a refused one, even when dialed.
        assert_eq!(
            connect_order(&resolved, &rules, ip("127.0.0.1")),
            [ip("192.0.2.1"), ip("192.0.2.2")]
        );
    }
}
