//! `omabox run --resource`: Session inputs end to end on linux sandboxes — a file from
//! omabox's file store, a git repository cloned through the enforced egress path with a
//! credential injected on the host (the fake internet of the linux backend's tests), memory
//! stores written back (or not, read-only) — and a failing resource that fails the run and
//! publishes nothing.
//!
//! Needs root, cgroups and `omabox-sandbox-init` next to `omabox`; skips with a printed
//! reason elsewhere and fails under `CI=true`.

mod common;

use common::describe;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The fake internet of the linux backend's egress tests (a namespace on 198.18.0.0/15 with
/// an HTTPS origin that demands a bearer token and serves `repo.git`).
#[path = "../../backends/linux/tests/internet/mod.rs"]
mod internet;

struct Setup {
    backend: &'static str,
    dirs: common::TestDirs,
}

fn linux() -> Option<Setup> {
    if !common::linux_available() {
        return None;
    }
    Some(Setup::new("linux"))
}

/// The local backend (test mode, no isolation): runs anywhere.
fn local() -> Setup {
    Setup::new("local")
}

impl Setup {
    fn new(backend: &'static str) -> Self {
        Self {
            backend,
            dirs: common::TestDirs::new("inputs"),
        }
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = self.dirs.command(args);
        command
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_LEASE_TTL_MS");
        command
    }

    /// `omabox run --json --session S <resources…> -- sh -c SCRIPT`.
    fn run(&self, session: &str, extra: &[&str], script: &str) -> Command {
        let mut args = vec![
            "run",
            "--json",
            "--backend",
            self.backend,
            "--session",
            session,
        ];
        args.extend_from_slice(extra);
        args.extend(["--", "sh", "-c", script]);
        self.command(&args)
    }

    fn add_file(&self, path: &Path) -> String {
        let output = self
            .command(&["files", "add", "--json"])
            .arg(path)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        json_of(&output)["id"].as_str().unwrap().to_owned()
    }

    /// The session's published revision, if any.
    fn revision(&self, session: &str) -> Option<u64> {
        let output = self.command(&["sessions", "--json"]).output().unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        json_of(&output)
            .as_array()
            .unwrap()
            .iter()
            .find(|row| row["session"] == session)
            .and_then(|row| row["revision"].as_u64())
    }

    fn export(&self, session: &str) -> tempfile::TempDir {
        self.dirs.export(session)
    }

    fn memory(&self, store: &str) -> PathBuf {
        self.dirs.data.path().join("memory").join(store)
    }

    fn assert_no_sandbox_left(&self) {
        let state: Vec<_> = std::fs::read_dir(self.dirs.runtime_dir.path())
            .map(|entries| entries.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(state.is_empty(), "state dirs left: {state:?}");
    }
}

fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {}", describe(output)))
}

fn steps(report: &Value) -> Vec<String> {
    report["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|event| event["step"].as_str().unwrap().to_owned())
        .collect()
}

fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if entry.file_type().is_ok_and(|kind| kind.is_dir()) {
            found.extend(files_containing(&path, needle));
        } else if std::fs::read(&path)
            .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        {
            found.push(path);
        }
    }
    found
}

/// A file from the store arrives byte for byte at its mount path, before the harness runs.
#[test]
fn a_file_resource_is_written_at_its_mount_path() {
    let Some(setup) = linux() else { return };
    file_resource(
        &setup,
        "/tmp/from-json.bin",
        "cp /workspace/in/input.bin /workspace/copy.bin && cmp /tmp/from-json.bin /workspace/copy.bin",
    );
}

/// The same on the local backend (whose sandbox paths are `/workspace` and the outputs).
#[test]
fn a_file_resource_is_written_on_the_local_backend() {
    // Its commands run on the host in the workspace directory: relative paths.
    file_resource(
        &local(),
        "/workspace/from-json.bin",
        "cp in/input.bin copy.bin && cmp from-json.bin copy.bin",
    );
}

