//! What an environment layer may hold, checked and made the layer's own: the upper dir a
//! dead build sandbox left is walked ([`super::walk`], which follows nothing) twice — first
//! to check everything without changing anything, then to change it.
//!
//! | entry | kept as |
//! |-------|---------|
//! | directory, regular file, symlink owned inside the build's id range | its owner shifted to `0..65536` (the layer is idmapped like the image when used) |
//! | overlay whiteout (a `0/0` character device) | root's; one overlayfs made is root's already and is left alone (it may share its inode with the overlay's work dir) |
//! | another device, FIFO, socket | refused |
//! | a hard link whose other links are not all in the layer | refused (a host file would be changed through it) |
//!
//! | extended attribute | kept as |
//! |--------------------|---------|
//! | `trusted.overlay.opaque` | kept: it makes a directory opaque, which the layer means |
//! | `user.*` | kept, but `user.overlay.*` (overlay metadata under `userxattr`) is removed |
//! | `system.posix_acl_access`, `system.posix_acl_default` | named users and groups shifted like owners; one outside the range refused |
//! | any other `trusted.*`, `security.*` | removed: overlay bookkeeping of the build's mount (`origin`, `impure`, …) means nothing in a lower layer, and file capabilities (`security.capability`, whose root id is the build's) are never the layer's to grant |
//! | anything else | refused |
//!
//! Never: chown, or change an attribute of, an inode that is not only the layer's.

use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::os::fd::BorrowedFd;

use rustix::fs::FileType;

use super::EnvLayerError;
use super::walk::{Entry, Limits, XATTR_MAX, walk};
use omabox_linux_sandbox::idmap::RANGE;

/// What an entry is after the check.
enum Checked {
    /// An overlay whiteout.
    Whiteout,
    /// Anything else the layer keeps, with its owner shifted.
    Owned { uid: u32, gid: u32 },
}

