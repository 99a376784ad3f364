//! `omabox sandbox exec [--user NAME] [--cwd DIR] [-e K=V]... [-i] ID -- CMD [ARGS...]`:
//! a command in a running sandbox of `omabox serve`, like `docker exec`.
//!
//! The sandbox's access token comes from serve's connect route (with the operator key);
//! the command runs through the sandbox's envd (`envd_client.rs`). While it runs:
//!
//! - its stdout and stderr are copied to ours as they arrive: raw to a pipe or a file,
//!   through [`ControlFilter`] to a terminal (as `sandbox run` does);
//! - with `-i`, our stdin is sent to its stdin (in chunks of at most 64 KiB) and closed at
//!   our EOF; without, it has no stdin;
//! - Ctrl-C (SIGINT) kills it (SIGKILL) and omabox exits 130;
//! - when our stdout or stderr stops taking bytes (a closed pipe) it gets SIGTERM, as
//!   SIGPIPE would have ended it.
//!
//! omabox exits with the command's exit code, `128 + n` when signal `n` ended it, 1 when
//! it ended some other way, and 1 with an error message when omabox could not run it.
//!
//! Must never: print the access token, or put the sandbox's bytes into an error message
//! unescaped.

use super::envd_client::{EnvdClient, ProcessEnd, ProcessEvent, StartRequest};
use super::remote::{Client, ServeFlag, segment};
use crate::terminal_safe::{ControlFilter, one_line};
use anyhow::anyhow;
use clap::Args;
use omabox_contract::SecretString;
use omabox_contract::signals::signal_number;
use serde_json::json;
use std::process::ExitCode;
use tokio::io::{AsyncWrite, AsyncWriteExt as _};
use tokio::signal::unix::{SignalKind, signal};

/// Exit code after Ctrl-C (128 + SIGINT, as a shell reports it).
const EXIT_INTERRUPTED: u8 = 130;

/// Options of `omabox sandbox exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub(super) serve: ServeFlag,
    /// Run as this user (relative `--cwd` is under its home). Default: the sandbox's.
    #[arg(long, value_name = "NAME", value_parser = user_name)]
    user: Option<String>,
    /// The command's working directory. Default: the user's home.
    #[arg(long, value_name = "DIR")]
    cwd: Option<String>,
    /// Set an environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = super::parse_env)]
    env: Vec<(String, String)>,
    /// Send our stdin to the command's (closed at our EOF).
    #[arg(long, short = 'i')]
    interactive: bool,
    /// The sandbox.
    #[arg(value_name = "ID")]
    id: String,
    /// The command and its arguments (after `--`).
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    command: Vec<String>,
}

/// `--user`: what envd takes as a user name (it travels in `Authorization: Basic`).
fn user_name(text: &str) -> Result<String, String> {
    if text.is_empty()
        || text.len() > 64
        || !text.bytes().all(|b| b.is_ascii_graphic() && b != b':')
    {
        return Err("a user name is 1 to 64 printable ASCII characters without `:`".to_owned());
    }
    Ok(text.to_owned())
}

/// Runs `args.command` in the sandbox until it ends; its exit code.
pub(super) async fn exec(client: &Client, args: ExecArgs) -> anyhow::Result<ExitCode> {
    let path = format!("/sandboxes/{}/connect", segment(&args.id));
    let sandbox = client
        .call(reqwest::Method::POST, &path, Some(json!({})))
        .await
        .map_err(|e| e.named(&args.id))?;
    let token = sandbox["envdAccessToken"]
        .as_str()
        .map(SecretString::new)
        .ok_or_else(|| {
            anyhow!(
                "serve at {} answered the connect without an access token",
                client.base
            )
        })?;
    let envd = EnvdClient::new(&client.base, &args.id, token, args.user.clone())?;
    // Before the start: a Ctrl-C from now on is ours to forward.
    let mut interrupts = signal(SignalKind::interrupt())?;
    let (cmd, rest) = args
        .command
        .split_first()
        .ok_or_else(|| anyhow!("no command given"))?;
    let mut stream = envd
        .start(&StartRequest {
            cmd,
            args: rest,
            envs: &args.env,
            cwd: args.cwd.as_deref(),
            stdin: args.interactive,
        })
        .await?;

    let mut stdout = Output::new(tokio::io::stdout(), 1);
    let mut stderr = Output::new(tokio::io::stderr(), 2);
    let mut pid = None;
    let mut interrupted = false;
    let mut terminated = false;
    let mut end = None;
    let mut feeder = None;
    loop {
        let event = tokio::select! {
            event = stream.next() => event,
            _ = interrupts.recv() => {
                interrupted = true;
                match pid {
                    Some(pid) => return Ok(interrupt(&envd, pid).await),
                    // Not started yet: killed as soon as its pid is known.
                    None => continue,
                }
            }
        };
        match event {
            Ok(Some(ProcessEvent::Start { pid: started })) => {
                pid = Some(started);
                if interrupted {
                    return Ok(interrupt(&envd, started).await);
                }
                if args.interactive {
                    feeder = Some(tokio::spawn(feed_stdin(envd.clone(), started)));
                }
            }
            Ok(Some(ProcessEvent::Stdout(bytes))) => stdout.write(&bytes).await,
            Ok(Some(ProcessEvent::Stderr(bytes))) => stderr.write(&bytes).await,
            Ok(Some(ProcessEvent::End(ended))) => end = Some(ended),
            Ok(Some(ProcessEvent::Keepalive)) => {}
            Ok(None) => break,
            // The end was already told: what broke after it does not change the result.
            Err(_) if end.is_some() => break,
            Err(error) => return Err(error.context(format!("sandbox {}", one_line(&args.id)))),
        }
        if (stdout.broken || stderr.broken)
            && !terminated
            && let Some(pid) = pid
        {
            terminated = true;
            let _ = envd.terminate(pid).await;
        }
    }
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    stdout.flush().await;
    stderr.flush().await;
    let end = end.ok_or_else(|| {
        anyhow!(
            "the process stream of sandbox {} ended before the process did",
            one_line(&args.id)
        )
    })?;
    if let Some(error) = &end.error {
        // Already escaped by the client.
        errln!("omabox: warning: {error}");
    }
    Ok(ExitCode::from(exit_code(&end)))
}

