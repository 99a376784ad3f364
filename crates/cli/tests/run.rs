//! `omabox run` end to end, driven as a user would: the real binary, a real data directory,
//! real sandboxes, real signals (`kill -9`, SIGINT). Each test has its own data directory
//! and, on linux, its own runtime dir and cgroup parent, and checks that no sandbox (state
//! dir, cgroup, process) is left.
//!
//! The linux tests need root, cgroups and the `omabox-sandbox-init` binary next to
//! `omabox` (`cargo build --bins`); they skip with a printed reason where those are missing,
//! and fail under `CI=true`. The basic two-run test also runs on `local` (test mode).

mod common;

use common::describe;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Which backend a [`Setup`] runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Linux,
    Local,
}

/// One test's data directory (and, on linux, runtime dir and cgroup parent).
struct Setup {
    backend: Backend,
    dirs: common::TestDirs,
}

/// `Some` when linux sandboxes can run here; otherwise prints why and returns `None`, or
/// fails under `CI=true`.
fn linux() -> Option<Setup> {
    if !common::linux_available() {
        return None;
    }
    Some(Setup::new(Backend::Linux))
}

fn local() -> Setup {
    Setup::new(Backend::Local)
}

impl Setup {
    fn new(backend: Backend) -> Self {
        Self {
            backend,
            dirs: common::TestDirs::new("run"),
        }
    }

    /// `omabox --data-dir D <args>` with this test's environment.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.dirs.command(args);
        command
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_LEASE_TTL_MS");
        command
    }

    fn backend_flag(&self) -> &'static str {
        match self.backend {
            Backend::Linux => "linux",
            Backend::Local => "local",
        }
    }

    /// `omabox run --json --backend B --session S <extra> -- CMD...`.
    fn run_command(&self, session: &str, extra: &[&str], cmd: &[&str]) -> Command {
        let mut args = vec![
            "run",
            "--json",
            "--backend",
            self.backend_flag(),
            "--session",
            session,
        ];
        args.extend_from_slice(extra);
        args.push("--");
        args.extend_from_slice(cmd);
        self.command(&args)
    }

    fn run(&self, session: &str, cmd: &[&str]) -> (Value, Output) {
        let output = self
            .run_command(session, &[], cmd)
            .output()
            .expect("omabox runs");
        (json_of(&output), output)
    }

    /// The `--json` document of `omabox <args>`.
    fn json(&self, args: &[&str]) -> Value {
        let output = self.command(args).output().expect("omabox runs");
        assert!(output.status.success(), "{}", describe(&output));
        json_of(&output)
    }

    fn cgroup_parents(&self) -> Vec<PathBuf> {
        common::cgroup_parent_dirs(&self.dirs.cgroup_parent)
    }

    /// The sandboxes' state dirs in this test's runtime dir.
    fn state_dirs(&self) -> Vec<PathBuf> {
        std::fs::read_dir(self.dirs.runtime_dir.path())
            .map(|entries| entries.flatten().map(|entry| entry.path()).collect())
            .unwrap_or_default()
    }

    /// No state dir, no sandbox cgroup, no process in one, no journaled lease.
    fn assert_no_sandbox_left(&self) {
        if self.backend == Backend::Linux {
            let state = self.state_dirs();
            assert!(state.is_empty(), "state dirs left: {state:?}");
            for parent in self.cgroup_parents() {
                if let Ok(entries) = std::fs::read_dir(&parent) {
                    let dirs: Vec<_> = entries
                        .flatten()
                        .map(|entry| entry.path())
                        .filter(|path| path.is_dir())
                        .collect();
                    assert!(dirs.is_empty(), "cgroups left under {parent:?}: {dirs:?}");
                }
            }
            let in_cgroup: Vec<_> = std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|entry| {
                    std::fs::read_to_string(entry.path().join("cgroup"))
                        .is_ok_and(|cgroup| cgroup.contains(&self.dirs.cgroup_parent))
                })
                .map(|entry| entry.file_name())
                .collect();
            assert!(in_cgroup.is_empty(), "processes left: {in_cgroup:?}");
        }
        let reap = self.json(&["reap", "--json"]);
        assert_eq!(
            reap["abandoned"]["inspected"], 0,
            "journaled leases left: {reap}"
        );
        assert_eq!(reap["inspected"], 0, "orphans left: {reap}");
    }

    /// Waits until a file named `name` appears in some workspace binding of this data dir
    /// (the harness wrote it: its sandbox is up).
    fn wait_for_workspace_file(&self, name: &str, child: &mut Child) -> PathBuf {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(found) = find_file(&self.dirs.data.path().join("runtime"), name) {
                return found;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("omabox run ended ({status}) before the harness wrote {name}");
            }
            assert!(Instant::now() < deadline, "the harness never wrote {name}");
            std::thread::sleep(Duration::from_millis(25));
        }
    }
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        let kind = entry.file_type().ok()?;
        if kind.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if entry.file_name() == name {
            return Some(path);
        }
    }
    None
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
        panic!(
            "stdout is not one JSON document ({error}): {}",
            describe(output)
        )
    })
}

