//! Sandboxes whose host died: found from the runtime dir, not from any journal.
//!
//! Every sandbox has a state dir `<runtime_dir>/<id>` (16 hex digits) from the first step of
//! its start. Its first file is `owner.json`: the pid, `/proc` start time and boot id of the
//! host process that owns the sandbox (written before anything else is created). A host
//! killed at any later step (kill -9, power loss) leaves that dir, maybe a half-written or
//! missing `identity.json`, maybe a cgroup `<hierarchy>/<cgroup_parent>/<id>` with or without
//! tasks. [`reap_leftovers`] finds them all:
//!
//! - **journaled** (the caller knows a lease of it, e.g. from omabox's lease journal): left to
//!   the lease's own reap, which also bills it (the backend's `managed`); the sweep is for the
//!   sandboxes no lease names (a host killed during the start);
//! - **owner alive** (same boot, same pid with the same start time): never touched, whatever
//!   state the sandbox is in — its host still owns it and will tear it down;
//! - **owner dead**: destroyed. The init is killed through `identity.json` when that parses,
//!   names this dir and its process is still the one recorded (pidfd + start time guard);
//!   the cgroup is recomputed from the cgroup layout, the parent and the id (never taken from
//!   the file), whatever is left in it is killed and it is removed; then the state dir. An init
//!   that never joined its cgroup needs no killing: it is blocked on its plan pipe, whose write
//!   end died with the host, and exits on the EOF (or on its closed agent socket);
//! - **owner unknown** (no or unreadable `owner.json`: a host killed between `mkdir` and that
//!   write, or a state dir of an older omabox): destroyed only when the dir is older than
//!   [`UNOWNED_GRACE`] and nothing in it is alive (no live recorded init, no task in its
//!   cgroup). Otherwise it is reported and kept;
//! - **a cgroup no state dir names** (`<parent>/<id>` with the state dir gone: a teardown
//!   that lost the cgroup's removal): removed once older than [`UNOWNED_GRACE`] and empty;
//!   with processes in it, reported and kept.
//!
//! The owner also refreshes its owner files' mtime every [`OWNER_HEARTBEAT`] (one background
//! thread per host process), so [`last_alive_ms`] tells, after a crash, the last moment the
//! host — and so its sandbox, whose agent exits when the host's connection closes — was
//! alive, to within one heartbeat. The usage ledger bills a crashed run's sandbox up to there.
//!
//! It must never kill a sandbox whose owner is alive, follow a symlink out of the runtime dir,
//! or delete anything recursively (the state dir is removed file by known file).

use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::cgroup::{CgroupLayout, CgroupPaths, V1_CONTROLLERS, V1_SWEPT};
use crate::config::RuntimeConfig;
use crate::identity::SandboxIdentity;
use crate::state_dir::{IDENTITY_FILE, read_small};
use crate::sys;

pub use crate::state_dir::OWNER_FILE;

/// How old a state dir without a readable owner must be before it counts as abandoned. The
/// owner file is written microseconds after the dir is made, so this only has to cover a
/// slow disk.
pub const UNOWNED_GRACE: Duration = Duration::from_secs(60);

/// How often the owning host refreshes the mtime of its owner files.
pub const OWNER_HEARTBEAT: Duration = Duration::from_secs(2);

/// The state dirs this process owns, refreshed by the heartbeat thread.
static OWNED: std::sync::Mutex<Vec<PathBuf>> = std::sync::Mutex::new(Vec::new());
static HEARTBEAT: std::sync::Once = std::sync::Once::new();

/// Adds `state_dir` to the heartbeat (starting its thread on first use). A dir whose owner
/// file is gone (the sandbox was destroyed) drops out by itself.
pub(crate) fn keep_alive(state_dir: &Path) {
    OWNED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(state_dir.to_path_buf());
    HEARTBEAT.call_once(|| {
        let _ = std::thread::Builder::new()
            .name("omabox-owner-heartbeat".into())
            .spawn(|| {
                loop {
                    std::thread::sleep(OWNER_HEARTBEAT);
                    let dirs = OWNED
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .clone();
                    let gone: Vec<PathBuf> = dirs
                        .into_iter()
                        .filter(|dir| touch(&dir.join(OWNER_FILE)).is_err())
                        .collect();
                    if !gone.is_empty() {
                        OWNED
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .retain(|dir| !gone.contains(dir));
                    }
                }
            });
    });
}

