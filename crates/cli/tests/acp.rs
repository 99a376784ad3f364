//! `omabox run --acp-command` end to end: the real binary driving the scripted ACP agent
//! (`omabox-fake-acp-agent`, built from `omabox-acp`, which speaks real ACP through the same
//! crate) in a real sandbox, on `local` (test mode) and `linux`.
//!
//! The agent binary must be visible inside the sandbox: on linux the test seeds a new
//! session's `/workspace` with a copy (`--workspace DIR`) and runs `/workspace/<agent>`; on
//! local (no isolation) it runs the host path. The linux tests need root, cgroups and
//! `omabox-sandbox-init`; they skip with a printed reason where those are missing, and fail
//! under `CI=true`. The agent binary itself must sit next to `omabox` (`cargo build --bins`,
//! which `cargo nextest run --workspace` does); a missing one skips the same way.

mod common;

use common::{describe, omabox_bin};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = "omabox-fake-acp-agent";

fn agent_bin() -> PathBuf {
    omabox_bin().with_file_name(AGENT)
}

/// `true` when the fake agent is built; otherwise skips (fails under `CI=true`).
fn agent_available() -> bool {
    omabox_test_support::require_capability((!agent_bin().is_file()).then(|| {
        format!(
            "{} is missing (build it: cargo build --bins)",
            agent_bin().display()
        )
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Linux,
    Local,
}

/// One test's data dir, runtime dir, cgroup parent and seed workspace (with the agent).
struct Setup {
    backend: Backend,
    dirs: common::TestDirs,
    seed: tempfile::TempDir,
}

impl Setup {
    fn new(backend: Backend) -> Option<Self> {
        if !agent_available() || (backend == Backend::Linux && !common::linux_available()) {
            return None;
        }
        let seed = tempfile::tempdir().unwrap();
        if backend == Backend::Linux {
            std::fs::copy(agent_bin(), seed.path().join(AGENT)).unwrap();
        }
        std::fs::write(seed.path().join("README"), "seeded\n").unwrap();
        Some(Self {
            backend,
            dirs: common::TestDirs::new("acp"),
            seed,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.dirs.command(args);
        command
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_LEASE_TTL_MS")
            .env_remove("OMABOX_ACP_INITIALIZE_TIMEOUT_MS")
            .env_remove("OMABOX_ACP_TURN_TIMEOUT_MS");
        command
    }

    /// The agent command as the sandbox sees it.
    fn agent(&self) -> String {
        match self.backend {
            Backend::Linux => format!("/workspace/{AGENT}"),
            Backend::Local => agent_bin().display().to_string(),
        }
    }

    /// `omabox run --json` of one ACP turn in `session` (seeded on its first run).
    fn acp_command(&self, session: &str, mode: &str, extra: &[&str]) -> Command {
        self.run_command(session, mode, extra, true)
    }

    fn run_command(&self, session: &str, mode: &str, extra: &[&str], json: bool) -> Command {
        let backend = match self.backend {
            Backend::Linux => "linux",
            Backend::Local => "local",
        };
        let agent = self.agent();
        let seed = self.seed.path().to_str().unwrap().to_owned();
        let mut args = vec!["run"];
        if json {
            args.push("--json");
        }
        args.extend([
            "--backend",
            backend,
            "--session",
            session,
            "--acp-command",
            &agent,
            "--prompt",
            "write the file",
        ]);
        if !self.session_exists(session) {
            args.extend(["--workspace", &seed]);
        }
        args.extend_from_slice(extra);
        args.extend(["--", mode]);
        self.command(&args)
    }

    fn acp(&self, session: &str, mode: &str, extra: &[&str]) -> (Value, Output) {
        let output = self
            .acp_command(session, mode, extra)
            .output()
            .expect("omabox runs");
        (json_of(&output), output)
    }

    fn session_exists(&self, session: &str) -> bool {
        let output = self.command(&["sessions", "--json"]).output().unwrap();
        serde_json::from_slice::<Value>(&output.stdout)
            .ok()
            .and_then(|rows| rows.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .any(|row| row["session"] == session)
    }

    /// The session's published workspace, exported.
    fn export(&self, session: &str) -> tempfile::TempDir {
        self.dirs.export(session)
    }

    fn wait_for_workspace_file(&self, name: &str, child: &mut Child) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if find_file(&self.dirs.data.path().join("runtime"), name)
                || find_file(self.dirs.runtime_dir.path(), name)
            {
                return;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("omabox run ended ({status}) before the agent wrote {name}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the agent never wrote {name}");
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn assert_no_lease_left(&self) {
        let output = self.command(&["reap", "--json"]).output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        let reap = json_of(&output);
        assert_eq!(reap["abandoned"]["inspected"], 0, "leases left: {reap}");
        if self.backend == Backend::Linux {
            let left: Vec<_> = std::fs::read_dir(self.dirs.runtime_dir.path())
                .map(|entries| entries.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "sandbox state dirs left: {left:?}");
        }
    }
}

fn find_file(dir: &Path, name: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|entry| {
        let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
        (is_dir && find_file(&entry.path(), name)) || (!is_dir && entry.file_name() == name)
    })
}

/// One JSON document (e.g. `reap --json`), or the report of a run: the last line of the
/// `--json` JSON Lines stream, whose earlier lines are the events as they arrived (checked
/// to be the report's `acpEvents`).
fn json_of(output: &Output) -> Value {
    if let Ok(document) = serde_json::from_slice::<Value>(&output.stdout) {
        return document;
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<Value> = text
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|error| {
                panic!(
                    "stdout line is not JSON ({error}): {line}\n{}",
                    describe(output)
                )
            })
        })
        .collect();
    let (report, streamed) = lines
        .split_last()
        .unwrap_or_else(|| panic!("no JSON on stdout: {}", describe(output)));
    assert!(
        report.get("result").is_some(),
        "the last line is the report"
    );
    if let Some(events) = report["acpEvents"].as_array() {
        assert_eq!(streamed, events.as_slice(), "streamed events = acpEvents");
    }
    report.clone()
}

/// The error message of a `failed` run result.
fn failure(report: &Value) -> &str {
    assert_eq!(report["result"]["type"], "failed", "{report}");
    report["result"]["error"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("no error message in {report}"))
}

fn acp_events(report: &Value) -> Vec<Value> {
    report["acpEvents"]
        .as_array()
        .unwrap_or_else(|| panic!("no acpEvents in {report}"))
        .clone()
}

fn event<'a>(events: &'a [Value], kind: &str) -> &'a Value {
    events
        .iter()
        .find(|event| event["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {events:?}"))
}

/// One turn writes the file (published), logs message, tool call and stop; the second run
/// of the session loads the same ACP session; the saved state holds no token.
fn a_turn_publishes_and_the_next_run_resumes(setup: &Setup) {
    let (first, output) = setup.acp("s1", "normal", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(first["result"]["type"], "completed", "{first}");
    let events = acp_events(&first);
    let session = event(&events, "session");
    assert_eq!(session["resumed"], false);
    let id = session["acpSessionId"].as_str().unwrap().to_owned();
    let message = event(&events, "agent_message")["text"].as_str().unwrap();
    assert_eq!(
        message,
        format!("hello from the fake agent, new session {id}")
    );
    let call = event(&events, "tool_call");
    assert_eq!(call["toolCallId"], "write-1");
    assert_eq!(call["kind"], "edit");
    assert_eq!(event(&events, "permission")["decision"], "allowed");
    assert_eq!(event(&events, "tool_call_update")["status"], "completed");
    assert_eq!(event(&events, "plan")["entries"][0]["priority"], "high");
    assert_eq!(event(&events, "stop")["reason"], "end_turn");

    let exported = setup.export("s1");
    let ws = exported.path().join("ws");
    assert_eq!(
        std::fs::read_to_string(ws.join("agent-was-here.txt")).unwrap(),
        format!("new session {id}\ntoken in env: true\n")
    );
    let state = std::fs::read_to_string(ws.join(".openma/harness-state/acp.json")).unwrap();
    let state: Value = serde_json::from_str(&state).unwrap();
    assert_eq!(state["version"], 1);
    assert_eq!(state["acpSessionId"], id.as_str());
    assert_eq!(state.as_object().unwrap().len(), 3, "{state}");
    let text = state.to_string();
    assert!(
        !text.contains("omst_") && !text.contains("HOSTED_INFERENCE"),
        "{text}"
    );

    let (second, output) = setup.acp("s1", "normal", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let events = acp_events(&second);
    let session = event(&events, "session");
    assert_eq!(session["resumed"], true, "{events:?}");
    assert_eq!(session["acpSessionId"], id.as_str());
    assert_eq!(
        event(&events, "agent_message")["text"],
        format!("hello from the fake agent, loaded session {id}")
    );
    setup.assert_no_lease_left();
}

#[test]
fn local_a_turn_publishes_and_the_next_run_resumes() {
    if let Some(setup) = Setup::new(Backend::Local) {
        a_turn_publishes_and_the_next_run_resumes(&setup);
    }
}

#[test]
fn linux_a_turn_publishes_and_the_next_run_resumes() {
    if let Some(setup) = Setup::new(Backend::Linux) {
        a_turn_publishes_and_the_next_run_resumes(&setup);
    }
}

/// An OpenMA agent definition: `_oma.acp.agent` is the process, `system` the AGENTS.md.
fn an_agent_definition_runs_its_acp_agent_with_its_system_prompt(setup: &Setup) {
    let definition = setup.seed.path().join("agent.json");
    let agent = serde_json::json!({
        "name": "coder",
        "system": "You write tests first.",
        "_oma": {"harness": "acp-sandbox", "acp": {"agent": {
            "command": setup.agent(), "args": ["normal"], "env": {"FROM_DEFINITION": "1"}}}},
    });
    std::fs::write(&definition, agent.to_string()).unwrap();
    let backend = match setup.backend {
        Backend::Linux => "linux",
        Backend::Local => "local",
    };
    let seed = setup.seed.path().to_str().unwrap().to_owned();
    let output = setup
        .command(&[
            "run",
            "--json",
            "--backend",
            backend,
            "--session",
            "def",
            "--workspace",
            &seed,
            "--prompt",
            "write the file",
            "--agent-json",
        ])
        .arg(&definition)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "completed", "{report}");
    assert_eq!(event(&acp_events(&report), "stop")["reason"], "end_turn");
    let ws = setup.export("def");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("ws/AGENTS.md")).unwrap(),
        "You write tests first."
    );

    // The public shape with its optional ACP registry id: carried into the report, and an id
    // omabox knows (Claude Code's) gives the agent Claude Code's state dir and sends its
    // model calls to the run's hosted inference proxy.
    let agent = serde_json::json!({
        "name": "coder",
        "_oma": {"harness": "acp-sandbox", "acp": {"agent": {
            "id": "claude-acp", "command": setup.agent(), "args": ["normal"], "env": {},
            "cwd": "/workspace"}}},
    });
    std::fs::write(&definition, agent.to_string()).unwrap();
    let output = setup
        .command(&[
            "run",
            "--json",
            "--backend",
            backend,
            "--session",
            "def-id",
            "--workspace",
            &seed,
            "--prompt",
            "write the file",
            "--agent-json",
        ])
        .arg(&definition)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "completed", "{report}");
    assert_eq!(report["agentRegistryId"], "claude-acp", "{report}");
    let ws = setup.export("def-id");
    let written = std::fs::read_to_string(ws.path().join("ws/agent-was-here.txt")).unwrap();
    // (The local backend shows /workspace as its host directory.)
    assert!(
        written.contains("/workspace/.openma/harness-state/claude\n"),
        "{written}"
    );
    assert!(
        written.contains("/anthropic\nanthropic auth token: true\n"),
        "{written}"
    );
    // Without --json the run says what the id does.
    let output = setup
        .command(&[
            "run",
            "--backend",
            backend,
            "--session",
            "def-id",
            "--prompt",
            "again",
            "--agent-json",
        ])
        .arg(&definition)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(
            "ACP registry id \"claude-acp\" is claude (`--agent claude`): the definition's \
             command runs as given"
        ),
        "{}",
        describe(&output)
    );

    // A definition without a command is refused before anything runs.
    std::fs::write(&definition, r#"{"_oma":{"acp":{"agent":{}}}}"#).unwrap();
    let output = setup
        .command(&["run", "--backend", backend, "--prompt", "x", "--agent-json"])
        .arg(&definition)
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("acp-sandbox requires _oma.acp.agent.command"),
        "{}",
        describe(&output)
    );
}

