//! `omabox sandbox run --backend gvisor` driven as a user would: the real binary, Debian's
//! runsc, the `omabox-gvisor-init` binary beside `omabox` (built with the workspace). Needs
//! root and runsc (scripts/setup installs it); a missing one skips with its reason, and
//! fails under `CI=true`.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "../../backends/linux/tests/internet/mod.rs"]
mod internet;

use common::{gvisor_missing as missing, omabox_bin};
use omabox_test_support::require_capability;

fn omabox(data: &Path) -> Command {
    let mut cmd = Command::new(omabox_bin());
    cmd.arg("--data-dir").arg(data);
    cmd
}

#[test]
fn runs_a_command_with_its_output_stdin_and_exit_code_and_refuses_what_it_does_not_serve() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let out = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "sh", "-c"])
        .arg("echo out; pwd; uname -r; echo err >&2; exit 3")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let mut lines = stdout.lines();
    assert_eq!(lines.next(), Some("out"));
    assert_eq!(lines.next(), Some("/workspace"));
    // gVisor's kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(lines.next(), Some(host.trim()));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");

    let mut cat = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    cat.stdin
        .take()
        .unwrap()
        .write_all(b"through the sandbox\n")
        .unwrap();
    let out = cat.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"through the sandbox\n");

    for refused in [&["--pids", "100"][..], &["--image", "debian:12"]] {
        let out = omabox(data.path())
            .args(["sandbox", "run", "--backend", "gvisor"])
            .args(refused)
            .args(["--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{refused:?}: {out:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("the gvisor backend"),
            "{out:?}"
        );
    }
    // Nothing of the runs is left.
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

#[test]
fn a_killed_omabox_leaves_nothing_running_and_reap_removes_the_rest() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let mut run = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--", "sh", "-c"])
        .arg("echo started; exec sleep 300")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 8];
    std::io::Read::read_exact(run.stdout.as_mut().unwrap(), &mut first).unwrap();
    assert_eq!(&first, b"started\n");
    run.kill().unwrap();
    run.wait().unwrap();

    // The sandbox's init reads the end of its stdin and stops everything in it.
    let marker = data.path().to_string_lossy().into_owned();
    let deadline = Instant::now() + Duration::from_secs(30);
    while processes_mentioning(&marker) > 0 {
        assert!(
            Instant::now() < deadline,
            "runsc processes of the killed run still live"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 1);

    let out = omabox(data.path()).args(["reap"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("gvisor sandboxes of dead omabox processes removed: 1"),
        "{out:?}"
    );
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 0);
    let listed = Command::new(omabox_backend_gvisor::locate_runsc().unwrap())
        .arg("--root")
        .arg(data.path().join("gvisor/runsc"))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    assert!(listed.stdout.is_empty(), "{listed:?}");
}

#[test]
fn the_memory_limit_stops_the_sandbox_and_says_so() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let allocate = |mib: u32| format!("x = bytearray({mib} << 20); print('allocated')");
    let out = omabox(data.path())
        .args([
            "sandbox",
            "run",
            "--backend",
            "gvisor",
            "--memory",
            "400M",
            "--cpus",
            "0.5",
        ])
        .args(["--", "python3", "-c"])
        .arg(allocate(20))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(out.stdout, b"allocated\n");

    let out = omabox(data.path())
        .args(["sandbox", "run", "--backend", "gvisor", "--memory", "100M"])
        .args(["--", "python3", "-c"])
        .arg(allocate(300))
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("memory limit of 100 MiB"),
        "{out:?}"
    );
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

/// Processes whose command line names `marker` (runsc's are given the data dir's paths).
fn processes_mentioning(marker: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(marker))
                .unwrap_or(false)
        })
        .count()
}

/// `omabox run --backend gvisor` in session `session` of `data`, with `envs`; its JSON
/// report and output.
fn run_gvisor(
    data: &Path,
    session: &str,
    envs: &[(&str, &str)],
    cmd: &[&str],
) -> (serde_json::Value, std::process::Output) {
    let output = omabox(data)
        .args(["run", "--json", "--backend", "gvisor", "--session", session])
        .arg("--")
        .args(cmd)
        .env_remove("OMABOX_LINUX_IMAGE")
        .env_remove("SANDBOX_IMAGE")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let report = serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    (report, output)
}

