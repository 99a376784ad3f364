//! The conformance cases. Each takes the [`Subject`] and panics on a violation; the macro
//! checks afterwards that no runtime was left running.

pub use super::process_checkpoints::process_checkpoints_carry_running_processes_into_the_next_run;
use super::subject::Subject;
use omabox_contract::{
    AbortController, AbortSignal, CollectOutputsInput, CredentialEgressEnforcement,
    HarnessDriverDeclaration, HarnessDriverType, HarnessIdentity, ManagedRuntimeProfile,
    ManagedRuntimeProviderCreateInput, ManagedRuntimeProviderDriverPort,
    ManagedRuntimeProviderPlacement, ManagedSandboxLease, ManagedSandboxPort,
    ManagedWorkExecutionResult, MaterializeWorkspaceInput, Meta, OutputDurability,
    OutputRequirement, OutputStrategy, OutputsProfile, PortError, RunHarnessInput,
    RuntimeCheckpointRequirement, RuntimeProcessDeclaration, RuntimePublicationCandidate,
    SandboxHeartbeatResult, SandboxState, SessionOutputPort, SupervisorProtocol, SuspendResume,
    TerminationReason, WorkspacePersistencePort, WorkspaceProfile, WorkspaceRequirement,
    WorkspaceStrategy,
};
use omabox_host::provider_host::{ManagedRuntimeProviderHost, ManagedRuntimeProviderHostOptions};
use omabox_host::runtime_host::{ManagedRuntimeRunInput, ManagedRuntimeRunResult};
use omabox_persistence::binding_host_path;
use omabox_sandbox::managed::{HarnessOutputSink, HarnessStream};
use omabox_sandbox::{DuplexKillSignal, SandboxDuplexProcessSpec};
use omabox_store::{MemoryFenceStore, MemoryOrphanStore};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const EVERY_REASON: [TerminationReason; 3] = [
    TerminationReason::Completed,
    TerminationReason::Failed,
    TerminationReason::LeaseLost,
];

/// Lifecycle: the lease is JSON-safe, round-trips, and contains no fence token.
pub async fn acquire_returns_a_json_safe_lease_without_the_fence_token(subject: &Subject) {
    let acquired = subject.acquire().await;
    let lease = &acquired.lease;
    assert_eq!(lease.provider, subject.backend.name);
    assert!(!lease.runtime_id.is_empty());
    let json = serde_json::to_string(lease).expect("lease serializes");
    assert!(
        !json.contains(&subject.token),
        "the fence token leaked into the lease: {json}"
    );
    let back: ManagedSandboxLease = serde_json::from_str(&json).expect("lease parses");
    assert_eq!(&back, lease);
    let value: serde_json::Value = serde_json::from_str(&json).expect("lease is JSON");
    let keys: Vec<&String> = value.as_object().expect("an object").keys().collect();
    assert!(
        keys.iter()
            .all(|key| ["provider", "runtimeId", "metadata"].contains(&key.as_str())),
        "unexpected lease keys {keys:?}"
    );
    subject.finish(&acquired).await;
}

/// Images: the lease is published only once the harness probe printed the marker; a
/// harness named by absolute path and one found on PATH both pass.
pub async fn acquire_publishes_only_after_the_readiness_marker(subject: &Subject) {
    let sh = subject
        .acquire_on(
            &subject.driver,
            RuntimeProcessDeclaration::command("sh"),
            AbortSignal::never(),
        )
        .await
        .expect("sh is on PATH");
    let probe = subject
        .sandbox(&sh)
        .await
        .exec("command -v sh", None)
        .await
        .expect("exec");
    let absolute = probe.lines().next().unwrap_or_default().trim().to_owned();
    assert!(absolute.starts_with('/'), "command -v sh gave {probe:?}");
    let by_path = subject
        .acquire_on(
            &subject.driver,
            RuntimeProcessDeclaration::command(absolute.clone()),
            AbortSignal::never(),
        )
        .await
        .unwrap_or_else(|error| panic!("absolute harness {absolute}: {error}"));
    let ready = subject
        .sandbox(&by_path)
        .await
        .exec(&omabox_sandbox::readiness_probe_command(&absolute), None)
        .await
        .expect("probe");
    assert!(ready.contains(omabox_sandbox::RUNTIME_READY_MARKER));
    subject.finish(&sh).await;
    subject.finish(&by_path).await;
}

