//! The managed runtime host: the fenced transaction around one work item
//! (reference §2, `createManagedRuntimeHost`).
//!
//! [`ManagedRuntimeHost::run`] reads as the contract's checklist:
//!
//! ```text
//!   §2.1 pre-flight (steps 1–8)       admission; failures REJECT, no fence is held
//!   §2.2 claim (step 9)               fences.acquire → conflict is returned unchanged
//!        state, cancel, monitor (10–12)
//!   §2.3 transaction (steps 13–36)    workspace → outputs → egress → restore|acquire → attach
//!                                     → session inputs → harness (+ live checkpoints)
//!                                     → sync → suspend → checkpoint → runtime checkpoint
//!                                     → outputs → publish
//!        catch                        lease lost → lease_lost; otherwise failed{error}
//!   §2.4 cleanup (11 steps)           revoke → terminate|orphan → outputs → egress
//!                                     → workspace → fence; persistence errors REJECT
//! ```
//!
//! What this module must never do: publish without the fence's atomic check (publication is
//! the fence port's single `publish` call), terminate a published retained runtime, release
//! unpublished outputs, or let the fence token reach a log line, an orphan record, a lease, or
//! an error that leaves `run`.
//!
//! Knowing differences from the TypeScript reference, all deliberate:
//! - **Redaction is unconditional.** The reference redacts the token only from `Error`
//!   messages and passes any other thrown value to `orphans.enqueue` raw. Rust has only
//!   [`PortError`], so every terminate failure is redacted; and the errors that leave `run` (a
//!   `failed` result's error, a cleanup-persistence rejection) are redacted too, which the
//!   reference does not do. Messages without the token are unchanged.
//! - **A dropped `run` future** (JavaScript promises cannot be dropped) aborts the internal
//!   signal, stopping the monitor and the periodic sync, but runs no cleanup: the fence then
//!   expires on its TTL as after a crash. Cancel with [`ManagedRuntimeRunInput::signal`] to get
//!   the full cleanup.
//! - **Heartbeat failure text** is `"Runtime heartbeat failed: <ErrorClass>: <message>"`, the
//!   JavaScript `String(error)` of an `Error`.

mod cleanup;
pub mod identity;
mod live_checkpoint;
mod monitor;
mod preflight;
mod session_sync;
mod state;
mod transaction;

use crate::run_observer::{RunObserver, RunStep, StepEvent, StepFacts, StepOutcome};
use crate::scheduler::TimerScheduler;
use omabox_contract::{
    AbortSignal, AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, CredentialEgressPort,
    ManagedRuntimeProfile, ManagedSandboxPort, PortError, RuntimeCheckpointPort, RuntimeOrphanPort,
    RuntimeResourceFencePort, RuntimeResourceScope, RuntimeSchedulerPort, RuntimeSessionSnapshot,
    SandboxHarnessDriverPort, SessionInputAccessPort, SessionInputMaterializerPort,
    SessionOutputPort, TerminationReason, WorkspacePersistencePort,
};
use serde::{Deserialize, Serialize};
use state::{RunContext, RunRequest};
use std::sync::Arc;
use tracing::Instrument;

/// Default cadence of the periodic Session-input sync: the official Environment Worker's.
pub const DEFAULT_SESSION_INPUT_SYNC_INTERVAL_MS: u64 = 15_000;

