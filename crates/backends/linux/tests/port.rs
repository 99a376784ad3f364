//! `LinuxSandboxPort` against real linux sandboxes: the tool-sandbox seam (exec, files,
//! duplex and background processes, env, destroy) and teardown that leaves nothing.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{Isolated, assert_gone, can_run, test_plan};
use omabox_backend_linux::SandboxPlan;
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_sandbox::{
    DuplexKillSignal, ProcessSignal, ProcessStatus, SandboxDuplexProcessSpec, SandboxPort,
    SandboxProcessExit, SandboxRuntimeStatus, SessionOutputMountRequest,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One sandbox in a private runtime dir and cgroup parent; `finish` destroys it (twice)
/// and asserts that nothing of it is left.
struct Fixture {
    iso: Isolated,
    port: LinuxSandboxPort,
}

impl Fixture {
    async fn start(plan: SandboxPlan) -> Self {
        let iso = Isolated::new();
        let port = LinuxSandboxPort::start(&iso.runtime(), &plan)
            .await
            .expect("sandbox start");
        Self { iso, port }
    }

    async fn finish(self) {
        let identity = self.port.identity().clone();
        self.port.terminate().await.expect("destroy");
        self.port
            .terminate()
            .await
            .expect("second destroy is a no-op");
        assert_gone(&identity);
        self.iso.assert_empty();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_returns_combined_output_and_exit_lines() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let port: &dyn SandboxPort = &fx.port;
    assert_eq!(port.exec("echo hi", None).await.unwrap(), "hi");
    assert_eq!(
        port.exec("printf out; printf err >&2; exit 2", None)
            .await
            .unwrap(),
        "out\nerr\n[exit 2]"
    );
    assert_eq!(port.exec("kill -9 $$", None).await.unwrap(), "\n[exit 137]");
    let timed_out = port.exec("echo start; sleep 30", Some(300)).await.unwrap();
    assert_eq!(
        timed_out, "start\n[timed out after 300 ms]\n[exit 124]",
        "timeout output"
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_binary_is_a_non_zero_exit_and_a_duplex_spawn_error() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let out = fx.port.exec("no-such-binary-omabox", None).await.unwrap();
    assert!(out.ends_with("[exit 127]"), "{out:?}");
    let duplex = fx.port.as_duplex_process().expect("duplex capability");
    let err = duplex
        .spawn_duplex_process(SandboxDuplexProcessSpec::new("/no/such/binary"))
        .await
        .unwrap_err();
    assert!(err.message().contains("/no/such/binary"), "{err}");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplex_cat_echoes_bytes_until_stdin_eof() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let duplex = fx.port.as_duplex_process().expect("duplex capability");
    let mut spec = SandboxDuplexProcessSpec::new("cat");
    spec.env.insert("UNUSED".into(), Some("1".into()));
    let mut process = duplex.spawn_duplex_process(spec).await.unwrap();
    let payload: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let mut stdin = std::mem::replace(&mut process.stdin, Box::new(tokio::io::sink()));
    let to_send = payload.clone();
    let writer = tokio::spawn(async move {
        stdin.write_all(&to_send).await.unwrap();
        stdin.shutdown().await.unwrap();
    });
    let mut echoed = Vec::new();
    process.stdout.read_to_end(&mut echoed).await.unwrap();
    let mut err = Vec::new();
    process.stderr.read_to_end(&mut err).await.unwrap();
    writer.await.unwrap();
    assert_eq!(echoed.len(), payload.len());
    assert!(echoed == payload, "cat echoed different bytes");
    assert!(err.is_empty());
    assert_eq!(
        process.exited().await.unwrap(),
        SandboxProcessExit {
            code: Some(0),
            signal: None,
            out_of_memory: None,
        }
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplex_kill_reports_the_signal_and_sigterm_escalates() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let duplex = fx.port.as_duplex_process().expect("duplex capability");

    let mut spec = SandboxDuplexProcessSpec::new("sleep");
    spec.args = vec!["100".into()];
    let process = duplex.spawn_duplex_process(spec).await.unwrap();
    process.kill(DuplexKillSignal::Kill).await.unwrap();
    assert_eq!(
        process.exited().await.unwrap(),
        SandboxProcessExit {
            code: None,
            signal: Some("SIGKILL".into()),
            out_of_memory: None,
        }
    );
    // A second kill after the exit is a no-op.
    process.kill(DuplexKillSignal::Term).await.unwrap();

    // TERM ignored (inherited by sleep too) → escalated to SIGKILL.
    let mut spec = SandboxDuplexProcessSpec::new("sh");
    spec.args = vec!["-c".into(), "trap '' TERM; echo ready; sleep 100".into()];
    let mut process = duplex.spawn_duplex_process(spec).await.unwrap();
    let mut ready = [0u8; 6];
    process.stdout.read_exact(&mut ready).await.unwrap();
    assert_eq!(&ready, b"ready\n");
    process.kill(DuplexKillSignal::Term).await.unwrap();
    assert_eq!(
        process.exited().await.unwrap().signal.as_deref(),
        Some("SIGKILL")
    );
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_bytes_round_trip_every_byte_value_and_land_in_the_workspace() {
    if !can_run() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.workspace = Some(ws.path().to_path_buf());
    let fx = Fixture::start(plan).await;
    let bytes_port = fx.port.as_file_bytes().expect("file bytes capability");
    let all: Vec<u8> = (0..=255u8).collect();
    for path in ["/workspace/deep/dir/all.bin", "/tmp/all.bin"] {
        let resolved = bytes_port.write_file_bytes(path, &all).await.unwrap();
        assert_eq!(resolved, path);
        assert_eq!(bytes_port.read_file_bytes(path).await.unwrap(), all);
    }
    assert_eq!(
        std::fs::read(ws.path().join("deep/dir/all.bin")).unwrap(),
        all
    );
    fx.port
        .write_file("/workspace/note.txt", "héllo\n")
        .await
        .unwrap();
    assert_eq!(
        fx.port.read_file("/workspace/note.txt").await.unwrap(),
        "héllo\n"
    );
    let err = fx.port.read_file("/workspace/deep/dir/all.bin").await;
    assert!(err.is_err(), "non-UTF-8 text read must fail");
    let err = fx.port.read_file("/workspace/missing").await.unwrap_err();
    assert!(err.message().contains("/workspace/missing"), "{err}");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_vars_reach_later_execs_and_duplex_processes() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let env = fx.port.as_env_vars().expect("env capability");
    env.set_env_vars(BTreeMap::from([
        ("GREETING".to_owned(), "hello world".to_owned()),
        ("OTHER".to_owned(), "x".to_owned()),
    ]))
    .await
    .unwrap();
    assert_eq!(
        fx.port.exec("echo \"$GREETING\"", None).await.unwrap(),
        "hello world"
    );
    let duplex = fx.port.as_duplex_process().unwrap();
    let mut spec = SandboxDuplexProcessSpec::new("sh");
    spec.args = vec!["-c".into(), "echo \"$GREETING:${OTHER-unset}\"".into()];
    spec.env.insert("OTHER".into(), None);
    let mut process = duplex.spawn_duplex_process(spec).await.unwrap();
    let mut out = String::new();
    process.stdout.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "hello world:unset\n");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_report_logs_status_and_kill() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let processes = fx.port.as_process().expect("process capability");
    let done = processes
        .start_process("echo started; echo oops >&2")
        .await
        .unwrap();
    assert!(done.pid > 0);
    let mut status = done.status().await.unwrap();
    for _ in 0..100 {
        if status != ProcessStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = done.status().await.unwrap();
    }
    assert_eq!(status, ProcessStatus::Completed);
    let logs = done.logs().await.unwrap();
    assert_eq!(
        (logs.stdout.as_str(), logs.stderr.as_str()),
        ("started\n", "oops\n")
    );

    let long = processes.start_process("sleep 100").await.unwrap();
    assert_eq!(long.status().await.unwrap(), ProcessStatus::Running);
    long.kill(ProcessSignal::Kill).await.unwrap();
    let mut status = long.status().await.unwrap();
    for _ in 0..100 {
        if status != ProcessStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        status = long.status().await.unwrap();
    }
    assert_eq!(status, ProcessStatus::Killed);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_is_idempotent_kills_everything_and_refuses_later_work() {
    if !can_run() {
        return;
    }
    let outputs = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.outputs = Some(outputs.path().to_path_buf());
    let fx = Fixture::start(plan).await;
    let port = &fx.port;
    // Outputs mount: durable, and writes land in the host directory.
    let mount = port.as_session_output_mount().unwrap();
    assert!(mount.session_output_mount_capabilities().is_some());
    mount
        .mount_session_outputs(SessionOutputMountRequest {
            tenant_id: "t".into(),
            session_id: "s".into(),
        })
        .await
        .unwrap();
    port.write_file("/mnt/session/outputs/report.txt", "done")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(outputs.path().join("report.txt")).unwrap(),
        "done"
    );
    // Something running in the background when the sandbox is destroyed.
    port.as_process()
        .unwrap()
        .start_process("sleep 1000")
        .await
        .unwrap();
    let runtime = port.as_runtime().unwrap();
    assert_eq!(runtime.runtime_handle().provider, "linux");
    assert_eq!(runtime.runtime_handle().runtime_id, port.id());
    assert_eq!(
        runtime.status().await.unwrap(),
        SandboxRuntimeStatus::Running
    );
    runtime.renew_lease(1000).await.unwrap();

    let destroy = port.as_destroy().unwrap();
    let (a, b) = tokio::join!(destroy.destroy(), destroy.destroy());
    a.unwrap();
    b.unwrap();
    destroy.destroy().await.unwrap();
    assert!(port.is_destroyed());
    assert_gone(port.identity());
    assert_eq!(
        runtime.status().await.unwrap(),
        SandboxRuntimeStatus::Stopped
    );
    assert!(runtime.renew_lease(1000).await.is_err());
    let err = port.exec("true", None).await.unwrap_err();
    assert!(err.message().contains("was destroyed"), "{err}");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_port_tears_the_sandbox_down() {
    if !can_run() {
        return;
    }
    let iso = Isolated::new();
    let port = LinuxSandboxPort::start(&iso.runtime(), &test_plan())
        .await
        .unwrap();
    let identity = port.identity().clone();
    assert!(port.is_alive());
    tokio::task::spawn_blocking(move || drop(port))
        .await
        .unwrap();
    assert_gone(&identity);
    iso.assert_empty();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oom_kill_names_the_memory_limit() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let port: &dyn SandboxPort = &fx.port;
    let out = port
        .exec(
            "exec python3 -c 'b=[]\nwhile True: b.append(bytearray(16<<20))'",
            None,
        )
        .await
        .unwrap();
    assert!(
        out.ends_with("[killed by the memory limit of 128 MiB]\n[exit 137]"),
        "{out:?}"
    );
    // A plain SIGKILL says only that.
    assert_eq!(port.exec("kill -9 $$", None).await.unwrap(), "\n[exit 137]");
    fx.finish().await;
}

/// A duplex process (a harness) the memory limit killed carries it in its exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplex_process_killed_by_the_memory_limit_says_so_in_its_exit() {
    if !can_run() {
        return;
    }
    let fx = Fixture::start(test_plan()).await;
    let duplex = fx.port.as_duplex_process().unwrap();
    let spawn = |script: &str| {
        let mut spec = SandboxDuplexProcessSpec::new("/bin/sh");
        spec.args = vec!["-c".into(), script.into()];
        spec
    };
    let process = duplex
        .spawn_duplex_process(spawn("exec dd if=/dev/zero of=/dev/null bs=512M count=1"))
        .await
        .unwrap();
    let exit = process.exited().await.unwrap();
    assert_eq!(exit.signal.as_deref(), Some("SIGKILL"), "{exit:?}");
    assert_eq!(
        exit.out_of_memory,
        Some(omabox_sandbox::OutOfMemory {
            limit_bytes: Some(128 << 20)
        })
    );
    let process = duplex
        .spawn_duplex_process(spawn("kill -9 $$"))
        .await
        .unwrap();
    let exit = process.exited().await.unwrap();
    assert_eq!(exit.out_of_memory, None, "{exit:?}");
    fx.finish().await;
}
