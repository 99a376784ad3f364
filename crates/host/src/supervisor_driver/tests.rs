//! Port of `supervisor-driver.test.ts`, plus every deadline and protocol text of reference §2.8.

use super::*;
use futures::FutureExt;
use omabox_contract::{
    ErrorKind, HarnessIdentity, LiveCheckpointCallback, ManagedSandboxLease,
    RuntimeProcessDeclaration, RuntimeResourceFence, SecretString,
};
use omabox_test_support::drivers::{ScriptEnd, ScriptedSupervisorTransport};
use std::sync::Mutex;

const FENCE_TOKEN: &str = "must-not-enter-sandbox";

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace_1", "environment_1", "session_1", "work_1")
}

fn declaration() -> HarnessDriverDeclaration {
    timeouts(5_000, 10_000, 5_000)
}

fn timeouts(ready: i64, heartbeat: i64, drain: i64) -> HarnessDriverDeclaration {
    HarnessDriverDeclaration::OpenmaSupervised {
        protocol: SupervisorProtocol::V1,
        supervisor: RuntimeProcessDeclaration::command("openma-harness-supervisor"),
        harness: HarnessIdentity {
            id: "pi".into(),
            version: "1.2.3".into(),
        },
        ready_timeout_ms: ready,
        heartbeat_timeout_ms: heartbeat,
        drain_timeout_ms: drain,
    }
}

fn input(driver: HarnessDriverDeclaration, signal: AbortSignal) -> RunHarnessInput {
    RunHarnessInput {
        scope: scope(),
        fence: RuntimeResourceFence {
            workspace_id: "workspace_1".into(),
            environment_id: "environment_1".into(),
            session_id: "session_1".into(),
            work_id: "work_1".into(),
            owner_id: "worker_1".into(),
            generation: 8,
            token: SecretString::new(FENCE_TOKEN),
            expires_at: "2026-09-03T12:00:00.000Z".into(),
        },
        sandbox: ManagedSandboxLease {
            provider: "fake".into(),
            runtime_id: "runtime_1".into(),
            metadata: None,
        },
        workspace_path: "/workspace".into(),
        output_path: None,
        driver,
        checkpoint: None,
        signal,
    }
}

fn ready() -> HarnessSupervisorEvent {
    HarnessSupervisorEvent::Ready {
        protocol: SUPERVISOR_PROTOCOL_V1.into(),
    }
}

fn checkpoint_event(checkpoint_id: &str, session_id: &str) -> HarnessSupervisorEvent {
    HarnessSupervisorEvent::Checkpoint {
        checkpoint_id: checkpoint_id.into(),
        session_id: session_id.into(),
        turn_id: None,
    }
}

fn stop(reason: SupervisorStopReason) -> HarnessSupervisorCommand {
    HarnessSupervisorCommand::Stop { reason }
}

/// A callback that records each request and then returns `outcome`.
fn recording_callback(
    outcome: Result<(), PortError>,
) -> (LiveCheckpointCallback, Arc<Mutex<Vec<LiveTurnCheckpoint>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let callback: LiveCheckpointCallback = {
        let seen = Arc::clone(&seen);
        Arc::new(move |request| {
            seen.lock().unwrap().push(request);
            let outcome = outcome.clone();
            async move { outcome }.boxed()
        })
    };
    (callback, seen)
}

async fn run(
    transport: &ScriptedSupervisorTransport,
    input: RunHarnessInput,
) -> Result<ManagedWorkExecutionResult, PortError> {
    SupervisedSandboxHarnessDriver::new(Arc::new(transport.clone()))
        .run(input)
        .await
}

#[tokio::test]
async fn advertises_only_the_supervised_harness_driver() {
    let driver =
        SupervisedSandboxHarnessDriver::new(Arc::new(ScriptedSupervisorTransport::new(vec![])));
    assert_eq!(
        driver.driver_capabilities(&scope()).await.unwrap().drivers,
        vec![HarnessDriverType::OpenmaSupervised]
    );
}

#[tokio::test]
async fn rejects_another_driver_before_opening_a_supervisor_transport() {
    let transport = ScriptedSupervisorTransport::new(vec![]);
    let error = run(
        &transport,
        input(
            HarnessDriverDeclaration::AmaWorker {
                process: RuntimeProcessDeclaration::command("node"),
            },
            AbortSignal::never(),
        ),
    )
    .await
    .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::SupervisorProtocol);
    assert_eq!(error.message(), "Supervised driver cannot run ama_worker");
    assert_eq!(transport.recorder().opens(), 0);
}

