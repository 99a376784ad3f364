//! The client side of E2B's in-sandbox API (envd) as `omabox serve` serves it: the
//! `process.Process` calls `omabox sandbox exec` needs, over the Connect protocol with the
//! JSON codec (connectrpc.com/docs/protocol). `Start` is server-streaming: one enveloped
//! request (a flags byte, a u32 big-endian length, the JSON), answered by enveloped events
//! and an end-of-stream envelope (flags `0x02`) holding the error, if any. `SendInput`,
//! `CloseStdin` and `SendSignal` are unary: plain JSON POSTs. Every request names its
//! sandbox (`E2b-Sandbox-Id`) and carries the sandbox's `X-Access-Token`.
//!
//! Must never: put the access token anywhere but its header (not in a URL, an error or a
//! log), let a length serve sends size a buffer past [`MAX_MESSAGE`], or put text serve
//! chose into an error unescaped ([`one_line`]).

use crate::terminal_safe::one_line;
use anyhow::{Context as _, anyhow, bail};
use base64::Engine as _;
use omabox_contract::SecretString;
use serde_json::{Value, json};
use std::time::Duration;

/// The longest message accepted in a process stream; a longer one is refused, not read.
pub(super) const MAX_MESSAGE: usize = 4 << 20;
/// Largest unary answer (or error body) read.
const MAX_ANSWER: usize = 64 << 10;
/// How long connecting to serve may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a read from serve may wait: serve sends a keepalive every 30 s while a process
/// is quiet, so a longer silence means the connection is gone.
const READ_TIMEOUT: Duration = Duration::from_secs(120);
/// Envelope flag of a compressed message (none is negotiated, so none is accepted).
const COMPRESSED: u8 = 0x01;
/// Envelope flag of the end-of-stream message.
const END_STREAM: u8 = 0x02;
/// The longest text of serve's shown in an error.
const MAX_SHOWN: usize = 512;

/// What `Start` runs.
pub(super) struct StartRequest<'a> {
    pub(super) cmd: &'a str,
    pub(super) args: &'a [String],
    pub(super) envs: &'a [(String, String)],
    pub(super) cwd: Option<&'a str>,
    /// Whether the process gets a stdin (fed with [`EnvdClient::send_input`]).
    pub(super) stdin: bool,
}

/// One event of a process stream.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum ProcessEvent {
    Start {
        pid: u32,
    },
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    End(ProcessEnd),
    /// Serve is still there (a quiet process).
    Keepalive,
}

/// How the process ended (E2B's `EndEvent`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcessEnd {
    pub(super) exit_code: i32,
    /// Whether it exited (rather than being ended by a signal).
    pub(super) exited: bool,
    /// `exit status N` or `signal: NAME` (Go's signal names: `killed`, `terminated`, …).
    pub(super) status: String,
    /// What went wrong around it (its output cut short, …), as serve said it.
    pub(super) error: Option<String>,
}

/// One sandbox's envd on a serve.
#[derive(Clone)]
pub(super) struct EnvdClient {
    http: reqwest::Client,
    base: String,
    sandbox_id: String,
    token: SecretString,
    /// The user calls run as (`Authorization: Basic`); `None`: the sandbox's default.
    user: Option<String>,
}

