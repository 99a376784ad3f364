//! Storage integrity through the `omabox` binary on the `local` backend (test mode): a
//! missing blob is named with its session, revision and object; `omabox fsck` says which
//! revisions are damaged; `omabox run --from-revision N` continues from an intact one;
//! checkpoint limits fail the run and keep the last publication; `omabox gc --keep N` keeps
//! exactly what the last N revisions need.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

struct Data {
    dir: tempfile::TempDir,
}

impl Data {
    fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
        command
            .arg("--data-dir")
            .arg(self.path())
            .args(args)
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_DATA_DIR")
            .env_remove("OMABOX_CHECKPOINT_MAX_ENTRIES")
            .env_remove("OMABOX_CHECKPOINT_MAX_BYTES")
            .env_remove("OMABOX_GC_KEEP");
        command
    }

    fn output(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("omabox runs")
    }

    /// `omabox run --backend local --session S [extra] --json -- sh -c SCRIPT` (cwd: the workspace).
    fn run(&self, session: &str, extra: &[&str], script: &str) -> (Value, Output) {
        let mut args = vec!["run", "--backend", "local", "--session", session, "--json"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["--", "sh", "-c", script]);
        let output = self.output(&args);
        let json = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (json, output)
    }

    fn json(&self, args: &[&str]) -> (Value, Output) {
        let output = self.output(args);
        let json = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("{args:?}: {error}: {}", text(&output)));
        (json, output)
    }

    /// Bytes of all blobs in the store.
    fn blob_bytes(&self) -> u64 {
        let mut total = 0;
        for shard in std::fs::read_dir(self.path().join("blobs/sha256")).unwrap() {
            for blob in std::fs::read_dir(shard.unwrap().path()).unwrap() {
                total += blob.unwrap().metadata().unwrap().len();
            }
        }
        total
    }

    fn blob_path(&self, content: &[u8]) -> PathBuf {
        let hex = omabox_persistence::BlobHash::of(content).to_hex();
        self.path().join("blobs/sha256").join(&hex[..2]).join(hex)
    }
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

fn completed(json: &Value, output: &Output) -> u64 {
    assert!(output.status.success(), "{}", text(output));
    assert_eq!(json["result"]["type"], "completed", "{}", text(output));
    json["result"]["revision"].as_u64().unwrap()
}

