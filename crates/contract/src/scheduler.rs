//! The host's clock, as a port, so tests can drive heartbeats deterministically.

use crate::{AbortSignal, PortError};
use async_trait::async_trait;

/// Sleeps for the host's heartbeat and sync loops.
#[async_trait]
pub trait RuntimeSchedulerPort: Send + Sync {
    /// Resolves after `ms`, or rejects with the signal's reason as soon as it aborts.
    async fn sleep(&self, ms: u64, signal: AbortSignal) -> Result<(), PortError>;
}
