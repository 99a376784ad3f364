//! The official E2B SDKs, installed from PyPI and npm (pinned versions), drive `omabox
//! serve` unchanged through `E2B_API_URL`, `E2B_SANDBOX_URL` and `E2B_API_KEY`: sandboxes,
//! commands (streamed output, exit codes, stdin, background, connect, kill, a flood of
//! output), files (text, binary, list, metadata, an upload larger than the sandbox's disk),
//! watches with entries, the sandbox log, filesystem snapshots (Python and JS), template building (`Template.build` over a
//! Debian base, then `Sandbox.create` from the template) and the refusals (unknown
//! sandbox, wrong key, another sandbox's token, steps omabox cannot honour), on linux and on
//! `serve --backend docker` (and gvisor: pause with memory). The scripts
//! check every answer themselves (`tests/e2b_sdk/`); this test runs them against a real
//! serve and checks that its log holds none of the access tokens they saw.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::serve::Serve;
use common::{TestDirs, debian_rootfs, gvisor_missing, linux_available};
use std::path::{Path, PathBuf};
use std::process::Command;

const KEY: &str = "omk_e2b-sdk-test-operator-key";
/// The SDK versions the tests were written against.
const PYTHON_SDK: &str = "e2b==2.63.0";
const JS_SDK: &str = "e2b@2.51.0";

/// serve with small sandboxes (64 MiB: a 32 MiB `/workspace`), so an upload can overflow
/// one.
fn start_serve(dirs: &TestDirs) -> Serve {
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_MEMORY", "64M")
        .env("OMABOX_LOG", "debug");
    Serve::start(command)
}

/// serve with gvisor sandboxes of 256 MiB (a debug log, which the token check reads).
fn start_gvisor_serve(dirs: &TestDirs) -> Serve {
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "gvisor"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_MEMORY", "256M")
        .env("OMABOX_LOG", "debug");
    Serve::start(command)
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/e2b_sdk")
        .join(name)
}

/// Runs an SDK script against `serve`; its output, after checking it ended with `OK`.
fn run_sdk(mut command: Command, serve: &Serve, dirs: &TestDirs) -> Vec<String> {
    let tokens = dirs.data.path().join("sdk-tokens");
    let output = command
        .env("E2B_API_URL", serve.url())
        .env("E2B_SANDBOX_URL", serve.url())
        .env("E2B_API_KEY", KEY)
        .env("TOKENS_OUT", &tokens)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.lines().last() == Some("OK"),
        "the SDK script failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
    std::fs::read_to_string(&tokens)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The Python of a venv with the pinned SDK (installed once per target dir), or `None`
/// (skipped locally without the registries; a failure under CI=true).
/// A copy of the JS script `name` placed in the npm prefix holding the JS SDK (installed
/// when missing; `None`: it could not be, the reason printed): ES modules resolve packages
/// from the script's own directory. The caller removes the copy.
fn js_sdk_script(name: &str) -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let prefix = omabox_test_support::sdk::npm_prefix(&root, "e2b-js-sdk", &[JS_SDK])?;
    let copy = prefix.join(format!("{}.{name}", std::process::id()));
    std::fs::copy(script(name), &copy).unwrap();
    Some(copy)
}

fn python_sdk() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    omabox_test_support::sdk::python_venv(
        &root,
        "e2b-python-sdk",
        &[PYTHON_SDK, "httpx"],
        "e2b, httpx",
    )
}

fn assert_no_token_logged(log: &[String], tokens: &[String]) {
    assert!(!tokens.is_empty());
    // A piped log is plain text (no colour escapes for a collector to store).
    if let Some(line) = log.iter().find(|line| line.contains('\x1b')) {
        panic!("a log line to a pipe carries escapes: {line:?}");
    }
    for token in tokens {
        assert!(token.len() >= 32, "{token:?}");
        if let Some(line) = log.iter().find(|line| line.contains(token.as_str())) {
            panic!(
                "a token was logged: {}",
                line.replace(token.as_str(), "<TOKEN>")
            );
        }
    }
}

