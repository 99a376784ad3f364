//! The local-subprocess backend against the real host: exec, duplex, background processes,
//! files, paths, teardown, the factory's test-mode rule and the readiness probe.

use omabox_backend_local::*;
use omabox_contract::PortError;
use omabox_sandbox::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn sandbox_in(dir: &Path) -> LocalSubprocessSandbox {
    LocalSubprocessSandbox::new(LocalSubprocessOptions::new(dir.join("ws"))).unwrap()
}

fn process_alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; read its state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

async fn eventually(mut check: impl FnMut() -> bool) -> bool {
    for _ in 0..300 {
        if check() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test]
async fn exec_follows_the_local_output_convention() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    assert_eq!(sandbox.exec("echo hi", None).await.unwrap(), "hi");
    assert_eq!(
        sandbox
            .exec("echo out; echo err >&2; exit 3", None)
            .await
            .unwrap(),
        // Exactly the TypeScript concatenation: stdout keeps its newline before "\n" + stderr.
        "out\n\nerr\n[exit exit=3]"
    );
    assert_eq!(
        sandbox.exec("exit 1", None).await.unwrap(),
        "\n[exit exit=1]"
    );
    assert_eq!(
        sandbox.exec("echo bye; kill -KILL $$", None).await.unwrap(),
        "bye\n[exit signal=SIGKILL]"
    );
    assert_eq!(
        sandbox.exec("printf 'a  \\n\\n'", None).await.unwrap(),
        "a",
        "trailing whitespace is trimmed"
    );
    let pwd = sandbox.exec("pwd", None).await.unwrap();
    assert_eq!(Path::new(&pwd), sandbox.workdir());
}

#[tokio::test]
async fn exec_timeout_terminates_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let started = std::time::Instant::now();
    let output = sandbox
        .exec("sleep 30 & echo $! > child.pid; wait", Some(200))
        .await
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(output.ends_with("[exit signal=SIGTERM]"), "{output}");
    let pid: u32 = std::fs::read_to_string(sandbox.workdir().join("child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        eventually(|| !process_alive(pid)).await,
        "grandchild survived"
    );
}

#[tokio::test]
async fn env_vars_and_command_secrets_reach_later_commands() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let env = sandbox.as_env_vars().unwrap();
    env.set_env_vars(BTreeMap::from([
        ("GREETING".to_owned(), "hello".to_owned()),
        ("HOME_DIR".to_owned(), "/workspace/home".to_owned()),
    ]))
    .await
    .unwrap();
    assert_eq!(sandbox.exec("echo $GREETING", None).await.unwrap(), "hello");
    let home = sandbox.exec("echo $HOME_DIR", None).await.unwrap();
    assert_eq!(Path::new(&home), sandbox.workdir().join("home"));
    assert!(
        env.set_env_vars(BTreeMap::from([("A=B".to_owned(), "x".to_owned())]))
            .await
            .is_err()
    );

    sandbox
        .as_command_secrets()
        .unwrap()
        .register_command_secrets(
            "gh ",
            BTreeMap::from([("GH_TOKEN".into(), "s3cr3t".into())]),
        );
    assert_eq!(
        sandbox.exec("echo \"[$GH_TOKEN]\"", None).await.unwrap(),
        "[]"
    );
    assert_eq!(
        sandbox
            .exec("gh() { echo \"[$GH_TOKEN]\"; }; gh ", None)
            .await
            .unwrap(),
        "[]",
        "the prefix is matched against the command text"
    );
    // Commands that start with the prefix see the secret.
    sandbox
        .as_command_secrets()
        .unwrap()
        .register_command_secrets("echo ", BTreeMap::from([("TOKEN".into(), "t0k".into())]));
    assert_eq!(sandbox.exec("echo $TOKEN", None).await.unwrap(), "t0k");
}

#[tokio::test]
async fn duplex_stdin_echoes_through_cat_and_eof_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    assert!(supports_duplex_process(&sandbox));
    let mut process = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(SandboxDuplexProcessSpec::new("cat"))
        .await
        .unwrap();
    process.stdin.write_all(b"hello\n").await.unwrap();
    process.stdin.write_all(&[0, 255, 10]).await.unwrap();
    process.stdin.shutdown().await.unwrap();
    let mut stdout = Vec::new();
    process.stdout.read_to_end(&mut stdout).await.unwrap();
    assert_eq!(stdout, b"hello\n\x00\xff\n");
    let exit = process.exited().await.unwrap();
    assert_eq!(
        exit,
        SandboxProcessExit {
            code: Some(0),
            signal: None,
            out_of_memory: None,
        }
    );
    // Writing after close is an error, not a panic.
    assert!(process.stdin.write_all(b"late").await.is_err());
}