/// Images/Processes: a missing harness binary fails acquire clearly, and the runtime that
/// was created for it is gone.
pub async fn a_missing_harness_binary_fails_acquire_and_leaves_nothing_behind(subject: &Subject) {
    for command in ["/nonexistent/omabox-harness", "omabox-no-such-harness"] {
        let before = subject.created().len();
        let error = subject
            .acquire_on(
                &subject.driver,
                RuntimeProcessDeclaration::command(command),
                AbortSignal::never(),
            )
            .await
            .expect_err("a missing harness must fail acquire");
        assert!(
            error.message().contains(command) && error.message().contains("not found"),
            "unclear error for {command}: {}",
            error.message()
        );
        let created = subject.created();
        assert_eq!(
            created.len(),
            before + 1,
            "one runtime was created for the probe"
        );
        let status = subject
            .observer()
            .status(&created[before])
            .await
            .expect("status");
        assert_ne!(status, omabox_sandbox::SandboxRuntimeStatus::Running);
        assert_eq!(
            subject
                .driver
                .runtime()
                .inspect(&created[before])
                .await
                .unwrap()
                .state,
            SandboxState::Stopped,
            "{command}: the failed runtime must be stopped"
        );
    }
    // An aborted acquire publishes nothing either.
    let error = subject
        .acquire_on(
            &subject.driver,
            subject.shell("true"),
            AbortSignal::aborted_with(PortError::new("cancelled by the test")),
        )
        .await
        .expect_err("an aborted acquire fails");
    assert_eq!(error.message(), "cancelled by the test");
}

/// Lifecycle: heartbeat alive while running, lost once the provider deleted the runtime.
pub async fn heartbeat_is_alive_then_lost_once_the_runtime_was_deleted(subject: &Subject) {
    let acquired = subject.acquire().await;
    let runtime = subject.driver.runtime();
    assert_eq!(
        runtime
            .heartbeat(&acquired.scope, &acquired.fence, &acquired.lease)
            .await,
        Ok(SandboxHeartbeatResult::Alive)
    );
    // The provider deletes it behind the host's back.
    subject
        .observer()
        .reap(&acquired.lease)
        .await
        .expect("out-of-band delete");
    assert_eq!(
        runtime
            .heartbeat(&acquired.scope, &acquired.fence, &acquired.lease)
            .await,
        Ok(SandboxHeartbeatResult::Lost)
    );
    subject.finish(&acquired).await;
    assert_eq!(
        runtime
            .heartbeat(&acquired.scope, &acquired.fence, &acquired.lease)
            .await,
        Ok(SandboxHeartbeatResult::Lost)
    );
}

/// Lifecycle: terminate is idempotent for every reason.
pub async fn terminate_is_idempotent_for_completed_failed_and_lease_lost(subject: &Subject) {
    let runtime = subject.driver.runtime();
    for reason in EVERY_REASON {
        let acquired = subject.acquire().await;
        for attempt in 0..3 {
            runtime
                .terminate(&acquired.scope, &acquired.fence, &acquired.lease, reason)
                .await
                .unwrap_or_else(|error| panic!("terminate {reason} #{attempt}: {error}"));
        }
        assert_eq!(
            runtime.inspect(&acquired.lease).await.unwrap().state,
            SandboxState::Stopped
        );
        subject.finish(&acquired).await;
    }
}

