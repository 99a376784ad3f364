//! omabox's enforced egress path, userland part: what a sandbox's connections and DNS
//! questions are checked against on the host side.
//!
//! - [`mod@sniff`]: the name a client asks for, from its first bytes (TLS SNI, HTTP `Host`).
//! - [`relay`]: the TCP relay a sandbox's redirected connections arrive at; it admits a
//!   connection by the *name* it asks for ([`omabox_contract::networking::NetworkPolicy`]),
//!   connects to an address the host resolved for that name, and replays the sniffed bytes.
//! - [`dns`]: the sandbox's DNS stub; it answers only names the policy answers, and never
//!   forwards a question; [`names`] keeps its recent answers so the relay can admit a
//!   connection that names nothing by the name its address was resolved for.
//! - [`synthetic`]: for a namespace with no route out, the stub answers admitted names with
//!   loopback addresses of the sandbox's own, which the relay maps back to the name.
//! - [`addresses`]: addresses no name opens (the contract's never-reachable set plus the
//!   backend's deny list); [`resolve`]: the host's resolver, as a port.
//!
//! This crate decides; it does not plumb. Binding the relay's listeners and the stub's socket
//! inside each sandbox's network namespace (which has no route out: the linux backend's
//! `netns`), and credential injection (`CredentialEgressPort`), belong to the linux backend
//! and later increments. [`original_dst`] serves a redirect-based backend, should one come.
//! It never logs payload bytes, and never sends a refused name to any resolver.

#![forbid(unsafe_code)]

pub mod addresses;
pub mod authority;
pub mod buffers;
pub mod dns;
pub mod intercept;
pub mod names;
pub mod original_dst;
pub mod relay;
pub mod resolve;
mod rewind;
pub mod sniff;
#[cfg(target_os = "linux")]
mod splice;
pub mod synthetic;

pub use addresses::{AddressRange, AddressRules};
pub use buffers::SocketBuffers;
pub use dns::DnsStub;
pub use names::ResolvedNames;
pub use original_dst::{FixedDestination, LocalAddress, OriginalDestination, SoOriginalDst};
pub use relay::{Gateway, Refusal, Relay, RelayConfig, Verdict};
pub use resolve::{FixedNames, Resolver, SystemResolver};
pub use sniff::{NoName, Protocol, RequestedName, SniffLimits, Sniffed, sniff};
pub use synthetic::SyntheticAddresses;
