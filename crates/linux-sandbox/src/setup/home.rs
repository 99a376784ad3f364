//! [`SandboxPlan::user_home`]: `/home/user`, a tmpfs of its own owned by the sandbox's
//! `user` account (uid/gid 1000). The generated `/etc` of the preinstalled rootfs lists
//! the account (`etc::generate`).
//!
//! Gap: an image root's own `/etc/passwd` is not changed here (reading and appending to
//! it safely means resolving inside the image's tree, where a symlink could point at the
//! host's files); with an image that does not list `user`, the home exists but running
//! as `user` fails with "user not found".

use std::path::Path;

use super::SetupError;
use super::etc::{USER_HOME, USER_ID};
use super::mounts::{half_memory_or_tmp, make_target, tmpfs};
use crate::idmap::IdRange;
use crate::plan::SandboxPlan;

/// Mounts the home tmpfs (`nosuid,nodev`, 0755, sized like the workspace tmpfs). `owner`
/// is the sandbox's id range when this process builds the tree as host root: the home
/// is then owned by the host id mapped to the sandbox's 1000. Without one (an
/// unprivileged sandbox maps only its root) it stays the sandbox root's.
pub(super) fn user_home(
    plan: &SandboxPlan,
    root: &Path,
    owner: Option<IdRange>,
) -> Result<(), SetupError> {
    let target = make_target(root, Path::new(USER_HOME), false)?;
    let mut opts = format!("size={},mode=0755", half_memory_or_tmp(plan));
    if let Some(r) = owner {
        let id = r.base + USER_ID;
        opts.push_str(&format!(",uid={id},gid={id}"));
    }
    tmpfs(&target, USER_HOME, libc::MS_NOSUID | libc::MS_NODEV, &opts)
}