/// Lifecycle: reap works from a serialized lease, with a fresh driver and no handle, twice.
pub async fn reap_works_from_a_serialized_lease_with_a_fresh_driver_twice(subject: &Subject) {
    for reason in EVERY_REASON {
        let acquired = subject.acquire().await;
        let json = serde_json::to_string(&acquired.lease).expect("serialize");
        let lease: ManagedSandboxLease = serde_json::from_str(&json).expect("parse");
        let fresh = subject.fresh_driver().await;
        for attempt in 0..2 {
            fresh
                .runtime()
                .reap(&acquired.scope, &lease, reason)
                .await
                .unwrap_or_else(|error| panic!("reap {reason} #{attempt}: {error}"));
        }
        assert_eq!(
            fresh.runtime().inspect(&lease).await.unwrap().state,
            SandboxState::Stopped
        );
        assert_eq!(
            subject
                .driver
                .runtime()
                .heartbeat(&acquired.scope, &acquired.fence, &acquired.lease)
                .await,
            Ok(SandboxHeartbeatResult::Lost),
            "the original driver sees the reaped runtime as lost"
        );
        subject.finish(&acquired).await;
    }
}

/// Lifecycle: inspect reports running, then stopped after terminate.
pub async fn inspect_reports_running_then_stopped(subject: &Subject) {
    let acquired = subject.acquire().await;
    let runtime = subject.driver.runtime();
    assert_eq!(
        runtime.inspect(&acquired.lease).await.unwrap().state,
        SandboxState::Running
    );
    let fresh = subject.fresh_driver().await;
    let seen = fresh
        .runtime()
        .inspect(&acquired.lease)
        .await
        .unwrap()
        .state;
    assert!(
        matches!(seen, SandboxState::Running | SandboxState::Unknown),
        "a fresh driver must not call a running runtime {seen:?}"
    );
    subject.finish(&acquired).await;
    assert_eq!(
        runtime.inspect(&acquired.lease).await.unwrap().state,
        SandboxState::Stopped
    );
}

/// Lifecycle: suspend is not advertised and refuses with the provider's name.
pub async fn suspend_is_refused_and_not_advertised(subject: &Subject) {
    let acquired = subject.acquire().await;
    let runtime = subject.driver.runtime();
    let capabilities = runtime.capabilities(&acquired.scope).await.unwrap();
    assert_eq!(capabilities.suspend_resume, SuspendResume::Unsupported);
    let error = runtime
        .suspend(
            &acquired.scope,
            &acquired.fence,
            &acquired.lease,
            AbortSignal::never(),
        )
        .await
        .expect_err("suspend is unsupported");
    assert_eq!(
        error.message(),
        format!("{} does not support suspend/resume", subject.backend.name)
    );
    subject.finish(&acquired).await;
}

/// Processes: exec returns stdout then stderr, and marks a non-zero exit.
pub async fn exec_returns_combined_output_including_a_non_zero_exit(subject: &Subject) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    let ok = sandbox.exec("echo out; echo err >&2", None).await.unwrap();
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|line| !line.trim().is_empty())
            .map(str::to_owned)
            .collect()
    };
    // stdout, then "\n" + stderr (stdout's own newline stays), trailing whitespace trimmed.
    assert_eq!(lines(&ok), ["out", "err"], "{ok:?}");
    assert!(!ok.ends_with('\n'));
    let failed = sandbox
        .exec("echo out; echo err >&2; exit 3", None)
        .await
        .unwrap();
    let failed_lines = lines(&failed);
    assert_eq!(failed_lines[..2], ["out", "err"], "{failed:?}");
    assert!(
        failed_lines[2].starts_with("[exit ") && failed_lines[2].contains('3'),
        "{failed:?}"
    );
    let missing = sandbox
        .exec("omabox-no-such-harness --version", None)
        .await
        .unwrap();
    assert!(
        missing.contains("[exit "),
        "a missing binary is a non-zero exit: {missing:?}"
    );
    assert!(!missing.contains(omabox_sandbox::RUNTIME_READY_MARKER));
    subject.finish(&acquired).await;
}

