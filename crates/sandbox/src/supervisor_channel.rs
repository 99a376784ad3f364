//! A generic JSON-Lines [`HarnessSupervisorChannel`] over a process's stdin and stdout.
//!
//! Any backend that can start a supervisor process and hand over its byte streams (a local
//! child, a duplex process in a sandbox, an attach stream) gets the wire protocol of
//! `openma-harness-supervisor-v1` from here instead of re-implementing it:
//!
//! - each command is written as `JSON(command) + "\n"` to stdin;
//! - stdout is split on `"\n"`, each line trimmed, empty lines skipped, and a trailing
//!   unterminated record at end of file still parsed; every record is validated by
//!   [`HarnessSupervisorEvent::parse_line`] (its error ends the stream);
//! - a line longer than [`MAX_SUPERVISOR_LINE`] bytes is never buffered: it is rejected as
//!   invalid JSON (the contract's text, with the limit named) as soon as the cap is passed,
//!   and the stream ends there like for any other invalid record; the rest of stdout is then
//!   read and discarded in the background, so the supervisor never blocks on a full pipe
//!   before `close` stops it;
//! - the event stream can be taken once, and ends with the consumer's abort reason as soon as
//!   the consumer's signal fires;
//! - `send` fails after `close` and once the signal given at open time fired;
//! - `close` is idempotent and never fails: it closes stdin (errors ignored), then runs the
//!   kill callback (the backend's SIGTERM; errors ignored).
//!
//! The adapter never spawns anything itself: the process and its kill belong to the backend.
//! (It moved here from `omabox-host` so backends can use it; the tests that drive a real
//! supervisor process through the host's supervised driver live in
//! `omabox-testkit/tests/supervisor_stdio.rs`.)

use futures::future::BoxFuture;
use omabox_contract::{
    AbortSignal, HarnessSupervisorChannel, HarnessSupervisorCommand, HarnessSupervisorEvent,
    HarnessSupervisorEventStream, PortError,
};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The longest event line (bytes, newline excluded) the host buffers. Every event of
/// `openma-harness-supervisor-v1` is a small object; a longer line is hostile or broken.
pub const MAX_SUPERVISOR_LINE: usize = 1024 * 1024;

/// The supervisor's stdin.
pub type SupervisorStdin = Box<dyn AsyncWrite + Send + Unpin>;
/// The supervisor's stdout (or stderr).
pub type SupervisorOutput = Box<dyn AsyncRead + Send + Unpin>;
/// Stops the supervisor process (SIGTERM for a process). Called at most once, by `close`.
pub type SupervisorKill = Box<dyn FnOnce() -> BoxFuture<'static, Result<(), PortError>> + Send>;

/// JSON-Lines channel to one supervisor process.
pub struct JsonLinesSupervisorChannel {
    stdin: tokio::sync::Mutex<Option<SupervisorStdin>>,
    stdout: Mutex<Option<SupervisorOutput>>,
    kill: Mutex<Option<SupervisorKill>>,
    /// The process's exit, when the transport knows it: read once the event stream ends
    /// early, to name a memory-limit kill.
    exited: Mutex<Option<crate::SandboxExitFuture>>,
    closed: AtomicBool,
    open_signal: AbortSignal,
}

impl std::fmt::Debug for JsonLinesSupervisorChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonLinesSupervisorChannel")
            .field("closed", &self.closed.load(Ordering::SeqCst))
            .finish_non_exhaustive()
    }
}

impl JsonLinesSupervisorChannel {
    /// A channel over `stdin`/`stdout`; `kill` stops the process on close; `open_signal` is the
    /// signal the transport's `open` received.
    pub fn new(
        stdin: SupervisorStdin,
        stdout: SupervisorOutput,
        kill: SupervisorKill,
        open_signal: AbortSignal,
    ) -> Self {
        Self {
            stdin: tokio::sync::Mutex::new(Some(stdin)),
            stdout: Mutex::new(Some(stdout)),
            kill: Mutex::new(Some(kill)),
            exited: Mutex::new(None),
            closed: AtomicBool::new(false),
            open_signal,
        }
    }