fn steps(report: &Value) -> Vec<String> {
    report["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["step"].as_str().unwrap().to_owned())
        .collect()
}

/// The session's row in `omabox sessions --json`.
fn session_row(setup: &Setup, session: &str) -> Value {
    let sessions = setup.json(&["sessions", "--json"]);
    sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["session"] == session)
        .cloned()
        .unwrap_or(Value::Null)
}

/// Writes `a` (through `/workspace` on linux, the cwd on local, which is `/workspace`
/// there) and an output; the second run reads `a` back.
fn two_runs_on_one_session(setup: &Setup) {
    let (first, output) = setup.run(
        "s1",
        &[
            "sh",
            "-c",
            r#"echo one > a && echo report > "${OMA_OUTPUTS_DIR:-/mnt/session/outputs}/r.txt""#,
        ],
    );
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        first["result"],
        serde_json::json!({"type": "completed", "revision": 1})
    );
    assert_eq!(first["generation"], 1);
    assert_eq!(first["restoredRevision"], Value::Null);
    assert_eq!(first["session"], "s1");
    assert_eq!(first["outputs"][0]["logicalPath"], "r.txt");
    assert_eq!(first["outputs"][0]["size"], 7);
    for step in [
        "fence.acquire",
        "sandbox.acquire",
        "harness.run",
        "workspace.checkpoint",
        "fence.publish",
        "total",
    ] {
        assert!(
            first["timings"][step].is_number(),
            "no timing for {step}: {first}"
        );
    }

    let read = if setup.backend == Backend::Linux {
        "/workspace/a"
    } else {
        "a"
    };
    let (second, output) = setup.run("s1", &["cat", read]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "one");
    assert_eq!(
        second["result"],
        serde_json::json!({"type": "completed", "revision": 2})
    );
    assert_eq!(second["generation"], 2);
    assert_eq!(second["restoredRevision"], 1);
    assert_eq!(second["outputs"], serde_json::json!([]));

    let row = session_row(setup, "s1");
    assert_eq!(
        (row["revision"].clone(), row["generation"].clone()),
        (2.into(), 2.into())
    );
    let exported = setup.dirs.data.path().join("exported");
    let export = setup
        .command(&["workspace", "export", "--session", "s1"])
        .arg(&exported)
        .output()
        .unwrap();
    assert!(export.status.success(), "{}", describe(&export));
    assert_eq!(
        std::fs::read_to_string(exported.join("a")).unwrap(),
        "one\n"
    );
    setup.assert_no_sandbox_left();
}

