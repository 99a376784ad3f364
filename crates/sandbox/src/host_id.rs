//! Host ids: which omabox process owns a backend's sandbox (the docker backend's
//! `omabox.host` label, the gvisor backend's `owner` file), and whether it is gone. An id is `<hostname>/<boot id>/<pid>/<start time>` of the omabox process that
//! made the container: its pid and its start time (clock ticks since boot, from
//! `/proc/<pid>/stat`) within one boot of one machine name exactly one process, so a
//! reused pid is not mistaken for the host.
//!
//! Must never call a host dead that it cannot judge: an id of another machine (an engine
//! shared over `DOCKER_HOST`) or one it cannot parse is alive as far as
//! [`host_is_gone`] knows, so a reap never removes another machine's sandboxes.

/// This process's host id.
pub fn current() -> String {
    let pid = std::process::id();
    format!(
        "{}/{}/{pid}/{}",
        hostname(),
        boot_id(),
        start_time(pid).unwrap_or_default()
    )
}

/// Whether the host `id` names is gone: this machine, and an earlier boot or a process
/// that no longer runs (or a different process with its pid). A host of another machine,
/// or an id that is not one, is never gone.
pub fn host_is_gone(id: &str) -> bool {
    let mut parts = id.split('/');
    let (Some(host), Some(boot), Some(pid), Some(start), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return false;
    };
    if host != hostname() {
        return false;
    }
    if boot != boot_id() {
        return true;
    }
    let Ok(pid) = pid.parse::<u32>() else {
        return false;
    };
    match start_time(pid) {
        Some(now) => now.to_string() != start,
        None => true,
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().replace('/', "_"))
        .unwrap_or_default()
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|b| b.trim().to_owned())
        .unwrap_or_default()
}

/// Field 22 of `/proc/<pid>/stat` (after the parenthesized command name, which may hold
/// spaces and parentheses: the last `)` ends it).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_a_finished_one_is_gone() {
        assert!(!host_is_gone(&current()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let start = start_time(pid);
        child.wait().unwrap();
        let id = format!(
            "{}/{}/{pid}/{}",
            hostname(),
            boot_id(),
            start.unwrap_or_default()
        );
        assert!(host_is_gone(&id), "{id}");
    }

    #[test]
    fn another_machine_or_a_bad_id_is_never_gone() {
        let other = format!("not-{}/{}/1/1", hostname(), boot_id());
        assert!(!host_is_gone(&other));
        assert!(!host_is_gone("garbage"));
        assert!(!host_is_gone("a/b/c/d/e"));
        let earlier_boot = format!("{}/another-boot/1/1", hostname());
        assert!(host_is_gone(&earlier_boot));
    }
}