    /// The supervisor process's exit: when its event stream ends before the protocol did and
    /// the sandbox's memory limit killed it, the stream's last item says so.
    pub fn with_exit(self, exited: crate::SandboxExitFuture) -> Self {
        *self
            .exited
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(exited);
        self
    }

    /// Drains and discards the supervisor's stderr in the background, so a chatty supervisor
    /// never blocks on a full pipe. Must be called inside a tokio runtime.
    pub fn with_stderr(self, stderr: SupervisorOutput) -> Self {
        tokio::spawn(async move {
            let mut stderr = stderr;
            let _ = tokio::io::copy(&mut stderr, &mut tokio::io::sink()).await;
        });
        self
    }
}

/// Reader state of the event stream.
struct EventReader {
    /// `None` once handed to the background drain.
    reader: Option<BufReader<SupervisorOutput>>,
    signal: AbortSignal,
    line: Vec<u8>,
    done: bool,
    /// See [`JsonLinesSupervisorChannel::with_exit`].
    exited: Option<crate::SandboxExitFuture>,
}

/// How long an ended event stream waits for the process's exit to name an OOM kill.
const EXIT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// How reading one line ended.
enum LineRead {
    /// A line (newline excluded) is in the buffer; `false` when end of file came first.
    Line(bool),
    /// The line passed [`MAX_SUPERVISOR_LINE`]; what was read of it is discarded.
    TooLong,
}

/// Reads one line into `line` (cleared first), never buffering more than
/// [`MAX_SUPERVISOR_LINE`] + one read buffer.
async fn read_line_capped(
    reader: &mut BufReader<SupervisorOutput>,
    line: &mut Vec<u8>,
) -> std::io::Result<LineRead> {
    line.clear();
    loop {
        let available = reader.fill_buf().await?;
        if available.is_empty() {
            return Ok(LineRead::Line(!line.is_empty()));
        }
        let (taken, ended) = match available.iter().position(|byte| *byte == b'\n') {
            Some(end) => (end, true),
            None => (available.len(), false),
        };
        if line.len() + taken > MAX_SUPERVISOR_LINE {
            line.clear();
            return Ok(LineRead::TooLong);
        }
        line.extend_from_slice(&available[..taken]);
        reader.consume(taken + usize::from(ended));
        if ended {
            return Ok(LineRead::Line(true));
        }
    }
}

impl EventReader {
    /// At an early end of the stream: the error naming the memory-limit kill that ended
    /// the supervisor, if the process's exit says so within [`EXIT_GRACE`].
    async fn out_of_memory(&mut self) -> Option<PortError> {
        let exited = self.exited.take()?;
        let exit = tokio::time::timeout(EXIT_GRACE, exited).await.ok()?.ok()?;
        let oom = exit.out_of_memory?;
        Some(PortError::supervisor_protocol(format!(
            "Supervisor closed before completion; {oom}"
        )))
    }

