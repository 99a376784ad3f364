//! `omabox sandbox run` driven as a user would: the real binary, real sandboxes, real
//! pipes and signals. Every linux test runs in its own runtime dir and cgroup parent and
//! checks afterwards that no state dir, cgroup, process or temporary workspace is left.
//!
//! Tests needing linux sandboxes (root, namespaces, cgroups, the `omabox-sandbox-init`
//! binary next to `omabox`) skip with a printed reason where those are missing, and fail
//! under `CI=true`.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

use common::{init_bin, omabox_bin};
use omabox_backend_linux::factory::{CGROUP_PARENT_ENV, INIT_ENV, RUNTIME_DIR_ENV};

/// A private runtime dir, cgroup parent and TMPDIR for one test; checks on drop that
/// nothing is left in any of them.
struct Linux {
    runtime_dir: tempfile::TempDir,
    tmp: tempfile::TempDir,
    cgroup_parent: String,
}

/// `Some` when linux sandboxes can run here; otherwise prints why and returns `None`,
/// or fails under `CI=true`.
fn linux() -> Option<Linux> {
    if !common::linux_available() {
        return None;
    }
    let runtime_dir = tempfile::tempdir().unwrap();
    let cgroup_parent = format!(
        "omabox-cli-test-{}",
        runtime_dir.path().file_name().unwrap().to_string_lossy()
    );
    Some(Linux {
        runtime_dir,
        tmp: tempfile::tempdir().unwrap(),
        cgroup_parent,
    })
}

