//! `omabox serve`'s E2B-compatible control plane over HTTP, with real linux sandboxes:
//! create → get → list → timeout extension → kill (its state dir and cgroup gone), a short
//! timeout that expires, 401 without the operator key, 404 and 400 in E2B's error shape, no
//! access token in any log line, every sandbox killed when serve stops, and those of a
//! killed serve reaped by `omabox reap` (linux, and gvisor with a memory pause).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::{Serve, subdirs};
use common::{TestDirs, cgroup_parent_dirs, gvisor_missing, linux_available};
use serde_json::Value;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const KEY: &str = "omk_e2b-test-operator-key";
/// How long a test waits for a sandbox's timeout to kill it (a bound, not a speed claim).
const EXPIRY_WAIT: Duration = Duration::from_secs(60);

/// serve with the tests' key, debug logs (the token must be in none) and a small body cap.
fn start_serve(dirs: &TestDirs) -> Serve {
    let mut command = dirs.command(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--max-body-bytes",
        "4096",
    ]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LOG", "debug");
    Serve::start(command)
}

impl Serve {
    /// One HTTP/1.0 request → (status, body as JSON or `Null`).
    fn call(
        &self,
        key: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Value) {
        let mut stream = TcpStream::connect(&self.addr).unwrap();
        let key = key.map_or(String::new(), |key| format!("x-api-key: {key}\r\n"));
        let body = body.unwrap_or("");
        write!(
            stream,
            "{method} {path} HTTP/1.0\r\nhost: {}\r\n{key}content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            self.addr,
            body.len()
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split(' ').nth(1).unwrap().parse().unwrap();
        let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
        let value = if body.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {response}"))
        };
        (status, value)
    }

    fn create(&self, body: &str) -> Value {
        let (status, created) = self.call(Some(KEY), "POST", "/sandboxes", Some(body));
        assert_eq!(status, 201, "{created}");
        created
    }
}

/// The sandbox cgroups under the test's cgroup parent (every hierarchy).
fn cgroups(dirs: &TestDirs) -> Vec<PathBuf> {
    cgroup_parent_dirs(&dirs.cgroup_parent)
        .iter()
        .flat_map(|parent| subdirs(parent))
        .collect()
}

fn assert_error(value: &Value, code: u16, needle: &str) {
    assert_eq!(value["code"], code, "{value}");
    let message = value["message"].as_str().unwrap();
    assert!(message.contains(needle), "{message:?} lacks {needle:?}");
}