#[tokio::test]
async fn duplex_spec_env_cwd_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    sandbox
        .as_env_vars()
        .unwrap()
        .set_env_vars(BTreeMap::from([("DROPPED".into(), "x".into())]))
        .await
        .unwrap();
    sandbox
        .write_file("/workspace/sub/keep.txt", "k")
        .await
        .unwrap();
    let spec = SandboxDuplexProcessSpec {
        command: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            "echo \"$ADDED/${DROPPED:-unset}/$(pwd)\"; echo oops >&2; exit 4".into(),
        ],
        env: BTreeMap::from([
            ("ADDED".into(), Some("yes".into())),
            ("DROPPED".into(), None),
        ]),
        cwd: Some("/workspace/sub".into()),
    };
    let mut process = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(spec)
        .await
        .unwrap();
    let mut stdout = String::new();
    let mut stderr = String::new();
    process.stdout.read_to_string(&mut stdout).await.unwrap();
    process.stderr.read_to_string(&mut stderr).await.unwrap();
    let expected = format!("yes/unset/{}\n", sandbox.workdir().join("sub").display());
    assert_eq!(stdout, expected);
    assert_eq!(stderr, "oops\n");
    assert_eq!(process.exited().await.unwrap().code, Some(4));

    let missing = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(SandboxDuplexProcessSpec::new(
            "definitely-not-a-binary-omabox",
        ))
        .await
        .unwrap_err();
    assert!(missing.message().contains("could not start"), "{missing}");
}

#[tokio::test]
async fn duplex_kill_reports_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let mut spec = SandboxDuplexProcessSpec::new("sleep");
    spec.args = vec!["100".into()];
    let process = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(spec)
        .await
        .unwrap();
    process.kill(DuplexKillSignal::Kill).await.unwrap();
    assert_eq!(
        process.exited().await.unwrap(),
        SandboxProcessExit {
            code: None,
            signal: Some("SIGKILL".into()),
            out_of_memory: None,
        }
    );
    // Killing an exited process is a no-op.
    process.kill(DuplexKillSignal::Term).await.unwrap();
}

#[tokio::test]
async fn duplex_sigterm_escalates_to_sigkill_when_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let spec = SandboxDuplexProcessSpec {
        command: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            "trap '' TERM; echo ready; while :; do sleep 1; done".into(),
        ],
        ..SandboxDuplexProcessSpec::default()
    };
    let mut process = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(spec)
        .await
        .unwrap();
    let mut ready = [0u8; 6];
    process.stdout.read_exact(&mut ready).await.unwrap();
    process.kill(DuplexKillSignal::Term).await.unwrap();
    assert_eq!(
        process.exited().await.unwrap().signal.as_deref(),
        Some("SIGKILL")
    );
}

