//! The generated `/etc` of the preinstalled rootfs (and the network files of an image
//! root's). Written from constants, never copied
//! from the host except `os-release` (public distribution facts): no shadow, no ssh
//! keys, no machine-id, no host users.

use omabox_agent::account;
use std::io;
use std::path::Path;

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n\
networks: files\nprotocols: files\nservices: files\n";
const RESOLV: &str = "nameserver 127.0.0.1\noptions ndots:0 attempts:1 timeout:1\n";

/// The account of [`crate::SandboxPlan::user_home`]: its name, uid and gid, home.
pub(in crate::setup) use omabox_agent::account::{USER, USER_HOME, USER_ID};

/// The `passwd` and `group` lines of the `user` account; its shell is `/bin/bash` when
/// the new root has one, else `/bin/sh`.
pub(super) fn user_lines(has_bash: bool) -> (String, String) {
    let shell = if has_bash { "/bin/bash" } else { "/bin/sh" };
    (
        format!("{}\n", account::passwd_line(shell)),
        format!("{}\n", account::group_line()),
    )
}

/// Writes the generated files into `etc` (an empty directory of the new root), with the
/// `user` account's lines when given.
pub(super) fn generate(
    etc: &Path,
    hostname: &str,
    user: Option<(String, String)>,
) -> io::Result<()> {
    let (user_passwd, user_group) = user.unwrap_or_default();
    std::fs::write(etc.join("passwd"), format!("{PASSWD}{user_passwd}"))?;
    std::fs::write(etc.join("group"), format!("{GROUP}{user_group}"))?;
    std::fs::write(etc.join("nsswitch.conf"), NSSWITCH)?;
    for (name, text) in network_files(hostname) {
        std::fs::write(etc.join(name), text)?;
    }
    // os-release is usually a symlink into /usr/lib; copy its bytes so the file exists
    // even where /usr/lib layout differs. Absent on the host: skip.
    if let Ok(bytes) = std::fs::read("/etc/os-release") {
        std::fs::write(etc.join("os-release"), bytes)?;
    }
    Ok(())
}

/// The files an image root's `/etc` gets over its own (written into the overlay's upper
/// layer): the sandbox's resolver is the host's DNS stub on its loopback, whatever the
/// image says, and its host name is the sandbox's.
pub(super) fn network_files(hostname: &str) -> [(&'static str, String); 3] {
    [
        ("resolv.conf", RESOLV.to_owned()),
        ("hostname", format!("{hostname}\n")),
        (
            "hosts",
            format!("127.0.0.1\tlocalhost {hostname}\n::1\tlocalhost ip6-localhost ip6-loopback\n"),
        ),
    ]
}