#[test]
fn linux_two_runs_on_one_session_continue_its_workspace() {
    let Some(setup) = linux() else { return };
    two_runs_on_one_session(&setup);

    // Each terminated linux sandbox left one sandbox_active_seconds record.
    let usage = setup.json(&["usage", "--session", "s1", "--json"]);
    let records = usage.as_array().expect("an array of usage records");
    assert_eq!(records.len(), 2, "{usage}");
    for record in records {
        assert_eq!(record["kind"], "sandbox_active_seconds");
        assert_eq!(record["provider"], "linux");
        assert!(
            record["seconds"].as_u64().is_some_and(|s| s < 600),
            "{record}"
        );
    }
}

#[test]
fn local_two_runs_on_one_session_continue_its_workspace() {
    let setup = local();
    two_runs_on_one_session(&setup);
    // local terminate/reap cannot observe a real stop from every process: no usage is guessed.
    assert_eq!(setup.json(&["usage", "--json"]), serde_json::json!([]));
}

#[test]
fn the_demo_runs_twice_and_counts() {
    let Some(setup) = linux() else { return };
    for run in 1..=2 {
        let output = setup.command(&["run"]).output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        let text = String::from_utf8_lossy(&output.stdout);
        for line in [
            "fence claimed",
            "workspace materialized",
            "sandbox acquired",
            "harness exited",
            "workspace checkpointed",
            "outputs collected",
            "published",
            "sandbox terminated",
            "fence released",
        ] {
            assert!(text.contains(line), "no {line:?} in the timeline:\n{text}");
        }
        assert!(text.contains(&format!("counter is now {run}")), "{text}");
        assert!(
            text.contains(&format!("completed: revision {run} published")),
            "{text}"
        );
    }
    let report = setup
        .command(&[
            "outputs",
            "--session",
            "demo",
            "--get",
            "report.md",
            "--to",
            "-",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&report.stdout).contains("- run: 2"));
    setup.assert_no_sandbox_left();
}