#[test]
fn a_missing_blob_is_named_fsck_finds_it_and_the_session_goes_on_or_continues_from_an_earlier_revision()
 {
    let data = Data::new();
    for round in 1..=3 {
        let (json, output) = data.run(
            "s",
            &[],
            &format!("echo v{round} > f{round}; echo keep > k"),
        );
        assert_eq!(completed(&json, &output), round);
    }
    let (fsck, output) = data.json(&["fsck", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(fsck["damagedRevisions"], 0);
    assert_eq!(fsck["revisions"].as_array().unwrap().len(), 3);

    // Revision 3 alone needs the blob of f3.
    std::fs::remove_file(data.blob_path(b"v3\n")).unwrap();
    let (fsck, output) = data.json(&["fsck", "--json"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_eq!(fsck["damagedRevisions"], 1);
    let damaged = &fsck["revisions"][0];
    assert_eq!(
        (damaged["revision"].as_u64(), damaged["intact"].as_bool()),
        (Some(3), Some(false))
    );
    assert_eq!(damaged["damages"][0]["path"], "f3");
    assert!(
        damaged["damages"][0]["problem"]
            .as_str()
            .unwrap()
            .contains("not in the blob store")
    );
    assert_eq!(fsck["revisions"][1]["intact"], true);
    let human = data.output(&["fsck"]);
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        human.contains("session s revision 3 (last): DAMAGED"),
        "{human}"
    );
    assert!(human.contains("--from-revision"), "{human}");

    // The next run goes on without f3 and says so: which path, which revision, why.
    let (json, output) = data.run("s", &[], "ls; test ! -e f3 && cat f1 f2");
    assert_eq!(completed(&json, &output), 4);
    assert_eq!(json["workspaceLost"][0]["path"], "f3", "{json}");
    assert_eq!(json["workspaceLostCount"], 1, "{json}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "1 workspace entry of revision 3 could not be restored",
        "f3: the blob is not in the blob store",
        "--from-revision",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }

    // A damaged or unknown revision is refused before anything runs.
    let (_, output) = data.run("s", &["--from-revision", "3"], "true");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("is damaged"),
        "{}",
        text(&output)
    );
    let (_, output) = data.run("s", &["--from-revision", "7"], "true");
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("has no revision 7 (its revisions: 1, 2, 3"),
        "{}",
        text(&output)
    );

    // Continuing from revision 2 restores its workspace and publishes revision 5 on top.
    let (json, output) = data.run(
        "s",
        &["--from-revision", "2"],
        "cat f1 f2; test ! -e f3; echo v4 > f4",
    );
    assert_eq!(completed(&json, &output), 5);
    assert_eq!(json["restoredRevision"], 2, "{json}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("v1\nv2"),
        "{}",
        text(&output)
    );
    let (json, output) = data.run("s", &[], "cat f4");
    assert_eq!(completed(&json, &output), 6);
    assert!(String::from_utf8_lossy(&output.stderr).contains("v4"));

    // `workspace export` of the damaged revision is not reachable any more; of the last it works.
    let out = data.path().join("export");
    let export = data.output(&[
        "workspace",
        "export",
        "--session",
        "s",
        out.to_str().unwrap(),
    ]);
    assert!(export.status.success(), "{}", text(&export));
}

#[test]
fn a_checkpoint_over_its_limit_fails_the_run_and_the_last_publication_stays() {
    let data = Data::new();
    let (json, output) = data.run("s", &[], "echo one > a");
    assert_eq!(completed(&json, &output), 1);
    let output = data
        .command(&[
            "run",
            "--backend",
            "local",
            "--session",
            "s",
            "--json",
            "--",
            "sh",
            "-c",
        ])
        .arg("for i in 1 2 3 4 5 6 7 8; do echo $i > f$i; done")
        .env("OMABOX_CHECKPOINT_MAX_ENTRIES", "5")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let json: Value = serde_json::from_slice(&output.stdout).unwrap();
    let message = json["result"]["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("exceeds its limit of 5 entries"),
        "{message}"
    );
    assert!(
        message.contains("OMABOX_CHECKPOINT_MAX_ENTRIES"),
        "{message}"
    );
    let (json, output) = data.run("s", &[], "ls; cat a");
    assert_eq!(completed(&json, &output), 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("one") && !stderr.contains("f1"), "{stderr}");

    let bad = data
        .command(&["run", "--backend", "local", "--session", "s", "--", "true"])
        .env("OMABOX_CHECKPOINT_MAX_BYTES", "lots")
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("OMABOX_CHECKPOINT_MAX_BYTES"));
}

