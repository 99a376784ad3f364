//! `--database-url` / `OMABOX_DATABASE_URL` through the `omabox` binary, against a real
//! PostgreSQL server (`omabox_test_support::postgres`; the capability gate skips with a
//! reason locally and fails under `CI=true`): two "hosts" (two data directories) share one
//! vault, the usage ledger and the session list in PostgreSQL, no SQLite file is made, a
//! collection on one host keeps what a run on another has stored and not yet published, and
//! the URL's password shows in no output.

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, Nullable, PublishRuntimeResourcesInput,
    RuntimePublicationCandidate, RuntimeResourceFencePort, RuntimeResourceScope, UsageKind,
    UsageLedgerPort, UsageRecord,
};
use omabox_store::PostgresStore;
use omabox_test_support::postgres::TestPostgres;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn omabox(data_dir: &Path, env_url: Option<&str>, args: &[&str], stdin: &[u8]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .env_remove("OMABOX_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = env_url {
        command.env("OMABOX_DATABASE_URL", url);
    }
    let mut child = command.spawn().expect("the omabox binary runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn two_hosts_share_vault_usage_and_sessions_in_postgres_and_the_password_shows_nowhere() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("shared").unwrap();
    let password = server.password().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let (host_a, host_b) = (dir.path().join("a"), dir.path().join("b"));

    // Host A stores a secret through the environment variable...
    let put = omabox(
        &host_a,
        Some(&url),
        &["vault", "put", "api-key"],
        b"v4lue\n",
    );
    assert!(put.status.success(), "{}", text(&put));
    assert!(!text(&put).contains(&password), "{}", text(&put));
    // ...host B lists it through the flag.
    let names = omabox(
        &host_b,
        None,
        &["--database-url", &url, "vault", "names", "--json"],
        b"",
    );
    assert!(names.status.success(), "{}", text(&names));
    let listed: Vec<String> = serde_json::from_slice(&names.stdout).unwrap();
    assert_eq!(listed, ["api-key"]);
    for host in [&host_a, &host_b] {
        assert!(
            !host.join("omabox.db").exists(),
            "{} got a SQLite store",
            host.display()
        );
    }

    // `omabox config` says the setting is set, and hides it.
    let config = omabox(&host_a, Some(&url), &["config"], b"");
    assert!(config.status.success(), "{}", text(&config));
    assert!(text(&config).contains("database_url"), "{}", text(&config));
    assert!(!text(&config).contains(&password), "{}", text(&config));

    // What another host published and used is listed here.
    seed_a_publication_and_usage(&url);
    let sessions = omabox(&host_b, Some(&url), &["sessions", "--json"], b"");
    assert!(sessions.status.success(), "{}", text(&sessions));
    let listed: serde_json::Value = serde_json::from_slice(&sessions.stdout).unwrap();
    assert_eq!(listed[0]["session"], "shared-session", "{listed}");
    assert_eq!(listed[0]["revision"], 1, "{listed}");
    let usage = omabox(&host_b, Some(&url), &["usage", "--json"], b"");
    assert!(usage.status.success(), "{}", text(&usage));
    let records: serde_json::Value = serde_json::from_slice(&usage.stdout).unwrap();
    assert_eq!(records[0]["runtimeId"], "rt-1", "{records}");
    assert_eq!(records[0]["seconds"], 42, "{records}");

    // `gc` on the shared history without the shared blob dir would find other hosts'
    // manifests nowhere: it refuses, and makes no local SQLite file either.
    let gc = omabox(&host_a, Some(&url), &["gc"], b"");
    assert!(!gc.status.success(), "{}", text(&gc));
    assert!(
        text(&gc).contains("--database-url without --blob-dir"),
        "{}",
        text(&gc)
    );
    assert!(!text(&gc).contains(&password), "{}", text(&gc));
    for host in [&host_a, &host_b] {
        assert!(!host.join("omabox.db").exists(), "{}", host.display());
    }

    // A wrong password: the error names the database, never the password given.
    let wrong = url.replace(&password, "not-the-p4ssword");
    let refused = omabox(&host_b, Some(&wrong), &["vault", "names"], b"");
    assert!(!refused.status.success());
    let output = text(&refused);
    assert!(output.contains("omabox@127.0.0.1:"), "{output}");
    assert!(!output.contains("not-the-p4ssword"), "{output}");
}

/// Another host's run: a publication of `shared-session` and one usage record.
fn seed_a_publication_and_usage(url: &str) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = PostgresStore::connect(url).await.unwrap();
        let scope = RuntimeResourceScope::new("default", "default", "shared-session", "main");
        let AcquireRuntimeFenceResult::Acquired { fence, .. } = store
            .acquire(AcquireRuntimeFenceInput {
                scope: scope.clone(),
                owner_id: "host-elsewhere".into(),
                ttl_ms: 60_000,
            })
            .await
            .unwrap()
        else {
            panic!("a fresh work item is acquired");
        };
        store
            .publish(PublishRuntimeResourcesInput {
                fence,
                workspace_candidate: RuntimePublicationCandidate {
                    id: "wcp_shared".into(),
                    content_hash: "sha256:00".into(),
                    metadata: None,
                },
                output_candidate: None,
                runtime_checkpoint: Nullable::Absent,
            })
            .await
            .unwrap();
        store
            .record_usage(UsageRecord {
                kind: UsageKind::SandboxActiveSeconds,
                scope,
                provider: "linux".into(),
                runtime_id: "rt-1".into(),
                seconds: 42,
                started_at: "2026-12-02T14:39:12.000Z".into(),
                stopped_at: "2026-12-02T14:39:54.000Z".into(),
                stop_estimated: false,
            })
            .await
            .unwrap();
    });
}

