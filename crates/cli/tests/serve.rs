//! `omabox serve` on a fresh data directory with no config: it starts, answers `/healthz`
//! and `/openapi.json`, refuses an inference request without a token, and stops cleanly on
//! SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::process::{Command, Stdio};

fn get(addr: &str, method: &str, path: &str) -> String {
    let mut stream = TcpStream::connect(addr).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}

#[test]
fn serve_starts_fresh_and_answers_healthz() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data.path().join("fresh"))
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OMABOX_API_KEY")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("omabox serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();

    let health = get(&addr, "GET", "/healthz");
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    assert!(health.ends_with(r#"{"status":"ok"}"#), "{health}");
    let openapi = get(&addr, "GET", "/openapi.json");
    assert!(openapi.contains("\"openapi\": \"3.1.0\""), "{openapi}");
    let refused = get(
        &addr,
        "POST",
        "/v1/oma/inference-proxy/s1/anthropic/v1/messages",
    );
    assert!(refused.starts_with("HTTP/1.1 401"), "{refused}");
    assert!(
        refused.ends_with(r#"{"error":"Unauthorized"}"#),
        "{refused}"
    );

    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
}

/// One HTTP/1.0 request (no chunked encoding) with the operator key → (status code, body).
fn request(addr: &str, key: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    raw_request(addr, addr, Some(key), method, path, body)
}

use common::serve::http_request as raw_request;

/// Starts `omabox serve` on a free loopback port; returns the child, its address, and its
/// stderr (kept open so the server can still log while it shuts down).
fn start_serve(
    data_dir: &std::path::Path,
) -> (
    std::process::Child,
    String,
    BufReader<std::process::ChildStderr>,
) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env_remove("OMABOX_API_KEY")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    stderr.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("omabox serve: listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line: {line:?}"))
        .to_owned();
    (child, addr, stderr)
}

