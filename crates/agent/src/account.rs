//! E2B's default account, which a sandbox of every backend gives the commands it runs as
//! `user`: its name, ids and home, and its `passwd` and `group` lines. The linux backend
//! writes them into its generated `/etc`, gvisor into its generated accounts, and an image
//! root (docker, gvisor) gets them added through the agent (`omabox-agent-port`).

/// The account's name.
pub const USER: &str = "user";
/// Its uid and gid.
pub const USER_ID: u32 = 1000;
/// Its home, writable by it.
pub const USER_HOME: &str = "/home/user";

/// Its `/etc/passwd` line, without the newline, with `shell` as its login shell.
pub fn passwd_line(shell: &str) -> String {
    format!("{USER}:x:{USER_ID}:{USER_ID}:{USER}:{USER_HOME}:{shell}")
}

/// Its `/etc/group` line, without the newline.
pub fn group_line() -> String {
    format!("{USER}:x:{USER_ID}:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lines_are_the_passwd_and_group_formats() {
        assert_eq!(
            passwd_line("/bin/sh"),
            "user:x:1000:1000:user:/home/user:/bin/sh"
        );
        assert_eq!(group_line(), "user:x:1000:");
    }
}