#[test]
fn omabox_run_keeps_its_fences_and_publications_in_postgres() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("runs").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    let run = |cmd: &[&str]| {
        let mut args = vec![
            "run",
            "--json",
            "--backend",
            "local",
            "--session",
            "pg-run",
            "--",
        ];
        args.extend_from_slice(cmd);
        let output = omabox(&host, Some(&url), &args, b"");
        assert!(output.status.success(), "{}", text(&output));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));
        (report, output)
    };

    let (first, _) = run(&["sh", "-c", "echo one > f"]);
    assert_eq!(
        first["result"],
        serde_json::json!({"type": "completed", "revision": 1}),
        "{first}"
    );
    // A second run (another process, another fence owner) takes the released fence and
    // restores what the first published.
    let (second, output) = run(&["cat", "f"]);
    assert_eq!(second["restoredRevision"], 1, "{second}");
    assert_eq!(
        second["result"],
        serde_json::json!({"type": "completed", "revision": 2}),
        "{second}"
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("one"),
        "{}",
        text(&output)
    );
    assert!(!host.join("omabox.db").exists(), "the run used SQLite");

    // The fence, its publications and the run's usage are in PostgreSQL.
    let sessions = omabox(&host, Some(&url), &["sessions", "--json"], b"");
    assert!(sessions.status.success(), "{}", text(&sessions));
    let listed: serde_json::Value = serde_json::from_slice(&sessions.stdout).unwrap();
    assert_eq!(listed[0]["session"], "pg-run", "{listed}");
    assert_eq!(listed[0]["revision"], 2, "{listed}");
    assert_eq!(listed[0]["generation"], 2, "{listed}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let store = runtime.block_on(PostgresStore::connect(&url)).unwrap();
    assert_eq!(
        runtime.block_on(store.active_fence_count()).unwrap(),
        0,
        "both runs released their fence"
    );
}