#[test]
fn omabox_run_backend_gvisor_keeps_the_workspace_between_runs_and_collects_outputs() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let (first, output) = run_gvisor(
        data.path(),
        "s1",
        &[],
        &[
            "sh",
            "-c",
            "echo one > /workspace/a && echo report > /mnt/session/outputs/r.txt && uname -r",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        first["result"],
        serde_json::json!({"type": "completed", "revision": 1}),
        "{first}"
    );
    assert_eq!(first["outputs"][0]["logicalPath"], "r.txt", "{first}");
    // The harness ran under gVisor's kernel, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains(host.trim()), "{stderr}");

    let (second, output) = run_gvisor(data.path(), "s1", &[], &["cat", "/workspace/a"]);
    assert!(output.status.success(), "{output:?}");
    assert_eq!(String::from_utf8_lossy(&output.stderr).trim(), "one");
    assert_eq!(second["restoredRevision"], 1, "{second}");
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

#[test]
fn omabox_run_backend_gvisor_applies_its_limits_probes_readiness_and_refuses_pids() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // The memory limit (the sandbox's cgroup) ends the sandbox, and the failure says so.
    let (report, output) = run_gvisor(
        data.path(),
        "oom",
        &[
            ("OMABOX_LINUX_MEMORY", "100M"),
            ("OMABOX_LINUX_CPUS", "0.5"),
        ],
        &[
            "python3",
            "-c",
            "x = bytearray(300 << 20); print('allocated')",
        ],
    );
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert_eq!(report["result"]["type"], "failed", "{report}");
    let message = report["result"]["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("memory limit of 100 MiB"), "{report}");
    // Under the limit the same run completes.
    let (report, output) = run_gvisor(
        data.path(),
        "ok",
        &[
            ("OMABOX_LINUX_MEMORY", "400M"),
            ("OMABOX_LINUX_CPUS", "0.5"),
        ],
        &[
            "python3",
            "-c",
            "x = bytearray(20 << 20); print('allocated')",
        ],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["result"]["type"], "completed", "{report}");

    // A harness the sandbox cannot run is refused by the readiness probe.
    let (report, output) = run_gvisor(data.path(), "ready", &[], &["no-such-harness-xyz"]);
    assert!(!output.status.success(), "{output:?}");
    let text = format!("{report} {}", String::from_utf8_lossy(&output.stderr));
    assert!(text.contains("Runtime environment is not ready"), "{text}");

    // A pids limit is refused before anything is made, saying why.
    let (_, output) = run_gvisor(
        data.path(),
        "pids",
        &[("OMABOX_LINUX_PIDS", "100")],
        &["true"],
    );
    assert!(!output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("the gvisor backend cannot limit"),
        "{stderr}"
    );
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

/// `get NAME`: the name looked up through the sandbox's resolver, then `GET /` to the
/// address it answered, printing the body's last line (`UNRESOLVED`, `ERROR ...`).
const GET: &str = r#"import socket, sys
try:
    a = socket.gethostbyname(sys.argv[1])
except OSError:
    print(sys.argv[1], "UNRESOLVED"); sys.exit()
try:
    s = socket.create_connection((a, 80), timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\nHost: " + sys.argv[1].encode() + b"\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk: break
        data += chunk
    print(sys.argv[1], data.decode().strip().splitlines()[-1])
except OSError as e:
    print(sys.argv[1], "ERROR", e)
"#;

#[test]
fn omabox_run_and_sandbox_run_backend_gvisor_enforce_the_network_policy() {
    if !require_capability(missing()) {
        return;
    }
    // The fake internet's server runs on a runtime's workers while this thread waits for
    // omabox.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let inet = internet::Internet::new();
    let web = inet.http(80, "web");
    let far = inet.far.to_string();
    let hosts = format!("allowed.test={far},denied.test={far}");
    let data = tempfile::tempdir().unwrap();
    let script = format!("for h in allowed.test denied.test; do python3 -c '{GET}' $h; done");
    let limited = r#"{"type":"limited","allowed_hosts":["allowed.test"]}"#;
    let (report, output) = run_gvisor(
        data.path(),
        "net",
        &[
            ("OMABOX_TEST_MODE", "1"),
            ("OMABOX_LINUX_TEST_HOSTS", &hosts),
            ("OMABOX_LINUX_NETWORK", limited),
        ],
        &["sh", "-c", &script],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("allowed.test web saw host allowed.test"),
        "{stderr}"
    );
    assert!(stderr.contains("denied.test UNRESOLVED"), "{stderr}");
    assert_eq!(web.accepts(), 1);

    // `none` (the default): no way out, the allowed name included.
    let (_, output) = run_gvisor(
        data.path(),
        "net",
        &[
            ("OMABOX_TEST_MODE", "1"),
            ("OMABOX_LINUX_TEST_HOSTS", &hosts),
        ],
        &["sh", "-c", &script],
    );
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("allowed.test UNRESOLVED"), "{stderr}");
    assert_eq!(web.accepts(), 1);

    // The one-shot command serves the same flags as the linux backend's.
    let out = omabox(data.path())
        .args([
            "sandbox",
            "run",
            "--backend",
            "gvisor",
            "--network",
            "limited",
        ])
        .args(["--allow-host", "allowed.test", "--", "sh", "-c"])
        .arg(format!(
            "cat /etc/resolv.conf; python3 -c '{GET}' denied.test"
        ))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("nameserver 127.0.0.1"), "{stdout}");
    assert!(stdout.contains("denied.test UNRESOLVED"), "{stdout}");
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

#[test]
fn omabox_run_backend_gvisor_injects_a_credential_the_sandbox_never_holds() {
    const SECRET: &str = "omabox-cli-gvisor-secret-7e2d";
    const CURL: &str = "/usr/bin/curl";
    let curl =
        (!Path::new(CURL).is_file()).then(|| format!("{CURL} is needed (apt-get install curl)"));
    if !require_capability(missing().or(curl)) {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let _entered = runtime.enter();
    let data = tempfile::tempdir().unwrap();
    let inet = internet::Internet::new();
    let origin = internet::https::Origin::start(&inet, SECRET);
    let hosts = format!("api.test={}", inet.far);
    let omabox = |args: &[&str]| {
        let mut command = omabox(data.path());
        command
            .args(args)
            .env("OMABOX_TEST_MODE", "1")
            .env("OMABOX_LINUX_TEST_HOSTS", &hosts)
            .env("SSL_CERT_FILE", origin.ca_path())
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("SANDBOX_IMAGE")
            .env_remove("OMABOX_LINUX_NETWORK")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    };
    let mut put = omabox(&["vault", "put", "api-token"]).spawn().unwrap();
    put.stdin
        .take()
        .unwrap()
        .write_all(SECRET.as_bytes())
        .unwrap();
    let put = put.wait_with_output().unwrap();
    assert!(put.status.success(), "{put:?}");
    let environment = data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"networking":{"type":"limited","allowed_hosts":["api.test"]}}"#,
    )
    .unwrap();
    let output = omabox(&[
        "run",
        "--json",
        "--backend",
        "gvisor",
        "--session",
        "cred",
        "--environment",
        environment.to_str().unwrap(),
        "--credential",
        "api.test=api-token",
        "--",
        "sh",
        "-c",
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1; env; cat /proc/1/environ",
    ])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("hello from api"), "{stderr}");
    assert!(
        !stdout.contains(SECRET) && !stderr.contains(SECRET),
        "the secret was printed"
    );
    // Without the credential the same request is refused by the origin.
    let output = omabox(&[
        "run",
        "--json",
        "--backend",
        "gvisor",
        "--session",
        "nocred",
        "--environment",
        environment.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1",
    ])
    .stdin(Stdio::null())
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("hello from api"), "{stderr}");
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
}