/// `Number.MAX_SAFE_INTEGER`.
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// The ports and settings of a host (reference §1.13).
#[derive(Clone)]
pub struct ManagedRuntimeHostDependencies {
    /// Who claims fences.
    pub owner_id: String,
    /// Fence time to live, renewed every heartbeat.
    pub lease_ttl_ms: u64,
    /// Heartbeat cadence.
    pub heartbeat_interval_ms: u64,
    /// Periodic sync cadence for materializer-owned writable memory stores (default 15 000).
    pub session_input_sync_interval_ms: Option<u64>,
    /// The authoritative control plane.
    pub fences: Arc<dyn RuntimeResourceFencePort>,
    /// Compute lifecycle.
    pub sandbox: Arc<dyn ManagedSandboxPort>,
    /// Workspace persistence.
    pub workspace: Arc<dyn WorkspacePersistencePort>,
    /// Session outputs.
    pub outputs: Arc<dyn SessionOutputPort>,
    /// Runs the harness.
    pub harness_driver: Arc<dyn SandboxHarnessDriverPort>,
    /// Durable queue of reaps for failed terminations.
    pub orphans: Arc<dyn RuntimeOrphanPort>,
    /// The clock; defaults to [`TimerScheduler`].
    pub scheduler: Option<Arc<dyn RuntimeSchedulerPort>>,
    /// Optional provider runtime checkpoints.
    pub runtime_checkpoint: Option<Arc<dyn RuntimeCheckpointPort>>,
    /// Optional credential egress.
    pub credential_egress: Option<Arc<dyn CredentialEgressPort>>,
    /// Optional Session-input stager.
    pub session_inputs: Option<Arc<dyn SessionInputMaterializerPort>>,
}

impl std::fmt::Debug for ManagedRuntimeHostDependencies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeHostDependencies")
            .field("owner_id", &self.owner_id)
            .field("lease_ttl_ms", &self.lease_ttl_ms)
            .field("heartbeat_interval_ms", &self.heartbeat_interval_ms)
            .field(
                "session_input_sync_interval_ms",
                &self.session_input_sync_interval_ms,
            )
            .field("scheduler", &self.scheduler.is_some())
            .field("runtime_checkpoint", &self.runtime_checkpoint.is_some())
            .field("credential_egress", &self.credential_egress.is_some())
            .field("session_inputs", &self.session_inputs.is_some())
            .finish_non_exhaustive()
    }
}

/// Input of [`ManagedRuntimeHost::run`].
#[derive(Clone)]
pub struct ManagedRuntimeRunInput {
    /// The work item.
    pub scope: RuntimeResourceScope,
    /// What it requires.
    pub profile: ManagedRuntimeProfile,
    /// The Session snapshot fetched after the claim.
    pub session: Option<RuntimeSessionSnapshot>,
    /// Ephemeral per-claim content access; never persisted.
    pub session_input_access: Option<Arc<dyn SessionInputAccessPort>>,
    /// Cancels this generation and prevents publication.
    pub signal: Option<AbortSignal>,
    /// Told about every step this run finishes (omabox extension; see
    /// [`crate::run_observer`]).
    pub observer: Option<Arc<dyn RunObserver>>,
}

impl ManagedRuntimeRunInput {
    /// A run of `profile` for `scope` with no session, accessor or signal.
    pub fn new(scope: RuntimeResourceScope, profile: ManagedRuntimeProfile) -> Self {
        Self {
            scope,
            profile,
            session: None,
            session_input_access: None,
            signal: None,
            observer: None,
        }
    }
}

impl std::fmt::Debug for ManagedRuntimeRunInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeRunInput")
            .field("scope", &self.scope)
            .field("profile", &self.profile)
            .field("session", &self.session)
            .field("session_input_access", &self.session_input_access.is_some())
            .field("signal", &self.signal)
            .field("observer", &self.observer.is_some())
            .finish()
    }
}

/// How a run ended, when it did not reject.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ManagedRuntimeRunResult {
    /// Published; `revision` is the publication revision.
    Completed {
        /// The final publication revision.
        revision: u64,
    },
    /// Another owner holds the work item.
    Conflict {
        /// When its fence expires.
        #[serde(rename = "expiresAt")]
        expires_at: Option<String>,
    },
    /// Ownership was lost (fence, sandbox, cancel, heartbeat, publish); nothing was published
    /// by the final step.
    LeaseLost,
    /// A step failed; everything allocated was cleaned up.
    Failed {
        /// The failing step's error (fence token redacted).
        error: PortError,
    },
}

