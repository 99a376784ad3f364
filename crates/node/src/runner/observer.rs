//! What a run reports while it goes, and to whom: the runner never writes to a terminal.
//! `omabox run` draws the timeline, bars, spinners and lines on its terminal; `omabox serve`
//! will hand the same events to a work item's client.

use crate::agent_cache::InstallObserver;
use omabox_acp::AcpEventSink;
use omabox_backend_linux::image::PullProgress;
use omabox_host::run_observer::RunObserver;
use omabox_persistence::ProgressObserver;
use omabox_sandbox::managed::HarnessOutputSink;
use std::sync::Arc;

/// What the runner tells its caller besides the transaction's steps.
pub trait RunNotices: Send + Sync {
    /// A line for the operator: a warning (`omabox: warning: …`) or a note.
    fn line(&self, line: &str);
    /// Where an agent install (`--agent`, first use) shows its progress.
    fn install(&self) -> &dyn InstallObserver;
    /// Where a registry pull of the run's image shows its progress (a fresh one per pull).
    fn pull(&self) -> Box<dyn PullProgress + Send + Sync>;
    /// What this node needed first is ready (proxy, agent, image, leftovers swept): the
    /// run's own setup (persistence, restore, driver) and then its transaction follow.
    fn prepared(&self);
    /// Everything is ready and the work item's transaction starts now (`owner_id`: the
    /// fence owner); a run that fails before never says this.
    fn starting(&self, owner_id: &str);
}

/// Everything a run reports to.
#[derive(Clone)]
pub struct RunObservers {
    /// The transaction's steps, in order, with their facts (after redaction).
    pub steps: Arc<dyn RunObserver>,
    /// Restore, checkpoint and export progress.
    pub progress: Option<Arc<dyn ProgressObserver>>,
    /// The harness's stdout and stderr.
    pub harness_output: Arc<dyn HarnessOutputSink>,
    /// An ACP harness's events.
    pub acp_events: Option<Arc<dyn AcpEventSink>>,
    /// Lines, installs, pulls and the start.
    pub notices: Arc<dyn RunNotices>,
}

impl std::fmt::Debug for RunObservers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunObservers").finish_non_exhaustive()
    }
}