/// Files: writeFile/readFile on /workspace land in the bound workspace directory and are what
/// commands see there.
pub async fn read_and_write_file_honour_the_workspace(subject: &Subject) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    sandbox
        .write_file("/workspace/dir/a.txt", "hello workspace")
        .await
        .expect("write");
    let host = binding_host_path(acquired.workspace.metadata.as_ref()).expect("hostPath");
    assert_eq!(
        std::fs::read_to_string(host.join("dir/a.txt")).expect("on the host"),
        "hello workspace"
    );
    let seen = sandbox
        .exec(&subject.script("cat \"$WS/dir/a.txt\""), None)
        .await
        .unwrap();
    assert_eq!(seen, "hello workspace");
    sandbox
        .exec(
            &subject.script("printf 'from a command' > \"$WS/b.txt\""),
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        sandbox.read_file("/workspace/b.txt").await.unwrap(),
        "from a command"
    );
    assert!(sandbox.read_file("/workspace/missing.txt").await.is_err());
    subject.finish(&acquired).await;
}

/// Files: readFileBytes/writeFileBytes round-trip every byte value.
pub async fn read_file_bytes_round_trips_binary_content(subject: &Subject) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    let bytes = sandbox
        .as_file_bytes()
        .expect("readFileBytes is implemented");
    let content: Vec<u8> = (0..=255_u8).cycle().take(70_000).collect();
    for path in ["/workspace/bin/blob.dat", "/mnt/session/outputs/blob.dat"] {
        bytes
            .write_file_bytes(path, &content)
            .await
            .expect("write bytes");
        assert_eq!(
            bytes.read_file_bytes(path).await.expect("read bytes"),
            content,
            "{path}"
        );
    }
    subject.finish(&acquired).await;
}

/// Processes: a duplex process gets stdin and streams stdout/stderr; `exited` has its code.
pub async fn duplex_process_streams_stdin_stdout_stderr_and_exits(subject: &Subject) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    let duplex = sandbox.as_duplex_process().expect("duplex processes");
    let mut spec = SandboxDuplexProcessSpec::new("sh");
    spec.args = vec!["-c".into(), "cat; echo err >&2; exit 5".into()];
    let mut process = duplex.spawn_duplex_process(spec).await.expect("spawn");
    process.stdin.write_all(b"ping\n\x00\xff").await.unwrap();
    process.stdin.shutdown().await.unwrap();
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let (out, err) = tokio::join!(
        process.stdout.read_to_end(&mut stdout),
        process.stderr.read_to_end(&mut stderr)
    );
    out.unwrap();
    err.unwrap();
    assert_eq!(stdout, b"ping\n\x00\xff");
    assert_eq!(stderr, b"err\n");
    let exit = tokio::time::timeout(Duration::from_secs(10), process.exited())
        .await
        .expect("exits")
        .expect("exit status");
    assert_eq!((exit.code, exit.signal), (Some(5), None));
    subject.finish(&acquired).await;
}

/// Processes: kill ends a duplex process and `exited` reports it.
pub async fn duplex_process_can_be_killed(subject: &Subject) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    let duplex = sandbox.as_duplex_process().expect("duplex processes");
    let mut spec = SandboxDuplexProcessSpec::new("sleep");
    spec.args = vec!["300".into()];
    let process = duplex.spawn_duplex_process(spec).await.expect("spawn");
    process.kill(DuplexKillSignal::Term).await.expect("kill");
    let exit = tokio::time::timeout(Duration::from_secs(10), process.exited())
        .await
        .expect("exits after kill")
        .expect("exit status");
    assert_ne!(exit.code, Some(0));
    assert!(exit.signal.is_some() || exit.code.is_some(), "{exit:?}");
    subject.finish(&acquired).await;
}

