//! A sandbox's state dir, `<runtime_dir>/<id>`: the names of the files in it, its removal
//! and the one reader of those files. Below `identity`, `leftovers` and `image_use`, which
//! each write one of them, so that none of them needs another to remove the dir.
//!
//! It must never recurse into a dir, nor follow a symlink when it reads.

use std::io;
use std::path::Path;

/// The sandbox's [`SandboxIdentity`](crate::SandboxIdentity) (`identity`).
pub(crate) const IDENTITY_FILE: &str = "identity.json";
/// The owner record in every state dir (`leftovers`).
pub const OWNER_FILE: &str = "owner.json";
/// The record of the roots a sandbox reads (`image_use`).
pub const ROOTS_FILE: &str = "roots.json";
/// The scratch mount point older versions made in each state dir (now the state dir
/// itself is the mount point); still removed if found.
pub(crate) const SCRATCH_DIR: &str = "scratch";

/// Reads a file of at most 64 KiB without following a symlink; `None` otherwise.
pub(crate) fn read_small(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.take(64 * 1024).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Removes a state dir without ever recursing: it holds only the identity, owner and roots
/// files
/// (and, made by older versions, an empty `scratch` mount point; mounts happen in the
/// sandbox's own namespace). Anything else there is an error, not something to delete
/// blindly.
pub(crate) fn remove(dir: &Path) -> io::Result<()> {
    for f in [
        dir.join(IDENTITY_FILE),
        dir.join(OWNER_FILE),
        dir.join(ROOTS_FILE),
    ] {
        match std::fs::remove_file(&f) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    for d in [dir.join(SCRATCH_DIR), dir.to_path_buf()] {
        match std::fs::remove_dir(&d) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
