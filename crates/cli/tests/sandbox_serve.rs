//! `omabox sandbox create|ls|rm|timeout` (`exec`: sandbox_exec.rs) against a real `omabox serve` with real linux
//! sandboxes: create → ls shows it → timeout → rm → ls empty and its state dir gone, the
//! operator key taken from serve's key file, `rm` of an unknown id (named, exit 1, the
//! others still removed), a wrong key (401 naming where the key came from, never the key),
//! no serve at the URL, and a hostile server's text escaped and its answers capped;
//! `pause`/`resume` of a gvisor serve's sandbox, whose processes go on from their memory.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::{Serve, subdirs};
use common::{TestDirs, describe, gvisor_missing, linux_available};
use serde_json::Value;
use std::process::Output;

fn start_serve(dirs: &TestDirs) -> Serve {
    common::serve::start_with_key_file(dirs)
}

fn sandbox(dirs: &TestDirs, url: &str, key: Option<&str>, args: &[&str]) -> Output {
    common::serve::sandbox_command(dirs, url, key, args)
        .output()
        .unwrap()
}

fn stdout(output: &Output) -> String {
    assert!(output.status.success(), "{}", describe(output));
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `sandbox ls --json`.
fn listed(dirs: &TestDirs, url: &str) -> Vec<Value> {
    let output = sandbox(dirs, url, None, &["ls", "--json"]);
    let value: Value = serde_json::from_str(&stdout(&output)).unwrap();
    value.as_array().unwrap().clone()
}

#[test]
fn create_ls_timeout_rm_with_the_key_from_the_data_dir() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("sandbox-serve");
    let serve = start_serve(&dirs);
    let url = serve.url();
    let url = url.as_str();

    let output = sandbox(&dirs, url, None, &["ls"]);
    assert_eq!(stdout(&output).trim_end(), "ID  TEMPLATE  STARTED  ENDS");

    let output = sandbox(
        &dirs,
        url,
        None,
        &[
            "create",
            "--timeout",
            "300",
            "--metadata",
            "owner=alice",
            "--env",
            "GREETING=hi",
        ],
    );
    let id = stdout(&output).trim().to_owned();
    assert_eq!(id.len(), 20, "{id:?}");
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id:?}");
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 1);

    // `--json` is the API's answer, token included; the human line was the id only.
    let output = sandbox(&dirs, url, None, &["create", "--json"]);
    let created: Value = serde_json::from_str(&stdout(&output)).unwrap();
    let second = created["sandboxID"].as_str().unwrap().to_owned();
    assert_eq!(created["templateID"], "base");
    assert_eq!(created["envdAccessToken"].as_str().unwrap().len(), 64);
    assert_eq!(subdirs(dirs.runtime_dir.path()).len(), 2);

    let table = stdout(&sandbox(&dirs, url, None, &["ls"]));
    let mut lines = table.lines();
    assert!(lines.next().unwrap().starts_with("ID "), "{table}");
    let mut rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    rows.sort();
    let mut ids = [id.as_str(), second.as_str()];
    ids.sort_unstable();
    assert_eq!(rows.len(), 2, "{table}");
    for (row, id) in rows.iter().zip(ids) {
        assert_eq!(row[..2], [id, "base"], "{table}");
        assert_eq!(row.len(), 4, "{table}");
    }

    let before = listed(&dirs, url);
    let entry = before
        .iter()
        .find(|s| s["sandboxID"] == id.as_str())
        .unwrap();
    assert_eq!(entry["metadata"]["owner"], "alice");
    let end_before = entry["endAt"].as_str().unwrap().to_owned();
    let output = sandbox(&dirs, url, None, &["timeout", &id, "3600"]);
    assert_eq!(stdout(&output), "");
    let after = listed(&dirs, url);
    let entry = after
        .iter()
        .find(|s| s["sandboxID"] == id.as_str())
        .unwrap();
    let end_after = entry["endAt"].as_str().unwrap();
    assert!(
        end_after > end_before.as_str(),
        "{end_before} → {end_after}"
    );

    // An unknown id among known ones: named, exit 1, the others still removed.
    let output = sandbox(&dirs, url, None, &["rm", &id, "nosuchsandbox", &second]);
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        format!("{id}\n{second}\n")
    );
    let errors = stderr(&output);
    assert!(
        errors.contains(&format!("no sandbox nosuchsandbox in the serve at {url}")),
        "{errors}"
    );
    assert!(listed(&dirs, url).is_empty());
    assert!(subdirs(dirs.runtime_dir.path()).is_empty());

    let output = sandbox(&dirs, url, None, &["rm", "--json", "gone"]);
    assert_eq!(output.status.code(), Some(1));
    let results: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(results[0]["sandboxID"], "gone");
    assert_eq!(results[0]["removed"], false);
}