#[test]
fn a_failing_harness_fails_publishes_nothing_and_leaves_no_sandbox() {
    let Some(setup) = linux() else { return };
    let (first, output) = setup.run("s", &["sh", "-c", "echo one > /workspace/a"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(first["result"]["revision"], 1);

    let (failed, output) = setup.run(
        "s",
        &[
            "sh",
            "-c",
            "echo two > /workspace/a; echo partial > /mnt/session/outputs/o.txt; exit 3",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(failed["result"]["type"], "failed", "{failed}");
    let message = failed["result"]["error"]["message"].as_str().unwrap();
    assert!(message.contains("exited with code 3"), "{message}");
    let steps = steps(&failed);
    for step in ["outputs.abort", "sandbox.terminate", "fence.release"] {
        assert!(steps.contains(&step.to_owned()), "no {step} in {steps:?}");
    }
    assert!(!steps.contains(&"fence.publish".to_owned()), "{steps:?}");
    assert_eq!(failed["outputs"], serde_json::json!([]));

    // Still revision 1, with its workspace and no outputs from the failed run.
    let row = session_row(&setup, "s");
    assert_eq!(row["revision"], 1);
    assert_eq!(row["outputs"], 0);
    let (third, output) = setup.run("s", &["cat", "/workspace/a"]);
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "one");
    assert_eq!(third["generation"], 3);
    assert_eq!(third["restoredRevision"], 1);
    setup.assert_no_sandbox_left();
}

/// A harness the sandbox's memory limit killed fails the run saying so, with the limit,
/// after the contract's text.
#[test]
fn a_harness_killed_by_the_memory_limit_is_named() {
    let Some(setup) = linux() else { return };
    let output = setup
        .run_command(
            "oom",
            &[],
            &["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"],
        )
        .env("OMABOX_LINUX_MEMORY", "32M")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "failed", "{report}");
    assert_eq!(
        report["result"]["error"]["message"],
        "AMA worker exited with code null (SIGKILL); killed: out of memory (limit 32 MiB)"
    );
    setup.assert_no_sandbox_left();
}

/// The same on the supervised lane: a supervisor the memory limit killed mid-run fails
/// the run naming the kill and the limit, not only "closed".
#[test]
fn a_supervisor_killed_by_the_memory_limit_is_named() {
    let Some(setup) = linux() else { return };
    let supervisor = r#"read start
printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n'
exec dd if=/dev/zero of=/dev/null bs=256M count=1"#;
    let output = setup
        .run_command("sup-oom", &["--supervised"], &["sh", "-c", supervisor])
        .env("OMABOX_LINUX_MEMORY", "32M")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "failed", "{report}");
    assert_eq!(
        report["result"]["error"]["message"],
        "Supervisor closed before completion; killed: out of memory (limit 32 MiB)"
    );
    setup.assert_no_sandbox_left();
}

#[test]
fn kill_9_mid_harness_then_reap_leaves_no_sandbox_and_the_session_continues() {
    let Some(setup) = linux() else { return };
    let (first, output) = setup.run("k", &["sh", "-c", "echo one > /workspace/a"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(first["generation"], 1);

    let mut killed = setup
        .run_command(
            "k",
            &[],
            &[
                "sh",
                "-c",
                "echo two > /workspace/a; touch /workspace/started; sleep 60",
            ],
        )
        .env("OMABOX_LEASE_TTL_MS", "1500")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    setup.wait_for_workspace_file("started", &mut killed);
    killed.kill().unwrap(); // SIGKILL: no cleanup at all.
    killed.wait().unwrap();
    assert_eq!(
        setup.state_dirs().len(),
        1,
        "the killed run's sandbox is still on record"
    );

    // Before the fence expires the lease is held: reap leaves it alone.
    let early = setup.json(&["reap", "--json"]);
    assert_eq!(
        early["abandoned"]["inspected"], 0,
        "a held lease was listed: {early}"
    );
    assert_eq!(setup.state_dirs().len(), 1);
    // After it expires, reap terminates the sandbox from its journaled lease.
    std::thread::sleep(Duration::from_millis(2_000));
    let reap = setup.json(&["reap", "--json"]);
    assert_eq!(reap["abandoned"]["reaped"], 1, "{reap}");
    let again = setup.json(&["reap", "--json"]);
    assert_eq!(
        again["abandoned"]["inspected"], 0,
        "reap is repeatable: {again}"
    );
    setup.assert_no_sandbox_left();

    let (next, output) = setup.run("k", &["cat", "/workspace/a"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "one");
    assert_eq!(next["generation"], 3, "{next}");
    assert_eq!(next["restoredRevision"], 1);
    assert_eq!(
        next["result"],
        serde_json::json!({"type": "completed", "revision": 2})
    );
    setup.assert_no_sandbox_left();
}

#[test]
fn a_held_work_item_is_a_conflict_with_its_expiry_and_ctrl_c_cleans_up() {
    let Some(setup) = linux() else { return };
    let mut holder = setup
        .run_command(
            "held",
            &[],
            &["sh", "-c", "touch /workspace/holding; sleep 60"],
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    setup.wait_for_workspace_file("holding", &mut holder);

    let (conflict, output) = setup.run("held", &["true"]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(conflict["result"]["type"], "conflict", "{conflict}");
    let expires_at = conflict["result"]["expiresAt"].as_str().unwrap();
    assert!(
        expires_at.ends_with('Z') && expires_at.contains('T'),
        "{expires_at}"
    );

    // Ctrl-C: the holder cancels through the run's signal and cleans up everything.
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    let sent = unsafe { libc::kill(holder.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let output = holder.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "lease_lost", "{report}");
    assert_eq!(report["cancelled"], true);
    let steps = steps(&report);
    for step in ["sandbox.terminate", "outputs.abort", "fence.release"] {
        assert!(steps.contains(&step.to_owned()), "no {step} in {steps:?}");
    }
    setup.assert_no_sandbox_left();

    // The fence was released, so the session is free at once.
    let (after, output) = setup.run("held", &["true"]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(after["generation"], 2);
}

#[test]
fn workspace_seeds_only_a_new_session() {
    let setup = local();
    let seed = tempfile::tempdir().unwrap();
    std::fs::write(seed.path().join("seeded.txt"), "from the seed\n").unwrap();
    let seed_arg = seed.path().to_str().unwrap();
    let output = setup
        .run_command("w", &["--workspace", seed_arg], &["cat", "seeded.txt"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr).trim(),
        "from the seed"
    );

    let output = setup
        .run_command("w", &["--workspace", seed_arg], &["true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("already has a published workspace (revision 1)"),
        "{stderr}"
    );
    setup.assert_no_sandbox_left();
}

#[test]
fn local_is_refused_outside_test_mode_with_a_clear_error() {
    let setup = local();
    let output = setup
        .command(&["run", "--backend", "local", "--", "true"])
        .env_remove("OMABOX_TEST_MODE")
        .env_remove("NODE_ENV")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("OMABOX_TEST_MODE=1"), "{stderr}");
}

#[test]
fn a_supervised_harness_speaks_json_lines_and_publishes() {
    let setup = local();
    let supervisor = r#"read start
echo supervised > s
printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n{"type":"completed","exitCode":0}\n'
read drain
printf '{"type":"drained"}\n'"#;
    let output = setup
        .run_command("sup", &["--supervised"], &["sh", "-c", supervisor])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(
        report["result"],
        serde_json::json!({"type": "completed", "revision": 1})
    );
    let (next, output) = setup.run("sup", &["cat", "s"]);
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "supervised");
    assert_eq!(next["restoredRevision"], 1);
    setup.assert_no_sandbox_left();
}

#[test]
fn a_supervisor_gets_its_claims_session_token() {
    let setup = local();
    let supervisor = r#"read start
case "${HOSTED_INFERENCE_TOKEN-}" in omst_?*) echo yes;; *) echo no;; esac > s
printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n{"type":"completed","exitCode":0}\n'
read drain
printf '{"type":"drained"}\n'"#;
    let output = setup
        .run_command("suptok", &["--supervised"], &["sh", "-c", supervisor])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let (_, output) = setup.run("suptok", &["cat", "s"]);
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "yes");
    setup.assert_no_sandbox_left();
}

/// The harness of the session-token test: records its token, inference URL and
/// `ANTHROPIC_API_KEY` in the workspace, waits for `done`, then removes every trace (so the
/// published workspace holds no token).
const TOKEN_HARNESS: &str = r#"printf %s "$HOSTED_INFERENCE_TOKEN" > tok
printf %s "${HOSTED_INFERENCE_URL-unset}" > url
printf %s "${ANTHROPIC_API_KEY-unset}" > key
touch started
while [ ! -e done ]; do sleep 0.05; done
rm -f tok url key started done"#;

/// Runs [`TOKEN_HARNESS`] in session `tok` with `extra` flags; while it waits, checks the
/// token against the store; returns (token, url, key, output).
fn run_token_harness(
    setup: &Setup,
    extra: &[&str],
    json: bool,
) -> (String, String, String, Output) {
    let mut args = vec!["run", "--backend", setup.backend_flag(), "--session", "tok"];
    if json {
        args.push("--json");
    }
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "sh", "-c", TOKEN_HARNESS]);
    let mut child = setup
        .command(&args)
        .env("ANTHROPIC_API_KEY", "sk-ant-host-secret")
        .env("OMABOX_LOG", "trace")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = setup.wait_for_workspace_file("started", &mut child);
    let dir = started.parent().unwrap();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
    let (token, url, key) = (read("tok"), read("url"), read("key"));
    assert!(token.starts_with("omst_") && token.len() > 40, "{token:?}");
    let claims = verify(setup, &token).expect("the live claim's token verifies");
    assert_eq!(claims.scope.session_id, "tok");
    assert_eq!(claims.scope.work_id, "main");
    std::fs::write(dir.join("done"), "").unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(verify(setup, &token), None, "revoked at cleanup");
    (token, url, key, output)
}

/// The claims of `token` in the test's store.
fn verify(setup: &Setup, token: &str) -> Option<omabox_contract::SessionTokenClaims> {
    use omabox_contract::SessionTokenPort as _;
    let store = omabox_store::SqliteStore::open(setup.dirs.data.path().join("omabox.db")).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(store.verify(token))
        .unwrap()
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path).is_ok_and(|bytes| {
            bytes
                .windows(needle.len())
                .any(|window| window == needle.as_bytes())
        }) {
            found.push(path);
        }
    }
    found
}

