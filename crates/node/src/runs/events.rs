//! A queued run's timeline: the runner's observers as JSON events appended to the run
//! queue (`{"type": "step" | "output" | "notice" | "acp" | "prepared" | "started", …}`),
//! through a bounded channel and one writer task, so an observer never waits on the store.
//! When the writer falls behind, events are dropped; the store keeps at most
//! `MAX_RUN_EVENTS` per run anyway. Every text is redacted against the run's credentials.

use super::spec::redact;
use crate::agent_cache::InstallObserver;
use crate::runner::{RunNotices, RunObservers};
use omabox_acp::{AcpEvent, AcpEventSink};
use omabox_backend_linux::image::PullProgress;
use omabox_contract::{RunClaim, RunQueuePort};
use omabox_host::run_observer::{RunObserver, StepEvent, StepFacts, StepOutcome};
use omabox_proxy::runs::RunSpec;
use omabox_sandbox::managed::{HarnessOutputSink, HarnessStream};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::mpsc;

/// Events waiting for the writer, at most.
const BACKLOG: usize = 512;
/// Bytes of harness output one event carries, at most.
const OUTPUT_CHUNK: usize = 4 * 1024;

/// The event writer of one run.
pub(super) struct EventLog {
    sender: Mutex<Option<mpsc::Sender<String>>>,
    writer: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl EventLog {
    /// Starts the writer appending to `claim`'s run.
    pub(super) fn start(queue: Arc<dyn RunQueuePort>, claim: RunClaim) -> Arc<Self> {
        let (sender, mut receiver) = mpsc::channel::<String>(BACKLOG);
        let writer = tokio::spawn(async move {
            while let Some(text) = receiver.recv().await {
                match queue.append_event(&claim, &text).await {
                    Ok(true) => {}
                    // The claim is gone: nothing more of this run is kept.
                    Ok(false) => return,
                    Err(error) => tracing::warn!(%error, "cannot store a run event"),
                }
            }
        });
        Arc::new(Self {
            sender: Mutex::new(Some(sender)),
            writer: Mutex::new(Some(writer)),
        })
    }

    fn send(&self, event: Value) {
        let guard = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = guard.as_ref() {
            // Full: dropped rather than waited for (module doc).
            let _ = sender.try_send(event.to_string());
        }
    }

    /// A notice line of the worker itself.
    pub(super) fn line(&self, text: &str) {
        self.send(json!({ "type": "notice", "text": text }));
    }

    /// Stops taking events and waits until the stored ones are written.
    pub(super) async fn close(&self) {
        drop(
            self.sender
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(writer) = writer {
            let _ = writer.await;
        }
    }

    /// The runner's observers for one attempt of the run of `spec`.
    pub(super) fn observers(self: &Arc<Self>, spec: &RunSpec) -> RunObservers {
        let sink = Arc::new(Sink {
            log: Arc::clone(self),
            spec: spec.clone(),
        });
        RunObservers {
            steps: Arc::clone(&sink) as _,
            progress: None,
            harness_output: Arc::clone(&sink) as _,
            acp_events: Some(Arc::clone(&sink) as _),
            notices: sink,
        }
    }
}

/// Every observer of a run, writing to its [`EventLog`].
struct Sink {
    log: Arc<EventLog>,
    spec: RunSpec,
}

impl Sink {
    fn text(&self, text: &str) -> String {
        redact(&self.spec, text)
    }
}

impl RunObserver for Sink {
    fn step(&self, event: StepEvent) {
        let mut value = json!({
            "type": "step",
            "step": event.step.name(),
            "ms": u64::try_from(event.elapsed.as_millis()).unwrap_or(u64::MAX),
        });
        match &event.outcome {
            StepOutcome::Done(StepFacts::Published { revision }) => {
                value["ok"] = json!(true);
                value["revision"] = json!(revision);
            }
            StepOutcome::Done(StepFacts::Lost) => value["ok"] = json!(false),
            StepOutcome::Done(_) => value["ok"] = json!(true),
            StepOutcome::Failed(error) => {
                value["ok"] = json!(false);
                value["error"] = json!(self.text(&error.to_string()));
            }
        }
        self.log.send(value);
    }
}

impl HarnessOutputSink for Sink {
    fn output(&self, stream: HarnessStream, bytes: &[u8]) {
        let stream = match stream {
            HarnessStream::Stdout => "stdout",
            HarnessStream::Stderr => "stderr",
        };
        for chunk in bytes.chunks(OUTPUT_CHUNK) {
            let text = self.text(&String::from_utf8_lossy(chunk));
            self.log
                .send(json!({ "type": "output", "stream": stream, "text": text }));
        }
    }
}

impl AcpEventSink for Sink {
    fn event(&self, event: &AcpEvent) {
        let text = serde_json::to_string(event).unwrap_or_default();
        self.log
            .send(json!({ "type": "acp", "event": self.text(&text) }));
    }
}

impl InstallObserver for Sink {
    fn started(&self, message: &str) {
        RunNotices::line(self, message);
    }
    fn ended(&self) {}
    fn line(&self, line: &str) {
        RunNotices::line(self, line);
    }
}

impl RunNotices for Sink {
    fn line(&self, line: &str) {
        self.log
            .send(json!({ "type": "notice", "text": self.text(line) }));
    }

    fn install(&self) -> &dyn InstallObserver {
        self
    }

    fn pull(&self) -> Box<dyn PullProgress + Send + Sync> {
        Box::new(omabox_backend_linux::image::NoProgress)
    }

    fn prepared(&self) {
        self.log.send(json!({ "type": "prepared" }));
    }

    fn starting(&self, _owner_id: &str) {
        self.log.send(json!({ "type": "started" }));
    }
}