#[test]
fn create_get_list_extend_kill_and_errors() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let serve = start_serve(&dirs);
    let mut tokens = Vec::new();

    let created = serve.create(
        r#"{"templateID":"base","timeout":300,"metadata":{"user":"abc"},"envVars":{"GREETING":"hi"}}"#,
    );
    let id = created["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 20, "{created}");
    assert_eq!(created["templateID"], "base");
    let token = created["envdAccessToken"].as_str().unwrap().to_owned();
    assert_eq!(token.len(), 64);
    tokens.push(token.clone());
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);
    assert!(!cgroups(&dirs).is_empty());

    let (status, detail) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["sandboxID"], id.as_str());
    assert_eq!(detail["state"], "running");
    assert_eq!(detail["metadata"]["user"], "abc");
    assert_eq!(detail["envdAccessToken"], token.as_str());
    assert!(detail["cpuCount"].as_u64().unwrap() >= 1);
    let end_before = detail["endAt"].as_str().unwrap().to_owned();

    for path in [
        "/sandboxes",
        "/v2/sandboxes",
        "/sandboxes?metadata=user%3Dabc",
    ] {
        let (status, listed) = serve.call(Some(KEY), "GET", path, None);
        assert_eq!(status, 200, "{path}: {listed}");
        let ids: Vec<&str> = listed
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["sandboxID"].as_str().unwrap())
            .collect();
        assert_eq!(ids, [id.as_str()], "{path}");
    }
    let (_, none) = serve.call(Some(KEY), "GET", "/sandboxes?metadata=user%3Dxyz", None);
    assert_eq!(none, Value::Array(vec![]));

    let (status, _) = serve.call(
        Some(KEY),
        "POST",
        &format!("/sandboxes/{id}/timeout"),
        Some(r#"{"timeout":3600}"#),
    );
    assert_eq!(status, 204);
    let (_, detail) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    let end_after = detail["endAt"].as_str().unwrap().to_owned();
    assert!(end_after > end_before, "{end_before} → {end_after}");
    // A refresh never shortens: a minute from now is before the hour just set.
    let (status, _) = serve.call(
        Some(KEY),
        "POST",
        &format!("/sandboxes/{id}/refreshes"),
        Some(r#"{"duration":60}"#),
    );
    assert_eq!(status, 204);
    let (_, detail) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(detail["endAt"], end_after.as_str());

    // No key, a wrong key: 401, and nothing is reachable.
    for key in [None, Some("omk_wrong")] {
        for (method, path) in [
            ("GET", "/sandboxes".to_owned()),
            ("GET", format!("/sandboxes/{id}")),
            ("DELETE", format!("/sandboxes/{id}")),
        ] {
            let (status, value) = serve.call(key, method, &path, None);
            assert_eq!(status, 401, "{method} {path} {key:?}: {value}");
            assert_eq!(value["code"], 401);
            assert!(!value.to_string().contains(&token));
        }
    }
    // Bad input: 400 naming the cause; nothing started.
    let oversize = format!(
        r#"{{"templateID":"base","metadata":{{"a":"{}"}}}}"#,
        "x".repeat(8192)
    );
    for (body, needle) in [
        (
            r#"{"templateID":"base","timeout":-5}"#,
            "timeout must be between 0 and 86400",
        ),
        (
            r#"{"templateID":"base","timeout":100000000000}"#,
            "timeout must be between 0 and 86400",
        ),
        (r#"{"templateID":"python"}"#, "\"python\" is not known"),
        ("{not json", "not valid JSON"),
        (oversize.as_str(), "too large"),
    ] {
        let (status, value) = serve.call(Some(KEY), "POST", "/sandboxes", Some(body));
        assert_eq!(status, 400, "{value}");
        assert_error(&value, 400, needle);
    }
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);

    let (status, _) = serve.call(Some(KEY), "DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 204);
    assert!(subdirs(dirs.runtime_dir.path()).is_empty());
    assert!(cgroups(&dirs).is_empty(), "{:?}", cgroups(&dirs));
    for (method, path) in [
        ("GET", format!("/sandboxes/{id}")),
        ("DELETE", format!("/sandboxes/{id}")),
    ] {
        let (status, value) = serve.call(Some(KEY), method, &path, None);
        assert_eq!(status, 404, "{value}");
        assert_error(&value, 404, &format!("sandbox \"{id}\" not found"));
    }

    // Its log outlives it: created (with its template), killed; never a token or an
    // environment value.
    let (status, logs) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}/logs"), None);
    assert_eq!(status, 200, "{logs}");
    let events: Vec<&str> = logs["logEntries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["fields"]["event"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["created", "killed"], "{logs}");
    assert_eq!(logs["logEntries"][0]["fields"]["template"], "base");
    assert_eq!(logs["logEntries"][0]["level"], "info");
    assert_eq!(logs["logs"].as_array().unwrap().len(), 2, "{logs}");
    assert!(logs["logs"][1]["line"].as_str().unwrap().contains("killed"));
    assert!(!logs.to_string().contains(&token) && !logs.to_string().contains("hi\""));
    let path = format!("/v2/sandboxes/{id}/logs?direction=backward&limit=1");
    let (status, newest) = serve.call(Some(KEY), "GET", &path, None);
    assert_eq!(status, 200, "{newest}");
    assert_eq!(newest["logs"].as_array().unwrap().len(), 1, "{newest}");
    assert_eq!(newest["logs"][0]["fields"]["event"], "killed");
    let (status, value) = serve.call(None, "GET", &format!("/sandboxes/{id}/logs"), None);
    assert_eq!(status, 401, "{value}");
    let (status, value) = serve.call(
        Some(KEY),
        "GET",
        "/sandboxes/nosuchsandbox0000000/logs",
        None,
    );
    assert_eq!(status, 404, "{value}");

    // A sandbox still running when serve stops is killed with it.
    let created = serve.create(r#"{"templateID":"base","timeout":600}"#);
    tokens.push(created["envdAccessToken"].as_str().unwrap().to_owned());
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);
    let log = serve.stop();
    assert!(subdirs(dirs.runtime_dir.path()).is_empty(), "{log:#?}");
    assert!(cgroups(&dirs).is_empty());
    assert!(
        log.iter().any(|line| line.contains("sandbox created")),
        "{log:#?}"
    );
    for line in &log {
        for token in &tokens {
            assert!(!line.contains(token.as_str()), "a token in the log: {line}");
        }
    }
}

#[test]
fn a_sandbox_is_killed_when_its_timeout_expires_unless_extended() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let serve = start_serve(&dirs);
    // `kept` would expire 5 s after its start but is extended right away; `short` starts
    // after it and expires 6 s after its start, so once `short` is gone, `kept`'s first
    // deadline has passed too: it must still run.
    let kept = serve.create(r#"{"templateID":"base","timeout":5}"#);
    let kept = kept["sandboxID"].as_str().unwrap();
    let path = format!("/sandboxes/{kept}/timeout");
    let (status, _) = serve.call(Some(KEY), "POST", &path, Some(r#"{"timeout":600}"#));
    assert_eq!(status, 204);
    let short = serve.create(r#"{"templateID":"base","timeout":6}"#);
    let short = short["sandboxID"].as_str().unwrap();
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 2);
    let started = Instant::now();
    loop {
        let (status, _) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{short}"), None);
        if status == 404 {
            break;
        }
        assert_eq!(status, 200);
        assert!(
            started.elapsed() < EXPIRY_WAIT,
            "not killed after {EXPIRY_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Gone for every route from the kill's start; its cleanup ends soon after.
    while subdirs(dirs.runtime_dir.path()).len() != 1 {
        assert!(
            started.elapsed() < EXPIRY_WAIT,
            "not cleaned up after {EXPIRY_WAIT:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, logs) = serve.call(
        Some(KEY),
        "GET",
        &format!("/v2/sandboxes/{short}/logs"),
        None,
    );
    assert_eq!(status, 200, "{logs}");
    let last = logs["logs"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["fields"]["event"], "timeout", "{logs}");
    let (_, listed) = serve.call(Some(KEY), "GET", "/v2/sandboxes", None);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed[0]["sandboxID"], kept);
    let (status, _) = serve.call(Some(KEY), "DELETE", &format!("/sandboxes/{kept}"), None);
    assert_eq!(status, 204);
    assert!(subdirs(dirs.runtime_dir.path()).is_empty());
    assert!(cgroups(&dirs).is_empty());
    serve.stop();
}

#[test]
fn the_sandboxes_of_a_killed_serve_are_reaped() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let mut serve = start_serve(&dirs);
    serve.create(r#"{"templateID":"base","timeout":600}"#);
    // A paused one too: its saved files outlive the kill -9 until the reap.
    let paused = serve.create(r#"{"templateID":"base","timeout":600}"#);
    let pause = format!("/sandboxes/{}/pause", paused["sandboxID"].as_str().unwrap());
    assert_eq!(serve.call(Some(KEY), "POST", &pause, None).0, 204);
    let saved = dirs.data.path().join("paused-sandboxes");
    assert!(!files_below(&saved).is_empty());
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);
    serve.child().kill().unwrap();
    serve.child().wait().unwrap();
    drop(serve);
    assert_eq!(
        subdirs(dirs.runtime_dir.path()).len(),
        1,
        "left behind by kill -9"
    );
    assert!(
        !cgroups(&dirs).is_empty(),
        "its cgroups are left behind too"
    );
    let output = dirs.command(&["reap"]).output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    assert!(
        subdirs(dirs.runtime_dir.path()).is_empty(),
        "{}",
        common::describe(&output)
    );
    assert!(cgroups(&dirs).is_empty());
    assert!(
        files_below(&saved).is_empty(),
        "a dead serve's paused sandboxes: {}",
        common::describe(&output)
    );
}

/// `omabox serve --backend gvisor` killed with a running sandbox, its fork (their workspaces
/// overlays over a shared layer), a memory snapshot of it (an image) and one paused with
/// its memory (a checkpoint on disk):
/// `omabox reap` removes them all, checkpoint, overlays, layers, runsc state and cgroups
/// included; nothing of them runs.
#[test]
fn the_gvisor_sandboxes_of_a_killed_serve_are_reaped() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    let dirs = TestDirs::new("e2bgvreap");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "gvisor"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LOG", "debug");
    let mut serve = Serve::start(command);
    let running = serve.create(r#"{"templateID":"base","timeout":600}"#);
    let fork = format!("/sandboxes/{}/fork", running["sandboxID"].as_str().unwrap());
    let (status, forked) = serve.call(Some(KEY), "POST", &fork, Some(r#"{"timeout":600}"#));
    assert_eq!(status, 201, "{forked}");
    assert!(forked[0]["sandbox"]["sandboxID"].is_string(), "{forked}");
    // A memory snapshot too: an image that outlives the kill -9 until the reap.
    let snapshot = format!(
        "/sandboxes/{}/snapshots",
        running["sandboxID"].as_str().unwrap()
    );
    let (status, snapped) = serve.call(Some(KEY), "POST", &snapshot, Some("{}"));
    assert_eq!(status, 201, "{snapped}");
    let paused = serve.create(r#"{"templateID":"base","timeout":600}"#);
    let pause = format!("/sandboxes/{}/pause", paused["sandboxID"].as_str().unwrap());
    assert_eq!(
        serve
            .call(Some(KEY), "POST", &pause, Some(r#"{"memory":true}"#))
            .0,
        204
    );
    let sandboxes = dirs.data.path().join("gvisor/sandboxes");
    let ids: Vec<String> = subdirs(&sandboxes)
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let bases = dirs.data.path().join("gvisor/bases");
    assert_eq!(
        subdirs(&bases).len(),
        2,
        "the fork's and the snapshot's layers"
    );
    let images = dirs.data.path().join("gvisor/images");
    assert_eq!(subdirs(&images).len(), 1, "the memory snapshot's image");
    let checkpoints: Vec<_> = subdirs(&sandboxes)
        .into_iter()
        .filter(|d| d.join("checkpoint").is_dir())
        .collect();
    assert_eq!(checkpoints.len(), 1, "the paused one's checkpoint");
    let running_id = running["sandboxID"].as_str().unwrap();
    serve.child().kill().unwrap();
    serve.child().wait().unwrap();
    drop(serve);
    assert_eq!(
        subdirs(&sandboxes).len(),
        3,
        "left behind by kill -9 {running_id}"
    );
    assert_reap_leaves_nothing(&dirs, &ids);
}

#[test]
fn a_kill_9_during_a_gvisor_pause_resume_or_fork_leaves_only_what_reap_removes() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    // (crash point, what the request does there)
    for (point, op) in [
        ("gvisor-checkpointed", "pause"),
        ("gvisor-restoring", "resume"),
        ("gvisor-restoring", "fork"),
    ] {
        let dirs = TestDirs::new("e2bgvkill");
        let mut command =
            dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "gvisor"]);
        command
            .env("OMABOX_API_KEY", KEY)
            .env("OMABOX_TEST_MODE", "1")
            .env("OMABOX_FAULT_POINT", point);
        let mut serve = Serve::start(command);
        let created = serve.create(r#"{"templateID":"base","timeout":600}"#);
        let id = created["sandboxID"].as_str().unwrap();
        let (path, body) = match op {
            "pause" => (format!("/sandboxes/{id}/pause"), r#"{"memory":true}"#),
            "resume" => {
                let pause = format!("/sandboxes/{id}/pause");
                let (status, paused) =
                    serve.call(Some(KEY), "POST", &pause, Some(r#"{"memory":true}"#));
                assert_eq!(status, 204, "{paused}");
                (format!("/sandboxes/{id}/connect"), r#"{"timeout":60}"#)
            }
            _ => (
                format!("/sandboxes/{id}/fork"),
                r#"{"count":2,"timeout":60}"#,
            ),
        };
        // serve kills itself at the point: the request gets no answer.
        let mut stream = TcpStream::connect(&serve.addr).unwrap();
        write!(
            stream,
            "POST {path} HTTP/1.0\r\nhost: {}\r\nx-api-key: {KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            serve.addr,
            body.len()
        )
        .unwrap();
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        assert!(answer.is_empty(), "{op}: answered before {point}: {answer}");
        let status = serve.child().wait().unwrap();
        assert!(
            !status.success(),
            "{op}: serve did not crash at {point}: {answer}"
        );
        drop(serve);
        let ids: Vec<String> = subdirs(&dirs.data.path().join("gvisor/sandboxes"))
            .iter()
            .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert!(!ids.is_empty(), "{op}: the crash left its sandbox for reap");
        eprintln!("{op} at {point}: reaping {ids:?}");
        assert_reap_leaves_nothing(&dirs, &ids);
    }
}

#[test]
fn a_memory_pause_without_room_on_disk_is_refused_and_the_sandbox_runs_on() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    let dirs = TestDirs::new("e2bgvdisk");
    // The gvisor backend's directory on a 64 MiB file system: below the checkpoint reserve.
    let gvisor = dirs.data.path().join("gvisor");
    std::fs::create_dir_all(&gvisor).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&gvisor)
        .status()
        .unwrap();
    assert!(mounted.success());
    let checked = std::panic::catch_unwind(|| {
        let mut command =
            dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "gvisor"]);
        command.env("OMABOX_API_KEY", KEY);
        let serve = Serve::start(command);
        let created = serve.create(r#"{"templateID":"base","timeout":600}"#);
        let id = created["sandboxID"].as_str().unwrap();
        let pause = format!("/sandboxes/{id}/pause");
        let (status, refused) = serve.call(Some(KEY), "POST", &pause, Some(r#"{"memory":true}"#));
        assert_eq!(status, 503, "{refused}");
        assert_error(&refused, 503, "not enough disk space");
        // Still running: listed as such, and a fork (which pauses first) is refused the same way.
        let assert_running = || {
            let (status, info) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
            assert_eq!(
                (status, info["state"].as_str()),
                (200, Some("running")),
                "{info}"
            );
        };
        assert_running();
        let fork = format!("/sandboxes/{id}/fork");
        let (status, forked) = serve.call(Some(KEY), "POST", &fork, Some(r#"{"count":1}"#));
        assert_eq!(status, 503, "{forked}");
        assert_error(&forked, 503, "not enough disk space");
        assert_running();
        let kill = format!("/sandboxes/{id}");
        assert_eq!(serve.call(Some(KEY), "DELETE", &kill, None).0, 204);
        serve.stop();
    });
    let _ = std::process::Command::new("umount").arg(&gvisor).status();
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
}

/// `omabox reap` after a kill -9 of serve: no sandbox directory, layer, image, overlay
/// mount, cgroup or process of `ids` is left.
fn assert_reap_leaves_nothing(dirs: &TestDirs, ids: &[String]) {
    let gvisor = dirs.data.path().join("gvisor");
    let (sandboxes, bases, images) = (
        gvisor.join("sandboxes"),
        gvisor.join("bases"),
        gvisor.join("images"),
    );
    let output = dirs.command(&["reap"]).output().unwrap();
    assert!(output.status.success(), "{}", common::describe(&output));
    assert!(
        subdirs(&sandboxes).is_empty(),
        "not reaped: {:?}\n{}",
        subdirs(&sandboxes),
        common::describe(&output)
    );
    assert!(
        subdirs(&bases).is_empty(),
        "layers left: {:?}",
        subdirs(&bases)
    );
    assert!(
        subdirs(&images).is_empty(),
        "images left: {:?}",
        subdirs(&images)
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&sandboxes.display().to_string()),
        "an overlay is still mounted"
    );
    for id in ids {
        let cgroups: Vec<_> = std::fs::read_dir("/sys/fs/cgroup")
            .unwrap()
            .flatten()
            .map(|c| c.path().join("omabox-gvisor").join(id))
            .filter(|d| d.exists())
            .collect();
        assert!(cgroups.is_empty(), "{cgroups:?}");
        // runsc's foreground process (and its subreaper) of a sandbox whose serve died end on
        // their own once reap deleted the container; the deadline only ends a hang.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while runs_a_process_naming(id) && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(!runs_a_process_naming(id), "a process of {id} runs on");
    }
}

/// Whether a process's command line names `text`.
fn runs_a_process_naming(text: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        e.file_name()
            .to_str()
            .is_some_and(|n| n.parse::<u32>().is_ok())
            && std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(text))
    })
}

#[test]
fn a_sandbox_whose_init_died_is_gone_and_cleaned_up() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let serve = start_serve(&dirs);
    let created = serve.create(r#"{"templateID":"base","timeout":600}"#);
    let id = created["sandboxID"].as_str().unwrap();
    let [state_dir] = &subdirs(dirs.runtime_dir.path())[..] else {
        panic!("one state dir expected");
    };
    let identity: Value =
        serde_json::from_slice(&std::fs::read(state_dir.join("identity.json")).unwrap()).unwrap();
    let pid = identity["pid"].as_i64().unwrap() as libc::pid_t;
    // SAFETY: plain kill(2) of the sandbox's PID 1, which this test's serve started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let started = Instant::now();
    loop {
        let (status, value) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
        let (_, listed) = serve.call(Some(KEY), "GET", "/sandboxes", None);
        if status == 404 {
            assert_eq!(listed, Value::Array(vec![]));
            assert_error(&value, 404, "not found");
            break;
        }
        assert!(started.elapsed() < EXPIRY_WAIT, "still shown: {value}");
        std::thread::sleep(Duration::from_millis(50));
    }
    while !subdirs(dirs.runtime_dir.path()).is_empty() || !cgroups(&dirs).is_empty() {
        assert!(started.elapsed() < EXPIRY_WAIT, "not cleaned up");
        std::thread::sleep(Duration::from_millis(50));
    }
    serve.stop();
}

/// Whether a TCP connect to `addr` from inside the network namespace of process `pid`
/// succeeds (on a thread of its own: a thread's `setns` leaves the others where they were).
fn connects_from_netns_of(pid: libc::pid_t, addr: &str) -> bool {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    let addr = addr.to_owned();
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns(2) of this thread only, on a namespace fd that stays open here.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(5)).is_ok()
    })
    .join()
    .unwrap()
}

#[test]
fn under_the_default_network_a_sandbox_has_no_internet_and_cannot_reach_serve() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let serve = start_serve(&dirs);
    // E2B's SDKs ask for the internet by default; the operator's setting decides, and the
    // sandbox's detail says what it got, not what was asked.
    let created =
        serve.create(r#"{"templateID":"base","timeout":300,"allow_internet_access":true}"#);
    let id = created["sandboxID"].as_str().unwrap();
    let (status, detail) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["allowInternetAccess"], false, "{detail}");
    let [state_dir] = &subdirs(dirs.runtime_dir.path())[..] else {
        panic!("one state dir expected");
    };
    let identity: Value =
        serde_json::from_slice(&std::fs::read(state_dir.join("identity.json")).unwrap()).unwrap();
    let pid = identity["pid"].as_i64().unwrap() as libc::pid_t;
    // The probe works: from this process's own namespace serve answers.
    assert!(connects_from_netns_of(
        std::process::id() as libc::pid_t,
        &serve.addr
    ));
    assert!(
        !connects_from_netns_of(pid, &serve.addr),
        "a sandbox reached serve's listener {}",
        serve.addr
    );
    serve.stop();
}

/// The pid of the one sandbox's init (from its state dir's identity).
fn only_sandbox_pid(dirs: &TestDirs) -> libc::pid_t {
    let [state_dir] = &subdirs(dirs.runtime_dir.path())[..] else {
        panic!("one state dir expected");
    };
    let identity: Value =
        serde_json::from_slice(&std::fs::read(state_dir.join("identity.json")).unwrap()).unwrap();
    identity["pid"].as_i64().unwrap() as libc::pid_t
}

/// Files (not directories) below `dir`, recursively.
fn files_below(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(files_below(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A paused sandbox: its processes, cgroup and state dir gone, its files kept in the data
/// dir (owner-only modes), listed as paused, its timeout stopped; a connect resumes it under
/// the same token (201), a second pause is a 409, a memory pause a 400, and a kill of a
/// paused sandbox removes its saved files.
#[test]
fn a_paused_sandbox_keeps_its_files_privately_and_no_timeout_until_resumed_or_killed() {
    use std::os::unix::fs::PermissionsExt as _;
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let serve = start_serve(&dirs);
    let created = serve.create(r#"{"templateID":"base","timeout":5}"#);
    let id = created["sandboxID"].as_str().unwrap();
    let pause = format!("/sandboxes/{id}/pause");
    let (status, body) = serve.call(Some(KEY), "POST", &pause, Some(r#"{"memory":true}"#));
    assert_eq!(status, 400);
    assert_error(&body, 400, "only filesystem pause is served");
    let (status, body) = serve.call(Some(KEY), "POST", &pause, Some(r#"{"memory":false}"#));
    assert_eq!(status, 204, "{body}");
    assert!(
        subdirs(dirs.runtime_dir.path()).is_empty(),
        "its state dir is gone"
    );
    assert!(cgroups(&dirs).is_empty(), "its cgroups are gone");
    let saved = dirs.data.path().join("paused-sandboxes");
    let files = files_below(&saved);
    assert!(
        files.iter().any(|f| f.ends_with("workspace.tar"))
            && files.iter().any(|f| f.ends_with("tmp.tar")),
        "{files:?}"
    );
    for file in &files {
        let mode = std::fs::metadata(file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", file.display());
        let dir_mode = std::fs::metadata(file.parent().unwrap())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(dir_mode & 0o777, 0o700, "{}", file.display());
    }
    let (status, body) = serve.call(Some(KEY), "POST", &pause, None);
    assert_eq!(status, 409, "{body}");
    // Past its 5 s timeout it is still there, paused.
    std::thread::sleep(Duration::from_secs(7));
    let (status, detail) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["state"], "paused", "{detail}");
    let (_, paused) = serve.call(Some(KEY), "GET", "/v2/sandboxes?state=paused", None);
    assert_eq!(paused.as_array().unwrap().len(), 1, "{paused}");
    let (_, running) = serve.call(Some(KEY), "GET", "/sandboxes", None);
    assert!(running.as_array().unwrap().is_empty(), "{running}");
    let connect = format!("/sandboxes/{id}/connect");
    let (status, resumed) = serve.call(Some(KEY), "POST", &connect, Some(r#"{"timeout":60}"#));
    assert_eq!(status, 201, "{resumed}");
    assert_eq!(resumed["sandboxID"], id);
    assert_eq!(resumed["envdAccessToken"], created["envdAccessToken"]);
    assert!(
        files_below(&saved).is_empty(),
        "resumed: its saved files are removed"
    );
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);
    let (status, body) = serve.call(Some(KEY), "POST", &connect, Some(r#"{"timeout":60}"#));
    assert_eq!(status, 200, "a running sandbox's connect: {body}");
    let (status, _) = serve.call(Some(KEY), "POST", &pause, None);
    assert_eq!(status, 204);
    assert!(!files_below(&saved).is_empty());
    let (status, _) = serve.call(Some(KEY), "DELETE", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 204);
    assert!(
        files_below(&saved).is_empty(),
        "killed: its saved files are removed"
    );
    let (status, _) = serve.call(Some(KEY), "GET", &format!("/sandboxes/{id}"), None);
    assert_eq!(status, 404);
    serve.stop();
}

/// One DNS question for `name`'s A record, asked of the sandbox's stub (`127.0.0.1:53` in
/// the network namespace of process `pid`): the answer's rcode and answer count.
fn dns_in_netns_of(pid: libc::pid_t, name: &str) -> (u8, u16) {
    let ns = std::fs::File::open(format!("/proc/{pid}/ns/net")).unwrap();
    let mut query = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        query.push(label.len() as u8);
        query.extend_from_slice(label.as_bytes());
    }
    query.extend_from_slice(&[0, 0, 1, 0, 1]);
    std::thread::spawn(move || {
        use std::os::fd::AsRawFd as _;
        // SAFETY: setns(2) of this thread only, on a namespace fd that stays open here.
        let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        socket.send_to(&query, "127.0.0.1:53").unwrap();
        let mut answer = [0u8; 512];
        let n = socket.recv(&mut answer).unwrap();
        assert!(n >= 12 && answer[..2] == [0x12, 0x34], "{:?}", &answer[..n]);
        (answer[3] & 0x0f, u16::from_be_bytes([answer[6], answer[7]]))
    })
    .join()
    .unwrap()
}

/// `PUT /sandboxes/{id}/network` changes what the live sandbox's DNS stub answers: a name
/// refused under `limited` with nothing allowed is answered once allowed, and
/// refused again after the next update; a pause and resume keeps the update; what the
/// policy cannot enforce is a 400 naming the field, and so is an open internet the
/// operator's network does not give.
#[test]
fn a_network_update_changes_what_the_sandbox_resolves() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_NETWORK", "limited")
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_LINUX_TEST_HOSTS", "allowed.test=198.18.0.7");
    let serve = Serve::start(command);
    let created = serve.create(r#"{"templateID":"base","timeout":300}"#);
    let id = created["sandboxID"].as_str().unwrap();
    let pid = only_sandbox_pid(&dirs);
    let (refused, none) = dns_in_netns_of(pid, "allowed.test");
    assert!(
        refused != 0 && none == 0,
        "answered before it was allowed: rcode {refused}"
    );
    let network = format!("/sandboxes/{id}/network");
    let allow = r#"{"allowOut":["allowed.test"],"denyOut":["0.0.0.0/0"]}"#;
    let (status, body) = serve.call(Some(KEY), "PUT", &network, Some(allow));
    assert_eq!(status, 204, "{body}");
    assert_eq!(dns_in_netns_of(pid, "allowed.test"), (0, 1));
    assert!(
        dns_in_netns_of(pid, "other.test").0 != 0,
        "only the allowed name"
    );
    // A pause and resume keeps the update: the new sandbox gets it, not the node's network.
    let (status, _) = serve.call(Some(KEY), "POST", &format!("/sandboxes/{id}/pause"), None);
    assert_eq!(status, 204);
    let connect = format!("/sandboxes/{id}/connect");
    let (status, body) = serve.call(Some(KEY), "POST", &connect, Some(r#"{"timeout":300}"#));
    assert_eq!(status, 201, "{body}");
    let pid = only_sandbox_pid(&dirs);
    assert_eq!(
        dns_in_netns_of(pid, "allowed.test"),
        (0, 1),
        "resumed with its update"
    );
    for (bad, field) in [
        (
            r#"{"allowOut":["198.18.0.7"],"denyOut":["0.0.0.0/0"]}"#,
            "allowOut",
        ),
        (r#"{"denyOut":["198.18.0.0/15"]}"#, "denyOut"),
        (r#"{}"#, "OMABOX_LINUX_NETWORK"),
    ] {
        let (status, body) = serve.call(Some(KEY), "PUT", &network, Some(bad));
        assert_eq!(status, 400, "{bad}: {body}");
        assert_error(&body, 400, field);
    }
    assert_eq!(
        dns_in_netns_of(pid, "allowed.test"),
        (0, 1),
        "a refused update changes nothing"
    );
    let (status, _) = serve.call(
        Some(KEY),
        "PUT",
        &network,
        Some(r#"{"allow_internet_access":false}"#),
    );
    assert_eq!(status, 204);
    assert!(dns_in_netns_of(pid, "allowed.test").0 != 0, "refused again");
    let (status, _) = serve.call(
        Some(KEY),
        "PUT",
        "/sandboxes/nosuchsandbox/network",
        Some(allow),
    );
    assert_eq!(status, 404);
    serve.stop();
}

/// Under an `unrestricted` operator network an update may narrow a sandbox to nothing and
/// open it again (`{}`: E2B's "no rules").
#[test]
fn an_open_internet_is_granted_back_under_an_unrestricted_operator_network() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("e2b");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_NETWORK", "unrestricted")
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_LINUX_TEST_HOSTS", "allowed.test=198.18.0.7");
    let serve = Serve::start(command);
    let created = serve.create(r#"{"templateID":"base","timeout":300}"#);
    let id = created["sandboxID"].as_str().unwrap();
    let pid = only_sandbox_pid(&dirs);
    assert_eq!(dns_in_netns_of(pid, "allowed.test"), (0, 1));
    let network = format!("/sandboxes/{id}/network");
    let (status, body) = serve.call(
        Some(KEY),
        "PUT",
        &network,
        Some(r#"{"denyOut":["0.0.0.0/0"]}"#),
    );
    assert_eq!(status, 204, "{body}");
    assert!(dns_in_netns_of(pid, "allowed.test").0 != 0, "denied");
    let (status, body) = serve.call(Some(KEY), "PUT", &network, Some("{}"));
    assert_eq!(status, 204, "{body}");
    assert_eq!(dns_in_netns_of(pid, "allowed.test"), (0, 1), "open again");
    serve.stop();
}
