//! An environment's network policy: the `networking` object of an Environment's `config`
//! and the pure rules an enforcing backend applies to every connection and DNS question a
//! sandbox makes.
//!
//! NOT FOUND in the reference: the TypeScript contract carries no Environment config type.
//! The shape follows the public managed-agents Environment API: a `"type"`-tagged object,
//! `unrestricted` or `limited` with `allowed_hosts`, `allow_package_managers` and
//! `allow_mcp_servers` (snake_case, as in that API). omabox adds `none` (loopback only).
//!
//! What is decided here, without I/O:
//! - [`NetworkPolicy::admits`]: may a connection to host *name* `host`, port `port` go out?
//!   Names, never addresses: `limited` admits by the name the sandbox asked for (TLS SNI,
//!   HTTP Host, or the name the host-side DNS stub resolved), so an allowed host's address
//!   does not open other names that share it.
//! - [`NetworkPolicy::answers`]: may the DNS stub resolve `host` at all? Only names some
//!   connection could be admitted to, so lookups cannot carry data out.
//! - [`address_is_never_reachable`]: addresses no policy reaches whatever a name resolves
//!   to (loopback, link-local, every cloud metadata address, unspecified, multicast,
//!   broadcast, and the IPv4-mapped, -compatible and NAT64 forms of those). The host's own
//!   addresses and other sandboxes' are added by
//!   the enforcing backend, which knows them.
//!
//! The omabox gateway (the hosted inference and MCP proxies) is not part of the config: an
//! enforcing backend admits it in every policy but `none`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

/// The `networking` object of an Environment's `config`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum NetworkingConfig {
    /// Outbound internet (never the host's own services or metadata addresses).
    Unrestricted,
    /// Only the listed hosts (and, when asked, the package registries and the MCP servers
    /// the session names).
    Limited {
        /// `HOST` or `HOST:PORT`; `*.example.com` for any subdomain (not the apex).
        #[serde(default, deserialize_with = "null_as_default")]
        allowed_hosts: Vec<String>,
        /// Adds [`PACKAGE_MANAGER_HOSTS`].
        #[serde(default, deserialize_with = "null_as_default")]
        allow_package_managers: bool,
        /// Adds the hosts of the session's URL MCP servers.
        #[serde(default, deserialize_with = "null_as_default")]
        allow_mcp_servers: bool,
    },
    /// omabox's own: nothing but loopback.
    None,
}

/// A field the public API sends as `null` to mean its default (its request params are
/// "Fields default to null"): absent and `null` both give `T::default()`.
fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

/// The registries `allow_package_managers` opens, by client: pip, npm, apt (Debian and
/// Ubuntu), cargo, go modules, RubyGems. Ports 80 and 443.
pub const PACKAGE_MANAGER_HOSTS: &[(&str, &[&str])] = &[
    ("pip", &["pypi.org", "files.pythonhosted.org"]),
    ("npm", &["registry.npmjs.org", "registry.yarnpkg.com"]),
    (
        "apt",
        &[
            "deb.debian.org",
            "security.debian.org",
            "archive.ubuntu.com",
            "security.ubuntu.com",
            "ports.ubuntu.com",
        ],
    ),
    (
        "cargo",
        &["crates.io", "index.crates.io", "static.crates.io"],
    ),
    ("go", &["proxy.golang.org", "sum.golang.org"]),
    ("gem", &["rubygems.org", "index.rubygems.org"]),
];

/// Ports a host entry without `:PORT` admits.
pub const DEFAULT_PORTS: [u16; 2] = [80, 443];

/// The ports an enforcing backend that cannot take every port (one listener per port)
/// relays under `unrestricted`: ftp, ssh, http, https, rsync, mysql, postgres, redis, the
/// usual development HTTP ports, git, mongodb.
pub const UNRESTRICTED_PORTS: [u16; 13] = [
    21, 22, 80, 443, 873, 3306, 5432, 6379, 8000, 8080, 8443, 9418, 27017,
];

/// Why a networking config or host entry was refused. Names the entry, never more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkingError {
    /// A host entry that is not `HOST`, `HOST:PORT` or `*.SUFFIX[:PORT]`.
    #[error("allowed host {entry:?}: {reason}")]
    BadHost {
        /// The entry as given.
        entry: String,
        /// What is wrong with it.
        reason: &'static str,
    },
}

/// The host part of a rule: one name, or every subdomain of a suffix.
#[derive(Debug, Clone, PartialEq, Eq)]
enum HostPattern {
    Exact(String),
    Subdomains(String),
}

