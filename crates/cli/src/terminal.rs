//! What `omabox run` draws on the terminal besides the timeline: the harness's own output
//! as it arrives, and progress bars for long restores and checkpoints.
//!
//! - [`TerminalHarnessOutput`] streams harness stdout/stderr. In human mode each line is
//!   indented under the timeline (`│ `), stdout to stdout and stderr to stderr; in `--json`
//!   mode both go to stderr unchanged, so stdout stays one JSON document.
//! - [`ProgressBars`] draws an `indicatif` bar on stderr for a restore, checkpoint, seed or
//!   export large enough to take a while, and only when stderr is a terminal.

use crate::terminal_safe::ControlFilter;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use omabox_persistence::{Progress, ProgressObserver, ProgressPhase};
use omabox_sandbox::managed::{HarnessOutputSink, HarnessStream};
use std::io::{IsTerminal as _, Write as _};
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The indent of harness output under the timeline.
const HARNESS_PREFIX: &str = "           │ ";

/// The longest unfinished line held back per stream (human mode). A longer line is written
/// out as it arrives, continued without a new prefix, so a harness that never prints a
/// newline costs at most this much host memory and linear time.
pub const MAX_PENDING_LINE: usize = 64 * 1024;

/// Per-stream line state (human mode).
#[derive(Debug, Default)]
struct LineState {
    /// Bytes of the current line not yet written (never more than [`MAX_PENDING_LINE`]).
    pending: Vec<u8>,
    /// Part of the current line was already written (its prefix with it).
    continued: bool,
    /// Set when this stream goes to a terminal: harness bytes reach it only as text.
    filter: Option<ControlFilter>,
}

/// Streams harness output to the terminal (see the module doc).
#[derive(Debug)]
pub struct TerminalHarnessOutput {
    json: bool,
    /// Unfinished last lines of stdout and stderr (human mode only).
    lines: Mutex<[LineState; 2]>,
}

impl TerminalHarnessOutput {
    /// `json`: everything raw to stderr.
    pub fn new(json: bool) -> Self {
        // With --json both streams go to stderr.
        let state = |fd| LineState {
            filter: ControlFilter::for_terminal(fd),
            ..LineState::default()
        };
        Self {
            json,
            lines: Mutex::new([state(if json { 2 } else { 1 }), state(2)]),
        }
    }