#[test]
fn omabox_run_backend_gvisor_uses_an_images_root_writable_only_in_memory() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // A rootfs tarball: the host's dash as /bin/sh with its libc and loader, nothing else.
    let rootfs = data.path().join("rootfs");
    for (from, to) in [
        ("/bin/dash", "bin/sh"),
        (
            "/lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/libc.so.6",
        ),
        ("/lib64/ld-linux-x86-64.so.2", "lib64/ld-linux-x86-64.so.2"),
    ] {
        let to = rootfs.join(to);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    }
    let tarball = data.path().join("rootfs.tar");
    let tarred = Command::new("tar")
        .arg("-cf")
        .arg(&tarball)
        .arg("-C")
        .arg(&rootfs)
        .arg(".")
        .status()
        .unwrap();
    assert!(tarred.success());
    let image = tarball.to_str().unwrap();
    let script = "test -e /usr/bin/python3 && echo host-usr || echo own-root; \
                  echo x > /etc/written && echo root-writable; echo w > /workspace/w";
    let (report, output) = run_gvisor(
        data.path(),
        "img",
        &[("OMABOX_LINUX_IMAGE", image)],
        &["sh", "-c", script],
    );
    assert!(output.status.success(), "{output:?}");
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("own-root"), "{stderr}");
    assert!(stderr.contains("root-writable"), "{stderr}");
    // The root's writes stayed in the sandbox's memory: nowhere under the data dir.
    assert!(
        !contains_file(data.path(), "written"),
        "a root write reached the host"
    );
    let (_, output) = run_gvisor(
        data.path(),
        "img",
        &[("OMABOX_LINUX_IMAGE", image)],
        &["sh", "-c", "read w < /workspace/w; echo got-$w"],
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("got-w"),
        "{output:?}"
    );
    // A directory used in place is refused (runsc would make its mount points in it).
    let (_, output) = run_gvisor(
        data.path(),
        "dir",
        &[("OMABOX_LINUX_IMAGE", rootfs.to_str().unwrap())],
        &["true"],
    );
    assert!(!output.status.success(), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not a directory used in place"),
        "{output:?}"
    );
    assert!(!rootfs.join("workspace").exists());
}

