//! Runtime lifecycle (`SandboxRuntimePort`) and the provider trio (`SandboxProviderPort`).
//!
//! Both shapes are inferred by the reference (§1.14) from adapters and test fakes; the wire
//! types keep the TypeScript field names so a handle written here is readable there.
//!
//! ```text
//!   create ──► running ──renew_lease*──► suspend(kind) ──► runtime-scoped handle
//!                 │                                 └──► resume(handle)  (same runtime only)
//!                 └── checkpoint(kind) ──► portable handle ──► provider.restore(handle)
//! ```

use crate::factory::{SandboxFactoryContext, SandboxFactoryEnv};
use crate::port::SandboxPort;
use async_trait::async_trait;
use omabox_contract::{Meta, PortError};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// `{provider, runtimeId}`: which provider runtime a sandbox is. JSON-safe.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxRuntimeHandle {
    /// Provider name.
    pub provider: String,
    /// The provider's runtime id.
    pub runtime_id: String,
}

/// `"running" | "suspended" | "stopped" | "unknown"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxRuntimeStatus {
    /// Running.
    Running,
    /// Suspended.
    Suspended,
    /// Stopped or gone.
    Stopped,
    /// Not known without a probe (which might wake a sleeping runtime).
    Unknown,
}

/// `"filesystem" | "memory"`: what a checkpoint captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxCheckpointKind {
    /// Files only.
    Filesystem,
    /// Files and process memory.
    Memory,
}

/// `"runtime" | "portable"`: where a checkpoint can be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SandboxCheckpointScope {
    /// Resume the same runtime only (from `suspend`).
    Runtime,
    /// Restore anywhere the provider can (from `checkpoint`).
    Portable,
}

/// `{lease, suspend, checkpoint}`: what the runtime port can do, as data.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRuntimeCapabilities {
    /// The runtime sleeps or expires unless its lease is renewed.
    pub lease: bool,
    /// Kinds `suspend` accepts.
    pub suspend: Vec<SandboxCheckpointKind>,
    /// Kinds `checkpoint` accepts.
    pub checkpoint: Vec<SandboxCheckpointKind>,
}

/// A provider checkpoint. JSON-safe.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxCheckpointHandle {
    /// Provider that made it; another provider must reject it.
    pub provider: String,
    /// Provider checkpoint id.
    pub checkpoint_id: String,
    /// Runtime it was taken from.
    pub source_runtime_id: String,
    /// What it captures.
    pub kind: SandboxCheckpointKind,
    /// Where it can be used.
    pub scope: SandboxCheckpointScope,
    /// Opaque, non-secret adapter state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Meta>,
}

/// Runtime lifecycle of a sandbox.
#[async_trait]
pub trait SandboxRuntimePort: Send + Sync {
    /// Which runtime this is. Pure; the execution guard lets it through.
    fn runtime_handle(&self) -> SandboxRuntimeHandle;

    /// What this runtime supports. Pure; the execution guard lets it through.
    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities;

    /// Observed state. Must not wake a sleeping runtime (answer `Unknown` instead).
    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError>;

    /// Keeps the runtime alive for `ttl_ms` more milliseconds. Failure means the lease is
    /// lost.
    async fn renew_lease(&self, ttl_ms: u64) -> Result<(), PortError>;

    /// Suspends the runtime; returns a `runtime`-scoped handle. Only kinds listed in
    /// `runtime_capabilities().suspend`.
    async fn suspend(
        &self,
        kind: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError>;

    /// Resumes from this runtime's own `runtime`-scoped handle; rejects any other.
    async fn resume(&self, handle: &SandboxCheckpointHandle) -> Result<(), PortError>;

    /// Takes a `portable` checkpoint. Only kinds listed in
    /// `runtime_capabilities().checkpoint`.
    async fn checkpoint(
        &self,
        kind: SandboxCheckpointKind,
        name: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError>;
}

/// Creates, reconnects to and restores provider runtimes.
///
/// Sandboxes returned here implement [`SandboxPort::as_runtime`].
#[async_trait]
pub trait SandboxProviderPort: Send + Sync {
    /// A fresh runtime.
    async fn create(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError>;

    /// Reconnects to an existing runtime; rejects another provider's handle.
    async fn resume(
        &self,
        handle: &SandboxRuntimeHandle,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError>;

    /// A new runtime from a `portable` checkpoint; rejects another provider's checkpoint.
    async fn restore(
        &self,
        checkpoint: &SandboxCheckpointHandle,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError>;
}
