//! Forks share their source's workspace without copying it: at a fork, the source's own
//! workspace is frozen into a base layer (renamed, never copied) under `<dir>/bases/`, and
//! the source and every fork get an overlay of the frozen layers with an upper directory
//! of their own (`<sandbox>/ws/upper`), mounted on the host at `<sandbox>/workspace`, the
//! path the bundle binds. A fork is then as fast with a 1 GiB workspace as with an empty
//! one, and no host code reads the files a sandbox left.
//!
//! Each sandbox lists its layers in `<sandbox>/ws/lowers` (newest first), written before a
//! new base exists, so [`collect_bases`] (after a destroy or a reap) never removes a base a
//! sandbox names. A source forked again freezes its upper into a new base on top of the
//! ones it had. Past [`MAX_LAYERS`], or where a path holds a character overlayfs options
//! cannot carry, forks copy the workspace instead (`copy.rs`).
//!
//! Must never: remove a sandbox directory whose overlay is still mounted (its merged view
//! would be walked; `unmount` first); let two sandboxes share an upper directory.

use std::ffi::CString;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Layers one overlay stacks at most (overlayfs's option string is one page).
pub(crate) const MAX_LAYERS: usize = 32;
/// The file of a sandbox's layers, one absolute path per line, newest first.
const LOWERS: &str = "ws/lowers";

/// Held while layers are made or collected, so a collection in this process never sees a
/// base between its creation and the list that names it.
static LAYERING: Mutex<()> = Mutex::new(());

fn layering() -> std::sync::MutexGuard<'static, ()> {
    LAYERING
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The layers sandbox `sandbox` stacks (empty: its workspace is a plain directory).
pub(crate) fn lowers(sandbox: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string(sandbox.join(LOWERS))
        .map(|text| text.lines().map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// Whether `paths` can be named in overlayfs's options (no `:`, `,`, `\` or newline).
pub(crate) fn nameable(paths: &[&Path]) -> bool {
    paths.iter().all(|p| {
        p.to_str()
            .is_some_and(|s| !s.contains([':', ',', '\\', '\n']))
    })
}

/// Freezes `sandbox`'s workspace (its container stopped) into a new base under `bases` and
/// mounts the source's overlay over it; returns the layers forks stack.
pub(crate) fn freeze(bases: &Path, sandbox: &Path) -> io::Result<Vec<PathBuf>> {
    let _held = layering();
    std::fs::create_dir_all(bases)?;
    let base = bases.join(uuid::Uuid::new_v4().simple().to_string());
    let old = lowers(sandbox);
    let mut layers = vec![base.clone()];
    layers.extend(old.iter().cloned());
    let workspace = sandbox.join("workspace");
    // What becomes the base: the plain workspace, or the overlay's upper.
    let frozen = if old.is_empty() {
        workspace.clone()
    } else {
        unmount(sandbox)?;
        sandbox.join("ws/upper")
    };
    std::fs::create_dir_all(sandbox.join("ws"))?;
    write_lowers(sandbox, &layers)?;
    std::fs::rename(&frozen, &base)?;
    if old.is_empty() {
        std::fs::create_dir(&workspace)?;
    }
    let _ = std::fs::remove_dir_all(sandbox.join("ws/work"));
    mount_locked(sandbox, &layers)?;
    Ok(layers)
}

/// Mounts an overlay of `layers` at `sandbox`'s workspace with an upper of its own.
pub(crate) fn mount(sandbox: &Path, layers: &[PathBuf]) -> io::Result<()> {
    let _held = layering();
    std::fs::create_dir_all(sandbox.join("ws"))?;
    write_lowers(sandbox, layers)?;
    std::fs::create_dir_all(sandbox.join("workspace"))?;
    mount_locked(sandbox, layers)
}

/// Records `layers` as stacked by `dir` (an image's directory: nothing is mounted there), so
/// [`collect_bases`] keeps them.
pub(crate) fn record(dir: &Path, layers: &[PathBuf]) -> io::Result<()> {
    let _held = layering();
    std::fs::create_dir_all(dir.join("ws"))?;
    write_lowers(dir, layers)
}

fn write_lowers(sandbox: &Path, layers: &[PathBuf]) -> io::Result<()> {
    let text: String = layers
        .iter()
        .map(|l| format!("{}\n", l.display()))
        .collect();
    let temp = sandbox.join("ws/lowers.new");
    std::fs::write(&temp, text)?;
    std::fs::rename(temp, sandbox.join(LOWERS))
}

fn mount_locked(sandbox: &Path, layers: &[PathBuf]) -> io::Result<()> {
    let (upper, work) = (sandbox.join("ws/upper"), sandbox.join("ws/work"));
    std::fs::create_dir_all(&upper)?;
    std::fs::create_dir_all(&work)?;
    let lowerdir: Vec<String> = layers.iter().map(|l| l.display().to_string()).collect();
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lowerdir.join(":"),
        upper.display(),
        work.display()
    );
    let cstr =
        |s: &str| CString::new(s).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e));
    let (source, target, fstype, data) = (
        cstr("overlay")?,
        cstr(&sandbox.join("workspace").display().to_string())?,
        cstr("overlay")?,
        cstr(&options)?,
    );
    // SAFETY: every pointer is a NUL-terminated string alive for the call.
    let rc = unsafe {
        libc::mount(
            source.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Unmounts `sandbox`'s overlay, if it has one mounted (before its directory is removed).
pub(crate) fn unmount(sandbox: &Path) -> io::Result<()> {
    if lowers(sandbox).is_empty() {
        return Ok(());
    }
    let target = CString::new(sandbox.join("workspace").display().to_string())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: a NUL-terminated path alive for the call.
    if unsafe { libc::umount2(target.as_ptr(), libc::UMOUNT_NOFOLLOW) } != 0 {
        let error = io::Error::last_os_error();
        // Not mounted (a reboot, an earlier unmount) is done.
        if error.raw_os_error() != Some(libc::EINVAL) && error.raw_os_error() != Some(libc::ENOENT)
        {
            return Err(error);
        }
    }
    Ok(())
}

/// Removes the bases under `<dir>/bases` that no sandbox under `<dir>/sandboxes` and no
/// image under `<dir>/images` stacks.
pub(crate) fn collect_bases(dir: &Path) {
    let _held = layering();
    let Ok(bases) = std::fs::read_dir(dir.join("bases")) else {
        return;
    };
    let named: std::collections::HashSet<PathBuf> = ["sandboxes", "images"]
        .iter()
        .flat_map(|kind| {
            std::fs::read_dir(dir.join(kind))
                .into_iter()
                .flatten()
                .flatten()
        })
        .flat_map(|stacker| lowers(&stacker.path()))
        .collect();
    for base in bases.flatten() {
        let is_dir = base.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && !named.contains(&base.path()) {
            let _ = std::fs::remove_dir_all(base.path());
        }
    }
}