#[test]
fn a_published_output_is_promoted_into_a_stored_file() {
    let data = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data.path())
        .env("OMABOX_TEST_MODE", "1")
        .args([
            "run",
            "--backend",
            "local",
            "--session",
            "p1",
            "--json",
            "--",
        ])
        .args([
            "sh",
            "-c",
            r#"echo promoted > "$OMA_OUTPUTS_DIR/r.txt"; echo kept > w.txt"#,
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let (mut child, addr, _stderr) = start_serve(data.path());
    let key = std::fs::read_to_string(data.path().join("serve-api-key")).unwrap();
    let key = key.trim();
    let (status, body) = request(
        &addr,
        key,
        "POST",
        "/v1/sessions/p1/files",
        r#"{"path":"/mnt/session/outputs/r.txt"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("file_"), "{created}");
    assert_eq!(created["size"], 9);
    let (status, content) = request(&addr, key, "GET", &format!("/v1/files/{id}/content"), "");
    assert_eq!((status, content.as_str()), (200, "promoted\n"));
    let (status, _) = raw_request(
        &addr,
        &addr,
        None,
        "GET",
        &format!("/v1/files/{id}/content"),
        "",
    );
    assert_eq!(status, 401, "the content route needs the key");
    let (status, _) = raw_request(
        &addr,
        "rebound.evil.test",
        Some(key),
        "GET",
        &format!("/v1/files/{id}/content"),
        "",
    );
    assert_eq!(status, 421, "a foreign Host is refused");

    let (status, body) = request(
        &addr,
        key,
        "POST",
        "/v1/sessions/p1/files",
        r#"{"path":"/workspace/w.txt"}"#,
    );
    assert_eq!(status, 201, "workspace files promote too: {body}");

    for absent in [
        r#"{"path":"/mnt/session/outputs/missing.txt"}"#,
        r#"{"path":"/etc/passwd"}"#,
    ] {
        let (status, body) = request(&addr, key, "POST", "/v1/sessions/p1/files", absent);
        assert_eq!(status, 400, "{absent}: {body}");
    }
    let (status, _) = request(
        &addr,
        key,
        "POST",
        "/v1/sessions/never-ran/files",
        r#"{"path":"/mnt/session/outputs/r.txt"}"#,
    );
    assert_eq!(status, 400);

    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
}

#[test]
fn the_operator_key_is_generated_once_private_and_printed_only_then() {
    use std::os::unix::fs::PermissionsExt as _;
    let data = tempfile::tempdir().unwrap();
    let mut printed = Vec::new();
    for _ in 0..2 {
        let (mut child, addr, mut stderr) = start_serve(data.path());
        let (status, _) = raw_request(&addr, &addr, None, "POST", "/v1/sessions/s/files", "{}");
        assert_eq!(status, 401, "no keyless mode");
        // SAFETY: plain kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(rc, 0);
        assert!(child.wait().unwrap().success());
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).unwrap();
        printed.push(rest);
    }
    let path = data.path().join("serve-api-key");
    let key = std::fs::read_to_string(&path).unwrap().trim().to_owned();
    assert!(key.starts_with("omk_"), "{key}");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    assert!(
        printed[0].contains(&key),
        "printed once when generated: {}",
        printed[0]
    );
    assert!(
        printed[0].contains("Authorization: Bearer"),
        "{}",
        printed[0]
    );
    assert!(!printed[1].contains(&key), "never again: {}", printed[1]);
    assert!(printed[1].contains("serve-api-key"), "{}", printed[1]);
}

#[test]
fn the_vault_stores_secrets_from_stdin_and_never_prints_them() {
    let data = tempfile::tempdir().unwrap();
    let secret = "vault-value-3f9c2a7e";
    let omabox = |args: &[&str], stdin: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_omabox"))
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    };
    let put = omabox(&["vault", "put", "github"], &format!("{secret}\n"));
    assert!(put.status.success(), "{put:?}");
    let names = omabox(&["vault", "names", "--json"], "");
    assert!(names.status.success());
    let listed: Vec<String> = serde_json::from_slice(&names.stdout).unwrap();
    assert_eq!(listed, ["github"]);
    for output in [&put, &names] {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(!text.contains(secret), "{text}");
    }
    let empty = omabox(&["vault", "put", "empty"], "");
    assert!(!empty.status.success());
    assert!(omabox(&["vault", "delete", "github"], "").status.success());
    let names = omabox(&["vault", "names", "--json"], "");
    assert_eq!(
        serde_json::from_slice::<Vec<String>>(&names.stdout).unwrap(),
        Vec::<String>::new()
    );
}

/// Kills the server if the test fails before stopping it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The peak resident set (VmHWM) of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn a_large_file_is_promoted_and_served_in_constant_memory() {
    const MIB: u64 = 1024 * 1024;
    const SIZE_MIB: u64 = 128;
    let data = tempfile::tempdir().unwrap();
    let run = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data.path())
        .env("OMABOX_TEST_MODE", "1")
        .args([
            "run",
            "--backend",
            "local",
            "--session",
            "big",
            "--json",
            "--",
        ])
        .args([
            "sh",
            "-c",
            &format!(
                r#"head -c {} /dev/urandom > "$OMA_OUTPUTS_DIR/big.bin""#,
                SIZE_MIB * MIB
            ),
        ])
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let (child, addr, _stderr) = start_serve(data.path());
    let mut child = KillOnDrop(child);
    let child = &mut child.0;
    let key = std::fs::read_to_string(data.path().join("serve-api-key")).unwrap();
    let key = key.trim();
    let baseline = peak_rss_kib(child.id());
    let (status, body) = raw_request(
        &addr,
        &addr,
        Some(key),
        "POST",
        "/v1/sessions/big/files",
        r#"{"path":"/mnt/session/outputs/big.bin"}"#,
    );
    assert_eq!(status, 201, "{body}");
    let created: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(created["size"], SIZE_MIB * MIB);
    assert_eq!(created["mediaType"], "application/octet-stream");
    let id = created["id"].as_str().unwrap();

    // Three concurrent reads, each drained without keeping the bytes.
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (addr, key, id) = (addr.clone(), key.to_owned(), id.to_owned());
            std::thread::spawn(move || {
                let mut stream = TcpStream::connect(&addr).unwrap();
                write!(
                    stream,
                    "GET /v1/files/{id}/content HTTP/1.0\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\r\n"
                )
                .unwrap();
                let mut reader = BufReader::new(stream);
                let mut head = String::new();
                reader.read_line(&mut head).unwrap();
                assert!(head.contains(" 200 "), "{head}");
                std::io::copy(&mut reader, &mut std::io::sink()).unwrap()
            })
        })
        .collect();
    for reader in readers {
        assert!(reader.join().unwrap() > SIZE_MIB * MIB);
    }
    let peak = peak_rss_kib(child.id());
    println!(
        "omabox serve peak RSS: {} MiB at start, {} MiB after promoting one {SIZE_MIB} MiB file and serving it 3x concurrently",
        baseline / 1024,
        peak / 1024
    );
    assert!(
        peak < baseline + 32 * 1024,
        "peak RSS grew by {} MiB for a {SIZE_MIB} MiB file",
        (peak - baseline) / 1024
    );
    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
}

