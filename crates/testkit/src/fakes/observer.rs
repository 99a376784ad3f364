//! [`RecordingObserver`]: a run observer that keeps every step event, for asserting which
//! steps a run reported and that none of them carries the fence token.

use omabox_host::run_observer::{RunObserver, RunStep, StepEvent, StepOutcome};
use std::sync::Mutex;

/// Records the events of the runs it observes.
#[derive(Debug, Default)]
pub struct RecordingObserver {
    events: Mutex<Vec<StepEvent>>,
}

impl RecordingObserver {
    /// Every event so far.
    pub fn events(&self) -> Vec<StepEvent> {
        self.events.lock().expect("observer").clone()
    }

    /// The steps reported so far, in order.
    pub fn steps(&self) -> Vec<RunStep> {
        self.events().iter().map(|event| event.step).collect()
    }

    /// The error texts of the failed steps, in order.
    pub fn errors(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|event| match &event.outcome {
                StepOutcome::Failed(error) => Some(error.message().to_owned()),
                StepOutcome::Done(_) => None,
            })
            .collect()
    }

    /// Every event as text (`Debug`), for grepping.
    pub fn text(&self) -> String {
        format!("{:?}", self.events())
    }
}

impl RunObserver for RecordingObserver {
    fn step(&self, event: StepEvent) {
        self.events.lock().expect("observer").push(event);
    }
}