#[tokio::test]
async fn does_not_open_a_transport_for_an_already_cancelled_generation() {
    let transport = ScriptedSupervisorTransport::new(vec![ready()]);
    let signal = AbortSignal::aborted_with(PortError::new("lease already lost"));
    let result = run(&transport, input(declaration(), signal)).await;
    assert_eq!(result, Ok(ManagedWorkExecutionResult::Aborted));
    assert_eq!(transport.recorder().opens(), 0);
}

#[tokio::test]
async fn performs_ready_heartbeat_completion_and_drain_without_exposing_the_fence_token() {
    let transport = ScriptedSupervisorTransport::new(vec![
        ready(),
        HarnessSupervisorEvent::Heartbeat { sequence: 1 },
        HarnessSupervisorEvent::Completed { exit_code: 0 },
        HarnessSupervisorEvent::Drained,
    ]);
    let mut run_input = input(declaration(), AbortSignal::never());
    run_input.output_path = Some("/mnt/session/outputs".into());
    let result = run(&transport, run_input).await;
    assert_eq!(result, Ok(ManagedWorkExecutionResult::Completed));
    let recorder = transport.recorder();
    assert_eq!(
        recorder.commands(),
        vec![
            HarnessSupervisorCommand::Start {
                scope: scope(),
                harness: HarnessIdentity {
                    id: "pi".into(),
                    version: "1.2.3".into()
                },
                workspace_path: "/workspace".into(),
                output_path: Some("/mnt/session/outputs".into()),
            },
            HarnessSupervisorCommand::Drain,
        ]
    );
    let wire: String = recorder
        .commands()
        .iter()
        .map(HarnessSupervisorCommand::to_json_line)
        .collect();
    assert!(!wire.contains(FENCE_TOKEN));
    assert_eq!(recorder.closes(), 1);
}

#[tokio::test]
async fn commits_each_supervisor_checkpoint_through_the_runtime_host_before_continuing() {
    let transport = ScriptedSupervisorTransport::new(vec![
        ready(),
        HarnessSupervisorEvent::Checkpoint {
            checkpoint_id: "checkpoint_1".into(),
            session_id: "session_1".into(),
            turn_id: Some("turn_1".into()),
        },
        HarnessSupervisorEvent::Completed { exit_code: 0 },
        HarnessSupervisorEvent::Drained,
    ]);
    let (callback, seen) = recording_callback(Ok(()));
    let mut run_input = input(declaration(), AbortSignal::never());
    run_input.checkpoint = Some(callback);
    assert_eq!(
        run(&transport, run_input).await,
        Ok(ManagedWorkExecutionResult::Completed)
    );
    assert_eq!(
        *seen.lock().unwrap(),
        vec![LiveTurnCheckpoint {
            checkpoint_id: "checkpoint_1".into(),
            session_id: "session_1".into(),
            turn_id: Some("turn_1".into()),
        }]
    );
    let commands = transport.recorder().commands();
    let commit = HarnessSupervisorCommand::CheckpointCommit {
        checkpoint_id: "checkpoint_1".into(),
    };
    assert_eq!(
        commands[1], commit,
        "committed before draining: {commands:?}"
    );
    assert_eq!(commands[2], HarnessSupervisorCommand::Drain);
}

#[tokio::test]
async fn rejects_and_stops_the_supervisor_when_a_live_checkpoint_cannot_be_committed() {
    let transport = ScriptedSupervisorTransport::new(vec![
        ready(),
        checkpoint_event("checkpoint_1", "session_1"),
    ]);
    let failure = PortError::new("workspace fence lost");
    let (callback, _) = recording_callback(Err(failure.clone()));
    let mut run_input = input(declaration(), AbortSignal::never());
    run_input.checkpoint = Some(callback);
    assert_eq!(run(&transport, run_input).await, Err(failure));
    let commands = transport.recorder().commands();
    assert!(
        commands.contains(&HarnessSupervisorCommand::CheckpointReject {
            checkpoint_id: "checkpoint_1".into(),
            message: "workspace fence lost".into(),
        })
    );
    assert!(commands.contains(&stop(SupervisorStopReason::Failed)));
}

#[tokio::test]
async fn rejects_an_invalid_supervisor_checkpoint_request() {
    let cases = [
        ("", "session_1", true),
        ("checkpoint_1", "session_intruder", true),
        ("checkpoint_1", "session_1", false),
    ];
    for (checkpoint_id, session_id, with_callback) in cases {
        let transport = ScriptedSupervisorTransport::new(vec![
            ready(),
            checkpoint_event(checkpoint_id, session_id),
        ]);
        let (callback, seen) = recording_callback(Ok(()));
        let mut run_input = input(declaration(), AbortSignal::never());
        run_input.checkpoint = with_callback.then_some(callback);
        let error = run(&transport, run_input).await.unwrap_err();
        assert_eq!(error.kind(), ErrorKind::SupervisorProtocol);
        assert_eq!(error.message(), "Supervisor checkpoint request is invalid");
        assert!(seen.lock().unwrap().is_empty());
        assert!(
            transport
                .recorder()
                .commands()
                .contains(&stop(SupervisorStopReason::Failed))
        );
    }
}