#[test]
fn a_wrong_key_is_refused_naming_its_source_never_itself() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("sandbox-serve-key");
    let serve = start_serve(&dirs);
    let wrong = "omk_not-the-operator-key-4242";
    for args in [&["ls"][..], &["create"], &["rm", "x"]] {
        let output = sandbox(&dirs, &serve.url(), Some(wrong), args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let errors = stderr(&output);
        assert!(
            errors.contains("refused the operator key (401)") && errors.contains("OMABOX_API_KEY"),
            "{errors}"
        );
        assert!(!errors.contains(wrong), "{errors}");
        assert!(output.stdout.is_empty());
    }
    assert!(subdirs(dirs.runtime_dir.path()).is_empty());
}

#[test]
fn no_serve_at_the_url_says_so() {
    let dirs = TestDirs::new("sandbox-serve-none");
    // A port that was free a moment ago and has no listener now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    for args in [&["ls"][..], &["create"], &["rm", "x"]] {
        let output = sandbox(&dirs, &url, Some("omk_any"), args);
        assert_eq!(output.status.code(), Some(1), "{args:?}");
        let errors = stderr(&output);
        assert!(
            errors.contains(&format!(
                "no omabox serve at {url}: connection refused; start it with `omabox serve`"
            )),
            "{errors}"
        );
    }
    // Without OMABOX_API_KEY and no key file: where to get one.
    let output = sandbox(&dirs, &url, None, &["ls"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr(&output).contains("no operator key"),
        "{}",
        stderr(&output)
    );
}

