//! What a user hands `omabox`, refused early and named: files read with a cap (never
//! `/dev/zero` or a 10 GiB sparse file whole), and every input that can be judged before a
//! run claims its fence judged before it — so a bad input leaves no fence, lease, token or
//! usage row, and no half-run timeline.

// Shared with the other CLI tests; this one needs only part of it.
#[allow(dead_code)]
mod common;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// `omabox --data-dir DATA ARGS…` in test mode, its address space capped at 2 GiB so a
/// command that reads an endless input whole fails at once instead of eating the machine.
fn omabox(data: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .env_remove("OMABOX_INFERENCE_GATEWAY")
        .stdin(Stdio::null());
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 2 << 30,
                rlim_max: 2 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A 10 GiB file of holes.
fn sparse_file(dir: &Path) -> PathBuf {
    let path = dir.join("huge.json");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(10 << 30)
        .unwrap();
    path
}

#[test]
fn every_file_the_cli_reads_is_capped() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let huge = sparse_file(dir.path());
    for input in [Path::new("/dev/zero"), huge.as_path()] {
        let file = input.to_str().unwrap();
        for (args, max) in [
            (
                vec![
                    "run",
                    "--backend",
                    "local",
                    "--agent-json",
                    file,
                    "--prompt",
                    "x",
                ],
                "1 MiB",
            ),
            (
                vec!["run", "--backend", "local", "--profile", file, "--", "true"],
                "1 MiB",
            ),
            (
                vec![
                    "run",
                    "--backend",
                    "local",
                    "--session-json",
                    file,
                    "--",
                    "true",
                ],
                "1 MiB",
            ),
            (
                vec![
                    "run",
                    "--backend",
                    "local",
                    "--environment",
                    file,
                    "--",
                    "true",
                ],
                "1 MiB",
            ),
            (
                vec![
                    "run",
                    "--backend",
                    "local",
                    "--acp-command",
                    "a",
                    "--prompt",
                    "x",
                    "--inference-config",
                    file,
                ],
                "1 MiB",
            ),
            (vec!["serve", "--config", file], "1 MiB"),
            (vec!["files", "add", file], "64 MiB"),
        ] {
            let output = omabox(&data, &args).output().unwrap();
            let text = stderr(&output);
            assert!(!output.status.success(), "{args:?}: {text}");
            assert!(
                text.contains(&format!("{file}: too large (max {max})")),
                "{args:?}: {text}"
            );
        }
    }
    // A secret on standard input.
    let output = omabox(&data, &["vault", "put", "k"])
        .stdin(std::fs::File::open("/dev/zero").unwrap())
        .output()
        .unwrap();
    assert!(
        stderr(&output).contains("the secret on standard input: too large (max 1 MiB)"),
        "{}",
        stderr(&output)
    );
    // A small file is read as before.
    let small = dir.path().join("small");
    std::fs::write(&small, "hello").unwrap();
    let output = omabox(&data, &["files", "add", small.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
}

/// Row counts of every table a claimed run writes.
fn claims(data: &Path) -> Vec<(String, i64)> {
    let conn = rusqlite::Connection::open(data.join("omabox.db")).unwrap();
    [
        "runtime_fence",
        "runtime_lease",
        "session_token",
        "usage_record",
        "runtime_orphan",
    ]
    .iter()
    .map(|table| {
        let count = conn
            .query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                row.get(0)
            })
            .unwrap();
        ((*table).to_owned(), count)
    })
    .collect()
}

