//! run_with_sandbox_lease (lease.ts semantics) under tokio's paused clock.

use async_trait::async_trait;
use omabox_contract::{AbortController, PortError};
use omabox_sandbox::*;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Records each renewal's time (ms since start) and fails renewal number `fail_at` (1-based)
/// and every later one.
struct FakeRuntime {
    start: Instant,
    renewals: Mutex<Vec<(u64, u64)>>,
    fail_at: Option<usize>,
}

impl FakeRuntime {
    fn new(fail_at: Option<usize>) -> Self {
        Self {
            start: Instant::now(),
            renewals: Mutex::new(Vec::new()),
            fail_at,
        }
    }
    fn renewal_times(&self) -> Vec<u64> {
        self.renewals
            .lock()
            .unwrap()
            .iter()
            .map(|(at, _)| *at)
            .collect()
    }
}

#[async_trait]
impl SandboxRuntimePort for FakeRuntime {
    fn runtime_handle(&self) -> SandboxRuntimeHandle {
        SandboxRuntimeHandle {
            provider: "fake".into(),
            runtime_id: "rt-7".into(),
        }
    }
    fn runtime_capabilities(&self) -> SandboxRuntimeCapabilities {
        SandboxRuntimeCapabilities {
            lease: true,
            ..SandboxRuntimeCapabilities::default()
        }
    }
    async fn status(&self) -> Result<SandboxRuntimeStatus, PortError> {
        Ok(SandboxRuntimeStatus::Running)
    }
    async fn renew_lease(&self, ttl_ms: u64) -> Result<(), PortError> {
        let mut renewals = self.renewals.lock().unwrap();
        renewals.push((self.start.elapsed().as_millis() as u64, ttl_ms));
        if self.fail_at.is_some_and(|n| renewals.len() >= n) {
            return Err(PortError::new("provider says no"));
        }
        Ok(())
    }
    async fn suspend(
        &self,
        _: SandboxCheckpointKind,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::new("unused"))
    }
    async fn resume(&self, _: &SandboxCheckpointHandle) -> Result<(), PortError> {
        Err(PortError::new("unused"))
    }
    async fn checkpoint(
        &self,
        _: SandboxCheckpointKind,
        _: Option<&str>,
    ) -> Result<SandboxCheckpointHandle, PortError> {
        Err(PortError::new("unused"))
    }
}

fn options(ttl_ms: u64, interval_ms: Option<u64>) -> SandboxLeaseOptions {
    SandboxLeaseOptions {
        ttl_ms,
        interval_ms,
        signal: None,
    }
}

