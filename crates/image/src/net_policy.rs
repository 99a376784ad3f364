//! Where a pull may connect and whom it may tell a password, since a registry's answers
//! name places to go: the token realm of its `WWW-Authenticate: Bearer` challenge and the
//! `Location` of its redirects.
//!
//! Two rules, both applied before anything is sent:
//!
//! - **Host rule.** A realm or redirect target must be the registry's own host and port,
//!   or match an allowed host for that registry: the built-in entries for the public
//!   registries whose token service or blob storage lives elsewhere ([`BUILT_IN`]), and
//!   the operator's `OMABOX_REGISTRY_ALLOWED_HOSTS`. Plain HTTP only where the registry
//!   itself may use it (loopback, `OMABOX_INSECURE_REGISTRIES`).
//! - **Address rule.** Every address a connection goes to is checked as resolved, in the
//!   client's resolver ([`PolicyResolver`]), so a name that resolves somewhere else the
//!   second time (DNS rebinding) gains nothing; IP literals are checked here. The
//!   registry's own name is resolved once per pull and pinned. Any other name may reach
//!   public addresses; a loopback or private one only when the registry itself is on a
//!   loopback or private address; link-local (cloud metadata), unspecified, multicast
//!   and reserved addresses only when it is exactly the registry's own.
//!
//! Must never: let a realm or redirect reach a host-only service the registry is not on;
//! send a credential anywhere but the registry's own origin and a realm these rules
//! admitted.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, PoisonError};

use reqwest::Url;

use crate::escape;

/// Env key: hosts a registry may send a pull to besides itself (token realms, blob
/// redirects): `REGISTRY=HOST` pairs separated by `,`.
pub const ALLOWED_HOSTS_ENV: &str = "OMABOX_REGISTRY_ALLOWED_HOSTS";

/// The public registries' own token services and blob stores (registry, host pattern).
pub const BUILT_IN: &[(&str, &str)] = &[
    ("docker.io", "*.docker.io"),
    ("docker.io", "*.docker.com"),
    ("docker.io", "*.r2.cloudflarestorage.com"),
    ("docker.io", "*.amazonaws.com"),
    ("ghcr.io", "*.githubusercontent.com"),
    ("quay.io", "*.quay.io"),
    ("quay.io", "*.amazonaws.com"),
    ("quay.io", "*.cloudfront.net"),
    ("gcr.io", "storage.googleapis.com"),
    ("*.gcr.io", "storage.googleapis.com"),
    ("mcr.microsoft.com", "*.mcr.microsoft.com"),
];

/// A host name, or `*.suffix` (any name ending in `.suffix`), with an optional port.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostPattern {
    /// Lowercase, without brackets; `*` alone matches anything.
    name: String,
    port: Option<u16>,
}

impl HostPattern {
    fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim().to_ascii_lowercase();
        if text == "*" {
            return Ok(Self {
                name: text,
                port: None,
            });
        }
        let (name, port) = split_host_port(&text);
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .map_err(|_| format!("bad port in `{text}`"))
            })
            .transpose()?;
        let bare = name.strip_prefix("*.").unwrap_or(name);
        let valid = !bare.is_empty()
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
        if !valid {
            return Err(format!("`{text}` is not a host name, `*.suffix` or `*`"));
        }
        Ok(Self {
            name: name.to_owned(),
            port,
        })
    }

    fn matches(&self, host: &str, port: Option<u16>) -> bool {
        if self.port.is_some() && self.port != port {
            return false;
        }
        match self.name.strip_prefix("*.") {
            _ if self.name == "*" => true,
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => self.name == host,
        }
    }
}

/// One allowed host: `registry` may send pulls to `host`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHost {
    registry: HostPattern,
    host: HostPattern,
}

impl AllowedHost {
    /// Parses [`ALLOWED_HOSTS_ENV`]'s value: `REGISTRY=HOST[,…]`, each side `host`,
    /// `host:port` or `*.suffix` (and `*` for any registry), e.g.
    /// `registry.gitlab.com=gitlab.com,myreg:5000=auth.corp:8443`.
    pub fn parse_list(text: &str) -> Result<Vec<Self>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                let (registry, host) = entry
                    .split_once('=')
                    .ok_or_else(|| format!("`{entry}` is not REGISTRY=HOST"))?;
                Ok(Self {
                    registry: HostPattern::parse(registry)?,
                    host: HostPattern::parse(host)?,
                })
            })
            .collect()
    }

    fn built_in() -> impl Iterator<Item = Self> {
        BUILT_IN.iter().filter_map(|(registry, host)| {
            Some(Self {
                registry: HostPattern::parse(registry).ok()?,
                host: HostPattern::parse(host).ok()?,
            })
        })
    }
}

