//! The sandbox's DNS stub (UDP): the only resolver a sandbox can reach.
//!
//! Contract, per datagram:
//! - not a well-formed single-question standard query → dropped, no answer;
//! - a name the policy does not answer ([`NetworkPolicy::answers`]), or not class `IN`, or
//!   not a DNS name → `REFUSED`, and the question goes nowhere: a refused name never reaches
//!   the [`Resolver`], so lookups of `<data>.attacker.example` carry nothing out;
//! - an answered name, type `A`/`AAAA` → the host resolver's addresses of that family that
//!   [`AddressRules`] permits (none left: `NOERROR` with no answer), TTL [`ANSWER_TTL`];
//!   lookup failure → `SERVFAIL`;
//! - an answered name, any other type → `NOERROR` with no answer, not looked up;
//! - a response never exceeds [`MAX_RESPONSE`] bytes (answers are dropped and `TC` set);
//! - with a [`SyntheticAddresses`] pool (a namespace with no route out): an answered name
//!   that resolves on the host to at least one permitted address gets its synthetic IPv4
//!   address instead (recorded in [`ResolvedNames`] so the relay maps it back), `AAAA` gets
//!   no answer (IPv6 has no path there), and a full pool answers no address.
//!
//! REFUSED, not NXDOMAIN: the stub refuses for policy reasons (RFC 1035's meaning of
//! REFUSED) and does not claim the name does not exist. NXDOMAIN is cached negatively by
//! resolvers and caches inside the sandbox (RFC 2308), so after the policy is widened on a
//! live sandbox a cached NXDOMAIN would go on failing the newly allowed name; REFUSED is
//! not cached. The cost: glibc reports REFUSED as a temporary failure (`EAI_AGAIN`), which
//! some clients retry before giving up.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{DNSClass, RData, Record, RecordType};
use omabox_contract::networking::{NetworkPolicy, normalize_name};
use tokio::net::UdpSocket;
use tokio::sync::Semaphore;

use crate::addresses::AddressRules;
use crate::names::ResolvedNames;
use crate::resolve::Resolver;
use crate::synthetic::SyntheticAddresses;

/// The largest response sent (the classic UDP limit, which every client accepts).
pub const MAX_RESPONSE: usize = 512;
/// The TTL of every answer: short, so a live policy change and address rotation show soon.
pub const ANSWER_TTL: u32 = 30;
/// Addresses given per answer at most.
const MAX_ANSWERS: usize = 8;
/// Datagrams larger than this are dropped (truncated on receive, so malformed).
const MAX_QUERY: usize = 1232;
/// A TCP connection without a complete question this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);

/// The stub. Share it in an [`Arc`] to [`DnsStub::serve`].
pub struct DnsStub {
    policy: RwLock<Arc<NetworkPolicy>>,
    resolver: Arc<dyn Resolver>,
    addresses: AddressRules,
    resolve_timeout: Duration,
    in_flight: Arc<Semaphore>,
    names: Option<Arc<ResolvedNames>>,
    synthetic: Option<Arc<SyntheticAddresses>>,
    pinned: Option<(String, Ipv4Addr)>,
}

impl std::fmt::Debug for DnsStub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsStub")
            .field("policy", &self.policy())
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

impl DnsStub {
    /// A stub answering by `policy`, resolving with `resolver`, handing out only addresses
    /// `addresses` permits.
    pub fn new(
        policy: NetworkPolicy,
        resolver: Arc<dyn Resolver>,
        addresses: AddressRules,
    ) -> Self {
        Self {
            policy: RwLock::new(Arc::new(policy)),
            resolver,
            addresses,
            resolve_timeout: Duration::from_secs(5),
            in_flight: Arc::new(Semaphore::new(64)),
            names: None,
            synthetic: None,
            pinned: None,
        }
    }

    /// Answers `name` with `address` under every policy but `none`, without asking the
    /// resolver: the gateway's host name, which the sandbox reaches at a loopback address
    /// of its own (see [`crate::Gateway`]). `name` is normalized (case, trailing dot).
    pub fn with_pinned(mut self, name: &str, address: Ipv4Addr) -> Self {
        self.pinned = normalize_name(name).map(|name| (name, address));
        self
    }

