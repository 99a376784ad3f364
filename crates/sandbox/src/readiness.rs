//! The runtime readiness probe (`verifyRuntimeEnvironment`).
//!
//! A managed runtime publishes no lease until the plan's harness executable is proven
//! runnable inside the sandbox: an absolute command must be an executable file (`test -x`),
//! anything else must be found on `PATH` (`command -v`). On success the probe prints
//! [`RUNTIME_READY_MARKER`] on a line of its own.
//!
//! The exact probe text is NOT FOUND in the reference; this is omabox's design. The probe
//! never echoes the command back, so a command whose name contains the marker cannot fake
//! readiness, and readiness requires a line that is exactly the marker.

use crate::port::SandboxPort;
use omabox_contract::PortError;
use std::time::Duration;

/// What the probe prints when the harness is runnable.
pub const RUNTIME_READY_MARKER: &str = "__OPENMA_RUNTIME_READY__";

/// Timeout of [`verify_runtime_environment`] when the caller passes none.
pub const DEFAULT_READINESS_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of the probe output an error quotes (the tail is kept).
const OUTPUT_QUOTE_LIMIT: usize = 500;

/// Quotes `value` for a POSIX shell: `'…'` with embedded `'` written as `'\''`.
pub fn shell_quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('\'');
    for ch in value.chars() {
        if ch == '\'' {
            quoted.push_str("'\\''");
        } else {
            quoted.push(ch);
        }
    }
    quoted.push('\'');
    quoted
}

fn validate_command(command: &str) -> Result<(), PortError> {
    if command.trim().is_empty() {
        return Err(PortError::invalid_argument(
            "harness command for the readiness probe must not be empty",
        ));
    }
    if command.contains('\0') {
        return Err(PortError::invalid_argument(
            "harness command for the readiness probe must not contain NUL",
        ));
    }
    Ok(())
}

/// The shell text that prints [`RUNTIME_READY_MARKER`] iff `command` is runnable, and
/// otherwise exits 127 without output.
///
/// Absolute paths: `test -f && test -x` (a directory is not a harness). Other names:
/// `command -v`. `command` must be non-empty and free of NUL bytes (see
/// [`verify_runtime_environment`], which checks).
pub fn readiness_probe_command(command: &str) -> String {
    let quoted = shell_quote(command);
    let check = if command.starts_with('/') {
        format!("test -f {quoted} && test -x {quoted}")
    } else {
        format!("command -v {quoted} >/dev/null 2>&1")
    };
    format!("if {check}; then printf '%s\\n' {RUNTIME_READY_MARKER}; else exit 127; fi")
}

fn tail(output: &str) -> &str {
    let trimmed = output.trim();
    if trimmed.len() <= OUTPUT_QUOTE_LIMIT {
        return trimmed;
    }
    let mut start = trimmed.len() - OUTPUT_QUOTE_LIMIT;
    while !trimmed.is_char_boundary(start) {
        start += 1;
    }
    &trimmed[start..]
}

/// Runs the readiness probe for `command` in `sandbox`; `Ok` only when the marker came back.
///
/// Errors: an empty command (`TypeError`); the sandbox could not run the probe; the probe did
/// not finish within `timeout` (default 10 s); the marker is absent — "Runtime environment is
/// not ready: harness executable <cmd> was not found or is not executable (output: …)".
pub async fn verify_runtime_environment(
    sandbox: &dyn SandboxPort,
    command: &str,
    timeout: Option<Duration>,
) -> Result<(), PortError> {
    validate_command(command)?;
    let timeout = timeout.unwrap_or(DEFAULT_READINESS_TIMEOUT);
    let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let probe = readiness_probe_command(command);
    // The sandbox enforces the timeout on the command; the outer bound (with a second of
    // grace) covers a sandbox that does not answer at all.
    let outer = timeout.saturating_add(Duration::from_secs(1));
    let output = match tokio::time::timeout(outer, sandbox.exec(&probe, Some(timeout_ms))).await {
        Ok(Ok(output)) => output,
        Ok(Err(error)) => {
            return Err(PortError::with_kind(
                error.kind(),
                format!(
                    "Runtime environment probe for harness executable {command} failed: {}",
                    error.message()
                ),
            ));
        }
        Err(_) => {
            return Err(PortError::new(format!(
                "Runtime environment probe for harness executable {command} timed out after \
                 {timeout_ms} ms"
            )));
        }
    };
    if output
        .lines()
        .any(|line| line.trim() == RUNTIME_READY_MARKER)
    {
        return Ok(());
    }
    Err(PortError::new(format!(
        "Runtime environment is not ready: harness executable {command} was not found or is \
         not executable (output: {})",
        tail(&output)
    )))
}
