//! Where a backend finds the helper binaries installed beside `omabox` (the docker
//! backend's `omabox-agent`, the gvisor backend's `omabox-gvisor-init`).

use std::path::{Path, PathBuf};

/// `explicit` when given, else `name` next to this executable or one directory up (cargo's
/// `deps/` for tests): the first that is a file. `Err`: the paths tried, for the error.
pub fn beside_executable(name: &str, explicit: Option<&Path>) -> Result<PathBuf, String> {
    let mut candidates = Vec::new();
    match explicit {
        Some(path) => candidates.push(path.to_path_buf()),
        None => {
            if let Ok(exe) = std::env::current_exe()
                && let Some(dir) = exe.parent()
            {
                candidates.push(dir.join(name));
                if let Some(up) = dir.parent() {
                    candidates.push(up.join(name));
                }
            }
        }
    }
    match candidates.iter().find(|c| c.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")),
    }
}
