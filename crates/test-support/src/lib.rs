//! Test support every omabox crate can use without a dependency cycle: it depends on the
//! contract only, and is only ever a dev-dependency (and the testkit's, which re-exports it).
//!
//! - [`capability`]: the one capability gate — skip loudly where this machine lacks something
//!   a test needs, fail under `CI=true`.
//! - [`drivers`]: contract-only fakes for provider admission and the harness driver lanes
//!   (the host's own unit tests use them; the full-transaction fakes and the conformance
//!   suite stay in `omabox-testkit`, which depends on the host).
//! - [`registry`]: a real OCI registry (`docker-registry`) on loopback and a minimal push
//!   client, for the image pull tests.
//! - [`dockerd`]: a Docker Engine of the test's own (data root, socket, containerd
//!   namespace in a temporary directory), for the docker backend's tests.
//! - [`hostile_http`]: a scripted HTTP server on loopback (a malicious registry, a
//!   host-only service that must never be contacted) and a tiny OCI image it serves.
//! - [`postgres`]: a real PostgreSQL server (the installed binaries) in a temp dir on a
//!   loopback port, for the store's PostgreSQL tests.
//! - [`sdk`]: official client SDKs (a Python venv, an npm prefix) installed from the
//!   registries once per target directory.

#![forbid(unsafe_code)]

pub mod capability;
pub mod dockerd;
pub mod drivers;
pub mod hostile_http;
pub mod postgres;
pub mod registry;
pub mod registry_token;
pub mod sdk;

pub use capability::{SKIP_LOG_ENV, in_ci, require_capability};
