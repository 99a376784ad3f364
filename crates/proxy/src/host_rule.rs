//! The Host rule against DNS rebinding: a request is served only when its `Host` (and its
//! `Origin`, when a browser sent one) names the configured public origin or a loopback name.
//! A web page that rebinds its own name to this machine still sends its own name as `Host`,
//! so it is refused before any route runs. Pure.
//!
//! Loopback names: `localhost`, `*.localhost`, `127.0.0.0/8`, `[::1]` (any port). The public
//! origin (`public_url`) matches by host and port (a `Host` without a port matches only a
//! public URL without an explicit port).
//!
//! Must never: accept a missing `Host`, user info in it, or `Origin: null`.

use axum::http::uri::Authority;
use std::net::IpAddr;

/// The allowed names (module doc).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRule {
    /// The public origin's lowercase host and explicit port.
    public: Option<(String, Option<u16>, Option<u16>)>,
}

impl HostRule {
    /// The rule for a public URL (`None`: loopback names only). `None` when `public_url` is
    /// not an absolute http(s) URL with a host.
    pub fn new(public_url: Option<&str>) -> Option<Self> {
        let Some(public_url) = public_url else {
            return Some(Self::default());
        };
        let url = url::Url::parse(public_url).ok()?;
        if !matches!(url.scheme(), "http" | "https") {
            return None;
        }
        let host = url.host_str()?.to_ascii_lowercase();
        Some(Self {
            public: Some((host, url.port(), url.port_or_known_default())),
        })
    }

    /// Whether a `Host` header value is allowed.
    pub fn allows_host(&self, host: &str) -> bool {
        let Ok(authority) = host.parse::<Authority>() else {
            return false;
        };
        if authority.as_str().contains('@') {
            return false;
        }
        let name = authority.host().to_ascii_lowercase();
        if is_loopback_name(&name) {
            return true;
        }
        match &self.public {
            Some((public, explicit, _)) => *public == name && *explicit == authority.port_u16(),
            None => false,
        }
    }

    /// Whether an `Origin` header value is allowed.
    pub fn allows_origin(&self, origin: &str) -> bool {
        let Ok(url) = url::Url::parse(origin) else {
            return false;
        };
        let Some(name) = url.host_str().map(str::to_ascii_lowercase) else {
            return false;
        };
        if is_loopback_name(&name) {
            return true;
        }
        match &self.public {
            Some((public, _, port)) => *public == name && *port == url.port_or_known_default(),
            None => false,
        }
    }
}

fn is_loopback_name(name: &str) -> bool {
    let bare = name
        .strip_prefix('[')
        .and_then(|rest| rest.strip_suffix(']'))
        .unwrap_or(name);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return ip.is_loopback();
    }
    name == "localhost" || name.ends_with(".localhost")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_only_by_default() {
        let rule = HostRule::new(None).unwrap();
        for host in [
            "127.0.0.1:8787",
            "localhost",
            "LOCALHOST:1",
            "a.localhost",
            "[::1]:9",
            "127.9.9.9",
        ] {
            assert!(rule.allows_host(host), "{host}");
        }
        for host in [
            "evil.test",
            "evil.test:8787",
            "localhost.evil.test",
            "10.0.2.2:8787",
            "0.0.0.0:8787",
            "user@localhost",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!rule.allows_host(host), "{host}");
        }
        assert!(rule.allows_origin("http://localhost:3000"));
        assert!(!rule.allows_origin("null"));
        assert!(!rule.allows_origin("https://evil.test"));
    }

    #[test]
    fn the_public_origin_by_host_and_port() {
        let rule = HostRule::new(Some("http://10.0.2.2:8787/x")).unwrap();
        assert!(rule.allows_host("10.0.2.2:8787"));
        assert!(!rule.allows_host("10.0.2.2"));
        assert!(!rule.allows_host("10.0.2.2:8788"));
        assert!(rule.allows_origin("http://10.0.2.2:8787"));
        assert!(!rule.allows_origin("http://10.0.2.2:80"));
        let rule = HostRule::new(Some("https://Omabox.Example")).unwrap();
        assert!(rule.allows_host("omabox.example"));
        assert!(!rule.allows_host("omabox.example:8443"));
        assert!(rule.allows_origin("https://omabox.example"));
        assert!(!rule.allows_origin("http://omabox.example"));
        assert!(HostRule::new(Some("not a url")).is_none());
    }
}