/// Construction-time settings, resolved.
pub(crate) struct HostInner {
    deps: ManagedRuntimeHostDependencies,
    scheduler: Arc<dyn RuntimeSchedulerPort>,
    session_input_sync_interval_ms: u64,
}

/// The managed runtime host. Cheap to clone; runs are independent.
#[derive(Clone)]
pub struct ManagedRuntimeHost {
    inner: Arc<HostInner>,
}

impl std::fmt::Debug for ManagedRuntimeHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedRuntimeHost")
            .field("deps", &self.inner.deps)
            .field(
                "session_input_sync_interval_ms",
                &self.inner.session_input_sync_interval_ms,
            )
            .finish_non_exhaustive()
    }
}

impl ManagedRuntimeHost {
    /// A host over `deps`. Fails with "sessionInputSyncIntervalMs must be a positive integer"
    /// unless the interval is in `1..=2^53-1`.
    pub fn new(deps: ManagedRuntimeHostDependencies) -> Result<Self, PortError> {
        let session_input_sync_interval_ms = deps
            .session_input_sync_interval_ms
            .unwrap_or(DEFAULT_SESSION_INPUT_SYNC_INTERVAL_MS);
        if session_input_sync_interval_ms == 0 || session_input_sync_interval_ms > MAX_SAFE_INTEGER
        {
            return Err(PortError::new(
                "sessionInputSyncIntervalMs must be a positive integer",
            ));
        }
        let scheduler = deps
            .scheduler
            .clone()
            .unwrap_or_else(|| Arc::new(TimerScheduler));
        Ok(Self {
            inner: Arc::new(HostInner {
                deps,
                scheduler,
                session_input_sync_interval_ms,
            }),
        })
    }

    /// Runs one work item through the fenced transaction.
    ///
    /// Rejects (`Err`) for pre-flight admission errors (no fence was claimed) and for
    /// cleanup-persistence errors (credential revoke, orphan enqueue or credential release
    /// failed; raised after every remaining cleanup step, overriding any result). Otherwise
    /// resolves with `completed`, `conflict`, `lease_lost` or `failed` (reference §2.6).
    ///
    /// Must be polled inside a tokio runtime: the heartbeat monitor and the periodic sync are
    /// tasks. Dropping the future mid-run stops them but skips cleanup; cancel through the
    /// input's signal instead.
    pub async fn run(
        &self,
        input: ManagedRuntimeRunInput,
    ) -> Result<ManagedRuntimeRunResult, PortError> {
        let ManagedRuntimeRunInput {
            scope,
            profile,
            session,
            session_input_access,
            signal,
            observer,
        } = input;
        // §2.1 Pre-flight, steps 1–8: rejects; no fence is held.
        let admission = preflight::admit(&self.inner, &scope, &profile, session.as_ref()).await?;
        // §2.2 step 9: claim the fence; a conflict is returned unchanged.
        let (fence, publication) = match self.claim_fence(&scope, observer.as_deref()).await? {
            AcquireRuntimeFenceResult::Conflict { expires_at } => {
                tracing::debug!(step = "fence.acquire", work_id = %scope.work_id, "conflict");
                return Ok(ManagedRuntimeRunResult::Conflict { expires_at });
            }
            AcquireRuntimeFenceResult::Acquired { fence, publication } => (fence, publication),
        };
        let span = tracing::info_span!(
            "managed_runtime.run",
            work_id = %scope.work_id,
            generation = fence.generation,
        );
        let request = RunRequest {
            scope,
            profile,
            session,
            session_input_access,
            observer,
        };
        // Step 10: the run's state.
        let context = RunContext::new(
            Arc::clone(&self.inner),
            request,
            admission,
            fence,
            publication,
        );
        let _stop_tasks_if_dropped = context.abort_on_drop();
        async move {
            // Step 11: the caller's signal loses the lease.
            context.link_external_signal(signal);
            // Step 12: the heartbeat monitor, from acquire on.
            let monitor = monitor::start(&context);
            // §2.3 steps 13–36.
            let mut allocated = transaction::Allocated::default();
            let outcome = transaction::run(&context, &mut allocated).await;
            let result = settle(&context, outcome);
            // §2.4 cleanup; a persistence error rejects.
            cleanup::run(&context, allocated, monitor).await?;
            Ok(result)
        }
        .instrument(span)
        .await
    }