/// A change to an entry's extended attributes.
enum XattrChange<'a> {
    Remove(&'a CStr),
    Set(&'a CStr, Vec<u8>),
}

/// Checks the layer at `upper` and makes it the layer's own (see the module doc); `base` is
/// the build sandbox's first host id. Returns the bytes of its regular files (each inode
/// once), at most `max_bytes`.
pub(super) fn normalize(
    upper: BorrowedFd<'_>,
    base: u32,
    limits: Limits,
    max_bytes: u64,
) -> Result<u64, EnvLayerError> {
    let mut buf = vec![0u8; XATTR_MAX];
    // 1. Check, change nothing.
    let (mut bytes, mut links) = (0u64, HashMap::<(u64, u64), (u64, u64)>::new());
    walk(upper, limits, &mut |entry| {
        let checked = check(entry, base)?;
        let names = xattr_names(entry, &mut buf)?;
        let changes = xattr_changes(entry, &names, base, &mut buf)?;
        #[allow(clippy::unnecessary_cast)]
        let nlink = entry.stat.st_nlink as u64;
        let kind = entry.kind();
        if let Checked::Whiteout = checked {
            let is_roots = entry.stat.st_uid == 0 && entry.stat.st_gid == 0;
            if nlink > 1 && !(is_roots && changes.is_empty()) {
                return Err(refused(
                    entry,
                    "is a hard-linked whiteout owned by the build",
                ));
            }
            return Ok(());
        }
        if kind == FileType::Directory {
            return Ok(());
        }
        if nlink > 1 {
            let seen = links.entry(entry.inode()).or_insert((nlink, 0));
            seen.1 += 1;
            if seen.1 > 1 {
                return Ok(());
            }
        }
        if kind == FileType::RegularFile {
            #[allow(clippy::unnecessary_cast)]
            let size = entry.stat.st_size.max(0) as u64;
            bytes = bytes.saturating_add(size);
            if bytes > max_bytes {
                return Err(EnvLayerError::Refused(format!(
                    "larger than {max_bytes} bytes"
                )));
            }
        }
        Ok(())
    })?;
    let outside: HashSet<(u64, u64)> = links
        .into_iter()
        .filter(|(_, (nlink, seen))| seen < nlink)
        .map(|(inode, _)| inode)
        .collect();
    if !outside.is_empty() {
        return Err(hard_link_out(upper, limits, &outside));
    }
    // 2. Change: attributes, then the owner (a chown by root may drop some attributes).
    let mut done = HashSet::new();
    walk(upper, limits, &mut |entry| {
        #[allow(clippy::unnecessary_cast)]
        let shared = entry.kind() != FileType::Directory && entry.stat.st_nlink as u64 > 1;
        if shared && !done.insert(entry.inode()) {
            return Ok(());
        }
        let checked = check(entry, base)?;
        let names = xattr_names(entry, &mut buf)?;
        let changes = xattr_changes(entry, &names, base, &mut buf)?;
        let whiteout = matches!(checked, Checked::Whiteout);
        let is_roots = entry.stat.st_uid == 0 && entry.stat.st_gid == 0;
        if whiteout && is_roots && changes.is_empty() {
            return Ok(());
        }
        if whiteout && shared {
            return Err(refused(
                entry,
                "is a hard-linked whiteout owned by the build",
            ));
        }
        for change in changes {
            let (name, result) = match change {
                XattrChange::Remove(name) => (name, entry.remove_xattr(name)),
                XattrChange::Set(name, value) => (name, entry.set_xattr(name, &value)),
            };
            result.map_err(|source| EnvLayerError::Io {
                what: format!(
                    "change the attribute {} of {}",
                    name.to_string_lossy(),
                    entry.shown()
                ),
                source,
            })?;
        }
        let (uid, gid) = match checked {
            Checked::Whiteout => (0, 0),
            Checked::Owned { uid, gid } => (uid, gid),
        };
        entry.chown(uid, gid).map_err(|source| EnvLayerError::Io {
            what: format!("chown {}", entry.shown()),
            source,
        })
    })?;
    Ok(bytes)
}

/// Checks an entry's type and owner.
fn check(entry: &Entry<'_>, base: u32) -> Result<Checked, EnvLayerError> {
    match entry.kind() {
        FileType::Directory | FileType::RegularFile | FileType::Symlink => Ok(Checked::Owned {
            uid: shift(entry, base, entry.stat.st_uid)?,
            gid: shift(entry, base, entry.stat.st_gid)?,
        }),
        // An overlay whiteout is a 0/0 character device; no other device may be kept.
        FileType::CharacterDevice if entry.stat.st_rdev == 0 => Ok(Checked::Whiteout),
        FileType::CharacterDevice => Err(refused(entry, "is a device")),
        _ => Err(refused(entry, "is a FIFO, socket or device")),
    }
}

/// `id` (a host id) shifted from the build's range to `0..65536`.
fn shift(entry: &Entry<'_>, base: u32, id: u32) -> Result<u32, EnvLayerError> {
    shift_id(base, id).ok_or_else(|| {
        refused(
            entry,
            &format!("is owned by id {id}, outside the build sandbox's range"),
        )
    })
}

fn shift_id(base: u32, id: u32) -> Option<u32> {
    id.checked_sub(base).filter(|id| *id < RANGE)
}

fn refused(entry: &Entry<'_>, what: &str) -> EnvLayerError {
    EnvLayerError::Refused(format!("{} {what}", entry.shown()))
}

fn xattr_names(entry: &Entry<'_>, buf: &mut [u8]) -> Result<Vec<std::ffi::CString>, EnvLayerError> {
    entry.xattr_names(buf).map_err(|source| EnvLayerError::Io {
        what: format!("list the attributes of {}", entry.shown()),
        source,
    })
}

/// The changes the module doc's table asks for, or why the entry is refused.
fn xattr_changes<'n>(
    entry: &Entry<'_>,
    names: &'n [std::ffi::CString],
    base: u32,
    buf: &mut [u8],
) -> Result<Vec<XattrChange<'n>>, EnvLayerError> {
    let mut changes = Vec::new();
    for name in names {
        let bytes = name.to_bytes();
        if bytes == b"trusted.overlay.opaque" {
            continue;
        }
        if bytes.starts_with(b"user.overlay.") {
            changes.push(XattrChange::Remove(name));
        } else if bytes.starts_with(b"user.") {
            continue;
        } else if bytes == b"system.posix_acl_access" || bytes == b"system.posix_acl_default" {
            let value = entry.xattr(name, buf).map_err(|source| EnvLayerError::Io {
                what: format!("read the ACL of {}", entry.shown()),
                source,
            })?;
            let shifted = shift_acl(&value, base).ok_or_else(|| {
                refused(
                    entry,
                    "has an ACL naming an id outside the build sandbox's range",
                )
            })?;
            if shifted != value {
                changes.push(XattrChange::Set(name, shifted));
            }
        } else if bytes.starts_with(b"trusted.") || bytes.starts_with(b"security.") {
            changes.push(XattrChange::Remove(name));
        } else {
            return Err(refused(
                entry,
                &format!(
                    "has the extended attribute {:?}, which a layer does not keep",
                    super::walk::escape(&name.to_string_lossy())
                ),
            ));
        }
    }
    Ok(changes)
}