/// One admitted destination: a host pattern and the ports it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostRule {
    host: HostPattern,
    /// `None`: [`DEFAULT_PORTS`].
    port: Option<u16>,
}

impl HostRule {
    /// Parses `HOST`, `HOST:PORT`, `*.SUFFIX` or `*.SUFFIX:PORT`. Host names are
    /// case-insensitive, a trailing dot is dropped; IP literals, URLs, user info and
    /// anything that is not a DNS name are refused.
    pub fn parse(entry: &str) -> Result<Self, NetworkingError> {
        let bad = |reason| NetworkingError::BadHost {
            entry: entry.to_owned(),
            reason,
        };
        if entry.contains("://") || entry.contains('/') || entry.contains('@') {
            return Err(bad("give a host name (and port), not a URL"));
        }
        if entry.starts_with('[') || entry.matches(':').count() > 1 {
            return Err(bad("IP addresses are not allowed: name the host"));
        }
        let (host, port) = match entry.rsplit_once(':') {
            Some((host, port)) => {
                let port = port
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .ok_or_else(|| bad("the port must be a number from 1 to 65535"))?;
                (host, Some(port))
            }
            None => (entry, None),
        };
        let (wildcard, name) = match host.strip_prefix("*.") {
            Some(suffix) => (true, suffix),
            None => (false, host),
        };
        let name = normalize_name(name).ok_or_else(|| bad("not a valid DNS host name"))?;
        if name.parse::<Ipv4Addr>().is_ok() || name.split('.').all(|l| l.parse::<u32>().is_ok()) {
            return Err(bad("IP addresses are not allowed: name the host"));
        }
        if wildcard && !name.contains('.') {
            return Err(bad("a wildcard needs a suffix of at least two labels"));
        }
        let host = if wildcard {
            HostPattern::Subdomains(name)
        } else {
            HostPattern::Exact(name)
        };
        Ok(Self { host, port })
    }

    fn exact(name: &str) -> Self {
        Self {
            host: HostPattern::Exact(name.to_owned()),
            port: None,
        }
    }

    fn matches_name(&self, name: &str) -> bool {
        match &self.host {
            HostPattern::Exact(h) => h == name,
            HostPattern::Subdomains(suffix) => name
                .strip_suffix(suffix.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }

    fn matches_port(&self, port: u16) -> bool {
        match self.port {
            Some(p) => p == port,
            None => DEFAULT_PORTS.contains(&port),
        }
    }
}

impl fmt::Display for HostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            HostPattern::Exact(h) => f.write_str(h)?,
            HostPattern::Subdomains(s) => write!(f, "*.{s}")?,
        }
        match self.port {
            Some(p) => write!(f, ":{p}"),
            None => Ok(()),
        }
    }
}

/// Lowercases a DNS name and drops one trailing dot; `None` when it is not one: labels of
/// 1–63 letters, digits and hyphens (not at either end), 253 characters at most.
pub fn normalize_name(name: &str) -> Option<String> {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let valid_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(valid_label)).then_some(name)
}

/// What a sandbox may reach, compiled from a [`NetworkingConfig`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkPolicy {
    /// Any name on any port (addresses still filtered).
    Unrestricted,
    /// Only these rules.
    Limited(Vec<HostRule>),
    /// Loopback only.
    None,
}

impl NetworkPolicy {
    /// Compiles a config. `mcp_hosts`: the host entries of the session's URL MCP servers
    /// (used when `allow_mcp_servers`).
    pub fn compile(config: &NetworkingConfig, mcp_hosts: &[&str]) -> Result<Self, NetworkingError> {
        match config {
            NetworkingConfig::Unrestricted => Ok(Self::Unrestricted),
            NetworkingConfig::None => Ok(Self::None),
            NetworkingConfig::Limited {
                allowed_hosts,
                allow_package_managers,
                allow_mcp_servers,
            } => {
                let mut rules = allowed_hosts
                    .iter()
                    .map(|h| HostRule::parse(h.trim()))
                    .collect::<Result<Vec<_>, _>>()?;
                if *allow_package_managers {
                    rules.extend(
                        PACKAGE_MANAGER_HOSTS
                            .iter()
                            .flat_map(|(_, hosts)| hosts.iter())
                            .map(|h| HostRule::exact(h)),
                    );
                }
                if *allow_mcp_servers {
                    for host in mcp_hosts {
                        rules.push(HostRule::parse(host)?);
                    }
                }
                rules.dedup();
                Ok(Self::Limited(rules))
            }
        }
    }