    /// Answers with synthetic addresses from `pool` (see the module doc); share the pool
    /// with nothing else, and give the stub a [`ResolvedNames`] the relay shares.
    pub fn with_synthetic(mut self, pool: Arc<SyntheticAddresses>) -> Self {
        self.synthetic = Some(pool);
        self
    }

    /// Records every answer in `names` (share it with the [`crate::Relay`] so it admits
    /// name-less connections to the addresses answered).
    pub fn with_resolved_names(mut self, names: Arc<ResolvedNames>) -> Self {
        self.names = Some(names);
        self
    }

    /// The policy in force.
    pub fn policy(&self) -> Arc<NetworkPolicy> {
        Arc::clone(&self.policy.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the policy for questions received from now on.
    pub fn set_policy(&self, policy: NetworkPolicy) {
        *self.policy.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(policy);
    }

    /// Answers datagrams on `socket` until it fails; at most 64 questions are being
    /// resolved at once (more are dropped: the client retries).
    pub async fn serve(self: Arc<Self>, socket: UdpSocket) -> io::Result<()> {
        let socket = Arc::new(socket);
        let mut buf = vec![0u8; MAX_QUERY + 1];
        // The questions' tasks belong to this future (dropping it ends them).
        let mut questions = tokio::task::JoinSet::new();
        loop {
            while questions.try_join_next().is_some() {}
            let (n, peer) = socket.recv_from(&mut buf).await?;
            if n > MAX_QUERY {
                continue;
            }
            let Ok(slot) = Arc::clone(&self.in_flight).try_acquire_owned() else {
                continue;
            };
            let packet = buf[..n].to_vec();
            let (stub, socket) = (Arc::clone(&self), Arc::clone(&socket));
            questions.spawn(async move {
                if let Some(response) = stub.answer(&packet, peer).await {
                    let _ = socket.send_to(&response, peer).await;
                }
                drop(slot);
            });
        }
    }

    /// Answers DNS over TCP on `listener` (RFC 7766 framing: a two-byte length before each
    /// message) until it fails: what a client falls back to on a truncated answer. At most
    /// 16 connections at once, each closed after 10 s without a complete question; the
    /// same limits and answers as over UDP.
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) -> io::Result<()> {
        let slots = Arc::new(Semaphore::new(16));
        let mut connections = tokio::task::JoinSet::new();
        loop {
            while connections.try_join_next().is_some() {}
            let (stream, peer) = listener.accept().await?;
            let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
                continue;
            };
            let stub = Arc::clone(&self);
            connections.spawn(async move {
                let _ = stub.serve_tcp_connection(stream, peer).await;
                drop(slot);
            });
        }
    }

