//! The runner's two sides of a warm session: a cold turn that may keep its runtime
//! ([`Keeping`]) and a warm turn on a kept one ([`run`]). Both run the host's
//! `WorkItemRunner` — the same fenced transaction, observers and publication through the
//! run queue as any run — over the decorators of [`super::ports`].

use super::ports::{Agent, Capture, KeepingDriver, KeepingFence, Reused};
use super::{Kept, WarmSessions};
use crate::runner::{RunObservers, RunOutcome, RunRequest};
use crate::session_inputs::{DirMemoryStores, MemoryCommitFence};
use crate::store_choice::ChosenStore;
use crate::wiring::{Backend, Persistence};
use anyhow::Context as _;
use omabox_acp::{AcpAgentSlot, WarmAcpHarness};
use omabox_contract::{
    AbortSignal, ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderResources, PortError,
    RuntimeResourceFencePort, RuntimeResourceScope, SandboxHeartbeatResult,
};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_host::session_tokens::{SessionTokenFence, SessionTokenSlots};
use omabox_host::work_item::{WorkItemPolicy, WorkItemPorts, WorkItemRunner};
use std::sync::Arc;
use std::time::Instant;

/// What a run must match to be a warm session's turn, or `None` when it may not run warm:
/// a queued (`omabox serve`) agent turn on the linux backend without credentials, Session
/// resources, seed or chosen revision. Two turns of one identity run the same agent in the
/// same Environment through the same gateway. Held in memory only (the gateway URL may
/// carry a secret): never logged.
pub(crate) fn identity(request: &RunRequest) -> Option<String> {
    let acp = request.acp.as_ref()?;
    let agent = acp.install?;
    let plain = request.queued.is_some()
        && request.backend == Backend::Linux
        && request.credentials.is_empty()
        && request.session_inputs.resources.is_empty()
        && request.workspace_seed.is_none()
        && request.from_revision.is_none()
        && acp.inference_config.is_none();
    plain.then(|| {
        format!(
            "{}\n{:?}\n{:?}\n{:?}\n{:?}",
            agent.name,
            request.environment,
            request.inference_gateway,
            request.profile,
            acp.turn.permission
        )
    })
}

impl WarmSessions {
    /// The kept runtime of `scope` when a run of `identity` may take its next turn on it;
    /// any other kept runtime of the session is ended first (a command run, another agent, a
    /// dead agent: the run is cold and must not wait for the kept claim).
    pub(crate) async fn reusable(
        &self,
        scope: &RuntimeResourceScope,
        identity: Option<&str>,
    ) -> Option<Kept> {
        let kept = self.take(scope)?;
        let why = if identity != Some(kept.identity.as_str()) {
            "a run the warm runtime cannot take (command, other agent or settings)"
        } else if !kept.agent.is_alive() {
            "its agent exited"
        } else if !sandbox_alive(&kept).await {
            "its sandbox is gone"
        } else {
            return Some(kept);
        };
        kept.teardown(why).await;
        None
    }
}

/// Whether the kept sandbox is still there (one heartbeat): a sandbox killed from outside
/// between turns makes the next turn cold rather than failed.
async fn sandbox_alive(kept: &Kept) -> bool {
    matches!(
        kept.resources
            .sandbox
            .heartbeat(&kept.scope, &kept.fence, &kept.reused.lease)
            .await,
        Ok(SandboxHeartbeatResult::Alive)
    )
}

/// A cold turn that may keep its runtime.
pub(crate) struct Keeping {
    capture: Arc<Capture>,
    driver: Arc<dyn ManagedRuntimeProviderDriverPort>,
    /// The fence chain under [`KeepingFence`] (session tokens included): what the kept
    /// claim is renewed and released through.
    fences: Arc<dyn RuntimeResourceFencePort>,
    slot: Arc<AcpAgentSlot>,
    owner_id: String,
    lease_ttl_ms: u64,
}

/// What a cold turn hands over at its end.
pub(crate) struct Finished<'a> {
    pub scope: RuntimeResourceScope,
    pub identity: String,
    pub result: &'a Result<ManagedRuntimeRunResult, PortError>,
    pub store: ChosenStore,
    pub persistence: Persistence,
    pub token_slots: SessionTokenSlots,
    pub memory_stores: DirMemoryStores,
    pub guards: Vec<Box<dyn std::any::Any + Send + Sync>>,
}

impl Keeping {
    /// Decorates a cold turn's `driver` and `fences` (its queue publication among them).
    pub(crate) fn new(
        policy: &WorkItemPolicy,
        store: &ChosenStore,
        persistence: &Persistence,
        token_slots: &SessionTokenSlots,
        slot: Arc<AcpAgentSlot>,
        driver: Arc<dyn ManagedRuntimeProviderDriverPort>,
        fences: Arc<dyn RuntimeResourceFencePort>,
    ) -> Self {
        let capture = Capture::new(
            None,
            Agent::Slot(Arc::clone(&slot)),
            Arc::clone(&persistence.outputs),
        );
        let fences = Arc::new(
            SessionTokenFence::new(fences, store.tokens(), Arc::new(token_slots.clone()))
                .with_ttl_ms(policy.session_token_ttl_ms),
        );
        Self {
            capture,
            driver,
            fences,
            slot,
            owner_id: policy.owner_id.clone(),
            lease_ttl_ms: policy.lease_ttl_ms,
        }
    }

