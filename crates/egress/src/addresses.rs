//! Which resolved addresses the host side may connect to (relay) or hand out (DNS stub).
//!
//! A name the policy admits still never opens an address that [`AddressRules`] refuses:
//! the contract's never-reachable set (loopback, link-local, every cloud metadata address,
//! unspecified, multicast, broadcast, and their IPv4-mapped, -compatible and NAT64 forms:
//! `omabox_contract::networking::address_is_never_reachable`) plus the ranges the enforcing backend
//! adds — the host's own addresses and other sandboxes'. The check is applied to the
//! addresses the *host* resolved, after resolution, so a name that rebinds to a refused
//! address is refused whatever the sandbox was told before.

use std::fmt;
use std::net::IpAddr;

use omabox_contract::networking::address_is_never_reachable;

/// An address range: `network/prefix` (a single address is `/32` or `/128`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    network: IpAddr,
    prefix: u8,
}

impl AddressRange {
    /// `None` when `prefix` is longer than the address.
    pub fn new(network: IpAddr, prefix: u8) -> Option<Self> {
        let bits = if network.is_ipv4() { 32 } else { 128 };
        (prefix <= bits).then_some(Self { network, prefix })
    }

    /// The range holding exactly `address`.
    pub fn single(address: IpAddr) -> Self {
        let prefix = if address.is_ipv4() { 32 } else { 128 };
        Self {
            network: address,
            prefix,
        }
    }

    /// Does the range hold `address`? An IPv4-mapped IPv6 address is compared as IPv4.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        match (self.network, address) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(
                u128::from(n.to_bits()),
                u128::from(a.to_bits()),
                32,
                self.prefix,
            ),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(n.to_bits(), a.to_bits(), 128, self.prefix),
            _ => false,
        }
    }
}

fn prefix_eq(network: u128, address: u128, bits: u32, prefix: u8) -> bool {
    let host_bits = bits - u32::from(prefix);
    host_bits >= bits || (network >> host_bits) == (address >> host_bits)
}

impl fmt::Display for AddressRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The address half of admission. [`Default`] is production's: the contract's
/// never-reachable rule and an empty deny list (the backend adds its ranges with
/// [`AddressRules::deny`]).
#[derive(Clone)]
pub struct AddressRules {
    never_reachable: fn(IpAddr) -> bool,
    denied: Vec<AddressRange>,
}

impl Default for AddressRules {
    fn default() -> Self {
        Self {
            never_reachable: address_is_never_reachable,
            denied: Vec::new(),
        }
    }
}

impl fmt::Debug for AddressRules {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AddressRules")
            .field("denied", &self.denied)
            .finish_non_exhaustive()
    }
}

impl AddressRules {
    /// Replaces the never-reachable rule. Production never calls this: it exists so tests
    /// can stand upstream servers on loopback.
    pub fn with_never_reachable(mut self, rule: fn(IpAddr) -> bool) -> Self {
        self.never_reachable = rule;
        self
    }

    /// Adds ranges nothing may reach (the host's own addresses, other sandboxes).
    pub fn deny(mut self, ranges: impl IntoIterator<Item = AddressRange>) -> Self {
        self.denied.extend(ranges);
        self
    }

    /// May the host side connect to (or hand out) `address`?
    pub fn permits(&self, address: IpAddr) -> bool {
        !(self.never_reachable)(address) && !self.denied.iter().any(|r| r.contains(address))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_hold_their_prefix_and_compare_mapped_addresses_as_ipv4() {
        let r = AddressRange::new(ip("10.200.0.0"), 16).unwrap();
        assert!(r.contains(ip("10.200.3.4")));
        assert!(r.contains(ip("::ffff:10.200.3.4")));
        assert!(!r.contains(ip("10.201.0.1")));
        assert!(!r.contains(ip("fd00::1")));
        let all = AddressRange::new(ip("0.0.0.0"), 0).unwrap();
        assert!(all.contains(ip("1.2.3.4")));
        let v6 = AddressRange::new(ip("fd00:1::"), 64).unwrap();
        assert!(v6.contains(ip("fd00:1::9")));
        assert!(!v6.contains(ip("fd00:2::9")));
        assert!(AddressRange::single(ip("192.0.2.1")).contains(ip("192.0.2.1")));
        assert!(!AddressRange::single(ip("192.0.2.1")).contains(ip("192.0.2.2")));
        assert!(AddressRange::new(ip("1.2.3.4"), 33).is_none());
        assert_eq!(r.to_string(), "10.200.0.0/16");
    }

    #[test]
    fn the_default_refuses_loopback_and_metadata_and_the_deny_list() {
        let rules = AddressRules::default();
        for refused in [
            "127.0.0.1",
            "::1",
            "169.254.169.254",
            "::ffff:127.0.0.1",
            "0.0.0.0",
        ] {
            assert!(!rules.permits(ip(refused)), "{refused}");
        }
        assert!(rules.permits(ip("192.0.2.7")));
        let rules = rules.deny([AddressRange::single(ip("192.0.2.7"))]);
        assert!(!rules.permits(ip("192.0.2.7")));
        assert!(!rules.permits(ip("::ffff:192.0.2.7")));
        assert!(rules.permits(ip("192.0.2.8")));
    }
}