/// Sets `path`'s mtime to now (never following a symlink).
pub(crate) fn touch(path: &Path) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?
        .set_modified(SystemTime::now())
}

/// The last moment the owner of `state_dir` was known alive (ms since the epoch): its owner
/// file's mtime, refreshed every [`OWNER_HEARTBEAT`] while the owner runs. `None` when the
/// file is gone.
pub fn last_alive_ms(state_dir: &Path) -> Option<u64> {
    let modified = std::fs::symlink_metadata(state_dir.join(OWNER_FILE))
        .ok()?
        .modified()
        .ok()?;
    let since_epoch = modified.duration_since(SystemTime::UNIX_EPOCH).ok()?;
    u64::try_from(since_epoch.as_millis()).ok()
}

/// How long one leftover's teardown may wait for its tasks and cgroup to go.
const DESTROY_TIMEOUT: Duration = Duration::from_secs(10);

/// The host process that owns a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Owner {
    pid: i32,
    start_time: u64,
    boot_id: String,
}

impl Owner {
    /// Writes this process as the owner of `state_dir` (mode 0600, created exclusively).
    /// The caller then adds it to the heartbeat ([`keep_alive`]) — not here, because a
    /// one-shot start must stay single-threaded until it has forked.
    pub(crate) fn record(state_dir: &Path, boot_id: &str) -> io::Result<()> {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let pid = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
        let owner = Self {
            pid,
            start_time: sys::process_start_time(pid)?.unwrap_or(0),
            boot_id: boot_id.to_owned(),
        };
        let bytes = serde_json::to_vec(&owner).map_err(io::Error::other)?;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(state_dir.join(OWNER_FILE))?
            .write_all(&bytes)
    }

    fn read(state_dir: &Path) -> Option<Self> {
        let bytes = read_small(&state_dir.join(OWNER_FILE))?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Whether the owner is still running (a zombie is dead).
    fn is_alive(&self) -> bool {
        sys::boot_id().ok().as_deref() == Some(self.boot_id.as_str())
            && sys::process_start_time(self.pid).ok().flatten() == Some(self.start_time)
            && !is_zombie(self.pid)
    }
}

fn is_zombie(pid: i32) -> bool {
    crate::sys::read_kernel_text(format!("/proc/{pid}/stat"), 512)
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next().map(|st| st == "Z"))
        })
        .unwrap_or(true)
}

/// One leftover that could not be removed (or was kept on purpose).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverProblem {
    /// The sandbox id (its state dir's name).
    pub id: String,
    /// Why it is still there.
    pub reason: String,
}

/// What one pass of [`reap_leftovers`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LeftoverSweep {
    /// State dirs looked at.
    pub inspected: usize,
    /// Sandboxes whose owner is alive (left alone).
    pub live: usize,
    /// Sandboxes a lease names (left to the lease's reap).
    pub journaled: usize,
    /// Ids of the sandboxes destroyed (their init killed if it still ran, cgroup and state
    /// dir removed).
    pub removed: Vec<String>,
    /// Leftovers kept: an unknown owner with something still alive, or a failed teardown.
    pub kept: Vec<LeftoverProblem>,
}