    /// The ports of the turn: the journal and the session tokens are composed here (inside
    /// the keeping decorators), not by the host.
    pub(crate) fn ports(&self, store: &ChosenStore) -> WorkItemPorts {
        WorkItemPorts {
            driver: Arc::new(KeepingDriver {
                inner: Arc::clone(&self.driver),
                resources: None,
                journal: store.journal(),
                capture: Arc::clone(&self.capture),
            }),
            fences: Arc::new(KeepingFence {
                inner: Arc::clone(&self.fences),
                capture: Arc::clone(&self.capture),
            }),
            orphans: store.orphans(),
            lease_journal: None,
            session_tokens: None,
        }
    }

    /// Keeps the runtime when the turn left it (completed, agent alive), else makes sure
    /// no agent is left running.
    pub(crate) async fn finish(self, warm: &WarmSessions, finished: Finished<'_>) {
        let agent = self.slot.take();
        let kept = {
            let mut state = self.capture.state();
            match (
                state.kept,
                state.resources.take(),
                state.lease.take(),
                state.workspace.take(),
                state.fence.take(),
                finished.result,
            ) {
                (
                    true,
                    Some(resources),
                    Some(lease),
                    Some(workspace),
                    Some(fence),
                    Ok(ManagedRuntimeRunResult::Completed { revision }),
                ) => Some((
                    resources,
                    lease,
                    workspace,
                    state.outputs.take(),
                    fence,
                    *revision,
                )),
                _ => None,
            }
        };
        let Some(agent) = agent else { return };
        let Some((resources, lease, workspace, outputs, fence, revision)) = kept else {
            agent.stop().await;
            return;
        };
        warm.keep(Kept {
            scope: finished.scope,
            identity: finished.identity,
            owner_id: self.owner_id,
            lease_ttl_ms: self.lease_ttl_ms,
            fence,
            fences: self.fences,
            driver: self.driver,
            resources,
            reused: Reused {
                lease,
                workspace,
                outputs,
                turn: String::new(),
            },
            agent: Arc::new(agent),
            store: finished.store,
            persistence: finished.persistence,
            token_slots: finished.token_slots,
            memory_stores: finished.memory_stores,
            guards: finished.guards,
            revision,
            last_used: Instant::now(),
        })
        .await;
    }
}