#[test]
fn the_official_python_sdk_drives_serve() {
    if !linux_available() {
        return;
    }
    let Some(python) = python_sdk() else {
        return;
    };
    let dirs = TestDirs::new("e2bpy");
    let serve = start_serve(&dirs);
    let mut command = Command::new(python);
    command.arg(script("sdk_test.py"));
    let tokens = run_sdk(command, &serve, &dirs);
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
}

/// Filesystem snapshots through the Python SDK (`snapshot_test.py`): taken, listed, started
/// from, deleted, refused where a memory snapshot is asked for; none of their files are
/// left once serve stopped.
#[test]
fn the_python_sdk_takes_snapshots_and_starts_sandboxes_from_them() {
    if !linux_available() {
        return;
    }
    let Some(python) = python_sdk() else {
        return;
    };
    let dirs = TestDirs::new("e2bsnap");
    let serve = start_serve(&dirs);
    let mut command = Command::new(python);
    command.arg(script("snapshot_test.py"));
    let tokens = run_sdk(command, &serve, &dirs);
    // The script deleted every snapshot and killed every sandbox: no files are kept.
    let saved = dirs.data.path().join("paused-sandboxes");
    let kept: Vec<_> = std::fs::read_dir(&saved)
        .unwrap()
        .flatten()
        .flat_map(|owner| std::fs::read_dir(owner.path()).unwrap().flatten())
        .map(|e| e.path())
        .collect();
    assert!(kept.is_empty(), "files of deleted snapshots kept: {kept:?}");
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
    let left: Vec<_> = std::fs::read_dir(&saved)
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "snapshot files left after serve stopped: {left:?}"
    );
}

#[test]
fn the_official_js_sdk_drives_serve() {
    if !linux_available() {
        return;
    }
    let Some(copy) = js_sdk_script("sdk_test.mjs") else {
        return;
    };
    let dirs = TestDirs::new("e2bjs");
    let serve = start_serve(&dirs);
    let mut command = Command::new("node");
    command.arg(&copy);
    let tokens = run_sdk(command, &serve, &dirs);
    let _ = std::fs::remove_file(&copy);
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
}

/// `Template.build` of the Python SDK over a Debian base (`base` = the image): a template
/// with a copied file and directory, a command and a build-time variable, built, started
/// with `Sandbox.create(template=…)`, chained; tags (`NAME:TAG` builds, `assign_tags`,
/// `remove_tags`, `get_tags`) each starting their build; listed (v1 and v2), a build's log
/// read, updated (`public` refused) and deleted through the SDK's API client; refusals
/// naming the step; a failing step.
#[test]
fn the_python_sdk_builds_a_template_and_starts_sandboxes_from_it() {
    if !linux_available() {
        return;
    }
    let Some(rootfs) = debian_rootfs() else {
        return;
    };
    let Some(python) = python_sdk() else {
        return;
    };
    let dirs = TestDirs::new("e2btpl");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_IMAGE", &rootfs)
        .env("OMABOX_LOG", "debug");
    let serve = Serve::start(command);
    let output = Command::new(python)
        .arg(script("template_test.py"))
        .env("E2B_API_URL", serve.url())
        .env("E2B_SANDBOX_URL", serve.url())
        .env("E2B_API_KEY", KEY)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let log = serve.stop();
    assert!(
        output.status.success() && stdout.lines().last() == Some("OK"),
        "the template script failed ({}):\n{stdout}\n{}\nserve:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        log.join("\n")
    );
    // An upload token is traced as hidden, like the keys.
    let traced: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("x-omabox-upload-token"))
        .collect();
    assert!(
        !traced.is_empty(),
        "the uploads were not traced (debug log)"
    );
    for line in traced {
        assert!(
            line.contains(r#""x-omabox-upload-token": Sensitive"#),
            "an upload token in the log: {line}"
        );
    }
    // Uploads end with serve.
    let uploads = dirs.data.path().join("template-files");
    let left: Vec<_> = std::fs::read_dir(&uploads)
        .map(|dir| dir.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "uploads left after serve stopped: {left:?}"
    );
}

