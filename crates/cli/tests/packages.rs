//! `omabox run --environment FILE` with `packages`: real installs from PyPI and the npm
//! registry (through `allow_package_managers`) into `/workspace` before the harness starts,
//! the tool directories on the harness's PATH, the restored path on the session's next run,
//! and a failed install failing the run with the package manager's error.
//!
//! Needs root and linux sandboxes (skips with a reason elsewhere, fails under `CI=true`);
//! reaches pypi.org / files.pythonhosted.org, registry.npmjs.org and deb.debian.org only
//! (the apt test boots a Debian root filesystem made once with debootstrap).

mod common;

use common::{describe, init_bin, omabox_bin};
use omabox_backend_linux::factory::{CGROUP_PARENT_ENV, INIT_ENV, RUNTIME_DIR_ENV};
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output, Stdio};

struct Setup {
    dirs: common::TestDirs,
}

impl Setup {
    fn new() -> Option<Self> {
        if !common::linux_available() {
            return None;
        }
        Some(Self {
            dirs: common::TestDirs::new("packages"),
        })
    }

    /// `omabox run --json --session S --environment E -- sh -c SCRIPT`.
    fn run(&self, session: &str, environment: &str, script: &str) -> (Value, Output) {
        self.run_on(None, session, environment, script)
    }

    /// [`Setup::run`] with `image` (a rootfs directory) as the sandbox's root.
    fn run_on(
        &self,
        image: Option<&Path>,
        session: &str,
        environment: &str,
        script: &str,
    ) -> (Value, Output) {
        self.run_with(image, &[], session, environment, script)
    }

    /// [`Setup::run_on`] with extra variables for `omabox run`.
    fn run_with(
        &self,
        image: Option<&Path>,
        vars: &[(&str, &str)],
        session: &str,
        environment: &str,
        script: &str,
    ) -> (Value, Output) {
        self.run_args(image, vars, &[], session, environment, script)
    }

    /// [`Setup::run_with`] with extra arguments for `omabox run` (before `--`).
    fn run_args(
        &self,
        image: Option<&Path>,
        vars: &[(&str, &str)],
        args: &[&str],
        session: &str,
        environment: &str,
        script: &str,
    ) -> (Value, Output) {
        let file = self.dirs.data.path().join(format!("{session}-env.json"));
        std::fs::write(&file, environment).unwrap();
        let mut command = Command::new(omabox_bin());
        command.envs(vars.iter().copied());
        if let Some(image) = image {
            command.env("SANDBOX_IMAGE", image).env(
                "OMABOX_LINUX_IMAGE_CACHE",
                self.dirs.data.path().join("images"),
            );
        }
        if image.is_none() {
            command.env_remove("SANDBOX_IMAGE");
        }
        let output = command
            .arg("--data-dir")
            .arg(self.dirs.data.path())
            .args(["run", "--json", "--session", session, "--environment"])
            .arg(&file)
            .args(args)
            .args(["--", "sh", "-c", script])
            .env(RUNTIME_DIR_ENV, self.dirs.runtime_dir.path())
            .env(CGROUP_PARENT_ENV, &self.dirs.cgroup_parent)
            .env(INIT_ENV, init_bin())
            .env("OMABOX_LOG", "info")
            .env_remove("OMABOX_LINUX_IMAGE")
            .env_remove("OMABOX_LINUX_NETWORK")
            .stdin(Stdio::null())
            .output()
            .expect("omabox runs");
        let report = serde_json::from_slice(&output.stdout).unwrap_or(Value::Null);
        (report, output)
    }
}

const ENVIRONMENT: &str = r#"{"config":{"type":"cloud",
    "networking":{"type":"limited","allowed_hosts":[],"allow_package_managers":true},
    "packages":{"pip":["six==1.16.0"],"npm":["semver@7.6.0"],"gem":["rake"]}}}"#;

/// The harness proves the tools are there: the venv's python imports six, npm's bin dir
/// has `semver`, and both markers hold hashes.
const PROBE: &str = "python -c 'import six; print(\"six\", six.__version__)' \
    && semver 1.2.3 && test -s /tmp/.oma-setup-warm && test -s /workspace/.oma-setup-restored \
    && grep -q npm-global /workspace/.oma-env && echo tools-ok";