/// Whether a file named `name` is anywhere under `dir`.
fn contains_file(dir: &Path, name: &str) -> bool {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| {
            let path = e.path();
            e.file_name() == name
                || (e.file_type().is_ok_and(|t| t.is_dir() && !t.is_symlink())
                    && contains_file(&path, name))
        })
}

#[test]
fn kill_9_of_omabox_run_backend_gvisor_then_reap_reaps_its_lease_and_sandbox() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    let mut killed = omabox(data.path())
        .args([
            "run",
            "--json",
            "--backend",
            "gvisor",
            "--session",
            "k",
            "--",
        ])
        .args(["sh", "-c", "touch /workspace/started; sleep 60"])
        .env("OMABOX_LEASE_TTL_MS", "1500")
        .env_remove("OMABOX_LINUX_IMAGE")
        .env_remove("SANDBOX_IMAGE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Polling for the harness's file, not a timed assertion: the deadline only ends a hang.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !contains_file(&data.path().join("runtime"), "started") {
        assert!(killed.try_wait().unwrap().is_none(), "the run ended first");
        assert!(Instant::now() < deadline, "the harness never started");
        std::thread::sleep(Duration::from_millis(25));
    }
    killed.kill().unwrap(); // SIGKILL: no cleanup at all.
    killed.wait().unwrap();
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 1);
    // Once its fence expired, reap terminates the sandbox from the journaled lease.
    std::thread::sleep(Duration::from_millis(2_000));
    let out = omabox(data.path())
        .args(["reap", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["abandoned"]["reaped"], 1, "{report}");
    assert_eq!(
        report["abandoned"]["errors"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(std::fs::read_dir(&sandboxes).unwrap().count(), 0);
    assert_eq!(processes_mentioning(&data.path().to_string_lossy()), 0);
}

#[test]
fn omabox_run_backend_gvisor_restores_the_previous_runs_processes_when_the_profile_asks() {
    if !require_capability(missing()) {
        return;
    }
    let data = tempfile::tempdir().unwrap();
    // One harness for every run (a checkpoint serves the same harness identity only): the
    // first run starts a counter held in a shell variable; a later run exits 4 when the
    // counter is not there (a cold sandbox), else prints where it got to.
    let script = "if [ ! -f /workspace/before ]; then \
        setsid sh -c 'n=0; while :; do n=$((n+1)); echo $n > /tmp/count; sleep 0.1; done' \
        counter </dev/null >/dev/null 2>&1 & sleep 0.5; cat /tmp/count > /workspace/before; \
        else now=$(cat /tmp/count 2>/dev/null) || exit 4; echo \"before=$(cat /workspace/before) now=$now\"; fi";
    let profile = data.path().join("profile.json");
    std::fs::write(
        &profile,
        serde_json::json!({
            "workspace": {"requirement": "durable"},
            "outputs": {"requirement": "durable"},
            "runtimeCheckpoint": "required",
            "driver": {"type": "ama_worker", "process": {"command": "sh", "args": ["-c", script]}},
        })
        .to_string(),
    )
    .unwrap();
    let run = || {
        let output = omabox(data.path())
            .args(["run", "--json", "--backend", "gvisor", "--session", "warm"])
            .arg("--profile")
            .arg(&profile)
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("SANDBOX_IMAGE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let report: serde_json::Value =
            serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
        (report, output)
    };
    let checkpoints = data.path().join("gvisor/checkpoints");
    let kept = || -> Vec<String> {
        std::fs::read_dir(&checkpoints)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let (first, output) = run();
    assert_eq!(first["result"]["type"], "completed", "{output:?}");
    let taken = kept();
    assert_eq!(taken.len(), 1, "{taken:?}");

    // Another omabox process restores it: the counter went on from where it was.
    let (second, output) = run();
    assert_eq!(second["result"]["revision"], 2, "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    let line = stderr
        .lines()
        .find(|l| l.contains("before="))
        .unwrap_or_else(|| panic!("{stderr}"));
    let number = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{line}"))
    };
    assert!(number("now=") >= number("before="), "{line}");
    // Consumed, and a newer one kept; no sandbox left.
    let now = kept();
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, taken);
    let sandboxes = data.path().join("gvisor/sandboxes");
    assert_eq!(std::fs::read_dir(sandboxes).unwrap().count(), 0);
    assert_eq!(processes_mentioning(&data.path().to_string_lossy()), 0);
}