/// `Template.build` of the JS SDK over a Debian base: a copied file and a command, a
/// sandbox from the template, a refused step.
#[test]
fn the_js_sdk_builds_a_template_and_starts_sandboxes_from_it() {
    if !linux_available() {
        return;
    }
    let Some(rootfs) = debian_rootfs() else {
        return;
    };
    let Some(copy) = js_sdk_script("template_test.mjs") else {
        return;
    };
    let dirs = TestDirs::new("e2bjstpl");
    let mut command = dirs.command(&["serve", "--listen", "127.0.0.1:0"]);
    command
        .env("OMABOX_API_KEY", KEY)
        .env("OMABOX_LINUX_IMAGE", &rootfs);
    let serve = Serve::start(command);
    let output = Command::new("node")
        .arg(&copy)
        .env("E2B_API_URL", serve.url())
        .env("E2B_SANDBOX_URL", serve.url())
        .env("E2B_API_KEY", KEY)
        .env_remove("E2B_DOMAIN")
        .env_remove("E2B_ACCESS_TOKEN")
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&copy);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let log = serve.stop();
    assert!(
        output.status.success() && stdout.lines().last() == Some("OK"),
        "the JS template script failed ({}):\n{stdout}\n{}\nserve:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        log.join("\n")
    );
}

/// E2B's full pause on `omabox serve --backend gvisor` through the Python SDK
/// (`gvisor_pause_test.py`): processes and memory go on after `connect`, a filesystem pause
/// ends them, a paused sandbox's kill removes it, forks and a memory snapshot go on from
/// the same memory. Nothing of a sandbox (directory, checkpoint, image, layer) is left once
/// serve stopped.
#[test]
fn the_python_sdk_pauses_a_gvisor_sandbox_with_its_memory() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    let Some(python) = python_sdk() else {
        return;
    };
    let dirs = TestDirs::new("e2bgv");
    let serve = start_gvisor_serve(&dirs);
    let mut command = Command::new(python);
    command.arg(script("gvisor_pause_test.py"));
    let tokens = run_sdk(command, &serve, &dirs);
    let sandboxes = dirs.data.path().join("gvisor/sandboxes");
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
    let left: Vec<_> = std::fs::read_dir(&sandboxes)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "gvisor sandboxes left after serve stopped: {left:?}"
    );
    // Memory snapshots (images) and the layers they and forks stacked go too.
    for kept in ["images", "bases"] {
        let dir = dirs.data.path().join("gvisor").join(kept);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{kept} left after serve stopped: {left:?}");
    }
}

/// An image template on `omabox serve --backend gvisor` through the Python SDK
/// (`gvisor_image_test.py`): a busybox image of a test registry is the sandbox's root, with
/// E2B's user added; its changes stay in the sandbox; a full pause, connect, fork and a
/// memory snapshot go on over the same root. Nothing of a sandbox is left once serve stopped.
#[test]
fn the_python_sdk_starts_gvisor_sandboxes_from_an_image_template() {
    use omabox_test_support::registry::TestRegistry;
    if !omabox_test_support::require_capability(
        gvisor_missing()
            .or_else(TestRegistry::missing)
            .or_else(busybox_missing),
    ) {
        return;
    }
    let Some(python) = python_sdk() else {
        return;
    };
    let registry = TestRegistry::start();
    let marker: &[u8] = b"from the image\n";
    registry.push_image(
        "test/gvimage",
        "1",
        &[busybox_layer(
            &["id", "cat", "mv", "sleep", "whoami"],
            &[("image-marker", marker)],
        )],
    );
    let dirs = TestDirs::new("e2bgvimg");
    let serve = start_gvisor_serve(&dirs);
    let mut command = Command::new(python);
    command
        .arg(script("gvisor_image_test.py"))
        .env(
            "IMAGE_TEMPLATE",
            format!("{}/test/gvimage:1", registry.host()),
        )
        .env("MISSING_IMAGE", format!("{}/test/none:1", registry.host()));
    let tokens = run_sdk(command, &serve, &dirs);
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
    let sandboxes = dirs.data.path().join("gvisor/sandboxes");
    let left: Vec<_> = std::fs::read_dir(&sandboxes)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(
        left.is_empty(),
        "gvisor sandboxes left after serve stopped: {left:?}"
    );
}

