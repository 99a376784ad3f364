//! The `/workspace` directory of one `omabox sandbox run`: the caller's (`--workspace`) or a
//! temporary one, removed after the sandbox is gone.

use std::path::{Path, PathBuf};

/// The `/workspace` directory of the run.
pub(super) enum Workspace {
    Given(PathBuf),
    /// `workspace` in `dir` (0700, see [`Workspace::temporary`]).
    Temporary {
        dir: tempfile::TempDir,
        workspace: PathBuf,
    },
}

impl Workspace {
    /// A fresh temporary workspace. The sandbox writes into it as the directory's owner: a
    /// parent only its owner may enter keeps other host users out of what it writes, while
    /// `/workspace` itself stays an ordinary 0755 directory inside.
    pub(super) fn temporary() -> std::io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("omabox-run-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()?;
        let workspace = dir.path().join("workspace");
        std::fs::create_dir(&workspace)?;
        Ok(Self::Temporary { dir, workspace })
    }

    pub(super) fn path(&self) -> &Path {
        match self {
            Self::Given(p) => p,
            Self::Temporary { workspace, .. } => workspace,
        }
    }

    /// Removes a temporary workspace (after the sandbox is gone).
    pub(super) fn finish(self) -> Result<(), String> {
        match self {
            Self::Given(_) => Ok(()),
            Self::Temporary { dir: t, .. } => {
                let path = t.path().to_path_buf();
                t.close().map_err(|e| {
                    format!(
                        "removing the temporary workspace {} failed: {e}",
                        path.display()
                    )
                })
            }
        }
    }
}