/// `host` and `port` of `host[:port]` (`[v6]:port` too); the host keeps no brackets.
fn split_host_port(text: &str) -> (&str, Option<&str>) {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').unwrap_or((rest, ""));
        return (host, after.strip_prefix(':'));
    }
    match text.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, Some(port)),
        _ => (text, None),
    }
}

/// What kind of place an address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressKind {
    Public,
    Loopback,
    Private,
    /// Link-local, and the cloud metadata services.
    LinkLocal,
    /// Unspecified, multicast, broadcast, documentation, benchmarking, reserved.
    Special,
}

impl AddressKind {
    fn name(self) -> &'static str {
        match self {
            Self::Public => "public",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::LinkLocal => "link-local (cloud metadata)",
            Self::Special => "reserved",
        }
    }
}

pub(crate) fn kind_of(ip: IpAddr) -> AddressKind {
    match ip {
        IpAddr::V4(v4) => kind_of_v4(v4),
        IpAddr::V6(v6) => kind_of_v6(v6),
    }
}

fn kind_of_v4(ip: Ipv4Addr) -> AddressKind {
    let [a, b, c, _] = ip.octets();
    if ip.is_loopback() {
        AddressKind::Loopback
    } else if ip.is_link_local() || ip == Ipv4Addr::new(100, 100, 100, 200) {
        AddressKind::LinkLocal // 169.254/16 (AWS, GCP, Azure metadata); Alibaba's
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        AddressKind::Private // RFC 1918, carrier-grade NAT
    } else if a == 0
        || a >= 224
        || ip.is_documentation()
        || (a == 198 && (b & 0xfe) == 18)
        || (a == 192 && b == 0 && c == 0)
        || (a == 192 && b == 88 && c == 99)
    {
        AddressKind::Special
    } else {
        AddressKind::Public
    }
}

fn kind_of_v6(ip: Ipv6Addr) -> AddressKind {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return kind_of_v4(v4);
    }
    let s = ip.segments();
    if ip.is_loopback() {
        AddressKind::Loopback
    } else if (s[0] & 0xffc0) == 0xfe80 || ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)
    {
        AddressKind::LinkLocal
    } else if (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfec0 {
        AddressKind::Private // unique local, deprecated site-local
    } else if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        // NAT64: the IPv4 address it stands for.
        kind_of_v4(Ipv4Addr::new(
            (s[6] >> 8) as u8,
            s[6] as u8,
            (s[7] >> 8) as u8,
            s[7] as u8,
        ))
    } else if s[0] == 0x2002 {
        kind_of_v4(Ipv4Addr::new(
            (s[1] >> 8) as u8,
            s[1] as u8,
            (s[2] >> 8) as u8,
            s[2] as u8,
        ))
    } else if ip.is_unspecified()
        || ip.is_multicast()
        || (s[0] == 0x2001 && s[1] == 0xdb8)
        || (s[0] == 0x100 && s[1..4] == [0, 0, 0])
        || s[0] == 0
    {
        AddressKind::Special
    } else {
        AddressKind::Public
    }
}

/// Why a realm or redirect target was looked at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    TokenRealm,
    Redirect,
}

impl Purpose {
    fn name(self) -> &'static str {
        match self {
            Self::TokenRealm => "the registry's token realm",
            Self::Redirect => "the registry's redirect to",
        }
    }
}

/// The rules for one pull from one registry.
#[derive(Debug)]
pub(crate) struct HostPolicy {
    /// `http` or `https`.
    scheme: &'static str,
    /// The registry's host (lowercase, no brackets) and port.
    host: String,
    port: u16,
    /// `host[:port]` as contacted (`index.docker.io`), and as written (`docker.io`).
    registry: String,
    written: String,
    allowed: Vec<AllowedHost>,
    insecure: Vec<String>,
    fixed: Vec<(String, IpAddr)>,
    /// The registry's addresses, pinned at its first resolution (or its IP literal).
    registry_addrs: Mutex<Vec<IpAddr>>,
}

