//! The OpenMA sandbox execution backend contract, in Rust.
//!
//! This crate is the vocabulary every other omabox crate speaks: the identity of a work item
//! (scope, fence, publication), the capability enums, the runtime profile and plan, and every
//! port a compute backend or a control plane implements (`ManagedSandboxPort`,
//! `WorkspacePersistencePort`, `SessionOutputPort`, `RuntimeCheckpointPort`,
//! `CredentialEgressPort`, the harness driver and supervisor protocol, session inputs, orphans
//! and provider drivers).
//!
//! Rules this crate keeps:
//! - **No I/O.** Types, pure validation and trait definitions only.
//! - **Wire compatible.** Every type that crosses a process boundary serializes to the same JSON
//!   as the TypeScript original: camelCase fields, `"type"`-tagged unions, the exact enum
//!   literals, and "absent" kept apart from `null` where the original distinguishes them
//!   (see [`json::Nullable`]).
//! - **Ports are dyn-compatible async traits** returning [`PortError`]; cancellation is an
//!   [`AbortSignal`] (a `CancellationToken` that also carries the abort reason, like a JS
//!   `AbortSignal`).
//! - **Secrets never print.** The fence token is a [`SecretString`] whose `Debug` and
//!   `Display` are redacted; it is serialized only where the fence itself crosses a wire.

#![forbid(unsafe_code)]

pub mod capabilities;
pub mod catalog;
pub mod checkpoint;
pub mod credentials;
pub mod egress;
pub mod error;
pub mod fence;
pub mod harness;
pub mod hosted_inference;
pub mod installation;
pub mod journal;
pub mod json;
pub mod networking;
pub mod orphan;
pub mod outputs;
pub mod profile;
pub mod provider;
pub mod run_queue;
pub mod sandbox;
pub mod scheduler;
pub mod scope;
pub mod secret;
pub mod session_inputs;
pub mod signal;
pub mod signals;
pub mod url_path;
pub mod workspace;

pub use capabilities::*;
pub use checkpoint::*;
pub use credentials::*;
pub use egress::*;
pub use error::{ErrorKind, PortError};
pub use fence::*;
pub use harness::*;
pub use installation::*;
pub use journal::*;
pub use json::{Meta, MetaValue, Nullable};
pub use orphan::*;
pub use outputs::*;
pub use profile::*;
pub use provider::*;
pub use run_queue::*;
pub use sandbox::*;
pub use scheduler::RuntimeSchedulerPort;
pub use scope::RuntimeResourceScope;
pub use secret::SecretString;
pub use session_inputs::*;
pub use signal::{AbortController, AbortSignal};
pub use workspace::*;

/// Mount path of the workspace inside every sandbox.
pub const WORKSPACE_MOUNT_PATH: &str = "/workspace";
/// Mount path of the Session outputs directory inside every sandbox.
pub const OUTPUTS_MOUNT_PATH: &str = "/mnt/session/outputs";