    /// The policy's name as the Environment API spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Unrestricted => "unrestricted",
            Self::Limited(_) => "limited",
            Self::None => "none",
        }
    }

    /// Whether a connection to `host` (a name, as the sandbox asked for it) on `port` may go
    /// out. Not a name (an address, garbage): only `unrestricted` admits it, and the address
    /// rules still apply.
    pub fn admits(&self, host: &str, port: u16) -> bool {
        match self {
            Self::Unrestricted => true,
            Self::None => false,
            Self::Limited(rules) => normalize_name(host).is_some_and(|name| {
                rules
                    .iter()
                    .any(|r| r.matches_name(&name) && r.matches_port(port))
            }),
        }
    }

    /// The destination ports some connection could be admitted on, for a backend that
    /// listens per port: [`DEFAULT_PORTS`] and every port a `limited` rule names;
    /// [`UNRESTRICTED_PORTS`] under `unrestricted` (which admits any port, but a backend
    /// listening per port reaches only these); none under `none`.
    pub fn ports(&self) -> std::collections::BTreeSet<u16> {
        match self {
            Self::Unrestricted => UNRESTRICTED_PORTS.into_iter().collect(),
            Self::None => std::collections::BTreeSet::new(),
            Self::Limited(rules) => rules
                .iter()
                .flat_map(|r| match r.port {
                    Some(port) => vec![port],
                    None => DEFAULT_PORTS.to_vec(),
                })
                .collect(),
        }
    }

    /// Whether the DNS stub may resolve `host`: under `limited`, only names a rule admits on
    /// some port, so a lookup of anything else never leaves the host.
    pub fn answers(&self, host: &str) -> bool {
        match self {
            Self::Unrestricted => normalize_name(host).is_some(),
            Self::None => false,
            Self::Limited(rules) => {
                normalize_name(host).is_some_and(|name| rules.iter().any(|r| r.matches_name(&name)))
            }
        }
    }
}

/// Cloud metadata and platform service addresses outside 169.254.0.0/16 (which holds AWS's,
/// GCP's — `metadata.google.internal` —, Azure's IMDS, OpenStack's, DigitalOcean's, Oracle's
/// and Tencent's `169.254.0.23`, ECS's task metadata `169.254.170.2`): Alibaba Cloud's
/// metadata service, Azure's wireserver (VM agent, extension configuration and secrets), and
/// Oracle Cloud's legacy metadata address.
pub const METADATA_V4: [Ipv4Addr; 3] = [
    Ipv4Addr::new(100, 100, 100, 200),
    Ipv4Addr::new(168, 63, 129, 16),
    Ipv4Addr::new(192, 0, 0, 192),
];

/// AWS's IPv6 platform services, `fd00:ec2::/32` (metadata `::254`, DNS `::253`, time
/// `::123`).
const AWS_V6: (Ipv6Addr, u8) = (Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0), 32);

/// Addresses no policy reaches, whatever name resolved to them: loopback, link-local
/// (169.254.0.0/16 holds most cloud metadata services; fe80::/10), the other metadata
/// addresses ([`METADATA_V4`], AWS's `fd00:ec2::/32`), unspecified, `0.0.0.0/8`, multicast,
/// broadcast — and every IPv6 form that carries one of those IPv4 addresses:
/// IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`), and NAT64, the well-known
/// `64:ff9b::/96` and the local-use `64:ff9b:1::/48` (RFC 6052, at each prefix length's
/// embedding), which a NAT64 gateway turns into that IPv4 address.
pub fn address_is_never_reachable(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => v4_never(v4),
        IpAddr::V6(v6) => {
            // `::` and `::1` are themselves, not ::0.0.0.0 and ::0.0.0.1.
            if v6.is_unspecified() || v6.is_loopback() {
                return true;
            }
            if embeds_never_reachable_v4(v6) {
                return true;
            }
            v6.is_multicast()
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6_in(v6, AWS_V6.0, AWS_V6.1)
        }
    }
}

fn v4_never(v4: Ipv4Addr) -> bool {
    v4.is_loopback()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_multicast()
        || v4.is_broadcast()
        || v4.octets()[0] == 0
        || METADATA_V4.contains(&v4)
}