/// The same full pause through the official JS SDK (`gvisor_pause_test.mjs`):
/// `pause({ keepMemory })`, `Sandbox.connect`, `fork({ count })`, a memory snapshot and a
/// sandbox from it, a filesystem-only pause, a paused sandbox's kill. Nothing of a sandbox is
/// left once serve stopped.
#[test]
fn the_js_sdk_pauses_a_gvisor_sandbox_with_its_memory() {
    if !omabox_test_support::require_capability(gvisor_missing()) {
        return;
    }
    let Some(copy) = js_sdk_script("gvisor_pause_test.mjs") else {
        return;
    };
    let dirs = TestDirs::new("e2bjsgv");
    let serve = start_gvisor_serve(&dirs);
    let mut command = Command::new("node");
    command.arg(&copy);
    let tokens = run_sdk(command, &serve, &dirs);
    let _ = std::fs::remove_file(&copy);
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
    for kept in ["sandboxes", "images", "bases"] {
        let dir = dirs.data.path().join("gvisor").join(kept);
        let left: Vec<_> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{kept} left after serve stopped: {left:?}");
    }
}

/// Why a busybox image cannot be made here (`None`: it can): `/bin/busybox` must be static.
fn busybox_missing() -> Option<String> {
    let busybox = std::fs::read("/bin/busybox").unwrap_or_default();
    let dynamic = busybox.windows(14).any(|w| w == b"/lib64/ld-linu");
    (busybox.is_empty() || dynamic)
        .then(|| "/bin/busybox is not a static busybox (apt-get install busybox-static)".to_owned())
}

/// An image layer of the static busybox as `/bin/sh` and each of `applets` (copies),
/// `/bin/bash` handing the SDK's `bash -l -c` to that `sh`, an `/etc/passwd` with `root`
/// only (E2B's user must be added), and `files`.
fn busybox_layer(applets: &[&str], files: &[(&str, &[u8])]) -> Vec<u8> {
    let busybox = std::fs::read("/bin/busybox").unwrap();
    let bash: &[u8] = b"#!/bin/sh\nexec /bin/sh \"$@\"\n";
    let paths: Vec<String> = ["sh", "busybox"]
        .iter()
        .chain(applets)
        .map(|applet| format!("bin/{applet}"))
        .collect();
    let mut entries: Vec<(&str, u32, &[u8])> = paths
        .iter()
        .map(|path| (path.as_str(), 0o755, busybox.as_slice()))
        .collect();
    entries.push(("bin/bash", 0o755, bash));
    entries.push(("etc/passwd", 0o644, b"root:x:0:0:root:/root:/bin/sh\n"));
    entries.extend(files.iter().map(|(path, bytes)| (*path, 0o644, *bytes)));
    omabox_test_support::registry::tar_layer(&entries)
}

/// Why serve cannot run docker sandboxes here (`None`: it can): an engine, a test registry,
/// a static busybox for the images and the agent binary.
fn docker_missing() -> Option<String> {
    let agent = common::omabox_bin().with_file_name("omabox-agent");
    omabox_test_support::registry::TestRegistry::missing()
        .or_else(busybox_missing)
        .or_else(|| (!agent.is_file()).then(|| format!("{} is not built", agent.display())))
        .or_else(omabox_test_support::dockerd::TestDockerd::missing)
}

