//! The runtime dir ([`RuntimeConfig::runtime_dir`](crate::RuntimeConfig), default
//! `/run/omabox`) holds one state dir per sandbox, made and removed at every start. It
//! belongs in memory: what it records means nothing after a reboot, and on a disk file
//! system each state dir's removal costs a write to the disk (measured on this project's
//! CI machine, ext4 mounted `-o discard`: `rmdir` waits ~65 µs for the discard of the
//! directory's one block, ~3 µs on tmpfs — a sizeable part of a one-shot run).
//!
//! `/run` is a tmpfs wherever an init system mounts it; where it is not (a VM or container
//! without one, like that CI machine), [`ensure`] mounts a small private tmpfs on a runtime
//! dir directly below `/run` the first time one is used, as root — `/run`'s own contract,
//! kept for our corner of it. Only while the dir is empty: a tmpfs over existing state
//! dirs would hide their sandboxes from `omabox reap`. Every root start calls [`ensure`]
//! before it forks anything (a process forked earlier would keep the disk dir in its
//! mount namespace), and the mount is made under a lock next to the dir, so concurrent
//! first starts agree on one tmpfs. Runtime dirs elsewhere (tests use temporary ones) are
//! left as they are. The host-wide id-range slots (`idmap::SLOTS_DIR`, a file claimed and
//! unlinked at every start) go on a tmpfs the same way ([`ensure_locked`]).

use std::io;
use std::os::unix::fs::DirBuilderExt as _;
use std::path::{Path, PathBuf};

use crate::sys;

/// The most the tmpfs holds: state dirs are a few small JSON files each.
const TMPFS_OPTIONS: &str = "mode=0700,size=64m";

/// Creates the runtime dir (0700) if absent and, as root, puts it on a tmpfs when it is
/// directly below a `/run` that is not one (see the module doc). Returns whether it is
/// on a tmpfs now. A mount that fails (no `CAP_SYS_ADMIN`, say) leaves the dir as it was.
pub fn ensure(dir: &Path) -> io::Result<bool> {
    ensure_holding(dir, None)
}

/// [`ensure`] for a dir whose users take the lock file `dir/<lock_file>` around every
/// change to it (the id-range slots, `idmap`): the tmpfs goes on only while this holds
/// that lock too and the dir holds nothing but that file, so no change is under way and
/// nothing is hidden.
pub(crate) fn ensure_locked(dir: &Path, lock_file: &str) -> io::Result<bool> {
    ensure_holding(dir, Some(lock_file))
}

fn ensure_holding(dir: &Path, lock_file: Option<&str>) -> io::Result<bool> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    if sys::on_tmpfs(dir)? {
        return Ok(true);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let Some(lock) = lock_path(dir).filter(|_| root) else {
        return Ok(false);
    };
    let _lock = sys::FileLock::take(&lock)?;
    if sys::on_tmpfs(dir)? {
        return Ok(true); // another start mounted it meanwhile
    }
    let _users = lock_file
        .map(|name| sys::FileLock::take(&dir.join(name)))
        .transpose()?;
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        if lock_file.is_none_or(|lock| name != lock) {
            return Ok(false);
        }
    }
    match sys::mount(
        Some(Path::new("tmpfs")),
        dir,
        Some("tmpfs"),
        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
        Some(TMPFS_OPTIONS),
    ) {
        Ok(()) => Ok(true),
        Err(e) => {
            tracing::debug!(dir = %dir.display(), error = %e, "runtime dir stays on disk");
            Ok(false)
        }
    }
}

/// `/run/<name>.lock` for a runtime dir `/run/<name>`; `None` for any other dir (or when
/// `/run` itself is a tmpfs already, as it is under an init system).
fn lock_path(dir: &Path) -> Option<PathBuf> {
    let run = Path::new("/run");
    if dir.parent() != Some(run) || sys::on_tmpfs(run).unwrap_or(true) {
        return None;
    }
    let name = dir.file_name()?.to_str()?;
    Some(run.join(format!("{name}.lock")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unmounts and removes a test's runtime dir below `/run`.
    struct Cleanup(PathBuf);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            while sys::umount2(&self.0, libc::MNT_DETACH).is_ok() {}
            let _ = std::fs::remove_dir_all(&self.0);
            let _ = std::fs::remove_file(lock_path(&self.0).unwrap_or_default());
        }
    }

    fn root() -> bool {
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() == 0 };
        omabox_test_support::require_capability((!root).then(|| "needs root".to_owned()))
    }

    fn run_on_disk() -> bool {
        !sys::on_tmpfs(Path::new("/run")).unwrap()
    }

    fn device(path: &Path) -> u64 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(path).unwrap().dev()
    }

    #[test]
    fn a_runtime_dir_below_a_disk_run_goes_on_a_tmpfs_once() {
        if !root() {
            return;
        }
        let dir = PathBuf::from(format!("/run/omabox-test-tmpfs-{}", std::process::id()));
        let _cleanup = Cleanup(dir.clone());
        assert!(ensure(&dir).unwrap());
        assert!(sys::on_tmpfs(&dir).unwrap());
        if !run_on_disk() {
            // `/run` is a tmpfs already (an init system's): nothing is mounted on top.
            assert_eq!(device(&dir), device(Path::new("/run")));
            return;
        }
        assert_ne!(device(&dir), device(Path::new("/run")));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o700);
        std::fs::create_dir(dir.join("state")).unwrap();
        // A second call mounts nothing more (the state dir stays visible).
        assert!(ensure(&dir).unwrap());
        assert!(dir.join("state").is_dir());
    }

    #[test]
    fn a_runtime_dir_holding_state_dirs_stays_where_it_is() {
        if !root() {
            return;
        }
        let dir = PathBuf::from(format!("/run/omabox-test-busy-{}", std::process::id()));
        let _cleanup = Cleanup(dir.clone());
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("0123456789abcdef")).unwrap();
        assert_eq!(ensure(&dir).unwrap(), !run_on_disk());
        assert_eq!(device(&dir), device(Path::new("/run")));
        assert!(dir.join("0123456789abcdef").is_dir());
    }

    #[test]
    fn a_locked_dir_goes_on_a_tmpfs_when_it_holds_only_its_lock_file() {
        if !root() {
            return;
        }
        let dir = PathBuf::from(format!("/run/omabox-test-slots-{}", std::process::id()));
        let _cleanup = Cleanup(dir.clone());
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join("7"), "a live slot").unwrap();
        // A slot is there: hiding it would hand its range out twice.
        assert_eq!(ensure_locked(&dir, "lock").unwrap(), !run_on_disk());
        assert_eq!(device(&dir), device(Path::new("/run")));
        std::fs::remove_file(dir.join("7")).unwrap();
        // Only the users' lock file: a tmpfs now (on a disk `/run`), empty.
        assert!(ensure_locked(&dir, "lock").unwrap());
        assert!(sys::on_tmpfs(&dir).unwrap());
        if run_on_disk() {
            assert_ne!(device(&dir), device(Path::new("/run")));
            assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
        }
    }

    #[test]
    fn a_runtime_dir_elsewhere_is_left_as_it_is() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let on_tmpfs = ensure(&dir).unwrap();
        assert!(dir.is_dir());
        assert_eq!(on_tmpfs, sys::on_tmpfs(tmp.path()).unwrap());
    }
}
