//! Cancelling a run from the terminal: the first SIGINT/SIGTERM/SIGHUP aborts the run's
//! signal (the host then cleans up in full), the second exits at once and leaves the rest
//! to `omabox reap`. SIGHUP is a terminal that closed (a dropped SSH session, a closed
//! window): by default it would kill omabox mid-run, fence held and sandbox left. What this
//! must never do: exit on the first signal (that would skip cleanup and leak the sandbox
//! until the fence expires), or fail to cancel because the terminal it reports to is gone.

use crate::run_report::EXIT_CANCELLED;
use omabox_contract::{AbortController, PortError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::signal::unix::{SignalKind, signal};

/// Listens for SIGINT/SIGTERM/SIGHUP from the moment it is called (the handlers are
/// installed before it returns, so no signal between this call and the first poll of the
/// future can kill the process): the first cancels the run through its signal (full
/// cleanup), the second exits at once. Call it inside the runtime, before the run starts.
pub fn cancel_on_signals(
    controller: AbortController,
    cancelled: Arc<AtomicBool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let streams = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    async move {
        let (Ok(interrupt), Ok(terminate), Ok(hangup)) = streams else {
            tracing::warn!("cannot listen for SIGINT/SIGTERM/SIGHUP; Ctrl-C will not clean up");
            return;
        };
        cancel(controller, cancelled, interrupt, terminate, hangup).await;
    }
}

async fn cancel(
    controller: AbortController,
    cancelled: Arc<AtomicBool>,
    mut interrupt: tokio::signal::unix::Signal,
    mut terminate: tokio::signal::unix::Signal,
    mut hangup: tokio::signal::unix::Signal,
) {
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
        _ = hangup.recv() => "SIGHUP",
    };
    cancelled.store(true, Ordering::SeqCst);
    // Cancel first: after a SIGHUP the terminal may be gone, and nothing said there may
    // stand in the way of the cleanup.
    controller.abort(PortError::new(format!("Run cancelled by {name}")));
    errln!(
        "omabox: {name}: cancelling the run (terminating the sandbox, releasing the fence); \
         press Ctrl-C again to exit at once"
    );
    tokio::select! {
        _ = interrupt.recv() => {},
        _ = terminate.recv() => {},
        _ = hangup.recv() => {},
    }
    errln!(
        "omabox: exiting without cleanup; the fence expires on its TTL and `omabox reap` \
         terminates the sandbox"
    );
    std::process::exit(i32::from(EXIT_CANCELLED));
}