fn session_tokens_are_issued_projected_revoked_and_rotated(setup: &Setup) {
    // With a gateway: the URL is projected and the host's model key is not visible.
    let (first, url, key, output) =
        run_token_harness(setup, &["--inference-gateway", "http://127.0.0.1:9/"], true);
    assert_eq!(url, "http://127.0.0.1:9/v1/oma/inference-proxy/tok");
    assert_eq!(
        key, "unset",
        "the host's ANTHROPIC_API_KEY reached the harness"
    );
    let report = json_of(&output);
    assert_eq!(report["generation"], 1);
    assert_eq!(report["result"]["type"], "completed", "{report}");

    // A second run (human mode: the timeline on stdout) rotates the token; no gateway, no URL.
    let (second, url, _, second_output) = run_token_harness(setup, &[], false);
    assert_eq!(url, "unset");
    assert_ne!(first, second, "a reclaim rotates the token");
    assert_eq!(verify(setup, &first), None);

    for token in [&first, &second] {
        for output in [&output, &second_output] {
            for stream in [&output.stdout, &output.stderr] {
                let text = String::from_utf8_lossy(stream);
                assert!(!text.contains(token.as_str()), "token printed: {text}");
            }
        }
        // The store (fences, lease journal, orphans, tokens), the blobs and the runtime dirs.
        let leaked = files_containing(setup.dirs.data.path(), token);
        assert!(leaked.is_empty(), "token stored in {leaked:?}");
        let leaked = files_containing(setup.dirs.runtime_dir.path(), token);
        assert!(leaked.is_empty(), "token stored in {leaked:?}");
    }
    setup.assert_no_sandbox_left();
}

