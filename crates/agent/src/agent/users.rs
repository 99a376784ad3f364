//! Accounts of the sandbox: names resolved from its own `/etc/passwd` and `/etc/group`.
//!
//! The files belong to the sandbox, so they are read with a size cap and parsed leniently
//! (a malformed line is skipped, never a panic). Names in errors are escaped and
//! shortened. This must never consult the host's account database (NSS, the host's
//! `/etc`): only the files under [`super::AgentConfig::etc_dir`].

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::message::{ErrorKind, RemoteError};

/// The most of `/etc/passwd` or `/etc/group` that is read.
pub(crate) const MAX_ACCOUNT_FILE: u64 = 1024 * 1024;

/// The longest account name quoted in an error.
const MAX_NAME_SHOWN: usize = 64;

/// One `/etc/passwd` entry (the parts the agent uses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Account {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) home: PathBuf,
}

impl Account {
    /// `root` as the agent knows it when `/etc/passwd` does not list it.
    fn root() -> Self {
        Self {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: PathBuf::from("/root"),
        }
    }
}

/// Reads at most [`MAX_ACCOUNT_FILE`] bytes of `etc/<name>`; a missing file is empty.
fn read_capped(etc: &Path, name: &str) -> Result<String, RemoteError> {
    let path = etc.join(name);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(String::new()),
        Err(e) => {
            return Err(RemoteError::io(
                format!("cannot read {}", path.display()),
                &e,
            ));
        }
    };
    let mut bytes = Vec::new();
    file.take(MAX_ACCOUNT_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| RemoteError::io(format!("cannot read {}", path.display()), &e))?;
    if bytes.len() as u64 > MAX_ACCOUNT_FILE {
        return Err(RemoteError::new(
            ErrorKind::Io,
            format!("{} is larger than {MAX_ACCOUNT_FILE} bytes", path.display()),
        ));
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// `name:x:uid:gid:gecos:home:shell` lines; malformed ones are skipped.
fn parse_passwd(text: &str) -> impl Iterator<Item = Account> + '_ {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 7 || f[0].is_empty() || line.starts_with('#') {
            return None;
        }
        Some(Account {
            name: f[0].to_owned(),
            uid: f[2].parse().ok()?,
            gid: f[3].parse().ok()?,
            home: PathBuf::from(f[5]),
        })
    })
}

/// `name:x:gid:members` lines as `(name, gid)`; malformed ones are skipped.
fn parse_group(text: &str) -> impl Iterator<Item = (String, u32)> + '_ {
    text.lines().filter_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 3 || f[0].is_empty() || line.starts_with('#') {
            return None;
        }
        Some((f[0].to_owned(), f[2].parse().ok()?))
    })
}

/// `name` escaped and shortened for an error message.
fn shown(name: &str) -> String {
    let short: String = name.chars().take(MAX_NAME_SHOWN).collect();
    let mut out: String = short.escape_debug().collect();
    if short.len() < name.len() {
        out.push('…');
    }
    out
}

/// The account called `name` in `etc/passwd`; `root` works whether or not it is listed.
pub(crate) fn lookup(etc: &Path, name: &str) -> Result<Account, RemoteError> {
    let text = read_capped(etc, "passwd")?;
    if let Some(a) = parse_passwd(&text).find(|a| a.name == name) {
        return Ok(a);
    }
    if name == "root" {
        return Ok(Account::root());
    }
    Err(RemoteError::new(
        ErrorKind::NotFound,
        format!("user \"{}\" not found", shown(name)),
    ))
}

/// Names of uids and gids, for stat and list replies.
#[derive(Debug, Default)]
pub(crate) struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

impl Names {
    /// Reads both files; unreadable or oversized files give no names (stat still works).
    pub(crate) fn load(etc: &Path) -> Self {
        let mut names = Self::default();
        if let Ok(text) = read_capped(etc, "passwd") {
            for a in parse_passwd(&text) {
                names.users.entry(a.uid).or_insert(a.name);
            }
        }
        if let Ok(text) = read_capped(etc, "group") {
            for (name, gid) in parse_group(&text) {
                names.groups.entry(gid).or_insert(name);
            }
        }
        names
    }

    pub(crate) fn user(&self, uid: u32) -> Option<String> {
        self.users.get(&uid).cloned()
    }

    pub(crate) fn group(&self, gid: u32) -> Option<String> {
        self.groups.get(&gid).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_parse_and_bad_ones_are_skipped() {
        let text = "root:x:0:0:root:/root:/bin/sh\n#c:x:1:1::/:/\nbad\nu:x:nope:1::/h:/bin/sh\n\
                    user:x:1000:1000:user:/home/user:/bin/bash\n";
        let all: Vec<Account> = parse_passwd(text).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].name, "user");
        assert_eq!((all[1].uid, all[1].gid), (1000, 1000));
        assert_eq!(all[1].home, PathBuf::from("/home/user"));
    }

    #[test]
    fn an_unknown_user_is_named_escaped_and_short() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("passwd"), "a:x:1:1::/:/bin/sh\n").unwrap();
        let e = lookup(dir.path(), "b\n\u{1b}[2J").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert_eq!(e.message, "user \"b\\n\\u{1b}[2J\" not found");
        let long = "x".repeat(500);
        let e = lookup(dir.path(), &long).unwrap_err();
        assert!(e.message.len() < 100, "{}", e.message);
        // root works without a passwd at all.
        let none = tempfile::tempdir().unwrap();
        assert_eq!(lookup(none.path(), "root").unwrap(), Account::root());
    }

    #[test]
    fn an_oversized_passwd_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let big = "a:x:1:1::/:/bin/sh\n".repeat(MAX_ACCOUNT_FILE as usize / 10);
        std::fs::write(dir.path().join("passwd"), big).unwrap();
        let e = lookup(dir.path(), "a").unwrap_err();
        assert!(e.message.contains("larger than"), "{}", e.message);
    }
}
