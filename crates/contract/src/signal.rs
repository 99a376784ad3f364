//! Cancellation with a reason: the Rust form of a JS `AbortController`/`AbortSignal`.
//!
//! The contract passes an `AbortSignal` to every long operation, and several behaviours depend
//! on its *reason* ("fail immediately with the signal's reason"). A bare `CancellationToken`
//! has no reason, so [`AbortSignal`] pairs one with a write-once reason that is always set
//! *before* the token fires: a waiter woken by cancellation always sees the reason.

use crate::PortError;
use std::sync::{Arc, OnceLock};
use tokio_util::sync::CancellationToken;

#[derive(Debug, Default)]
struct AbortState {
    token: CancellationToken,
    reason: OnceLock<PortError>,
}

/// The owning side: aborts its signal, once, with a reason.
#[derive(Debug, Clone, Default)]
pub struct AbortController {
    state: Arc<AbortState>,
}

impl AbortController {
    /// A controller whose signal has not fired.
    pub fn new() -> Self {
        Self::default()
    }

    /// The signal observers hold.
    pub fn signal(&self) -> AbortSignal {
        AbortSignal {
            state: Arc::clone(&self.state),
        }
    }

    /// Aborts with `reason`. Later calls are no-ops: the first reason wins.
    pub fn abort(&self, reason: PortError) {
        let _ = self.state.reason.set(reason);
        self.state.token.cancel();
    }

    /// True once aborted.
    pub fn is_aborted(&self) -> bool {
        self.state.token.is_cancelled()
    }
}

/// The observing side of an [`AbortController`].
#[derive(Debug, Clone, Default)]
pub struct AbortSignal {
    state: Arc<AbortState>,
}

impl AbortSignal {
    /// A signal that never fires.
    pub fn never() -> Self {
        Self::default()
    }

    /// A signal that has already fired with `reason`.
    pub fn aborted_with(reason: PortError) -> Self {
        let controller = AbortController::new();
        controller.abort(reason);
        controller.signal()
    }

    /// True once the controller aborted.
    pub fn is_aborted(&self) -> bool {
        self.state.token.is_cancelled()
    }

    /// The abort reason, once aborted.
    pub fn reason(&self) -> Option<PortError> {
        if !self.is_aborted() {
            return None;
        }
        Some(
            self.state
                .reason
                .get()
                .cloned()
                .unwrap_or_else(PortError::aborted),
        )
    }

    /// `throwIfAborted`: fails with the reason when aborted.
    pub fn throw_if_aborted(&self) -> Result<(), PortError> {
        match self.reason() {
            Some(reason) => Err(reason),
            None => Ok(()),
        }
    }

    /// Resolves when the signal fires, with its reason.
    pub async fn aborted(&self) -> PortError {
        self.state.token.cancelled().await;
        self.reason().unwrap_or_else(PortError::aborted)
    }

    /// The underlying token, for `select!` with other cancellation-aware code.
    pub fn token(&self) -> &CancellationToken {
        &self.state.token
    }

    /// Runs `future` until it completes or this signal fires; on abort fails with the reason.
    pub async fn race<T>(
        &self,
        future: impl std::future::Future<Output = Result<T, PortError>>,
    ) -> Result<T, PortError> {
        self.throw_if_aborted()?;
        tokio::select! {
            biased;
            reason = self.aborted() => Err(reason),
            result = future => result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reason_is_visible_to_waiters_and_first_reason_wins() {
        let controller = AbortController::new();
        let signal = controller.signal();
        assert!(signal.throw_if_aborted().is_ok());
        let waiter = tokio::spawn({
            let signal = signal.clone();
            async move { signal.aborted().await }
        });
        controller.abort(PortError::new("first"));
        controller.abort(PortError::new("second"));
        assert_eq!(waiter.await.unwrap().message(), "first");
        assert_eq!(signal.throw_if_aborted().unwrap_err().message(), "first");
    }

    #[tokio::test]
    async fn race_fails_with_the_reason() {
        let signal = AbortSignal::aborted_with(PortError::new("gone"));
        let result: Result<(), _> = signal.race(std::future::pending()).await;
        assert_eq!(result.unwrap_err().message(), "gone");
    }
}
