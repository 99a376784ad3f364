//! The DNS stub's recent answers, so the relay can admit a connection that names nothing
//! (no SNI, no `Host`: SSH, a TLS client dialing without SNI, any other TCP protocol) by the
//! name the stub resolved its destination address for.
//!
//! Contract: an address maps to a name only while the stub's answer is fresh
//! ([`ResolvedNames::ttl`], longer than the answer's own TTL so a client that cached the
//! answer still connects); the table holds at most `capacity` (address, name) pairs and,
//! when full of fresh entries, records nothing more (a name-less connection is then
//! refused: fail closed, never evict a fresh entry an attacker could churn). The relay
//! still checks the policy (with the port) and the address rules on every connection.
//!
//! What it admits is weaker than a sniffed name: an address shared by several names (a CDN)
//! is reachable without a name once any allowed name resolved to it.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Names the stub answered per address, each until its expiry.
#[derive(Debug)]
pub struct ResolvedNames {
    ttl: Duration,
    capacity: usize,
    entries: Mutex<HashMap<IpAddr, Vec<(String, Instant)>>>,
}

/// Names kept per address at most.
const NAMES_PER_ADDRESS: usize = 8;

impl ResolvedNames {
    /// A table whose entries last `ttl`, holding at most `capacity` (address, name) pairs.
    pub fn new(ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity,
            entries: Mutex::default(),
        }
    }

    /// How long an answer admits name-less connections to its addresses.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Records that the stub answered `name` with `addresses`; `false` when the table was
    /// full and something was not recorded.
    pub fn record(&self, name: &str, addresses: &[IpAddr]) -> bool {
        let now = Instant::now();
        let expires = now + self.ttl;
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let mut size: usize = entries.values().map(Vec::len).sum();
        if size + addresses.len() > self.capacity {
            entries.retain(|_, names| {
                names.retain(|(_, until)| *until > now);
                !names.is_empty()
            });
            size = entries.values().map(Vec::len).sum();
        }
        let mut all_recorded = true;
        for address in addresses {
            let names = entries.entry(address.to_canonical()).or_default();
            if let Some(entry) = names.iter_mut().find(|(n, _)| n == name) {
                entry.1 = expires;
            } else if size < self.capacity && names.len() < NAMES_PER_ADDRESS {
                names.push((name.to_owned(), expires));
                size += 1;
            } else {
                all_recorded = false;
            }
        }
        entries.retain(|_, names| !names.is_empty());
        all_recorded
    }

    /// The names `address` was recently given for.
    pub fn names_for(&self, address: IpAddr) -> Vec<String> {
        let now = Instant::now();
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        entries
            .get(&address.to_canonical())
            .map(|names| {
                names
                    .iter()
                    .filter(|(_, until)| *until > now)
                    .map(|(n, _)| n.clone())
                    .collect()
            })
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn entries_expire_and_the_table_fails_closed_when_full() {
        let table = ResolvedNames::new(Duration::from_secs(60), 3);
        assert!(table.record("a.test", &[ip("192.0.2.1"), ip("192.0.2.2")]));
        assert!(table.record("b.test", &[ip("192.0.2.1")]));
        assert_eq!(table.names_for(ip("192.0.2.1")), ["a.test", "b.test"]);
        assert_eq!(table.names_for(ip("::ffff:192.0.2.2")), ["a.test"]);
        // Full of fresh entries: nothing more is recorded, nothing fresh evicted.
        assert!(!table.record("c.test", &[ip("192.0.2.3")]));
        assert!(table.names_for(ip("192.0.2.3")).is_empty());
        // Refreshing a recorded pair needs no room.
        assert!(table.record("a.test", &[ip("192.0.2.1")]));
        tokio::time::advance(Duration::from_secs(61)).await;
        assert!(table.names_for(ip("192.0.2.1")).is_empty());
        assert!(
            table.record("c.test", &[ip("192.0.2.3")]),
            "expired entries make room"
        );
        assert_eq!(table.names_for(ip("192.0.2.3")), ["c.test"]);
    }
}
