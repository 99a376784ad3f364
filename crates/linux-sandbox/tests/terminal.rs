//! A process in a pseudo-terminal (`ExecRequest::pty`, E2B's `pty`) inside a real
//! sandbox: its terminal comes from the sandbox's own devpts instance, through the
//! sandbox's seccomp filter and Landlock rules.

mod common;

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use common::{Sandboxed, can_run, test_plan};
use omabox_agent::ErrorKind;
use omabox_agent::client::ExecRequest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_process_gets_a_terminal_of_the_sandboxs_own_devpts() {
    if !can_run() {
        return;
    }
    let mut sb = Sandboxed::start(test_plan()).await;
    let script = "t=$(tty) && echo tty=$t; stty size; [ -t 0 ] && [ -t 1 ] && echo stdio-is-a-tty; \
                  stat -L -c tty-dev=%d $t; stat -c pts-dev=%d /dev/pts; echo TERM=$TERM";
    let out = sb
        .client
        .exec(
            ExecRequest::shell(script)
                .pty(100, 30)
                .timeout(Duration::from_secs(60)),
        )
        .await
        .expect("exec");
    let text = String::from_utf8_lossy(&out.stdout).replace('\r', "");
    assert!(out.success(), "{:?}: {text}", out.exit);
    assert!(out.stderr.is_empty(), "{:?}", out.stderr);
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {text:?}"))
            .to_owned()
    };
    assert!(field("tty=").starts_with("/dev/pts/"), "{text}");
    assert!(text.contains("30 100"), "{text}");
    assert!(text.contains("stdio-is-a-tty"), "{text}");
    assert_eq!(field("TERM="), "xterm-256color");
    // The terminal lives in the devpts mounted at the sandbox's /dev/pts, and that is an
    // instance of its own, not the host's.
    let pts = field("pts-dev=");
    assert_eq!(field("tty-dev="), pts, "{text}");
    let host_pts = std::fs::metadata("/dev/pts").expect("host /dev/pts").dev();
    assert_ne!(
        pts,
        host_pts.to_string(),
        "the sandbox's terminal is on the host's devpts"
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sandbox_out_of_terminals_says_so_and_recovers() {
    if !can_run() {
        return;
    }
    let mut sb = Sandboxed::start(test_plan()).await;
    // A process takes every terminal of the sandbox's devpts (128) and holds them.
    let hog = r#"
import os, time
fds = []
try:
    while True:
        fds.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
except OSError as e:
    print("full", len(fds), e.errno, flush=True)
time.sleep(600)
"#;
    let bg = sb
        .client
        .start_background(ExecRequest::argv(["python3", "-c", hog]))
        .await
        .expect("start the hog");
    eventually("the hog took every terminal", || async {
        bg.logs().await.expect("logs").stdout.contains("full")
    })
    .await;
    let logs = bg.logs().await.unwrap().stdout;
    assert!(logs.starts_with("full 128 "), "{logs}");
    let err = sb
        .client
        .spawn(ExecRequest::shell("tty").pty(80, 24))
        .await
        .unwrap_err();
    assert_eq!(err.remote_kind(), Some(ErrorKind::SpawnFailed), "{err}");
    assert!(
        err.to_string().contains("every pseudo-terminal is in use"),
        "{err}"
    );
    // Once they are closed, terminals open again.
    bg.kill("SIGKILL").await.unwrap();
    eventually("the hog ended", || async {
        bg.info().await.expect("status").exit.is_some()
    })
    .await;
    let out = sb
        .client
        .exec(ExecRequest::shell("tty").pty(80, 24))
        .await
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("/dev/pts/"),
        "{out:?}"
    );
    sb.destroy();
}

/// Polls `cond` until it holds; the deadline only bounds a hang.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cond().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