/// Outputs: files written under /mnt/session/outputs are collected by the outputs port.
pub async fn outputs_written_in_the_sandbox_are_collected_through_the_outputs_port(
    subject: &Subject,
) {
    let acquired = subject.acquire().await;
    let sandbox = subject.sandbox(&acquired).await;
    sandbox
        .write_file("/mnt/session/outputs/report.txt", "report")
        .await
        .expect("write output");
    sandbox
        .exec(
            &subject.script("mkdir -p \"$OUT/sub\" && printf 'x' > \"$OUT/sub/x.txt\""),
            None,
        )
        .await
        .unwrap();
    let entries = subject
        .outputs
        .collect(CollectOutputsInput {
            scope: acquired.scope.clone(),
            fence: acquired.fence.clone(),
            strategy: OutputStrategy::FinalCollect,
            binding: acquired.outputs.clone(),
            signal: AbortSignal::never(),
        })
        .await
        .expect("collect");
    let paths: Vec<(&str, u64)> = entries
        .iter()
        .map(|entry| (entry.logical_path.as_str(), entry.size))
        .collect();
    assert_eq!(paths, vec![("report.txt", 6), ("sub/x.txt", 1)]);
    subject.finish(&acquired).await;
}

#[derive(Default)]
struct Captured(Mutex<Vec<(HarnessStream, Vec<u8>)>>);

impl HarnessOutputSink for Captured {
    fn output(&self, stream: HarnessStream, bytes: &[u8]) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((stream, bytes.to_vec()));
    }
}