#[test]
fn zero_limits_from_flags_or_env_are_refused_clearly() {
    let data = tempfile::tempdir().unwrap();
    for (flag, env) in [
        (Some("--max-connections=0"), None),
        (None, Some(("OMABOX_SERVE_IDLE_TIMEOUT_MS", "0"))),
    ] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
        command
            .arg("--data-dir")
            .arg(data.path())
            .args(["serve", "--listen", "127.0.0.1:0"]);
        command.args(flag);
        if let Some((name, value)) = env {
            command.env(name, value);
        }
        let output = command.output().unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("must be positive"), "{stderr}");
    }
}

/// Under a low descriptor limit (64, soft and hard: root here cannot raise it), idle clients
/// cannot take the descriptors a request needs: the connection cap is derived from the
/// limit, so an operator's file download queued behind 300 half-open connections (each
/// closed by the header-read timeout) is served, not failed with EMFILE.
#[test]
fn a_low_descriptor_limit_leaves_room_to_serve_behind_idle_clients() {
    use std::os::unix::process::CommandExt as _;
    let data = tempfile::tempdir().unwrap();
    let file = data.path().join("hello.txt");
    std::fs::write(&file, "hello\n").unwrap();
    let added = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data.path().join("d"))
        .args(["files", "add"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let id = String::from_utf8(added.stdout).unwrap().trim().to_owned();
    let key = "k".repeat(40);
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(data.path().join("d"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--header-read-timeout-ms",
            "500",
        ])
        .env("OMABOX_API_KEY", &key)
        .env("OMABOX_LOG", "warn")
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; the closure touches nothing else.
    unsafe {
        command.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = KillOnDrop(command.spawn().unwrap());
    let child = &mut child.0;
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("listening on") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "serve exited");
    }
    let addr = line.trim().rsplit("http://").next().unwrap().to_owned();
    let idle = |n: usize| -> Vec<TcpStream> {
        (0..n).map(|_| TcpStream::connect(&addr).unwrap()).collect()
    };
    let before = idle(150);
    let mut stream = TcpStream::connect(&addr).unwrap();
    write!(
        stream,
        "GET /v1/files/{id}/content HTTP/1.0\r\nhost: {addr}\r\nauthorization: Bearer {key}\r\n\r\n"
    )
    .unwrap();
    let after = idle(150);
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200"), "{response}");
    assert!(response.ends_with("\r\n\r\nhello\n"), "{response}");
    drop((before, after));

    // SAFETY: plain kill(2) on our own child's pid.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(rc, 0);
    assert!(child.wait().unwrap().success());
    let mut rest = String::new();
    let _ = stderr.read_to_string(&mut rest);
    assert!(rest.contains("serving fewer connections at once"), "{rest}");
}
