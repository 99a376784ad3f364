//! The docker backend against a real engine: each test starts its own `dockerd`
//! (`omabox_test_support::dockerd`) and a registry on loopback, pushes a tiny image (the
//! host's static busybox as `/bin/sh`), and runs a sandbox from it through the Engine API.
//! The agent binary must be built (`cargo build -p omabox-agent`; the workspace's test run
//! builds it); a missing engine, registry, busybox or agent skips, and fails under CI.

mod common;

use common::{config, missing, rig};
use omabox_backend_docker::reap::reap_dead_hosts;
use omabox_backend_docker::{DockerConfig, DockerSandboxPort, Engine, HOST_LABEL, SANDBOX_LABEL};
use omabox_sandbox::SandboxPort as _;
use omabox_test_support::require_capability;

async fn inspect(engine: &Engine, container: &str) -> serde_json::Value {
    let inspected = engine
        .docker()
        .inspect_container(container, None)
        .await
        .unwrap();
    serde_json::to_value(inspected).unwrap()
}

async fn exists(engine: &Engine, container: &str) -> bool {
    engine
        .docker()
        .inspect_container(container, None)
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_from_a_loopback_registry_runs_commands_with_their_exit_codes() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    let port = DockerSandboxPort::start(&rig.engine, &config(&rig, "host-a"), "sbx-1")
        .await
        .unwrap();

    assert_eq!(
        port.exec("echo hi; exit 3", None).await.unwrap(),
        "hi\n[exit 3]"
    );
    assert_eq!(
        port.exec("echo out; echo err >&2", None).await.unwrap(),
        "out\n\nerr"
    );
    assert_eq!(port.exec("pwd", None).await.unwrap(), "/workspace");
    assert_eq!(port.exec("kill -9 $$", None).await.unwrap(), "\n[exit 137]");
    assert_eq!(
        port.exec("sleep 5", Some(200)).await.unwrap(),
        "\n[timed out after 200 ms]\n[exit 124]"
    );
    // The agent is the container's PID 1.
    assert_eq!(
        port.exec("cat /proc/1/cmdline | tr '\\0' ' '", None)
            .await
            .unwrap(),
        "/.omabox/omabox-agent --stdio --workdir /workspace"
    );
    port.write_file("/workspace/a.txt", "hello").await.unwrap();
    assert_eq!(port.read_file("a.txt").await.unwrap(), "hello");

    let container = port.container().to_owned();
    let state = inspect(&rig.engine, &container).await;
    let labels = &state["Config"]["Labels"];
    assert_eq!(labels[SANDBOX_LABEL], "sbx-1");
    assert_eq!(labels[HOST_LABEL], "host-a");
    let host = &state["HostConfig"];
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["CapDrop"], serde_json::json!(["ALL"]));
    assert_eq!(
        host["SecurityOpt"],
        serde_json::json!(["no-new-privileges"])
    );
    assert_eq!(host["Memory"], 1i64 << 30);
    assert_eq!(host["PidsLimit"], 512);
    assert_eq!(host["NanoCpus"], 1_000_000_000i64);
    assert_eq!(
        state["Mounts"],
        serde_json::json!([]),
        "no binding, no mount"
    );
    // Capabilities really held by the agent: the kept seven, nothing else.
    let caps = port.exec("grep CapEff /proc/1/status", None).await.unwrap();
    assert_eq!(
        caps, "CapEff:\t00000000000000fb",
        "CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID"
    );
    // Docker's default seccomp filter is on (mode 2: filter); no-new-privileges is set.
    assert_eq!(
        port.exec("grep -E '^(Seccomp|NoNewPrivs):' /proc/1/status", None)
            .await
            .unwrap(),
        "NoNewPrivs:\t1\nSeccomp:\t2"
    );
    // Network mode none: a loopback interface, nothing else.
    let links = port
        .exec(
            "cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' '",
            None,
        )
        .await
        .unwrap();
    assert_eq!(links, "lo");

    port.terminate().await.unwrap();
    port.terminate().await.unwrap();
    assert!(
        !exists(&rig.engine, &container).await,
        "the container is removed"
    );
    let after = port.exec("true", None).await.unwrap_err();
    assert!(after.message().contains("was destroyed"), "{after}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_workspace_and_outputs_are_the_only_host_paths_bound() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    let workspace = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("restored.txt"), "from the checkpoint").unwrap();
    let config = DockerConfig {
        workspace: Some(workspace.path().to_path_buf()),
        outputs: Some(outputs.path().to_path_buf()),
        ..config(&rig, "host-a")
    };
    let port = DockerSandboxPort::start(&rig.engine, &config, "sbx-ws")
        .await
        .unwrap();
    assert_eq!(
        port.exec("cat restored.txt", None).await.unwrap(),
        "from the checkpoint"
    );
    port.exec(
        "echo made > /workspace/new.txt && echo out > /mnt/session/outputs/o.txt",
        None,
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("new.txt")).unwrap(),
        "made\n"
    );
    assert_eq!(
        std::fs::read_to_string(outputs.path().join("o.txt")).unwrap(),
        "out\n"
    );
    let state = inspect(&rig.engine, port.container()).await;
    let mut bound: Vec<(String, String)> = state["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["Source"].as_str().unwrap().to_owned(),
                m["Destination"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    bound.sort();
    let mut expected = vec![
        (
            workspace.path().display().to_string(),
            "/workspace".to_owned(),
        ),
        (
            outputs.path().display().to_string(),
            "/mnt/session/outputs".to_owned(),
        ),
    ];
    expected.sort();
    assert_eq!(bound, expected);
    port.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reap_removes_the_containers_of_dead_hosts_only() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    let dead = DockerSandboxPort::start(&rig.engine, &config(&rig, "host-dead"), "sbx-dead")
        .await
        .unwrap();
    let live = DockerSandboxPort::start(&rig.engine, &config(&rig, "host-live"), "sbx-live")
        .await
        .unwrap();
    let reaped = reap_dead_hosts(&rig.engine, |host| host == "host-live")
        .await
        .unwrap();
    assert_eq!(reaped.len(), 1, "{reaped:?}");
    assert_eq!(reaped[0].sandbox, "sbx-dead");
    assert_eq!(reaped[0].host, "host-dead");
    assert!(!exists(&rig.engine, dead.container()).await);
    assert!(exists(&rig.engine, live.container()).await);
    assert_eq!(live.exec("echo still", None).await.unwrap(), "still");
    // A second reap finds nothing more to do.
    assert!(
        reap_dead_hosts(&rig.engine, |host| host == "host-live")
            .await
            .unwrap()
            .is_empty()
    );
    live.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplex_and_background_processes_run_through_the_agent() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    let port = DockerSandboxPort::start(&rig.engine, &config(&rig, "host-a"), "sbx-duplex")
        .await
        .unwrap();
    let duplex = port.as_duplex_process().expect("duplex processes");
    let mut process = duplex
        .spawn_duplex_process(omabox_sandbox::SandboxDuplexProcessSpec {
            command: "/bin/sh".into(),
            args: vec!["-c".into(), "cat; echo done >&2; exit 5".into()],
            env: Default::default(),
            cwd: None,
        })
        .await
        .unwrap();
    process.stdin.write_all(b"through stdin\n").await.unwrap();
    process.stdin.shutdown().await.unwrap();
    let mut stdout = String::new();
    process.stdout.read_to_string(&mut stdout).await.unwrap();
    let mut stderr = String::new();
    process.stderr.read_to_string(&mut stderr).await.unwrap();
    let exit = process.exited().await.unwrap();
    assert_eq!(stdout, "through stdin\n");
    assert_eq!(stderr, "done\n");
    assert_eq!((exit.code, exit.signal), (Some(5), None));

    let background = port
        .as_process()
        .expect("background processes")
        .start_process("echo started; sleep 30")
        .await
        .unwrap();
    let mut logs = background.logs().await.unwrap();
    for _ in 0..100 {
        if !logs.stdout.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        logs = background.logs().await.unwrap();
    }
    assert_eq!(logs.stdout, "started\n");
    background
        .kill(omabox_sandbox::ProcessSignal::Kill)
        .await
        .unwrap();
    port.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_the_engine_has_is_used_without_a_pull() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    rig.engine.ensure_image(&rig.image).await.unwrap();
    // A local name no registry serves: a pull of it would fail.
    rig.engine
        .docker()
        .tag_image(
            &rig.image,
            Some(bollard::query_parameters::TagImageOptions {
                repo: Some("omabox-local/busybox".into()),
                tag: Some("1".into()),
            }),
        )
        .await
        .unwrap();
    let config = DockerConfig {
        image: "omabox-local/busybox:1".into(),
        ..config(&rig, "host-a")
    };
    let port = DockerSandboxPort::start(&rig.engine, &config, "sbx-local")
        .await
        .unwrap();
    assert_eq!(port.exec("echo local", None).await.unwrap(), "local");
    port.terminate().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_of_the_container_cannot_reach_the_agents_connection() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig().await;
    let port = DockerSandboxPort::start(&rig.engine, &config(&rig, "host-a"), "sbx-fd")
        .await
        .unwrap();
    // PID 1's stdout is the protocol stream to the host: a process that could write there
    // could forge the agent's frames. The agent is non-dumpable, so its fds are closed to
    // root in the container (no CAP_SYS_PTRACE).
    let forged = port
        .exec("echo forged > /proc/1/fd/1 && echo wrote", None)
        .await
        .unwrap();
    assert!(forged.ends_with("[exit 1]"), "{forged}");
    assert!(forged.contains("Permission denied"), "{forged}");
    assert_eq!(port.exec("echo still", None).await.unwrap(), "still");
    port.terminate().await.unwrap();
}
