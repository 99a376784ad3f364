//! `omabox sandbox run --backend docker` driven as a user would: the real binary against an
//! engine of the test's own (`omabox_test_support::dockerd`, `DOCKER_HOST` pointing at it)
//! and an image pushed to a registry on loopback (the host's static busybox as `/bin/sh`).
//! Needs root, docker.io (installed when missing), docker-registry, a static busybox and
//! the `omabox-agent` binary next to `omabox` (`cargo build -p omabox-agent`); a missing one
//! skips with its reason, and fails under `CI=true`.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

mod common;
#[path = "../../backends/linux/tests/internet/mod.rs"]
mod internet;

use common::omabox_bin;
use omabox_backend_docker::{Engine, HOST_LABEL};
use omabox_test_support::dockerd::TestDockerd;
use omabox_test_support::registry::{TestRegistry, tar_layer};
use omabox_test_support::require_capability;

const BUSYBOX: &str = "/bin/busybox";

fn missing() -> Option<String> {
    let agent = omabox_bin().with_file_name("omabox-agent");
    TestRegistry::missing()
        .or_else(|| {
            let static_busybox = std::fs::read(BUSYBOX)
                .map(|b| !b.windows(14).any(|w| w == b"/lib64/ld-linu"))
                .unwrap_or(false);
            (!static_busybox).then(|| {
                format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)")
            })
        })
        .or_else(|| {
            (!agent.is_file()).then(|| {
                format!(
                    "{} is not built (cargo build -p omabox-agent)",
                    agent.display()
                )
            })
        })
        .or_else(TestDockerd::missing)
}

struct Rig {
    dockerd: TestDockerd,
    image: String,
    data: tempfile::TempDir,
    _registry: TestRegistry,
}

fn rig() -> Rig {
    let registry = TestRegistry::start();
    let busybox = std::fs::read(BUSYBOX).unwrap();
    registry.push_image(
        "test/busybox",
        "1",
        &[tar_layer(&[
            ("bin/busybox", 0o755, &busybox),
            ("bin/sh", 0o755, &busybox),
            ("bin/cat", 0o755, &busybox),
            ("bin/true", 0o755, &busybox),
        ])],
    );
    Rig {
        dockerd: TestDockerd::start(),
        image: format!("{}/test/busybox:1", registry.host()),
        data: tempfile::tempdir().unwrap(),
        _registry: registry,
    }
}

impl Rig {
    fn run(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut child = Command::new(omabox_bin())
            .arg("--data-dir")
            .arg(self.data.path())
            .args([
                "sandbox",
                "run",
                "--backend",
                "docker",
                "--image",
                &self.image,
            ])
            .args(args)
            .env("DOCKER_HOST", self.dockerd.host())
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("SANDBOX_IMAGE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        child.wait_with_output().unwrap()
    }

    /// The containers omabox made that the engine still has.
    fn containers(&self) -> usize {
        let host = self.dockerd.host();
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async move {
                Engine::connect(&host)
                    .await
                    .unwrap()
                    .containers_labelled(HOST_LABEL)
                    .await
                    .unwrap()
                    .len()
            })
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn sandbox_run_backend_docker_streams_stdio_and_returns_the_exit_code() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    let out = rig.run(
        &["--", "sh", "-c", "cat; echo to-err >&2; exit 3"],
        b"piped in\n",
    );
    assert_eq!(out.status.code(), Some(3), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "piped in\n");
    assert!(
        text(&out.stderr).contains("to-err"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        rig.containers(),
        0,
        "the container is removed after the run"
    );

    let out = rig.run(&["--", "true"], b"");
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
}

#[test]
fn sandbox_run_backend_docker_binds_the_workspace_and_serves_a_network() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("in.txt"), "seed").unwrap();
    let dir = workspace.path().to_str().unwrap();
    let out = rig.run(
        &[
            "--workspace",
            dir,
            "--",
            "sh",
            "-c",
            "cat in.txt > out.txt; echo -n ' done' >> out.txt",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("out.txt")).unwrap(),
        "seed done"
    );

