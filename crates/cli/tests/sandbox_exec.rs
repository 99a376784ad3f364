//! `omabox sandbox exec` against a real `omabox serve` with a real linux sandbox: stdout and
//! stderr reach the right streams, the exit code is the command's (`exit 7` → 7, SIGKILL →
//! 137), `-e` and `--cwd` apply, `-i` forwards piped stdin (past one 64 KiB chunk) and
//! without `-i` the command has none, Ctrl-C kills the command and exits 130, a closed
//! stdout ends it with SIGTERM, an unknown sandbox and a wrong key are named, and the
//! sandbox's access token is never printed; a hostile serve's text is escaped, its messages
//! capped at 4 MiB.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::Serve;
use common::{TestDirs, describe, linux_available};
use serde_json::Value;
use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Command, Output, Stdio};

fn start_serve(dirs: &TestDirs) -> Serve {
    common::serve::start_with_key_file(dirs)
}

fn sandbox(dirs: &TestDirs, url: &str, key: Option<&str>, args: &[&str]) -> Command {
    common::serve::sandbox_command(dirs, url, key, args)
}

/// Runs `command` with `input` piped to its stdin.
fn with_stdin(mut command: Command, input: &[u8]) -> Output {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || {
        // The command may end before reading it all (no `-i`).
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().unwrap();
    writer.join().unwrap();
    output
}

/// A sandbox with a long timeout; its id and access token.
fn create(dirs: &TestDirs, url: &str) -> (String, String) {
    let output = sandbox(dirs, url, None, &["create", "--timeout", "600", "--json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    let created: Value = serde_json::from_slice(&output.stdout).unwrap();
    (
        created["sandboxID"].as_str().unwrap().to_owned(),
        created["envdAccessToken"].as_str().unwrap().to_owned(),
    )
}

#[test]
fn exec_streams_output_returns_the_exit_code_and_forwards_stdin() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("sandbox-exec");
    let serve = start_serve(&dirs);
    let url = serve.url();
    let url = url.as_str();
    let (id, token) = create(&dirs, url);
    let mut outputs = Vec::new();
    let exec = |args: &[&str]| {
        let mut all = vec!["exec"];
        all.extend_from_slice(args);
        sandbox(&dirs, url, None, &all)
    };

    // stdout and stderr to their own streams, the command's exit code ours.
    let output = exec(&[&id, "--", "sh", "-c", "echo out; echo err >&2; exit 7"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(7), "{}", describe(&output));
    assert_eq!(output.stdout, b"out\n", "{}", describe(&output));
    assert_eq!(output.stderr, b"err\n", "{}", describe(&output));
    outputs.push(output);

    // Raw bytes to a pipe, binary included.
    let output = exec(&[&id, "--", "printf", "a\\000b\\377\\033[2J"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(output.stdout, b"a\0b\xff\x1b[2J");
    outputs.push(output);

    // -e and --cwd.
    let output = exec(&[
        "-e",
        "GREETING=hello there",
        "--cwd",
        "/tmp",
        &id,
        "--",
        "sh",
        "-c",
        "echo \"$GREETING\"; pwd",
    ])
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(output.stdout, b"hello there\n/tmp\n");
    outputs.push(output);

    // -i: our stdin is the command's, past one 64 KiB chunk, and closed at our EOF.
    let input: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let output = with_stdin(exec(&["-i", &id, "--", "cat"]), &input);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(output.stdout.len(), input.len());
    assert!(output.stdout == input);
    outputs.push(output);

    // Without -i the command has no stdin: `cat` reads EOF at once.
    let output = with_stdin(exec(&[&id, "--", "cat"]), b"not for the command\n");
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(output.stdout, b"");
    outputs.push(output);

    // A command ended by SIGKILL: 128 + 9.
    let output = exec(&[&id, "--", "sh", "-c", "kill -9 $$"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(137), "{}", describe(&output));
    outputs.push(output);

    // Ctrl-C: the command is killed and omabox exits 130.
    let mut child = exec(&[&id, "--", "sh", "-c", "echo ready; exec sleep 1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "ready\n");
    // SAFETY: plain kill(2) on our own child's pid, not yet waited for.
    let rc = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    assert_eq!(rc, 0);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(130), "{}", describe(&output));
    outputs.push(output);
    // Our stdout closed (`| head -1`): the command gets SIGTERM, as SIGPIPE would end it.
    let mut child = exec(&[&id, "--", "yes"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    assert_eq!(line, "y\n");
    drop(reader);
    let output = child.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(143), "{}", describe(&output));
    outputs.push(output);

    // The sleep is gone: it is not among the sandbox's processes (SIGKILL was sent before
    // omabox exited; its death may take a moment to show).
    let mut listed = String::new();
    for _ in 0..50 {
        let output = exec(&[
            &id,
            "--",
            "sh",
            "-c",
            "cat /proc/[0-9]*/cmdline | tr '\\0' ' '",
        ])
        .output()
        .unwrap();
        assert!(output.status.success(), "{}", describe(&output));
        listed = String::from_utf8_lossy(&output.stdout).into_owned();
        outputs.push(output);
        if !listed.contains("sleep 1000") {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(!listed.contains("sleep 1000"), "{listed}");

    for output in &outputs {
        let all = [&output.stdout[..], &output.stderr[..]].concat();
        assert!(
            !String::from_utf8_lossy(&all).contains(&token),
            "{}",
            describe(output)
        );
    }
}

#[test]
fn an_unknown_sandbox_or_a_wrong_key_is_named_never_the_key() {
    if !linux_available() {
        return;
    }
    let dirs = TestDirs::new("sandbox-exec-refused");
    let serve = start_serve(&dirs);
    let url = serve.url();
    let url = url.as_str();

    let output = sandbox(&dirs, url, None, &["exec", "nosuchsandbox", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains(&format!("no sandbox nosuchsandbox in the serve at {url}")),
        "{errors}"
    );
    assert!(output.stdout.is_empty());

    let (id, token) = create(&dirs, url);
    let wrong = "omk_not-the-operator-key-4242";
    let output = sandbox(&dirs, url, Some(wrong), &["exec", &id, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("refused the operator key (401)") && errors.contains("OMABOX_API_KEY"),
        "{errors}"
    );
    assert!(
        !errors.contains(wrong) && !errors.contains(&token),
        "{errors}"
    );
    assert!(output.stdout.is_empty());
}

#[test]
fn no_serve_at_the_url_says_so() {
    let dirs = TestDirs::new("sandbox-exec-none");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = sandbox(&dirs, &url, Some("omk_any"), &["exec", "x", "--", "true"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains(&format!(
            "no omabox serve at {url}: connection refused; start it with `omabox serve`"
        )),
        "{errors}"
    );

    // A user name that cannot travel in `Authorization: Basic` is a usage error, not a
    // misleading "no serve".
    let output = sandbox(
        &dirs,
        &url,
        Some("omk_any"),
        &["exec", "--user", "a\nb", "x", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("a user name is"),
        "{}",
        describe(&output)
    );
}

/// A loopback "serve" that answers the connect route with `token` and every
/// `process.Process` call with `status` and `body` (a hostile server).
fn fake_serve(token: &'static str, status: &'static str, body: Vec<u8>) -> String {
    use std::io::Read as _;
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
            let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0);
            let mut request_body = vec![0u8; length];
            let _ = stream.read_exact(&mut request_body);
            let (status, kind, answer) = if head.contains("/connect ") {
                let sandbox = serde_json::json!({"sandboxID": "x", "envdAccessToken": token});
                (
                    "200 OK",
                    "application/json",
                    sandbox.to_string().into_bytes(),
                )
            } else {
                (status, "application/connect+json", body.clone())
            };
            let _ = write!(
                stream,
                "HTTP/1.1 {status}\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                answer.len()
            );
            let _ = stream.write_all(&answer);
        }
    });
    url
}

fn envelope(flags: u8, message: &str) -> Vec<u8> {
    let mut frame = vec![flags];
    frame.extend_from_slice(&u32::try_from(message.len()).unwrap().to_be_bytes());
    frame.extend_from_slice(message.as_bytes());
    frame
}

#[test]
fn what_a_hostile_serve_says_is_escaped_capped_and_the_token_never_shown() {
    let dirs = TestDirs::new("sandbox-exec-hostile");
    let token = "tok-secret-0123456789";
    let exec = |url: &str| {
        sandbox(&dirs, url, Some("omk_any"), &["exec", "x", "--", "true"])
            .output()
            .unwrap()
    };

    // An error ending the stream: one escaped line, after the output that came first.
    let hostile = "\u{1b}]0;owned\u{7}\u{1b}[2J\nomabox: fake line\u{202e}";
    let end = serde_json::json!({"error": {"code": "internal", "message": hostile}});
    let mut body = envelope(0, r#"{"event":{"data":{"stdout":"aGkK"}}}"#);
    body.extend(envelope(2, &end.to_string()));
    let output = exec(&fake_serve(token, "200 OK", body));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(output.stdout, b"hi\n");
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("internal: \\u{1b}]0;owned\\u{7}\\u{1b}[2J\\nomabox: fake line\\u{202e}"),
        "{errors:?}"
    );
    assert!(
        !errors.contains('\u{1b}') && errors.lines().count() == 1,
        "{errors:?}"
    );

    // A message longer than the cap is refused from its header, not read.
    let mut body = vec![0u8];
    body.extend_from_slice(&(5u32 << 20).to_be_bytes());
    body.extend_from_slice(b"{}");
    let output = exec(&fake_serve(token, "200 OK", body));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("over the 4194304-byte cap"), "{errors}");

    // The stream ending before the process did.
    let body = envelope(0, r#"{"event":{"start":{"pid":3}}}"#);
    let output = exec(&fake_serve(token, "200 OK", body));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("ended without its end message"), "{errors}");

    // The token refused: named as the sandbox's, never shown.
    let refused = serde_json::json!({"code": 401, "message": "bad token"}).to_string();
    let output = exec(&fake_serve(token, "401 Unauthorized", refused.into_bytes()));
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("refused sandbox x's access token (401)"),
        "{errors}"
    );
    assert!(!errors.contains(token), "{errors}");

    // A sandbox gone between the connect and the start (serve's 502 for it).
    let gone = serde_json::json!({"code": 502, "message": "The sandbox \"x\" was not found"});
    let output = exec(&fake_serve(
        token,
        "502 Bad Gateway",
        gone.to_string().into_bytes(),
    ));
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(errors.contains("no sandbox x in the serve at"), "{errors}");
}