    fn lines(&self) -> MutexGuard<'_, [LineState; 2]> {
        self.lines.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes out unfinished lines (call when the harness has ended).
    pub fn flush(&self) {
        let mut lines = self.lines();
        for (index, stream) in [HarnessStream::Stdout, HarnessStream::Stderr]
            .into_iter()
            .enumerate()
        {
            let state = &mut lines[index];
            if !state.pending.is_empty() || state.continued {
                let mut text = Vec::new();
                render(state, b"\n", &mut text);
                write_raw(stream, &text);
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

/// Feeds `bytes` into one stream's line state and appends to `text` what can be written
/// now: every completed line behind the harness prefix, and an over-long unfinished line.
/// Linear in `bytes`: only the new bytes are scanned for newlines.
fn render(state: &mut LineState, bytes: &[u8], text: &mut Vec<u8>) {
    let (complete, rest) = match bytes.iter().rposition(|byte| *byte == b'\n') {
        Some(end) => bytes.split_at(end + 1),
        None => (&[][..], bytes),
    };
    if !complete.is_empty() {
        let pending = std::mem::take(&mut state.pending);
        let mut first = true;
        for line in complete.split_inclusive(|byte| *byte == b'\n') {
            if !(first && state.continued) {
                text.extend_from_slice(HARNESS_PREFIX.as_bytes());
            }
            if first {
                text.extend_from_slice(&pending);
                first = false;
            }
            text.extend_from_slice(line);
        }
        state.continued = false;
    }
    state.pending.extend_from_slice(rest);
    if state.pending.len() > MAX_PENDING_LINE {
        if !state.continued {
            text.extend_from_slice(HARNESS_PREFIX.as_bytes());
        }
        text.append(&mut state.pending);
        state.continued = true;
    }
}

impl HarnessOutputSink for TerminalHarnessOutput {
    fn output(&self, stream: HarnessStream, bytes: &[u8]) {
        let index = match stream {
            HarnessStream::Stdout => 0,
            HarnessStream::Stderr => 1,
        };
        let mut lines = self.lines();
        let state = &mut lines[index];
        let mut filtered = Vec::new();
        let bytes = match &mut state.filter {
            Some(f) => {
                f.filter(bytes, &mut filtered);
                &filtered[..]
            }
            None => bytes,
        };
        if self.json {
            drop(lines);
            write_raw(HarnessStream::Stderr, bytes);
            return;
        }
        let mut text = Vec::new();
        render(state, bytes, &mut text);
        drop(lines);
        if !text.is_empty() {
            write_raw(stream, &text);
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

/// An agent install on stderr: a spinner on a terminal, else one line (`quiet`: the line
/// only, for `--json`).
#[derive(Debug)]
pub struct InstallSpinner {
    quiet: bool,
    bar: Mutex<Option<ProgressBar>>,
}

impl InstallSpinner {
    /// A spinner, or only lines when `quiet`.
    pub fn new(quiet: bool) -> Self {
        Self {
            quiet,
            bar: Mutex::new(None),
        }
    }
}

impl omabox_node::agent_cache::InstallObserver for InstallSpinner {
    fn started(&self, message: &str) {
        if self.quiet || !std::io::stderr().is_terminal() {
            errln!("omabox: {message}…");
            return;
        }
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
        let style = ProgressStyle::with_template("{spinner} {msg} {elapsed}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner());
        bar.set_style(style);
        bar.set_message(message.to_owned());
        bar.enable_steady_tick(std::time::Duration::from_millis(120));
        *self.bar.lock().unwrap_or_else(PoisonError::into_inner) = Some(bar);
    }

    fn ended(&self) {
        if let Some(bar) = self
            .bar
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            bar.finish_and_clear();
        }
    }

    fn line(&self, line: &str) {
        errln!("{line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `chunks` through one stream's state, then flushes; returns what was written.
    fn rendered(chunks: &[&[u8]]) -> (Vec<u8>, usize) {
        let mut state = LineState::default();
        let mut text = Vec::new();
        let mut held = 0;
        for chunk in chunks {
            render(&mut state, chunk, &mut text);
            held = held.max(state.pending.capacity());
        }
        if !state.pending.is_empty() || state.continued {
            render(&mut state, b"\n", &mut text);
        }
        (text, held)
    }

    fn prefixed(lines: &[&str]) -> Vec<u8> {
        lines
            .iter()
            .flat_map(|line| format!("{HARNESS_PREFIX}{line}\n").into_bytes())
            .collect()
    }

    #[test]
    fn lines_split_across_chunks_are_prefixed_once() {
        let (text, _) = rendered(&[b"he", b"llo\nwor", b"ld\n\nlast"]);
        assert_eq!(text, prefixed(&["hello", "world", "", "last"]));
    }

    #[test]
    fn a_line_without_newline_is_written_through_past_the_cap_and_never_held() {
        let chunk = vec![b'x'; 16 * 1024];
        let chunks: Vec<&[u8]> = std::iter::repeat_n(&chunk[..], 1024)
            .chain([&b"y\nnext\n"[..]])
            .collect();
        let (text, held) = rendered(&chunks);
        assert!(
            held <= 2 * MAX_PENDING_LINE,
            "held {held} bytes of a 16 MiB line"
        );
        let mut line = "x".repeat(16 * 1024 * 1024);
        line.push('y');
        assert_eq!(text, prefixed(&[&line, "next"]), "one line, one prefix");
    }

    #[test]
    fn an_over_long_line_cut_by_the_end_of_output_gets_its_newline() {
        let long = vec![b'z'; MAX_PENDING_LINE + 1];
        let (text, _) = rendered(&[&long]);
        let expected = prefixed(&[std::str::from_utf8(&long).unwrap()]);
        assert_eq!(text, expected);
    }
}