    // `limited`: the host's DNS stub answers in the container, and refuses a name the
    // policy does not allow (the lookup never leaves the host).
    let out = rig.run(
        &[
            "--network",
            "limited",
            "--allow-host",
            "allowed.test",
            "--",
            "sh",
            "-c",
            "cat /etc/resolv.conf; busybox nslookup -type=a denied.test 2>&1",
        ],
        b"",
    );
    let stdout = text(&out.stdout);
    assert!(stdout.contains("nameserver 127.0.0.1"), "{stdout}");
    assert!(stdout.contains("REFUSED"), "{stdout}");
    let out = rig.run(
        &[
            "--network",
            "limited",
            "--allow-host",
            "bad host",
            "--",
            "true",
        ],
        b"",
    );
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        text(&out.stderr).contains("--allow-host"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(rig.containers(), 0);
}

#[test]
fn reap_removes_the_containers_a_dead_host_left_in_the_engine_and_keeps_a_live_ones() {
    use omabox_backend_docker::config::locate_agent;
    use omabox_backend_docker::{DockerConfig, DockerSandboxPort};
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    // A host of this machine that is gone: a finished process's pid.
    let mut finished = Command::new("true").spawn().unwrap();
    let pid = finished.id();
    finished.wait().unwrap();
    let current = omabox_backend_docker::host::current();
    let machine = current.rsplitn(3, '/').nth(2).unwrap();
    let dead_host = format!("{machine}/{pid}/1");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let live = runtime.block_on(async {
        let engine = Engine::connect(&rig.dockerd.host()).await.unwrap();
        let config = |host: &str| DockerConfig {
            agent_binary: locate_agent(Some(&omabox_bin().with_file_name("omabox-agent"))).unwrap(),
            ..DockerConfig::new(rig.image.clone(), host)
        };
        let dead = DockerSandboxPort::start(&engine, &config(&dead_host), "sbx-dead")
            .await
            .unwrap();
        // Its host "died": the connection goes, the container stays.
        drop(dead);
        DockerSandboxPort::start(&engine, &config(&current), "sbx-live")
            .await
            .unwrap()
    });
    assert_eq!(rig.containers(), 2);
    let out = Command::new(omabox_bin())
        .arg("--data-dir")
        .arg(rig.data.path())
        .args(["reap", "--json"])
        .env("DOCKER_HOST", rig.dockerd.host())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["leftovers"]["dockerContainersRemoved"],
        serde_json::json!(["sbx-dead"]),
        "{report}"
    );
    assert_eq!(rig.containers(), 1, "the live host's container is kept");
    runtime.block_on(live.terminate()).unwrap();
    assert_eq!(rig.containers(), 0);
}

#[test]
fn omabox_run_backend_docker_keeps_the_workspace_between_runs_and_collects_outputs() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    let run = |cmd: &[&str]| {
        let output = Command::new(omabox_bin())
            .arg("--data-dir")
            .arg(rig.data.path())
            .args([
                "run",
                "--json",
                "--backend",
                "docker",
                "--session",
                "s1",
                "--",
            ])
            .args(cmd)
            .env("DOCKER_HOST", rig.dockerd.host())
            .env("OMABOX_LINUX_IMAGE", &rig.image)
            .env_remove("SANDBOX_IMAGE")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|e| panic!("{e}: stderr: {}", text(&output.stderr)));
        (report, output)
    };
    let (first, output) = run(&[
        "sh",
        "-c",
        "echo one > /workspace/a && echo report > /mnt/session/outputs/r.txt",
    ]);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert_eq!(
        first["result"],
        serde_json::json!({"type": "completed", "revision": 1}),
        "{first}"
    );
    assert_eq!(first["outputs"][0]["logicalPath"], "r.txt");
    let (second, output) = run(&["cat", "/workspace/a"]);
    assert!(output.status.success(), "stderr: {}", text(&output.stderr));
    assert_eq!(text(&output.stderr).trim(), "one");
    assert_eq!(second["restoredRevision"], 1, "{second}");
    assert_eq!(rig.containers(), 0, "every container is removed");
}

#[test]
fn omabox_run_backend_docker_reaches_the_inference_gateway_and_nothing_else_of_the_host() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    // The gateway, and another service of the host's loopback.
    let serve = |name: &'static str| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut stream = stream;
                let mut head = [0u8; 1024];
                let _ = std::io::Read::read(&mut stream, &mut head);
                let _ =
                    stream.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{name} saw it\n").as_bytes());
            }
        });
        port
    };
    let (gateway, other) = (serve("gateway"), serve("other"));
    let get = |port: u16| {
        format!(
            "printf 'GET / HTTP/1.0\\r\\n\\r\\n' | busybox nc -w 5 127.0.0.1 {port} | busybox tail -n 1"
        )
    };
    let script = format!(
        "{}; {}; echo url=$HOSTED_INFERENCE_URL",
        get(gateway),
        get(other)
    );
    let output = Command::new(omabox_bin())
        .arg("--data-dir")
        .arg(rig.data.path())
        .args(["run", "--json", "--backend", "docker", "--session", "gw"])
        .arg("--inference-gateway")
        .arg(format!("http://127.0.0.1:{gateway}/"))
        .args(["--", "sh", "-c", &script])
        .env("DOCKER_HOST", rig.dockerd.host())
        .env("OMABOX_LINUX_IMAGE", &rig.image)
        .env_remove("SANDBOX_IMAGE")
        .env_remove("OMABOX_LINUX_NETWORK")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("gateway saw it"), "{stderr}");
    assert!(!stderr.contains("other saw it"), "{stderr}");
    assert!(
        stderr.contains(&format!("url=http://127.0.0.1:{gateway}/")),
        "{stderr}"
    );
    assert_eq!(rig.containers(), 0, "every container is removed");
}