impl HostPolicy {
    pub(crate) fn new(
        registry: &str,
        written: &str,
        https: bool,
        allowed: &[AllowedHost],
        insecure: &[String],
        fixed: &[(String, IpAddr)],
    ) -> Self {
        let (host, port) = split_host_port(registry);
        let host = host.to_ascii_lowercase();
        let scheme = if https { "https" } else { "http" };
        let port = port
            .and_then(|p| p.parse().ok())
            .unwrap_or(if https { 443 } else { 80 });
        let literal = host.parse::<IpAddr>().ok();
        let applies = |a: &AllowedHost| {
            [registry, written].iter().any(|r| {
                let (h, p) = split_host_port(r);
                a.registry
                    .matches(&h.to_ascii_lowercase(), p.and_then(|p| p.parse().ok()))
            })
        };
        Self {
            scheme,
            port,
            registry: registry.to_owned(),
            written: written.to_owned(),
            allowed: AllowedHost::built_in()
                .chain(allowed.iter().cloned())
                .filter(|a| applies(a))
                .collect(),
            insecure: insecure.to_vec(),
            fixed: fixed
                .iter()
                .map(|(n, ip)| (n.to_ascii_lowercase(), *ip))
                .collect(),
            registry_addrs: Mutex::new(literal.into_iter().collect()),
            host,
        }
    }

    /// `scheme://host:port` of the registry.
    pub(crate) fn base(&self) -> String {
        format!("{}://{}", self.scheme, self.registry)
    }

    /// Whether `url` is the registry's own origin (where its credentials may go).
    pub(crate) fn is_registry(&self, url: &Url) -> bool {
        url.scheme() == self.scheme
            && host_of(url) == self.host
            && url.port_or_known_default() == Some(self.port)
    }

    /// Checks a realm or redirect target against both rules (module doc).
    pub(crate) fn check(&self, url: &Url, purpose: Purpose) -> Result<(), String> {
        let host = host_of(url);
        let port = url.port_or_known_default();
        let authority = match port {
            Some(p) if host.contains(':') => format!("[{host}]:{p}"),
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let shown = escape::untrusted(&authority, escape::SHOWN_CHARS);
        let what = purpose.name();
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "{what} {} is not HTTP(S): refused",
                escape::untrusted(url.as_str(), escape::SHOWN_CHARS)
            ));
        }
        if let Ok(ip) = host.parse::<IpAddr>()
            && !self.address_allowed(ip)
        {
            return Err(format!(
                "{what} {shown} is a {} address the registry is not on: refused",
                kind_of(ip).name()
            ));
        }
        let own = host == self.host && port == Some(self.port);
        if !own && !self.allowed.iter().any(|a| a.host.matches(&host, port)) {
            return Err(format!(
                "{what} {shown} is not the registry's own host ({}): refused (to allow it, set {ALLOWED_HOSTS_ENV}={}={shown})",
                self.registry, self.written
            ));
        }
        if url.scheme() == "http" && !self.allows_http(&host, &authority) {
            return Err(format!(
                "{what} {shown} is plain HTTP: refused (only loopback registries and those in OMABOX_INSECURE_REGISTRIES are reached over HTTP)"
            ));
        }
        Ok(())
    }

    fn allows_http(&self, host: &str, authority: &str) -> bool {
        host == "localhost"
            || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
            || self.insecure.iter().any(|r| r == authority || r == host)
    }

    /// The address rule (module doc).
    pub(crate) fn address_allowed(&self, ip: IpAddr) -> bool {
        let own = self
            .registry_addrs
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match kind_of(ip) {
            AddressKind::Public => true,
            kind @ (AddressKind::Loopback | AddressKind::Private) => {
                own.iter().any(|a| kind_of(*a) == kind)
            }
            AddressKind::LinkLocal | AddressKind::Special => own.contains(&ip),
        }
    }

    /// The addresses of `name` a connection may use (module doc).
    async fn resolve(&self, name: &str) -> Result<Vec<IpAddr>, String> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let registry = name == self.host;
        if registry {
            let pinned = self
                .registry_addrs
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            if !pinned.is_empty() {
                return Ok(pinned);
            }
        }
        let fixed: Vec<IpAddr> = self
            .fixed
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, ip)| *ip)
            .collect();
        let found = if fixed.is_empty() {
            tokio::net::lookup_host((name.as_str(), 0))
                .await
                .map_err(|e| format!("cannot resolve {}: {e}", escape::untrusted(&name, 256)))?
                .map(|a| a.ip())
                .collect()
        } else {
            fixed
        };
        if registry {
            let mut pinned = self
                .registry_addrs
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if pinned.is_empty() {
                pinned.clone_from(&found);
            }
            return Ok(pinned.clone());
        }
        let kept: Vec<IpAddr> = found
            .iter()
            .copied()
            .filter(|ip| self.address_allowed(*ip))
            .collect();
        if kept.is_empty() {
            let kinds: Vec<&str> = found.iter().map(|ip| kind_of(*ip).name()).collect();
            return Err(format!(
                "{} resolves only to addresses a registry may not send a pull to ({}): refused",
                escape::untrusted(&name, 256),
                kinds.join(", ")
            ));
        }
        Ok(kept)
    }
}