/// A POSIX ACL xattr (`posix_acl_xattr_header` version 2, then 8-byte entries: tag, perm,
/// id, little-endian) with its named users' and groups' ids shifted like owners; `None`
/// when it is malformed or names an id outside the range.
fn shift_acl(value: &[u8], base: u32) -> Option<Vec<u8>> {
    const ACL_USER: u16 = 0x02;
    const ACL_GROUP: u16 = 0x08;
    let (header, entries) = value.split_at_checked(4)?;
    if u32::from_le_bytes(header.try_into().ok()?) != 2 || entries.len() % 8 != 0 {
        return None;
    }
    let mut out = header.to_vec();
    for entry in entries.chunks_exact(8) {
        let tag = u16::from_le_bytes([entry[0], entry[1]]);
        out.extend_from_slice(&entry[..4]);
        let id = u32::from_le_bytes(entry[4..8].try_into().ok()?);
        let id = match tag {
            ACL_USER | ACL_GROUP => shift_id(base, id)?,
            _ => id,
        };
        out.extend_from_slice(&id.to_le_bytes());
    }
    Some(out)
}

/// The refusal of a layer holding a hard link to an inode in `outside` (one whose other
/// links are not all in the layer), naming the first such entry.
fn hard_link_out(
    upper: BorrowedFd<'_>,
    limits: Limits,
    outside: &HashSet<(u64, u64)>,
) -> EnvLayerError {
    let mut found = None;
    let _ = walk(upper, limits, &mut |entry| {
        if found.is_none()
            && entry.kind() != FileType::Directory
            && outside.contains(&entry.inode())
        {
            found = Some(entry.shown());
        }
        Ok(())
    });
    EnvLayerError::Refused(format!(
        "{} is a hard link to a file outside the layer",
        found.unwrap_or_else(|| "an entry".into())
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::MetadataExt as _;
    use std::path::Path;

    const BASE: u32 = 0x4000_0000;
    const LIMITS: Limits = Limits {
        entries: 1000,
        depth: 16,
    };

    fn run(upper: &Path, base: u32) -> Result<u64, EnvLayerError> {
        let fd = super::super::walk::open_dir(upper).unwrap();
        normalize(fd.as_fd(), base, LIMITS, 1 << 20)
    }

    fn own(path: &Path, uid: u32, gid: u32) {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    }

    fn upper() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let upper = dir.path().join("upper");
        std::fs::create_dir(&upper).unwrap();
        own(&upper, BASE, BASE);
        (dir, upper)
    }

    fn xattrs(path: &Path) -> Vec<String> {
        let mut buf = vec![0u8; XATTR_MAX];
        let len = rustix::fs::llistxattr(path, &mut buf[..]).unwrap();
        let mut names: Vec<String> = buf[..len]
            .split(|b| *b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn owners_are_shifted_and_strangers_refused() {
        let (_dir, upper) = upper();
        std::fs::create_dir_all(upper.join("usr/bin")).unwrap();
        std::fs::write(upper.join("usr/bin/tool"), b"12345").unwrap();
        std::os::unix::fs::symlink("/etc/shadow", upper.join("usr/bin/link")).unwrap();
        for p in ["usr", "usr/bin", "usr/bin/tool", "usr/bin/link"] {
            own(&upper.join(p), BASE + 7, BASE);
        }
        assert_eq!(run(&upper, BASE).unwrap(), 5);
        let meta = std::fs::symlink_metadata(upper.join("usr/bin/link")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (7, 0));
        assert_eq!(std::fs::metadata(&upper).unwrap().uid(), 0);
        // The link was not followed.
        assert_ne!(std::fs::metadata("/etc/shadow").unwrap().uid(), 7);

        // An owner outside the range (a host id) is refused.
        std::fs::write(upper.join("stranger"), b"").unwrap();
        own(&upper.join("stranger"), 0, 0);
        let e = run(&upper, 7).unwrap_err().to_string();
        assert!(e.contains("outside the build sandbox's range"), "{e}");
    }

    /// A setuid or setgid file the build left (a copied-up image binary): the host's chown
    /// clears both bits (the kernel drops them on every chown of a non-directory), so the
    /// layer on the host's disk holds none, whatever mounts it.
    #[test]
    fn setuid_and_setgid_bits_do_not_survive_into_the_layer() {
        use std::os::unix::fs::PermissionsExt as _;
        let (_dir, upper) = upper();
        for (name, mode) in [("suid", 0o4755), ("sgid", 0o2755), ("same", 0o6755)] {
            let path = upper.join(name);
            std::fs::write(&path, b"elf").unwrap();
            // Owned by the build's root: shifted to 0, and by its uid 1000: shifted to 1000.
            let owner = if name == "same" { BASE } else { BASE + 1000 };
            own(&path, owner, owner);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        run(&upper, BASE).unwrap();
        for name in ["suid", "sgid", "same"] {
            let mode = std::fs::metadata(upper.join(name)).unwrap().mode();
            assert_eq!(mode & 0o6000, 0, "{name}: {mode:o}");
            assert_eq!(mode & 0o777, 0o755, "{name}: {mode:o}");
        }
    }

    #[test]
    fn a_hard_linked_inode_is_shifted_and_counted_once() {
        let (_dir, upper) = upper();
        std::fs::write(upper.join("a"), b"1234").unwrap();
        std::fs::hard_link(upper.join("a"), upper.join("b")).unwrap();
        own(&upper.join("a"), BASE + 3, BASE + 3);
        assert_eq!(run(&upper, BASE).unwrap(), 4);
        assert_eq!(std::fs::metadata(upper.join("b")).unwrap().uid(), 3);
    }

    /// A file of the layer that is also a host file (a hard link to it from outside the
    /// upper dir): the host's file keeps its owner and the layer is refused.
    #[test]
    fn a_hard_link_to_a_file_outside_the_layer_is_refused_and_left_alone() {
        let (dir, upper) = upper();
        let host_file = dir.path().join("host-file");
        std::fs::write(&host_file, b"host").unwrap();
        own(&host_file, BASE + 5, BASE + 5);
        std::fs::create_dir(upper.join("etc")).unwrap();
        own(&upper.join("etc"), BASE, BASE);
        std::fs::hard_link(&host_file, upper.join("etc/passwd")).unwrap();
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(
            e.contains("/etc/passwd is a hard link to a file outside the layer"),
            "{e}"
        );
        let meta = std::fs::metadata(&host_file).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (BASE + 5, BASE + 5));
        // Nothing of the layer was changed either: the check comes first.
        assert_eq!(std::fs::metadata(&upper).unwrap().uid(), BASE);
    }

    fn mknod(path: &Path, mode: libc::mode_t, dev: libc::dev_t) {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid C string; mknod only reads it.
        assert_eq!(unsafe { libc::mknod(c.as_ptr(), mode, dev) }, 0);
    }

    #[test]
    fn fifos_sockets_and_devices_are_refused_whiteouts_kept() {
        for (name, mode, dev, says) in [
            ("pipe", libc::S_IFIFO | 0o644, 0, "/pipe is a FIFO"),
            ("sock", libc::S_IFSOCK | 0o644, 0, "/sock is a FIFO, socket"),
            (
                "null",
                libc::S_IFCHR | 0o666,
                libc::makedev(1, 3),
                "/null is a device",
            ),
            (
                "disk",
                libc::S_IFBLK | 0o600,
                libc::makedev(7, 0),
                "/disk is a FIFO, socket or device",
            ),
            (
                "blk0",
                libc::S_IFBLK | 0o600,
                0,
                "/blk0 is a FIFO, socket or device",
            ),
        ] {
            let (_dir, upper) = upper();
            mknod(&upper.join(name), mode, dev);
            let e = run(&upper, BASE).unwrap_err().to_string();
            assert!(e.contains(says), "{name}: {e}");
        }
        // A whiteout made by the sandbox (its owner in the range) becomes root's; one
        // overlayfs made (root's already) is left as it is, even hard-linked (overlayfs
        // shares one whiteout inode with its work dir).
        let (dir, upper) = upper();
        mknod(&upper.join("gone"), libc::S_IFCHR, 0);
        own(&upper.join("gone"), BASE + 1, BASE + 1);
        mknod(&upper.join("shared"), libc::S_IFCHR, 0);
        std::fs::hard_link(upper.join("shared"), dir.path().join("work-whiteout")).unwrap();
        assert_eq!(run(&upper, BASE).unwrap(), 0);
        let meta = std::fs::symlink_metadata(upper.join("gone")).unwrap();
        assert_eq!((meta.uid(), meta.gid(), meta.rdev()), (0, 0, 0));
        // But one the build owns and shares with something else is refused.
        own(&upper, BASE, BASE);
        own(&upper.join("shared"), BASE + 2, BASE + 2);
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(e.contains("/shared is a hard-linked whiteout"), "{e}");
        assert_eq!(
            std::fs::symlink_metadata(dir.path().join("work-whiteout"))
                .unwrap()
                .uid(),
            BASE + 2
        );
    }

    #[test]
    fn extended_attributes_are_kept_shifted_removed_or_refused() {
        let (_dir, upper) = upper();
        let (dir, file) = (upper.join("dir"), upper.join("dir/ping"));
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(&file, b"elf").unwrap();
        own(&dir, BASE, BASE);
        own(&file, BASE, BASE);
        let set = |path: &Path, name: &str, value: &[u8]| {
            rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty())
                .unwrap_or_else(|e| panic!("set {name}: {e}"));
        };
        // cap_net_raw+ep as a v2 capability, overlay bookkeeping, a user attribute.
        let mut cap = vec![0u8; 20];
        cap[..4].copy_from_slice(&0x0200_0001u32.to_le_bytes());
        cap[4..8].copy_from_slice(&(1u32 << 13).to_le_bytes());
        set(&file, "security.capability", &cap);
        set(&file, "trusted.overlay.origin", b"x");
        set(&file, "user.overlay.redirect", b"/x");
        set(&file, "user.mime_type", b"text/plain");
        set(&dir, "trusted.overlay.opaque", b"y");
        set(&dir, "trusted.overlay.impure", b"y");
        // An ACL granting the build's uid 1000 and gid 1000 (host ids base+1000).
        let acl = |user: u32, group: u32| {
            let mut value = 2u32.to_le_bytes().to_vec();
            for (tag, perm, id) in [
                (0x01u16, 7u16, u32::MAX),
                (0x02, 6, user),
                (0x04, 5, u32::MAX),
                (0x08, 4, group),
                (0x10, 7, u32::MAX),
                (0x20, 0, u32::MAX),
            ] {
                value.extend_from_slice(&tag.to_le_bytes());
                value.extend_from_slice(&perm.to_le_bytes());
                value.extend_from_slice(&id.to_le_bytes());
            }
            value
        };
        set(
            &dir,
            "system.posix_acl_default",
            &acl(BASE + 1000, BASE + 1000),
        );
        run(&upper, BASE).unwrap();
        assert_eq!(xattrs(&file), ["user.mime_type"]);
        assert_eq!(
            xattrs(&dir),
            ["system.posix_acl_default", "trusted.overlay.opaque"]
        );
        let mut buf = vec![0u8; XATTR_MAX];
        let len = rustix::fs::lgetxattr(&dir, "system.posix_acl_default", &mut buf[..]).unwrap();
        assert_eq!(&buf[..len], acl(1000, 1000).as_slice());

        // An ACL naming a host id outside the range is refused.
        let (_other, upper) = self::upper();
        std::fs::create_dir(upper.join("d")).unwrap();
        own(&upper.join("d"), BASE, BASE);
        set(
            &upper.join("d"),
            "system.posix_acl_default",
            &acl(1000, BASE),
        );
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(e.contains("/d has an ACL naming an id outside"), "{e}");
    }

    #[test]
    fn names_are_shown_on_one_line_and_limits_hold() {
        let (_dir, upper) = upper();
        let evil = upper.join("a\nfake: ok \u{202e}x");
        mknod(&evil, libc::S_IFIFO | 0o644, 0);
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(!e.contains('\n') && !e.contains('\u{202e}'), "{e:?}");
        assert!(e.contains(r"/a\nfake: ok \u{202e}x is a FIFO"), "{e}");

        // More entries than the limit.
        let (_dir, upper) = self::upper();
        for i in 0..LIMITS.entries {
            std::fs::write(upper.join(i.to_string()), b"").unwrap();
            own(&upper.join(i.to_string()), BASE, BASE);
        }
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(e.contains("more than 1000 entries"), "{e}");
        // Deeper than the limit.
        let (_dir, upper) = self::upper();
        let mut deep = upper.clone();
        for _ in 0..=LIMITS.depth {
            deep.push("d");
            std::fs::create_dir(&deep).unwrap();
            own(&deep, BASE, BASE);
        }
        let e = run(&upper, BASE).unwrap_err().to_string();
        assert!(e.contains("nested deeper than 16 directories"), "{e}");
    }
}