/// `omabox run` on two hosts (two data directories) sharing the PostgreSQL store and one
/// `--blob-dir`: what one host published, the other restores and continues; either host
/// collects the shared dir; `files add` puts its file in the shared file store.
#[test]
fn a_session_moves_between_hosts_sharing_the_database_and_the_blob_dir() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("moves").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let shared_blobs = dir.path().join("shared-blobs");
    let blob_flag = shared_blobs.to_str().unwrap().to_owned();
    let run = |host: &str, cmd: &[&str]| {
        let mut args = vec![
            "--blob-dir",
            &blob_flag,
            "run",
            "--json",
            "--backend",
            "local",
            "--session",
            "moving",
            "--",
        ];
        args.extend_from_slice(cmd);
        let output = omabox(&dir.path().join(host), Some(&url), &args, b"");
        assert!(output.status.success(), "{}", text(&output));
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|error| panic!("{error}: {}", text(&output)));
        (report, output)
    };

    let (first, _) = run("host-a", &["sh", "-c", "echo made-on-a > f"]);
    assert_eq!(first["result"]["revision"], 1, "{first}");
    let (second, output) = run("host-b", &["sh", "-c", "cat f && echo and-b >> f"]);
    assert_eq!(second["restoredRevision"], 1, "{second}");
    assert_eq!(second["result"]["revision"], 2, "{second}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("made-on-a"),
        "{}",
        text(&output)
    );
    let (third, output) = run("host-a", &["cat", "f"]);
    assert_eq!(third["restoredRevision"], 2, "{third}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("and-b"),
        "{}",
        text(&output)
    );
    assert!(shared_blobs.join("sha256").is_dir());
    // Host B exports what host A published last, and lists its (no) outputs.
    let export = dir.path().join("exported");
    let exported = omabox(
        &dir.path().join("host-b"),
        Some(&url),
        &[
            "--blob-dir",
            &blob_flag,
            "workspace",
            "export",
            "--session",
            "moving",
            export.to_str().unwrap(),
        ],
        b"",
    );
    assert!(exported.status.success(), "{}", text(&exported));
    assert_eq!(
        std::fs::read_to_string(export.join("f")).unwrap(),
        "made-on-a\nand-b\n"
    );
    let outputs = omabox(
        &dir.path().join("host-b"),
        Some(&url),
        &[
            "--blob-dir",
            &blob_flag,
            "outputs",
            "--session",
            "moving",
            "--json",
        ],
        b"",
    );
    assert!(outputs.status.success(), "{}", text(&outputs));
    for host in ["host-a", "host-b"] {
        let data = dir.path().join(host);
        assert!(!data.join("blobs").exists(), "{host} kept blobs of its own");
        assert!(!data.join("omabox.db").exists(), "{host} used SQLite");
    }

    // Host B collects the shared directory against the shared history, keeping one revision
    // per session: host A's last revision still verifies and exports on host A.
    let gc = omabox(
        &dir.path().join("host-b"),
        Some(&url),
        &[
            "--blob-dir",
            &blob_flag,
            "gc",
            "--keep",
            "1",
            "--grace",
            "0",
            "--json",
        ],
        b"",
    );
    assert!(gc.status.success(), "{}", text(&gc));
    let summary: serde_json::Value = serde_json::from_slice(&gc.stdout).unwrap();
    assert_eq!(summary["revisionsForgotten"], 2, "{summary}");
    let fsck = omabox(
        &dir.path().join("host-a"),
        Some(&url),
        &["--blob-dir", &blob_flag, "fsck", "--json"],
        b"",
    );
    assert!(fsck.status.success(), "{}", text(&fsck));
    let (fourth, _) = run("host-a", &["cat", "f"]);
    assert_eq!(fourth["restoredRevision"], 3, "{fourth}");

    // `files add` on a host keeps the file next to the shared blobs, where the host that
    // runs the session finds it; no SQLite file is made.
    let input = dir.path().join("input.txt");
    std::fs::write(&input, "for any host\n").unwrap();
    let added = omabox(
        &dir.path().join("host-a"),
        Some(&url),
        &[
            "--blob-dir",
            &blob_flag,
            "files",
            "add",
            input.to_str().unwrap(),
        ],
        b"",
    );
    assert!(added.status.success(), "{}", text(&added));
    let id = String::from_utf8_lossy(&added.stdout).trim().to_owned();
    assert!(id.starts_with("file_"), "{id}");
    assert!(
        shared_blobs
            .join("promoted")
            .join(format!("{id}.json"))
            .is_file(),
        "the file is not in the shared file store"
    );
    assert!(!dir.path().join("host-a/omabox.db").exists());
}

