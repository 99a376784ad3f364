//! `omabox-sandbox-net`: the enforced network of a sandbox whose network namespace has
//! loopback only and no route out, served from the host.
//!
//! - [`netns`]: host-owned sockets made inside such a namespace, through a pidfd of a
//!   process in it ([`netns::pidfd_of`] opens one that cannot be a recycled pid);
//! - [`sk_lookup`]: the BPF program handing every port of the synthetic addresses to one
//!   listener;
//! - [`network`]: [`SandboxNetwork`], the DNS stub, the admitting relay's listeners and the
//!   gateway bound there and served by the host's tokio runtime, with live policy changes
//!   and credential interception (the policy and the relay are `omabox-egress`'s);
//! - [`credential_egress`]: the `CredentialEgressPort` over such sandboxes (vault secrets
//!   injected by the relay into HTTPS requests to bound hosts).
//!
//! The linux backend starts it on its sandbox's init; the docker backend on a local
//! container's PID 1 under network mode `none`.
//!
//! It must never decide what a sandbox may reach (the policy says it), run anything inside
//! the sandbox, or leave a socket in a namespace once its [`SandboxNetwork`] is dropped. It
//! depends on `omabox-contract` and `omabox-egress` only, so no backend reaches another
//! through it.

pub mod credential_egress;
pub mod netns;
pub mod network;
pub mod sk_lookup;

pub use network::{GatewayAccess, NetworkError, NetworkSetup, SandboxNetwork};