/// Kills the process after a Ctrl-C; the exit code to use.
async fn interrupt(envd: &EnvdClient, pid: u32) -> ExitCode {
    if let Err(error) = envd.kill(pid).await {
        errln!("omabox: could not kill the command: {error:#}");
    }
    ExitCode::from(EXIT_INTERRUPTED)
}

/// The process's end as a shell reports it: its code, `128 + n` for signal `n` (E2B's
/// status names it as Go does: `signal: killed`), else 1.
fn exit_code(end: &ProcessEnd) -> u8 {
    if end.exited {
        return (end.exit_code & 0xff) as u8;
    }
    let Some(name) = end.status.strip_prefix("signal: ") else {
        return 1;
    };
    let signal = match name {
        "killed" => "SIGKILL".to_owned(),
        "terminated" => "SIGTERM".to_owned(),
        "interrupt" => "SIGINT".to_owned(),
        "hangup" => "SIGHUP".to_owned(),
        "broken pipe" => "SIGPIPE".to_owned(),
        "segmentation fault" => "SIGSEGV".to_owned(),
        "aborted" => "SIGABRT".to_owned(),
        // serve's fallback: the lowercased name (`sigusr1`).
        other => other.to_ascii_uppercase(),
    };
    signal_number(&signal)
        .and_then(|n| u8::try_from(128 + n).ok())
        .unwrap_or(1)
}

/// One of our output streams: filtered when it is a terminal; `broken` once it stopped
/// taking bytes (then what comes is dropped).
struct Output<W> {
    to: W,
    filter: Option<ControlFilter>,
    filtered: Vec<u8>,
    broken: bool,
}

impl<W: AsyncWrite + Unpin> Output<W> {
    fn new(to: W, fd: std::os::fd::RawFd) -> Self {
        Self {
            to,
            filter: ControlFilter::for_terminal(fd),
            filtered: Vec::new(),
            broken: false,
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        if self.broken {
            return;
        }
        let bytes = match &mut self.filter {
            Some(filter) => {
                self.filtered.clear();
                filter.filter(bytes, &mut self.filtered);
                &self.filtered[..]
            }
            None => bytes,
        };
        let written = async {
            self.to.write_all(bytes).await?;
            self.to.flush().await
        };
        if written.await.is_err() {
            self.broken = true;
        }
    }

    async fn flush(&mut self) {
        if !self.broken {
            let _ = self.to.flush().await;
        }
    }
}

/// Sends our stdin to process `pid` until our EOF, then closes its stdin.
async fn feed_stdin(envd: EnvdClient, pid: u32) {
    if let Some(mut chunks) = super::stdin_chunks() {
        while let Some(chunk) = chunks.recv().await {
            if envd.send_input(pid, &chunk).await.is_err() {
                // The process ended or closed its stdin: the rest of ours is not wanted.
                return;
            }
        }
    }
    let _ = envd.close_stdin(pid).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(exited: bool, code: i32, status: &str) -> ProcessEnd {
        ProcessEnd {
            exit_code: code,
            exited,
            status: status.into(),
            error: None,
        }
    }

    #[test]
    fn a_user_name_fits_a_basic_header() {
        assert_eq!(user_name("nobody").unwrap(), "nobody");
        for bad in ["", "a:b", "a b", "a\nb", "é", &"x".repeat(65)] {
            assert!(user_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_end_is_the_exit_code_a_shell_would_report() {
        assert_eq!(exit_code(&end(true, 0, "exit status 0")), 0);
        assert_eq!(exit_code(&end(true, 7, "exit status 7")), 7);
        assert_eq!(exit_code(&end(true, 256 + 3, "exit status 3")), 3);
        assert_eq!(exit_code(&end(false, -1, "signal: killed")), 137);
        assert_eq!(exit_code(&end(false, -1, "signal: terminated")), 143);
        assert_eq!(exit_code(&end(false, -1, "signal: interrupt")), 130);
        assert_eq!(
            exit_code(&end(false, -1, "signal: segmentation fault")),
            139
        );
        assert_eq!(exit_code(&end(false, -1, "signal: sigusr1")), 138);
        assert_eq!(exit_code(&end(false, -1, "signal: sigrtmin+3")), 1);
        assert_eq!(exit_code(&end(false, -1, "unknown")), 1);
    }
}
