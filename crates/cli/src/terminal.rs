//! What `omabox run` draws on the terminal besides the timeline: the harness's own output
//! as it arrives, and progress bars for long restores and checkpoints.
//!
//! - [`TerminalHarnessOutput`] streams harness stdout/stderr. In human mode each line is
//!   indented under the timeline (`│ `), stdout to stdout and stderr to stderr; in `--json`
//!   mode both go to stderr unchanged, so stdout stays one JSON document.
//! - [`ProgressBars`] draws an `indicatif` bar on stderr for a restore, checkpoint, seed or
//!   export large enough to take a while, and only when stderr is a terminal.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use omabox_persistence::{Progress, ProgressObserver, ProgressPhase};
use omabox_sandbox::managed::{HarnessOutputSink, HarnessStream};
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The indent of harness output under the timeline.
const HARNESS_PREFIX: &str = "           │ ";

/// Streams harness output to the terminal (see the module doc).
#[derive(Debug)]
pub struct TerminalHarnessOutput {
    json: bool,
    /// Unfinished last lines of stdout and stderr (human mode only).
    partial: Mutex<[Vec<u8>; 2]>,
}

impl TerminalHarnessOutput {
    /// `json`: everything raw to stderr.
    pub fn new(json: bool) -> Self {
        Self {
            json,
            partial: Mutex::new([Vec::new(), Vec::new()]),
        }
    }

    fn partial(&self) -> MutexGuard<'_, [Vec<u8>; 2]> {
        self.partial.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes out unfinished lines (call when the harness has ended).
    pub fn flush(&self) {
        let mut partial = self.partial();
        for (index, stream) in [HarnessStream::Stdout, HarnessStream::Stderr]
            .into_iter()
            .enumerate()
        {
            if !partial[index].is_empty() {
                let mut line = std::mem::take(&mut partial[index]);
                line.push(b'\n');
                write_prefixed(stream, &line);
            }
        }
    }
}

fn write_raw(stream: HarnessStream, bytes: &[u8]) {
    let _ = match stream {
        HarnessStream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(bytes).and_then(|()| out.flush())
        }
        HarnessStream::Stderr => {
            let mut err = std::io::stderr().lock();
            err.write_all(bytes).and_then(|()| err.flush())
        }
    };
}

/// Writes complete lines, each behind the harness prefix.
fn write_prefixed(stream: HarnessStream, lines: &[u8]) {
    let mut text = Vec::with_capacity(lines.len() + 16);
    for line in lines.split_inclusive(|byte| *byte == b'\n') {
        text.extend_from_slice(HARNESS_PREFIX.as_bytes());
        text.extend_from_slice(line);
    }
    write_raw(stream, &text);
}

impl HarnessOutputSink for TerminalHarnessOutput {
    fn output(&self, stream: HarnessStream, bytes: &[u8]) {
        if self.json {
            write_raw(HarnessStream::Stderr, bytes);
            return;
        }
        let index = match stream {
            HarnessStream::Stdout => 0,
            HarnessStream::Stderr => 1,
        };
        let mut partial = self.partial();
        let buffer = &mut partial[index];
        buffer.extend_from_slice(bytes);
        if let Some(end) = buffer.iter().rposition(|byte| *byte == b'\n') {
            let complete: Vec<u8> = buffer.drain(..=end).collect();
            drop(partial);
            write_prefixed(stream, &complete);
        }
    }
}

/// Operations smaller than this finish too fast for a bar.
const BAR_MIN_BYTES: u64 = 32 * 1024 * 1024;
/// Or with at least this many files.
const BAR_MIN_FILES: u64 = 2_000;

/// `indicatif` bars for long persistence operations (see the module doc).
#[derive(Debug, Default)]
pub struct ProgressBars {
    bars: Mutex<Vec<(ProgressPhase, ProgressBar)>>,
}

impl ProgressBars {
    /// Bars on stderr, or `None` when stderr is not a terminal (nothing is drawn then).
    pub fn for_stderr() -> Option<Self> {
        std::io::stderr().is_terminal().then(Self::default)
    }

    fn bars(&self) -> MutexGuard<'_, Vec<(ProgressPhase, ProgressBar)>> {
        self.bars.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn phase_name(phase: ProgressPhase) -> &'static str {
    match phase {
        ProgressPhase::Restore => "restoring /workspace",
        ProgressPhase::Checkpoint => "checkpointing /workspace",
        ProgressPhase::Seed => "seeding /workspace",
        ProgressPhase::Export => "exporting the workspace",
    }
}

impl ProgressObserver for ProgressBars {
    fn update(&self, progress: Progress) {
        let finished = progress.files_done >= progress.files_total;
        let mut bars = self.bars();
        let existing = bars.iter().position(|(phase, _)| *phase == progress.phase);
        match existing {
            Some(index) => {
                bars[index].1.set_position(progress.bytes_done);
                if finished {
                    let (_, bar) = bars.remove(index);
                    bar.finish_and_clear();
                }
            }
            None => {
                let large =
                    progress.bytes_total >= BAR_MIN_BYTES || progress.files_total >= BAR_MIN_FILES;
                if finished || !large {
                    return;
                }
                let bar = ProgressBar::with_draw_target(
                    Some(progress.bytes_total),
                    ProgressDrawTarget::stderr(),
                );
                let style = ProgressStyle::with_template(
                    "{msg:>24} [{bar:30}] {bytes}/{total_bytes} ({eta} left)",
                )
                .map(|style| style.progress_chars("=> "))
                .unwrap_or_else(|_| ProgressStyle::default_bar());
                bar.set_style(style);
                bar.set_message(phase_name(progress.phase));
                bar.set_position(progress.bytes_done);
                bars.push((progress.phase, bar));
            }
        }
    }
}