#[test]
fn packages_are_installed_before_the_harness_and_come_back_with_the_workspace() {
    let Some(setup) = Setup::new() else { return };
    let (report, output) = setup.run("pkgs", ENVIRONMENT, PROBE);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("six 1.16.0"), "{}", describe(&output));
    assert!(
        stderr.contains("1.2.3") && stderr.contains("tools-ok"),
        "{stderr}"
    );
    assert!(logged_path(&stderr, "Fresh"), "{stderr}");

    // The next run restores the workspace (venv, npm globals, markers) into a new sandbox:
    // the restored path re-runs apt only (none here), and the tools still work.
    let (report, output) = setup.run("pkgs", ENVIRONMENT, PROBE);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(logged_path(&stderr, "Restored"), "{stderr}");
    assert!(stderr.contains("tools-ok"), "{stderr}");
}

/// The `openma_supervised` lane gets the packages too (the host drives it through the
/// provider's supervisor transport, not the harness driver), from an Environment `config`
/// in the public API's exact shape: `"type": "packages"`, `null` lists and flags.
#[test]
fn packages_are_installed_before_a_supervised_harness_too() {
    let Some(setup) = Setup::new() else { return };
    let environment = r#"{"type":"cloud",
        "networking":{"type":"limited","allowed_hosts":null,"allow_mcp_servers":null,"allow_package_managers":true},
        "packages":{"type":"packages","apt":null,"cargo":null,"gem":null,"go":null,"npm":null,"pip":["six==1.16.0"]}}"#;
    let supervisor = r#"read start
{ command -v python; python -c 'import six; print(six.__file__)'; cat /tmp/.oma-setup-warm; } > probe.txt 2>&1
printf '{"type":"ready","protocol":"openma-harness-supervisor-v1"}\n{"type":"completed","exitCode":0}\n'
read drain
printf '{"type":"drained"}\n'"#;
    let (report, output) =
        setup.run_args(None, &[], &["--supervised"], "sup", environment, supervisor);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(logged_path(&stderr, "Fresh"), "{stderr}");
    let exported = setup.dirs.export("sup");
    let probe = std::fs::read_to_string(exported.path().join("ws/probe.txt")).unwrap();
    let lines: Vec<&str> = probe.lines().collect();
    assert_eq!(
        lines.first(),
        Some(&"/workspace/.venv/bin/python"),
        "{probe}"
    );
    assert!(
        lines
            .get(1)
            .is_some_and(|l| l.starts_with("/workspace/.venv/") && l.contains("six")),
        "{probe}"
    );
    assert_eq!(lines.len(), 3, "the warm marker: {probe}");
}

#[test]
fn a_failed_install_fails_the_run_with_the_package_managers_error() {
    let Some(setup) = Setup::new() else { return };
    let environment = r#"{"networking":{"type":"limited","allow_package_managers":true},
        "packages":{"pip":["omabox-no-such-package-7f3e9c==0.0.1"]}}"#;
    let (report, output) = setup.run("bad", environment, "echo harness-ran");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "failed", "{report}");
    let message = report["result"]["error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("full_setup_failed exit=1")
            && message.contains("omabox-no-such-package-7f3e9c"),
        "{message}"
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("harness-ran"));
    assert!(report["outputs"].as_array().is_none_or(Vec::is_empty));

    // apt needs an image root (the default root's /usr is the host's, read-only).
    let apt = r#"{"packages":{"apt":["jq"]}}"#;
    let (_, output) = setup.run("apt", apt, "true");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("packages.apt and dockerfile need an image root"),
        "{}",
        describe(&output)
    );
}

/// Whether the installer's log line says it took `path` (the line may carry ANSI styling).
fn logged_path(stderr: &str, path: &str) -> bool {
    stderr
        .lines()
        .any(|line| line.contains("environment packages") && line.contains(path))
}

