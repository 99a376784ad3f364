//! Warm sessions (issue 31, the contract's `retained_runtime` idea on `omabox serve`): after
//! an agent turn the session's sandbox and its ACP agent stay up, so the session's next turn
//! on this host is one `session/prompt` on the live agent, still checkpointed and published
//! through the run queue by the host's fenced transaction.
//!
//! ```text
//!   cold turn ─ completed, agent alive ─► WarmSessions::keep(Kept)      (claim kept, renewed)
//!   next turn of the session ─► take ─► alive? same agent? ─► warm turn (ports: warm::ports)
//!                                          └ no ─► teardown ─► cold turn
//!   keeper, every second: idle past `serve_warm_ttl_ms` │ claim lost │ agent dead │
//!       MemAvailable below `serve_warm_min_available` (the least recently used) │
//!       a run of the session running elsewhere, seen on two passes ─► teardown
//!   more than `serve_warm_max` kept ─► the least recently used ─► teardown
//!   serve stopping (SIGTERM) ─► teardown of every kept runtime
//! ```
//!
//! Why the claim is kept: the agent read its session token from its environment at spawn,
//! and the token lives as long as its claim. So a kept runtime keeps its fence (renewed every
//! third of the lease ttl, the token extended with it): a run of the session on another host
//! gets `conflict` meanwhile, as it would during a turn; the warm turn re-acquires the same
//! claim (re-entrant, same generation: a fresh token is issued, the agent keeps using the
//! first until the runtime ends). A cold turn — after an eviction, on another host — claims
//! a new generation and rotates the token as before. Eviction releases the claim, so a cold
//! turn never waits for it. Many hosts on one run queue: when another host claimed the
//! session's next run (it then retries on `conflict`), the keeper sees that run `running`
//! while the runtime is still kept here (this host takes its runtime out within moments of
//! claiming a run of the session), and lets the runtime go on its second pass: the other
//! host's turn waits a second or two and runs cold, instead of waiting out the ttl.
//!
//! Crash safety: the kept sandbox's lease stays in the lease journal (its `terminate` never
//! ran) and its fence stops being renewed when serve dies, so `omabox reap` (or the next
//! run's sweep) reaps it once the fence expired, as a crashed run's.
//!
//! What this must never do: reuse a runtime for another session or agent, or across a
//! publication it did not make; keep a runtime whose turn failed; leave a runtime running
//! after serve stopped cleanly.

pub(crate) mod ports;
pub(crate) mod turn;

use crate::NodeConfig;
use crate::config::Key;
use crate::store_choice::ChosenStore;
use crate::wiring::Persistence;
use omabox_acp::LiveAcpAgent;
use omabox_contract::{
    ManagedRuntimeProviderDriverPort, ManagedRuntimeProviderResources, RenewRuntimeFenceResult,
    RunQueuePort, RunStatus, RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourceScope,
    TerminationReason,
};
use ports::Reused;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// `serve_warm_ttl_ms`'s default: five minutes.
pub const DEFAULT_TTL_MS: u64 = 5 * 60 * 1000;
/// `serve_warm_max`'s default.
pub const DEFAULT_MAX: u64 = 8;
/// `serve_warm_min_available`'s default: 512 MiB.
pub const DEFAULT_MIN_AVAILABLE: u64 = 512 << 20;

/// How often the keeper looks at the kept runtimes.
const TICK: Duration = Duration::from_secs(1);
/// The newest runs of a kept session the keeper looks at for one running elsewhere.
const RUNS_LOOKED_AT: usize = 4;

/// How warm sessions are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WarmSettings {
    /// How long a kept runtime waits for its session's next turn.
    pub ttl: Duration,
    /// How many runtimes are kept at most (0: none).
    pub max: usize,
    /// Below this much `MemAvailable`, the least recently used runtime is let go.
    pub min_available_bytes: u64,
}

