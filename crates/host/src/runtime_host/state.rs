//! The state one `run` shares between its transaction, its heartbeat monitor, the periodic
//! Session-input sync and the callbacks it hands to ports (reference §2.2 steps 10–11).
//!
//! In the TypeScript host these are closure variables; here they live behind short,
//! never-awaited `std::sync::Mutex` sections in one [`RunContext`], so every reader sees the
//! latest value at the moment it reads (the renewed fence, the current cleanup reason), exactly
//! as a closure would.
//!
//! `loseLease` and the external-signal listener are synchronous in JavaScript: when a caller
//! aborts, the very next `throwIfAborted` already fails. A tokio task cannot give that
//! guarantee, so the external signal is linked twice: a watcher task wakes ports blocked on the
//! internal signal, and every abort check the host makes ([`RunContext::is_aborted`],
//! [`RunContext::throw_if_aborted`]) first propagates an external abort it can already see.

use super::HostInner;
use super::identity::RuntimeIdentity;
use crate::run_observer::{RunObserver, RunStep, StepEvent, StepFacts, StepOutcome};
use omabox_contract::{
    AbortController, AbortSignal, CredentialEgressRequirement, ManagedRuntimePlan,
    ManagedRuntimeProfile, ManagedSandboxLease, PortError, RuntimePublicationCandidate,
    RuntimeResourceFence, RuntimeResourcePublication, RuntimeResourceScope, RuntimeSessionSnapshot,
    SessionInputAccessPort, TerminationReason,
};
use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// `loseLease` reason of an external abort.
pub(super) const EXECUTION_CANCELLED: &str = "Managed runtime execution cancelled";

/// Locks a mutex, ignoring poisoning: every critical section here is a plain field update
/// that cannot leave the value half-written.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The mutable bookkeeping of one run (step 10).
#[derive(Debug)]
pub(super) struct Ledger {
    /// Set by `loseLease`; decides `lease_lost` over `failed`.
    pub lease_lost: bool,
    /// The reason every cleanup step passes.
    pub cleanup_reason: TerminationReason,
    /// Outputs were published: release them instead of aborting them.
    pub output_published: bool,
    /// A retained runtime was published: do not terminate it.
    pub retained_runtime_published: bool,
    /// The output candidate a live checkpoint publishes (carried forward when outputs are
    /// disabled).
    pub published_output_candidate: Option<RuntimePublicationCandidate>,
    /// Live checkpoint ids already published.
    pub committed_checkpoint_ids: HashSet<String>,
    /// The periodic sync's failure, rethrown once the harness settled.
    pub session_input_sync_failure: Option<PortError>,
}

/// Everything admission decided before the fence was claimed.
#[derive(Debug)]
pub(super) struct Admission {
    /// The resolved plan.
    pub plan: ManagedRuntimePlan,
    /// The effective egress requirement.
    pub egress_requirement: CredentialEgressRequirement,
    /// The harness identity.
    pub identity: RuntimeIdentity,
}

/// What the caller passed to `run`, minus the signal.
pub(super) struct RunRequest {
    pub scope: RuntimeResourceScope,
    pub profile: ManagedRuntimeProfile,
    pub session: Option<RuntimeSessionSnapshot>,
    pub session_input_access: Option<Arc<dyn SessionInputAccessPort>>,
    pub observer: Option<Arc<dyn RunObserver>>,
}

/// The shared state of one run.
pub(super) struct RunContext {
    pub host: Arc<HostInner>,
    pub scope: RuntimeResourceScope,
    pub profile: ManagedRuntimeProfile,
    pub session: Option<RuntimeSessionSnapshot>,
    pub session_input_access: Option<Arc<dyn SessionInputAccessPort>>,
    observer: Option<Arc<dyn RunObserver>>,
    pub plan: ManagedRuntimePlan,
    pub egress_requirement: CredentialEgressRequirement,
    pub identity: RuntimeIdentity,
    /// The publication the claim returned (possibly from an earlier generation).
    pub publication: Option<RuntimeResourcePublication>,
    controller: AbortController,
    signal: AbortSignal,
    external: Mutex<Option<AbortSignal>>,
    fence: Mutex<RuntimeResourceFence>,
    sandbox_lease: Mutex<Option<ManagedSandboxLease>>,
    ledger: Mutex<Ledger>,
}

