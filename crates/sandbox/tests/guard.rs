//! SandboxExecutionGuard (execution-guard.ts semantics).

mod common;

use common::{Caps, FakeSandbox};
use omabox_contract::{AbortController, PortError};
use omabox_sandbox::*;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn guarded(
    sandbox: Arc<FakeSandbox>,
    signal: Option<&AbortController>,
    valid: Option<Arc<AtomicBool>>,
) -> SandboxExecutionGuard {
    with_sandbox_execution_guard(
        sandbox,
        SandboxExecutionGuardOptions {
            signal: signal.map(AbortController::signal),
            is_valid: valid.map(|flag| {
                Arc::new(move || flag.load(Ordering::SeqCst)) as Arc<dyn Fn() -> bool + Send + Sync>
            }),
        },
    )
}

#[tokio::test]
async fn a_valid_guard_passes_calls_through() {
    let sandbox = Arc::new(FakeSandbox::new(Caps::all()));
    let guard = guarded(sandbox.clone(), Some(&AbortController::new()), None);
    assert_eq!(guard.exec("ls", None).await.unwrap(), "ran ls");
    guard
        .as_file_bytes()
        .unwrap()
        .write_file_bytes("/workspace/a", b"x")
        .await
        .unwrap();
    assert_eq!(sandbox.log.names(), vec!["exec", "writeFileBytes"]);
}

#[tokio::test]
async fn an_invalid_fence_stops_the_call_before_the_provider() {
    let sandbox = Arc::new(FakeSandbox::new(Caps::all()));
    let valid = Arc::new(AtomicBool::new(false));
    let guard = guarded(sandbox.clone(), None, Some(valid));
    let error = guard.exec("rm -rf /workspace", None).await.unwrap_err();
    assert_eq!(
        error.message(),
        "sandbox execution fence is no longer valid"
    );
    let error = guard
        .as_env_vars()
        .unwrap()
        .set_env_vars(BTreeMap::new())
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "sandbox execution fence is no longer valid"
    );
    assert!(sandbox.log.entries().is_empty());
}

/// Flips the fence while the provider call runs.
struct FlipOnExec {
    valid: Arc<AtomicBool>,
}

#[async_trait::async_trait]
impl SandboxPort for FlipOnExec {
    async fn exec(&self, _command: &str, _timeout_ms: Option<u64>) -> Result<String, PortError> {
        self.valid.store(false, Ordering::SeqCst);
        Ok("late result".into())
    }
    async fn read_file(&self, _path: &str) -> Result<String, PortError> {
        Ok(String::new())
    }
    async fn write_file(&self, path: &str, _content: &str) -> Result<String, PortError> {
        Ok(path.into())
    }
}

#[tokio::test]
async fn a_result_arriving_after_the_fence_was_lost_is_never_returned() {
    let valid = Arc::new(AtomicBool::new(true));
    let guard = with_sandbox_execution_guard(
        Arc::new(FlipOnExec {
            valid: valid.clone(),
        }),
        SandboxExecutionGuardOptions {
            signal: None,
            is_valid: Some(Arc::new(move || valid.load(Ordering::SeqCst))),
        },
    );
    let error = guard.exec("echo", None).await.unwrap_err();
    assert_eq!(
        error.message(),
        "sandbox execution fence is no longer valid"
    );
}

#[tokio::test]
async fn an_abort_during_a_pending_call_fails_it_with_the_reason() {
    let sandbox = Arc::new(FakeSandbox::new(Caps::all()).hanging("exec"));
    let controller = AbortController::new();
    let guard = guarded(sandbox.clone(), Some(&controller), None);
    let aborter = controller.clone();
    let log = sandbox.log.clone();
    tokio::spawn(async move {
        // Abort while exec is pending in the provider.
        log.wait_until(|entry| entry.starts_with("exec")).await;
        aborter.abort(PortError::new("lease lost"));
    });
    let error = guard.exec("sleep 100", None).await.unwrap_err();
    assert_eq!(error.message(), "lease lost");
    assert_eq!(sandbox.log.names(), vec!["exec"]);
    // Later calls fail before the provider.
    let error = guard.read_file("/workspace/x").await.unwrap_err();
    assert_eq!(error.message(), "lease lost");
    assert_eq!(sandbox.log.names(), vec!["exec"]);
}

#[tokio::test]
async fn an_abort_without_a_specific_reason_uses_the_signal_default() {
    let controller = AbortController::new();
    controller.abort(PortError::new(""));
    let guard = guarded(
        Arc::new(FakeSandbox::new(Caps::all())),
        Some(&controller),
        None,
    );
    let error = guard.exec("true", None).await.unwrap_err();
    assert_eq!(error.message(), "sandbox execution was aborted");
}