/// A loopback server answering every request with `status` and `body` (a hostile "serve").
fn fake_serve(status: &'static str, body: String) -> String {
    use std::io::{Read as _, Write as _};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

#[test]
fn what_serve_says_reaches_the_terminal_escaped_and_capped() {
    let dirs = TestDirs::new("sandbox-serve-hostile");
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2J\nomabox: fake line\u{202e}";
    let escaped = "\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\nomabox: fake line\\u{202e}";

    let message = serde_json::json!({"code": 400, "message": hostile}).to_string();
    let url = fake_serve("400 Bad Request", message);
    let output = sandbox(&dirs, &url, Some("omk_any"), &["create"]);
    assert_eq!(output.status.code(), Some(1));
    let errors = stderr(&output);
    assert!(errors.contains(escaped), "{errors:?}");
    assert!(
        !errors.contains('\u{1b}') && errors.lines().count() == 1,
        "{errors:?}"
    );

    let listed = serde_json::json!([{"sandboxID": hostile, "templateID": hostile,
        "startedAt": "2026-01-01T00:00:00Z", "endAt": hostile}])
    .to_string();
    let url = fake_serve("200 OK", listed);
    let table = stdout(&sandbox(&dirs, &url, Some("omk_any"), &["ls"]));
    assert_eq!(table.lines().count(), 2, "{table:?}");
    assert!(
        !table.contains('\u{1b}') && !table.contains('\u{202e}'),
        "{table:?}"
    );
    assert!(table.contains(escaped), "{table:?}");

    // An answer past the cap is refused, not read whole.
    let url = fake_serve("200 OK", format!("[\"{}\"]", "x".repeat(5 << 20)));
    let output = sandbox(&dirs, &url, Some("omk_any"), &["ls"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("bytes"), "{}", stderr(&output));
}

/// `omabox sandbox pause|resume|fork` against `omabox serve --backend gvisor`: a counter held
/// only in a shell's memory goes on after the resume (and after `exec`, which connects and
/// so resumes); `ls` shows it only while it runs; `--filesystem` ends its processes; `--memory` is
/// refused by a linux serve.
#[test]
fn pause_resume_and_fork_keep_a_gvisor_sandboxs_processes() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    let dirs = TestDirs::new("sandbox-serve-gv");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "gvisor"]);
    command.env_remove("OMABOX_API_KEY");
    let serve = Serve::start(command);
    let url = serve.url();
    let url = url.as_str();
    let id = stdout(&sandbox(&dirs, url, None, &["create", "--timeout", "300"]))
        .trim()
        .to_owned();
    let exec = |script: &str| sandbox(&dirs, url, None, &["exec", &id, "--", "sh", "-c", script]);
    let started = exec(
        "mkfifo /tmp/ask /tmp/answer && \
         (i=0; while :; do read l < /tmp/ask; i=$((i+1)); echo $i > /tmp/answer; done) \
         >/dev/null 2>&1 </dev/null & echo started",
    );
    assert_eq!(stdout(&started).trim(), "started");
    let ask = || {
        stdout(&exec("echo x > /tmp/ask; cat /tmp/answer"))
            .trim()
            .to_owned()
    };
    assert_eq!(ask(), "1");

    assert_eq!(
        stdout(&sandbox(&dirs, url, None, &["pause", &id])).trim(),
        id
    );
    let state = |dirs: &TestDirs| {
        listed(dirs, url)
            .iter()
            .find(|s| s["sandboxID"] == id.as_str())
            .map(|s| s["state"].as_str().unwrap_or_default().to_owned())
    };
    // `ls` lists running sandboxes (E2B's list): a paused one is not among them.
    assert_eq!(state(&dirs), None);
    assert_eq!(
        stdout(&sandbox(
            &dirs,
            url,
            None,
            &["resume", &id, "--timeout", "300"]
        ))
        .trim(),
        id
    );
    assert_eq!(state(&dirs).as_deref(), Some("running"));
    assert_eq!(ask(), "2", "the counter went on from its memory");
    // `exec` connects, as E2B's SDKs do: a paused sandbox is resumed by it.
    stdout(&sandbox(&dirs, url, None, &["pause", &id]));
    assert_eq!(ask(), "3", "exec resumed it, memory and all");

    // Two copies from its memory: each goes on from 3 on its own; the source runs on.
    let forked = stdout(&sandbox(&dirs, url, None, &["fork", &id, "--count", "2"]));
    let forks: Vec<&str> = forked.lines().collect();
    assert_eq!(forks.len(), 2, "{forked}");
    for fork in &forks {
        assert_ne!(*fork, id);
        let asked = sandbox(
            &dirs,
            url,
            None,
            &[
                "exec",
                fork,
                "--",
                "sh",
                "-c",
                "echo x > /tmp/ask; cat /tmp/answer",
            ],
        );
        assert_eq!(stdout(&asked).trim(), "4", "a fork's counter goes on");
    }
    assert_eq!(ask(), "4", "the source's counter goes on by itself");
    let mut rm = vec!["rm"];
    rm.extend(forks.iter().copied());
    stdout(&sandbox(&dirs, url, None, &rm));

    // (`[r]ead`: the pattern does not match this very command line.)
    let counters = || stdout(&exec("ps -eo args | grep -c '[r]ead l < /tmp/ask' || true"));
    assert_ne!(
        counters().trim(),
        "0",
        "the counter runs before the filesystem pause"
    );
    stdout(&exec("echo saved > /tmp/file"));
    let output = sandbox(&dirs, url, None, &["pause", "--filesystem", &id]);
    stdout(&output);
    stdout(&sandbox(&dirs, url, None, &["resume", &id]));
    let kept = exec("cat /tmp/file");
    assert_eq!(
        stdout(&kept).trim(),
        "saved",
        "a filesystem pause keeps /tmp's files"
    );
    assert_eq!(counters().trim(), "0", "a filesystem pause ends processes");
    stdout(&sandbox(&dirs, url, None, &["rm", &id]));
    serve.stop();
}

#[test]
fn pause_memory_and_fork_are_refused_by_a_linux_serve() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("sandbox-serve-pause");
    let serve = start_serve(&dirs);
    let url = serve.url();
    let url = url.as_str();
    let id = stdout(&sandbox(&dirs, url, None, &["create", "--timeout", "300"]))
        .trim()
        .to_owned();
    let refused = sandbox(&dirs, url, None, &["fork", &id]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("fork is not offered"),
        "{}",
        describe(&refused)
    );
    let refused = sandbox(&dirs, url, None, &["pause", "--memory", &id]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("only filesystem pause"),
        "{}",
        describe(&refused)
    );
    stdout(&sandbox(&dirs, url, None, &["pause", &id]));
    stdout(&sandbox(&dirs, url, None, &["resume", &id]));
    stdout(&sandbox(&dirs, url, None, &["rm", &id]));
    serve.stop();
}
