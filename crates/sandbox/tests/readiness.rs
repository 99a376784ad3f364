//! Readiness probe text and verdicts against scripted sandboxes (the local backend's tests
//! run the probe for real).

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::*;
use std::sync::Mutex;
use std::time::Duration;

/// Answers every exec with a fixed output, or never.
struct Scripted {
    output: Option<Result<String, PortError>>,
    commands: Mutex<Vec<(String, Option<u64>)>>,
}

impl Scripted {
    fn answering(output: Result<String, PortError>) -> Self {
        Self {
            output: Some(output),
            commands: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl SandboxPort for Scripted {
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError> {
        self.commands
            .lock()
            .unwrap()
            .push((command.to_owned(), timeout_ms));
        match &self.output {
            Some(output) => output.clone(),
            None => std::future::pending().await,
        }
    }
    async fn read_file(&self, _path: &str) -> Result<String, PortError> {
        Ok(String::new())
    }
    async fn write_file(&self, path: &str, _content: &str) -> Result<String, PortError> {
        Ok(path.into())
    }
}

#[test]
fn probe_text_checks_absolute_paths_with_test_x_and_names_with_command_v() {
    assert_eq!(
        readiness_probe_command("/usr/bin/node"),
        "if test -f '/usr/bin/node' && test -x '/usr/bin/node'; then printf '%s\\n' \
         __OPENMA_RUNTIME_READY__; else exit 127; fi"
    );
    assert_eq!(
        readiness_probe_command("claude"),
        "if command -v 'claude' >/dev/null 2>&1; then printf '%s\\n' __OPENMA_RUNTIME_READY__; \
         else exit 127; fi"
    );
}

#[test]
fn shell_quoting_survives_quotes_and_metacharacters() {
    assert_eq!(shell_quote("it's"), r"'it'\''s'");
    assert_eq!(shell_quote("$(rm -rf /); `x`"), "'$(rm -rf /); `x`'");
    assert_eq!(shell_quote(""), "''");
}

#[tokio::test]
async fn ready_when_the_marker_line_comes_back() {
    let sandbox = Scripted::answering(Ok("__OPENMA_RUNTIME_READY__".into()));
    verify_runtime_environment(&sandbox, "node", None)
        .await
        .unwrap();
    let commands = sandbox.commands.lock().unwrap();
    assert_eq!(commands[0].0, readiness_probe_command("node"));
    assert_eq!(commands[0].1, Some(10_000), "default timeout is 10 s");
}

#[tokio::test]
async fn not_ready_without_the_marker_and_the_error_quotes_the_output() {
    let sandbox = Scripted::answering(Ok("\n[exit exit=127]".into()));
    let error = verify_runtime_environment(&sandbox, "/opt/harness/bin/run", None)
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Runtime environment is not ready: harness executable /opt/harness/bin/run was not found \
         or is not executable (output: [exit exit=127])"
    );
    // The marker inside a longer line (for example an echoed command) is not readiness.
    let echoed = Scripted::answering(Ok("sh: echo __OPENMA_RUNTIME_READY__x: not found".into()));
    assert!(
        verify_runtime_environment(&echoed, "x", None)
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_failed_exec_and_bad_commands_are_clear_errors() {
    let broken = Scripted::answering(Err(PortError::new("sandbox is gone")));
    let error = verify_runtime_environment(&broken, "node", None)
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Runtime environment probe for harness executable node failed: sandbox is gone"
    );
    for bad in ["", "  ", "a\0b"] {
        let error = verify_runtime_environment(&broken, bad, None)
            .await
            .unwrap_err();
        assert_eq!(error.kind(), omabox_contract::ErrorKind::InvalidArgument);
    }
    assert!(broken.commands.lock().unwrap().len() == 1);
}

#[tokio::test(start_paused = true)]
async fn a_sandbox_that_never_answers_times_out() {
    let silent = Scripted {
        output: None,
        commands: Mutex::new(Vec::new()),
    };
    let error = verify_runtime_environment(&silent, "node", Some(Duration::from_millis(500)))
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Runtime environment probe for harness executable node timed out after 500 ms"
    );
    assert_eq!(silent.commands.lock().unwrap()[0].1, Some(500));
}
