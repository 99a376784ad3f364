//! An unlucky terminal: a stdout whose reader left (`omabox … | head`), a terminal that
//! closed under a run (SIGHUP). `omabox run` must neither panic nor skip its cleanup; a
//! reporting command ends quietly.

use std::os::fd::{FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn omabox(data: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .stdin(Stdio::null());
    command
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The write end of a pipe whose read end is already closed: every write fails (EPIPE).
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two fds into the array it is given.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both fds were just made and are owned here, once each.
    let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(read);
    Stdio::from(write)
}

/// The run's published revision of `session` (`omabox sessions --json`).
fn revision(data: &Path, session: &str) -> Option<u64> {
    let output = omabox(data, &["sessions", "--json"]).output().unwrap();
    let rows: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    rows.as_array()?
        .iter()
        .find(|row| row["session"] == session)
        .and_then(|row| row["revision"].as_u64())
}

#[test]
fn a_closed_stdout_neither_panics_nor_skips_the_runs_cleanup() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for json in [false, true] {
        let mut args = vec!["run", "--backend", "local", "--session", "s"];
        if json {
            args.push("--json");
        }
        args.extend(["--", "sh", "-c", "echo out; echo err >&2"]);
        let output = omabox(&data, &args).stdout(closed_pipe()).output().unwrap();
        let text = stderr(&output);
        assert!(!text.contains("panicked"), "{text}");
        assert_eq!(output.status.code(), Some(0), "{text}");
    }
    assert_eq!(revision(&data, "s"), Some(2), "both runs published");
    // A reporting command ends quietly (killed by SIGPIPE, as `cat` would be).
    let output = omabox(&data, &["sessions"])
        .stdout(closed_pipe())
        .output()
        .unwrap();
    let text = stderr(&output);
    assert!(!text.contains("panicked"), "{text}");
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{text}");
}

/// The commands that change state as they go (`gc`, `reap`, `image prune`) keep SIGPIPE
/// ignored: with stdout and stderr both closed they still finish their work, quietly, and
/// never panic half-way through it.
#[test]
fn state_changing_commands_finish_with_closed_stdout_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let output = omabox(
        &data,
        &["run", "--backend", "local", "--session", "s", "--", "true"],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    for args in [
        &["gc", "--grace", "0"][..],
        &["gc", "--grace", "0", "--json"],
        &["reap"],
        &["reap", "--json"],
        &["image", "prune"],
    ] {
        let output = omabox(&data, args)
            .stdout(closed_pipe())
            .stderr(closed_pipe())
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(
            (output.status.code(), output.status.signal()),
            (Some(0), None),
            "omabox {args:?} with closed stdout and stderr"
        );
    }
}

#[test]
fn a_terminal_that_closes_cancels_the_run_and_it_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut child = omabox(
        &data,
        &[
            "run",
            "--backend",
            "local",
            "--session",
            "hup",
            "--",
            "sh",
            "-c",
            "touch started; exec sleep 60",
        ],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // Wait until the harness runs (its workspace binding holds `started`).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !find(&data.join("runtime"), "started") {
        assert!(Instant::now() < deadline, "the harness never started");
        assert!(
            child.try_wait().unwrap().is_none(),
            "omabox run ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: plain kill(2) on our own child's pid.
    let hup = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    assert_eq!(hup, 0);
    let output = child.wait_with_output().unwrap();
    let text = stderr(&output);
    assert_eq!(output.status.code(), Some(130), "{text}");
    assert!(text.contains("SIGHUP: cancelling the run"), "{text}");
    // The fence was released: the session runs again at once, no conflict.
    let output = omabox(
        &data,
        &[
            "run",
            "--backend",
            "local",
            "--session",
            "hup",
            "--",
            "true",
        ],
    )
    .output()
    .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(revision(&data, "hup"), Some(1));
}

fn find(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|entry| {
            let path = entry.path();
            entry.file_name() == name
                || (entry.file_type().is_ok_and(|t| t.is_dir()) && find(&path, name))
        })
}
