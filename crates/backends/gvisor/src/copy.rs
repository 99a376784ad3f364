//! A fork's copy of a workspace tree. Never: follow a sandbox-made symlink on the host.

use std::path::Path;

use crate::GvisorError;

/// Copies a workspace tree: directories, regular files and symlinks (as links, never
/// followed); anything else (fifos, sockets, devices) is skipped.
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<(), GvisorError> {
    let io = |what: &Path, e| GvisorError::Io {
        what: format!("copying the workspace at {}", what.display()),
        source: e,
    };
    std::fs::create_dir(to).map_err(|e| io(to, e))?;
    for entry in std::fs::read_dir(from).map_err(|e| io(from, e))? {
        let entry = entry.map_err(|e| io(from, e))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type().map_err(|e| io(&src, e))?;
        if kind.is_dir() {
            copy_tree(&src, &dst)?;
        } else if kind.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| io(&src, e))?;
            std::os::unix::fs::symlink(target, &dst).map_err(|e| io(&dst, e))?;
        } else if kind.is_file() {
            copy_file(&src, &dst).map_err(|e| io(&src, e))?;
        }
    }
    Ok(())
}

/// Copies one regular file without following a link at `src` (O_NOFOLLOW).
fn copy_file(src: &Path, dst: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut input = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(src)?;
    let mode = input.metadata()?.permissions();
    let mut output = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(dst)?;
    std::io::copy(&mut input, &mut output)?;
    output.set_permissions(mode)?;
    Ok(())
}
