//! Sandbox paths → host paths.
//!
//! | sandbox path                       | host path                    |
//! |------------------------------------|------------------------------|
//! | `/workspace`, `/workspace/<rest>`  | `<workdir>/<rest>`           |
//! | `<relative>`                       | `<workdir>/<relative>`       |
//! | `/mnt/session/outputs[/<rest>]`    | `<outputsRoot>/<rest>` (error when no outputs root) |
//! | any other absolute path            | error                        |
//!
//! `<rest>` is normalised lexically; a `..` that would climb above the root is an error, and
//! so is a path whose existing part resolves (through symlinks) outside the root. The file
//! API is fenced this way; commands run by `exec` are not (this backend has no isolation).

use crate::error::LocalSandboxError;
use omabox_contract::{OUTPUTS_MOUNT_PATH, WORKSPACE_MOUNT_PATH};
use std::path::{Component, Path, PathBuf};

/// The host directories a local sandbox maps its paths to.
#[derive(Debug, Clone)]
pub(crate) struct SandboxPaths {
    workdir: PathBuf,
    outputs_root: Option<PathBuf>,
}

fn strip_mount<'a>(path: &'a str, mount: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(mount)?;
    if rest.is_empty() {
        Some("")
    } else {
        rest.strip_prefix('/')
    }
}

impl SandboxPaths {
    /// `workdir` and `outputs_root` must be canonical (absolute, symlink-free).
    pub(crate) fn new(workdir: PathBuf, outputs_root: Option<PathBuf>) -> Self {
        Self {
            workdir,
            outputs_root,
        }
    }

    pub(crate) fn workdir(&self) -> &Path {
        &self.workdir
    }

    pub(crate) fn outputs_root(&self) -> Option<&Path> {
        self.outputs_root.as_deref()
    }

    /// The host path for `path`, fenced to its root.
    pub(crate) fn resolve(&self, path: &str) -> Result<PathBuf, LocalSandboxError> {
        if path.contains('\0') {
            return Err(LocalSandboxError::InvalidPath {
                path: path.to_owned(),
                reason: "contains a NUL byte",
            });
        }
        let (root, root_name, rest) = if let Some(rest) = strip_mount(path, WORKSPACE_MOUNT_PATH) {
            (&self.workdir, WORKSPACE_MOUNT_PATH, rest)
        } else if let Some(rest) = strip_mount(path, OUTPUTS_MOUNT_PATH) {
            let root =
                self.outputs_root
                    .as_ref()
                    .ok_or_else(|| LocalSandboxError::OutputsNotMounted {
                        path: path.to_owned(),
                    })?;
            (root, OUTPUTS_MOUNT_PATH, rest)
        } else if path.starts_with('/') {
            return Err(LocalSandboxError::OutsideRoots {
                path: path.to_owned(),
            });
        } else {
            (&self.workdir, WORKSPACE_MOUNT_PATH, path)
        };

        let escapes = || LocalSandboxError::Escapes {
            path: path.to_owned(),
            root: root_name,
        };
        let mut resolved = root.clone();
        let mut depth = 0usize;
        for component in Path::new(rest).components() {
            match component {
                Component::Normal(part) => {
                    resolved.push(part);
                    depth += 1;
                }
                Component::ParentDir => {
                    if depth == 0 {
                        return Err(escapes());
                    }
                    resolved.pop();
                    depth -= 1;
                }
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        if !existing_part_stays_inside(&resolved, root) {
            return Err(escapes());
        }
        Ok(resolved)
    }

    /// A host-path environment value for `/workspace` paths; other values unchanged.
    pub(crate) fn translate_env_value(&self, value: &str) -> String {
        match strip_mount(value, WORKSPACE_MOUNT_PATH) {
            Some(_) => self
                .resolve(value)
                .map(|path| path.to_string_lossy().into_owned())
                .unwrap_or_else(|_| value.to_owned()),
            None => value.to_owned(),
        }
    }
}

/// True when the deepest existing ancestor of `path` (or `path` itself) canonicalises inside
/// `root`.
fn existing_part_stays_inside(path: &Path, root: &Path) -> bool {
    let mut probe = path;
    loop {
        match probe.canonicalize() {
            Ok(canonical) => return canonical.starts_with(root),
            Err(_) => {
                // Something exists at `probe` but does not resolve (a dangling or looping
                // symlink): a write would go through it, so refuse.
                if probe.symlink_metadata().is_ok() {
                    return false;
                }
                match probe.parent() {
                    Some(parent) => probe = parent,
                    None => return false,
                }
            }
        }
    }
}