    /// The next validated event, `None` at end of file, or the error that ends the stream.
    async fn next_event(&mut self) -> Option<Result<HarnessSupervisorEvent, PortError>> {
        while !self.done {
            let reader = self.reader.as_mut()?;
            let read = tokio::select! {
                biased;
                reason = self.signal.aborted() => Err(reason),
                read = read_line_capped(reader, &mut self.line) => read.map_err(PortError::from),
            };
            let record = match read {
                Err(error) => {
                    self.done = true;
                    return Some(Err(error));
                }
                Ok(LineRead::TooLong) => {
                    self.done = true;
                    if let Some(mut rest) = self.reader.take() {
                        tokio::spawn(async move {
                            let _ = tokio::io::copy(&mut rest, &mut tokio::io::sink()).await;
                        });
                    }
                    return Some(Err(PortError::new(format!(
                        "Harness supervisor emitted invalid JSON (a line longer than \
                         {MAX_SUPERVISOR_LINE} bytes)"
                    ))));
                }
                // End of file with nothing pending.
                Ok(LineRead::Line(false)) => {
                    self.done = true;
                    return self.out_of_memory().await.map(Err);
                }
                // A terminated line, or the unterminated last record at end of file.
                Ok(LineRead::Line(true)) => String::from_utf8_lossy(&self.line).trim().to_owned(),
            };
            if record.is_empty() {
                continue;
            }
            let event = HarnessSupervisorEvent::parse_line(&record);
            if event.is_err() {
                self.done = true;
            }
            return Some(event);
        }
        None
    }
}

#[async_trait::async_trait]
impl HarnessSupervisorChannel for JsonLinesSupervisorChannel {
    async fn send(&self, command: HarnessSupervisorCommand) -> Result<(), PortError> {
        let closed = || PortError::new("Harness supervisor channel is closed");
        if self.closed.load(Ordering::SeqCst) {
            return Err(closed());
        }
        self.open_signal.throw_if_aborted()?;
        let mut stdin = self.stdin.lock().await;
        let writer = stdin.as_mut().ok_or_else(closed)?;
        writer
            .write_all(command.to_json_line().as_bytes())
            .await
            .map_err(PortError::from)?;
        writer.flush().await.map_err(PortError::from)
    }

    async fn events(&self, signal: AbortSignal) -> Result<HarnessSupervisorEventStream, PortError> {
        let stdout = self
            .stdout
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
            .ok_or_else(|| {
                PortError::new("Harness supervisor event stream can only be consumed once")
            })?;
        let reader = EventReader {
            reader: Some(BufReader::new(stdout)),
            signal,
            line: Vec::new(),
            done: false,
            exited: self
                .exited
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .take(),
        };
        Ok(Box::pin(futures::stream::unfold(
            reader,
            |mut reader| async move {
                let event = reader.next_event().await?;
                Some((event, reader))
            },
        )))
    }