#[test]
fn bad_inputs_are_refused_before_a_fence_is_claimed() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let first = omabox(
        &data,
        &["run", "--backend", "local", "--session", "ok", "--", "true"],
    )
    .output()
    .unwrap();
    assert!(first.status.success(), "{}", stderr(&first));
    let before = claims(&data);
    let json = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_owned()
    };
    let bad_mount = json(
        "bad-mount.json",
        r#"{"resources":[{"type":"file","file_id":"file_x","mount_path":"../../etc"}]}"#,
    );
    let bad_type = json("bad-type.json", r#"{"resources":[{"type":"dataset"}]}"#);
    let bad_store = json(
        "bad-store.json",
        r#"{"resources":[{"type":"memory_store","memory_store_id":"../x"}]}"#,
    );
    let creds = json(
        "creds.json",
        r#"{"resources":[{"type":"github_repository","url":"https://u:p@example.com/r.git","mount_path":"/workspace/r"}]}"#,
    );
    let no_command = json("agent.json", r#"{"_oma":{"acp":{"agent":{}}}}"#);
    let not_profile = json("profile.json", r#"{"driver": 1}"#);
    let long_session = "s".repeat(100_000);
    let holds_data = dir.path().to_str().unwrap().to_owned();
    let data_itself = data.to_str().unwrap().to_owned();
    // (extra arguments, extra environment, what the error says)
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![
                "--resource",
                "file:file_00000000000000000000000000000000:/workspace/x",
            ],
            vec![],
            "no such file in omabox's file store",
        ),
        (
            vec!["--session-json", &bad_mount],
            vec![],
            "may not traverse parents",
        ),
        (
            vec!["--session-json", &bad_type],
            vec![],
            "Unsupported Session resource type: dataset",
        ),
        (
            vec!["--session-json", &bad_store],
            vec![],
            "requires a memory_store_id",
        ),
        (
            vec!["--session-json", &creds],
            vec![],
            "must not carry credentials",
        ),
        (
            vec!["--inference-config", &bad_type],
            vec![],
            "--inference-config is for an ACP agent",
        ),
        (
            vec!["--session", "seed1", "--workspace", &holds_data],
            vec![],
            "holds omabox's data directory",
        ),
        (
            vec!["--session", "seed2", "--workspace", &data_itself],
            vec![],
            "is omabox's data directory",
        ),
        (
            vec!["--acp-command", "agent", "--prompt", " \n"],
            vec![],
            "--prompt is empty",
        ),
        (
            vec!["--acp-permission", "deny"],
            vec![],
            "--acp-permission is for an ACP agent",
        ),
        (vec!["--session", "../etc"], vec![], "is not valid"),
        (vec!["--session", "a\nb"], vec![], "\"a\\nb\" is not valid"),
        (
            vec!["--session", &long_session],
            vec![],
            "(100000 characters) is not valid",
        ),
        (
            vec!["--profile", &not_profile],
            vec![],
            "is not a ManagedRuntimeProfile",
        ),
        (
            vec!["--session", "ok", "--from-revision", "7"],
            vec![],
            "revision 7",
        ),
        (
            vec![],
            vec![("OMABOX_CHECKPOINT_MAX_BYTES", "lots")],
            "OMABOX_CHECKPOINT_MAX_BYTES",
        ),
    ];
    for (extra, env, expected) in cases {
        let mut args = vec!["run", "--backend", "local"];
        args.extend(&extra);
        if !extra.contains(&"--profile") {
            args.extend(["--", "true"]);
        }
        let output = omabox(&data, &args)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        let text = stderr(&output);
        assert!(!output.status.success(), "{extra:?}: {text}");
        assert!(text.contains(expected), "{extra:?}: {text}");
        assert!(text.len() < 2000, "{extra:?}: the error is short: {text}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(!stdout.contains("fence"), "{extra:?}: a half-run: {stdout}");
        assert_eq!(
            claims(&data),
            before,
            "{extra:?} left a claim behind: {text}"
        );
    }
    // A bad sandbox limit is the user's input, said as such (not "this machine cannot run
    // linux sandboxes", not a hint about root), before anything is claimed.
    for (key, value) in [
        ("OMABOX_LINUX_MEMORY", "lots"),
        ("OMABOX_LINUX_CPUS", "-1"),
        ("OMABOX_LINUX_PIDS", "1"),
    ] {
        let output = omabox(&data, &["run", "--backend", "linux", "--", "true"])
            .env(key, value)
            .output()
            .unwrap();
        let text = stderr(&output);
        assert!(!output.status.success(), "{key}: {text}");
        assert!(
            text.contains(&format!("{key}={value:?} is invalid")),
            "{text}"
        );
        assert!(!text.contains("on this machine"), "{text}");
        assert!(!text.contains("need root"), "{text}");
        assert_eq!(claims(&data), before, "{key} left a claim behind");
    }
    // The agent definition without a command (no --backend linux needed to judge it).
    let output = omabox(
        &data,
        &[
            "run",
            "--backend",
            "local",
            "--agent-json",
            &no_command,
            "--prompt",
            "x",
        ],
    )
    .output()
    .unwrap();
    assert!(stderr(&output).contains("acp-sandbox requires _oma.acp.agent.command"));
    assert_eq!(claims(&data), before);
}

/// `omabox vault put` with a closed or empty standard input is refused, not stored empty.
#[test]
fn a_closed_stdin_is_no_secret() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = omabox(&data, &["vault", "put", "k"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdin.take());
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("no secret on standard input"),
        "{}",
        stderr(&output)
    );
    let _ = std::io::stdout().flush();
}

