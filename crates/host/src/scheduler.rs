//! The host's default clock: [`TimerScheduler`].
//!
//! Contract (reference §1.13): `sleep(ms, signal)` resolves after `ms` milliseconds, or, as soon
//! as `signal` aborts, clears its timer and rejects with the signal's *reason*. The heartbeat
//! monitor and the periodic Session-input sync both rely on that rejection to stop, so a
//! scheduler that ignored the signal would keep a finished run's monitor alive.
//!
//! It is a tokio timer, so tests drive it with tokio's paused clock
//! (`#[tokio::test(start_paused = true)]`) instead of fake timers.

use async_trait::async_trait;
use omabox_contract::{AbortSignal, PortError, RuntimeSchedulerPort};
use std::time::Duration;

/// The default [`RuntimeSchedulerPort`]: a tokio sleep that rejects with the abort reason.
#[derive(Debug, Clone, Copy, Default)]
pub struct TimerScheduler;

#[async_trait]
impl RuntimeSchedulerPort for TimerScheduler {
    async fn sleep(&self, ms: u64, signal: AbortSignal) -> Result<(), PortError> {
        signal.throw_if_aborted()?;
        tokio::select! {
            biased;
            reason = signal.aborted() => Err(reason),
            () = tokio::time::sleep(Duration::from_millis(ms)) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_contract::AbortController;

    #[tokio::test(start_paused = true)]
    async fn wakes_after_the_interval() {
        let started = tokio::time::Instant::now();
        TimerScheduler
            .sleep(10, AbortSignal::never())
            .await
            .expect("an unaborted sleep resolves");
        assert!(started.elapsed() >= Duration::from_millis(10));
    }

    #[tokio::test(start_paused = true)]
    async fn rejects_with_the_abort_reason() {
        let controller = AbortController::new();
        let sleeping = tokio::spawn({
            let signal = controller.signal();
            async move { TimerScheduler.sleep(60_000, signal).await }
        });
        tokio::task::yield_now().await;
        controller.abort(PortError::new("Managed runtime cleanup"));
        let error = sleeping.await.expect("task").expect_err("aborted");
        assert_eq!(error.message(), "Managed runtime cleanup");

        let already = AbortSignal::aborted_with(PortError::new("before"));
        let error = TimerScheduler.sleep(1, already).await.expect_err("aborted");
        assert_eq!(error.message(), "before");
    }
}