#[test]
fn local_session_tokens_are_issued_projected_revoked_and_rotated() {
    session_tokens_are_issued_projected_revoked_and_rotated(&local());
}

#[test]
fn linux_session_tokens_are_issued_projected_revoked_and_rotated() {
    let Some(setup) = linux() else { return };
    session_tokens_are_issued_projected_revoked_and_rotated(&setup);
}

/// A stand-in for the omabox gateway on the host's loopback: answers every request with
/// `gateway saw <request line>`; returns its port.
fn fake_gateway() -> u16 {
    use std::io::{BufRead as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = std::io::BufReader::new(&stream);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let body = format!("gateway saw {}", line.trim());
            let _ = (&stream).write_all(
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            );
        }
    });
    port
}

/// A linux run reaches the gateway at its `HOSTED_INFERENCE_URL` (the host's loopback) and,
/// by default, nothing else; an environment with networking `none` reaches nothing.
#[test]
fn linux_harness_reaches_the_gateway_and_by_default_nothing_else() {
    let Some(setup) = linux() else { return };
    let port = fake_gateway();
    let gateway = format!("http://127.0.0.1:{port}/");
    let probe = "curl -fsS -m 5 \"$HOSTED_INFERENCE_URL/v1/messages\" > gw.txt 2>&1 || echo unreachable > gw.txt; \
                 curl -fsS -m 5 https://pypi.org/simple/six/ > /dev/null 2>&1 && echo reached > pypi.txt || echo blocked > pypi.txt";
    let read = |session: &str| {
        let (_, output) = setup.run(session, &["cat", "gw.txt", "pypi.txt"]);
        String::from_utf8_lossy(&output.stderr).into_owned()
    };

    let output = setup
        .run_command(
            "gw",
            &["--inference-gateway", &gateway],
            &["sh", "-c", probe],
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let seen = read("gw");
    assert!(
        seen.contains("gateway saw GET /v1/oma/inference-proxy/gw/v1/messages"),
        "{seen}"
    );
    assert!(seen.contains("blocked"), "{seen}");

    let environment = setup.dirs.data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"config":{"type":"cloud","networking":{"type":"none"}}}"#,
    )
    .unwrap();
    let output = setup
        .run_command(
            "gw-none",
            &[
                "--inference-gateway",
                &gateway,
                "--environment",
                environment.to_str().unwrap(),
            ],
            &["sh", "-c", probe],
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let seen = read("gw-none");
    assert!(
        seen.contains("unreachable") && seen.contains("blocked"),
        "{seen}"
    );
    setup.assert_no_sandbox_left();
}