#[tokio::test]
async fn introspection_and_local_registration_are_exempt() {
    let sandbox = Arc::new(FakeSandbox::new(Caps::all()));
    let controller = AbortController::new();
    controller.abort(PortError::new("fenced"));
    let guard = guarded(sandbox.clone(), Some(&controller), None);
    let runtime = guard.as_runtime().unwrap();
    assert_eq!(runtime.runtime_handle().runtime_id, "rt-1");
    assert!(runtime.runtime_capabilities().lease);
    assert_eq!(
        runtime.status().await.unwrap(),
        SandboxRuntimeStatus::Running
    );
    assert!(
        guard
            .as_session_output_mount()
            .unwrap()
            .session_output_mount_capabilities()
            .is_some()
    );
    guard
        .as_command_secrets()
        .unwrap()
        .register_command_secrets("gh ", BTreeMap::new());
    assert_eq!(
        sandbox.log.names(),
        vec![
            "runtimeHandle",
            "runtimeCapabilities",
            "status",
            "registerCommandSecrets"
        ]
    );
    // Everything else is fenced, including runtime mutations.
    assert_eq!(
        runtime.renew_lease(1000).await.unwrap_err().message(),
        "fenced"
    );
    assert_eq!(
        guard
            .as_destroy()
            .unwrap()
            .destroy()
            .await
            .unwrap_err()
            .message(),
        "fenced"
    );
}

#[tokio::test]
async fn the_guard_exposes_exactly_the_wrapped_capabilities() {
    let bare = guarded(Arc::new(FakeSandbox::new(Caps::default())), None, None);
    assert!(!supports_duplex_process(&bare));
    assert!(!supports_sandbox_runtime(&bare));
    assert!(!supports_workspace_backup(&bare));
    assert!(!supports_managed_workspace_lifecycle(&bare));
    assert!(!supports_session_output_mount(&bare));
    assert!(bare.as_process().is_none());
    assert!(bare.as_file_bytes().is_none());

    let full = guarded(Arc::new(FakeSandbox::new(Caps::all())), None, None);
    assert!(supports_duplex_process(&full));
    assert!(supports_sandbox_runtime(&full));
    assert!(supports_workspace_backup(&full));
    assert!(supports_managed_workspace_lifecycle(&full));
    assert!(supports_session_output_mount(&full));

    let null_outputs = guarded(
        Arc::new(FakeSandbox::new(Caps {
            outputs: Some(None),
            ..Caps::default()
        })),
        None,
        None,
    );
    assert!(!supports_session_output_mount(&null_outputs));
}

#[tokio::test]
async fn background_processes_are_terminated_when_the_signal_aborts() {
    let sandbox = Arc::new(FakeSandbox::new(Caps::all()));
    let controller = AbortController::new();
    let guard = guarded(sandbox.clone(), Some(&controller), None);
    let handle = guard
        .as_process()
        .unwrap()
        .start_process("server")
        .await
        .unwrap();
    assert_eq!(handle.id, "proc_1");
    controller.abort(PortError::new("fenced"));
    tokio::time::timeout(
        Duration::from_secs(10),
        sandbox.log.wait_until(|entry| entry == "kill SIGTERM"),
    )
    .await
    .expect("the process is terminated once the signal aborts");
    assert_eq!(
        sandbox.log.entries(),
        vec!["startProcess server", "kill SIGTERM"]
    );
}

/// Loses the fence while starting a process.
struct FlipOnStart {
    valid: Arc<AtomicBool>,
    log: common::Log,
}

#[async_trait::async_trait]
impl SandboxPort for FlipOnStart {
    async fn exec(&self, _command: &str, _timeout_ms: Option<u64>) -> Result<String, PortError> {
        Ok(String::new())
    }
    async fn read_file(&self, _path: &str) -> Result<String, PortError> {
        Ok(String::new())
    }
    async fn write_file(&self, path: &str, _content: &str) -> Result<String, PortError> {
        Ok(path.into())
    }
    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        Some(self)
    }
}

#[async_trait::async_trait]
impl SandboxProcessPort for FlipOnStart {
    async fn start_process(&self, _command: &str) -> Result<ProcessHandle, PortError> {
        self.valid.store(false, Ordering::SeqCst);
        Ok(ProcessHandle::new(
            "proc_9",
            9,
            Arc::new(common::FakeProcess {
                log: self.log.clone(),
            }),
        ))
    }
}

#[tokio::test]
async fn a_process_whose_start_is_fenced_afterwards_is_killed_not_leaked() {
    let valid = Arc::new(AtomicBool::new(true));
    let log = common::Log::default();
    let check = valid.clone();
    let guard = with_sandbox_execution_guard(
        Arc::new(FlipOnStart {
            valid: valid.clone(),
            log: log.clone(),
        }),
        SandboxExecutionGuardOptions {
            signal: None,
            is_valid: Some(Arc::new(move || check.load(Ordering::SeqCst))),
        },
    );
    let error = guard
        .as_process()
        .unwrap()
        .start_process("server")
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "sandbox execution fence is no longer valid"
    );
    assert_eq!(log.entries(), vec!["kill SIGTERM"]);
}
