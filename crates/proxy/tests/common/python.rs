//! The official `anthropic` and `openai` Python SDKs in a venv under the target directory,
//! installed once from PyPI and reused (`omabox_test_support::sdk`).

use std::path::PathBuf;

/// The venv's python with both SDKs, or `None` (after printing why) when they cannot be
/// installed outside CI. Panics under `CI=true`.
pub fn sdk_python() -> Option<PathBuf> {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    omabox_test_support::sdk::python_venv(
        &root,
        "sdk-venv",
        &["anthropic", "openai"],
        "anthropic, openai",
    )
}