impl Captured {
    fn text(&self, stream: HarnessStream) -> String {
        let chunks = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let bytes: Vec<u8> = chunks
            .iter()
            .filter(|(from, _)| *from == stream)
            .flat_map(|(_, bytes)| bytes.clone())
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

fn run_input(
    subject: &Subject,
    acquired: &super::Acquired,
    process: RuntimeProcessDeclaration,
    signal: AbortSignal,
) -> RunHarnessInput {
    let _ = subject;
    RunHarnessInput {
        scope: acquired.scope.clone(),
        fence: acquired.fence.clone(),
        sandbox: acquired.lease.clone(),
        workspace_path: omabox_contract::WORKSPACE_MOUNT_PATH.into(),
        output_path: Some(omabox_contract::OUTPUTS_MOUNT_PATH.into()),
        driver: HarnessDriverDeclaration::AmaWorker { process },
        checkpoint: None,
        signal,
    }
}

/// Harness: `ama_worker` runs the declared process (args, env, cwd), streams its output, and
/// maps exit 0 / code / signal.
pub async fn ama_worker_runs_the_declared_process_and_maps_its_exit(subject: &Subject) {
    let sink = Arc::new(Captured::default());
    let driver = subject.driver_with_output(sink.clone()).await;
    let acquired = subject
        .acquire_on(&driver, subject.shell("true"), AbortSignal::never())
        .await
        .expect("acquire");
    let resources = driver.resources();
    let harness = &resources.harness_driver;
    assert_eq!(
        harness
            .driver_capabilities(&acquired.scope)
            .await
            .unwrap()
            .drivers,
        vec![HarnessDriverType::AmaWorker]
    );
    let mut ok = subject.shell("echo \"hello $GREETING\"; echo warn >&2; pwd > \"$WS/cwd.txt\"");
    ok.env = Some([("GREETING".to_owned(), "worker".to_owned())].into());
    assert_eq!(
        harness
            .run(run_input(subject, &acquired, ok, AbortSignal::never()))
            .await,
        Ok(ManagedWorkExecutionResult::Completed)
    );
    assert_eq!(sink.text(HarnessStream::Stdout), "hello worker\n");
    assert_eq!(sink.text(HarnessStream::Stderr), "warn\n");
    let failed = harness
        .run(run_input(
            subject,
            &acquired,
            subject.shell("exit 7"),
            AbortSignal::never(),
        ))
        .await
        .expect_err("exit 7 fails");
    assert_eq!(failed.message(), "AMA worker exited with code 7");
    let killed = harness
        .run(run_input(
            subject,
            &acquired,
            subject.shell("kill -KILL $$"),
            AbortSignal::never(),
        ))
        .await
        .expect_err("SIGKILL fails");
    assert_eq!(
        killed.message(),
        "AMA worker exited with code null (SIGKILL)"
    );
    let supervised = harness
        .run(RunHarnessInput {
            driver: supervised_declaration(subject.shell("true")),
            ..run_input(
                subject,
                &acquired,
                subject.shell("true"),
                AbortSignal::never(),
            )
        })
        .await
        .expect_err("the direct driver runs ama_worker only");
    assert_eq!(
        supervised.message(),
        "Provider direct driver cannot run openma_supervised"
    );
    driver
        .runtime()
        .terminate(
            &acquired.scope,
            &acquired.fence,
            &acquired.lease,
            TerminationReason::Completed,
        )
        .await
        .expect("terminate");
    subject.finish(&acquired).await;
}

/// Harness: an abort kills the worker and resolves `aborted`.
pub async fn ama_worker_abort_kills_the_process_and_resolves_aborted(subject: &Subject) {
    let acquired = subject.acquire().await;
    let resources = subject.driver.resources();
    let controller = AbortController::new();
    let input = run_input(
        subject,
        &acquired,
        subject.shell("echo started > \"$WS/started\"; exec sleep 300"),
        controller.signal(),
    );
    let harness = Arc::clone(&resources.harness_driver);
    let running = tokio::spawn(async move { harness.run(input).await });
    let sandbox = subject.sandbox(&acquired).await;
    for _ in 0..200 {
        if sandbox.read_file("/workspace/started").await.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    controller.abort(PortError::new("lease lost"));
    let result = tokio::time::timeout(Duration::from_secs(15), running)
        .await
        .expect("abort resolves promptly")
        .expect("join");
    assert_eq!(result, Ok(ManagedWorkExecutionResult::Aborted));
    subject.finish(&acquired).await;
}

fn foreign_lease() -> ManagedSandboxLease {
    let mut metadata = Meta::new();
    metadata.insert("sandboxId".into(), "sbx_foreign".into());
    ManagedSandboxLease {
        provider: "e2b".into(),
        runtime_id: "sbx_foreign".into(),
        metadata: Some(metadata),
    }
}

/// Boundary: another provider's lease is refused on reap, heartbeat and terminate, and
/// inspect does not pretend to know it.
pub async fn a_foreign_provider_lease_is_rejected(subject: &Subject) {
    let runtime = subject.driver.runtime();
    let scope = subject.scope();
    let fence = subject.fence(&scope, 1);
    let lease = foreign_lease();
    let expected = "Incompatible sandbox lease provider: e2b";
    for reason in EVERY_REASON {
        assert_eq!(
            runtime
                .reap(&scope, &lease, reason)
                .await
                .unwrap_err()
                .message(),
            expected
        );
        assert_eq!(
            runtime
                .terminate(&scope, &fence, &lease, reason)
                .await
                .unwrap_err()
                .message(),
            expected
        );
    }
    assert_eq!(
        runtime
            .heartbeat(&scope, &fence, &lease)
            .await
            .unwrap_err()
            .message(),
        expected
    );
    assert_eq!(
        runtime.inspect(&lease).await.unwrap().state,
        SandboxState::Unknown
    );
    let fresh = subject.fresh_driver().await;
    assert_eq!(
        fresh
            .runtime()
            .reap(&scope, &lease, TerminationReason::LeaseLost)
            .await
            .unwrap_err()
            .message(),
        expected
    );
}

/// Boundary: a workspace candidate made by another provider's runtime checkpoint is refused
/// on restore, before any compute exists.
pub async fn a_foreign_workspace_candidate_is_rejected_on_restore(subject: &Subject) {
    let scope = subject.scope();
    let fence = subject.fence(&scope, 2);
    let mut metadata = Meta::new();
    metadata.insert(
        "openma.runtime.checkpoint.v1".into(),
        r#"{"provider":"e2b","checkpointId":"snap_1","sourceRuntimeId":"sbx_1","kind":"memory","scope":"portable"}"#.into(),
    );
    let foreign = RuntimePublicationCandidate {
        id: "wrc_0123456789abcdef".into(),
        content_hash: format!("sha256:{}", "0".repeat(64)),
        metadata: Some(metadata),
    };
    let restored = subject
        .workspace
        .materialize(MaterializeWorkspaceInput {
            scope: scope.clone(),
            fence: fence.clone(),
            strategy: WorkspaceStrategy::CheckpointRestore,
            active_checkpoint: Some(foreign),
            idempotency_key: format!("{}:2:workspace-materialize", scope.work_id),
            signal: AbortSignal::never(),
        })
        .await;
    assert!(
        restored.is_err(),
        "a foreign candidate must not be restored: {restored:?}"
    );
}

/// Admission: the descriptor says exactly what the ports do, and only `in_process` is
/// accepted.
pub async fn the_descriptor_is_honest_and_other_placements_are_rejected(subject: &Subject) {
    let driver = &subject.driver;
    let descriptor = driver.descriptor();
    assert_eq!(descriptor.provider, subject.backend.name);
    assert_eq!(
        descriptor.placements,
        vec![ManagedRuntimeProviderPlacement::InProcess]
    );
    assert_eq!(
        descriptor.credential_egress.enforcement,
        CredentialEgressEnforcement::Unsupported
    );
    let scope = subject.scope();
    let resources = driver.resources();
    assert_eq!(
        descriptor.capabilities.sandbox,
        resources.sandbox.capabilities(&scope).await.unwrap()
    );
    assert_eq!(
        descriptor.capabilities.workspace,
        resources.workspace.capabilities(&scope).await.unwrap()
    );
    assert_eq!(
        descriptor.capabilities.outputs,
        resources.outputs.capabilities(&scope).await.unwrap()
    );
    assert!(
        descriptor
            .capabilities
            .outputs
            .strategies
            .iter()
            .any(|out| out.strategy == OutputStrategy::FinalCollect
                && out.durability == OutputDurability::Durable)
    );
    let mut live_lanes = resources
        .harness_driver
        .driver_capabilities(&scope)
        .await
        .unwrap()
        .drivers;
    if resources.supervisor_transport.is_some() {
        live_lanes.push(HarnessDriverType::OpenmaSupervised);
    }
    assert_eq!(descriptor.capabilities.harness.drivers, live_lanes);
    // The checkpoint port is made per run, for a plan that asks for it.
    assert!(resources.runtime_checkpoint.is_none());
    assert!(resources.credential_egress.is_none());
    for placement in [
        ManagedRuntimeProviderPlacement::DriverService,
        ManagedRuntimeProviderPlacement::ProviderNative,
    ] {
        let error = driver
            .create(ManagedRuntimeProviderCreateInput {
                environment_id: "env".into(),
                placement,
                profile: profile(subject.shell("true")),
                plan: subject.plan(subject.shell("true")),
                provider_config: serde_json::Map::new(),
            })
            .await
            .expect_err("only in_process");
        assert_eq!(
            error.message(),
            format!(
                "{} does not support {placement} placement",
                subject.backend.name
            )
        );
    }
}

pub(super) fn profile(process: RuntimeProcessDeclaration) -> ManagedRuntimeProfile {
    ManagedRuntimeProfile {
        workspace: WorkspaceProfile {
            requirement: WorkspaceRequirement::Durable,
            preferred_strategies: None,
        },
        outputs: OutputsProfile {
            requirement: OutputRequirement::Durable,
            preferred_strategies: None,
        },
        runtime_checkpoint: RuntimeCheckpointRequirement::Disabled,
        credential_egress: None,
        driver: HarnessDriverDeclaration::AmaWorker { process },
    }
}

fn supervised_declaration(supervisor: RuntimeProcessDeclaration) -> HarnessDriverDeclaration {
    HarnessDriverDeclaration::OpenmaSupervised {
        protocol: SupervisorProtocol::V1,
        supervisor,
        harness: HarnessIdentity {
            id: "conformance".into(),
            version: "1".into(),
        },
        ready_timeout_ms: 10_000,
        heartbeat_timeout_ms: 10_000,
        drain_timeout_ms: 10_000,
    }
}

pub(super) fn provider_host(
    subject: &Subject,
    fences: Arc<MemoryFenceStore>,
) -> ManagedRuntimeProviderHost {
    ManagedRuntimeProviderHost::new(ManagedRuntimeProviderHostOptions {
        owner_id: "conformance-host".into(),
        lease_ttl_ms: 60_000,
        heartbeat_interval_ms: 1_000,
        fences,
        orphans: Arc::new(MemoryOrphanStore::new()),
        scheduler: None,
        driver: Arc::new(subject.driver.clone()),
        placement: ManagedRuntimeProviderPlacement::InProcess,
        provider_config: serde_json::Map::new(),
    })
    .expect("provider host")
}

async fn assert_published(
    subject: &Subject,
    fences: &MemoryFenceStore,
    scope: &omabox_contract::RuntimeResourceScope,
    workspace_file: &str,
    output_file: &str,
) {
    let record = fences.inspect(scope).expect("fence record");
    let publication = record.publication.expect("published");
    assert_eq!(publication.revision, 1);
    let manifest = subject
        .workspace
        .read_manifest(&publication.workspace_candidate)
        .await
        .expect("workspace manifest");
    assert!(
        manifest
            .entries
            .iter()
            .any(|entry| entry.path == workspace_file),
        "{workspace_file} persisted into the candidate"
    );
    let outputs = publication.output_candidate.expect("outputs published");
    let outputs = subject
        .outputs
        .read_manifest(&outputs)
        .await
        .expect("outputs manifest");
    assert!(
        outputs
            .entries
            .iter()
            .any(|entry| entry.logical_path == output_file),
        "{output_file} collected"
    );
}

/// Host: a full `ama_worker` run through the managed runtime host (in-memory fences):
/// completed, revision 1, the workspace file in the candidate, the output collected, no
/// runtime left.
pub async fn a_full_host_run_completes_and_persists_workspace_and_outputs(subject: &Subject) {
    let fences = Arc::new(MemoryFenceStore::new());
    let host = provider_host(subject, Arc::clone(&fences));
    let scope = subject.scope();
    let process = subject.shell("echo one > \"$WS/a.txt\" && echo report > \"$OUT/report.txt\"");
    let result = host
        .run(ManagedRuntimeRunInput::new(scope.clone(), profile(process)))
        .await
        .expect("run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_published(subject, &fences, &scope, "a.txt", "report.txt").await;
    assert!(!subject.created().is_empty(), "the run acquired a runtime");

    let failing = subject.shell("exit 9");
    let result = host
        .run(ManagedRuntimeRunInput::new(
            subject.scope(),
            profile(failing),
        ))
        .await
        .expect("run");
    match result {
        ManagedRuntimeRunResult::Failed { error } => {
            assert_eq!(error.message(), "AMA worker exited with code 9");
        }
        other => panic!("a failing harness fails the run: {other:?}"),
    }
}

/// Host: the supervised lane over a duplex process, through the registry's projection of
/// the supervisor transport.
pub async fn a_supervised_host_run_completes_over_a_duplex_process(subject: &Subject) {
    let fences = Arc::new(MemoryFenceStore::new());
    let host = provider_host(subject, Arc::clone(&fences));
    let scope = subject.scope();
    let script = r#"
        read start
        case "$start" in *'"type":"start"'*) ;; *) exit 3 ;; esac
        echo supervised > "$WS/s.txt"; echo out > "$OUT/s.txt"
        printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n'
        printf '{"type":"heartbeat","sequence":0}\n{"type":"completed","exitCode":0}\n'
        read drain
        printf '{"type":"drained"}\n'
    "#;
    let mut profile = profile(subject.shell("true"));
    profile.driver = supervised_declaration(subject.shell(script));
    let result = host
        .run(ManagedRuntimeRunInput::new(scope.clone(), profile))
        .await
        .expect("run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });
    assert_published(subject, &fences, &scope, "s.txt", "s.txt").await;
}