/// `omabox serve --backend docker` through the Python SDK (`docker_test.py`), then the JS SDK
/// (`docker_test.mjs`: commands, user, streaming, files, pause and connect): containers of
/// a test engine from images of a test registry (busybox, with `/bin/bash` handing the
/// SDK's `bash -l -c` to its `sh`), E2B's user added to them, commands, files, metrics of
/// the container's cgroup, a filesystem pause and connect, an image reference as the
/// template. No token in serve's log; no container left once serve stopped.
#[test]
fn the_python_and_js_sdks_drive_docker_sandboxes() {
    use omabox_test_support::registry::TestRegistry;
    if !omabox_test_support::require_capability(docker_missing()) {
        return;
    }
    let Some(python) = python_sdk() else {
        return;
    };
    let registry = TestRegistry::start();
    let applets = ["id", "stat", "touch", "sleep", "cat"];
    let tmp: &[u8] = b"";
    registry.push_image(
        "test/base",
        "1",
        &[busybox_layer(&applets, &[("tmp/.keep", tmp)])],
    );
    let other: &[u8] = b"other\n";
    registry.push_image(
        "test/other",
        "1",
        &[busybox_layer(
            &applets,
            &[("tmp/.keep", tmp), ("other-image", other)],
        )],
    );
    let dockerd = omabox_test_support::dockerd::TestDockerd::start();
    let dirs = TestDirs::new("e2bdocker");
    let serve_command = |dirs: &TestDirs| {
        let mut command =
            dirs.command(&["serve", "--listen", "127.0.0.1:0", "--backend", "docker"]);
        command
            .env("OMABOX_API_KEY", KEY)
            .env(
                "OMABOX_LINUX_IMAGE",
                format!("{}/test/base:1", registry.host()),
            )
            .env("OMABOX_LINUX_MEMORY", "256M")
            .env("DOCKER_HOST", dockerd.host())
            .env("OMABOX_LOG", "debug");
        command
    };
    let serve = Serve::start(serve_command(&dirs));
    let mut command = Command::new(python);
    command
        .arg(script("docker_test.py"))
        .env("OTHER_IMAGE", format!("{}/test/other:1", registry.host()))
        .env("MISSING_IMAGE", format!("{}/test/none:1", registry.host()));
    let mut tokens = run_sdk(command, &serve, &dirs);
    // The JS SDK against the same serve (`docker_test.mjs`).
    if let Some(copy) = js_sdk_script("docker_test.mjs") {
        let mut command = Command::new("node");
        command.arg(&copy);
        tokens.extend(run_sdk(command, &serve, &dirs));
        let _ = std::fs::remove_file(&copy);
    }
    let log = serve.stop();
    assert_no_token_logged(&log, &tokens);
    let containers = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(async {
                let engine = omabox_backend_docker::Engine::connect(&dockerd.host())
                    .await
                    .unwrap();
                engine
                    .containers_labelled(omabox_backend_docker::HOST_LABEL)
                    .await
                    .unwrap()
            })
    };
    let left = containers();
    assert!(
        left.is_empty(),
        "containers left after serve stopped: {left:?}"
    );

    // A serve killed with its sandbox running leaves a container `omabox reap` removes.
    let mut serve = Serve::start(serve_command(&dirs));
    let created = common::serve::sandbox_command(&dirs, &serve.url(), Some(KEY), &["create"])
        .env("DOCKER_HOST", dockerd.host())
        .output()
        .unwrap();
    assert!(created.status.success(), "{}", common::describe(&created));
    assert_eq!(containers().len(), 1, "the sandbox's container");
    serve.child().kill().unwrap();
    let _ = serve.child().wait();
    let reaped = dirs
        .command(&["reap"])
        .env("DOCKER_HOST", dockerd.host())
        .output()
        .unwrap();
    assert!(reaped.status.success(), "{}", common::describe(&reaped));
    let left = containers();
    assert!(left.is_empty(), "containers left after reap: {left:?}");
}