/// The fake internet of the linux backend's egress tests (a namespace on 198.18.0.0/15 with
/// an HTTPS origin that demands a bearer token).
#[path = "../../backends/linux/tests/internet/mod.rs"]
mod internet;

/// `omabox run --credential`: the contract's credential egress (prepare → attach → revoke →
/// release) around a harness that reaches a token-protected HTTPS origin with `curl` and
/// `git clone` holding no token; the token is in no output, log, published workspace or
/// runtime file.
#[test]
fn linux_credential_egress_injects_a_vault_secret_the_harness_never_sees() {
    let Some(setup) = linux() else { return };
    const SECRET: &str = "omabox-cli-secret-8d2e47";
    let inet = internet::Internet::new();
    let origin = internet::https::Origin::start(&inet, SECRET);
    common::run_with_stdin(&mut setup.command(&["vault", "put", "api-token"]), SECRET);
    let environment = setup.dirs.data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"networking":{"type":"limited","allowed_hosts":["api.test"]}}"#,
    )
    .unwrap();
    let harness = "curl -fsS -m 10 https://api.test/hello.txt > got.txt 2>&1; \
                   git clone -q https://api.test/repo.git clone >> got.txt 2>&1; \
                   cat clone/file.txt >> got.txt; rm -rf clone";
    let output = setup
        .run_command(
            "cred",
            &[
                "--environment",
                environment.to_str().unwrap(),
                "--credential",
                "api.test=api-token",
            ],
            &["sh", "-c", harness],
        )
        .env("OMABOX_LINUX_TEST_HOSTS", format!("api.test={}", inet.far))
        .env("SSL_CERT_FILE", origin.ca_path())
        .env("OMABOX_LOG", "trace")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let report = json_of(&output);
    let steps = steps(&report);
    for step in [
        "credential_egress.prepare",
        "credential_egress.attach",
        "credential_egress.revoke",
        "credential_egress.release",
    ] {
        assert!(
            steps.iter().any(|s| s == step),
            "{step} missing from {steps:?}"
        );
    }
    let (_, shown) = setup.run("cred", &["cat", "got.txt"]);
    let shown = String::from_utf8_lossy(&shown.stderr);
    assert!(
        shown.contains("hello from api") && shown.contains("cloned through the relay"),
        "{shown}"
    );
    for stream in [&output.stdout, &output.stderr] {
        assert!(
            !String::from_utf8_lossy(stream).contains(SECRET),
            "the secret was printed"
        );
    }
    // Only the vault (the store) holds it: no blob, no runtime file.
    let leaked: Vec<_> = files_containing(setup.dirs.data.path(), SECRET)
        .into_iter()
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("omabox.db"))
        })
        .collect();
    assert!(leaked.is_empty(), "secret stored in {leaked:?}");
    assert!(files_containing(setup.dirs.runtime_dir.path(), SECRET).is_empty());
    setup.assert_no_sandbox_left();
}