#[tokio::test]
async fn background_process_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let processes = sandbox.as_process().unwrap();

    let done = processes
        .start_process("echo start; echo warn >&2; sleep 0.2; echo done")
        .await
        .unwrap();
    assert!(done.id.starts_with(&format!("proc_{}_", done.pid)));
    assert_eq!(done.status().await.unwrap(), ProcessStatus::Running);
    let mut status = ProcessStatus::Running;
    for _ in 0..300 {
        status = done.status().await.unwrap();
        if status != ProcessStatus::Running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(status, ProcessStatus::Completed);
    assert_eq!(
        done.logs().await.unwrap(),
        ProcessLogs {
            stdout: "start\ndone\n".into(),
            stderr: "warn\n".into()
        }
    );

    let failing = processes.start_process("exit 3").await.unwrap();
    let killed = processes.start_process("sleep 100").await.unwrap();
    killed.kill(ProcessSignal::Term).await.unwrap();
    for (handle, expected) in [
        (&failing, ProcessStatus::Error),
        (&killed, ProcessStatus::Killed),
    ] {
        let mut status = ProcessStatus::Running;
        for _ in 0..300 {
            status = handle.status().await.unwrap();
            if status != ProcessStatus::Running {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(status, expected);
    }
    // Killing a finished process is harmless.
    killed.kill(ProcessSignal::Kill).await.unwrap();
}

#[tokio::test]
async fn file_bytes_round_trip_every_byte_value() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let bytes: Vec<u8> = (0..=255u8).collect();
    let files = sandbox.as_file_bytes().unwrap();
    let resolved = files
        .write_file_bytes("/workspace/deep/dir/all.bin", &bytes)
        .await
        .unwrap();
    assert_eq!(
        Path::new(&resolved),
        sandbox.workdir().join("deep/dir/all.bin")
    );
    assert_eq!(
        files
            .read_file_bytes("/workspace/deep/dir/all.bin")
            .await
            .unwrap(),
        bytes
    );
    assert_eq!(std::fs::read(&resolved).unwrap(), bytes);
    // Text API: non-UTF-8 is a clear error.
    let error = sandbox
        .read_file("/workspace/deep/dir/all.bin")
        .await
        .unwrap_err();
    assert!(error.message().contains("not valid UTF-8"), "{error}");
    // Text round trip, relative paths land in the workspace, and exec sees the same file.
    sandbox.write_file("notes/a.txt", "héllo").await.unwrap();
    assert_eq!(
        sandbox.read_file("/workspace/notes/a.txt").await.unwrap(),
        "héllo"
    );
    assert_eq!(
        sandbox.exec("cat notes/a.txt", None).await.unwrap(),
        "héllo"
    );
    let missing = sandbox.read_file("/workspace/nope").await.unwrap_err();
    assert!(
        missing.message().contains("\"/workspace/nope\""),
        "{missing}"
    );
}

#[tokio::test]
async fn path_traversal_out_of_the_roots_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), "s").unwrap();
    let sandbox = LocalSubprocessSandbox::new(LocalSubprocessOptions {
        outputs_root: Some(dir.path().join("outputs")),
        ..LocalSubprocessOptions::new(dir.path().join("ws"))
    })
    .unwrap();
    std::os::unix::fs::symlink(&outside, sandbox.workdir().join("link")).unwrap();

    for path in [
        "/workspace/../outside/secret",
        "../outside/secret",
        "/workspace/a/../../outside/secret",
        "/mnt/session/outputs/../ws/x",
        "/workspace/link/secret",
        "/workspace/link/new-file",
    ] {
        let error = sandbox.read_file(path).await.unwrap_err();
        assert!(
            error.message().contains("escapes its root"),
            "{path}: {error}"
        );
        let error = sandbox.write_file(path, "x").await.unwrap_err();
        assert!(
            error.message().contains("escapes its root"),
            "{path}: {error}"
        );
    }
    for path in [
        "/etc/passwd",
        "/tmp/x",
        "/workspacefoo/x",
        "/mnt/memory/notes/a",
    ] {
        let error = sandbox.read_file(path).await.unwrap_err();
        assert!(
            error
                .message()
                .contains("outside the local sandbox's file roots"),
            "{path}: {error}"
        );
    }
    let nul = sandbox.read_file("/workspace/a\0b").await.unwrap_err();
    assert!(nul.message().contains("NUL"));
    assert_eq!(
        std::fs::read_to_string(outside.join("secret")).unwrap(),
        "s"
    );

    // Staying inside with `..` is fine, and outputs map to the outputs root.
    sandbox
        .write_file("/workspace/a/../inside.txt", "ok")
        .await
        .unwrap();
    assert!(sandbox.workdir().join("inside.txt").exists());
    let written = sandbox
        .write_file("/mnt/session/outputs/report.md", "# r")
        .await
        .unwrap();
    assert_eq!(
        Path::new(&written),
        dir.path()
            .join("outputs")
            .canonicalize()
            .unwrap()
            .join("report.md")
    );
    assert_eq!(
        sandbox
            .exec("cat \"$OMA_OUTPUTS_DIR/report.md\"", None)
            .await
            .unwrap(),
        "# r"
    );
}

#[tokio::test]
async fn outputs_paths_without_an_outputs_root_are_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let error = sandbox
        .write_file("/mnt/session/outputs/x", "x")
        .await
        .unwrap_err();
    assert!(error.message().contains("no outputs root"), "{error}");
}

#[tokio::test]
async fn destroy_kills_every_process_group_and_removes_the_workdir_it_created() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let workdir = sandbox.workdir().to_owned();
    let background = sandbox
        .as_process()
        .unwrap()
        .start_process("sleep 100 & echo $! > bg-child.pid; sleep 100")
        .await
        .unwrap();
    let mut spec = SandboxDuplexProcessSpec::new("sleep");
    spec.args = vec!["100".into()];
    let duplex = sandbox
        .as_duplex_process()
        .unwrap()
        .spawn_duplex_process(spec)
        .await
        .unwrap();
    assert!(
        eventually(|| workdir.join("bg-child.pid").exists()
            && !std::fs::read_to_string(workdir.join("bg-child.pid"))
                .unwrap()
                .trim()
                .is_empty())
        .await
    );
    let grandchild: u32 = std::fs::read_to_string(workdir.join("bg-child.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(process_alive(grandchild));

    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    assert!(eventually(|| !process_alive(background.pid)).await);
    assert!(eventually(|| !process_alive(grandchild)).await);
    assert_eq!(
        duplex.exited().await.unwrap().signal.as_deref(),
        Some("SIGKILL")
    );
    assert!(!workdir.exists());

    // Destroy is idempotent, and the sandbox refuses work afterwards.
    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    let error = sandbox.exec("true", None).await.unwrap_err();
    assert_eq!(
        error.message(),
        "the local-subprocess sandbox was destroyed"
    );
    assert!(
        sandbox
            .as_process()
            .unwrap()
            .start_process("true")
            .await
            .is_err()
    );
}

#[tokio::test]
async fn an_existing_workdir_is_left_in_place_and_drop_kills_processes() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = LocalSubprocessSandbox::new(LocalSubprocessOptions::new(dir.path())).unwrap();
    let handle = sandbox
        .as_process()
        .unwrap()
        .start_process("sleep 100")
        .await
        .unwrap();
    sandbox.write_file("kept.txt", "k").await.unwrap();
    drop(sandbox);
    assert!(eventually(|| !process_alive(handle.pid)).await);
    assert!(dir.path().join("kept.txt").exists());
}