#[tokio::test]
async fn preserves_a_checkpoint_failure_when_rejection_delivery_also_fails() {
    let transport = ScriptedSupervisorTransport::new(vec![
        ready(),
        checkpoint_event("checkpoint_1", "session_1"),
    ])
    .failing_send(
        "checkpoint.reject",
        PortError::new("rejection transport closed"),
    );
    let (callback, _) = recording_callback(Err(PortError::new("checkpoint failed")));
    let mut run_input = input(declaration(), AbortSignal::never());
    run_input.checkpoint = Some(callback);
    assert_eq!(
        run(&transport, run_input).await.unwrap_err().message(),
        "checkpoint failed"
    );
    assert!(transport.recorder().commands().contains(
        &HarnessSupervisorCommand::CheckpointReject {
            checkpoint_id: "checkpoint_1".into(),
            message: "checkpoint failed".into(),
        }
    ));
}

#[tokio::test]
async fn sends_a_bounded_stop_when_the_runtime_host_aborts_it() {
    let transport = ScriptedSupervisorTransport::new(vec![ready()]).ending(ScriptEnd::WaitForAbort);
    let recorder = transport.recorder();
    let controller = AbortController::new();
    let running = tokio::spawn({
        let transport = transport.clone();
        let run_input = input(declaration(), controller.signal());
        async move { run(&transport, run_input).await }
    });
    recorder.wait_for_yielded(1).await;
    controller.abort(PortError::new("lease lost"));
    assert_eq!(
        running.await.unwrap(),
        Ok(ManagedWorkExecutionResult::Aborted)
    );
    assert!(
        recorder
            .commands()
            .contains(&stop(SupervisorStopReason::Aborted))
    );
    assert_eq!(recorder.closes(), 1);
}

#[tokio::test]
async fn stops_a_generation_after_a_protocol_failure() {
    let cases: Vec<(&str, Vec<HarnessSupervisorEvent>, &str)> = vec![
        (
            "protocol mismatch",
            vec![HarnessSupervisorEvent::Ready {
                protocol: "wrong-protocol".into(),
            }],
            "Supervisor protocol mismatch: wrong-protocol",
        ),
        (
            "supervisor error before completion",
            vec![
                ready(),
                HarnessSupervisorEvent::Error {
                    message: "native harness failed".into(),
                },
            ],
            "native harness failed",
        ),
        (
            "non-zero exit",
            vec![ready(), HarnessSupervisorEvent::Completed { exit_code: 7 }],
            "Harness exited with code 7",
        ),
        (
            "unexpected completion-phase event",
            vec![ready(), HarnessSupervisorEvent::Drained],
            "Unexpected supervisor event before completion: drained",
        ),
        (
            "second ready",
            vec![ready(), ready()],
            "Unexpected supervisor event before completion: ready",
        ),
        (
            "drain error",
            vec![
                ready(),
                HarnessSupervisorEvent::Completed { exit_code: 0 },
                HarnessSupervisorEvent::Error {
                    message: "flush failed".into(),
                },
            ],
            "flush failed",
        ),
    ];
    for (name, events, message) in cases {
        let transport = ScriptedSupervisorTransport::new(events);
        let error = run(&transport, input(declaration(), AbortSignal::never()))
            .await
            .unwrap_err();
        assert_eq!(error.message(), message, "{name}");
        assert_eq!(error.kind(), ErrorKind::SupervisorProtocol, "{name}");
        let recorder = transport.recorder();
        assert!(
            recorder
                .commands()
                .contains(&stop(SupervisorStopReason::Failed)),
            "{name}"
        );
        assert_eq!(recorder.closes(), 1, "{name}");
    }
}

#[tokio::test]
async fn ignores_non_ready_events_before_ready_and_non_drained_events_while_draining() {
    let transport = ScriptedSupervisorTransport::new(vec![
        HarnessSupervisorEvent::Heartbeat { sequence: 1 },
        ready(),
        HarnessSupervisorEvent::Completed { exit_code: 0 },
        HarnessSupervisorEvent::Heartbeat { sequence: 2 },
        HarnessSupervisorEvent::Drained,
    ]);
    assert_eq!(
        run(&transport, input(declaration(), AbortSignal::never())).await,
        Ok(ManagedWorkExecutionResult::Completed)
    );
}