fn file_resource(setup: &Setup, second: &str, script: &str) {
    let source = setup.dirs.data.path().join("input.bin");
    let bytes: Vec<u8> = (0..=255u8).cycle().take(100_000).collect();
    std::fs::write(&source, &bytes).unwrap();
    let id = setup.add_file(&source);
    assert!(id.starts_with("file_"), "{id}");
    let spec = format!("file:{id}:/workspace/in/input.bin");
    // The same file once more through the contract's JSON shape.
    let session_json = setup.dirs.data.path().join("session.json");
    std::fs::write(
        &session_json,
        serde_json::json!({"resources": [
            {"type": "file", "file_id": id, "mount_path": second}
        ]})
        .to_string(),
    )
    .unwrap();
    let output = setup
        .run(
            "file",
            &[
                "--session-json",
                session_json.to_str().unwrap(),
                "--resource",
                &spec,
            ],
            script,
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let report = json_of(&output);
    let steps = steps(&report);
    let staged = steps.iter().position(|s| s == "session_inputs.materialize");
    let harness = steps.iter().position(|s| s == "harness.run");
    assert!(staged.is_some() && staged < harness, "{steps:?}");
    let exported = setup.export("file");
    assert_eq!(
        std::fs::read(exported.path().join("ws/copy.bin")).unwrap(),
        bytes
    );
    setup.assert_no_sandbox_left();
}

/// A missing file id, then an unreachable repository: each run fails naming the resource,
/// the harness never runs, and the session gets no revision.
#[test]
fn a_failing_resource_fails_the_run_and_publishes_nothing() {
    let Some(setup) = linux() else { return };
    // A file id the store does not hold is refused before the run claims anything.
    let missing = "file:file_00000000000000000000000000000000:/workspace/x";
    let output = setup
        .run("bad", &["--resource", missing], "touch /workspace/ran")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(output.stdout.is_empty(), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains(
            "file resource file_00000000000000000000000000000000: no such file in omabox's \
             file store"
        ),
        "{}",
        describe(&output)
    );
    assert_eq!(setup.revision("bad"), None);

    // A host the networking does not admit (none is: `limited` with nothing allowed).
    let output = setup
        .run(
            "bad",
            &[
                "--resource",
                "git:https://git.invalid/r.git@main:/workspace/r",
            ],
            "touch /workspace/ran",
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    let message = report["result"]["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(
            "Session resource github_repository https://git.invalid/r.git: git clone failed"
        ),
        "{message}"
    );
    assert_eq!(setup.revision("bad"), None);
    setup.assert_no_sandbox_left();
}

/// A repository behind a bearer token, cloned at a branch and (in another session) at a
/// commit, through the sandbox's enforced egress with the secret injected on the host: the
/// secret is in no published file, git config included, and in no file of the data dir
/// but the vault.
#[test]
fn git_resources_clone_through_the_enforced_egress_path() {
    let Some(setup) = linux() else { return };
    const SECRET: &str = "omabox-inputs-secret-5b1e93";
    let inet = internet::Internet::new();
    let origin = internet::https::Origin::start(&inet, SECRET);
    common::run_with_stdin(&mut setup.command(&["vault", "put", "git-token"]), SECRET);
    let environment = setup.dirs.data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"networking":{"type":"limited","allowed_hosts":["api.test"]}}"#,
    )
    .unwrap();
    let commit = String::from_utf8(
        Command::new("git")
            .arg("--git-dir")
            .arg(origin.dir.path().join("www/repo.git"))
            .args(["rev-parse", "main"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_owned();
    assert_eq!(commit.len(), 40, "{commit}");
    let run = |session: &str, spec: &str| {
        let output = setup
            .run(
                session,
                &[
                    "--environment",
                    environment.to_str().unwrap(),
                    "--credential",
                    "api.test=git-token",
                    "--resource",
                    spec,
                ],
                "git -C /workspace/repo rev-parse HEAD > /workspace/head.txt; \
                 (git -C /workspace/repo symbolic-ref -q HEAD || echo detached) > /workspace/ref.txt",
            )
            .env("OMABOX_LINUX_TEST_HOSTS", format!("api.test={}", inet.far))
            .env("SSL_CERT_FILE", origin.ca_path())
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        for stream in [&output.stdout, &output.stderr] {
            assert!(!String::from_utf8_lossy(stream).contains(SECRET));
        }
        let exported = setup.export(session);
        let ws = exported.path().join("ws");
        assert_eq!(
            std::fs::read_to_string(ws.join("repo/file.txt")).unwrap(),
            "cloned through the relay\n"
        );
        assert_eq!(
            std::fs::read_to_string(ws.join("head.txt")).unwrap().trim(),
            commit
        );
        // The published workspace (the clone's .git/config included) never holds it.
        assert!(ws.join("repo/.git/config").is_file());
        assert!(files_containing(&ws, SECRET).is_empty());
        std::fs::read_to_string(ws.join("ref.txt")).unwrap()
    };
    let branch = run(
        "git-branch",
        "git:https://api.test/repo.git@main:/workspace/repo",
    );
    assert_eq!(branch.trim(), "refs/heads/main");
    let spec = format!("git:https://api.test/repo.git@{commit}:/workspace/repo");
    let detached = run("git-commit", &spec);
    assert_eq!(detached.trim(), "detached");
    let leaked: Vec<_> = files_containing(setup.dirs.data.path(), SECRET)
        .into_iter()
        .filter(|p| {
            !p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("omabox.db"))
        })
        .collect();
    assert!(leaked.is_empty(), "secret stored in {leaked:?}");
    setup.assert_no_sandbox_left();
}

/// A store written in one run is there in the next (another session); a read-only store's
/// changes never reach the host store.
#[test]
fn memory_stores_round_trip_and_read_only_ones_are_not_written_back() {
    let Some(setup) = linux() else { return };
    let output = setup
        .run(
            "mem-1",
            &["--resource", "memory:notes"],
            "mkdir -p /mnt/memory/notes/d && echo first > /mnt/memory/notes/d/a.md && \
             ln -s /etc/passwd /mnt/memory/notes/link && mkfifo /mnt/memory/notes/fifo",
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let store = setup.memory("notes");
    assert_eq!(
        std::fs::read_to_string(store.join("d/a.md")).unwrap(),
        "first\n"
    );
    // Neither the symlink nor the FIFO was carried.
    assert!(std::fs::symlink_metadata(store.join("link")).is_err());
    assert!(std::fs::symlink_metadata(store.join("fifo")).is_err());

    // Read-only: visible, not writable in place, and whatever happens is not written back.
    let output = setup
        .run(
            "mem-2",
            &["--resource", "memory:notes:ro"],
            "cat /mnt/memory/notes/d/a.md > /workspace/seen.txt; \
             (echo changed > /mnt/memory/notes/d/a.md) 2>/dev/null && echo wrote > /workspace/wrote.txt; \
             chmod -R u+w /mnt/memory/notes; echo changed > /mnt/memory/notes/d/a.md; \
             echo new > /mnt/memory/notes/b.md",
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let exported = setup.export("mem-2");
    assert_eq!(
        std::fs::read_to_string(exported.path().join("ws/seen.txt")).unwrap(),
        "first\n"
    );
    assert!(!exported.path().join("ws/wrote.txt").exists());
    assert_eq!(
        std::fs::read_to_string(store.join("d/a.md")).unwrap(),
        "first\n"
    );
    assert!(!store.join("b.md").exists());

    // Read-write again: a deletion is carried back too.
    let output = setup
        .run(
            "mem-3",
            &["--resource", "memory:notes"],
            "test \"$(cat /mnt/memory/notes/d/a.md)\" = first && rm /mnt/memory/notes/d/a.md && \
             echo second > /mnt/memory/notes/c.md",
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert!(!store.join("d/a.md").exists());
    assert_eq!(
        std::fs::read_to_string(store.join("c.md")).unwrap(),
        "second\n"
    );

    // Over the entry cap: the write-back fails the run, the store and the session are
    // untouched.
    let output = setup
        .run(
            "mem-4",
            &["--resource", "memory:notes"],
            "cd /mnt/memory/notes && seq 1 10001 | xargs touch",
        )
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let report = json_of(&output);
    let message = report["result"]["error"]["message"].as_str().unwrap();
    assert_eq!(
        message,
        "Session resource memory_store notes: Session Memory has more than 10000 entries"
    );
    assert_eq!(setup.revision("mem-4"), None);
    let names: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["c.md"]);
    setup.assert_no_sandbox_left();
}

/// Memory stores and the workspace move together when `omabox run` is killed (SIGKILL at a
/// fault point) between the memory write-back and the publication, or between the
/// publication and the write-back's commit: after `omabox reap` both are the old ones, or
/// both the new ones — never a new memory store beside an old workspace.
#[test]
fn a_killed_run_moves_memory_stores_and_workspace_together() {
    use std::os::unix::process::ExitStatusExt as _;
    let Some(setup) = linux() else { return };
    let resources = ["--resource", "memory:notes", "--resource", "memory:more"];
    let write = |round: &str| {
        format!(
            "echo {round} > /mnt/memory/notes/v.md; echo {round} > /mnt/memory/more/v.md; \
             echo {round} > /workspace/v.txt; head -c 4096 /dev/urandom > /workspace/r{round}"
        )
    };
    let killed_at = |point: &str, round: &str| {
        let status = setup
            .run("mem", &resources, &write(round))
            .env("OMABOX_FAULT_POINT", point)
            .env("OMABOX_LEASE_TTL_MS", "1000")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "omabox run never reached {point}: {status}"
        );
    };
    // Reaps until the killed run's sandbox, lease and memory stage are gone.
    let reap = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let output = setup.command(&["reap", "--json"]).output().unwrap();
            assert!(output.status.success(), "{}", describe(&output));
            let report = json_of(&output);
            let stages = setup.dirs.data.path().join("memory/.pending");
            let pending = std::fs::read_dir(&stages).map_or(0, |dir| dir.count());
            if report["abandoned"]["inspected"] == 0 && pending == 0 {
                let left: Vec<_> = std::fs::read_dir(setup.dirs.runtime_dir.path())
                    .map(|entries| entries.flatten().map(|e| e.path()).collect())
                    .unwrap_or_default();
                if left.is_empty() {
                    return report;
                }
            }
            assert!(std::time::Instant::now() < deadline, "not reaped: {report}");
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    };
    let state = || {
        let exported = setup.export("mem");
        (
            std::fs::read_to_string(setup.memory("notes").join("v.md")).unwrap(),
            std::fs::read_to_string(setup.memory("more").join("v.md")).unwrap(),
            std::fs::read_to_string(exported.path().join("ws/v.txt")).unwrap(),
        )
    };
    let output = setup.run("mem", &resources, &write("1")).output().unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let one = ("1\n".to_owned(), "1\n".to_owned(), "1\n".to_owned());
    assert_eq!(state(), one);

    // Killed after the final write-back, during the checkpoint (before the publication):
    // both stay old.
    killed_at("blob-temp-created", "2");
    assert_eq!(state(), one, "the memory store moved without the workspace");
    reap();
    assert_eq!(state(), one, "after reap");
    assert_eq!(setup.revision("mem"), Some(1));

    // Killed after the publication, before the write-back's commit: reap rolls it forward.
    killed_at("run-published", "3");
    assert_eq!(setup.revision("mem"), Some(2));
    let report = reap();
    let three = ("3\n".to_owned(), "3\n".to_owned(), "3\n".to_owned());
    assert_eq!(state(), three, "after reap: {report}");

    // Killed half-way through the commit (one store swapped): reap finishes it.
    killed_at("memory-store-committing", "4");
    let report = reap();
    let four = ("4\n".to_owned(), "4\n".to_owned(), "4\n".to_owned());
    assert_eq!(state(), four, "after reap: {report}");

    // Killed while a write-back's temp copy is written: reap removes it with the stage, and
    // both stay as they were.
    killed_at("memory-store-temp-written", "5");
    reap();
    assert_eq!(state(), four);
    let mut temps = Vec::new();
    let mut dirs = vec![setup.dirs.data.path().join("memory")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            if entry.file_name().to_string_lossy().starts_with(".tmp-") {
                temps.push(entry.path());
            }
            if entry.file_type().unwrap().is_dir() {
                dirs.push(entry.path());
            }
        }
    }
    assert!(temps.is_empty(), "temp copies left: {temps:?}");

    // And the session goes on, seeing both.
    let output = setup
        .run(
            "mem",
            &resources,
            "test \"$(cat /mnt/memory/notes/v.md /mnt/memory/more/v.md /workspace/v.txt)\" = \"4\n4\n4\"",
        )
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    setup.assert_no_sandbox_left();
}
