//! Registry images end to end, as a user drives them: `omabox sandbox run --image
//! HOST/REPO:TAG` against a real `docker-registry` on loopback (pull, run, a moved tag, a
//! pin), `omabox image pull|ls|rm|prune` (human and `--json`), bad references, and a
//! registry with basic auth whose password never shows in any output or cache file.
//!
//! The pushed test image is tiny: the host's static busybox (package busybox-static) and a
//! marker file. Missing docker-registry, htpasswd, busybox or linux sandboxes skip with a
//! printed reason, and fail under `CI=true`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;

use base64::Engine as _;
use common::{init_bin, omabox_bin};
use omabox_backend_linux::factory::{
    CGROUP_PARENT_ENV, IMAGE_CACHE_ENV, INIT_ENV, RUNTIME_DIR_ENV,
};
use omabox_test_support::registry::{PushedImage, TestRegistry, tar_layer};
use omabox_test_support::require_capability;

const BUSYBOX: &str = "/bin/busybox";

fn registry_missing() -> Option<String> {
    TestRegistry::missing().or_else(|| {
        let static_busybox = std::fs::read(BUSYBOX)
            .ok()
            .is_some_and(|elf| is_static(&elf));
        (!static_busybox)
            .then(|| format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)"))
    })
}

/// A 64-bit little-endian ELF without a `PT_INTERP` program header (no dynamic loader).
fn is_static(elf: &[u8]) -> bool {
    let u16_at = |o: usize| {
        elf.get(o..o + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
    };
    let u32_at = |o: usize| {
        elf.get(o..o + 4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        elf.get(o..o + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()) as usize)
    };
    if !elf.starts_with(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(size), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    (0..count).all(|i| u32_at(phoff + i * size).is_some_and(|t| t != 3))
}

/// The test image: `/bin/busybox` and `/marker`.
fn push(registry: &TestRegistry, repo: &str, tag: &str, marker: &str) -> PushedImage {
    let busybox = std::fs::read(BUSYBOX).unwrap();
    registry.push_image(
        repo,
        tag,
        &[
            tar_layer(&[("bin/busybox", 0o755, &busybox)]),
            tar_layer(&[("marker", 0o644, marker.as_bytes())]),
        ],
    )
}

struct Env {
    dir: tempfile::TempDir,
    cgroup_parent: String,
}

impl Env {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cgroup_parent = format!(
            "omabox-image-test-{}",
            dir.path().file_name().unwrap().to_string_lossy()
        );
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        Self { dir, cgroup_parent }
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn omabox(&self, args: &[&str]) -> Command {
        let mut c = Command::new(omabox_bin());
        c.args(args)
            .env(IMAGE_CACHE_ENV, self.cache())
            .env(RUNTIME_DIR_ENV, self.dir.path().join("run"))
            .env(CGROUP_PARENT_ENV, &self.cgroup_parent)
            .env(INIT_ENV, init_bin())
            .env("DOCKER_CONFIG", self.dir.path().join("docker"))
            .env("OMABOX_DATA_DIR", self.dir.path().join("data"))
            .env_remove("OPENMA_TEST_SANDBOX_PROVIDER")
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("SANDBOX_IMAGE")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        self.omabox(args).output().expect("omabox runs")
    }

    fn docker_login(&self, host: &str, user: &str, password: &str) {
        let dir = self.dir.path().join("docker");
        std::fs::create_dir_all(&dir).unwrap();
        let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        std::fs::write(
            dir.join("config.json"),
            format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
        )
        .unwrap();
    }
}

impl Env {
    /// No sandbox state dir is left in the runtime dir.
    fn assert_no_sandbox_left(&self) {
        let left: Vec<_> = std::fs::read_dir(self.dir.path().join("run"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        assert!(left.is_empty(), "sandboxes left: {left:?}");
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let parents = common::cgroup_parent_dirs(&self.cgroup_parent);
        for parent in parents {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn json(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

#[test]
fn sandbox_run_pulls_a_registry_image_and_a_moved_tag_gives_the_new_digest() {
    if !require_capability(registry_missing()) || !common::linux_available() {
        return;
    }
    let registry = TestRegistry::start();
    let first = push(&registry, "test/busybox", "1", "one\n");
    let env = Env::new();
    let image = format!("{}/test/busybox:1", registry.host());
    let run = |image: &str| {
        env.run(&[
            "sandbox",
            "run",
            "--image",
            image,
            "--",
            "/bin/busybox",
            "cat",
            "/marker",
        ])
    };

    let out = run(&image);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\n");
    assert!(
        text(&out.stderr).contains(&first.digest),
        "{}",
        text(&out.stderr)
    );

    // The tag moves: the next run resolves it again and gets the new image.
    let second = push(&registry, "test/busybox", "1", "two\n");
    let out = run(&image);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "two\n");
    assert!(
        text(&out.stderr).contains(&second.digest),
        "{}",
        text(&out.stderr)
    );

    // A pin to the first digest runs the first image (cached: no registry needed).
    drop(registry);
    let pinned = format!("{}@{}", image.trim_end_matches(":1"), first.digest);
    let out = run(&pinned);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "one\n");
    env.assert_no_sandbox_left();

    // A bad reference is a usage error naming the value.
    let out = run("Bad Ref:1");
    assert_eq!(out.status.code(), Some(2), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("Bad Ref:1"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn omabox_run_resolves_the_tag_at_acquire_and_reports_the_digest() {
    if !require_capability(registry_missing()) || !common::linux_available() {
        return;
    }
    let registry = TestRegistry::start();
    let busybox = std::fs::read(BUSYBOX).unwrap();
    // `omabox run` probes the harness with a shell: busybox is /bin/sh too.
    let push_run_image = |marker: &str| {
        registry.push_image(
            "test/run",
            "latest",
            &[
                tar_layer(&[
                    ("bin/busybox", 0o755, &busybox),
                    ("bin/sh", 0o755, &busybox),
                ]),
                tar_layer(&[("marker", 0o644, marker.as_bytes())]),
            ],
        )
    };
    let first = push_run_image("first\n");
    let env = Env::new();
    let data = env.dir.path().join("data");
    let image = format!("{}/test/run", registry.host());
    let run = || {
        let out = env
            .omabox(&[
                "--data-dir",
                data.to_str().unwrap(),
                "run",
                "--json",
                "--backend",
                "linux",
                "--session",
                "img",
                "--",
                "/bin/busybox",
                "cat",
                "/marker",
            ])
            .env("SANDBOX_IMAGE", &image)
            .env("OMABOX_TEST_MODE", "1")
            .output()
            .expect("omabox runs");
        (json(&out), text(&out.stdout), text(&out.stderr))
    };
    let (report, stdout, stderr) = run();
    // The download shows on stderr (a line per blob off a terminal), not in the JSON.
    assert!(
        stderr.contains(&format!("fetched {}", first.layers[0])),
        "{stderr}"
    );
    let expected = format!("{}/test/run:latest@{}", registry.host(), first.digest);
    assert_eq!(report["image"], expected.as_str(), "{stdout}");
    let acquired = report["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["step"] == "sandbox.acquire")
        .unwrap_or_else(|| panic!("no sandbox.acquire event: {stdout}"));
    assert!(
        acquired["detail"].as_str().unwrap().contains(&first.digest),
        "{acquired}"
    );

    // The tag moves; the next acquire resolves it again.
    let second = push_run_image("second\n");
    let (report, _, _) = run();
    let expected = format!("{}/test/run:latest@{}", registry.host(), second.digest);
    assert_eq!(report["image"], expected.as_str());
    env.assert_no_sandbox_left();
}

#[test]
fn image_pull_ls_rm_prune_with_json() {
    if !require_capability(registry_missing()) {
        return;
    }
    let registry = TestRegistry::start();
    let pushed = push(&registry, "test/tools", "1", "tools\n");
    let env = Env::new();
    let name = format!("{}/test/tools:1", registry.host());

    let pulled = json(&env.run(&["image", "pull", &name, "--json"]));
    assert_eq!(pulled["digest"], pushed.digest.as_str());
    assert_eq!(pulled["reference"], name.as_str());
    assert_eq!(pulled["unpacked"], true);
    assert!(pulled["downloadedBytes"].as_u64().unwrap() > 1_000_000);
    let rootfs = PathBuf::from(pulled["rootfs"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(rootfs.join("marker")).unwrap(),
        "tools\n"
    );

    // Human output, a second time: up to date.
    let out = env.run(&["image", "pull", &name]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("up to date"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stdout).contains(&pushed.digest),
        "{}",
        text(&out.stdout)
    );

    let listed = json(&env.run(&["image", "ls", "--json"]));
    let images = listed["images"].as_array().unwrap();
    assert_eq!(images.len(), 1);
    assert_eq!(images[0]["digest"], pushed.digest.as_str());
    assert_eq!(images[0]["names"][0], name.as_str());
    assert!(images[0]["sizeBytes"].as_u64().unwrap() > 1_000_000);
    let out = env.run(&["image", "ls"]);
    assert!(text(&out.stdout).contains(&name), "{}", text(&out.stdout));

    // rm by name: the only name, so the image goes too.
    let removed = json(&env.run(&["image", "rm", &name, "--json"]));
    assert_eq!(removed["removed"][0]["images"][0], pushed.digest.as_str());
    let out = env.run(&["image", "rm", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("not in the image cache"));

    // prune: the named image stays, an unnamed local unpack goes.
    json(&env.run(&["image", "pull", &name, "--json"]));
    let tarball = env.dir.path().join("local.tar");
    std::fs::write(&tarball, tar_layer(&[("x", 0o644, b"x")])).unwrap();
    omabox_backend_linux::ImageCache::new(env.cache())
        .resolve(&tarball)
        .unwrap();
    let pruned = json(&env.run(&["image", "prune", "--json"]));
    let pruned = pruned["removed"].as_array().unwrap();
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0]["source"], tarball.display().to_string().as_str());
    let listed = json(&env.run(&["image", "ls", "--json"]));
    assert_eq!(listed["images"].as_array().unwrap().len(), 1);

    // Bad references: exit 2, the value named.
    for bad in ["Bad Ref", "x@sha256:123", "./missing"] {
        let out = env.run(&["image", "pull", bad]);
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", text(&out.stderr));
        assert!(text(&out.stderr).contains(bad), "{}", text(&out.stderr));
    }
}

#[test]
fn registry_passwords_never_show_in_output_or_cache() {
    if !require_capability(registry_missing()) {
        return;
    }
    let password = "cli-Secret-Pa55word";
    let wrong = "cli-Wrong-Pa55word";
    let registry = TestRegistry::start_with_auth("bob", password);
    let pushed = push(&registry, "private/tools", "1", "private\n");
    let env = Env::new();
    let name = format!("{}/private/tools:1", registry.host());
    let shows = |out: &Output, secret: &str| {
        text(&out.stdout).contains(secret) || text(&out.stderr).contains(secret)
    };

    let out = env.run(&["image", "pull", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains(&name), "{}", text(&out.stderr));

    env.docker_login(&registry.host(), "bob", wrong);
    let out = env.run(&["image", "pull", &name]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(!shows(&out, wrong), "{}", text(&out.stderr));

    env.docker_login(&registry.host(), "bob", password);
    let out = env.run(&["image", "pull", &name, "--json"]);
    assert!(!shows(&out, password));
    assert_eq!(json(&out)["digest"], pushed.digest.as_str());
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("bob:{password}"));
    assert_no_file_holds(&env.cache(), &[password, &basic]);
}

#[test]
fn registry_credentials_come_from_the_vault_before_docker_config() {
    if !require_capability(registry_missing()) {
        return;
    }
    let password = "vault-Secret-Pa55word";
    let registry = TestRegistry::start_with_auth("carol", password);
    let pushed = push(&registry, "vaulted/tools", "1", "vaulted\n");
    let env = Env::new();
    let name = format!("{}/vaulted/tools:1", registry.host());
    let vault_put = |value: &str| {
        let name = format!("registry/{}", registry.host());
        common::run_with_stdin(&mut env.omabox(&["vault", "put", &name]), value);
    };
    // docker's file has a wrong password: the vault's right one is asked first.
    env.docker_login(&registry.host(), "carol", "docker-Wrong-pw");
    vault_put(&format!("carol:{password}"));
    let out = env.run(&["image", "pull", &name, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json(&out)["digest"], pushed.digest.as_str());
    assert!(!text(&out.stdout).contains(password) && !text(&out.stderr).contains(password));

    // A wrong vault password fails the pull without showing it; `sandbox run` asks the
    // vault too (the image is cached by digest, so pull by a second tag).
    push(&registry, "vaulted/tools", "2", "second\n");
    vault_put("carol:vault-Wrong-pw");
    let second = format!("{}/vaulted/tools:2", registry.host());
    let out = env.run(&[
        "sandbox",
        "run",
        "--image",
        &second,
        "--",
        "/bin/busybox",
        "true",
    ]);
    assert_ne!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        !text(&out.stderr).contains("vault-Wrong-pw"),
        "{}",
        text(&out.stderr)
    );
    vault_put(&format!("carol:{password}"));
    let out = env.run(&[
        "sandbox",
        "run",
        "--image",
        &second,
        "--",
        "/bin/busybox",
        "cat",
        "/marker",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "second\n");
    env.assert_no_sandbox_left();
}

fn assert_no_file_holds(dir: &Path, needles: &[&str]) {
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let meta = entry.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            } else if meta.is_file() {
                let content = std::fs::read(entry.path()).unwrap();
                for needle in needles {
                    assert!(
                        !content
                            .windows(needle.len())
                            .any(|w| w == needle.as_bytes()),
                        "{} holds a credential",
                        entry.path().display()
                    );
                }
            }
        }
    }
}

/// `image rm` refuses, and `image prune` keeps, an image a running sandbox reads; both
/// go through once the sandbox is gone.
#[test]
fn an_image_a_sandbox_reads_is_neither_removed_nor_pruned() {
    if !common::linux_available() {
        return;
    }
    let busybox_missing = (!std::fs::read(BUSYBOX).is_ok_and(|elf| is_static(&elf)))
        .then(|| format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)"));
    if !require_capability(busybox_missing) {
        return;
    }
    let env = Env::new();
    let busybox = std::fs::read(BUSYBOX).unwrap();
    let tarball = env.dir.path().join("tools.tar");
    std::fs::write(&tarball, tar_layer(&[("bin/busybox", 0o755, &busybox)])).unwrap();
    let tarball = tarball.display().to_string();
    let mut sandbox = env
        .omabox(&[
            "sandbox",
            "run",
            "--image",
            &tarball,
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            "echo up; exec /bin/busybox sleep 60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut up = [0u8; 3];
    std::io::Read::read_exact(sandbox.stdout.as_mut().unwrap(), &mut up).unwrap();
    assert_eq!(&up, b"up\n");

    let listed = json(&env.run(&["image", "ls", "--json"]));
    let digest = listed["images"][0]["digest"].as_str().unwrap().to_owned();
    let out = env.run(&["image", "rm", &digest]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(&format!("{digest} is in use by sandbox ")),
        "{}",
        text(&out.stderr)
    );
    let pruned = json(&env.run(&["image", "prune", "--json"]));
    assert_eq!(pruned["removed"], serde_json::json!([]));
    let listed = json(&env.run(&["image", "ls", "--json"]));
    assert_eq!(listed["images"][0]["digest"], digest.as_str());

    // The sandbox ends (SIGTERM is forwarded; it tears down): now both go through.
    // SAFETY: kill on the pid of our own child.
    unsafe { libc::kill(sandbox.id() as i32, libc::SIGTERM) };
    let out = sandbox.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    let pruned = json(&env.run(&["image", "prune", "--json"]));
    assert_eq!(pruned["removed"][0]["digest"], digest.as_str());
    let out = env.run(&["image", "rm", &digest]);
    assert!(text(&out.stderr).contains("not in the image cache"));
}

/// docker's `credsStore` helper answers for the registry (run from `PATH` with the host on
/// stdin); its password shows nowhere.
#[test]
fn a_docker_credential_helper_is_asked_for_the_registry() {
    use std::os::unix::fs::PermissionsExt as _;
    if !require_capability(registry_missing()) {
        return;
    }
    let password = "helper-Secret-Pa55word";
    let registry = TestRegistry::start_with_auth("dave", password);
    let pushed = push(&registry, "helped/tools", "1", "helped\n");
    let env = Env::new();
    let bin = env.dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-omaboxtest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 3\nread -r server\n[ \"$server\" = \"{}\" ] || {{ echo 'credentials not found'; exit 1; }}\nprintf '{{\"Username\":\"dave\",\"Secret\":\"{password}\"}}'\n",
            registry.host()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let docker = env.dir.path().join("docker");
    std::fs::create_dir_all(&docker).unwrap();
    std::fs::write(docker.join("config.json"), r#"{"credsStore":"omaboxtest"}"#).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let name = format!("{}/helped/tools:1", registry.host());
    let out = env
        .omabox(&["image", "pull", &name, "--json"])
        .env("PATH", &path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(json(&out)["digest"], pushed.digest.as_str());
    assert!(!text(&out.stdout).contains(password) && !text(&out.stderr).contains(password));
    assert_no_file_holds(&env.cache(), &[password]);

    // Without the helper on PATH the pull fails and says which helper is missing.
    let out = env.run(&[
        "image",
        "pull",
        &format!("{}/helped/tools:2", registry.host()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("docker-credential-omaboxtest is not on PATH"),
        "{}",
        text(&out.stderr)
    );
}

/// The entries of the cache's `tmp/` whose name starts with `prefix`.
fn temps(env: &Env, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(env.cache().join("tmp"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default()
}

fn reap(env: &Env) -> serde_json::Value {
    json(&env.run(&["reap", "--json"]))
}

/// A registry (scripted, on loopback) whose last layer sends its first 4 KiB and then
/// nothing, the connection held open: a pull of it waits mid-download.
fn stalling_registry() -> (
    omabox_test_support::hostile_http::HostileServer,
    omabox_test_support::hostile_http::FakeImage,
) {
    use omabox_test_support::hostile_http::{Body, HostileServer, Reply, image, serve_image};
    let big: Vec<u8> = (0..(1 << 20)).map(|i: u32| (i % 251) as u8).collect();
    let image = image(&[
        tar_layer(&[("marker", 0o644, b"killed\n")]),
        tar_layer(&[("big", 0o644, &big)]),
    ]);
    let served = image.clone();
    let last = image.layers()[1].clone();
    let server = HostileServer::start(move |request| {
        if request.path().ends_with(&last) {
            let blob = served.blob(&last).unwrap_or_default();
            return Reply::ok("application/octet-stream", "")
                .body(Body::Stall(blob[..4096].to_vec()))
                .content_length(blob.len() as u64);
        }
        serve_image(&served, request)
    });
    (server, image)
}

/// `kill -9` of `omabox image pull` mid-download leaves its temporary layout; `omabox
/// reap` keeps it while the pull lives and removes it once the pull is dead.
#[test]
fn reap_removes_what_a_killed_pull_left_in_the_image_cache_and_nothing_of_a_live_one() {
    let (server, image) = stalling_registry();
    // The stalled layer's download (digests are `sha256:<hex>`, files `<hex>.part`): the
    // first layer's passes through `.part` too, for a moment, then is renamed.
    let stalled = image.layers()[1].trim_start_matches("sha256:").to_owned();
    let env = Env::new();
    let name = format!("{}/killed/pull:1", server.host());
    let mut pull = env
        .omabox(&["image", "pull", &name])
        .env("OMABOX_PULL_STALL_TIMEOUT", "600")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the last layer is being written (a liveness bound, not a speed check).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let partial = loop {
        let parts: Vec<PathBuf> = temps(&env, "pull-")
            .iter()
            .flat_map(|layout| {
                std::fs::read_dir(layout.join("blobs/sha256"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
            })
            .filter(|p| p.extension().is_some_and(|e| e == "part"))
            .filter(|p| p.file_stem().is_some_and(|stem| stem == stalled.as_str()))
            .collect();
        if let Some(part) = parts.into_iter().next() {
            break part;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the pull never reached its last layer"
        );
        assert!(pull.try_wait().unwrap().is_none(), "the pull ended early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let layout = temps(&env, "pull-");
    assert_eq!(layout.len(), 1, "{layout:?}");

    // Alive: reap leaves it alone.
    let report = reap(&env);
    assert_eq!(
        report["leftovers"]["imageTempsRemoved"],
        serde_json::json!([])
    );
    assert!(partial.is_file(), "reap removed a live pull's download");

    // SAFETY: kill on the pid of our own child.
    unsafe { libc::kill(pull.id() as i32, libc::SIGKILL) };
    pull.wait().unwrap();
    assert!(partial.is_file(), "kill -9 runs no cleanup");
    let report = reap(&env);
    assert_eq!(
        report["leftovers"]["imageTempsRemoved"],
        serde_json::json!([layout[0].display().to_string()])
    );
    assert!(temps(&env, "").is_empty(), "{:?}", temps(&env, ""));
}

/// `kill -9` in the middle of the unpack (after its first layer) leaves the pull's layout
/// and the half-unpacked tree; `omabox reap` removes both, and the next pull publishes the
/// whole image.
#[test]
fn reap_removes_what_a_pull_killed_during_its_unpack_left() {
    use omabox_test_support::hostile_http::{HostileServer, image, serve_image};
    let image = image(&[
        tar_layer(&[("first", 0o644, b"1\n")]),
        tar_layer(&[("second", 0o644, b"2\n")]),
    ]);
    let served = image.clone();
    let server = HostileServer::start(move |request| serve_image(&served, request));
    let env = Env::new();
    let name = format!("{}/killed/unpack:1", server.host());
    let out = env
        .omabox(&["image", "pull", &name])
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_FAULT_POINT", "image-unpack-layer")
        .output()
        .unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(libc::SIGKILL),
        "{}",
        text(&out.stderr)
    );
    let hex = image.digest.trim_start_matches("sha256:");
    let unpack = temps(&env, hex);
    let layout = temps(&env, "pull-");
    assert_eq!(
        (unpack.len(), layout.len()),
        (1, 1),
        "{:?}",
        temps(&env, "")
    );
    assert!(unpack[0].join("rootfs/first").is_file());

    let report = reap(&env);
    let mut removed: Vec<String> = report["leftovers"]["imageTempsRemoved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    removed.sort();
    let mut expected: Vec<String> = unpack
        .iter()
        .chain(&layout)
        .map(|p| p.display().to_string())
        .collect();
    expected.sort();
    assert_eq!(removed, expected);
    assert!(temps(&env, "").is_empty());

    let pulled = json(&env.run(&["image", "pull", &name, "--json"]));
    let rootfs = PathBuf::from(pulled["rootfs"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(rootfs.join("second")).unwrap(),
        "2\n"
    );
}

/// Sandboxes starting on a tarball image while `omabox image rm` deletes it in a loop:
/// no sandbox ever runs on a partial tree (each counts the image's 300 files), no start
/// fails, and every `rm` either deletes the image (no sandbox starting on or reading it;
/// the next start unpacks it again) or says why it did not.
#[test]
fn image_rm_racing_sandbox_starts_never_leaves_a_sandbox_a_partial_tree() {
    use std::sync::atomic::{AtomicBool, Ordering};
    if !common::linux_available() {
        return;
    }
    let busybox_missing = (!std::fs::read(BUSYBOX).is_ok_and(|elf| is_static(&elf)))
        .then(|| format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)"));
    if !require_capability(busybox_missing) {
        return;
    }
    let env = Env::new();
    let busybox = std::fs::read(BUSYBOX).unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("files/f{i:03}")).collect();
    let mut entries: Vec<(&str, u32, &[u8])> = vec![("bin/busybox", 0o755, &busybox)];
    entries.extend(
        names
            .iter()
            .map(|n| (n.as_str(), 0o644, &b"0123456789"[..])),
    );
    let tarball = env.dir.path().join("many.tar");
    std::fs::write(&tarball, tar_layer(&entries)).unwrap();
    let tarball = tarball.display().to_string();
    let digest = omabox_backend_linux::ImageCache::new(env.cache())
        .resolve(Path::new(&tarball))
        .unwrap()
        .digest
        .unwrap();

    let stop = AtomicBool::new(false);
    let (runs, mut removals) = std::thread::scope(|scope| {
        let remover = scope.spawn(|| {
            let mut removals = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let out = env.run(&["image", "rm", &digest]);
                removals.push((out.status.code(), text(&out.stdout), text(&out.stderr)));
            }
            removals
        });
        let starters: Vec<_> = (0..3)
            .map(|_| {
                scope.spawn(|| {
                    (0..8)
                        .map(|_| {
                            env.run(&[
                                "sandbox",
                                "run",
                                "--image",
                                &tarball,
                                "--",
                                "/bin/busybox",
                                "sh",
                                "-c",
                                "/bin/busybox ls /files | /bin/busybox wc -l",
                            ])
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let runs: Vec<Output> = starters
            .into_iter()
            .flat_map(|s| s.join().unwrap())
            .collect();
        stop.store(true, Ordering::SeqCst);
        (runs, remover.join().unwrap())
    });
    for out in &runs {
        assert_eq!(
            (out.status.code(), text(&out.stdout).trim()),
            (Some(0), "300"),
            "a sandbox ran on a partial tree or failed: {}",
            text(&out.stderr)
        );
    }
    // Once nothing starts any more, the image goes (if a racing rm has not taken it).
    let out = env.run(&["image", "rm", &digest]);
    removals.push((out.status.code(), text(&out.stdout), text(&out.stderr)));
    for (code, stdout, stderr) in &removals {
        let understood = (*code == Some(0) && stdout.contains(&format!("deleted {digest}")))
            || (*code == Some(1)
                && (stderr.contains("is in use by sandbox")
                    || stderr.contains("is in use by a sandbox that is starting")
                    || stderr.contains("not in the image cache")));
        assert!(understood, "rm: {code:?} {stdout} {stderr}");
    }
    assert!(
        removals.iter().any(|(code, _, _)| *code == Some(0)),
        "no rm went through: {removals:?}"
    );
    env.assert_no_sandbox_left();
}

/// `OMABOX_IMAGE_MAX_ENTRIES`/`_MAX_BYTES` bound what a pull unpacks; a bad value is
/// refused naming its key; nothing of a refused image stays.
#[test]
fn image_pull_unpacks_within_the_configured_limits() {
    use omabox_test_support::hostile_http::{HostileServer, image, serve_image};
    let image = image(&[tar_layer(&[
        ("a", 0o644, b"a"),
        ("b", 0o644, b"b"),
        ("c", 0o644, &[7; 4096]),
    ])]);
    let served = image.clone();
    let server = HostileServer::start(move |request| serve_image(&served, request));
    let env = Env::new();
    let name = format!("{}/limited/image:1", server.host());
    for (key, value, expected) in [
        ("OMABOX_IMAGE_MAX_ENTRIES", "2", "more than 2 entries"),
        ("OMABOX_IMAGE_MAX_BYTES", "1K", "more than 1024 bytes"),
        (
            "OMABOX_IMAGE_MAX_BYTES",
            "lots",
            "OMABOX_IMAGE_MAX_BYTES=\"lots\" is invalid",
        ),
    ] {
        let out = env
            .omabox(&["image", "pull", &name])
            .env(key, value)
            .output()
            .unwrap();
        assert_ne!(out.status.code(), Some(0), "{key}={value}");
        assert!(
            text(&out.stderr).contains(expected),
            "{}",
            text(&out.stderr)
        );
        assert!(temps(&env, "").is_empty());
    }
    let pulled = json(&env.run(&["image", "pull", &name, "--json"]));
    assert_eq!(pulled["digest"], image.digest.as_str());
}

/// One HTTP/1.0 request to serve → (status, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, Vec<u8>) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let mut head = format!(
        "{method} {path} HTTP/1.0\r\nhost: {addr}\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).unwrap();
    let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&response[..split])
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    (status, response[split + 4..].to_vec())
}

/// The stdout bytes of a Connect `process.Process/Start` answer (its JSON envelopes).
fn streamed_stdout(mut body: &[u8]) -> Vec<u8> {
    let mut stdout = Vec::new();
    while body.len() >= 5 {
        let length = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        let message: serde_json::Value = serde_json::from_slice(&body[5..5 + length]).unwrap();
        if let Some(data) = message["event"]["data"]["stdout"].as_str() {
            stdout.extend(
                base64::engine::general_purpose::STANDARD
                    .decode(data)
                    .unwrap(),
            );
        }
        body = &body[5 + length..];
    }
    stdout
}

#[test]
fn an_e2b_template_naming_a_registry_image_starts_sandboxes_of_it() {
    if !require_capability(registry_missing()) || !common::linux_available() {
        return;
    }
    const KEY: &str = "omk_template-test-key";
    let registry = TestRegistry::start();
    push(&registry, "test/busybox", "tpl", "from the template\n");
    let env = Env::new();
    let template = format!("{}/test/busybox:tpl", registry.host());
    let mut command = env.omabox(&["serve", "--listen", "127.0.0.1:0"]);
    command.env("OMABOX_API_KEY", KEY);
    let serve = common::serve::Serve::start(command);
    let json_headers = [("x-api-key", KEY), ("content-type", "application/json")];

    let body = format!(r#"{{"templateID":"{template}","timeout":60}}"#);
    let (status, created) = http(
        &serve.addr,
        "POST",
        "/v2/sandboxes",
        &json_headers,
        body.as_bytes(),
    );
    assert_eq!(status, 201, "{}", text(&created));
    let created: serde_json::Value = serde_json::from_slice(&created).unwrap();
    assert_eq!(created["templateID"], template.as_str());
    let (id, token) = (
        created["sandboxID"].as_str().unwrap(),
        created["envdAccessToken"].as_str().unwrap(),
    );

    // The sandbox's root is the image's: its marker is there.
    let start =
        serde_json::json!({ "process": { "cmd": "/bin/busybox", "args": ["cat", "/marker"] } });
    let start = serde_json::to_vec(&start).unwrap();
    let mut enveloped = vec![0u8];
    enveloped.extend((start.len() as u32).to_be_bytes());
    enveloped.extend(start);
    let (status, answer) = http(
        &serve.addr,
        "POST",
        "/process.Process/Start",
        &[
            ("content-type", "application/connect+json"),
            ("e2b-sandbox-id", id),
            ("x-access-token", token),
            ("authorization", "Basic cm9vdDo="),
        ],
        &enveloped,
    );
    assert_eq!(status, 200);
    assert_eq!(
        text(&streamed_stdout(&answer)),
        "from the template\n",
        "{}",
        text(&answer)
    );

    // A template that names no image this server can get: 400 naming it, nothing started.
    let missing = format!("{}/test/nothing:here", registry.host());
    let body = format!(r#"{{"templateID":"{missing}"}}"#);
    let (status, refused) = http(
        &serve.addr,
        "POST",
        "/v2/sandboxes",
        &json_headers,
        body.as_bytes(),
    );
    assert_eq!(status, 400, "{}", text(&refused));
    assert!(
        text(&refused).contains("test/nothing:here"),
        "{}",
        text(&refused)
    );

    let (status, _) = http(
        &serve.addr,
        "DELETE",
        &format!("/sandboxes/{id}"),
        &json_headers,
        b"",
    );
    assert_eq!(status, 204);
    serve.stop();
    env.assert_no_sandbox_left();
}
