//! `omabox serve`'s E2B-compatible control plane over HTTP, with real linux sandboxes:
//! create → get → list → timeout extension → kill (its state dir and cgroup gone), a short
//! timeout that expires, 401 without the operator key, 404 and 400 in E2B's error shape, no
//! access token in any log line, every sandbox killed when serve stops, and those of a
//! killed serve reaped by `omabox reap`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::{Serve, subdirs};
use common::{TestDirs, cgroup_parent_dirs, linux_available};
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
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);
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
