//! The official `anthropic` and `openai` Python SDKs in a venv under the target directory,
//! installed once from PyPI and reused. Without Python or PyPI the SDK tests skip loudly;
//! under `CI=true` that is a failure.

use std::path::PathBuf;
use std::process::Command;

const PACKAGES: &[&str] = &["anthropic", "openai"];

fn venv_python(venv: &std::path::Path) -> PathBuf {
    venv.join("bin").join("python")
}

fn has_sdks(python: &std::path::Path) -> bool {
    // A marker written after a verified install spares every test the slow import check.
    let marker = python.with_file_name(".sdks-installed");
    if marker.exists() {
        return true;
    }
    let ok = Command::new(python)
        .args(["-c", "import anthropic, openai"])
        .status()
        .is_ok_and(|status| status.success());
    if ok {
        let _ = std::fs::write(marker, PACKAGES.join("\n"));
    }
    ok
}

/// The venv's python with both SDKs, or `None` (after printing why) when they cannot be
/// installed outside CI. Panics under `CI=true`.
pub fn sdk_python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let venv = root.join("sdk-venv");
    if has_sdks(&venv_python(&venv)) {
        return Some(venv_python(&venv));
    }
    // Build in a private directory, then rename into place: concurrent test processes race
    // harmlessly (the loser's rename fails and it uses the winner's venv).
    let staging = root.join(format!("sdk-venv.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    let result = (|| -> Result<(), String> {
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&staging)
            .status()
            .map_err(|e| format!("cannot run python3: {e}"))?;
        if !status.success() {
            return Err(format!("python3 -m venv failed: {status}"));
        }
        let status = Command::new(venv_python(&staging))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(PACKAGES)
            .status()
            .map_err(|e| format!("cannot run pip: {e}"))?;
        if !status.success() {
            return Err(format!("pip install {PACKAGES:?} failed: {status}"));
        }
        Ok(())
    })();
    match result {
        Ok(()) => {
            if std::fs::rename(&staging, &venv).is_ok() || has_sdks(&venv_python(&venv)) {
                let _ = std::fs::remove_dir_all(&staging);
                return Some(venv_python(&venv));
            }
            Some(venv_python(&staging))
        }
        Err(why) => {
            let _ = std::fs::remove_dir_all(&staging);
            omabox_test_support::require_capability(Some(format!(
                "the official Python SDKs are not available ({why})"
            )));
            None
        }
    }
}