/// Whether `name` is a sandbox id (16 lowercase hex digits, as `LinuxRuntime::start` makes).
fn is_sandbox_id(name: &str) -> bool {
    name.len() == 16
        && name
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The cgroup directories of sandbox `id` that exist: those `LinuxRuntime::start` creates,
/// and on v1 those in the hierarchies earlier versions joined too.
pub fn cgroup_of(layout: &CgroupLayout, parent: &str, id: &str) -> CgroupPaths {
    let mut paths = cgroup_dirs(layout, parent, id, V1_SWEPT);
    paths.dirs.retain(|dir| dir.is_dir());
    paths
}

/// The cgroup directories `LinuxRuntime::start` creates for `id`, whether they exist or
/// not (pure).
pub(crate) fn planned_cgroup(layout: &CgroupLayout, parent: &str, id: &str) -> CgroupPaths {
    cgroup_dirs(layout, parent, id, V1_CONTROLLERS)
}

fn cgroup_dirs(layout: &CgroupLayout, parent: &str, id: &str, v1: &[&str]) -> CgroupPaths {
    let mut dirs: Vec<PathBuf> = Vec::new();
    match layout {
        CgroupLayout::V1 { controllers } => {
            for name in v1 {
                if let Some(mount) = controllers.get(*name) {
                    let dir = mount.join(parent).join(id);
                    if !dirs.contains(&dir) {
                        dirs.push(dir);
                    }
                }
            }
        }
        CgroupLayout::V2 { root, .. } => dirs.push(root.join(parent).join(id)),
    }
    CgroupPaths {
        dirs,
        unified: matches!(layout, CgroupLayout::V2 { .. }),
    }
}

/// Sandbox cgroups under `config.cgroup_parent` that no state dir names (a teardown that
/// lost its cgroup's removal): a start makes its state dir before any cgroup and a
/// teardown removes the cgroup first, so such a cgroup belongs to no sandbox. Removed
/// when empty and older than [`UNOWNED_GRACE`] (the grace covers another runtime dir
/// sharing this cgroup parent); one with processes is reported and kept (nothing is
/// killed that no state dir names).
fn sweep_orphan_cgroups(layout: &CgroupLayout, config: &RuntimeConfig, sweep: &mut LeftoverSweep) {
    let mut ids: Vec<String> = Vec::new();
    // The parent directory in every hierarchy (the paths of a placeholder id, less it).
    for parent in cgroup_dirs(layout, &config.cgroup_parent, "0", V1_SWEPT)
        .dirs
        .iter()
        .filter_map(|dir| dir.parent())
    {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for entry in entries.flatten() {
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if is_sandbox_id(&name)
                && entry.file_type().is_ok_and(|t| t.is_dir())
                && std::fs::symlink_metadata(config.runtime_dir.join(&name)).is_err()
                && !ids.contains(&name)
            {
                ids.push(name);
            }
        }
    }
    for id in ids {
        let cgroup = cgroup_of(layout, &config.cgroup_parent, &id);
        if !cgroup.tasks().is_empty() {
            sweep.kept.push(LeftoverProblem {
                id,
                reason: "a cgroup with processes that no state dir names: left alone".into(),
            });
            continue;
        }
        let young = cgroup.dirs.iter().any(|dir| {
            std::fs::metadata(dir)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() < UNOWNED_GRACE)
        });
        if young {
            continue;
        }
        cgroup.remove_if_empty();
        if cgroup.exists() {
            sweep.kept.push(LeftoverProblem {
                id,
                reason: "an empty cgroup no state dir names could not be removed".into(),
            });
        } else {
            sweep.removed.push(id);
        }
    }
}

/// The recorded identity of the sandbox in `state_dir`, if it parses and names this dir.
fn identity_in(state_dir: &Path, id: &str) -> Option<SandboxIdentity> {
    let bytes = read_small(&state_dir.join(IDENTITY_FILE))?;
    let identity: SandboxIdentity = serde_json::from_slice(&bytes).ok()?;
    (identity.id == id && identity.state_dir == state_dir).then_some(identity)
}