    async fn close(&self) -> Result<(), PortError> {
        if self.closed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        if let Some(mut stdin) = self.stdin.lock().await.take() {
            let _ = stdin.shutdown().await;
        }
        let kill = self
            .kill
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(kill) = kill {
            let _ = kill().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::{FutureExt, StreamExt};
    use omabox_contract::{AbortController, SupervisorStopReason};
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use tokio::io::{AsyncReadExt, DuplexStream};

    struct Harness {
        channel: JsonLinesSupervisorChannel,
        /// What the supervisor reads (our stdin).
        supervisor_stdin: DuplexStream,
        /// What the supervisor writes (our stdout).
        supervisor_stdout: DuplexStream,
        kills: Arc<AtomicUsize>,
        open: AbortController,
    }

    fn harness(kill_result: Result<(), PortError>) -> Harness {
        let (stdin, supervisor_stdin) = tokio::io::duplex(4096);
        let (supervisor_stdout, stdout) = tokio::io::duplex(4096);
        let kills = Arc::new(AtomicUsize::new(0));
        let open = AbortController::new();
        let kill: SupervisorKill = {
            let kills = Arc::clone(&kills);
            Box::new(move || {
                kills.fetch_add(1, Ordering::SeqCst);
                async move { kill_result }.boxed()
            })
        };
        Harness {
            channel: JsonLinesSupervisorChannel::new(
                Box::new(stdin),
                Box::new(stdout),
                kill,
                open.signal(),
            ),
            supervisor_stdin,
            supervisor_stdout,
            kills,
            open,
        }
    }

    async fn collect(
        channel: &JsonLinesSupervisorChannel,
    ) -> Vec<Result<HarnessSupervisorEvent, PortError>> {
        channel
            .events(AbortSignal::never())
            .await
            .unwrap()
            .collect()
            .await
    }

    #[tokio::test]
    async fn splits_trims_skips_blank_lines_and_parses_a_trailing_unterminated_record() {
        let mut h = harness(Ok(()));
        let writer = tokio::spawn(async move {
            for chunk in [
                "  {\"type\":\"ready\",\"protocol\":\"openma-harness-",
                "supervisor-v1\"}  \r\n\n   \n{\"type\":\"heartbeat\",\"sequence\":0}\n",
                "{\"type\":\"completed\",\"exitCode\":0,\"extra\":true}",
            ] {
                h.supervisor_stdout
                    .write_all(chunk.as_bytes())
                    .await
                    .unwrap();
                tokio::task::yield_now().await;
            }
            // Dropping the write half is end of file.
        });
        let events = collect(&h.channel).await;
        writer.await.unwrap();
        assert_eq!(
            events,
            vec![
                Ok(HarnessSupervisorEvent::Ready {
                    protocol: "openma-harness-supervisor-v1".into()
                }),
                Ok(HarnessSupervisorEvent::Heartbeat { sequence: 0 }),
                Ok(HarnessSupervisorEvent::Completed { exit_code: 0 }),
            ]
        );
    }

    #[tokio::test]
    async fn a_validation_error_ends_the_stream_with_the_contract_text() {
        let cases = [
            ("nope", "Harness supervisor emitted invalid JSON"),
            (
                "null",
                "Harness supervisor event must be an object with a type",
            ),
            (
                "{}",
                "Harness supervisor event must be an object with a type",
            ),
            (
                r#"{"type":"ready","protocol":"v0"}"#,
                "Harness supervisor emitted an unsupported ready protocol",
            ),
            (
                r#"{"type":"heartbeat","sequence":-1}"#,
                "Harness supervisor heartbeat sequence must be non-negative",
            ),
            (
                r#"{"type":"checkpoint","checkpointId":"c","sessionId":""}"#,
                "Harness supervisor checkpoint request is invalid",
            ),
            (
                r#"{"type":"completed","exitCode":0.5}"#,
                "Harness supervisor completion exitCode must be an integer",
            ),
            (
                r#"{"type":"error","message":""}"#,
                "Harness supervisor error message must be non-empty",
            ),
            (
                r#"{"type":"dance"}"#,
                "Unknown harness supervisor event: dance",
            ),
        ];
        for (line, message) in cases {
            let mut h = harness(Ok(()));
            let text = format!("{line}\n{{\"type\":\"drained\"}}\n");
            h.supervisor_stdout
                .write_all(text.as_bytes())
                .await
                .unwrap();
            drop(h.supervisor_stdout);
            let events = collect(&h.channel).await;
            assert_eq!(events.len(), 1, "{line}: the stream ends at the bad record");
            assert_eq!(events[0].as_ref().unwrap_err().message(), message, "{line}");
        }
    }

    #[tokio::test]
    async fn a_line_past_the_cap_is_rejected_without_being_buffered() {
        let mut h = harness(Ok(()));
        // 96 MiB without a newline: the reader answers at the cap, not at the end of the line,
        // and then discards the rest without buffering it.
        let writer = tokio::spawn(async move {
            h.supervisor_stdout
                .write_all(b"{\"type\":\"heartbeat\",\"sequence\":1}\n")
                .await
                .unwrap();
            let chunk = vec![b' '; 64 * 1024];
            for _ in 0..(96 * 16) {
                h.supervisor_stdout.write_all(&chunk).await.unwrap();
            }
        });
        let mut events = h.channel.events(AbortSignal::never()).await.unwrap();
        assert_eq!(
            events.next().await,
            Some(Ok(HarnessSupervisorEvent::Heartbeat { sequence: 1 }))
        );
        let error = events.next().await.unwrap().unwrap_err();
        assert_eq!(
            error.message(),
            format!(
                "Harness supervisor emitted invalid JSON (a line longer than \
                 {MAX_SUPERVISOR_LINE} bytes)"
            )
        );
        assert!(
            events.next().await.is_none(),
            "the stream ends at the bad line"
        );
        // The rest is drained while the stream is still held: the writer finishes all 96 MiB.
        writer.await.unwrap();
        drop(events);
    }

    #[tokio::test]
    async fn a_line_of_exactly_the_cap_is_still_parsed() {
        let mut h = harness(Ok(()));
        let event = b"{\"type\":\"drained\"}";
        let mut line = vec![b' '; MAX_SUPERVISOR_LINE - event.len()];
        line.extend_from_slice(event);
        line.push(b'\n');
        let writer = tokio::spawn(async move {
            h.supervisor_stdout.write_all(&line).await.unwrap();
        });
        let events = collect(&h.channel).await;
        writer.await.unwrap();
        assert_eq!(events, vec![Ok(HarnessSupervisorEvent::Drained)]);
    }

    #[tokio::test]
    async fn the_event_stream_can_only_be_consumed_once() {
        let h = harness(Ok(()));
        let _first = h.channel.events(AbortSignal::never()).await.unwrap();
        let second = h.channel.events(AbortSignal::never()).await;
        assert_eq!(
            second.err().unwrap().message(),
            "Harness supervisor event stream can only be consumed once"
        );
    }

    #[tokio::test]
    async fn sends_json_lines_and_refuses_after_close() {
        let mut h = harness(Ok(()));
        h.channel
            .send(HarnessSupervisorCommand::Drain)
            .await
            .unwrap();
        h.channel
            .send(HarnessSupervisorCommand::Stop {
                reason: SupervisorStopReason::Failed,
            })
            .await
            .unwrap();
        h.channel.close().await.unwrap();
        let mut written = String::new();
        h.supervisor_stdin
            .read_to_string(&mut written)
            .await
            .unwrap();
        assert_eq!(
            written, "{\"type\":\"drain\"}\n{\"type\":\"stop\",\"reason\":\"failed\"}\n",
            "stdin is closed by close()"
        );
        assert_eq!(
            h.channel
                .send(HarnessSupervisorCommand::Drain)
                .await
                .unwrap_err()
                .message(),
            "Harness supervisor channel is closed"
        );
    }

    #[tokio::test]
    async fn send_fails_with_the_abort_reason_once_the_open_signal_fired() {
        let h = harness(Ok(()));
        h.open.abort(PortError::new("generation cancelled"));
        assert_eq!(
            h.channel
                .send(HarnessSupervisorCommand::Drain)
                .await
                .unwrap_err()
                .message(),
            "generation cancelled"
        );
    }

    #[tokio::test]
    async fn close_is_idempotent_and_ignores_kill_errors() {
        let h = harness(Err(PortError::new("no such process")));
        h.channel.close().await.unwrap();
        h.channel.close().await.unwrap();
        assert_eq!(h.kills.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_aborted_consumer_signal_ends_the_pending_read_with_its_reason() {
        let mut h = harness(Ok(()));
        let consumer = AbortController::new();
        let mut events = h.channel.events(consumer.signal()).await.unwrap();
        h.supervisor_stdout
            .write_all(b"{\"type\":\"heartbeat\",\"sequence\":3}\n")
            .await
            .unwrap();
        assert_eq!(
            events.next().await,
            Some(Ok(HarnessSupervisorEvent::Heartbeat { sequence: 3 }))
        );
        let pending = tokio::spawn(async move {
            let next = events.next().await;
            (next, events.next().await)
        });
        tokio::task::yield_now().await;
        consumer.abort(PortError::new("lease lost"));
        let (next, after) = pending.await.unwrap();
        assert_eq!(next.unwrap().unwrap_err().message(), "lease lost");
        assert!(after.is_none(), "the stream ends after the abort");
    }
}
