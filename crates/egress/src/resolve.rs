//! Name resolution on the host side, behind a port so tests inject their own.

use std::io;
use std::net::IpAddr;

/// Resolves a DNS name to addresses. Called only for names the policy already admits (the
/// relay) or answers (the DNS stub): a resolver never sees a refused name.
#[async_trait::async_trait]
pub trait Resolver: Send + Sync {
    /// Every address of `name` (A and AAAA), in the resolver's order.
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>>;
}

/// The host's own resolver: the host's `/etc/resolv.conf` name servers and `/etc/hosts`,
/// asked by hickory's resolver (Rust), not by libc's `getaddrinfo`. The names it is given
/// come from a sandbox (an SNI, a `Host`, a DNS question), so parsing the answers about them
/// stays in memory-safe code; musl's C resolver is never handed one.
///
/// Every name is asked as absolute (a trailing dot): the host's `search` domains never
/// turn a sandbox's `intranet` into `intranet.corp.example`. A resolver is built per lookup
/// (two small file reads): lookups come from many tokio runtimes (each test, each
/// `omabox` command), and a resolver's pooled connections belong to the runtime that made
/// them.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let (config, options) = hickory_resolver::system_conf::read_system_conf().map_err(|e| {
            io::Error::other(format!(
                "cannot read the host's resolver configuration: {e}"
            ))
        })?;
        lookup_absolute(config, options, name).await
    }
}

/// Every address of `name` asked as an absolute name of `config`'s servers (and, with
/// `options`' hosts-file setting forced on, the host's `/etc/hosts`), in answer order,
/// without duplicates.
async fn lookup_absolute(
    config: hickory_resolver::config::ResolverConfig,
    mut options: hickory_resolver::config::ResolverOpts,
    name: &str,
) -> io::Result<Vec<IpAddr>> {
    options.use_hosts_file = hickory_resolver::config::ResolveHosts::Always;
    let mut builder = hickory_resolver::TokioResolver::builder_with_config(
        config,
        hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
    );
    *builder.options_mut() = options;
    let resolver = builder
        .build()
        .map_err(|e| io::Error::other(format!("cannot build the host's resolver: {e}")))?;
    let absolute = match name.ends_with('.') {
        true => name.to_owned(),
        false => format!("{name}."),
    };
    let lookup = resolver.lookup_ip(absolute.as_str()).await.map_err(|e| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("cannot resolve {name:?}: {e}"),
        )
    })?;
    let mut addresses: Vec<IpAddr> = Vec::new();
    for address in lookup.iter() {
        if !addresses.contains(&address) {
            addresses.push(address);
        }
    }
    Ok(addresses)
}

/// Fixed names first, then another resolver: a hosts file of the backend's own (tests
/// stand their "internet" up under names the host's resolver does not know).
pub struct FixedNames {
    names: std::collections::HashMap<String, Vec<IpAddr>>,
    fallback: std::sync::Arc<dyn Resolver>,
}

impl std::fmt::Debug for FixedNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixedNames")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl FixedNames {
    /// Parses `NAME=IP[,NAME=IP]...`; names are normalized.
    pub fn parse(text: &str, fallback: std::sync::Arc<dyn Resolver>) -> Result<Self, String> {
        let mut names: std::collections::HashMap<String, Vec<IpAddr>> = Default::default();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (name, ip) = entry
                .split_once('=')
                .ok_or_else(|| format!("{entry:?} is not NAME=IP"))?;
            let name = omabox_contract::networking::normalize_name(name)
                .ok_or_else(|| format!("{name:?} is not a host name"))?;
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| format!("{ip:?} is not an IP address"))?;
            names.entry(name).or_default().push(ip);
        }
        Ok(Self { names, fallback })
    }
}

#[async_trait::async_trait]
impl Resolver for FixedNames {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        match omabox_contract::networking::normalize_name(name).and_then(|n| self.names.get(&n)) {
            Some(addresses) => Ok(addresses.clone()),
            None => self.fallback.resolve(name).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, OpCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{RData, Record};
    use hickory_resolver::config::{
        ConnectionConfig, NameServerConfig, ResolverConfig, ResolverOpts,
    };

    /// A name server on loopback answering every A question with 198.18.0.7 and recording
    /// the names it was asked.
    async fn fake_name_server() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let port = socket.local_addr().unwrap().port();
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = std::sync::Arc::clone(&asked);
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                let mut answer =
                    Message::new(query.metadata.id, MessageType::Response, OpCode::Query);
                answer.metadata.recursion_available = true;
                answer.add_queries(query.queries.iter().cloned());
                for question in &query.queries {
                    seen.lock().unwrap().push(question.name().to_ascii());
                    if question.query_type() == hickory_proto::rr::RecordType::A {
                        answer.add_answer(Record::from_rdata(
                            question.name().clone(),
                            30,
                            RData::A(A::new(198, 18, 0, 7)),
                        ));
                    }
                }
                let _ = socket.send_to(&answer.to_vec().unwrap(), peer).await;
            }
        });
        (port, asked)
    }

    #[tokio::test]
    async fn a_sandboxs_name_is_asked_absolute_never_under_the_hosts_search_domains() {
        let (port, asked) = fake_name_server().await;
        let mut udp = ConnectionConfig::udp();
        udp.port = port;
        let server = NameServerConfig::new("127.0.0.1".parse().unwrap(), true, vec![udp]);
        let config = ResolverConfig::from_parts(
            Some("corp.test".parse().unwrap()),
            vec!["corp.test".parse().unwrap()],
            vec![server],
        );
        let addresses = lookup_absolute(config, ResolverOpts::default(), "intranet")
            .await
            .unwrap();
        assert_eq!(addresses, ["198.18.0.7".parse::<IpAddr>().unwrap()]);
        let asked = asked.lock().unwrap().clone();
        assert!(!asked.is_empty());
        assert!(
            asked.iter().all(|name| name == "intranet."),
            "the host's search domain reached the name server: {asked:?}"
        );
    }

    #[tokio::test]
    async fn the_hosts_file_answers_first() {
        // /etc/hosts names localhost on every Debian machine; no name server is asked.
        let config = ResolverConfig::from_parts(None, vec![], vec![]);
        let addresses = lookup_absolute(config, ResolverOpts::default(), "localhost")
            .await
            .unwrap();
        assert!(
            addresses.contains(&"127.0.0.1".parse::<IpAddr>().unwrap()),
            "{addresses:?}"
        );
    }

    #[tokio::test]
    async fn fixed_names_answer_first_and_bad_entries_are_refused() {
        let fixed = FixedNames::parse(
            "API.test=198.18.0.2, b.test=::1",
            std::sync::Arc::new(SystemResolver),
        )
        .unwrap();
        assert_eq!(
            fixed.resolve("api.test.").await.unwrap(),
            ["198.18.0.2".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            fixed.resolve("b.test").await.unwrap(),
            ["::1".parse::<IpAddr>().unwrap()]
        );
        for bad in ["x", "a.test=nope", "bad name=1.2.3.4"] {
            assert!(
                FixedNames::parse(bad, std::sync::Arc::new(SystemResolver)).is_err(),
                "{bad}"
            );
        }
    }
}