#[test]
fn apt_packages_and_dockerfile_steps_are_built_once_into_an_environment_layer() {
    let Some(setup) = Setup::new() else { return };
    let Some(rootfs) = common::debian_rootfs() else {
        return;
    };
    // A file of omabox's file store for the dockerfile's COPY.
    let source = setup.dirs.data.path().join("table.csv");
    std::fs::write(&source, "a,b\n1,2\n").unwrap();
    let added = Command::new(omabox_bin())
        .arg("--data-dir")
        .arg(setup.dirs.data.path())
        .args(["files", "add", "--json"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(added.status.success(), "{}", describe(&added));
    let file_id = serde_json::from_slice::<Value>(&added.stdout).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let environment = format!(
        r##"{{"networking":{{"type":"limited","allow_package_managers":true}},
        "packages":{{"apt":["hello"]}},
        "dockerfile":"# the layer's own steps\nENV GREETING=\"hi there\"\nWORKDIR /opt/tool\nRUN printf '%s' \"$GREETING\" > greeting && hello > hello.txt\nCOPY {file_id} data/table.csv\nRUN grep -q 1,2 data/table.csv"}}"##
    );
    let environment = environment.as_str();
    let probe = "hello && test -s /workspace/.oma-setup-restored \
        && [ \"$GREETING\" = 'hi there' ] && [ \"$(cat /opt/tool/greeting)\" = \"$GREETING\" ] && grep -q Hello /opt/tool/hello.txt \
        && [ \"$(cat /opt/tool/data/table.csv)\" = \"$(printf 'a,b\\n1,2')\" ] && test ! -e /tmp/.omabox-copy \
        && echo apt-ok";
    let layer_line = |stderr: &str| {
        plain(stderr)
            .lines()
            .find(|l| l.contains("environment layer") && l.contains("built="))
            .unwrap_or_default()
            .to_owned()
    };
    // First session: the layer is built (apt in a build sandbox), the session's sandbox
    // starts from image + layer, and the installer finds apt there.
    let (report, output) = setup.run_on(Some(&rootfs), "apt", environment, probe);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Hello, world!") && stderr.contains("apt-ok"),
        "{stderr}"
    );
    assert!(layer_line(&stderr).contains("built=true"), "{stderr}");
    assert!(logged_path(&stderr, "Fresh"), "{stderr}");
    assert!(plain(&stderr).contains("apt_from_layer=true"), "{stderr}");
    let layers = setup.dirs.data.path().join("images/env-layers");
    let kept: Vec<_> = std::fs::read_dir(&layers)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        kept.len(),
        3,
        "one layer, its record and its lock: {kept:?}"
    );
    // Owner-only (a layer may hold files COPY took from the file store).
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&layers).unwrap().permissions().mode();
    assert_eq!(mode & 0o077, 0, "env-layers mode {mode:o}");
    // `omabox image ls` shows it, with its image and size.
    let listed = Command::new(omabox_bin())
        .args(["image", "ls", "--json"])
        .env(
            "OMABOX_LINUX_IMAGE_CACHE",
            setup.dirs.data.path().join("images"),
        )
        .output()
        .unwrap();
    assert!(listed.status.success(), "{}", describe(&listed));
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let layer = &listed["envLayers"][0];
    assert_eq!(layer["image"], rootfs.to_str().unwrap(), "{listed}");
    assert!(layer["sizeBytes"].as_u64().unwrap() > 10_000, "{listed}");

    // The session again (restored path) and a new session (fresh path): the layer is found,
    // nothing is installed.
    for session in ["apt", "apt-2"] {
        let (report, output) = setup.run_on(Some(&rootfs), session, environment, probe);
        assert!(output.status.success(), "{}", describe(&output));
        assert_eq!(report["result"]["type"], "completed", "{report}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(layer_line(&stderr).contains("built=false"), "{stderr}");
        assert!(plain(&stderr).contains("apt_from_layer=true"), "{stderr}");
        assert!(stderr.contains("apt-ok"), "{stderr}");
    }

    // A package apt does not know fails the run with apt's error, before the run claims
    // anything (the layer is built before the fence: no report); the harness never runs
    // and no layer (nor a partial one) is kept.
    let missing = r#"{"networking":{"type":"limited","allow_package_managers":true},
        "packages":{"apt":["omabox-no-such-package"]}}"#;
    let (report, output) = setup.run_on(Some(&rootfs), "apt-bad", missing, "echo harness-ran");
    assert_eq!(output.status.code(), Some(1), "{}", describe(&output));
    assert_eq!(report, Value::Null, "{}", describe(&output));
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        message.contains("environment layer: build_failed exit=100")
            && message.contains("Unable to locate package omabox-no-such-package"),
        "{message}"
    );
    assert!(!String::from_utf8_lossy(&output.stderr).contains("harness-ran"));
    let dirs = std::fs::read_dir(&layers)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_type().unwrap().is_dir())
        .count();
    assert_eq!(dirs, 1, "only the good layer");
}