#[test]
fn gc_keeps_exactly_what_the_last_revisions_need_and_both_still_restore() {
    const MIB: u64 = 1 << 20;
    let data = Data::new();
    for round in 1..=10u64 {
        // 1 MiB that changes every run, plus a marker of the round.
        let script = format!(
            "head -c 1048576 /dev/urandom > big; echo {round} > round; sha256sum big > big.sum; \
             echo {round} > \"$OMA_OUTPUTS_DIR/out.txt\" 2>/dev/null || true"
        );
        let (json, output) = data.run("s", &[], &script);
        assert_eq!(completed(&json, &output), round);
    }
    let before = data.blob_bytes();
    assert!(before >= 10 * MIB, "{before}");

    // Dry run: figures, per session, and nothing changes.
    let (dry, output) = data.json(&["gc", "--keep", "2", "--grace", "0", "--dry-run", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(dry["dryRun"], true);
    assert_eq!(dry["revisionsForgotten"], 8);
    assert_eq!(
        dry["sessions"]["s"]["revisionsForgotten"],
        serde_json::json!([1, 2, 3, 4, 5, 6, 7, 8])
    );
    let would = dry["bytesRemoved"].as_u64().unwrap();
    assert!((8 * MIB..9 * MIB).contains(&would), "{would}");
    assert_eq!(dry["sessions"]["s"]["bytes"].as_u64().unwrap(), would);
    assert_eq!(data.blob_bytes(), before, "a dry run removed blobs");
    let human = data.output(&["gc", "--keep", "2", "--grace", "0", "--dry-run"]);
    let human = String::from_utf8_lossy(&human.stdout).into_owned();
    assert!(
        human.contains("session s: 8 revisions beyond the last 2"),
        "{human}"
    );
    assert!(human.contains("would remove"), "{human}");

    let (done, output) = data.json(&["gc", "--keep", "2", "--grace", "0", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(done["bytesRemoved"].as_u64().unwrap(), would);
    let after = data.blob_bytes();
    assert!((2 * MIB..2 * MIB + 64 * 1024).contains(&after), "{after}");

    // fsck sees exactly revisions 10 and 9, both intact.
    let (fsck, output) = data.json(&["fsck", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    let revisions: Vec<u64> = fsck["revisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row["revision"].as_u64().unwrap())
        .collect();
    assert_eq!(revisions, [10, 9]);

    // Both restore, byte for byte.
    let (json, output) = data.run(
        "s",
        &["--from-revision", "9"],
        "cat round; sha256sum -c big.sum",
    );
    assert_eq!(completed(&json, &output), 11);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("9\nbig: OK"),
        "{}",
        text(&output)
    );
    let (json, output) = data.run("s", &[], "cat round; sha256sum -c big.sum");
    assert_eq!(completed(&json, &output), 12);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("9\nbig: OK"),
        "{}",
        text(&output)
    );
    let (_, output) = data.run("s", &["--from-revision", "8"], "true");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("has no revision 8"),
        "{}",
        text(&output)
    );

    // A second collection with the default grace removes nothing young.
    let (again, output) = data.json(&["gc", "--keep", "2", "--json"]);
    assert!(output.status.success(), "{}", text(&output));
    assert_eq!(again["blobsRemoved"], 0, "{again}");
}

#[test]
fn gc_removes_nothing_while_a_retained_manifest_cannot_be_read() {
    let data = Data::new();
    for round in 1..=3 {
        let (json, output) = data.run("s", &[], &format!("echo {round} > f"));
        assert_eq!(completed(&json, &output), round);
    }
    let (sessions, _) = data.json(&["sessions", "--json"]);
    let candidate = sessions[0]["workspaceCandidate"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest = candidate.strip_prefix("wcp_").unwrap();
    std::fs::remove_file(
        data.path()
            .join("blobs/sha256")
            .join(&manifest[..2])
            .join(manifest),
    )
    .unwrap();
    let before = data.blob_bytes();
    let output = data.output(&["gc", "--keep", "1", "--grace", "0"]);
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("session s revision 3 cannot be read"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was removed"), "{stderr}");
    assert_eq!(data.blob_bytes(), before);
}

#[test]
fn a_fifo_in_the_workspace_is_skipped_with_a_warning_and_the_run_publishes() {
    let data = Data::new();
    let (json, output) = data.run("s", &[], "mkfifo pipe; echo kept > a");
    assert_eq!(completed(&json, &output), 1);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("/workspace: skipped pipe: a FIFO"),
        "{stderr}"
    );
    let (json, output) = data.run("s", &[], "cat a; test ! -e pipe");
    assert_eq!(completed(&json, &output), 2);
}

#[test]
fn gc_with_a_short_grace_refuses_while_a_run_is_in_progress() {
    let data = Data::new();
    let sync = tempfile::tempdir().unwrap();
    let started = sync.path().join("started");
    let go = sync.path().join("go");
    let script = format!(
        "echo x > a; touch {started}; while [ ! -e {go} ]; do sleep 0.02; done",
        started = started.display(),
        go = go.display()
    );
    let mut run = data
        .command(&[
            "run",
            "--backend",
            "local",
            "--session",
            "s",
            "--json",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The harness runs, so the fence is held (bounded wait for the harness's marker).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the harness never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let output = data.output(&["gc", "--keep", "1", "--grace", "0"]);
    std::fs::write(&go, b"").unwrap();
    assert!(run.wait().unwrap().success());
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("1 run is in progress"), "{stderr}");
    // Once it finished, the same collection runs.
    let output = data.output(&["gc", "--keep", "1", "--grace", "0"]);
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn a_missing_output_blob_is_named_with_session_revision_and_object() {
    let data = Data::new();
    let (json, output) = data.run("o", &[], "echo report > \"$OMA_OUTPUTS_DIR/r.txt\"");
    assert_eq!(completed(&json, &output), 1);
    std::fs::remove_file(data.blob_path(b"report\n")).unwrap();
    let output = data.output(&["outputs", "--session", "o", "--get", "r.txt", "--to", "-"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let blob = omabox_persistence::BlobHash::of(b"report\n").to_hex();
    for expected in [
        "session o (revision 1)",
        "Session output r.txt is missing or corrupt",
        blob.as_str(),
        "not in the blob store",
    ] {
        assert!(stderr.contains(expected), "{expected:?} not in {stderr}");
    }
    let (fsck, output) = data.json(&["fsck", "--json"]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(fsck["revisions"][0]["damages"][0]["path"], "r.txt");
}

/// One lost blob of a single-revision session (the only revision: nothing to go back to):
/// the next run restores everything else, leaves the lost file (and a hard link to it) out,
/// says exactly which paths and why — in the JSON report, on stderr, in `omabox fsck` — and
/// the session goes on. A blob whose bytes were altered is lost the same way, never restored
/// with wrong bytes. A lost manifest loses every path: the run starts empty and says so.
#[test]
fn a_lost_blob_of_the_only_revision_is_named_and_the_session_goes_on() {
    let data = Data::new();
    let (json, output) = data.run(
        "one",
        &[],
        "echo alpha > a; echo bravo > b; ln b hb; mkdir d; echo charlie > d/c",
    );
    assert_eq!(completed(&json, &output), 1);
    std::fs::remove_file(data.blob_path(b"bravo\n")).unwrap();
    // Same size, other bytes.
    std::fs::write(data.blob_path(b"charlie\n"), b"CHARLIE\n").unwrap();

    let (json, output) = data.run(
        "one",
        &[],
        "cat a; test ! -e b && test ! -e hb && test ! -e d/c && test -d d && echo rest-ok",
    );
    assert_eq!(completed(&json, &output), 2);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("alpha") && stderr.contains("rest-ok"),
        "{stderr}"
    );
    let lost: Vec<(String, String)> = json["workspaceLost"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["path"].as_str().unwrap().to_owned(),
                d["problem"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        lost,
        [
            ("b".into(), "the blob is not in the blob store".into()),
            (
                "d/c".into(),
                "the blob's bytes do not match the manifest".into()
            ),
            ("hb".into(), "a hard link to b, which is lost".into()),
        ],
        "{json}"
    );
    assert!(
        stderr.contains("3 workspace entries of revision 1 could not be restored"),
        "{stderr}"
    );
    // fsck names the damaged revision; the new one is intact; the session goes on.
    let (fsck, output) = data.json(&["fsck", "--json", "--session", "one"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert_eq!(fsck["revisions"][0]["intact"], true);
    assert_eq!(fsck["revisions"][1]["intact"], false);
    let (json, output) = data.run("one", &[], "cat a; echo bravo2 > b");
    assert_eq!(completed(&json, &output), 3);
    assert!(json.get("workspaceLost").is_none(), "{json}");

    // The manifest itself lost: every path, and the run starts empty, saying so.
    let (sessions, _) = data.json(&["sessions", "--json"]);
    let candidate = sessions
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["session"] == "one")
        .unwrap()["workspaceCandidate"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest = candidate.strip_prefix("wcp_").unwrap();
    std::fs::remove_file(
        data.path()
            .join("blobs/sha256")
            .join(&manifest[..2])
            .join(manifest),
    )
    .unwrap();
    let (json, output) = data.run("one", &[], "test -z \"$(ls -A)\" && echo empty");
    assert_eq!(completed(&json, &output), 4);
    assert_eq!(
        json["workspaceLost"][0]["object"],
        candidate.as_str(),
        "{json}"
    );
    assert!(json["workspaceLost"][0].get("path").is_none(), "{json}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("every path of this revision is lost"),
        "{stderr}"
    );
    assert!(stderr.contains("empty"), "{stderr}");
}