#[test]
fn omabox_run_backend_docker_injects_a_credential_the_container_never_holds() {
    const SECRET: &str = "omabox-cli-docker-secret-5c1a";
    const CURL: &str = "/usr/bin/curl";
    const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    let curl = (!std::path::Path::new(CURL).is_file())
        .then(|| format!("{CURL} is needed (apt-get install curl)"));
    if !require_capability(missing().or(curl)) {
        return;
    }
    let rig = rig();
    // An image with the host's curl, its libraries and CA bundle, and busybox as sh.
    let mut files = omabox_test_support::registry::host_files(&[CURL, BUNDLE]);
    let busybox = std::fs::read(BUSYBOX).unwrap();
    files.push(("bin/busybox".into(), busybox.clone()));
    files.push(("bin/sh".into(), busybox));
    files.push(("tmp/.keep".into(), Vec::new()));
    let entries: Vec<(&str, u32, &[u8])> = files
        .iter()
        .map(|(path, bytes)| (path.as_str(), 0o755, bytes.as_slice()))
        .collect();
    rig._registry
        .push_image("test/curl", "1", &[tar_layer(&entries)]);
    let image = format!("{}/test/curl:1", rig._registry.host());
    let inet = internet::Internet::new();
    let origin = internet::https::Origin::start(&inet, SECRET);
    let omabox = |args: &[&str]| {
        let mut command = Command::new(omabox_bin());
        command
            .arg("--data-dir")
            .arg(rig.data.path())
            .args(args)
            .env("DOCKER_HOST", rig.dockerd.host())
            .env("OMABOX_LINUX_IMAGE", &image)
            .env("OMABOX_TEST_MODE", "1")
            .env("OMABOX_LINUX_TEST_HOSTS", format!("api.test={}", inet.far))
            .env("SSL_CERT_FILE", origin.ca_path())
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
    assert!(put.status.success(), "{}", text(&put.stderr));
    let environment = rig.data.path().join("env.json");
    std::fs::write(
        &environment,
        r#"{"networking":{"type":"limited","allowed_hosts":["api.test"]}}"#,
    )
    .unwrap();
    let mut run = omabox(&[
        "run",
        "--json",
        "--backend",
        "docker",
        "--session",
        "cred",
        "--environment",
        environment.to_str().unwrap(),
        "--credential",
        "api.test=api-token",
        "--",
        "sh",
        "-c",
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1",
    ]);
    let output = run.stdin(Stdio::null()).output().unwrap();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "stderr: {stderr}");
    assert!(stderr.contains("hello from api"), "{stderr}");
    assert!(
        !stdout.contains(SECRET) && !stderr.contains(SECRET),
        "the secret was printed"
    );
    assert_eq!(rig.containers(), 0, "every container is removed");
}

/// Waits until a file named `name` appears under `dir` (the harness wrote it).
fn wait_for_file(dir: &std::path::Path, name: &str, child: &mut std::process::Child) {
    fn find(dir: &std::path::Path, name: &str) -> bool {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|entry| {
                let path = entry.path();
                entry.file_name() == name || (path.is_dir() && find(&path, name))
            })
    }
    // Polling for the harness's file, not a timed assertion: the deadline only ends a hang.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !find(dir, name) {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("omabox run ended ({status}) before the harness wrote {name}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the harness never wrote {name}"
        );
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
}

#[test]
fn kill_9_of_omabox_run_backend_docker_then_reap_reaps_its_lease_and_container() {
    if !require_capability(missing()) {
        return;
    }
    let rig = rig();
    let mut killed = Command::new(omabox_bin())
        .arg("--data-dir")
        .arg(rig.data.path())
        .args([
            "run",
            "--json",
            "--backend",
            "docker",
            "--session",
            "k",
            "--",
        ])
        .args(["sh", "-c", "touch /workspace/started; sleep 60"])
        .env("DOCKER_HOST", rig.dockerd.host())
        .env("OMABOX_LINUX_IMAGE", &rig.image)
        .env("OMABOX_LEASE_TTL_MS", "1500")
        .env_remove("SANDBOX_IMAGE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for_file(&rig.data.path().join("runtime"), "started", &mut killed);
    killed.kill().unwrap(); // SIGKILL: no cleanup at all.
    killed.wait().unwrap();
    assert_eq!(rig.containers(), 1, "the killed run's container is left");
    // Once its fence expired, reap terminates the container from the journaled lease.
    std::thread::sleep(std::time::Duration::from_millis(2_000));
    let out = Command::new(omabox_bin())
        .arg("--data-dir")
        .arg(rig.data.path())
        .args(["reap", "--json"])
        .env("DOCKER_HOST", rig.dockerd.host())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["abandoned"]["reaped"], 1, "{report}");
    assert_eq!(
        report["abandoned"]["errors"],
        serde_json::json!([]),
        "{report}"
    );
    assert_eq!(rig.containers(), 0);
}
