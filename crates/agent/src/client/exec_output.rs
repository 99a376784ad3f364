//! The contract's combined output of an exec, as every backend that runs this agent
//! reports it (the linux and docker backends): stdout, then `"\n" + stderr` when stderr is
//! non-empty, trailing whitespace trimmed, then the exit line in the shell's numbering
//! (`[exit <n>]`, `128 + signal`, `124` after a timeout), with timeout, truncation and OOM
//! notes before it. Pure: must never lose or reorder output, nor invent an exit the agent
//! did not report.

use std::fmt::Write as _;
use std::time::Duration;

use super::ExecOutput;
use crate::message::ProcessExit;

/// Exit number reported for a command killed by its timeout.
const TIMEOUT_EXIT: i32 = 124;

/// What the sandbox's memory cgroup saw during one exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OomKill {
    /// The memory limit in bytes, when known.
    pub limit_bytes: Option<u64>,
}

/// The contract's combined output of an exec (see the module doc for the exact form).
/// `oom`: the kernel's OOM killer killed a process of the sandbox while the command
/// ran; a SIGKILL exit then says it was the memory limit.
pub fn format_exec_output(output: &ExecOutput, timeout: Duration, oom: Option<OomKill>) -> String {
    let mut text = output.combined();
    if output.exit.output_truncated {
        text.push_str(
            "\n[output truncated: a process the command started kept stdout/stderr open]",
        );
    }
    if output.truncated {
        let _ = write!(
            text,
            "\n[output truncated: more than {} bytes]",
            super::DEFAULT_MAX_EXEC_OUTPUT
        );
    }
    let killed = output.exit.signal.as_deref() == Some("SIGKILL") || output.exit.code == Some(137);
    if let Some(oom) = oom.filter(|_| killed && !output.exit.timed_out) {
        match oom.limit_bytes {
            Some(bytes) => {
                let _ = write!(
                    text,
                    "\n[killed by the memory limit of {} MiB]",
                    bytes.div_ceil(1 << 20)
                );
            }
            None => text.push_str("\n[killed by the memory limit]"),
        }
    }
    let status = if output.exit.timed_out {
        let _ = write!(text, "\n[timed out after {} ms]", timeout.as_millis());
        TIMEOUT_EXIT
    } else {
        exit_number(&output.exit)
    };
    if status != 0 {
        let _ = write!(text, "\n[exit {status}]");
    }
    text
}

/// The shell's number for an exit: the code, `128 + signal` for a signal, 255 when the
/// agent could tell neither.
pub fn exit_number(exit: &ProcessExit) -> i32 {
    match (&exit.code, &exit.signal) {
        (Some(code), _) => *code,
        (None, Some(signal)) => crate::sys::signal_number(signal).map_or(255, |n| 128 + n),
        (None, None) => 255,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn output(stdout: &str, stderr: &str, exit: ProcessExit) -> ExecOutput {
        ExecOutput {
            stdout: stdout.as_bytes().to_vec(),
            stderr: stderr.as_bytes().to_vec(),
            exit,
            truncated: false,
        }
    }

    fn code(n: i32) -> ProcessExit {
        ProcessExit {
            code: Some(n),
            ..ProcessExit::default()
        }
    }

    const T: Duration = Duration::from_secs(1);

    #[test]
    fn success_is_the_trimmed_combined_output() {
        assert_eq!(
            format_exec_output(&output("hi\n\n", "", code(0)), T, None),
            "hi"
        );
        assert_eq!(
            format_exec_output(&output("out\n", "err\n", code(0)), T, None),
            "out\n\nerr"
        );
    }

    #[test]
    fn failure_appends_the_exit_line() {
        assert_eq!(
            format_exec_output(&output("out", "err", code(2)), T, None),
            "out\nerr\n[exit 2]"
        );
        assert_eq!(
            format_exec_output(&output("", "", code(3)), T, None),
            "\n[exit 3]"
        );
    }

    #[test]
    fn signals_and_timeouts_use_the_shell_numbers() {
        let killed = ProcessExit {
            signal: Some("SIGKILL".into()),
            ..ProcessExit::default()
        };
        assert_eq!(
            format_exec_output(&output("x", "", killed.clone()), T, None),
            "x\n[exit 137]"
        );
        let oom = Some(OomKill {
            limit_bytes: Some(128 << 20),
        });
        assert_eq!(
            format_exec_output(&output("x", "", killed.clone()), T, oom),
            "x\n[killed by the memory limit of 128 MiB]\n[exit 137]"
        );
        // An OOM kill elsewhere in the sandbox does not explain a clean exit.
        assert_eq!(format_exec_output(&output("x", "", code(0)), T, oom), "x");
        let timed_out = ProcessExit {
            timed_out: true,
            ..killed
        };
        assert_eq!(
            format_exec_output(&output("x", "", timed_out), T, None),
            "x\n[timed out after 1000 ms]\n[exit 124]"
        );
    }
}
