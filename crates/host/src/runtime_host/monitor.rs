//! The heartbeat monitor (reference §2.2 step 12).
//!
//! Fence ownership starts at acquire, not when the sandbox becomes runnable: restore, mounts
//! and provider allocation may each take longer than one TTL, so the fence is renewed
//! throughout the whole resource transaction; the sandbox heartbeat joins once a lease exists.
//!
//! Loop until the internal signal aborts: `sleep(heartbeatIntervalMs)` → renew the fence
//! (`lost` → `loseLease("Runtime resource fence lost")`) → adopt the renewed fence → heartbeat
//! the sandbox if a lease exists (`lost` → `loseLease("Sandbox lease lost")`). Any error while
//! the run is still live (a rejected sleep, a failing renew or heartbeat) becomes
//! `loseLease("Runtime heartbeat failed: <error>")`. The monitor never fails the run itself;
//! it only turns loss into cancellation, which the transaction observes.

use super::state::RunContext;
use crate::run_observer::{RunStep, StepFacts};
use omabox_contract::{PortError, RenewRuntimeFenceResult, SandboxHeartbeatResult};
use std::sync::Arc;
use std::time::Instant;
use tokio::task::JoinHandle;

const FENCE_LOST: &str = "Runtime resource fence lost";
const SANDBOX_LOST: &str = "Sandbox lease lost";

/// Starts the monitor; cleanup step 5 awaits the handle.
pub(super) fn start(context: &Arc<RunContext>) -> JoinHandle<()> {
    let context = Arc::clone(context);
    tokio::spawn(async move {
        if let Err(error) = heartbeat_loop(&context).await
            && !context.is_aborted()
        {
            // The reason becomes the abort reason every port sees: never the token.
            let error = context.redact(&error);
            let reason = format!("Runtime heartbeat failed: {}", js_string(&error));
            tracing::warn!(
                %error,
                generation = context.generation(),
                "managed runtime heartbeat failed"
            );
            context.lose_lease(&reason);
        }
    })
}

async fn heartbeat_loop(context: &RunContext) -> Result<(), PortError> {
    let host = &context.host;
    while !context.is_aborted() {
        host.scheduler
            .sleep(host.deps.heartbeat_interval_ms, context.signal())
            .await?;
        if context.is_aborted() {
            return Ok(());
        }
        let began = Instant::now();
        let renewed = host
            .deps
            .fences
            .renew(&context.fence(), host.deps.lease_ttl_ms)
            .await;
        context.observe(
            RunStep::FenceRenew,
            began,
            &renewed,
            |renewed| match renewed {
                RenewRuntimeFenceResult::Lost => StepFacts::Lost,
                RenewRuntimeFenceResult::Renewed { .. } => StepFacts::Nothing,
            },
        );
        let renewed = renewed?;
        match renewed {
            RenewRuntimeFenceResult::Lost => {
                context.lose_lease(FENCE_LOST);
                return Ok(());
            }
            RenewRuntimeFenceResult::Renewed { fence } => {
                tracing::trace!(
                    generation = fence.generation,
                    "managed runtime fence renewed"
                );
                context.set_fence(fence);
            }
        }
        let Some(lease) = context.sandbox_lease() else {
            continue;
        };
        let began = Instant::now();
        let heartbeat = host
            .deps
            .sandbox
            .heartbeat(&context.scope, &context.fence(), &lease)
            .await;
        context.observe(
            RunStep::SandboxHeartbeat,
            began,
            &heartbeat,
            |beat| match beat {
                SandboxHeartbeatResult::Lost => StepFacts::Lost,
                SandboxHeartbeatResult::Alive => StepFacts::Nothing,
            },
        );
        let heartbeat = heartbeat?;
        if heartbeat == SandboxHeartbeatResult::Lost {
            context.lose_lease(SANDBOX_LOST);
            return Ok(());
        }
    }
    Ok(())
}

/// JavaScript's `String(error)` of an `Error`: `"<name>: <message>"`.
fn js_string(error: &PortError) -> String {
    format!("{}: {}", error.kind().class_name(), error.message())
}