    /// Step 9. No fence is held yet, so there is no token to redact from a failure.
    async fn claim_fence(
        &self,
        scope: &RuntimeResourceScope,
        observer: Option<&dyn RunObserver>,
    ) -> Result<AcquireRuntimeFenceResult, PortError> {
        let deps = &self.inner.deps;
        let began = std::time::Instant::now();
        let result = deps
            .fences
            .acquire(AcquireRuntimeFenceInput {
                scope: scope.clone(),
                owner_id: deps.owner_id.clone(),
                ttl_ms: deps.lease_ttl_ms,
            })
            .await;
        if let Some(observer) = observer {
            let outcome = match &result {
                Ok(AcquireRuntimeFenceResult::Acquired { fence, publication }) => {
                    // The token leaves with the claim result only; the event never holds it.
                    StepOutcome::Done(StepFacts::FenceClaimed {
                        generation: fence.generation,
                        publication: publication.clone().map(Box::new),
                    })
                }
                Ok(AcquireRuntimeFenceResult::Conflict { expires_at }) => {
                    StepOutcome::Done(StepFacts::FenceConflict {
                        expires_at: expires_at.clone(),
                    })
                }
                Err(error) => StepOutcome::Failed(error.clone()),
            };
            observer.step(StepEvent {
                step: RunStep::FenceAcquire,
                elapsed: began.elapsed(),
                outcome,
            });
        }
        result
    }
}

/// The reference's `catch`: a failure after losing the lease is `lease_lost`; any other is
/// `failed` with the (redacted) error.
fn settle(
    context: &RunContext,
    outcome: Result<ManagedRuntimeRunResult, PortError>,
) -> ManagedRuntimeRunResult {
    match outcome {
        Ok(result) => result,
        Err(_) if context.lease_lost() => {
            tracing::debug!(step = "settle", "lease lost");
            ManagedRuntimeRunResult::LeaseLost
        }
        Err(error) => {
            context.set_cleanup_reason(TerminationReason::Failed);
            let error = context.redact(&error);
            tracing::warn!(%error, "managed runtime transaction failed");
            ManagedRuntimeRunResult::Failed { error }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_results_are_wire_compatible() {
        let cases = [
            (
                ManagedRuntimeRunResult::Completed { revision: 3 },
                r#"{"type":"completed","revision":3}"#,
            ),
            (
                ManagedRuntimeRunResult::Conflict { expires_at: None },
                r#"{"type":"conflict","expiresAt":null}"#,
            ),
            (
                ManagedRuntimeRunResult::Conflict {
                    expires_at: Some("2026-09-03T12:00:00.000Z".into()),
                },
                r#"{"type":"conflict","expiresAt":"2026-09-03T12:00:00.000Z"}"#,
            ),
            (
                ManagedRuntimeRunResult::LeaseLost,
                r#"{"type":"lease_lost"}"#,
            ),
            (
                ManagedRuntimeRunResult::Failed {
                    error: PortError::new("harness failed"),
                },
                r#"{"type":"failed","error":{"name":"Error","message":"harness failed"}}"#,
            ),
        ];
        for (result, json) in cases {
            assert_eq!(serde_json::to_string(&result).expect("serializes"), json);
            let parsed: ManagedRuntimeRunResult = serde_json::from_str(json).expect("parses");
            assert_eq!(parsed, result);
        }
    }
}
