//! [`FakeScheduler`]: a scripted `RuntimeSchedulerPort`.
//!
//! Default: every sleep blocks until its signal aborts, then rejects with the reason (the
//! fault matrix's "scheduler blocks until aborted"), so no heartbeat ever fires unless a test
//! scripts one. [`FakeScheduler::wakes_on`] makes sleeps resolve when a [`Gate`] opens;
//! [`FakeScheduler::wakes_first_n`] resolves the first `n` sleeps at once.

use super::log::{CallLog, names};
use super::step::{Gate, Step, WithSignal};
use async_trait::async_trait;
use omabox_contract::{AbortSignal, PortError, RuntimeSchedulerPort};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Input of `sleep`.
#[derive(Debug, Clone)]
pub struct SleepCall {
    /// Requested duration.
    pub ms: u64,
    /// Cancellation.
    pub signal: AbortSignal,
}

impl WithSignal for SleepCall {
    fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }
}

/// A scripted clock.
#[derive(Debug)]
pub struct FakeScheduler {
    log: CallLog,
    /// `sleep`.
    pub sleep: Step<SleepCall, ()>,
}

impl FakeScheduler {
    /// A clock that never wakes on its own.
    pub fn new(log: CallLog) -> Self {
        let sleep = Step::new(|call: SleepCall| async move { Err(call.signal.aborted().await) });
        Self { log, sleep }
    }

    /// Sleeps resolve once `gate` opens (and reject on abort first).
    pub fn wakes_on(&self, gate: Gate) {
        self.sleep.set(move |call: SleepCall| {
            let gate = gate.clone();
            async move {
                tokio::select! {
                    reason = call.signal.aborted() => Err(reason),
                    () = gate.wait() => Ok(()),
                }
            }
        });
    }

    /// The first `n` sleeps resolve at once; later ones block until aborted.
    pub fn wakes_first_n(&self, n: usize) {
        let woken = Arc::new(AtomicUsize::new(0));
        self.sleep.set(move |call: SleepCall| {
            let first = woken.fetch_add(1, Ordering::SeqCst) < n;
            async move {
                if first {
                    Ok(())
                } else {
                    Err(call.signal.aborted().await)
                }
            }
        });
    }
}

#[async_trait]
impl RuntimeSchedulerPort for FakeScheduler {
    async fn sleep(&self, ms: u64, signal: AbortSignal) -> Result<(), PortError> {
        self.log.push(format!("{}.sleep", names::SCHEDULER));
        self.sleep.invoke(SleepCall { ms, signal }).await
    }
}