#[tokio::test]
async fn preserves_the_original_transport_open_failure_when_no_channel_exists() {
    let failure = PortError::new("transport unavailable");
    let transport = ScriptedSupervisorTransport::new(vec![]).failing_open(failure.clone());
    assert_eq!(
        run(&transport, input(declaration(), AbortSignal::never())).await,
        Err(failure)
    );
    assert!(transport.recorder().commands().is_empty());
    assert_eq!(transport.recorder().closes(), 0);
}

#[tokio::test]
async fn bounds_stop_and_close_cleanup_failures_without_masking_the_execution_failure() {
    let failure = PortError::new("start failed");
    let transport = ScriptedSupervisorTransport::new(vec![])
        .failing_send("start", failure.clone())
        .failing_send("stop", PortError::new("stop failed"))
        .failing_close(PortError::new("close failed"));
    assert_eq!(
        run(&transport, input(declaration(), AbortSignal::never())).await,
        Err(failure)
    );
    let recorder = transport.recorder();
    assert!(
        recorder
            .commands()
            .contains(&stop(SupervisorStopReason::Failed))
    );
    assert_eq!(recorder.closes(), 1);
}

#[tokio::test]
async fn rejects_invalid_timeouts_through_the_protocol_boundary() {
    let cases = [
        (
            timeouts(0, 1_000, 1_000),
            "ready timeout must be a positive integer",
        ),
        (
            timeouts(-5, 1_000, 1_000),
            "ready timeout must be a positive integer",
        ),
        (
            timeouts(1 << 53, 1_000, 1_000),
            "ready timeout must be a positive integer",
        ),
        (
            timeouts(1_000, 0, 1_000),
            "harness heartbeat timeout must be a positive integer",
        ),
        (
            timeouts(1_000, 1_000, 0),
            "drain timeout must be a positive integer",
        ),
    ];
    for (declaration, message) in cases {
        let transport = ScriptedSupervisorTransport::new(vec![
            ready(),
            HarnessSupervisorEvent::Completed { exit_code: 0 },
            HarnessSupervisorEvent::Drained,
        ]);
        let error = run(&transport, input(declaration, AbortSignal::never()))
            .await
            .unwrap_err();
        assert_eq!(error.message(), message);
        assert_eq!(error.kind(), ErrorKind::SupervisorProtocol);
        assert!(
            transport
                .recorder()
                .commands()
                .contains(&stop(SupervisorStopReason::Failed))
        );
    }
}

#[tokio::test]
async fn fails_when_the_event_stream_closes_or_rejects_before_the_next_protocol_event() {
    let cases: Vec<(Vec<Result<HarnessSupervisorEvent, PortError>>, &str)> = vec![
        (vec![], "Supervisor closed before ready"),
        (
            vec![Ok(ready())],
            "Supervisor closed before harness heartbeat",
        ),
        (
            vec![
                Ok(ready()),
                Ok(HarnessSupervisorEvent::Completed { exit_code: 0 }),
            ],
            "Supervisor closed before drain",
        ),
        (
            vec![Ok(ready()), Err(PortError::new("stream broke"))],
            "stream broke",
        ),
    ];
    for (events, message) in cases {
        let transport = ScriptedSupervisorTransport::from_results(events);
        let error = run(&transport, input(declaration(), AbortSignal::never()))
            .await
            .unwrap_err();
        assert_eq!(error.message(), message);
        assert!(
            transport
                .recorder()
                .commands()
                .contains(&stop(SupervisorStopReason::Failed))
        );
    }
}

#[tokio::test]
async fn times_out_each_phase_with_its_own_deadline() {
    let cases: Vec<(Vec<HarnessSupervisorEvent>, HarnessDriverDeclaration, &str)> = vec![
        (
            vec![],
            timeouts(20, 5_000, 5_000),
            "ready timed out after 20ms",
        ),
        (
            vec![ready(), HarnessSupervisorEvent::Heartbeat { sequence: 0 }],
            timeouts(5_000, 25, 5_000),
            "harness heartbeat timed out after 25ms",
        ),
        (
            vec![ready(), HarnessSupervisorEvent::Completed { exit_code: 0 }],
            timeouts(5_000, 5_000, 30),
            "drain timed out after 30ms",
        ),
    ];
    for (events, declaration, message) in cases {
        let transport = ScriptedSupervisorTransport::new(events).ending(ScriptEnd::WaitForAbort);
        let error = run(&transport, input(declaration, AbortSignal::never()))
            .await
            .unwrap_err();
        assert_eq!(error.message(), message);
        assert_eq!(error.kind(), ErrorKind::SupervisorProtocol);
        let recorder = transport.recorder();
        assert!(
            recorder
                .commands()
                .contains(&stop(SupervisorStopReason::Failed))
        );
        assert_eq!(recorder.closes(), 1);
    }
}