/// A warm turn: `request`'s prompt on `kept`'s live agent, through the fenced transaction
/// (the same claim re-acquired, the kept sandbox and bindings reused, the workspace
/// checkpointed incrementally and published through the queue). The runtime is kept again
/// when the turn completed, else ended. `None` when the turn failed only because the agent
/// was gone (it died between turns unseen): nothing was published and the claim is
/// released, so the caller runs the turn cold.
pub(crate) async fn run(
    warm: &WarmSessions,
    kept: Kept,
    request: RunRequest,
    observers: RunObservers,
    signal: AbortSignal,
) -> anyhow::Result<Option<RunOutcome>> {
    let notices = Arc::clone(&observers.notices);
    let Some(acp) = request.acp else {
        kept.teardown("not an agent turn").await;
        anyhow::bail!("a warm session takes agent turns only");
    };
    notices.prepared();
    // As a cold run: a collection waits for this turn's publication, and it for one.
    let blobs = Arc::clone(kept.persistence.workspace.store());
    let warn_to = Arc::clone(&notices);
    let writer = tokio::task::spawn_blocking(move || {
        blobs.hold_as_writer(|| {
            warn_to
                .line("omabox serve: waiting for `omabox gc` to finish collecting the blob store");
        })
    })
    .await
    .context("the blob store lock task failed")
    .and_then(|held| held.context("cannot lock the blob store for this run"));
    let _writer = match writer {
        Ok(writer) => writer,
        Err(error) => {
            kept.teardown("its turn could not start").await;
            return Err(error);
        }
    };
    // This turn's own checkpoint key (ports::Reused::turn).
    let turn = match &request.queued {
        Some(queued) => format!("{}:{}", queued.claim.run_id, queued.claim.attempt),
        None => format!("turn-{:016x}", rand::random::<u64>()),
    };
    let capture = Capture::new(
        Some(Reused {
            turn,
            ..kept.reused.clone()
        }),
        Agent::Live(Arc::clone(&kept.agent)),
        Arc::clone(&kept.persistence.outputs),
    );
    let harness = WarmAcpHarness::new(
        Arc::clone(&kept.agent),
        acp.turn.clone(),
        observers.acp_events.clone(),
    );
    let resources = ManagedRuntimeProviderResources {
        harness_driver: Arc::new(harness),
        ..kept.resources.clone()
    };
    let policy = WorkItemPolicy::new(kept.owner_id.clone(), Some(kept.lease_ttl_ms));
    let publishing: Arc<dyn RuntimeResourceFencePort> = Arc::new(
        MemoryCommitFence::new(&kept.store, kept.memory_stores.stage())
            .publishing_through(request.queued),
    );
    let tokened: Arc<dyn RuntimeResourceFencePort> = Arc::new(
        SessionTokenFence::new(
            publishing,
            kept.store.tokens(),
            Arc::new(kept.token_slots.clone()),
        )
        .with_ttl_ms(policy.session_token_ttl_ms),
    );
    let runner = WorkItemRunner::new(
        policy,
        WorkItemPorts {
            driver: Arc::new(KeepingDriver {
                inner: Arc::clone(&kept.driver),
                resources: Some(resources),
                journal: kept.store.journal(),
                capture: Arc::clone(&capture),
            }),
            fences: Arc::new(KeepingFence {
                inner: tokened,
                capture: Arc::clone(&capture),
            }),
            orphans: kept.store.orphans(),
            lease_journal: None,
            session_tokens: None,
        },
    );
    let runner = match runner {
        Ok(runner) => runner,
        Err(error) => {
            kept.teardown("its turn could not start").await;
            return Err(error.into());
        }
    };
    let mut input = ManagedRuntimeRunInput::new(request.scope.clone(), request.profile.clone());
    input.signal = Some(signal);
    input.observer = Some(Arc::clone(&observers.steps));
    notices.starting(&kept.owner_id);
    notices.line(&format!(
        "warm session: the prompt goes to the running agent (ACP session {}, revision {})",
        kept.agent.session_id(),
        kept.revision
    ));
    let result = runner.run(input).await;
    drop(runner);
    let (kept_again, fence) = {
        let mut state = capture.state();
        (state.kept, state.fence.take())
    };
    drop(capture);
    let outcome_store = kept.store.clone();
    let outcome_persistence = kept.persistence.clone();
    let owner_id = kept.owner_id.clone();
    let lost =
        kept.agent.was_lost() && matches!(&result, Ok(ManagedRuntimeRunResult::Failed { .. }));
    match (&result, kept_again, fence) {
        (Ok(ManagedRuntimeRunResult::Completed { revision }), true, Some(fence)) => {
            let revision = *revision;
            warm.keep(Kept {
                fence,
                revision,
                last_used: Instant::now(),
                ..kept
            })
            .await;
        }
        // Not kept: the transaction's cleanup released what it reached; the rest (all of
        // it when the claim was not re-acquired) ends here. Terminate and release are
        // idempotent.
        _ => kept.teardown("its warm turn did not complete").await,
    }
    if lost {
        notices.line("warm session: the agent was gone; the turn runs cold");
        return Ok(None);
    }
    Ok(Some(RunOutcome::warm(
        owner_id,
        result,
        request.scope,
        outcome_store,
        outcome_persistence,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runner::QueuedRun;
    use omabox_contract::RunClaim;
    use omabox_proxy::runs::RunSpec;

    fn request(spec: &str, queued: bool) -> RunRequest {
        let env: crate::config::Environment = [("HOME", "/nonexistent")].into_iter().collect();
        let config = crate::NodeConfig::from_sources(&crate::config::Flags::new(), env).unwrap();
        let spec: RunSpec = serde_json::from_str(spec).unwrap();
        let queued = queued.then(|| QueuedRun {
            queue: Arc::new(omabox_store::MemoryRunQueue::new(Arc::new(
                omabox_store::MemoryFenceStore::new(),
            ))),
            claim: RunClaim {
                run_id: "run_1".into(),
                host_id: "h".into(),
                attempt: 1,
            },
        });
        crate::runs::spec::request(&spec, "s1", &config, queued).unwrap()
    }

    #[test]
    fn only_plain_queued_agent_turns_may_run_warm() {
        let claude = request(r#"{"agent": "claude", "prompt": "hi"}"#, true);
        let again = request(r#"{"agent": "claude", "prompt": "something else"}"#, true);
        // The prompt is the turn's, not the runtime's: the two turns share a runtime.
        assert_eq!(identity(&claude), identity(&again));
        assert!(identity(&claude).is_some());
        let codex = request(r#"{"agent": "codex", "prompt": "hi"}"#, true);
        assert_ne!(identity(&claude), identity(&codex));
        let networked = request(
            r#"{"agent": "claude", "prompt": "hi", "environment": {"networking": {"type": "unrestricted"}}}"#,
            true,
        );
        assert_ne!(identity(&claude), identity(&networked));
        // Not warm: `omabox run` (not queued), commands, credentials.
        assert_eq!(
            identity(&request(r#"{"agent": "claude", "prompt": "hi"}"#, false)),
            None
        );
        assert_eq!(identity(&request(r#"{"command": ["true"]}"#, true)), None);
        let credentials = request(
            r#"{"agent": "claude", "prompt": "hi", "credentials": ["api.example.com=tok"]}"#,
            true,
        );
        assert_eq!(identity(&credentials), None);
    }
}
