//! Official client SDKs installed from the package registries for the tests that drive
//! omabox with them: a Python venv ([`python_venv`]) or an npm prefix ([`npm_prefix`])
//! under the test's target directory, installed once and reused. Without Python, node or
//! the registries the test skips loudly; under `CI=true` that is a failure.
//!
//! Concurrent test processes (nextest runs each test in its own) race harmlessly: each
//! builds in a private staging directory and renames it into place; the loser uses the
//! winner's copy.

use std::path::{Path, PathBuf};
use std::process::Command;

/// `root/name`: a venv with `packages` pip-installed, whose python imports `imports`
/// (comma-separated modules); its python, or `None` (after printing why) outside CI.
pub fn python_venv(root: &Path, name: &str, packages: &[&str], imports: &str) -> Option<PathBuf> {
    let python = |venv: &Path| venv.join("bin").join("python");
    let ready = |venv: &Path| {
        let marker = venv.join(".sdks-installed");
        if marker.exists() {
            return true;
        }
        let ok = Command::new(python(venv))
            .args(["-c", &format!("import {imports}")])
            .status()
            .is_ok_and(|status| status.success());
        if ok {
            let _ = std::fs::write(marker, packages.join("\n"));
        }
        ok
    };
    install(root, name, &ready, &|staging| {
        run(Command::new("python3").args(["-m", "venv"]).arg(staging))?;
        run(Command::new(python(staging))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(packages))
    })
    .map(|venv| python(&venv))
    .or_else(|| skip(&format!("the Python packages {packages:?}")))
}

/// `root/name`: an npm prefix with `packages` installed (scripts placed in it import
/// them); the prefix, or `None` (after printing why) outside CI.
pub fn npm_prefix(root: &Path, name: &str, packages: &[&str]) -> Option<PathBuf> {
    let ready = |prefix: &Path| {
        packages.iter().all(|package| {
            let bare = package.rsplit_once('@').map_or(*package, |(name, _)| name);
            let bare = if bare.is_empty() { package } else { bare };
            prefix
                .join("node_modules")
                .join(bare)
                .join("package.json")
                .exists()
        })
    };
    install(root, name, &ready, &|staging| {
        std::fs::create_dir_all(staging).map_err(|e| format!("cannot create {staging:?}: {e}"))?;
        std::fs::write(staging.join("package.json"), "{\"private\":true}\n")
            .map_err(|e| format!("cannot write package.json: {e}"))?;
        run(Command::new("npm")
            .args(["install", "--silent", "--no-audit", "--no-fund", "--prefix"])
            .arg(staging)
            .args(packages))
    })
    .or_else(|| skip(&format!("the npm packages {packages:?}")))
}

fn install(
    root: &Path,
    name: &str,
    ready: &dyn Fn(&Path) -> bool,
    build: &dyn Fn(&Path) -> Result<(), String>,
) -> Option<PathBuf> {
    let target = root.join(name);
    if ready(&target) {
        return Some(target);
    }
    let staging = root.join(format!("{name}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    match build(&staging) {
        Ok(()) => {
            if std::fs::rename(&staging, &target).is_ok() || ready(&target) {
                let _ = std::fs::remove_dir_all(&staging);
                return Some(target);
            }
            Some(staging)
        }
        Err(why) => {
            let _ = std::fs::remove_dir_all(&staging);
            eprintln!("cannot install into {staging:?}: {why}");
            None
        }
    }
}

fn run(command: &mut Command) -> Result<(), String> {
    let shown = format!("{command:?}");
    let status = command
        .status()
        .map_err(|e| format!("cannot run {shown}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{shown} failed: {status}"))
    }
}

fn skip<T>(what: &str) -> Option<T> {
    crate::require_capability(Some(format!(
        "{what} cannot be installed from the registry (see the lines above)"
    )));
    None
}