/// A root filesystem of the host's static busybox as `/bin/sh`, with an image's mount
/// targets.
fn busybox_rootfs(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", dir.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", dir.join("bin/sh")).unwrap();
    for target in [
        "etc",
        "proc",
        "dev",
        "tmp",
        "workspace",
        "mnt/session/outputs",
    ] {
        std::fs::create_dir_all(dir.join(target)).unwrap();
    }
}

/// A run's image and environment layer are prepared before it claims its fence: an image
/// that cannot be unpacked, or a dockerfile whose `RUN` fails, is reported with no fence,
/// lease, token or usage row made (an acquire only starts a sandbox from what was
/// prepared).
#[test]
fn a_bad_image_or_a_failing_layer_build_is_reported_before_a_fence_is_claimed() {
    if !common::linux_available() {
        return;
    }
    // `ldd` refuses a static executable ("not a dynamic executable").
    let static_busybox = Path::new("/bin/busybox").is_file()
        && Command::new("ldd")
            .arg("/bin/busybox")
            .output()
            .is_ok_and(|o| !o.status.success());
    if !omabox_test_support::require_capability(
        (!static_busybox).then(|| "a static /bin/busybox is missing (busybox-static)".to_owned()),
    ) {
        return;
    }
    let dirs = common::TestDirs::new("inputs");
    let data = dirs.data.path();
    let cache = data.join("images");
    let run = |image: &Path, environment: Option<&Path>| {
        let mut command = dirs.command(&["run", "--json", "--backend", "linux", "--session", "s"]);
        if let Some(file) = environment {
            command.arg("--environment").arg(file);
        }
        command
            .args(["--", "true"])
            .env("SANDBOX_IMAGE", image)
            .env("OMABOX_LINUX_IMAGE_CACHE", &cache)
            .env_remove("OMABOX_LINUX_NETWORK")
            .env_remove("OMABOX_INFERENCE_GATEWAY")
            .output()
            .unwrap()
    };
    let nothing_claimed = |what: &str, output: &Output| {
        assert!(
            !output.status.success(),
            "{what}: {}",
            common::describe(output)
        );
        assert!(
            output.stdout.is_empty(),
            "{what}: a report: {}",
            common::describe(output)
        );
        for (table, count) in claims(data) {
            assert_eq!(
                count,
                0,
                "{what} left a {table} row: {}",
                common::describe(output)
            );
        }
    };

    // A tarball cut short: its header is a tar's, its content ends early.
    let tree = dirs.runtime_dir.path().join("tree");
    std::fs::create_dir_all(&tree).unwrap();
    std::fs::write(tree.join("big"), vec![7u8; 1 << 20]).unwrap();
    let tarball = data.join("cut.tar");
    let made = Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&tree)
        .arg("big")
        .status()
        .unwrap();
    assert!(made.success());
    std::fs::File::options()
        .write(true)
        .open(&tarball)
        .unwrap()
        .set_len(4096)
        .unwrap();
    let output = run(&tarball, None);
    assert!(
        stderr(&output).contains("cannot use image"),
        "{}",
        stderr(&output)
    );
    nothing_claimed("a truncated tarball", &output);

    // A dockerfile whose RUN fails, over a good image.
    let rootfs = data.join("rootfs");
    busybox_rootfs(&rootfs);
    let environment = data.join("env.json");
    std::fs::write(
        &environment,
        r#"{"config":{"type":"cloud","networking":{"type":"none"},"dockerfile":"RUN echo building && exit 7"}}"#,
    )
    .unwrap();
    let output = run(&rootfs, Some(&environment));
    nothing_claimed("a failing dockerfile RUN", &output);
}