/// Finds and destroys the sandboxes under `config.runtime_dir` whose host died (module doc),
/// except those `journaled` says a lease names. Blocking; safe to run while other hosts run
/// sandboxes there, and to repeat.
pub fn reap_leftovers(
    config: &RuntimeConfig,
    journaled: &dyn Fn(&str) -> bool,
) -> io::Result<LeftoverSweep> {
    let mut sweep = LeftoverSweep::default();
    let entries = match std::fs::read_dir(&config.runtime_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(sweep),
        Err(error) => return Err(error),
    };
    let layout = CgroupLayout::detect().ok().flatten();
    for entry in entries {
        let entry = entry?;
        let Some(id) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if !is_sandbox_id(&id) || !meta.is_dir() {
            continue;
        }
        sweep.inspected += 1;
        if journaled(&id) {
            sweep.journaled += 1;
            continue;
        }
        let state_dir = entry.path();
        let identity = identity_in(&state_dir, &id);
        let cgroup = layout
            .as_ref()
            .map(|layout| cgroup_of(layout, &config.cgroup_parent, &id))
            .unwrap_or(CgroupPaths {
                dirs: Vec::new(),
                unified: false,
            });
        match Owner::read(&state_dir) {
            Some(owner) if owner.is_alive() => {
                sweep.live += 1;
                continue;
            }
            Some(_) => {}
            None => {
                let age = SystemTime::now()
                    .duration_since(
                        SystemTime::UNIX_EPOCH + Duration::from_secs(meta.mtime().max(0) as u64),
                    )
                    .unwrap_or_default();
                let alive = identity.as_ref().is_some_and(SandboxIdentity::is_alive)
                    || !cgroup.tasks().is_empty();
                if age < UNOWNED_GRACE || alive {
                    sweep.kept.push(LeftoverProblem {
                        id,
                        reason: if alive {
                            "no owner record and still running: left alone".into()
                        } else {
                            "no owner record yet (a sandbox being started?)".into()
                        },
                    });
                    continue;
                }
            }
        }
        let target = match identity {
            Some(identity) => SandboxIdentity { cgroup, ..identity },
            // Nothing to kill by pid: an empty boot id never matches, so `destroy` only
            // empties and removes the cgroup and the state dir.
            None => SandboxIdentity {
                id: id.clone(),
                pid: 0,
                start_time: 0,
                boot_id: String::new(),
                cgroup,
                state_dir,
                id_base: None,
            },
        };
        match target.destroy(DESTROY_TIMEOUT) {
            Ok(_) => sweep.removed.push(id),
            Err(error) => sweep.kept.push(LeftoverProblem {
                id,
                reason: format!("teardown failed: {error}: {}", error.source),
            }),
        }
    }
    if let Some(layout) = &layout {
        sweep_orphan_cgroups(layout, config, &mut sweep);
    }
    // A sandbox killed before its identity was written held an id range that no identity
    // names: its slot is stale now that the state dir is gone.
    if let Err(error) = crate::idmap::free_stale() {
        sweep.kept.push(LeftoverProblem {
            id: "id-range slots".into(),
            reason: format!("freeing stale slots failed: {error}"),
        });
    }
    Ok(sweep)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_joins_the_limited_v1_controllers_and_reap_also_finds_older_ones() {
        let root = tempfile::tempdir().unwrap();
        // cpu and cpuacct co-mounted, the others on their own, as many hosts have them.
        let mount = |m: &str| root.path().join(m);
        let controllers: std::collections::BTreeMap<String, PathBuf> = [
            ("memory", mount("memory")),
            ("pids", mount("pids")),
            ("cpu", mount("cpu,cpuacct")),
            ("cpuacct", mount("cpu,cpuacct")),
            ("freezer", mount("freezer")),
        ]
        .into_iter()
        .map(|(c, m)| (c.to_owned(), m))
        .collect();
        let layout = CgroupLayout::V1 { controllers };
        let id = "0123456789abcdef";
        let planned = planned_cgroup(&layout, "p", id).dirs;
        let sub = |m: &str| mount(m).join("p").join(id);
        assert_eq!(planned, [sub("memory"), sub("pids"), sub("cpu,cpuacct")]);
        // A leftover of an earlier version in the freezer hierarchy is found too.
        for m in ["memory", "freezer"] {
            std::fs::create_dir_all(sub(m)).unwrap();
        }
        assert_eq!(
            cgroup_of(&layout, "p", id).dirs,
            [sub("memory"), sub("freezer")]
        );
    }

    fn config(dir: &Path) -> RuntimeConfig {
        RuntimeConfig {
            runtime_dir: dir.to_path_buf(),
            cgroup_parent: format!("omabox-leftover-test-{}", std::process::id()),
            ..RuntimeConfig::default()
        }
    }

    fn state_dir(root: &Path, id: &str) -> PathBuf {
        let dir = root.join(id);
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(dir.join("scratch")).unwrap();
        dir
    }

    #[test]
    fn a_live_owner_keeps_its_sandbox_and_a_dead_one_loses_it() {
        let root = tempfile::tempdir().unwrap();
        let boot = sys::boot_id().unwrap();
        let live = state_dir(root.path(), "00000000000000a1");
        Owner::record(&live, &boot).unwrap();
        let dead = state_dir(root.path(), "00000000000000d1");
        // A pid that exists with another start time is a dead owner (pid reuse).
        let ghost = Owner {
            pid: 1,
            start_time: u64::MAX,
            boot_id: boot.clone(),
        };
        std::fs::write(dead.join(OWNER_FILE), serde_json::to_vec(&ghost).unwrap()).unwrap();
        // A half-written identity is removed with it.
        std::fs::write(dead.join(IDENTITY_FILE), b"{\"id\":\"00000000").unwrap();

        let sweep = reap_leftovers(&config(root.path()), &|_| false).unwrap();
        assert_eq!(sweep.inspected, 2);
        assert_eq!(sweep.live, 1);
        assert_eq!(sweep.removed, vec!["00000000000000d1".to_owned()]);
        assert!(sweep.kept.is_empty(), "{:?}", sweep.kept);
        assert!(live.join(OWNER_FILE).exists());
        assert!(!dead.exists());
    }

    #[test]
    fn the_owner_file_tells_when_its_owner_was_last_alive() {
        let root = tempfile::tempdir().unwrap();
        let dir = state_dir(root.path(), "00000000000000a2");
        assert_eq!(last_alive_ms(&dir), None);
        Owner::record(&dir, &sys::boot_id().unwrap()).unwrap();
        keep_alive(&dir);
        let written = last_alive_ms(&dir).unwrap();
        // The heartbeat moves it forward while we own it (polled, not timed).
        let old = SystemTime::now() - Duration::from_secs(3600);
        std::fs::File::open(dir.join(OWNER_FILE))
            .unwrap()
            .set_modified(old)
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while last_alive_ms(&dir).unwrap() < written {
            assert!(std::time::Instant::now() < deadline, "no heartbeat");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::fs::remove_file(dir.join(OWNER_FILE)).unwrap();
        assert_eq!(last_alive_ms(&dir), None);
    }

    #[test]
    fn a_journaled_sandbox_is_left_to_its_lease() {
        let root = tempfile::tempdir().unwrap();
        let dead = state_dir(root.path(), "00000000000000f1");
        let ghost = Owner {
            pid: 1,
            start_time: u64::MAX,
            boot_id: sys::boot_id().unwrap(),
        };
        std::fs::write(dead.join(OWNER_FILE), serde_json::to_vec(&ghost).unwrap()).unwrap();
        let sweep = reap_leftovers(&config(root.path()), &|id| id == "00000000000000f1").unwrap();
        assert_eq!((sweep.journaled, sweep.removed.len()), (1, 0));
        assert!(dead.exists());
    }

    #[test]
    fn an_unowned_dir_waits_for_the_grace_period_and_foreign_names_are_ignored() {
        let root = tempfile::tempdir().unwrap();
        let young = state_dir(root.path(), "00000000000000b1");
        std::fs::create_dir(root.path().join("not-a-sandbox")).unwrap();
        std::os::unix::fs::symlink("/", root.path().join("00000000000000c1")).unwrap();
        let sweep = reap_leftovers(&config(root.path()), &|_| false).unwrap();
        assert_eq!(sweep.inspected, 1, "only real dirs named like a sandbox id");
        assert!(sweep.removed.is_empty());
        assert_eq!(sweep.kept.len(), 1);
        assert!(young.exists());

        let old = SystemTime::now() - UNOWNED_GRACE - Duration::from_secs(5);
        std::fs::File::open(&young)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let sweep = reap_leftovers(&config(root.path()), &|_| false).unwrap();
        assert_eq!(sweep.removed, vec!["00000000000000b1".to_owned()]);
        assert!(!young.exists());
        assert!(root.path().join("not-a-sandbox").exists());
    }

    #[test]
    fn unknown_files_in_a_state_dir_are_not_deleted() {
        let root = tempfile::tempdir().unwrap();
        let dead = state_dir(root.path(), "00000000000000e1");
        let ghost = Owner {
            pid: 1,
            start_time: u64::MAX,
            boot_id: sys::boot_id().unwrap(),
        };
        std::fs::write(dead.join(OWNER_FILE), serde_json::to_vec(&ghost).unwrap()).unwrap();
        std::fs::write(dead.join("planted"), b"x").unwrap();
        let sweep = reap_leftovers(&config(root.path()), &|_| false).unwrap();
        assert!(sweep.removed.is_empty());
        assert_eq!(sweep.kept.len(), 1, "{sweep:?}");
        assert!(dead.join("planted").exists());
    }
}
