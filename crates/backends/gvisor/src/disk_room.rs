//! Room on disk for a checkpoint: a pause writes the sandbox's memory to the backend's
//! directory (uncompressed), and a disk it fills fails everything else that writes there —
//! workspace checkpoints first. So a pause is refused, the sandbox left running, unless the
//! file system holds the sandbox's memory in use (its memory cgroup's figure, which also
//! counts gVisor's kernel: an overestimate) plus [`CHECKPOINT_DISK_RESERVE`].

use std::path::Path;

use crate::GvisorError;

/// What a checkpoint must leave free on the backend's file system.
pub const CHECKPOINT_DISK_RESERVE: u64 = 256 << 20;

/// Bytes sandbox `id`'s memory cgroup counts (cgroup v1 `memory.usage_in_bytes`, else v2
/// `memory.current`); 0 when it cannot be read.
fn memory_in_use(id: &str) -> u64 {
    let cgroup = crate::bundle::memory_cgroup(id);
    ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .find_map(|file| std::fs::read_to_string(cgroup.join(file)).ok())
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// What a checkpoint of `in_use` bytes of memory needs free.
fn needed(in_use: u64) -> u64 {
    in_use.saturating_add(CHECKPOINT_DISK_RESERVE)
}

/// Refuses ([`GvisorError::NoDiskRoom`]) when the file system of `dir` has less room than a
/// checkpoint of sandbox `id` needs.
pub(crate) fn check(dir: &Path, id: &str) -> Result<(), GvisorError> {
    let stat = rustix::fs::statvfs(dir).map_err(|e| GvisorError::Io {
        what: format!("reading the free space under {}", dir.display()),
        source: e.into(),
    })?;
    let free = stat.f_bavail.saturating_mul(stat.f_frsize);
    let needed = needed(memory_in_use(id));
    if free < needed {
        return Err(GvisorError::NoDiskRoom {
            dir: dir.to_path_buf(),
            free_mib: free >> 20,
            needed_mib: needed.div_ceil(1 << 20),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_checkpoint_needs_its_memory_plus_the_reserve() {
        assert_eq!(needed(0), CHECKPOINT_DISK_RESERVE);
        assert_eq!(needed(100 << 20), (100 << 20) + CHECKPOINT_DISK_RESERVE);
        assert_eq!(needed(u64::MAX), u64::MAX);
    }

    #[test]
    fn a_file_system_without_room_refuses_and_says_how_much_is_missing() {
        // An id with no cgroup: its memory reads as 0, so the reserve alone decides.
        let id = "omabox-gv-00000000000000000000000000000000";
        let roomy = tempfile::tempdir().unwrap();
        let free = rustix::fs::statvfs(roomy.path()).unwrap();
        if free.f_bavail.saturating_mul(free.f_frsize) > CHECKPOINT_DISK_RESERVE {
            check(roomy.path(), id).unwrap();
        }
        // /proc has no free blocks at all.
        match check(Path::new("/proc"), id) {
            Err(GvisorError::NoDiskRoom {
                free_mib,
                needed_mib,
                ..
            }) => {
                assert_eq!(free_mib, 0);
                assert_eq!(needed_mib, CHECKPOINT_DISK_RESERVE >> 20);
            }
            other => panic!("no room on /proc: {other:?}"),
        }
    }
}