impl WarmSettings {
    /// The settings of `config` (`serve_warm_*`).
    pub fn from_config(config: &NodeConfig) -> anyhow::Result<Self> {
        let min_available_bytes = match config.checked(Key::ServeWarmMinAvailable)? {
            Some(text) if text.trim() == "0" => 0,
            Some(text) => omabox_backend_linux::factory::parse_memory_size(text)
                .map_err(|error| anyhow::anyhow!("serve_warm_min_available: {error}"))?,
            None => DEFAULT_MIN_AVAILABLE,
        };
        Ok(Self {
            ttl: Duration::from_millis(
                config
                    .number(Key::ServeWarmTtlMs)?
                    .unwrap_or(DEFAULT_TTL_MS),
            ),
            max: usize::try_from(config.number(Key::ServeWarmMax)?.unwrap_or(DEFAULT_MAX))
                .unwrap_or(usize::MAX),
            min_available_bytes,
        })
    }

    fn enabled(&self) -> bool {
        self.max > 0 && !self.ttl.is_zero()
    }
}

/// A runtime kept after its session's turn (the module doc).
pub(crate) struct Kept {
    pub scope: RuntimeResourceScope,
    /// What a turn must match to reuse it (`turn::identity`): another agent's turn, or
    /// one in another Environment, is cold.
    pub identity: String,
    pub owner_id: String,
    pub lease_ttl_ms: u64,
    /// The claim, kept; renewed through `fences` (session tokens extended with it).
    pub fence: RuntimeResourceFence,
    pub fences: Arc<dyn RuntimeResourceFencePort>,
    /// The provider's ports of the runtime (the journaled sandbox), undecorated.
    pub driver: Arc<dyn ManagedRuntimeProviderDriverPort>,
    pub resources: ManagedRuntimeProviderResources,
    pub reused: Reused,
    pub agent: Arc<LiveAcpAgent>,
    pub store: ChosenStore,
    pub persistence: Persistence,
    pub token_slots: omabox_host::session_tokens::SessionTokenSlots,
    pub memory_stores: crate::session_inputs::DirMemoryStores,
    /// What must live as long as the agent (the in-process inference proxy it calls).
    pub guards: Vec<Box<dyn std::any::Any + Send + Sync>>,
    /// The revision its last turn published.
    pub revision: u64,
    pub last_used: Instant,
}

impl Kept {
    /// Ends the runtime: the agent, the sandbox, its bindings, then the claim (and its
    /// token). Failures are logged; a sandbox that could not be terminated stays in the
    /// lease journal for `omabox reap`.
    pub(crate) async fn teardown(self, why: &str) {
        tracing::info!(session = %self.scope.session_id, why, "ending a warm session's runtime");
        if let Ok(agent) = Arc::try_unwrap(self.agent) {
            agent.stop().await;
        }
        let reason = TerminationReason::Completed;
        let resources = &self.resources;
        if let Err(error) = resources
            .sandbox
            .terminate(&self.scope, &self.fence, &self.reused.lease, reason)
            .await
        {
            tracing::warn!(%error, "cannot terminate a warm session's sandbox; `omabox reap` will");
        }
        if let Some(outputs) = &self.reused.outputs {
            let _ = resources
                .outputs
                .release(&self.scope, &self.fence, outputs)
                .await;
        }
        let _ = resources
            .workspace
            .release(&self.scope, &self.fence, &self.reused.workspace)
            .await;
        if let Err(error) = self.fences.release(&self.fence, reason).await {
            tracing::warn!(%error, "cannot release a warm session's claim; it expires");
        }
        // The agent is gone: what it called (the inference proxy) may end now.
        drop(self.guards);
    }
}

/// The kept runtimes of this host (cheap to clone).
#[derive(Clone)]
pub struct WarmSessions {
    inner: Arc<Pool>,
}

struct Pool {
    settings: WarmSettings,
    kept: Mutex<HashMap<String, Kept>>,
    keeper: Mutex<Option<JoinHandle<()>>>,
    /// Set by `shutdown`: nothing is kept any more, and the keeper stops after its pass.
    stopping: AtomicBool,
    /// Teardowns of runtimes a newer one pushed out, run beside the turn that kept it (so
    /// its run ends without waiting for them); `shutdown` waits for them.
    teardowns: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for WarmSessions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WarmSessions")
            .field("settings", &self.inner.settings)
            .finish_non_exhaustive()
    }
}