impl RunContext {
    /// Step 10: the local state right after a successful claim.
    pub fn new(
        host: Arc<HostInner>,
        request: RunRequest,
        admission: Admission,
        fence: RuntimeResourceFence,
        publication: Option<RuntimeResourcePublication>,
    ) -> Arc<Self> {
        let controller = AbortController::new();
        let published_output_candidate = publication
            .as_ref()
            .and_then(|publication| publication.output_candidate.clone());
        Arc::new(Self {
            host,
            scope: request.scope,
            profile: request.profile,
            session: request.session,
            session_input_access: request.session_input_access,
            observer: request.observer,
            plan: admission.plan,
            egress_requirement: admission.egress_requirement,
            identity: admission.identity,
            publication,
            signal: controller.signal(),
            controller,
            external: Mutex::new(None),
            fence: Mutex::new(fence),
            sandbox_lease: Mutex::new(None),
            ledger: Mutex::new(Ledger {
                lease_lost: false,
                cleanup_reason: TerminationReason::Failed,
                output_published: false,
                retained_runtime_published: false,
                published_output_candidate,
                committed_checkpoint_ids: HashSet::new(),
                session_input_sync_failure: None,
            }),
        })
    }

    /// Step 11: `loseLease(reason)`.
    pub fn lose_lease(&self, reason: &str) {
        {
            let mut ledger = lock(&self.ledger);
            ledger.lease_lost = true;
            ledger.cleanup_reason = TerminationReason::LeaseLost;
        }
        let reason = PortError::new(reason);
        tracing::debug!(reason = %self.redact(&reason), "managed runtime lease lost");
        self.controller.abort(reason);
    }

    /// A guard that aborts the internal controller if the `run` future is dropped.
    pub fn abort_on_drop(&self) -> AbortOnDrop {
        AbortOnDrop(self.controller.clone())
    }

    /// Aborts the internal controller without losing the lease (periodic-sync failure,
    /// cleanup).
    pub fn abort(&self, reason: PortError) {
        self.controller.abort(reason);
    }