    async fn serve_tcp_connection(
        &self,
        mut stream: tokio::net::TcpStream,
        peer: SocketAddr,
    ) -> io::Result<()> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let read = async {
                let len = usize::from(stream.read_u16().await?);
                if len > MAX_QUERY {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "query too large",
                    ));
                }
                let mut packet = vec![0u8; len];
                stream.read_exact(&mut packet).await?;
                Ok::<_, io::Error>(packet)
            };
            let packet = tokio::time::timeout(TCP_IDLE, read)
                .await
                .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "idle"))??;
            let Some(response) = self.answer(&packet, peer).await else {
                return Ok(());
            };
            let len = u16::try_from(response.len()).unwrap_or(u16::MAX);
            stream.write_u16(len).await?;
            stream.write_all(&response[..usize::from(len)]).await?;
        }
    }

    /// The response to one datagram from `peer`, or `None` to drop it.
    pub async fn answer(&self, packet: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
        let query = Message::from_vec(packet).ok()?;
        if query.metadata.message_type != MessageType::Query || query.queries.len() != 1 {
            return None;
        }
        if query.metadata.op_code != OpCode::Query {
            return encode(response(&query, ResponseCode::NotImp));
        }
        let question = &query.queries[0];
        if let Some(response) = self.answer_pinned(&query) {
            return encode(response);
        }
        let name = normalize_name(&question.name().to_ascii())
            .filter(|name| question.query_class() == DNSClass::IN && self.policy().answers(name));
        let Some(name) = name else {
            tracing::info!(%peer, qtype = %question.query_type(), verdict = "refused", "dns");
            return encode(response(&query, ResponseCode::Refused));
        };
        let family = match question.query_type() {
            RecordType::A => IpAddr::is_ipv4,
            RecordType::AAAA => IpAddr::is_ipv6,
            _ => return encode(response(&query, ResponseCode::NoError)),
        };
        let resolved =
            tokio::time::timeout(self.resolve_timeout, self.resolver.resolve(&name)).await;
        let Ok(Ok(resolved)) = resolved else {
            tracing::info!(%peer, name = %name, verdict = "servfail", "dns");
            return encode(response(&query, ResponseCode::ServFail));
        };
        let mut message = response(&query, ResponseCode::NoError);
        let addresses: Vec<IpAddr> = match &self.synthetic {
            None => resolved
                .into_iter()
                .filter(|ip| family(ip) && self.addresses.permits(*ip))
                .take(MAX_ANSWERS)
                .collect(),
            // One synthetic IPv4 address, if the host could reach the name at all.
            Some(pool) => {
                let reachable = resolved.iter().any(|ip| self.addresses.permits(*ip));
                if reachable && question.query_type() == RecordType::A {
                    pool.address_for(&name)
                        .map(IpAddr::V4)
                        .into_iter()
                        .collect()
                } else {
                    Vec::new()
                }
            }
        };
        for ip in &addresses {
            let rdata = match ip {
                IpAddr::V4(v4) => RData::A(A::from(*v4)),
                IpAddr::V6(v6) => RData::AAAA(AAAA::from(*v6)),
            };
            message.add_answer(Record::from_rdata(
                question.name().clone(),
                ANSWER_TTL,
                rdata,
            ));
        }
        if let Some(names) = &self.names
            && !names.record(&name, &addresses)
        {
            tracing::warn!(name = %name, "resolved-names table full: not recorded");
        }
        tracing::info!(%peer, name = %name, qtype = %question.query_type(), answers = addresses.len(), verdict = "answered", "dns");
        encode(message)
    }
}

impl DnsStub {
    /// The pinned name's answer, if `query` asks for it (and the policy is not `none`).
    fn answer_pinned(&self, query: &Message) -> Option<Message> {
        let (pinned, address) = self.pinned.as_ref()?;
        let question = &query.queries[0];
        let name = normalize_name(&question.name().to_ascii())?;
        if name != *pinned
            || question.query_class() != DNSClass::IN
            || *self.policy() == NetworkPolicy::None
        {
            return None;
        }
        let mut message = response(query, ResponseCode::NoError);
        if question.query_type() == RecordType::A {
            message.add_answer(Record::from_rdata(
                question.name().clone(),
                ANSWER_TTL,
                RData::A(A::from(*address)),
            ));
        }
        Some(message)
    }
}

/// A response header for `query` with its question echoed.
fn response(query: &Message, code: ResponseCode) -> Message {
    let mut message = Message::new(
        query.metadata.id,
        MessageType::Response,
        query.metadata.op_code,
    );
    message.metadata.recursion_desired = query.metadata.recursion_desired;
    message.metadata.recursion_available = true;
    message.metadata.response_code = code;
    message.add_queries(query.queries.iter().cloned());
    message
}

/// The wire form, dropping answers (and setting `TC`) until it fits [`MAX_RESPONSE`].
fn encode(mut message: Message) -> Option<Vec<u8>> {
    loop {
        let bytes = message.to_vec().ok()?;
        if bytes.len() <= MAX_RESPONSE {
            return Some(bytes);
        }
        message.answers.pop()?;
        message.metadata.truncation = true;
    }
}
