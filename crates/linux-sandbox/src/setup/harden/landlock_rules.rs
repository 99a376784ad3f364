//! The Landlock ruleset: read everywhere in the sandbox tree, write only in its writable
//! places, a few device files, signals and abstract unix sockets scoped to the sandbox.
//! Must never grant device creation or writes outside the plan's writable places.

use std::io;
use std::path::Path;

use ::landlock::{
    ABI, Access, AccessFs, CompatLevel, Compatible, PathBeneath, PathFd, RestrictionStatus,
    Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
};

use super::SetupError;
use crate::plan::{RootfsSource, SandboxPlan};

/// Kernel's Landlock ABI version, 0 when absent or disabled.
pub fn landlock_abi() -> io::Result<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: a null attribute with size 0 and the VERSION flag only queries the ABI.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP) => Ok(0),
            _ => Err(e),
        };
    }
    Ok(r as u32)
}

/// Restricts filesystem access to reading the sandbox tree plus writing its writable
/// places, and scopes signals and abstract unix sockets to the sandbox. Returns whether
/// a ruleset is enforced.
pub(in crate::setup) fn landlock(plan: &SandboxPlan) -> Result<bool, SetupError> {
    let lerr = |e: landlock::RulesetError| SetupError::Landlock(e.to_string());
    // The newest ABI this code was written and tested against; newer kernels enforce it.
    let abi = ABI::V6;
    let level = if plan.hardening.require_landlock {
        CompatLevel::HardRequirement
    } else {
        CompatLevel::BestEffort
    };
    let all = AccessFs::from_all(abi);
    let read = AccessFs::from_read(abi);
    let tree_rw = all & !(AccessFs::MakeChar | AccessFs::MakeBlock);
    let file_rw =
        AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate | AccessFs::IoctlDev;

    let mut writable: Vec<&Path> = vec![Path::new("/tmp"), Path::new("/dev/shm")];
    if matches!(plan.rootfs, RootfsSource::Directory { .. }) {
        writable.push(Path::new("/"));
    }
    if plan.workspace.is_some() || plan.workspace_tmpfs {
        writable.push(Path::new("/workspace"));
    }
    if plan.outputs.is_some() {
        writable.push(Path::new("/mnt/session/outputs"));
    }
    if plan.memory_mount {
        writable.push(Path::new(crate::setup::mounts::MEMORY_MOUNT));
    }
    if plan.user_home {
        writable.push(Path::new(crate::setup::etc::USER_HOME));
    }
    writable.extend(
        plan.binds
            .iter()
            .filter(|b| b.writable)
            .map(|b| b.target.as_path()),
    );
    let files: [&Path; 7] = [
        Path::new("/dev/null"),
        Path::new("/dev/zero"),
        Path::new("/dev/full"),
        Path::new("/dev/tty"),
        Path::new("/dev/random"),
        Path::new("/dev/urandom"),
        Path::new("/dev/pts"),
    ];

    let mut created = Ruleset::default()
        .set_compatibility(level)
        .handle_access(all)
        .map_err(lerr)?
        .scope(Scope::from_all(abi))
        .map_err(lerr)?
        .create()
        .map_err(lerr)?;
    created = created
        .add_rule(PathBeneath::new(open(Path::new("/"))?, read))
        .map_err(lerr)?;
    for p in writable {
        created = created
            .add_rule(PathBeneath::new(open(p)?, tree_rw))
            .map_err(lerr)?;
    }
    for p in files.iter().chain([&Path::new("/proc")]) {
        if p.exists() {
            created = created
                .add_rule(PathBeneath::new(open(p)?, file_rw))
                .map_err(lerr)?;
        }
    }
    let status: RestrictionStatus = created.restrict_self().map_err(lerr)?;
    Ok(status.ruleset != RulesetStatus::NotEnforced)
}

fn open(p: &Path) -> Result<PathFd, SetupError> {
    PathFd::new(p).map_err(|e| SetupError::Landlock(format!("open {}: {e}", p.display())))
}
