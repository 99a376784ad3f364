//! Session-input synchronization (reference §2.3 steps 21–23, 26, 30; cleanup step 2).
//!
//! - `authorize` re-validates the fence (`isCurrent`) right before every canonical mutation a
//!   materializer makes; a stale fence additionally loses the lease.
//! - [`SessionInputSync::sync`] is serialized: each call waits for the previous one (a fair
//!   async mutex is the "tail" promise chain of the reference), and a failed call does not
//!   block the next.
//! - [`PeriodicSync`] runs only for materializer-owned, writable memory stores: every
//!   `sessionInputSyncIntervalMs` it syncs stage `periodic-<n>`. It stops when the run's
//!   internal signal aborts; any other failure is remembered and aborts the run, which then
//!   fails with that error once the harness settled.

use super::state::RunContext;
use omabox_contract::{
    AbortController, AuthorizeCallback, HarnessDriverType, ManagedSandboxLease,
    MemoryStoreOwnership, PortError, ResourceOwnership, SessionInputLifecycleContext,
};
use std::sync::Arc;
use tokio::task::JoinHandle;

/// `authorize` loss reason during materialization.
pub(super) const LOST_DURING_MATERIALIZATION: &str =
    "Runtime resource fence lost during Session input materialization";
/// `authorize` loss reason during synchronization.
const LOST_DURING_SYNCHRONIZATION: &str =
    "Runtime resource fence lost during Session input synchronization";

/// An AMA worker syncs its own memory stores; any other harness relies on the materializer.
pub(super) fn resource_ownership(context: &RunContext) -> ResourceOwnership {
    ResourceOwnership {
        memory_store: if context.profile.driver.driver_type() == HarnessDriverType::AmaWorker {
            MemoryStoreOwnership::Worker
        } else {
            MemoryStoreOwnership::Materializer
        },
    }
}

/// `authorize`: `fences.isCurrent(fence)`; false also loses the lease with `loss`.
pub(super) fn authorize(context: &Arc<RunContext>, loss: &'static str) -> AuthorizeCallback {
    let context = Arc::clone(context);
    Arc::new(move || {
        let context = Arc::clone(&context);
        Box::pin(async move {
            let current = context
                .host
                .deps
                .fences
                .is_current(&context.fence())
                .await?;
            if !current {
                context.lose_lease(loss);
            }
            Ok(current)
        })
    })
}

/// The serialized `synchronize` helper of one run (step 22).
pub(super) struct SessionInputSync {
    context: Arc<RunContext>,
    sandbox: ManagedSandboxLease,
    ownership: ResourceOwnership,
    tail: tokio::sync::Mutex<()>,
}

impl SessionInputSync {
    /// The helper for the sandbox the harness runs in.
    pub fn new(context: &Arc<RunContext>, sandbox: ManagedSandboxLease) -> Arc<Self> {
        Arc::new(Self {
            context: Arc::clone(context),
            ownership: resource_ownership(context),
            sandbox,
            tail: tokio::sync::Mutex::new(()),
        })
    }

    /// Step 23's condition: materializer-owned and some memory store is not read-only.
    pub fn needs_periodic_sync(&self) -> bool {
        self.ownership.memory_store == MemoryStoreOwnership::Materializer
            && self.context.session.as_ref().is_some_and(|session| {
                session.resources.iter().any(|resource| {
                    resource.resource_type == "memory_store"
                        && resource.str_field("access") != Some("read_only")
                })
            })
    }

    /// `sync(stage)`: a no-op without a materializer or a session; otherwise
    /// `synchronize(... "session-inputs-synchronize-<stage>")` after every earlier sync, then
    /// `throwIfAborted`.
    pub async fn sync(&self, stage: &str) -> Result<(), PortError> {
        let context = &self.context;
        let (Some(materializer), Some(session)) = (
            context.host.deps.session_inputs.as_ref(),
            context.session.as_ref(),
        ) else {
            return Ok(());
        };
        let _turn = self.tail.lock().await;
        let idempotency_key =
            context.idempotency_key(&format!("session-inputs-synchronize-{stage}"));
        tracing::debug!(
            step = "session_inputs.synchronize",
            stage,
            generation = context.generation()
        );
        materializer
            .synchronize(
                SessionInputLifecycleContext {
                    scope: context.scope.clone(),
                    fence: context.fence(),
                    session: session.clone(),
                    sandbox: self.sandbox.clone(),
                    resource_ownership: self.ownership,
                    access: context.session_input_access.clone(),
                    authorize: authorize(context, LOST_DURING_SYNCHRONIZATION),
                    signal: context.signal(),
                },
                idempotency_key,
            )
            .await?;
        context.throw_if_aborted()
    }

    /// Waits for every queued sync to finish ("await sessionInputSyncTail").
    pub async fn settle(&self) {
        drop(self.tail.lock().await);
    }
}

/// The periodic sync loop of step 23.
pub(super) struct PeriodicSync {
    controller: AbortController,
    task: Option<JoinHandle<()>>,
}

impl PeriodicSync {
    /// Starts the loop; it is linked to the run's internal signal.
    pub fn start(sync: &Arc<SessionInputSync>) -> Self {
        let controller = AbortController::new();
        let context = &sync.context;
        // Wake a sleeping loop when the run aborts (the reference's abort listener).
        tokio::spawn({
            let run_signal = context.signal();
            let periodic = controller.clone();
            let periodic_signal = controller.signal();
            async move {
                tokio::select! {
                    reason = run_signal.aborted() => periodic.abort(reason),
                    () = periodic_signal.token().cancelled() => {}
                }
            }
        });
        let task = tokio::spawn(periodic_loop(Arc::clone(sync), controller.clone()));
        Self {
            controller,
            task: Some(task),
        }
    }

    /// Stops the loop with `reason` and waits for it (steps 26 and cleanup 2).
    pub async fn stop(&mut self, reason: &str) {
        self.controller.abort(PortError::new(reason));
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

async fn periodic_loop(sync: Arc<SessionInputSync>, periodic: AbortController) {
    let context = Arc::clone(&sync.context);
    let signal = periodic.signal();
    // The reference aborts the periodic controller synchronously from the run's abort
    // listener; check the run's signal at every decision point so no stale state is read.
    let stopped = || {
        if context.is_aborted() && !signal.is_aborted() {
            periodic.abort(context.signal().reason().unwrap_or_else(PortError::aborted));
        }
        signal.is_aborted()
    };
    let interval = context.host.session_input_sync_interval_ms;
    let result: Result<(), PortError> = async {
        let mut sequence: u64 = 0;
        while !stopped() {
            context
                .host
                .scheduler
                .sleep(interval, signal.clone())
                .await?;
            if stopped() {
                return Ok(());
            }
            sequence += 1;
            sync.sync(&format!("periodic-{sequence}")).await?;
        }
        Ok(())
    }
    .await;
    if let Err(error) = result {
        if stopped() {
            return;
        }
        tracing::warn!(error = %context.redact(&error), "periodic Session input sync failed");
        context.ledger().session_input_sync_failure = Some(error.clone());
        context.abort(error);
    }
}
