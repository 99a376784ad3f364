//! [`SandboxPlan::user_home`]: `/home/user`, a tmpfs of its own owned by the sandbox's
//! `user` account (uid/gid 1000), and the account itself. The generated `/etc` of the
//! preinstalled rootfs lists it (`etc::generate`); an image root's own `/etc/passwd` and
//! `/etc/group` get its lines appended when they lack a `user` entry.
//!
//! The image's files are the sandbox's, and this runs as host root: they are opened with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)` below the new root,
//! so a symlink in the image resolves inside the image, never to a host file; they are read
//! capped and must be regular files. Gap: an image whose `/etc/passwd` is a dangling
//! symlink, or a special file, gets no account (running as `user` is then "not found").

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};

use super::SetupError;
use super::etc::{USER, USER_HOME, USER_ID, user_lines};
use super::mounts::{half_memory_or_tmp, make_target, step, tmpfs};
use crate::idmap::IdRange;
use crate::plan::{RootfsSource, SandboxPlan};

/// The most of an image's `/etc/passwd` or `/etc/group` that is read.
const MAX_ACCOUNT_FILE: u64 = 1024 * 1024;

/// Mounts the home tmpfs (`nosuid,nodev`, 0755, sized like the workspace tmpfs) and, for
/// an image root, lists the account. `owner` is the sandbox's id range when this process
/// builds the tree as host root: the home is then owned by the host id mapped to the
/// sandbox's 1000. Without one (an unprivileged sandbox maps only its root) it stays the
/// sandbox root's.
pub(super) fn user_home(
    plan: &SandboxPlan,
    root: &Path,
    owner: Option<IdRange>,
) -> Result<(), SetupError> {
    if let RootfsSource::Directory { .. } = plan.rootfs {
        step(
            || "add the user account to the image".into(),
            image_account(root),
        )?;
    }
    let target = make_target(root, Path::new(USER_HOME), false)?;
    let mut opts = format!("size={},mode=0755", half_memory_or_tmp(plan));
    if let Some(r) = owner {
        let id = r.base + USER_ID;
        opts.push_str(&format!(",uid={id},gid={id}"));
    }
    tmpfs(&target, USER_HOME, libc::MS_NOSUID | libc::MS_NODEV, &opts)
}

const IN_ROOT: ResolveFlags = ResolveFlags::IN_ROOT
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

fn image_account(root: &Path) -> io::Result<()> {
    let dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let has_bash = rustix::fs::openat2(
        &dir,
        "bin/bash",
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        IN_ROOT,
    )
    .and_then(rustix::fs::fstat)
    .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file());
    let (passwd, group) = user_lines(has_bash);
    append_unless_listed(&dir, "etc/passwd", &passwd)?;
    append_unless_listed(&dir, "etc/group", &group)
}

/// Appends `line` to `name` (below `dir`, resolved inside it) unless a line already names
/// the account; creates the file (never through a symlink) when it is missing.
fn append_unless_listed(dir: &OwnedFd, name: &str, line: &str) -> io::Result<()> {
    let flags = OFlags::RDWR | OFlags::APPEND | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match rustix::fs::openat2(dir, name, flags, Mode::empty(), IN_ROOT) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => {
            let create = flags | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
            match rustix::fs::openat2(dir, name, create, Mode::from_raw_mode(0o644), IN_ROOT) {
                Ok(fd) => fd,
                // A dangling symlink (EEXIST) or no /etc (ENOENT): no account.
                Err(rustix::io::Errno::EXIST | rustix::io::Errno::NOENT) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Err(e) => return Err(e.into()),
    };
    let st = rustix::fs::fstat(&fd)?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Ok(());
    }
    let mut file = std::fs::File::from(fd);
    let mut text = Vec::new();
    (&file).take(MAX_ACCOUNT_FILE + 1).read_to_end(&mut text)?;
    if text.len() as u64 > MAX_ACCOUNT_FILE {
        return Err(io::Error::other(format!(
            "the image's /{name} is larger than {MAX_ACCOUNT_FILE} bytes"
        )));
    }
    let prefix = format!("{USER}:");
    if text
        .split(|b| *b == b'\n')
        .any(|l| l.starts_with(prefix.as_bytes()))
    {
        return Ok(());
    }
    let sep = if text.is_empty() || text.ends_with(b"\n") {
        ""
    } else {
        "\n"
    };
    file.write_all(format!("{sep}{line}").as_bytes())
}
