//! The host's supervised harness driver over a real supervisor process, through
//! `omabox_sandbox::supervisor_channel::JsonLinesSupervisorChannel` (moved here from the
//! channel's own unit tests when the channel moved from `omabox-host` to `omabox-sandbox`).

use futures::FutureExt;
use omabox_contract::{
    AbortController, AbortSignal, HarnessDriverDeclaration, HarnessIdentity,
    HarnessSupervisorChannel, HarnessSupervisorTransportPort, ManagedSandboxLease,
    ManagedWorkExecutionResult, OpenSupervisorInput, PortError, RunHarnessInput,
    RuntimeProcessDeclaration, RuntimeResourceFence, RuntimeResourceScope,
    SandboxHarnessDriverPort, SecretString, SupervisorProtocol,
};
use omabox_host::supervisor_driver::SupervisedSandboxHarnessDriver;
use omabox_sandbox::supervisor_channel::{JsonLinesSupervisorChannel, SupervisorKill};
use std::sync::Arc;

/// A transport that runs the supervisor as a real `sh` child process.
struct ShellTransport {
    script: &'static str,
}

#[async_trait::async_trait]
impl HarnessSupervisorTransportPort for ShellTransport {
    async fn open(
        &self,
        input: OpenSupervisorInput,
    ) -> Result<Box<dyn HarnessSupervisorChannel>, PortError> {
        let mut child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(self.script)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child
            .stdin
            .take()
            .ok_or_else(|| PortError::new("no stdin"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| PortError::new("no stdout"))?;
        let stderr = child
            .stderr
            .take()
            .ok_or_else(|| PortError::new("no stderr"))?;
        let kill: SupervisorKill = Box::new(move || {
            async move {
                if let Some(pid) = child.id() {
                    let _ = tokio::process::Command::new("kill")
                        .arg("-TERM")
                        .arg(pid.to_string())
                        .status()
                        .await;
                }
                child.wait().await?;
                Ok(())
            }
            .boxed()
        });
        Ok(Box::new(
            JsonLinesSupervisorChannel::new(Box::new(stdin), Box::new(stdout), kill, input.signal)
                .with_stderr(Box::new(stderr)),
        ))
    }
}

fn supervised_input() -> RunHarnessInput {
    RunHarnessInput {
        scope: RuntimeResourceScope::new("w", "e", "s", "k"),
        fence: RuntimeResourceFence {
            workspace_id: "w".into(),
            environment_id: "e".into(),
            session_id: "s".into(),
            work_id: "k".into(),
            owner_id: "o".into(),
            generation: 1,
            token: SecretString::new("fence-secret"),
            expires_at: "2026-09-03T12:00:00.000Z".into(),
        },
        sandbox: ManagedSandboxLease {
            provider: "local".into(),
            runtime_id: "r".into(),
            metadata: None,
        },
        workspace_path: "/workspace".into(),
        output_path: None,
        driver: HarnessDriverDeclaration::OpenmaSupervised {
            protocol: SupervisorProtocol::V1,
            supervisor: RuntimeProcessDeclaration::command("sh"),
            harness: HarnessIdentity {
                id: "pi".into(),
                version: "1".into(),
            },
            ready_timeout_ms: 5_000,
            heartbeat_timeout_ms: 5_000,
            drain_timeout_ms: 5_000,
        },
        checkpoint: None,
        signal: AbortSignal::never(),
    }
}

#[tokio::test]
async fn drives_a_real_supervisor_process_over_stdio() {
    // Checks the start command, chats on stderr, and ends with an unterminated record.
    let script = r#"
        read start
        case "$start" in
          *'"type":"start"'*'"workspacePath":"/workspace"'*) ;;
          *) echo "bad start: $start" >&2; exit 3 ;;
        esac
        case "$start" in *fence-secret*) exit 4 ;; esac
        echo "noise on stderr" >&2
        printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n\n'
        printf '  {"type":"heartbeat","sequence":1}  \n{"type":"completed","exitCode":0}\n'
        read drain
        case "$drain" in '{"type":"drain"}') ;; *) exit 5 ;; esac
        printf '{"type":"drained"}'
    "#;
    let driver = SupervisedSandboxHarnessDriver::new(Arc::new(ShellTransport { script }));
    assert_eq!(
        driver.run(supervised_input()).await,
        Ok(ManagedWorkExecutionResult::Completed)
    );
}

#[tokio::test]
async fn reports_a_real_supervisor_that_exits_early() {
    let driver = SupervisedSandboxHarnessDriver::new(Arc::new(ShellTransport {
        script: "read start; exit 0",
    }));
    let error = driver.run(supervised_input()).await.unwrap_err();
    assert_eq!(error.message(), "Supervisor closed before ready");
}

#[tokio::test]
async fn stops_a_hanging_real_supervisor_when_cancelled() {
    // The supervisor says it is running through a FIFO: the test blocks on reading it
    // instead of sleeping, then cancels a supervisor that is certainly up.
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("running");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let script: &'static str = Box::leak(
        format!(
            r#"read start; printf '{{"type":"ready","protocol":"openma-harness-supervisor-v1"}}\n'; echo up > '{}'; while :; do sleep 1; done"#,
            fifo.display()
        )
        .into_boxed_str(),
    );
    let driver = SupervisedSandboxHarnessDriver::new(Arc::new(ShellTransport { script }));
    let controller = AbortController::new();
    let mut input = supervised_input();
    input.signal = controller.signal();
    let running = tokio::spawn(async move { driver.run(input).await });
    let up = tokio::task::spawn_blocking(move || std::fs::read_to_string(fifo));
    let up = tokio::time::timeout(std::time::Duration::from_secs(10), up)
        .await
        .expect("the supervisor starts")
        .unwrap()
        .unwrap();
    assert_eq!(up.trim(), "up");
    controller.abort(PortError::new("lease lost"));
    let result = tokio::time::timeout(std::time::Duration::from_secs(10), running)
        .await
        .expect("close kills the supervisor promptly")
        .unwrap();
    assert_eq!(result, Ok(ManagedWorkExecutionResult::Aborted));
}