/// `omabox --data-dir HOST --database-url URL --blob-dir BLOBS ARGS…` in test mode, with
/// `extra` environment variables, not yet waited for.
fn host_command(host: &Path, url: &str, blobs: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(host)
        .arg("--database-url")
        .arg(url)
        .arg("--blob-dir")
        .arg(blobs)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .env_remove("OMABOX_DATABASE_URL")
        .env_remove("OMABOX_BLOB_DIR")
        .env_remove("OMABOX_GC_KEEP")
        .env_remove("OMABOX_PAUSE_POINT")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn json_of(output: &Output) -> serde_json::Value {
    serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {}", text(output)))
}

/// The blobs in a blob dir (`sha256/<2 hex>/<hex>`).
fn blob_count(blobs: &Path) -> usize {
    std::fs::read_dir(blobs.join("sha256"))
        .map(|shards| {
            shards
                .flatten()
                .map(|shard| std::fs::read_dir(shard.path()).map_or(0, Iterator::count))
                .sum()
        })
        .unwrap_or(0)
}

/// Two hosts share the PostgreSQL store and one `--blob-dir`. Host A's run has stored its
/// checkpoint's blobs in the shared directory and is paused right before its publish when
/// host B collects: with `--grace 0` B refuses (a run is in progress on some host), with
/// the default grace and through `omabox reap` it keeps the young blobs. A then publishes;
/// B collects with `--grace 0`, every published revision verifies, and B continues the
/// session from what A stored.
#[test]
fn a_collection_on_one_host_keeps_what_another_host_stored_and_has_not_published() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("collect").unwrap();
    let password = server.password().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let (host_a, host_b, blobs) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("blobs"),
    );
    let run = |host: &Path, script: &str| {
        let mut command = host_command(
            host,
            &url,
            &blobs,
            &[
                "run",
                "--json",
                "--backend",
                "local",
                "--session",
                "moving",
                "--",
                "sh",
                "-c",
            ],
        );
        command.arg(script);
        command
    };
    let first = run(&host_a, "echo old > old").output().unwrap();
    assert!(first.status.success(), "{}", text(&first));

    let go = dir.path().join("go");
    let mut paused = run(
        &host_a,
        "head -c 300000 /dev/urandom > data; echo new > small",
    )
    .env("OMABOX_PAUSE_POINT", "run-publishing")
    .env("OMABOX_PAUSE_FILE", &go)
    .spawn()
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !dir.path().join("go.paused").exists() {
        assert!(
            paused.try_wait().unwrap().is_none(),
            "host A's run ended before its publish"
        );
        assert!(std::time::Instant::now() < deadline, "host A never paused");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let stored = blob_count(&blobs);

    let short = host_command(&host_b, &url, &blobs, &["gc", "--grace", "0", "--json"])
        .output()
        .unwrap();
    assert!(!short.status.success(), "{}", text(&short));
    assert!(text(&short).contains("in progress"), "{}", text(&short));
    let default = host_command(&host_b, &url, &blobs, &["gc", "--keep", "1", "--json"])
        .output()
        .unwrap();
    assert!(default.status.success(), "{}", text(&default));
    assert_eq!(json_of(&default)["blobsRemoved"], 0, "{}", text(&default));
    let reap = host_command(&host_b, &url, &blobs, &["reap", "--json"])
        .output()
        .unwrap();
    assert!(reap.status.success(), "{}", text(&reap));
    assert_eq!(json_of(&reap)["gc"]["blobsRemoved"], 0, "{}", text(&reap));
    assert_eq!(
        blob_count(&blobs),
        stored,
        "a collection removed host A's blobs"
    );
    for output in [&short, &default, &reap] {
        assert!(!text(output).contains(&password), "{}", text(output));
    }

    std::fs::write(&go, b"").unwrap();
    let published = paused.wait_with_output().unwrap();
    assert!(published.status.success(), "{}", text(&published));
    assert_eq!(
        json_of(&published)["result"]["revision"],
        2,
        "{}",
        text(&published)
    );

    let collected = host_command(
        &host_b,
        &url,
        &blobs,
        &["gc", "--keep", "1", "--grace", "0", "--json"],
    )
    .output()
    .unwrap();
    assert!(collected.status.success(), "{}", text(&collected));
    assert_eq!(
        json_of(&collected)["revisionsForgotten"],
        1,
        "{}",
        text(&collected)
    );
    let fsck = host_command(&host_b, &url, &blobs, &["fsck", "--json"])
        .output()
        .unwrap();
    assert_eq!(json_of(&fsck)["damagedRevisions"], 0, "{}", text(&fsck));
    assert!(fsck.status.success(), "{}", text(&fsck));
    let next = run(&host_b, "cat small").output().unwrap();
    assert!(next.status.success(), "{}", text(&next));
    assert!(
        String::from_utf8_lossy(&next.stderr).contains("new"),
        "{}",
        text(&next)
    );
}

/// A shared blob dir without the shared store: `gc` refuses (this host's SQLite history
/// knows only its own publications) and `reap` skips the collection and says so.
#[test]
fn a_shared_blob_dir_is_never_collected_from_one_hosts_sqlite_history() {
    let dir = tempfile::tempdir().unwrap();
    let (host, blobs) = (dir.path().join("host"), dir.path().join("blobs"));
    let command = |args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
        command
            .arg("--data-dir")
            .arg(&host)
            .arg("--blob-dir")
            .arg(&blobs)
            .args(args)
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_DATABASE_URL")
            .stdin(Stdio::null());
        command.output().unwrap()
    };
    let run = command(&["run", "--backend", "local", "--", "true"]);
    assert!(run.status.success(), "{}", text(&run));
    let gc = command(&["gc", "--grace", "0"]);
    assert!(!gc.status.success(), "{}", text(&gc));
    assert!(
        text(&gc).contains("without --database-url"),
        "{}",
        text(&gc)
    );
    let reap = command(&["reap"]);
    assert!(reap.status.success(), "{}", text(&reap));
    assert!(
        text(&reap).contains("blobs: not collected"),
        "{}",
        text(&reap)
    );
}