/// `--credential` for a host the session's networking never reaches is refused before
/// anything starts: no store, no fence, no sandbox (before: the run started and the secret
/// was bound to a host the sandbox could not reach).
#[test]
fn a_credential_for_a_host_the_networking_blocks_is_refused_before_anything_starts() {
    let Some(setup) = linux() else { return };
    let environment = setup.dirs.data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"networking":{"type":"limited","allowed_hosts":["other.test","*.api.test"]}}"#,
    )
    .unwrap();
    let environment = environment.to_str().unwrap();
    let listing = || {
        let mut names: Vec<_> = std::fs::read_dir(setup.dirs.data.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        names.sort();
        names
    };
    let before = listing();
    for (extra, network, says) in [
        (
            &[][..],
            None,
            "the default networking is `limited` and does not allow api.test",
        ),
        (&[][..], Some("none"), "OMABOX_LINUX_NETWORK is `none`"),
        (
            &["--environment", environment][..],
            Some("unrestricted"),
            "--environment's networking is `limited` and does not allow api.test",
        ),
    ] {
        let mut args = extra.to_vec();
        args.extend(["--credential", "api.test/org=api-token"]);
        let mut command = setup.run_command("cred-blocked", &args, &["true"]);
        match network {
            Some(network) => command.env("OMABOX_LINUX_NETWORK", network),
            None => command.env_remove("OMABOX_LINUX_NETWORK"),
        };
        let output = command.output().unwrap();
        assert!(!output.status.success(), "{}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("--credential for api.test") && stderr.contains(says),
            "{says}: {stderr}"
        );
        assert_eq!(listing(), before, "the run started: {says}");
    }
    setup.assert_no_sandbox_left();
}

/// Checks one human listing: the hostile name arrives escaped on one line, nothing of it
/// can drive the terminal or pose as a line of omabox's.
fn assert_name_shown_as_text(listing: &str) {
    assert!(
        !listing.contains(['\u{1b}', '\u{7}', '\u{202e}']),
        "raw control characters reached the listing: {listing:?}"
    );
    assert!(
        !listing
            .lines()
            .any(|l| l.starts_with("completed: revision 99")),
        "the name started a line of its own: {listing}"
    );
    assert!(
        listing.contains(r"x\u{1b}]52;c;aGk=\u{7}\ncompleted: revision 99\u{202e}txt"),
        "the name is not shown escaped: {listing}"
    );
}

#[test]
fn output_names_reach_the_terminal_as_one_line_of_text() {
    // An output's name is the sandbox's choice: an OSC 52 (clipboard write), a newline
    // and a bidi override in it must be shown escaped by `omabox run` and `omabox outputs`.
    let setup = local();
    let script = r#"import os
name = "x\x1b]52;c;aGk=\x07\ncompleted: revision 99\u202etxt"
out = os.environ.get("OMA_OUTPUTS_DIR", "/mnt/session/outputs")
open(os.path.join(out, name), "w").write("hi")"#;
    let output = setup
        .command(&[
            "run",
            "--backend",
            "local",
            "--session",
            "hostile",
            "--",
            "python3",
            "-c",
            script,
        ])
        .output()
        .expect("omabox runs");
    assert!(output.status.success(), "{}", describe(&output));
    assert_name_shown_as_text(&String::from_utf8_lossy(&output.stdout));
    let listing = setup
        .command(&["outputs", "--session", "hostile"])
        .output()
        .expect("omabox runs");
    assert!(listing.status.success(), "{}", describe(&listing));
    assert_name_shown_as_text(&String::from_utf8_lossy(&listing.stdout));
    // `--json` keeps the name exactly (JSON escapes it).
    let json = setup.json(&["outputs", "--session", "hostile", "--json"]);
    assert_eq!(
        json[0]["logicalPath"],
        "x\u{1b}]52;c;aGk=\u{7}\ncompleted: revision 99\u{202e}txt"
    );
}