impl EnvdClient {
    pub(super) fn new(
        base: &str,
        sandbox_id: &str,
        token: SecretString,
        user: Option<String>,
    ) -> anyhow::Result<Self> {
        // No deadline for a whole call: a process stream lasts as long as the process.
        let http = reqwest::Client::builder()
            .connect_timeout(CONNECT_TIMEOUT)
            .read_timeout(READ_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            .context("cannot make an HTTP client")?;
        Ok(Self {
            http,
            base: base.to_owned(),
            sandbox_id: sandbox_id.to_owned(),
            token,
            user,
        })
    }

    fn post(&self, method: &str, content_type: &str, body: Vec<u8>) -> reqwest::RequestBuilder {
        let mut request = self
            .http
            .post(format!("{}/process.Process/{method}", self.base))
            .header("content-type", content_type)
            .header("e2b-sandbox-id", &self.sandbox_id)
            .header("x-access-token", self.token.expose())
            .body(body);
        if let Some(user) = &self.user {
            let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:"));
            request = request.header("authorization", format!("Basic {basic}"));
        }
        request
    }

    /// Starts the process; its events follow from the stream.
    pub(super) async fn start(&self, start: &StartRequest<'_>) -> anyhow::Result<ProcessStream> {
        let mut process = json!({
            "cmd": start.cmd,
            "args": start.args,
            "envs": start.envs.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
        });
        if let Some(cwd) = start.cwd {
            process["cwd"] = cwd.into();
        }
        let message = json!({ "process": process, "stdin": start.stdin }).to_string();
        let mut body = Vec::with_capacity(message.len() + 5);
        body.push(0);
        body.extend_from_slice(&u32::try_from(message.len())?.to_be_bytes());
        body.extend_from_slice(message.as_bytes());
        let response = self
            .post("Start", "application/connect+json", body)
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        let response = self.successful(response).await?;
        Ok(ProcessStream {
            response,
            envelopes: Envelopes::default(),
            base: self.base.clone(),
            finished: false,
        })
    }

    /// Writes `data` to the process's stdin.
    pub(super) async fn send_input(&self, pid: u32, data: &[u8]) -> anyhow::Result<()> {
        let data = base64::engine::general_purpose::STANDARD.encode(data);
        self.unary(
            "SendInput",
            json!({ "process": { "pid": pid }, "input": { "stdin": data } }),
        )
        .await
    }

    /// Closes the process's stdin (it reads EOF).
    pub(super) async fn close_stdin(&self, pid: u32) -> anyhow::Result<()> {
        self.unary("CloseStdin", json!({ "process": { "pid": pid } }))
            .await
    }

    /// Sends SIGKILL to the process.
    pub(super) async fn kill(&self, pid: u32) -> anyhow::Result<()> {
        self.unary(
            "SendSignal",
            json!({ "process": { "pid": pid }, "signal": "SIGNAL_SIGKILL" }),
        )
        .await
    }

    /// Sends SIGTERM to the process.
    pub(super) async fn terminate(&self, pid: u32) -> anyhow::Result<()> {
        self.unary(
            "SendSignal",
            json!({ "process": { "pid": pid }, "signal": "SIGNAL_SIGTERM" }),
        )
        .await
    }

    async fn unary(&self, method: &str, message: Value) -> anyhow::Result<()> {
        let response = self
            .post(method, "application/json", message.to_string().into_bytes())
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.successful(response).await.map(drop)
    }

    fn unreachable(&self, error: &reqwest::Error) -> anyhow::Error {
        let why = if error.is_connect() {
            "connection refused".to_owned()
        } else if error.is_timeout() {
            "timed out".to_owned()
        } else {
            // reqwest's text names the URL (never the token, which is a header) and hyper's cause.
            one_line(&format!("{error}")).into_owned()
        };
        anyhow!("no omabox serve at {}: {why}", self.base)
    }

    /// `response` if it is a 200; else the error serve's answer names.
    async fn successful(
        &self,
        mut response: reqwest::Response,
    ) -> anyhow::Result<reqwest::Response> {
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let mut bytes = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            if bytes.len() + chunk.len() > MAX_ANSWER {
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let message = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v["message"].as_str().map(shown));
        let (base, id) = (&self.base, one_line(&self.sandbox_id));
        match status {
            // serve's answer for no running sandbox of that id (E2B's).
            reqwest::StatusCode::BAD_GATEWAY
                if message
                    .as_deref()
                    .is_some_and(|m| m.ends_with("was not found")) =>
            {
                bail!("no sandbox {id} in the serve at {base} (it ended)")
            }
            reqwest::StatusCode::UNAUTHORIZED => {
                bail!("serve at {base} refused sandbox {id}'s access token (401)")
            }
            _ => bail!(
                "serve at {base} answered {status}: {}",
                message.as_deref().unwrap_or("no message")
            ),
        }
    }
}

/// `text` as an error may show it: one line, escaped, at most [`MAX_SHOWN`] characters.
fn shown(text: &str) -> String {
    one_line(&text.chars().take(MAX_SHOWN).collect::<String>()).into_owned()
}

/// The events of one `Start` call.
pub(super) struct ProcessStream {
    response: reqwest::Response,
    envelopes: Envelopes,
    base: String,
    finished: bool,
}

impl ProcessStream {
    /// The next event; `None` once the stream ended cleanly. An end-of-stream envelope
    /// holding an error is that error.
    pub(super) async fn next(&mut self) -> anyhow::Result<Option<ProcessEvent>> {
        let base = &self.base;
        loop {
            if self.finished {
                return Ok(None);
            }
            match self
                .envelopes
                .next()
                .map_err(|e| anyhow!("serve at {base} {e}"))?
            {
                Some((flags, message)) if flags & END_STREAM != 0 => {
                    self.finished = true;
                    return end_of_stream(&message).map_err(|e| anyhow!("serve at {base}: {e}"));
                }
                Some((_, message)) => {
                    return event(&message)
                        .map(Some)
                        .map_err(|e| anyhow!("serve at {base} sent {e}"));
                }
                None => {}
            }
            let chunk = self.response.chunk().await.map_err(|e| {
                anyhow!(
                    "the process stream from serve at {base} broke off: {}",
                    shown(&e.to_string())
                )
            })?;
            match chunk {
                Some(chunk) => self.envelopes.push(&chunk),
                None => {
                    bail!("the process stream from serve at {base} ended without its end message")
                }
            }
        }
    }
}

/// The envelopes in a byte stream read in chunks; a header is checked as soon as it is
/// complete, so the buffer never holds more than one message under the cap and a chunk.
#[derive(Debug, Default)]
struct Envelopes {
    buffer: Vec<u8>,
}

impl Envelopes {
    fn push(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next whole envelope (flags, message); `None` while incomplete. The error reads
    /// after "serve at URL ".
    fn next(&mut self) -> Result<Option<(u8, Vec<u8>)>, String> {
        let Some(&[flags, a, b, c, d]) = self.buffer.first_chunk::<5>() else {
            return Ok(None);
        };
        let length = u32::from_be_bytes([a, b, c, d]) as usize;
        if length > MAX_MESSAGE {
            return Err(format!(
                "sent a message of {length} bytes, over the {MAX_MESSAGE}-byte cap"
            ));
        }
        if flags & COMPRESSED != 0 {
            return Err("sent a compressed message, which was not asked for".to_owned());
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        let message = self.buffer[5..5 + length].to_vec();
        self.buffer.drain(..5 + length);
        Ok(Some((flags, message)))
    }
}

/// The end-of-stream message: `{}`, or `{"error": {"code", "message"}}`.
fn end_of_stream(message: &[u8]) -> anyhow::Result<Option<ProcessEvent>> {
    let value: Value =
        serde_json::from_slice(message).map_err(|_| anyhow!("an end message that is not JSON"))?;
    match value.get("error") {
        None | Some(Value::Null) => Ok(None),
        Some(error) => {
            let code = error["code"].as_str().map(shown);
            let text = error["message"].as_str().map(shown);
            Err(anyhow!(
                "{}: {}",
                code.as_deref().unwrap_or("unknown"),
                text.as_deref().unwrap_or("no message")
            ))
        }
    }
}

/// One `{"event": {...}}` message; the error reads after "sent ".
fn event(message: &[u8]) -> anyhow::Result<ProcessEvent> {
    let value: Value =
        serde_json::from_slice(message).map_err(|_| anyhow!("a message that is not JSON"))?;
    let event = &value["event"];
    if let Some(start) = event.get("start") {
        let pid = start["pid"]
            .as_u64()
            .and_then(|p| u32::try_from(p).ok())
            .ok_or_else(|| anyhow!("a start event without a pid"))?;
        return Ok(ProcessEvent::Start { pid });
    }
    if let Some(data) = event.get("data") {
        let decode = |text: &Value| {
            text.as_str()
                .and_then(|t| base64::engine::general_purpose::STANDARD.decode(t).ok())
                .ok_or_else(|| anyhow!("output that is not base64"))
        };
        return match (data.get("stdout"), data.get("stderr")) {
            (Some(out), _) => Ok(ProcessEvent::Stdout(decode(out)?)),
            (None, Some(err)) => Ok(ProcessEvent::Stderr(decode(err)?)),
            // pty output is never asked for.
            (None, None) => Ok(ProcessEvent::Keepalive),
        };
    }
    if let Some(end) = event.get("end") {
        let exit_code = end["exitCode"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok())
            .unwrap_or(-1);
        return Ok(ProcessEvent::End(ProcessEnd {
            exit_code,
            exited: end["exited"].as_bool().unwrap_or(false),
            status: end["status"].as_str().map(shown).unwrap_or_default(),
            error: end["error"].as_str().map(shown),
        }));
    }
    // A keepalive, or an event this client does not know: nothing to do.
    Ok(ProcessEvent::Keepalive)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn envelope(flags: u8, message: &[u8]) -> Vec<u8> {
        let mut frame = vec![flags];
        frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(message);
        frame
    }

    #[test]
    fn envelopes_split_anywhere_are_read_whole() {
        let mut stream = envelope(0, br#"{"event":{"start":{"pid":7}}}"#);
        stream.extend(envelope(END_STREAM, b"{}"));
        for cut in 0..stream.len() {
            let mut envelopes = Envelopes::default();
            let mut got = Vec::new();
            for part in [&stream[..cut], &stream[cut..]] {
                envelopes.push(part);
                while let Some(envelope) = envelopes.next().unwrap() {
                    got.push(envelope);
                }
            }
            assert_eq!(got.len(), 2, "cut at {cut}");
            assert_eq!(event(&got[0].1).unwrap(), ProcessEvent::Start { pid: 7 });
            assert_eq!(got[1], (END_STREAM, b"{}".to_vec()));
        }
    }

    #[test]
    fn a_length_over_the_cap_is_refused_from_its_header() {
        let mut envelopes = Envelopes::default();
        let too_long = u32::try_from(MAX_MESSAGE + 1).unwrap();
        envelopes.push(&[0]);
        envelopes.push(&too_long.to_be_bytes());
        let error = envelopes.next().unwrap_err();
        assert!(error.contains("over the 4194304-byte cap"), "{error}");
        let mut envelopes = Envelopes::default();
        envelopes.push(&envelope(COMPRESSED, b"{}"));
        assert!(envelopes.next().unwrap_err().contains("compressed"));
    }

    #[test]
    fn events_and_ends_are_read_and_serves_text_is_escaped() {
        let out = event(br#"{"event":{"data":{"stdout":"aGkK"}}}"#).unwrap();
        assert_eq!(out, ProcessEvent::Stdout(b"hi\n".to_vec()));
        let err = event(br#"{"event":{"data":{"stderr":"AA=="}}}"#).unwrap();
        assert_eq!(err, ProcessEvent::Stderr(vec![0]));
        let end =
            event(br#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed"}}}"#)
                .unwrap();
        assert_eq!(
            end,
            ProcessEvent::End(ProcessEnd {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: None,
            })
        );
        assert_eq!(
            event(br#"{"event":{"keepalive":{}}}"#).unwrap(),
            ProcessEvent::Keepalive
        );
        assert!(event(br#"{"event":{"data":{"stdout":"%%"}}}"#).is_err());
        assert!(event(b"not json").is_err());

        assert_eq!(end_of_stream(b"{}").unwrap(), None);
        let hostile =
            br#"{"error":{"code":"not_found","message":"\u001b]0;x\u0007\nomabox: fake"}}"#;
        let error = format!("{:#}", end_of_stream(hostile).unwrap_err());
        assert!(error.starts_with("not_found: "), "{error}");
        assert!(
            !error.contains('\u{1b}') && !error.contains('\n'),
            "{error:?}"
        );
    }
}