#[test]
fn local_an_agent_definition_runs_its_acp_agent_with_its_system_prompt() {
    if let Some(setup) = Setup::new(Backend::Local) {
        an_agent_definition_runs_its_acp_agent_with_its_system_prompt(&setup);
    }
}

#[test]
fn linux_an_agent_definition_runs_its_acp_agent_with_its_system_prompt() {
    if let Some(setup) = Setup::new(Backend::Linux) {
        an_agent_definition_runs_its_acp_agent_with_its_system_prompt(&setup);
    }
}

#[test]
fn local_a_failed_load_falls_back_to_a_new_session_with_a_warning() {
    let Some(setup) = Setup::new(Backend::Local) else {
        return;
    };
    std::fs::write(setup.seed.path().join("fail-load"), "").unwrap();
    let (first, output) = setup.acp("f", "normal", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let first_id = event(&acp_events(&first), "session")["acpSessionId"].clone();
    let (second, output) = setup.acp("f", "normal", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    let events = acp_events(&second);
    let warning = event(&events, "warning")["message"].as_str().unwrap();
    assert!(
        warning.starts_with("session/load of the saved ACP session failed")
            && warning.ends_with("starting a new session"),
        "{warning}"
    );
    let session = event(&events, "session");
    assert_eq!(session["resumed"], false);
    assert_ne!(session["acpSessionId"], first_id);
    assert_eq!(event(&events, "stop")["reason"], "end_turn");
}

#[test]
fn local_deny_policy_rejects_the_permission_request() {
    let Some(setup) = Setup::new(Backend::Local) else {
        return;
    };
    let (report, output) = setup.acp("d", "normal", &["--acp-permission", "deny"]);
    assert!(output.status.success(), "{}", describe(&output));
    let events = acp_events(&report);
    assert_eq!(event(&events, "permission")["decision"], "denied");
    assert_eq!(event(&events, "tool_call_update")["status"], "failed");
    let exported = setup.export("d");
    assert!(!exported.path().join("ws/agent-was-here.txt").exists());
}

/// The agent exits mid-prompt: the run fails with a message naming the exit, and nothing of
/// it is published (a later run's workspace has no trace of it).
fn a_crashed_agent_fails_the_run_and_publishes_nothing(setup: &Setup) {
    let (first, output) = setup.acp("c", "normal", &[]);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(first["result"]["revision"], 1);
    let (crashed, output) = setup.acp("c", "exit-mid-prompt", &[]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(crashed["result"]["type"], "failed", "{crashed}");
    let message = failure(&crashed);
    assert!(
        message.starts_with("the ACP agent exited (code 3) before its turn ended"),
        "{message}"
    );
    let exported = setup.export("c");
    let ws = exported.path().join("ws");
    assert!(ws.join("agent-was-here.txt").exists());
    assert!(
        !ws.join("crashed-agent-was-here.txt").exists(),
        "the failed run published its workspace"
    );
    setup.assert_no_lease_left();
}

#[test]
fn local_a_crashed_agent_fails_the_run_and_publishes_nothing() {
    if let Some(setup) = Setup::new(Backend::Local) {
        a_crashed_agent_fails_the_run_and_publishes_nothing(&setup);
    }
}

#[test]
fn linux_a_crashed_agent_fails_the_run_and_publishes_nothing() {
    if let Some(setup) = Setup::new(Backend::Linux) {
        a_crashed_agent_fails_the_run_and_publishes_nothing(&setup);
    }
}

#[test]
fn local_an_agent_that_never_initializes_times_out() {
    if let Some(setup) = Setup::new(Backend::Local) {
        an_agent_that_never_initializes_times_out(&setup);
    }
}

#[test]
fn linux_an_agent_that_never_initializes_times_out() {
    if let Some(setup) = Setup::new(Backend::Linux) {
        an_agent_that_never_initializes_times_out(&setup);
    }
}

fn an_agent_that_never_initializes_times_out(setup: &Setup) {
    let output = setup
        .acp_command("t", "no-initialize", &[])
        .env("OMABOX_ACP_INITIALIZE_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "failed", "{report}");
    assert_eq!(
        failure(&report),
        "the ACP agent did not answer initialize within 500ms"
    );
    setup.assert_no_lease_left();
}

/// Ctrl-C while the agent is mid-prompt: `session/cancel`, the turn ends `cancelled`, the run
/// is cancelled (exit 130) and cleaned up.
fn cancel_mid_prompt_ends_the_turn(setup: &Setup) {
    let mut child = setup
        .acp_command("x", "hang", &[])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    setup.wait_for_workspace_file("agent-waiting-for-cancel", &mut child);
    // SAFETY: kill has no memory-safety preconditions; the pid is our child's.
    let sent = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(sent, 0);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["cancelled"], true, "{report}");
    let events = acp_events(&report);
    assert_eq!(event(&events, "stop")["reason"], "cancelled", "{events:?}");
    setup.assert_no_lease_left();
}

#[test]
fn local_cancel_mid_prompt_ends_the_turn() {
    if let Some(setup) = Setup::new(Backend::Local) {
        cancel_mid_prompt_ends_the_turn(&setup);
    }
}

#[test]
fn linux_cancel_mid_prompt_ends_the_turn() {
    if let Some(setup) = Setup::new(Backend::Linux) {
        cancel_mid_prompt_ends_the_turn(&setup);
    }
}

#[test]
fn local_a_turn_over_its_timeout_is_cancelled_and_fails() {
    let Some(setup) = Setup::new(Backend::Local) else {
        return;
    };
    let output = setup
        .acp_command("slow", "hang", &[])
        .env("OMABOX_ACP_TURN_TIMEOUT_MS", "500")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    assert_eq!(report["result"]["type"], "failed", "{report}");
    assert_eq!(
        failure(&report),
        "the ACP agent's turn did not end within 500ms"
    );
    setup.assert_no_lease_left();
}

#[test]
fn human_mode_streams_messages_and_tool_calls() {
    let Some(setup) = Setup::new(Backend::Local) else {
        return;
    };
    let output = setup
        .run_command("h", "normal", &[], false)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    for expected in [
        "[session] new ACP session fake-",
        "\nhello from the fake agent, new session fake-",
        "\n[tool] write agent-was-here.txt (edit, pending) #write-1\n",
        "\n[permission] #write-1 allowed\n",
        "\n[tool] #write-1 completed\n",
        "\n[stop] end_turn\n",
        "completed: revision 1 published",
    ] {
        assert!(stdout.contains(expected), "no {expected:?} in:\n{stdout}");
    }
}

#[test]
fn usage_errors_are_clear() {
    let setup = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(omabox_bin())
            .arg("--data-dir")
            .arg(setup.path())
            .args(args)
            .env("OMABOX_TEST_MODE", "1")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let output = run(&["run", "--backend", "local", "--prompt", "hi", "--", "true"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--prompt is for an ACP agent"),
        "{}",
        describe(&output)
    );
    let output = run(&["run", "--backend", "local", "--acp-command", "agent"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("--acp-command needs --prompt"),
        "{}",
        describe(&output)
    );
    for (args, expected) in [
        (
            &["run", "--backend", "local", "--agent", "claude"][..],
            "--agent needs --prompt",
        ),
        (
            &[
                "run",
                "--backend",
                "local",
                "--agent",
                "claude",
                "--prompt",
                "x",
            ][..],
            "--agent needs the linux backend",
        ),
        (
            &[
                "run",
                "--backend",
                "local",
                "--agent",
                "gemini",
                "--prompt",
                "x",
            ][..],
            "invalid value 'gemini'",
        ),
        (
            &[
                "run",
                "--backend",
                "local",
                "--system-prompt",
                "x",
                "--",
                "true",
            ][..],
            "--system-prompt is for an ACP agent",
        ),
    ] {
        let output = run(args);
        assert!(!output.status.success(), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains(expected),
            "{args:?}: {}",
            describe(&output)
        );
    }
}