fn host_of(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    host.trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase()
}

/// The HTTP client's resolver: the address rule on every connection.
#[derive(Debug)]
pub(crate) struct PolicyResolver(pub(crate) Arc<HostPolicy>);

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = Arc::clone(&self.0);
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addrs = policy.resolve(&name).await.map_err(Refused)?;
            let addrs: reqwest::dns::Addrs =
                Box::new(addrs.into_iter().map(|ip| std::net::SocketAddr::new(ip, 0)));
            Ok(addrs)
        })
    }
}

/// A resolution the address rule refused (its text is the reason).
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(registry: &str, allowed: &str, fixed: &[(&str, &str)]) -> HostPolicy {
        let fixed: Vec<(String, IpAddr)> = fixed
            .iter()
            .map(|(n, ip)| ((*n).to_owned(), ip.parse().unwrap()))
            .collect();
        HostPolicy::new(
            registry,
            registry,
            !registry.starts_with("127.") && !registry.starts_with("localhost"),
            &AllowedHost::parse_list(allowed).unwrap(),
            &[],
            &fixed,
        )
    }

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    #[test]
    fn addresses_are_classified_with_mapped_and_embedded_ipv4() {
        for (ip, kind) in [
            ("8.8.8.8", AddressKind::Public),
            ("127.0.0.2", AddressKind::Loopback),
            ("10.1.2.3", AddressKind::Private),
            ("172.16.0.1", AddressKind::Private),
            ("100.64.0.1", AddressKind::Private),
            ("169.254.169.254", AddressKind::LinkLocal),
            ("100.100.100.200", AddressKind::LinkLocal),
            ("0.0.0.0", AddressKind::Special),
            ("198.18.0.1", AddressKind::Special),
            ("255.255.255.255", AddressKind::Special),
            ("::1", AddressKind::Loopback),
            ("::ffff:127.0.0.1", AddressKind::Loopback),
            ("::ffff:169.254.169.254", AddressKind::LinkLocal),
            ("64:ff9b::a9fe:a9fe", AddressKind::LinkLocal),
            ("2002:a00:1::1", AddressKind::Private),
            ("fd00:ec2::254", AddressKind::LinkLocal),
            ("fc00::1", AddressKind::Private),
            ("fe80::1", AddressKind::LinkLocal),
            ("::", AddressKind::Special),
            ("2606:4700::1111", AddressKind::Public),
        ] {
            assert_eq!(kind_of(ip.parse().unwrap()), kind, "{ip}");
        }
    }

    #[test]
    fn realms_and_redirects_go_only_to_the_registry_or_an_allowed_host() {
        let p = policy("registry.example", "", &[]);
        assert!(
            p.check(&url("https://registry.example/token"), Purpose::TokenRealm)
                .is_ok()
        );
        let e = p
            .check(&url("https://auth.example/token"), Purpose::TokenRealm)
            .unwrap_err();
        assert!(e.contains(ALLOWED_HOSTS_ENV), "{e}");
        // Another port of the registry's host is another host.
        assert!(
            p.check(&url("https://registry.example:444/"), Purpose::Redirect)
                .is_err()
        );
        // Plain HTTP to a public host: refused even on the registry's own host.
        let e = p
            .check(&url("http://registry.example:443/x"), Purpose::Redirect)
            .unwrap_err();
        assert!(e.contains("plain HTTP"), "{e}");
        assert!(
            p.check(&url("file:///etc/passwd"), Purpose::Redirect)
                .is_err()
        );

        let p = policy(
            "registry.example",
            "registry.example=auth.example,registry.example=*.cdn.example:8443",
            &[],
        );
        assert!(
            p.check(&url("https://auth.example/token"), Purpose::TokenRealm)
                .is_ok()
        );
        assert!(
            p.check(&url("https://eu.cdn.example:8443/b"), Purpose::Redirect)
                .is_ok()
        );
        assert!(
            p.check(&url("https://eu.cdn.example/b"), Purpose::Redirect)
                .is_err()
        );
        assert!(
            p.check(&url("https://cdn.example:8443/b"), Purpose::Redirect)
                .is_err()
        );
        // Entries of other registries do not apply.
        let p = policy("other.example", "registry.example=auth.example", &[]);
        assert!(
            p.check(&url("https://auth.example/token"), Purpose::TokenRealm)
                .is_err()
        );
        // Docker Hub's token service and CDN are built in.
        let p = HostPolicy::new("index.docker.io", "docker.io", true, &[], &[], &[]);
        assert!(
            p.check(&url("https://auth.docker.io/token"), Purpose::TokenRealm)
                .is_ok()
        );
        assert!(
            p.check(
                &url("https://production.cloudflare.docker.com/x"),
                Purpose::Redirect
            )
            .is_ok()
        );
    }

    #[test]
    fn host_only_addresses_are_refused_unless_the_registry_is_there() {
        let p = policy("registry.example", "*=*", &[]);
        for target in [
            "http://127.0.0.1:8080/",
            "https://[::1]/",
            "https://169.254.169.254/latest/meta-data/",
            "https://10.0.0.1/",
            "https://[fd00:ec2::254]/",
            "https://0.0.0.0/",
        ] {
            let e = p.check(&url(target), Purpose::Redirect).unwrap_err();
            assert!(e.contains("refused"), "{target}: {e}");
        }
        assert!(p.check(&url("https://1.1.1.1/"), Purpose::Redirect).is_ok());
        // A loopback registry may send its client to loopback (when the host rule
        // allows the host), never to the metadata service.
        let p = policy("127.0.0.1:5000", "*=*", &[]);
        assert!(
            p.check(&url("http://127.0.0.1:5001/t"), Purpose::TokenRealm)
                .is_ok()
        );
        assert!(
            p.check(&url("http://10.0.0.1/t"), Purpose::TokenRealm)
                .is_err()
        );
        assert!(
            p.check(&url("http://169.254.169.254/"), Purpose::TokenRealm)
                .is_err()
        );
    }

    #[tokio::test]
    async fn names_are_checked_as_resolved_and_the_registry_is_pinned() {
        let p = policy(
            "registry.example",
            "",
            &[
                ("registry.example", "1.2.3.4"),
                ("rebind.example", "127.0.0.1"),
                ("meta.example", "169.254.169.254"),
                ("mixed.example", "10.0.0.1"),
                ("mixed.example", "5.6.7.8"),
            ],
        );
        assert_eq!(
            p.resolve("registry.example").await.unwrap(),
            ["1.2.3.4".parse::<IpAddr>().unwrap()]
        );
        for name in ["rebind.example", "meta.example"] {
            let e = p.resolve(name).await.unwrap_err();
            assert!(e.contains("refused"), "{e}");
        }
        assert_eq!(
            p.resolve("mixed.example").await.unwrap(),
            ["5.6.7.8".parse::<IpAddr>().unwrap()]
        );
        // A loopback registry's own name: anything it resolves to, once.
        let p = policy("localhost:5000", "", &[("localhost", "127.0.0.1")]);
        assert_eq!(
            p.resolve("localhost").await.unwrap(),
            ["127.0.0.1".parse::<IpAddr>().unwrap()]
        );
    }

    #[test]
    fn allowed_host_lists_parse_or_say_what_is_wrong() {
        assert_eq!(
            AllowedHost::parse_list(" a.example=b.example , *=*.c.example:8443 ")
                .unwrap()
                .len(),
            2
        );
        for bad in ["nope", "a=b c", "a=b:port", "=b"] {
            assert!(AllowedHost::parse_list(bad).is_err(), "{bad}");
        }
    }
}
