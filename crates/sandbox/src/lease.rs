//! `runWithSandboxLease`: keep a provider lease alive exactly while an operation runs.
//!
//! ```text
//!   validate ttl/interval ─► renew (failure: lease lost) ─► op(signal) ┬─ op settles: its result
//!                                   every interval: renew ─ failure ───┴─ abort op signal,
//!                                                                          return lease lost now
//! ```
//!
//! An external abort is forwarded to the operation's signal; the operation decides how to
//! end. When the lease is lost the operation future is aborted through its signal and then
//! dropped: its eventual result is never observed (the TypeScript original lets it run on
//! detached).

use crate::runtime::SandboxRuntimePort;
use omabox_contract::{AbortController, AbortSignal, PortError};
use std::future::Future;
use std::time::Duration;

/// Renewal cadence when the caller does not choose one: at most this often…
const DEFAULT_MAX_INTERVAL: Duration = Duration::from_millis(30_000);

/// Options of [`run_with_sandbox_lease`].
#[derive(Debug, Clone, Default)]
pub struct SandboxLeaseOptions {
    /// Lease length requested on every renewal, in milliseconds. Must be positive.
    pub ttl_ms: u64,
    /// Renewal period in milliseconds; default `min(30000, ttl_ms / 2)`. Must be positive and
    /// less than `ttl_ms`.
    pub interval_ms: Option<u64>,
    /// External cancellation, forwarded to the operation's signal.
    pub signal: Option<AbortSignal>,
}

/// `SandboxLeaseLostError`: the runtime's lease could not be renewed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("sandbox runtime {runtime_id} lost its lease")]
pub struct SandboxLeaseLostError {
    /// The runtime that lost its lease.
    pub runtime_id: String,
    /// The renewal failure.
    #[source]
    pub cause: PortError,
}

/// Why [`run_with_sandbox_lease`] failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SandboxLeaseError {
    /// `ttl_ms` is zero.
    #[error("sandbox lease ttlMs must be positive")]
    InvalidTtl,
    /// `interval_ms` is zero or not below `ttl_ms`.
    #[error("sandbox lease intervalMs must be positive and less than ttlMs")]
    InvalidInterval,
    /// The lease was lost, before or during the operation.
    #[error(transparent)]
    Lost(#[from] SandboxLeaseLostError),
    /// The operation itself failed.
    #[error(transparent)]
    Operation(PortError),
}

impl From<SandboxLeaseError> for PortError {
    fn from(error: SandboxLeaseError) -> Self {
        match error {
            SandboxLeaseError::InvalidTtl | SandboxLeaseError::InvalidInterval => {
                PortError::invalid_argument(error.to_string())
            }
            SandboxLeaseError::Lost(lost) => PortError::new(lost.to_string()),
            SandboxLeaseError::Operation(error) => error,
        }
    }
}

fn renewal_interval(options: &SandboxLeaseOptions) -> Result<Duration, SandboxLeaseError> {
    if options.ttl_ms == 0 {
        return Err(SandboxLeaseError::InvalidTtl);
    }
    let ttl = Duration::from_millis(options.ttl_ms);
    let interval = match options.interval_ms {
        Some(ms) => Duration::from_millis(ms),
        None => DEFAULT_MAX_INTERVAL.min(ttl / 2),
    };
    if interval.is_zero() || interval >= ttl {
        return Err(SandboxLeaseError::InvalidInterval);
    }
    Ok(interval)
}

/// Renews `runtime`'s lease, runs `operation` while renewing every interval, and stops
/// renewing when it settles.
///
/// A failed first renewal fails with [`SandboxLeaseError::Lost`] before the operation
/// starts. A failed later renewal aborts the operation's signal with the lease-lost error
/// and returns that error at once.
pub async fn run_with_sandbox_lease<T, F, Fut>(
    runtime: &dyn SandboxRuntimePort,
    options: SandboxLeaseOptions,
    operation: F,
) -> Result<T, SandboxLeaseError>
where
    F: FnOnce(AbortSignal) -> Fut,
    Fut: Future<Output = Result<T, PortError>>,
{
    let interval = renewal_interval(&options)?;
    let ttl_ms = options.ttl_ms;
    let runtime_id = runtime.runtime_handle().runtime_id;
    let lost = |cause: PortError| SandboxLeaseLostError {
        runtime_id: runtime_id.clone(),
        cause,
    };

    runtime.renew_lease(ttl_ms).await.map_err(lost)?;

    let controller = AbortController::new();
    if let Some(reason) = options.signal.as_ref().and_then(AbortSignal::reason) {
        controller.abort(reason);
    }
    let forward_external_abort = async {
        if let Some(signal) = &options.signal {
            let reason = signal.aborted().await;
            controller.abort(reason);
        }
        std::future::pending::<()>().await;
    };
    let heartbeat = async {
        loop {
            tokio::time::sleep(interval).await;
            if let Err(cause) = runtime.renew_lease(ttl_ms).await {
                let error = lost(cause);
                controller.abort(PortError::new(error.to_string()));
                return error;
            }
        }
    };
    let operation = operation(controller.signal());

    tokio::select! {
        biased;
        result = operation => result.map_err(SandboxLeaseError::Operation),
        error = heartbeat => Err(SandboxLeaseError::Lost(error)),
        () = forward_external_abort => unreachable_pending(),
    }
}

// `forward_external_abort` ends in `pending()`, so its branch never completes.
fn unreachable_pending<T>() -> Result<T, SandboxLeaseError> {
    Err(SandboxLeaseError::Operation(PortError::new(
        "sandbox lease abort forwarder completed unexpectedly",
    )))
}
