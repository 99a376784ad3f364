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

/// The host's own resolver (`getaddrinfo` through [`tokio::net::lookup_host`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

#[async_trait::async_trait]
impl Resolver for SystemResolver {
    async fn resolve(&self, name: &str) -> io::Result<Vec<IpAddr>> {
        let mut addresses: Vec<IpAddr> = Vec::new();
        for a in tokio::net::lookup_host((name, 0)).await? {
            if !addresses.contains(&a.ip()) {
                addresses.push(a.ip());
            }
        }
        Ok(addresses)
    }
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
