//! Names of a blob store's temp files, and whose they are.
//!
//! `tmp/put-<pid>-<n>-<nanos>-h<host>`: `<host>` is this machine's boot id (16 hex digits of
//! `/proc/sys/kernel/random/boot_id`), so in a blob directory several hosts share (`--blob-dir`
//! on a network filesystem) a temp file says which machine's process wrote it. A pid means
//! something only on its own machine, and a lock free here may be held by a writer elsewhere,
//! so another machine's temp file is judged by its age alone. A name without `-h<host>` (an
//! older omabox) is taken for this machine's.
//!
//! What this must never do: take another machine's pid for one of this machine's.

use std::path::Path;
use std::sync::OnceLock;

/// This machine's id in temp file names: 16 hex digits of its boot id (`local` where the
/// kernel has none).
pub(crate) fn host_id() -> &'static str {
    static HOST: OnceLock<String> = OnceLock::new();
    HOST.get_or_init(|| {
        let id: String = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .unwrap_or_default()
            .chars()
            .filter(char::is_ascii_hexdigit)
            .take(16)
            .collect();
        if id.len() == 16 {
            id
        } else {
            "local".to_owned()
        }
    })
}

/// The name of a temp file of this process.
pub(crate) fn temp_name(n: u64, nanos: u32) -> String {
    format!("put-{}-{n}-{nanos}-h{}", std::process::id(), host_id())
}

/// Who wrote a temp file, by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writer {
    /// A process of this machine, with this pid.
    Here(u32),
    /// A process of another machine.
    Elsewhere,
    /// Not a temp file name this store makes.
    Unknown,
}

/// The writer of the temp file at `path` (module doc).
pub(crate) fn writer(path: &Path) -> Writer {
    let Some(rest) = path
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| name.strip_prefix("put-"))
    else {
        return Writer::Unknown;
    };
    let mut parts = rest.split('-');
    let Some(pid) = parts.next().and_then(|pid| pid.parse().ok()) else {
        return Writer::Unknown;
    };
    match parts.nth(2).and_then(|host| host.strip_prefix('h')) {
        Some(host) if host != host_id() => Writer::Elsewhere,
        _ => Writer::Here(pid),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temp_name_says_its_pid_and_this_machine() {
        let name = temp_name(3, 42);
        assert!(name.ends_with(&format!("-h{}", host_id())), "{name}");
        assert_eq!(writer(Path::new(&name)), Writer::Here(std::process::id()));
        assert_eq!(
            writer(Path::new("put-7-0-0")),
            Writer::Here(7),
            "older names"
        );
        assert_eq!(
            writer(Path::new("put-7-0-0-h0123456789abcdef0")),
            Writer::Elsewhere
        );
        assert_eq!(writer(Path::new("put-x-0-0")), Writer::Unknown);
        assert_eq!(writer(Path::new("other")), Writer::Unknown);
    }
}