#[tokio::test]
async fn the_local_backend_exposes_only_what_it_implements() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    assert!(supports_duplex_process(&sandbox));
    assert!(sandbox.as_process().is_some());
    assert!(sandbox.as_file_bytes().is_some());
    assert!(sandbox.as_env_vars().is_some());
    assert!(sandbox.as_destroy().is_some());
    assert!(!supports_sandbox_runtime(&sandbox));
    assert!(!supports_workspace_backup(&sandbox));
    assert!(!supports_managed_workspace_lifecycle(&sandbox));
    assert!(!supports_session_output_mount(&sandbox));
    assert!(sandbox.as_memory_mount().is_none());
    assert!(sandbox.as_outbound_context().is_none());
}

fn ctx(dir: &Path) -> SandboxFactoryContext {
    SandboxFactoryContext {
        session_id: "sess_local".into(),
        workdir: dir.join("ws"),
        memory_root: None,
        outputs_root: None,
    }
}

#[tokio::test]
async fn the_factory_refuses_outside_test_mode() {
    let dir = tempfile::tempdir().unwrap();
    let factory = LocalSubprocessFactory::new();
    for env in [
        SandboxFactoryEnv::default(),
        [("NODE_ENV", "production")].into_iter().collect(),
        [("OMABOX_TEST_MODE", "0")].into_iter().collect(),
    ] {
        let error = match factory.create(&ctx(dir.path()), &env).await {
            Ok(_) => panic!("created outside test mode"),
            Err(error) => error,
        };
        assert_eq!(
            error.message(),
            "the local-subprocess sandbox has no isolation boundary and is created only in test \
             mode (set OMABOX_TEST_MODE=1 or NODE_ENV=test)"
        );
    }
    assert!(!dir.path().join("ws").exists(), "nothing created");
}

#[tokio::test]
async fn the_provider_map_selects_local_in_test_mode_and_it_works() {
    let dir = tempfile::tempdir().unwrap();
    let mut registry = SandboxFactoryRegistry::new();
    registry.register_local_subprocess(Arc::new(LocalSubprocessFactory::new()));
    for flag in [("OMABOX_TEST_MODE", "1"), ("NODE_ENV", "test")] {
        let env: SandboxFactoryEnv = [("OPENMA_TEST_SANDBOX_PROVIDER", "local-subprocess"), flag]
            .into_iter()
            .collect();
        let factory = resolve_sandbox_provider(&env, &registry).unwrap();
        let sandbox = factory.create(&ctx(dir.path()), &env).await.unwrap();
        assert_eq!(sandbox.exec("echo ok", None).await.unwrap(), "ok");
        sandbox.as_destroy().unwrap().destroy().await.unwrap();
    }
}

#[tokio::test]
async fn readiness_probe_passes_for_present_executables() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    verify_runtime_environment(&sandbox, "sh", None)
        .await
        .unwrap();
    verify_runtime_environment(&sandbox, "/bin/sh", None)
        .await
        .unwrap();
    let script = sandbox.workdir().join("harness.sh");
    std::fs::write(&script, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    verify_runtime_environment(&sandbox, script.to_str().unwrap(), None)
        .await
        .unwrap();
}

#[tokio::test]
async fn readiness_probe_fails_clearly_for_missing_or_non_executable_harnesses() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = sandbox_in(dir.path());
    let plain = sandbox.workdir().join("not-executable");
    std::fs::write(&plain, "data").unwrap();
    let directory = sandbox.workdir().to_str().unwrap().to_owned();
    for command in [
        "definitely-not-a-real-harness-omabox",
        "/nonexistent/bin/harness",
        plain.to_str().unwrap(),
        directory.as_str(),
        // An injection attempt stays a (missing) command name.
        "x'; echo __OPENMA_RUNTIME_READY__; '",
    ] {
        let error: PortError = verify_runtime_environment(&sandbox, command, None)
            .await
            .unwrap_err();
        assert_eq!(
            error.message(),
            format!(
                "Runtime environment is not ready: harness executable {command} was not found or \
                 is not executable (output: [exit exit=127])"
            )
        );
    }
}
