//! omabox's default backend, the adapter over `omabox-linux-sandbox`: it makes that
//! crate's sandboxes (a [`SandboxPlan`] made into Linux namespaces, cgroups, seccomp and
//! Landlock, with the omabox agent as PID 1) omabox's ports.
//!
//! - [`factory`]: the typed [`factory::LinuxSandboxConfig`] (parsed from an env map only at
//!   the `SANDBOX_PROVIDER=linux` seam), its preparation steps — the [`image`] resolved,
//!   pulled and held (re-exported from `omabox-image`), the [`env_layer`] built over it —
//!   and the `SandboxFactory` that makes a sandbox of a prepared config;
//! - [`port`]: the `SandboxPort` and its optional capabilities over a running sandbox's
//!   agent client, with the sandbox's [`network`] (the DNS stub and `omabox-egress`
//!   relays the host binds in the sandbox's namespace);
//! - [`managed`]: the managed-runtime provider and driver, whose lease carries the
//!   sandbox's identity; [`credential_egress`] its `CredentialEgressPort`; [`catalog`] its
//!   conformance row.
//!
//! The mechanism's modules and types are re-exported under their old paths
//! (`omabox_backend_linux::oneshot`, `::leftovers`, [`LinuxRuntime`], …), so callers
//! name one crate.
//!
//! It must never reach the host, the store, the CLI or another backend; what a sandbox
//! is and may do is the mechanism's plan, which this crate only fills in.
//!
//! See `SECURITY.md` at the repository root for the escape tests and what is not
//! defended yet.

pub mod catalog;
pub mod credential_egress;
pub mod env_layer;
pub mod factory;
pub use omabox_image as image;
pub mod managed;
pub mod network;
pub mod port;

pub use omabox_linux_sandbox::{
    cgroup, handoff, idmap, image_use, leftovers, oneshot, plan, probe, runtime_dir,
};
pub use omabox_sandbox_net::netns;

pub use image::{CachedImage, ImageCache, ImageError, ImageKind, ResolvedImage};
pub use network::{NetworkError, SandboxNetwork};
pub use omabox_linux_sandbox::{
    BindMount, CgroupLayout, CgroupPaths, CpuLimit, DestroyError, DestroyOutcome, Hardening,
    INIT_BINARY, Limits, LinuxCapabilities, LinuxRuntime, LinuxSandbox, MissingRequirement,
    Networking, PlanError, ProbeError, RootfsSource, RuntimeConfig, SandboxIdentity, SandboxPlan,
    SetupReport, StartError,
};