#[tokio::test(start_paused = true)]
async fn ttl_and_interval_are_validated_before_any_renewal() {
    let runtime = FakeRuntime::new(None);
    let cases = [
        (options(0, None), "sandbox lease ttlMs must be positive"),
        (
            options(1000, Some(0)),
            "sandbox lease intervalMs must be positive and less than ttlMs",
        ),
        (
            options(1000, Some(1000)),
            "sandbox lease intervalMs must be positive and less than ttlMs",
        ),
        (
            options(1000, Some(5000)),
            "sandbox lease intervalMs must be positive and less than ttlMs",
        ),
    ];
    for (options, message) in cases {
        let error = run_with_sandbox_lease(&runtime, options, |_| async { Ok(()) })
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), message);
        let port: PortError = error.into();
        assert_eq!(port.kind(), omabox_contract::ErrorKind::InvalidArgument);
    }
    assert!(runtime.renewal_times().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_failed_initial_renewal_is_a_lost_lease_and_the_operation_never_runs() {
    let runtime = FakeRuntime::new(Some(1));
    let mut ran = false;
    let error = run_with_sandbox_lease(&runtime, options(90_000, None), |_| {
        ran = true;
        async { Ok(()) }
    })
    .await
    .unwrap_err();
    assert!(!ran);
    assert_eq!(error.to_string(), "sandbox runtime rt-7 lost its lease");
    match error {
        SandboxLeaseError::Lost(lost) => {
            assert_eq!(lost.runtime_id, "rt-7");
            assert_eq!(lost.cause.message(), "provider says no");
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renews_every_interval_while_the_operation_runs_and_stops_after() {
    let runtime = FakeRuntime::new(None);
    // ttl 10 s: default interval min(30 s, 5 s) = 5 s.
    let value = run_with_sandbox_lease(&runtime, options(10_000, None), |_| async {
        tokio::time::sleep(Duration::from_millis(12_000)).await;
        Ok(42)
    })
    .await
    .unwrap();
    assert_eq!(value, 42);
    assert_eq!(runtime.renewal_times(), vec![0, 5_000, 10_000]);
    assert!(
        runtime
            .renewals
            .lock()
            .unwrap()
            .iter()
            .all(|(_, ttl)| *ttl == 10_000)
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(runtime.renewal_times().len(), 3, "renewals must stop");
}

#[tokio::test(start_paused = true)]
async fn the_default_interval_is_capped_at_thirty_seconds() {
    let runtime = FakeRuntime::new(None);
    run_with_sandbox_lease(&runtime, options(90_000, None), |_| async {
        tokio::time::sleep(Duration::from_millis(61_000)).await;
        Ok(())
    })
    .await
    .unwrap();
    assert_eq!(runtime.renewal_times(), vec![0, 30_000, 60_000]);
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_aborts_the_operation_and_rejects_at_once() {
    let runtime = FakeRuntime::new(Some(3));
    let op_signal = Mutex::new(None);
    let started = Instant::now();
    let error = run_with_sandbox_lease(&runtime, options(1_000, Some(100)), |signal| {
        *op_signal.lock().unwrap() = Some(signal.clone());
        async move {
            // An operation that ignores its signal must not delay the rejection.
            std::future::pending::<()>().await;
            Ok(())
        }
    })
    .await
    .unwrap_err();
    assert!(matches!(error, SandboxLeaseError::Lost(_)));
    assert_eq!(error.to_string(), "sandbox runtime rt-7 lost its lease");
    assert_eq!(started.elapsed(), Duration::from_millis(200));
    // Whatever the operation handed its signal to (child tasks, processes) sees the abort.
    let signal = op_signal.lock().unwrap().clone().unwrap();
    assert_eq!(
        signal
            .reason()
            .map(|reason| reason.message().to_owned())
            .as_deref(),
        Some("sandbox runtime rt-7 lost its lease")
    );
}

#[tokio::test(start_paused = true)]
async fn an_external_abort_is_forwarded_to_the_operation() {
    let runtime = FakeRuntime::new(None);
    let external = AbortController::new();
    let options = SandboxLeaseOptions {
        signal: Some(external.signal()),
        ..options(10_000, None)
    };
    let aborter = external.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        aborter.abort(PortError::new("user cancelled"));
    });
    let error = run_with_sandbox_lease(&runtime, options, |signal| async move {
        Err::<(), _>(signal.aborted().await)
    })
    .await
    .unwrap_err();
    match error {
        SandboxLeaseError::Operation(reason) => assert_eq!(reason.message(), "user cancelled"),
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn an_already_aborted_external_signal_reaches_the_operation_immediately() {
    let runtime = FakeRuntime::new(None);
    let external = AbortController::new();
    external.abort(PortError::new("too late"));
    let options = SandboxLeaseOptions {
        signal: Some(external.signal()),
        ..options(10_000, None)
    };
    let result = run_with_sandbox_lease(&runtime, options, |signal| async move {
        Ok(signal.reason().map(|reason| reason.message().to_owned()))
    })
    .await
    .unwrap();
    assert_eq!(result.as_deref(), Some("too late"));
}

#[tokio::test(start_paused = true)]
async fn an_operation_error_is_returned_as_is() {
    let runtime = FakeRuntime::new(None);
    let error = run_with_sandbox_lease(&runtime, options(10_000, None), |_| async {
        Err::<(), _>(PortError::new("tool crashed"))
    })
    .await
    .unwrap_err();
    assert_eq!(
        error,
        SandboxLeaseError::Operation(PortError::new("tool crashed"))
    );
}