/// `text` without ANSI escape sequences (log lines may be styled).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            // CSI: ESC [ parameters final-byte (a letter).
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[test]
fn a_run_killed_while_it_builds_a_layer_leaves_nothing_after_reap() {
    let Some(setup) = Setup::new() else { return };
    let Some(rootfs) = common::debian_rootfs() else {
        return;
    };
    let environment = r#"{"networking":{"type":"limited","allow_package_managers":true},
        "packages":{"apt":["hello"]}}"#;
    let file = setup.dirs.data.path().join("kill-env.json");
    std::fs::write(&file, environment).unwrap();
    let images = setup.dirs.data.path().join("images");
    let command = |args: &[&str]| {
        let mut command = Command::new(omabox_bin());
        command
            .arg("--data-dir")
            .arg(setup.dirs.data.path())
            .args(args)
            .env(RUNTIME_DIR_ENV, setup.dirs.runtime_dir.path())
            .env(CGROUP_PARENT_ENV, &setup.dirs.cgroup_parent)
            .env(INIT_ENV, init_bin())
            .env("SANDBOX_IMAGE", &rootfs)
            .env("OMABOX_LINUX_IMAGE_CACHE", &images)
            .stdin(Stdio::null());
        command
    };
    let status = command(&["run", "--session", "kill", "--environment"])
        .arg(&file)
        .args(["--", "true"])
        .env("OMABOX_TEST_MODE", "1")
        .env("OMABOX_FAULT_POINT", "env-layer-built")
        .output()
        .unwrap()
        .status;
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    let partials = || {
        std::fs::read_dir(images.join("env-layers"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".partial-"))
            .count()
    };
    let state_dirs = || {
        std::fs::read_dir(setup.dirs.runtime_dir.path())
            .unwrap()
            .count()
    };
    assert_eq!(partials(), 1, "the kill left its build dir");
    assert!(state_dirs() > 0, "the kill left its build sandbox");

    let reap = command(&["reap", "--json"]).output().unwrap();
    assert!(reap.status.success(), "{}", describe(&reap));
    assert_eq!(partials(), 0, "reap removed the build dir");
    let left: Vec<_> = std::fs::read_dir(setup.dirs.runtime_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| !n.to_string_lossy().starts_with('.'))
        .collect();
    assert!(left.is_empty(), "reap removed the build sandbox: {left:?}");

    // The environment still works: the next run (another session: the killed one's fence
    // holds until it expires) builds the layer.
    let (report, output) = setup.run_on(Some(&rootfs), "kill-2", environment, "hello");
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
}

/// `packages.cargo`: a real `cargo install` from crates.io (sparse index, through
/// `allow_package_managers`) into `/workspace/.cargo`. The default root has no Rust, so the
/// sandbox gets the host's toolchain read-only at `/usr/local` (what an image with Rust
/// would have); the crate is the smallest binary crate on crates.io that builds offline of
/// any dependency.
#[test]
fn cargo_packages_install_from_crates_io_into_the_workspace() {
    let Some(setup) = Setup::new() else { return };
    let sysroot = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned());
    if !omabox_test_support::require_capability(
        sysroot
            .is_none()
            .then(|| "no Rust toolchain on the host (rustc --print sysroot)".to_owned()),
    ) {
        return;
    }
    let bind = format!("{}:/usr/local", sysroot.unwrap());
    let environment = r#"{"networking":{"type":"limited","allow_package_managers":true},
        "packages":{"cargo":["hello_cargo@0.1.0"]}}"#;
    let probe = "hello_cargo && test -x /workspace/.cargo/bin/hello_cargo && echo cargo-ok";
    let vars = [("OMABOX_LINUX_READONLY_BINDS", bind.as_str())];
    let (report, output) = setup.run_with(None, &vars, "cargo", environment, probe);
    assert!(output.status.success(), "{}", describe(&output));
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Hello, world!") && stderr.contains("cargo-ok"),
        "{stderr}"
    );
    // The next run brings the installed binary back with the workspace.
    let (report, output) = setup.run_with(None, &vars, "cargo", environment, probe);
    assert_eq!(report["result"]["type"], "completed", "{report}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        logged_path(&stderr, "Restored") && stderr.contains("cargo-ok"),
        "{stderr}"
    );
}
