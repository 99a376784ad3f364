//! Cancelling a run from the terminal: the first SIGINT/SIGTERM aborts the run's signal (the
//! host then cleans up in full), the second exits at once and leaves the rest to
//! `omabox reap`. What this must never do: exit on the first signal (that would skip
//! cleanup and leak the sandbox until the fence expires).

use crate::run_report::EXIT_CANCELLED;
use omabox_contract::{AbortController, PortError};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::signal::unix::{SignalKind, signal};

/// Waits for SIGINT/SIGTERM: the first cancels the run through its signal (full cleanup),
/// the second exits at once.
pub async fn cancel_on_signals(controller: AbortController, cancelled: Arc<AtomicBool>) {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM; Ctrl-C will not clean up");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    cancelled.store(true, Ordering::SeqCst);
    eprintln!(
        "omabox: {name}: cancelling the run (terminating the sandbox, releasing the fence); \
         press Ctrl-C again to exit at once"
    );
    controller.abort(PortError::new(format!("Run cancelled by {name}")));
    tokio::select! {
        _ = interrupt.recv() => {},
        _ = terminate.recv() => {},
    }
    eprintln!(
        "omabox: exiting without cleanup; the fence expires on its TTL and `omabox reap` \
         terminates the sandbox"
    );
    std::process::exit(i32::from(EXIT_CANCELLED));
}