fn v6_in(addr: Ipv6Addr, network: Ipv6Addr, prefix: u8) -> bool {
    let shift = 128 - u32::from(prefix);
    (addr.to_bits() >> shift) == (network.to_bits() >> shift)
}

/// Whether `v6` stands for an IPv4 address no policy reaches: mapped or compatible
/// (`to_ipv4`) and NAT64 well-known `64:ff9b::/96` by the whole rule; NAT64 local-use
/// `64:ff9b:1::/48`, whose prefix length is the operator's, read at each RFC 6052 embedding
/// (prefix /48, /56, /64, /96; bits 64–71 are the reserved `u` octet) and refused when one
/// reading is loopback, link-local or metadata (the zero tail of a /48 embedding reads as
/// `0.0.0.0` at /96: that alone refuses nothing).
fn embeds_never_reachable_v4(v6: Ipv6Addr) -> bool {
    let well_known = Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0);
    let local_use = Ipv6Addr::new(0x64, 0xff9b, 1, 0, 0, 0, 0, 0);
    let o = v6.octets();
    if v6.to_ipv4().is_some_and(v4_never) {
        return true;
    }
    if v6_in(v6, well_known, 96) && v4_never(Ipv4Addr::new(o[12], o[13], o[14], o[15])) {
        return true;
    }
    v6_in(v6, local_use, 48)
        && [
            Ipv4Addr::new(o[6], o[7], o[9], o[10]),
            Ipv4Addr::new(o[7], o[9], o[10], o[11]),
            Ipv4Addr::new(o[9], o[10], o[11], o[12]),
            Ipv4Addr::new(o[12], o[13], o[14], o[15]),
        ]
        .into_iter()
        .any(|v4| v4.is_loopback() || v4.is_link_local() || METADATA_V4.contains(&v4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited(hosts: &[&str], pm: bool) -> NetworkPolicy {
        NetworkPolicy::compile(
            &NetworkingConfig::Limited {
                allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
                allow_package_managers: pm,
                allow_mcp_servers: false,
            },
            &[],
        )
        .unwrap()
    }

    #[test]
    fn configs_round_trip_the_environment_api_json() {
        let cases = [
            (r#"{"type":"unrestricted"}"#, NetworkingConfig::Unrestricted),
            (r#"{"type":"none"}"#, NetworkingConfig::None),
            (
                r#"{"type":"limited","allowed_hosts":["api.example.com"],"allow_package_managers":true,"allow_mcp_servers":false}"#,
                NetworkingConfig::Limited {
                    allowed_hosts: vec!["api.example.com".into()],
                    allow_package_managers: true,
                    allow_mcp_servers: false,
                },
            ),
        ];
        for (json, config) in cases {
            assert_eq!(
                serde_json::from_str::<NetworkingConfig>(json).unwrap(),
                config
            );
            assert_eq!(serde_json::to_string(&config).unwrap(), json);
        }
        // Omitted lists and flags default to empty/false.
        assert_eq!(
            serde_json::from_str::<NetworkingConfig>(r#"{"type":"limited"}"#).unwrap(),
            NetworkingConfig::Limited {
                allowed_hosts: vec![],
                allow_package_managers: false,
                allow_mcp_servers: false
            }
        );
        for bad in [
            r#"{"type":"open"}"#,
            r#"{}"#,
            r#"{"type":"limited","allowed_host":["x.com"]}"#,
        ] {
            assert!(
                serde_json::from_str::<NetworkingConfig>(bad).is_err(),
                "{bad}"
            );
        }
    }

    /// The public API's request params: "Fields default to null".
    #[test]
    fn null_fields_of_a_limited_config_mean_their_defaults() {
        let config = serde_json::from_str::<NetworkingConfig>(
            r#"{"type":"limited","allowed_hosts":null,"allow_mcp_servers":null,"allow_package_managers":null}"#,
        )
        .unwrap();
        assert_eq!(
            config,
            NetworkingConfig::Limited {
                allowed_hosts: vec![],
                allow_package_managers: false,
                allow_mcp_servers: false
            }
        );
        let config = serde_json::from_str::<NetworkingConfig>(
            r#"{"type":"limited","allowed_hosts":["api.example.com"],"allow_mcp_servers":null,"allow_package_managers":true}"#,
        )
        .unwrap();
        assert_eq!(
            config,
            NetworkingConfig::Limited {
                allowed_hosts: vec!["api.example.com".into()],
                allow_package_managers: true,
                allow_mcp_servers: false
            }
        );
        for bad in [
            r#"{"type":"limited","allowed_hosts":"x.com"}"#,
            r#"{"type":"limited","allow_mcp_servers":"yes"}"#,
        ] {
            assert!(
                serde_json::from_str::<NetworkingConfig>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn listened_ports_are_the_default_ones_plus_every_port_a_rule_names() {
        let ports = |p: &NetworkPolicy| p.ports().into_iter().collect::<Vec<_>>();
        assert_eq!(ports(&limited(&[], false)), Vec::<u16>::new());
        assert_eq!(ports(&limited(&["a.example"], false)), [80, 443]);
        assert_eq!(
            ports(&limited(&["a.example:8443", "b.example:22"], false)),
            [22, 8443]
        );
        assert_eq!(
            ports(&limited(&["a.example", "b.example:8443"], false)),
            [80, 443, 8443]
        );
        assert_eq!(ports(&NetworkPolicy::Unrestricted), UNRESTRICTED_PORTS);
        assert!(NetworkPolicy::None.ports().is_empty());
    }

    #[test]
    fn host_entries_are_names_with_an_optional_port() {
        for (entry, shown) in [
            ("Example.COM", "example.com"),
            ("example.com.", "example.com"),
            ("example.com:8443", "example.com:8443"),
            ("*.githubusercontent.com", "*.githubusercontent.com"),
            ("*.corp.example:22", "*.corp.example:22"),
            ("localhost", "localhost"),
        ] {
            assert_eq!(HostRule::parse(entry).unwrap().to_string(), shown);
        }
        for (entry, why) in [
            ("", "valid DNS"),
            ("https://example.com", "URL"),
            ("example.com/path", "URL"),
            ("user@example.com", "URL"),
            ("10.0.0.1", "IP"),
            ("10.0.0.1:443", "IP"),
            ("[::1]:443", "IP"),
            ("fd00::1", "IP"),
            ("example.com:0", "port"),
            ("example.com:65536", "port"),
            ("example.com:https", "port"),
            ("exa mple.com", "valid DNS"),
            ("a..b", "valid DNS"),
            ("-a.com", "valid DNS"),
            ("a-.com", "valid DNS"),
            ("*", "valid DNS"),
            ("*.com", "wildcard"),
            ("a.*.com", "valid DNS"),
            ("ex\u{e4}mple.com", "valid DNS"),
        ] {
            let err = HostRule::parse(entry).unwrap_err().to_string();
            assert!(err.contains(why), "{entry:?}: {err}");
        }
        let long = format!("{}.com", "a".repeat(64));
        assert!(HostRule::parse(&long).is_err());
    }

    #[test]
    fn limited_admits_exactly_its_names_and_ports() {
        let p = limited(
            &["api.example.com", "git.example.com:22", "*.cdn.example"],
            false,
        );
        assert!(p.admits("api.example.com", 443));
        assert!(p.admits("API.example.com.", 80));
        assert!(!p.admits("api.example.com", 8080));
        assert!(!p.admits("example.com", 443));
        assert!(!p.admits("xapi.example.com", 443));
        assert!(!p.admits("api.example.com.evil.test", 443));
        assert!(p.admits("git.example.com", 22));
        assert!(!p.admits("git.example.com", 443));
        assert!(p.admits("a.cdn.example", 443));
        assert!(p.admits("a.b.cdn.example", 443));
        assert!(!p.admits("cdn.example", 443), "a wildcard is not its apex");
        assert!(!p.admits("xcdn.example", 443));
        // Addresses are never names.
        assert!(!p.admits("93.184.216.34", 443));
        assert!(!p.admits("", 443));
        // DNS answers only admitted names.
        assert!(p.answers("api.example.com"));
        assert!(p.answers("x.cdn.example"));
        assert!(!p.answers("secret-data.attacker.test"));
        assert!(!p.answers("cdn.example"));
    }

    #[test]
    fn package_managers_are_opened_only_when_asked() {
        let without = limited(&[], false);
        let with = limited(&[], true);
        for (_, hosts) in PACKAGE_MANAGER_HOSTS {
            for h in *hosts {
                assert!(!without.admits(h, 443));
                assert!(with.admits(h, 443), "{h}");
                assert!(with.admits(h, 80), "{h}");
                assert!(!with.admits(h, 22), "{h}");
            }
        }
        assert!(with.admits("pypi.org", 443) && with.admits("registry.npmjs.org", 443));
    }

    #[test]
    fn mcp_servers_are_added_only_with_the_flag() {
        let config = |flag| NetworkingConfig::Limited {
            allowed_hosts: vec![],
            allow_mcp_servers: flag,
            allow_package_managers: false,
        };
        let on = NetworkPolicy::compile(&config(true), &["mcp.example.com"]).unwrap();
        let off = NetworkPolicy::compile(&config(false), &["mcp.example.com"]).unwrap();
        assert!(on.admits("mcp.example.com", 443));
        assert!(!off.admits("mcp.example.com", 443));
        assert!(NetworkPolicy::compile(&config(true), &["http://x"]).is_err());
    }

    #[test]
    fn none_admits_nothing_and_unrestricted_every_name() {
        assert!(!NetworkPolicy::None.admits("example.com", 443));
        assert!(!NetworkPolicy::None.answers("example.com"));
        assert!(NetworkPolicy::Unrestricted.admits("example.com", 12345));
        assert!(NetworkPolicy::Unrestricted.answers("example.com"));
        assert!(!NetworkPolicy::Unrestricted.answers("bad name"));
        assert_eq!(NetworkPolicy::Unrestricted.name(), "unrestricted");
    }

    #[test]
    fn host_local_and_metadata_addresses_are_never_reachable() {
        for a in [
            "127.0.0.1",
            "127.8.9.10",
            "169.254.169.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "febf::1",
            "ff02::1",
            "fd00:ec2::254",
            "fd00:ec2::253",
            "fd00:ec2::123",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::127.0.0.1",
            "64:ff9b::0.0.0.0",
        ] {
            assert!(address_is_never_reachable(a.parse().unwrap()), "{a}");
        }
        for a in [
            "93.184.216.34",
            "198.18.0.1",
            "2001:db8::1",
            "::ffff:8.8.8.8",
            "fd00::1",
            "fd00:ec3::254",
            "100.100.100.201",
            "168.63.129.17",
            "192.0.0.193",
            "64:ff9b::8.8.8.8",
            "64:ff9b:1:808:8:800::",
            "64:ff9b:2::a9fe:a9fe",
        ] {
            assert!(!address_is_never_reachable(a.parse().unwrap()), "{a}");
        }
    }

    /// Every cloud metadata address, in every form that reaches it: itself, IPv4-mapped,
    /// IPv4-compatible, NAT64 well-known, NAT64 local-use at each RFC 6052 prefix length.
    #[test]
    fn every_metadata_address_is_never_reachable_in_every_form() {
        let metadata: [Ipv4Addr; 7] = [
            Ipv4Addr::new(169, 254, 169, 254), // AWS, GCP, Azure IMDS, OpenStack, Oracle, ...
            Ipv4Addr::new(169, 254, 170, 2),   // AWS ECS task metadata
            Ipv4Addr::new(169, 254, 0, 23),    // Tencent Cloud
            Ipv4Addr::new(100, 100, 100, 200), // Alibaba Cloud
            Ipv4Addr::new(168, 63, 129, 16),   // Azure wireserver
            Ipv4Addr::new(192, 0, 0, 192),     // Oracle Cloud (legacy)
            Ipv4Addr::new(169, 254, 169, 123), // AWS time sync
        ];
        for v4 in metadata {
            let [a, b, c, d] = v4.octets();
            let forms: [IpAddr; 8] = [
                IpAddr::V4(v4),
                IpAddr::V6(v4.to_ipv6_mapped()),
                IpAddr::V6(v4.to_ipv6_compatible()),
                IpAddr::V6(Ipv6Addr::from([
                    0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, a, b, c, d,
                ])),
                IpAddr::V6(Ipv6Addr::from([
                    0, 0x64, 0xff, 0x9b, 0, 1, a, b, 0, c, d, 0, 0, 0, 0, 0,
                ])),
                IpAddr::V6(Ipv6Addr::from([
                    0, 0x64, 0xff, 0x9b, 0, 1, 0, a, 0, b, c, d, 0, 0, 0, 0,
                ])),
                IpAddr::V6(Ipv6Addr::from([
                    0, 0x64, 0xff, 0x9b, 0, 1, 0, 0, 0, a, b, c, d, 0, 0, 0,
                ])),
                IpAddr::V6(Ipv6Addr::from([
                    0, 0x64, 0xff, 0x9b, 0, 1, 0, 0, 0, 0, 0, 0, a, b, c, d,
                ])),
            ];
            for form in forms {
                assert!(address_is_never_reachable(form), "{v4} as {form}");
            }
        }
    }
}
