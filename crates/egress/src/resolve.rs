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
