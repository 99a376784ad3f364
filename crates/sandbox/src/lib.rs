//! The tool-sandbox seam of omabox (OpenMA's `@open-managed-agents/sandbox`).
//!
//! What lives here:
//! - [`SandboxPort`], the small required surface (exec, read file, write file), and its
//!   optional capabilities as separate traits reached through `as_*` accessors, with the
//!   `supports_*` probes ([`probe`]);
//! - the runtime lifecycle ([`SandboxRuntimePort`]) and the provider trio
//!   ([`SandboxProviderPort`]);
//! - [`SandboxFactory`], its context and read-only env, and the closed `SANDBOX_PROVIDER`
//!   map ([`resolve_sandbox_provider`] over a [`SandboxFactoryRegistry`] the binary fills);
//! - [`DefaultSandboxOrchestrator`], which provisions a sandbox by probing capabilities;
//! - [`run_with_sandbox_lease`] and the execution guard ([`SandboxExecutionGuard`]);
//! - the readiness probe ([`verify_runtime_environment`]);
//! - the JSON-Lines supervisor channel over any process's stdio ([`supervisor_channel`]);
//! - the managed composition ([`managed`]): a provider of tool sandboxes adapted into the
//!   contract's managed ports, with an honest provider driver.
//!
//! # Test mode
//!
//! OpenMA loads its unisolated local-subprocess adapter only when
//! `OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess` *and* `NODE_ENV=test`. omabox keeps both
//! names and adds its own flag: test mode is on when `OMABOX_TEST_MODE=1` or `NODE_ENV=test`
//! ([`is_test_mode`]). Nothing else enables it, and `OPENMA_TEST_SANDBOX_PROVIDER` outside test
//! mode is an error rather than being ignored.
//!
//! # What this crate must never do
//!
//! - Name a concrete backend: factories are registered by the binary, and the orchestrator
//!   never branches on a provider name.
//! - Treat a missing capability as success, or offer a capability stub that pretends to work.
//! - Put anything secret into a handle, log line or error: env values are never printed.

#![forbid(unsafe_code)]

pub mod dockerfile;
mod factory;
pub mod fault;
mod guard;
pub mod host_id;
mod lease;
pub mod locate;
pub mod managed;
mod orchestrator;
pub mod packages;
mod port;
pub mod probe;
mod process;
mod provider_map;
mod readiness;
mod runtime;
pub mod session_inputs;
pub mod supervisor_channel;

pub use factory::{
    NODE_ENV, SandboxFactory, SandboxFactoryContext, SandboxFactoryEnv, TEST_MODE_ENV, is_test_mode,
};
pub use guard::{
    SandboxExecutionFencedError, SandboxExecutionGuard, SandboxExecutionGuardOptions,
    with_sandbox_execution_guard,
};
pub use lease::{
    SandboxLeaseError, SandboxLeaseLostError, SandboxLeaseOptions, run_with_sandbox_lease,
};
pub use orchestrator::{
    BackupOwner, DefaultSandboxOrchestrator, ProvisionBackup, ProvisionInput, ProvisionReport,
    SandboxCapabilities, WorkspaceBackupService,
};
pub use port::*;
pub use probe::{
    supports_duplex_process, supports_managed_workspace_lifecycle, supports_sandbox_runtime,
    supports_session_output_mount, supports_workspace_backup,
};
pub use process::*;
pub use provider_map::{
    LOCAL_SUBPROCESS, SANDBOX_PROVIDER_ENV, SandboxFactoryRegistry, SandboxProviderError,
    SandboxProviderName, TEST_SANDBOX_PROVIDER_ENV, resolve_sandbox_provider,
};
pub use readiness::{
    DEFAULT_READINESS_TIMEOUT, RUNTIME_READY_MARKER, readiness_probe_command, shell_quote,
    verify_runtime_environment,
};
pub use runtime::*;