impl WarmSessions {
    /// No kept runtime yet.
    pub fn new(settings: WarmSettings) -> Self {
        Self {
            inner: Arc::new(Pool {
                settings,
                kept: Mutex::new(HashMap::new()),
                keeper: Mutex::new(None),
                stopping: AtomicBool::new(false),
                teardowns: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Whether runtimes are kept at all.
    pub fn enabled(&self) -> bool {
        self.inner.settings.enabled()
    }

    fn kept(&self) -> MutexGuard<'_, HashMap<String, Kept>> {
        self.inner
            .kept
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How many runtimes are kept now.
    pub fn len(&self) -> usize {
        self.kept().len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The kept runtime of `scope`, taken out (its caller reuses or ends it).
    pub(crate) fn take(&self, scope: &RuntimeResourceScope) -> Option<Kept> {
        self.kept().remove(&scope.key())
    }

    /// Ends the kept runtime of `scope`, if any (before a cold run of the session: its
    /// claim is released, so the run does not wait for it).
    pub async fn evict(&self, scope: &RuntimeResourceScope, why: &str) {
        if let Some(kept) = self.take(scope) {
            kept.teardown(why).await;
        }
    }

    /// Keeps `kept` for its session's next turn; the least recently used one goes when
    /// more than `serve_warm_max` would be kept.
    pub(crate) async fn keep(&self, mut kept: Kept) {
        if !self.enabled() || self.inner.stopping.load(Ordering::SeqCst) {
            kept.teardown("warm sessions are off").await;
            return;
        }
        kept.last_used = Instant::now();
        let mut ended = Vec::new();
        {
            let mut map = self.kept();
            if let Some(old) = map.insert(kept.scope.key(), kept) {
                ended.push(old);
            }
            while map.len() > self.inner.settings.max {
                let Some(oldest) = least_recently_used(&map) else {
                    break;
                };
                if let Some(old) = map.remove(&oldest) {
                    ended.push(old);
                }
            }
        }
        if !ended.is_empty() {
            let mut teardowns = self
                .inner
                .teardowns
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            teardowns.retain(|task| !task.is_finished());
            for old in ended {
                teardowns.push(tokio::spawn(
                    old.teardown("more warm sessions than serve_warm_max"),
                ));
            }
        }
        self.start_keeper();
    }

    fn start_keeper(&self) {
        let mut keeper = self
            .inner
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if keeper.as_ref().is_some_and(|task| !task.is_finished()) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        *keeper = Some(tokio::spawn(async move {
            let mut passes = Passes::default();
            loop {
                tokio::time::sleep(TICK).await;
                let Some(inner) = weak.upgrade() else { return };
                if inner.stopping.load(Ordering::SeqCst) {
                    return;
                }
                let pool = WarmSessions { inner };
                pool.tick(&mut passes).await;
            }
        }));
    }

    /// One pass of the keeper (module doc).
    async fn tick(&self, passes: &mut Passes) {
        let Passes { renewed, contested } = passes;
        let now = Instant::now();
        let settings = self.inner.settings;
        let mut ended: Vec<(Kept, &'static str)> = Vec::new();
        let mut renew = Vec::new();
        let mut watch: Vec<(String, String, Arc<dyn RunQueuePort>)> = Vec::new();
        {
            let mut map = self.kept();
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let Some(kept) = map.get(&key) else { continue };
                let why = if now.duration_since(kept.last_used) >= settings.ttl {
                    Some("idle past serve_warm_ttl_ms")
                } else if !kept.agent.is_alive() {
                    Some("its agent exited")
                } else {
                    None
                };
                if let Some(why) = why {
                    if let Some(kept) = map.remove(&key) {
                        ended.push((kept, why));
                    }
                    continue;
                }
                watch.push((
                    key.clone(),
                    kept.scope.session_id.clone(),
                    kept.store.runs(),
                ));
                let every = Duration::from_millis((kept.lease_ttl_ms / 3).max(50));
                if renewed
                    .get(&key)
                    .is_none_or(|at| now.duration_since(*at) >= every)
                {
                    renew.push((
                        key.clone(),
                        Arc::clone(&kept.fences),
                        kept.fence.clone(),
                        kept.lease_ttl_ms,
                    ));
                }
            }
            if settings.min_available_bytes > 0
                && !map.is_empty()
                && mem_available().is_some_and(|bytes| bytes < settings.min_available_bytes)
                && let Some(oldest) = least_recently_used(&map)
                && let Some(kept) = map.remove(&oldest)
            {
                ended.push((kept, "MemAvailable below serve_warm_min_available"));
            }
            renewed.retain(|key, _| map.contains_key(key));
            contested.retain(|key| map.contains_key(key));
        }
        for (key, fences, fence, ttl_ms) in renew {
            match fences.renew(&fence, ttl_ms).await {
                Ok(RenewRuntimeFenceResult::Renewed { .. }) => {
                    renewed.insert(key, now);
                }
                Ok(_) => {
                    // Lost (expired, taken over): the runtime cannot publish any more.
                    if let Some(kept) = self.kept().remove(&key) {
                        ended.push((kept, "its claim was lost"));
                    }
                }
                // A store hiccup: the next tick tries again before the claim expires.
                Err(error) => tracing::warn!(%error, "cannot renew a warm session's claim"),
            }
        }
        for (key, session, runs) in watch {
            let elsewhere = match runs.session_runs(&session, None, RUNS_LOOKED_AT).await {
                Ok(page) => page.runs.iter().any(|run| run.status == RunStatus::Running),
                Err(error) => {
                    tracing::warn!(%error, "cannot look at a warm session's runs");
                    false
                }
            };
            if !elsewhere {
                contested.remove(&key);
            } else if !contested.insert(key.clone())
                && let Some(kept) = self.kept().remove(&key)
            {
                // Running on two passes while kept here: another host claimed it.
                contested.remove(&key);
                ended.push((kept, "another host claimed a run of its session"));
            }
        }
        for (kept, why) in ended {
            kept.teardown(why).await;
        }
    }

    /// Ends every kept runtime (serve stopping). The keeper finishes its pass first (never
    /// cancelled half-way through a teardown).
    pub async fn shutdown(&self) {
        self.inner.stopping.store(true, Ordering::SeqCst);
        let keeper = self
            .inner
            .keeper
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(keeper) = keeper {
            let _ = keeper.await;
        }
        let teardowns: Vec<JoinHandle<()>> = self
            .inner
            .teardowns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
            .collect();
        for teardown in teardowns {
            let _ = teardown.await;
        }
        let all: Vec<Kept> = self.kept().drain().map(|(_, kept)| kept).collect();
        for kept in all {
            kept.teardown("omabox serve is stopping").await;
        }
    }
}

/// What the keeper remembers between its passes.
#[derive(Default)]
struct Passes {
    /// When each kept claim was last renewed.
    renewed: HashMap<String, Instant>,
    /// Kept sessions whose run was seen running elsewhere on the last pass.
    contested: HashSet<String>,
}

fn least_recently_used(map: &HashMap<String, Kept>) -> Option<String> {
    map.iter()
        .min_by_key(|(_, kept)| kept.last_used)
        .map(|(key, _)| key.clone())
}

/// `MemAvailable` of `/proc/meminfo` in bytes (`None` where it cannot be read).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_mem_available(&text)
}

fn parse_mem_available(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_available_is_read_in_bytes() {
        let meminfo =
            "MemTotal:       16303412 kB\nMemFree:  1000 kB\nMemAvailable:   10950148 kB\n";
        assert_eq!(parse_mem_available(meminfo), Some(10_950_148 * 1024));
        assert_eq!(parse_mem_available("MemTotal: 1 kB\n"), None);
    }
}
