//! Synthetic answers, for a sandbox whose network namespace has no route out (the linux
//! backend's design: `omabox_linux_sandbox::netns`). There the only way out is a listener
//! the host bound inside the namespace, on loopback; so the DNS stub answers an admitted
//! name with a loopback address of the sandbox's own from [`SYNTHETIC_V4`]
//! (`127.64.0.0/10`), one per name, stable while the pool lives. The relay's listeners
//! accept connections to every such address; the one dialed maps back to its name (through
//! [`crate::ResolvedNames`], recorded by the stub), and the relay connects to the *host's*
//! resolution of that name — never to the synthetic address, which leads nowhere.
//!
//! Contract: a name gets the same address every time; different names never share one;
//! the pool holds at most `capacity` names and, when full, hands out nothing more (the
//! stub then answers no address: fail closed, never reuse an address a client may still
//! hold for another name).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use crate::addresses::AddressRange;

/// The synthetic range: `127.64.0.0/10` (4,194,304 addresses, all loopback).
pub const SYNTHETIC_V4: (Ipv4Addr, u8) = (Ipv4Addr::new(127, 64, 0, 0), 10);

/// One sandbox's name ↔ synthetic address pool.
#[derive(Debug)]
pub struct SyntheticAddresses {
    capacity: usize,
    by_name: Mutex<HashMap<String, Ipv4Addr>>,
}

impl SyntheticAddresses {
    /// A pool of at most `capacity` names (never more than the range holds).
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.min((1 << (32 - SYNTHETIC_V4.1)) - 2),
            by_name: Mutex::default(),
        }
    }

    /// The address of `name` (a normalized DNS name), allocated on first use; `None` when
    /// the pool is full.
    pub fn address_for(&self, name: &str) -> Option<Ipv4Addr> {
        let mut by_name = self.by_name.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(address) = by_name.get(name) {
            return Some(*address);
        }
        if by_name.len() >= self.capacity {
            return None;
        }
        // Sequential from .0.1: the n-th name gets base + n + 1 (capacity keeps it inside
        // the range, below its last address).
        let offset = u32::try_from(by_name.len()).ok()? + 1;
        let address = Ipv4Addr::from(u32::from(SYNTHETIC_V4.0) + offset);
        by_name.insert(name.to_owned(), address);
        Some(address)
    }

    /// Whether `address` is in the synthetic range (handed out or not).
    pub fn contains(address: IpAddr) -> bool {
        AddressRange::new(IpAddr::V4(SYNTHETIC_V4.0), SYNTHETIC_V4.1)
            .is_some_and(|range| range.contains(address))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_get_stable_distinct_addresses_until_the_pool_is_full() {
        let pool = SyntheticAddresses::new(2);
        let a = pool.address_for("a.test").unwrap();
        let b = pool.address_for("b.test").unwrap();
        assert_ne!(a, b);
        assert_eq!(pool.address_for("a.test"), Some(a));
        assert_eq!(a, Ipv4Addr::new(127, 64, 0, 1));
        assert_eq!(pool.address_for("c.test"), None, "full: fail closed");
        assert_eq!(pool.address_for("b.test"), Some(b));
        for ip in [a, b, Ipv4Addr::new(127, 127, 255, 255)] {
            assert!(SyntheticAddresses::contains(IpAddr::V4(ip)));
        }
        for ip in ["127.0.0.1", "127.128.0.1", "10.64.0.1", "::1"] {
            assert!(!SyntheticAddresses::contains(ip.parse().unwrap()), "{ip}");
        }
        assert!(SyntheticAddresses::contains(
            "::ffff:127.64.0.9".parse().unwrap()
        ));
    }
}