impl Linux {
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(omabox_bin());
        c.args(["sandbox", "run"])
            .args(args)
            .env(RUNTIME_DIR_ENV, self.runtime_dir.path())
            .env(CGROUP_PARENT_ENV, &self.cgroup_parent)
            .env(INIT_ENV, init_bin())
            .env("TMPDIR", self.tmp.path())
            .env_remove("OPENMA_TEST_SANDBOX_PROVIDER")
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("SANDBOX_IMAGE");
        c
    }

    /// `omabox reap` over this test's runtime dir and cgroup parent.
    fn reap_command(&self, data_dir: &std::path::Path) -> Command {
        let mut c = Command::new(omabox_bin());
        c.arg("--data-dir")
            .arg(data_dir)
            .arg("reap")
            .env(RUNTIME_DIR_ENV, self.runtime_dir.path())
            .env(CGROUP_PARENT_ENV, &self.cgroup_parent)
            .env(INIT_ENV, init_bin())
            .env("TMPDIR", self.tmp.path())
            .env_remove("OMABOX_FAULT_POINT")
            .stdin(Stdio::null());
        c
    }

    /// Runs `omabox reap` (which must succeed) and asserts that nothing is left: no
    /// sandbox, and no temporary workspace of a killed run.
    fn reap_and_assert_nothing_left(&self, data_dir: &std::path::Path) {
        let reap = self
            .reap_command(data_dir)
            .output()
            .expect("omabox reap runs");
        assert!(reap.status.success(), "{}", text(&reap.stderr));
        self.assert_nothing_left();
    }

    /// Runs with stdin at /dev/null and collects the output.
    /// Starts `omabox sandbox run ARGS` (stdin closed) and reads its stdout by lines.
    fn spawn_lines(
        &self,
        args: &[&str],
    ) -> (
        std::process::Child,
        std::io::Lines<BufReader<std::process::ChildStdout>>,
    ) {
        let mut child = self
            .command(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("omabox starts");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        (child, lines)
    }

    fn run(&self, args: &[&str]) -> Output {
        self.command(args)
            .stdin(Stdio::null())
            .output()
            .expect("omabox runs")
    }

    fn cgroup_parents(&self) -> Vec<PathBuf> {
        common::cgroup_parent_dirs(&self.cgroup_parent)
    }

    /// No state dir, no sandbox cgroup, no process in one, no temporary workspace.
    fn assert_nothing_left(&self) {
        self.assert_no_sandbox_left();
        let tmp: Vec<_> = std::fs::read_dir(self.tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(tmp.is_empty(), "temporary workspace left: {tmp:?}");
    }

    /// No state dir, no sandbox cgroup, no process in one. A one-shot PID 1 may still be
    /// finishing its exit in the cgroup parent for a moment after `sandbox run` returned
    /// (the run does not wait for that when the sandbox holds no host directory): it is
    /// given a second to go.
    fn assert_no_sandbox_left(&self) {
        let state: Vec<_> = std::fs::read_dir(self.runtime_dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        assert!(state.is_empty(), "state dirs left: {state:?}");
        for parent in self.cgroup_parents() {
            if let Ok(entries) = std::fs::read_dir(&parent) {
                let dirs: Vec<_> = entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect();
                assert!(dirs.is_empty(), "cgroups left under {parent:?}: {dirs:?}");
            }
        }
        let in_cgroup = || -> Vec<_> {
            std::fs::read_dir("/proc")
                .unwrap()
                .flatten()
                .filter(|e| {
                    std::fs::read_to_string(e.path().join("cgroup"))
                        .is_ok_and(|c| c.contains(&self.cgroup_parent))
                })
                .map(|e| e.file_name())
                .collect()
        };
        let deadline = Instant::now() + Duration::from_secs(1);
        let mut left = in_cgroup();
        while !left.is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
            left = in_cgroup();
        }
        assert!(left.is_empty(), "processes left: {left:?}");
    }
}

impl Drop for Linux {
    fn drop(&mut self) {
        for parent in self.cgroup_parents() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn echo_hi_and_exit_3() {
    let Some(lx) = linux() else { return };
    let out = lx.run(&["--", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!(text(&out.stdout), "hi\n");
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    lx.assert_nothing_left();
}

#[test]
fn a_bare_program_name_is_searched_in_path_like_execvp() {
    // PID 1 skips the PATH entries where the program is missing without starting a
    // process for each; what exists but cannot run is still tried, and refused.
    let Some(lx) = linux() else { return };
    let ws = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    let make = |dir: &str, mode: u32| {
        std::fs::create_dir_all(ws.path().join(dir)).unwrap();
        let prog = ws.path().join(dir).join("omabox-prog");
        std::fs::write(&prog, format!("#!/bin/sh\necho from {dir}\n")).unwrap();
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    make("plain", 0o644);
    std::fs::create_dir_all(ws.path().join("dir/omabox-prog")).unwrap();
    make("good", 0o755);
    make("later", 0o755);
    let run = |path: &str| {
        let path = format!("PATH={path}");
        let ws = ws.path().to_str().unwrap();
        lx.run(&["--workspace", ws, "-e", &path, "--", "omabox-prog"])
    };
    let out = run(
        "/workspace/missing:/workspace/plain:/workspace/dir:/workspace/good:/workspace/later:/usr/bin",
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from good\n");
    // Only a file that may not be executed: refused as such, not "not found" (both exit
    // 127: the command did not start).
    for (path, why) in [
        (
            "/workspace/missing:/workspace/plain:/workspace/dir",
            "Permission denied",
        ),
        ("/workspace/missing", "No such file"),
    ] {
        let out = run(path);
        assert_eq!(
            out.status.code(),
            Some(127),
            "{path}: {}",
            text(&out.stderr)
        );
        assert!(
            text(&out.stderr).contains(why),
            "{path}: {}",
            text(&out.stderr)
        );
    }
    lx.assert_nothing_left();
}

#[test]
fn the_command_may_use_every_cpu_omabox_may() {
    // PID 1 is kept off the CLI's CPU while it starts (see `oneshot::fork_into`) and must
    // give the command the whole mask back.
    let Some(lx) = linux() else { return };
    let out = lx
        .command(&["--", "grep", "Cpus_allowed_list", "/proc/self/status"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let ours = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = ours
        .lines()
        .find(|l| l.starts_with("Cpus_allowed_list"))
        .unwrap();
    assert_eq!(text(&out.stdout).trim(), ours);
}

#[test]
fn without_a_workspace_nothing_of_the_sandbox_is_on_the_host() {
    // No --workspace: /workspace is a tmpfs of the sandbox's own, so nothing the sandbox
    // writes lands in a host directory (other host users cannot read it, a killed run
    // leaves nothing to sweep), and it holds no more than the memory limit allows.
    let Some(lx) = linux() else { return };
    let (mut child, mut lines) = lx.spawn_lines(&[
        "--",
        "sh",
        "-c",
        "stat -f -c %T /workspace; stat -c '%a %u' /workspace; echo x > f && cat f; exec sleep 5",
    ]);
    let mut next = || lines.next().unwrap().unwrap();
    assert_eq!(next(), "tmpfs");
    assert_eq!(next(), "755 0", "/workspace belongs to the sandbox's root");
    assert_eq!(next(), "x");
    let entries: Vec<_> = std::fs::read_dir(lx.tmp.path())
        .unwrap()
        .flatten()
        .collect();
    assert!(entries.is_empty(), "host TMPDIR: {entries:?}");
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().unwrap();

    let out = lx.run(&[
        "--memory",
        "32M",
        "--",
        "sh",
        "-c",
        "dd if=/dev/zero of=/workspace/big bs=1M count=64 2>&1; echo rc=$?",
    ]);
    let said = text(&out.stdout);
    assert!(said.contains("No space left on device"), "{said}");
    assert!(!said.contains("rc=0"), "{said}");
    lx.assert_nothing_left();
}

#[test]
fn output_to_a_terminal_arrives_as_text_only() {
    use std::os::unix::fs::OpenOptionsExt as _;
    // OSC 52 would set the host's clipboard, OSC 0 its window title, and `CSI 6 n` makes
    // the terminal type a report into the next reader's input: none of that may reach a
    // terminal of ours. Colours do; a pipe gets every byte.
    let Some(lx) = linux() else { return };
    let script = r"printf 'a\033]52;c;ZXZpbA==\007b\033[6nc\033[31md\033[0m\n'; printf 'e\033]0;t\007f\n' >&2";
    // SAFETY: posix_openpt/grantpt/unlockpt/ptsname_r on a fresh master fd and a local
    // buffer; the fds are owned by the `File`s made from them.
    let (master, slave) = unsafe {
        let m = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(m >= 0);
        assert_eq!(libc::grantpt(m), 0);
        assert_eq!(libc::unlockpt(m), 0);
        let mut name = [0 as libc::c_char; 64];
        assert_eq!(libc::ptsname_r(m, name.as_mut_ptr(), name.len()), 0);
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_str()
            .unwrap()
            .to_owned();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY)
            .open(path)
            .unwrap();
        (
            <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(m),
            slave,
        )
    };
    let status = lx
        .command(&["--", "sh", "-c", script])
        .stdin(Stdio::null())
        .stdout(slave.try_clone().unwrap())
        .stderr(slave)
        .status()
        .unwrap();
    assert!(status.success());
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    let mut master = master;
    // Every slave fd is closed: the master reads what is buffered, then EIO.
    while let Ok(n) = std::io::Read::read(&mut master, &mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.contains("abc\x1b[31md\x1b[0m"), "{seen:?}");
    assert!(seen.contains("ef"), "{seen:?}");
    assert!(
        !seen.contains("\x1b]") && !seen.contains("\x1b[6n"),
        "{seen:?}"
    );
    let raw = lx.run(&["--", "sh", "-c", script]);
    assert!(text(&raw.stdout).contains("\x1b]52;c;ZXZpbA==\x07b\x1b[6n"));
    assert!(text(&raw.stderr).contains("\x1b]0;t\x07f"));
    lx.assert_nothing_left();
}

#[test]
fn stdin_is_forwarded_until_eof() {
    let Some(lx) = linux() else { return };
    let mut child = lx
        .command(&["--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"abc").unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.stdout, b"abc");
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));

    // Binary-exact in both directions, more than one window's worth.
    let payload: Vec<u8> = (0..=255u8).cycle().take(1 << 20).collect();
    let mut child = lx
        .command(&["--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let sent = payload.clone();
    let writer = std::thread::spawn(move || stdin.write_all(&sent).unwrap());
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    assert!(
        out.stdout == payload,
        "bytes differ ({} received)",
        out.stdout.len()
    );
    lx.assert_nothing_left();
}

#[test]
fn a_null_or_closed_stdin_does_not_hang() {
    let Some(lx) = linux() else { return };
    let out = lx.run(&["--", "sh", "-c", "cat; echo done"]);
    assert_eq!(text(&out.stdout), "done\n");
    // A command that never reads stdin ends while ours is still open.
    let mut child = lx
        .command(&["--", "true"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _keep_open = child.stdin.take();
    let status = wait_timeout(&mut child, Duration::from_secs(20)).expect("omabox exits");
    assert_eq!(status, Some(0));
    lx.assert_nothing_left();
}

#[test]
fn a_killed_command_exits_128_plus_the_signal() {
    let Some(lx) = linux() else { return };
    let out = lx.run(&["--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(128 + 9));
    lx.assert_nothing_left();
}

/// A mistyped option before the command is refused as an option (usage, exit 2), not run
/// as the command; the command's own options after its first word stay its own.
#[test]
fn a_mistyped_option_is_refused_not_run_as_the_command() {
    let out = Command::new(omabox_bin())
        .args(["sandbox", "run", "--memroy", "32M", "--", "echo", "hi"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("unexpected argument '--memroy'"),
        "{stderr}"
    );
    assert!(!stderr.contains("cannot run"), "{stderr}");
    let Some(lx) = linux() else { return };
    let out = lx.run(&["sh", "-c", "echo \"$@\"", "x", "-a", "--b"]);
    assert_eq!(text(&out.stdout), "-a --b\n");
    let out = lx.run(&["--", "-no-such-program"]);
    assert_eq!(out.status.code(), Some(127));
    lx.assert_nothing_left();
}

/// omabox's data directory (its store holds the vault's secrets) is never a sandbox's
/// `/workspace`, nor a directory holding it.
#[test]
fn the_data_directory_is_never_bound_as_the_workspace() {
    let Some(lx) = linux() else { return };
    let data = lx.tmp.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("omabox.db"), "secret").unwrap();
    for (dir, relation) in [(&data, "is"), (&lx.tmp.path().to_path_buf(), "holds")] {
        let out = lx
            .command(&[
                "--workspace",
                dir.to_str().unwrap(),
                "--",
                "cat",
                "/workspace/omabox.db",
            ])
            .env("OMABOX_DATA_DIR", &data)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("{relation} omabox's data directory")),
            "{stderr}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("secret"));
    }
    std::fs::remove_dir_all(&data).unwrap();
    lx.assert_no_sandbox_left();
}

/// A command the memory limit killed is named as such, with the limit (not a bare 137);
/// so is a process of the command's; a plain SIGKILL is not.
#[test]
fn an_out_of_memory_kill_is_named_with_the_limit() {
    let Some(lx) = linux() else { return };
    let dd = ["dd", "if=/dev/zero", "of=/dev/null", "bs=256M", "count=1"];
    let mut args = vec!["--memory", "32M", "--"];
    args.extend(dd);
    let out = lx.run(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{stderr}");
    assert!(
        stderr.contains("omabox: dd: killed: out of memory (limit 32 MiB)"),
        "{stderr}"
    );
    let script = format!("{}; exit 3", dd.join(" "));
    let out = lx.run(&["--memory", "32M", "--", "sh", "-c", &script]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert!(
        stderr
            .contains("omabox: a process in the sandbox was killed: out of memory (limit 32 MiB)"),
        "{stderr}"
    );
    let out = lx.run(&["--memory", "32M", "--", "sh", "-c", "kill -9 $$"]);
    assert_eq!(out.status.code(), Some(137));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("out of memory"));
    lx.assert_nothing_left();
}

#[test]
fn stdout_and_stderr_stay_separate() {
    let Some(lx) = linux() else { return };
    let out = lx.run(&["--", "sh", "-c", "echo to-out; echo to-err >&2; exit 0"]);
    assert_eq!(text(&out.stdout), "to-out\n");
    assert_eq!(text(&out.stderr), "to-err\n");
    assert!(out.status.success());
    lx.assert_nothing_left();
}

#[test]
fn workspace_writes_land_in_the_given_directory_and_env_flags_apply() {
    let Some(lx) = linux() else { return };
    let ws = tempfile::tempdir().unwrap();
    let out = lx.run(&[
        "--workspace",
        ws.path().to_str().unwrap(),
        "--env",
        "GREETING=hello there",
        "--memory",
        "256M",
        "--pids",
        "64",
        "--cpus",
        "0.5",
        "--",
        "sh",
        "-c",
        "pwd; echo \"$GREETING\" > /workspace/greeting.txt",
    ]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "/workspace\n");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("greeting.txt")).unwrap(),
        "hello there\n"
    );
    lx.assert_nothing_left();
    assert!(ws.path().exists(), "a given workspace is kept");
}

#[test]
fn readonly_binds_are_seen_but_cannot_be_written() {
    let Some(lx) = linux() else { return };
    let shared = tempfile::tempdir().unwrap();
    std::fs::write(shared.path().join("tool.txt"), "from the host\n").unwrap();
    let out = lx
        .command(&[
            "--",
            "sh",
            "-c",
            "cat /opt/omabox/tool/tool.txt; touch /opt/omabox/tool/new 2>/dev/null && echo WROTE; \
             echo x >> /opt/omabox/tool/tool.txt 2>/dev/null && echo APPENDED; true",
        ])
        .env(
            "OMABOX_LINUX_READONLY_BINDS",
            format!("{}:/opt/omabox/tool", shared.path().display()),
        )
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "from the host\n");
    assert!(!shared.path().join("new").exists());
    let bad = lx
        .command(&["--", "true"])
        .env("OMABOX_LINUX_READONLY_BINDS", "/etc:relative")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "stderr: {}", text(&bad.stderr));
    assert!(text(&bad.stderr).contains("OMABOX_LINUX_READONLY_BINDS"));
    lx.assert_nothing_left();
}

/// PID 1 is forked before the plan is worked out; a run refused after that (a bad value,
/// a missing image, a bad env) leaves no process behind. Run under a child subreaper, a
/// PID 1 the CLI did not reap would become the subreaper's child.
#[test]
fn a_run_refused_after_the_fork_leaves_no_process() {
    let Some(lx) = linux() else { return };
    let subreaper = r#"
import ctypes, os, subprocess, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
code = subprocess.run(sys.argv[1:], stderr=subprocess.DEVNULL).returncode
time.sleep(0.3)
try:
    pid, _ = os.waitpid(-1, os.WNOHANG)
except ChildProcessError:
    pid = 0
print(code, "orphan" if pid else "none")
"#;
    let missing = lx.tmp.path().join("no-such-image");
    for args in [
        vec!["--memory", "lots", "--", "true"],
        vec!["--image", missing.to_str().unwrap(), "--", "true"],
        vec!["--", ""],
    ] {
        let cli = lx.command(&args);
        let out = Command::new("python3")
            .args(["-c", subreaper])
            .arg(cli.get_program())
            .args(cli.get_args())
            .envs(cli.get_envs().filter_map(|(k, v)| Some((k, v?))))
            .output()
            .unwrap();
        let said = text(&out.stdout).trim().to_owned();
        assert!(
            said.ends_with(" none"),
            "{args:?}: {said} {}",
            text(&out.stderr)
        );
        assert_ne!(said, "0 none", "{args:?} should have been refused");
    }
    lx.assert_nothing_left();
}

/// The one-shot path (PID 1 forked from `omabox` itself) isolates like the agent path:
/// no capabilities, no_new_privs, seccomp, its own user ids, no terminal, only `lo`, no
/// fd of ours, and nothing of our command line or environment readable through PID 1.
#[test]
fn the_command_is_isolated_and_sees_nothing_of_the_host_process() {
    let Some(lx) = linux() else { return };
    let script = "grep -E '^(CapEff|CapPrm|CapBnd|NoNewPrivs|Seccomp):' /proc/self/status; \
                  echo uid_map $(cat /proc/self/uid_map); \
                  set -- /proc/$$/fd/*; echo fds $#; \
                  echo pid1 $(tr '\\0' ' ' < /proc/1/cmdline); \
                  cat /proc/1/environ >/dev/null 2>&1 && echo environ readable; \
                  echo ifaces $(ls /sys/class/net 2>/dev/null || cut -d: -f1 /proc/net/dev | tail -n +3); \
                  (exec 3</dev/tty) 2>/dev/null && echo tty opened; \
                  env | grep -c OMABOX_TEST_SECRET";
    let out = lx
        .command(&["--", "sh", "-c", script])
        .env("OMABOX_TEST_SECRET", "do-not-leak-4711")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(!stdout.contains("do-not-leak"), "{stdout}");
    for line in [
        "CapEff:\t0000000000000000",
        "CapPrm:\t0000000000000000",
        "CapBnd:\t0000000000000000",
        "NoNewPrivs:\t1",
        "Seccomp:\t2",
        // 0, 1, 2 and the glob's own directory fd: nothing else is open.
        "fds 4\n",
        "pid1 omabox-sandbox-init",
    ] {
        assert!(stdout.contains(line), "{line:?} missing in {stdout}");
    }
    assert!(!stdout.contains("environ readable"), "{stdout}");
    assert!(!stdout.contains("tty opened"), "{stdout}");
    assert!(stdout.contains("ifaces lo\n"), "{stdout}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As root: uid 0 inside is a range of its own, far from host root.
        let map = stdout
            .lines()
            .find_map(|l| l.strip_prefix("uid_map "))
            .unwrap();
        let base: u64 = map.split_whitespace().nth(1).unwrap().parse().unwrap();
        assert!(base >= 1 << 30, "{map}");
    }
    // The env the command sees is the plan's plus --env, never ours.
    assert!(stdout.ends_with("0\n"), "{stdout}");
    assert_eq!(out.status.code(), Some(1), "grep -c exits 1 on no match");
    lx.assert_nothing_left();
}

#[test]
fn the_sandboxs_pid1_holds_nothing_of_the_hosts_environment() {
    // PID 1 is a fork of `omabox`, so it starts with a copy of the user's environment
    // (tokens, keys). It lives in the sandbox's namespaces next to the untrusted command:
    // nothing of that environment may stay in its memory. Read as host root, the whole of
    // it: the canary is in the host process and nowhere in PID 1.
    let Some(lx) = linux() else { return };
    const CANARY: &str = "omabox-canary-5be1c0de-do-not-keep";
    let mut child = lx
        .command(&["--", "sh", "-c", "echo ready; exec sleep 30"])
        .env("OMABOX_TEST_HOST_TOKEN", CANARY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let host = child.id();
    let pid1 = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(host)
            })
        })
        .expect("the sandbox's PID 1 is a child of omabox");
    let holds = |pid: u32| -> bool {
        use std::io::{Read as _, Seek as _, SeekFrom};
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
        maps.lines().any(|line| {
            let range = line.split_whitespace().next().unwrap();
            let (start, end) = range.split_once('-').unwrap();
            let start = u64::from_str_radix(start, 16).unwrap();
            let end = u64::from_str_radix(end, 16).unwrap();
            let mut buf = vec![0u8; (end - start) as usize];
            // Unreadable regions ([vvar], guard pages) are skipped.
            mem.seek(SeekFrom::Start(start)).is_ok()
                && mem.read_exact(&mut buf).is_ok()
                && buf.windows(CANARY.len()).any(|w| w == CANARY.as_bytes())
        })
    };
    let in_host = holds(host);
    let in_pid1 = holds(pid1);
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(host as i32, libc::SIGTERM) };
    child.wait().unwrap();
    assert!(
        in_host,
        "positive control: the canary is in omabox's own memory"
    );
    assert!(
        !in_pid1,
        "PID 1 ({pid1}) still holds the host's environment"
    );
    lx.assert_nothing_left();
}

/// `omabox sandbox run` killed at every step of its start leaves nothing `omabox reap`
/// does not remove: the one-shot PID 1, forked before the state dir exists, dies with
/// its host; from the owner record on, the reap finds the rest.
#[test]
fn a_killed_run_leaves_nothing_reap_cannot_find() {
    let Some(lx) = linux() else { return };
    let data = tempfile::tempdir().unwrap();
    for point in [
        "linux-start-cloned",
        "linux-start-state-dir",
        "linux-start-cgroup",
        "linux-start-userns",
        "linux-start-plan-sent",
        "linux-start-go-sent",
        "linux-start-identity",
    ] {
        let out = lx
            .command(&["--", "sleep", "30"])
            .env("OMABOX_TEST_MODE", "1")
            .env("OMABOX_FAULT_POINT", point)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt as _;
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{point}");
    }
    lx.reap_and_assert_nothing_left(data.path());
}

/// PID 1 makes its own cgroup (v1, as root) once it has the plan, before the go: a host
/// killed in between leaves a PID 1 that sees the control channel close and removes that
/// cgroup itself (it is not in it yet), so nothing hinges on when `omabox reap` runs.
#[test]
fn a_host_killed_before_the_go_leaves_no_cgroup_behind() {
    let Some(lx) = linux() else { return };
    let out = lx
        .command(&["--", "sleep", "30"])
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_FAULT_POINT", "linux-start-cgroup")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(out.status.signal(), Some(libc::SIGKILL));
    let sandbox_cgroups = || {
        lx.cgroup_parents()
            .iter()
            .filter_map(|p| std::fs::read_dir(p).ok())
            .flat_map(|d| d.flatten().map(|e| e.path()).filter(|p| p.is_dir()))
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !sandbox_cgroups().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(sandbox_cgroups(), Vec::<PathBuf>::new(), "before any reap");
    let data = tempfile::tempdir().unwrap();
    lx.reap_and_assert_nothing_left(data.path());
}

/// A tiny rootfs from the host (dash as /bin/sh, cat, their libraries, a marker file)
/// packed by GNU tar as a gzip tarball.
fn tiny_rootfs_tarball(dir: &std::path::Path) -> PathBuf {
    let root = dir.join("rootfs");
    let copy = |from: &std::path::Path, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    for (bin, at) in [("/bin/sh", "bin/sh"), ("/bin/cat", "bin/cat")] {
        let real = std::fs::canonicalize(bin).unwrap();
        copy(&real, root.join(at));
        let ldd = Command::new("ldd").arg(&real).output().unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
                let p = PathBuf::from(p);
                copy(&p, root.join(p.strip_prefix("/").unwrap()));
            }
        }
    }
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::write(root.join("etc/image-marker"), "from-image\n").unwrap();
    let tarball = dir.join("image.tgz");
    let status = Command::new("tar")
        .args(["--numeric-owner", "-czf"])
        .arg(&tarball)
        .arg("-C")
        .arg(&root)
        .arg(".")
        .status()
        .expect("tar runs");
    assert!(status.success());
    tarball
}

#[test]
fn an_image_tarball_is_unpacked_into_the_cache_and_runs() {
    let Some(lx) = linux() else { return };
    let dir = tempfile::tempdir().unwrap();
    let tarball = tiny_rootfs_tarball(dir.path());
    let cache = dir.path().join("cache");
    for round in 0..2 {
        let out = lx
            .command(&[
                "--image",
                tarball.to_str().unwrap(),
                "--",
                "cat",
                "/etc/image-marker",
            ])
            .env("OMABOX_LINUX_IMAGE_CACHE", &cache)
            .stdin(Stdio::null())
            .output()
            .expect("omabox runs");
        assert_eq!(
            out.status.code(),
            Some(0),
            "round {round}: stderr: {}",
            text(&out.stderr)
        );
        assert_eq!(text(&out.stdout), "from-image\n");
        lx.assert_nothing_left();
    }
    let entries: Vec<_> = std::fs::read_dir(cache.join("sha256"))
        .unwrap()
        .flatten()
        .collect();
    assert_eq!(entries.len(), 1, "unpacked once: {entries:?}");

    // A value that is neither a path nor a registry reference is a usage error naming it.
    let out = lx.run(&["--image", "Debian 12", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("invalid image reference \"Debian 12\""),
        "{}",
        text(&out.stderr)
    );
    lx.assert_nothing_left();
}

#[test]
fn bad_arguments_fail_clearly_before_anything_starts() {
    let Some(lx) = linux() else { return };
    let out = lx.run(&["--memory", "lots", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--memory") && text(&out.stderr).contains("not a size"),
        "{}",
        text(&out.stderr)
    );
    let out = lx.run(&["--cpus", "0", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("--cpus"),
        "{}",
        text(&out.stderr)
    );
    let out = lx.run(&["--image", "/no/such/rootfs", "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("OMABOX_LINUX_IMAGE"));
    let tarball = lx.tmp.path().join("rootfs.tar");
    std::fs::write(&tarball, b"").unwrap();
    let out = lx.run(&["--image", tarball.to_str().unwrap(), "--", "true"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(
            "not a rootfs directory, an OCI image layout or a (gzip-compressed) tar archive"
        ),
        "{}",
        text(&out.stderr)
    );
    std::fs::remove_file(&tarball).unwrap();
    let out = lx.run(&["--workspace", "/no/such/dir", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let out = lx.run(&["--", "no-such-command-omabox"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(text(&out.stderr).contains("no-such-command-omabox"));
    let out = lx.run(&[]);
    assert_eq!(out.status.code(), Some(2));
    let out = lx.run(&["--allow-host", "10.0.0.1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("IP addresses are not allowed"),
        "{}",
        text(&out.stderr)
    );
    let out = lx.run(&[
        "--network",
        "none",
        "--allow-host",
        "pypi.org",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("need --network limited"),
        "{}",
        text(&out.stderr)
    );
    lx.assert_nothing_left();
}

/// The real registries through their own clients (the one kind of outside host these
/// tests reach): `pip download` and `npm pack` of one small package each, from a `limited`
/// sandbox that allows the package managers, and the same refused without.
#[test]
fn package_registries_are_reached_only_when_the_network_allows_them() {
    let Some(lx) = linux() else { return };
    let workspace = tempfile::tempdir().unwrap();
    let ws = workspace.path().to_str().unwrap();
    let fetch = "cd /workspace && rm -rf dl *.tgz; \
        pip download --no-deps --no-cache-dir --retries 0 --timeout 20 -d dl six==1.16.0 >pip.log 2>&1; \
        npm pack is-number@7.0.0 --fetch-retries=0 >npm.log 2>&1; \
        ls dl *.tgz 2>/dev/null; true";
    for (flags, reached) in [
        (&["--allow-package-managers"][..], true),
        (&["--network", "limited"][..], false),
        (&["--network", "none"][..], false),
    ] {
        let mut args = vec!["--workspace", ws, "-e", "HOME=/tmp"];
        args.extend_from_slice(flags);
        args.extend(["--", "sh", "-c", fetch]);
        let out = lx.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let listed = text(&out.stdout);
        let logs = || {
            ["pip.log", "npm.log"]
                .map(|f| std::fs::read_to_string(workspace.path().join(f)).unwrap_or_default())
                .join("\n")
        };
        for artifact in ["six-1.16.0-py2.py3-none-any.whl", "is-number-7.0.0.tgz"] {
            assert_eq!(
                listed.contains(artifact),
                reached,
                "{flags:?}: {artifact} in {listed:?}; logs:\n{}",
                logs()
            );
        }
    }
    lx.assert_nothing_left();
}

#[test]
fn sigint_is_forwarded_and_everything_is_destroyed() {
    let Some(lx) = linux() else { return };
    let (mut child, mut lines) = lx.spawn_lines(&[
        "--",
        "sh",
        "-c",
        "trap 'echo got-term; exit 7' TERM; echo ready; sleep 100 & wait",
    ]);
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGINT) };
    assert_eq!(lines.next().unwrap().unwrap(), "got-term");
    let status = wait_timeout(&mut child, Duration::from_secs(20)).expect("omabox exits");
    assert_eq!(status, Some(7));
    lx.assert_nothing_left();

    // A command that ignores SIGTERM is killed; the exit says so.
    let (mut child, mut lines) =
        lx.spawn_lines(&["--", "sh", "-c", "trap '' TERM; echo ready; sleep 100"]);
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    let pid = i32::try_from(child.id()).unwrap();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = wait_timeout(&mut child, Duration::from_secs(20)).expect("omabox exits");
    assert_eq!(status, Some(128 + 9));
    lx.assert_nothing_left();
}

#[test]
fn local_backend_needs_test_mode() {
    let tmp = tempfile::tempdir().unwrap();
    let base = |test_mode: bool| {
        let mut c = Command::new(omabox_bin());
        c.args(["sandbox", "run", "--backend", "local", "--"])
            .args(["sh", "-c", "echo hi; exit 3"])
            .env("TMPDIR", tmp.path())
            .env_remove("NODE_ENV")
            .stdin(Stdio::null());
        if test_mode {
            c.env("OMABOX_TEST_MODE", "1");
        } else {
            c.env_remove("OMABOX_TEST_MODE");
        }
        c.output().unwrap()
    };
    let out = base(false);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("OMABOX_TEST_MODE=1"),
        "{}",
        text(&out.stderr)
    );
    let out = base(true);
    assert_eq!(text(&out.stdout), "hi\n", "stderr: {}", text(&out.stderr));
    assert_eq!(out.status.code(), Some(3));
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "temporary workspace left: {left:?}");
}

/// Waits for `child` up to `limit`; kills it and returns `None` on timeout.
fn wait_timeout(child: &mut Child, limit: Duration) -> Option<Option<i32>> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status.code());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An image root's uid 0 keeps the file-ownership capabilities (so apt and dpkg work), but
/// only those, only for uid 0, and only inside the sandbox's own user namespace: no other
/// capability, none after a switch to another uid, no setuid modes, no mount, no unshare,
/// and nothing over a host file whose owner is outside the sandbox's id range.
#[test]
fn an_image_roots_uid_0_keeps_only_file_ownership_capabilities() {
    let Some(lx) = linux() else { return };
    let Some(rootfs) = common::debian_rootfs() else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    let outside = ws.path().join("outsider");
    std::fs::write(&outside, "private\n").unwrap();
    // Owned by a host id no sandbox range maps (ranges start at 2^30, 65,536 ids each).
    std::os::unix::fs::chown(&outside, Some(1 << 20), Some(1 << 20)).unwrap();
    std::fs::set_permissions(
        &outside,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let script = "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status | tr -s '\\t ' ' '
echo --
setpriv --reuid=1000 --regid=1000 --clear-groups grep -E '^Cap(Prm|Eff):' /proc/self/status | tr -s '\\t ' ' '
echo --
touch /workspace/mine
chown 1000:1000 /workspace/mine && echo chown-in-range-ok
chown 70000 /workspace/mine 2>/dev/null || echo chown-out-of-range-refused
chmod u+s /workspace/mine 2>/dev/null || echo setuid-refused
cat /workspace/outsider 2>/dev/null || echo outsider-unreadable
chown 0 /workspace/outsider 2>/dev/null || echo outsider-chown-refused
mount -t tmpfs x /mnt 2>/dev/null || echo mount-refused
unshare -U true 2>/dev/null || echo unshare-refused
true";
    let out = lx.run(&[
        "--image",
        rootfs.to_str().unwrap(),
        "--workspace",
        ws.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut parts = stdout.split("--\n");
    for line in parts.next().unwrap().lines() {
        let (k, v) = line.split_once(':').unwrap();
        let want = match k {
            "NoNewPrivs" => "1",
            "Seccomp" => "2",
            // CHOWN, DAC_OVERRIDE, FOWNER, KILL, SETGID, SETUID.
            "CapPrm" | "CapEff" | "CapBnd" => "00000000000000eb",
            _ => "0000000000000000",
        };
        assert_eq!(v.trim(), want, "{k} in {stdout}");
    }
    for line in parts.next().unwrap().lines() {
        assert!(line.ends_with(" 0000000000000000"), "uid 1000 kept {line}");
    }
    let rest = parts.next().unwrap();
    for expected in [
        "chown-in-range-ok",
        "chown-out-of-range-refused",
        "setuid-refused",
        "outsider-unreadable",
        "outsider-chown-refused",
        "mount-refused",
        "unshare-refused",
    ] {
        assert!(rest.contains(expected), "{expected} missing in {stdout}");
    }
    // The host sees the chowned file with the sandbox's uid 1000 through the idmapped
    // workspace (disk uid 1000), never setuid; the outsider is untouched.
    let mine = std::fs::metadata(ws.path().join("mine")).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!((mine.uid(), mine.mode() & 0o6000), (1000, 0));
    let outsider = std::fs::metadata(&outside).unwrap();
    assert_eq!(outsider.uid(), 1 << 20);
    lx.assert_nothing_left();
}