    /// Step 11: links the caller's signal. Already aborted → `loseLease` now; otherwise on
    /// abort, until [`RunContext::detach_external_signal`].
    pub fn link_external_signal(self: &Arc<Self>, external: Option<AbortSignal>) {
        let Some(external) = external else {
            return;
        };
        *lock(&self.external) = Some(external.clone());
        if external.is_aborted() {
            self.propagate_external_abort();
            return;
        }
        let context = Arc::clone(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = external.aborted() => context.propagate_external_abort(),
                () = context.signal.token().cancelled() => {}
            }
        });
    }

    /// Cleanup step 1: an abort of the caller's signal no longer changes this run.
    pub fn detach_external_signal(&self) {
        lock(&self.external).take();
    }

    /// The external listener: fires at most once, and never after detach.
    fn propagate_external_abort(&self) {
        let fired = {
            let mut external = lock(&self.external);
            match external.as_ref() {
                Some(signal) if signal.is_aborted() => external.take().is_some(),
                _ => false,
            }
        };
        if fired {
            self.lose_lease(EXECUTION_CANCELLED);
        }
    }

    /// The internal signal every port call receives.
    pub fn signal(&self) -> AbortSignal {
        self.signal.clone()
    }

    /// `controller.signal.aborted`, seeing an external abort as JavaScript would.
    pub fn is_aborted(&self) -> bool {
        self.propagate_external_abort();
        self.signal.is_aborted()
    }

    /// `controller.signal.throwIfAborted()`, seeing an external abort as JavaScript would.
    pub fn throw_if_aborted(&self) -> Result<(), PortError> {
        self.propagate_external_abort();
        self.signal.throw_if_aborted()
    }

    /// The current fence (replaced by every renewal).
    pub fn fence(&self) -> RuntimeResourceFence {
        lock(&self.fence).clone()
    }

    /// Adopts a renewed fence.
    pub fn set_fence(&self, fence: RuntimeResourceFence) {
        *lock(&self.fence) = fence;
    }

    /// The fence generation (fixed for the run).
    pub fn generation(&self) -> u64 {
        lock(&self.fence).generation
    }

    /// `"<workId>:<generation>:<stage>"`.
    pub fn idempotency_key(&self, stage: &str) -> String {
        format!("{}:{}:{stage}", self.scope.work_id, self.generation())
    }

    /// The sandbox lease, once acquired or restored.
    pub fn sandbox_lease(&self) -> Option<ManagedSandboxLease> {
        lock(&self.sandbox_lease).clone()
    }

    /// Records the lease (the monitor starts heartbeating it).
    pub fn set_sandbox_lease(&self, lease: ManagedSandboxLease) {
        *lock(&self.sandbox_lease) = Some(lease);
    }

    /// Short exclusive access to the bookkeeping. Never hold it across an await.
    pub fn ledger(&self) -> MutexGuard<'_, Ledger> {
        lock(&self.ledger)
    }

    /// The reason cleanup passes, as of now.
    pub fn cleanup_reason(&self) -> TerminationReason {
        self.ledger().cleanup_reason
    }

    /// Sets the cleanup reason.
    pub fn set_cleanup_reason(&self, reason: TerminationReason) {
        self.ledger().cleanup_reason = reason;
    }

    /// True once `loseLease` ran.
    pub fn lease_lost(&self) -> bool {
        self.ledger().lease_lost
    }

    /// `error` with the fence token replaced by `"[redacted]"`: for everything that leaves the
    /// run (orphan records, results, rejections) and every log line.
    pub fn redact(&self, error: &PortError) -> PortError {
        error.redacted(lock(&self.fence).token.expose())
    }

    /// Tells the run's observer that `step`, begun at `began`, ended with `result`. An error
    /// is redacted before the observer sees it.
    pub fn observe<T>(
        &self,
        step: RunStep,
        began: Instant,
        result: &Result<T, PortError>,
        facts: impl FnOnce(&T) -> StepFacts,
    ) {
        let Some(observer) = &self.observer else {
            return;
        };
        let outcome = match result {
            Ok(value) => StepOutcome::Done(facts(value)),
            Err(error) => StepOutcome::Failed(self.redact(error)),
        };
        observer.step(StepEvent {
            step,
            elapsed: began.elapsed(),
            outcome,
        });
    }
}

/// One named step: logs it, awaits its port call and reports the outcome to the observer.
/// The port's answer is returned unchanged.
pub(super) async fn observed<T>(
    context: &RunContext,
    step: RunStep,
    call: impl Future<Output = Result<T, PortError>>,
    facts: impl FnOnce(&T) -> StepFacts,
) -> Result<T, PortError> {
    tracing::debug!(step = step.name(), generation = context.generation());
    let began = Instant::now();
    let result = call.await;
    context.observe(step, began, &result, facts);
    result
}

/// Aborts the internal controller when the `run` future is dropped mid-transaction, so its
/// monitor and sync tasks stop; see the "dropped run" note on [`super::ManagedRuntimeHost::run`].
pub(super) struct AbortOnDrop(AbortController);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort(PortError::new(RUN_DROPPED));
    }
}

/// Abort reason when the `run` future is dropped before cleanup finished.
const RUN_DROPPED: &str = "Managed runtime run was dropped";
