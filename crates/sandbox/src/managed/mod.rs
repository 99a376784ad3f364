//! The managed composition: a provider of tool sandboxes adapted into the contract's managed
//! ports (omabox's equivalent of OpenMA's `createProviderManagedRuntime`, reference §1.15).
//!
//! ```text
//!   backend ──► ManagedSandboxProvider ──► ProviderManagedRuntime   (ManagedSandboxPort)
//!                                     ├──► DirectAmaWorkerDriver    (ama_worker)
//!                                     ├──► SandboxSupervisorTransport (openma_supervised,
//!                                     │       projected by the host's registry)
//!   persistence ports (hostPath bindings) ─┘
//!               └──────────── ProviderManagedRuntimeDriver (ManagedRuntimeProviderDriverPort)
//! ```
//!
//! What this module guarantees:
//! - **No lease before readiness.** `acquire` publishes a lease only after the readiness probe
//!   printed `__OPENMA_RUNTIME_READY__` for the plan's harness executable; any failure after
//!   the provider created the runtime destroys it (best effort) and returns the original error.
//! - **The fence token never reaches a provider**: the acquisition context has the
//!   generation only, and leases carry `{provider, runtimeId, metadata}` with the provider's
//!   non-secret identity data.
//! - **Honest capabilities**: suspend/resume is neither implemented nor advertised; `process`
//!   runtime checkpoints only for a provider that captures processes (`checkpoint.rs`);
//!   credential egress only when the backend composes its port; lanes only for
//!   duplex-capable providers.
//!
//! What it must never do: keep a runtime alive after a failed acquire, reap another
//! provider's lease ("Incompatible sandbox lease provider: <p>"), or invent a runtime state
//! it did not observe (errors read as `lost`/`unknown`).

mod checkpoint;
mod driver;
mod harness;
mod provider;
mod runtime;

pub use driver::{
    DRIVER_VERSION, ProviderManagedRuntimeDriver, ProviderManagedRuntimeDriverOptions,
};
pub use harness::{
    DirectAmaWorkerDriver, HarnessEnvSource, HarnessOutputSink, HarnessStream,
    SandboxSupervisorTransport, drain, harness_process_spec,
};
pub use provider::{
    AcquisitionContext, HOST_PATH_METADATA_KEY, LiveRuntimes, ManagedSandboxProvider,
    ManagedSandboxProviderCapabilities, ProvidedSandbox,
};
pub use runtime::{ProviderManagedRuntime, ProviderManagedRuntimeOptions, STARTED_AT_METADATA_KEY};
