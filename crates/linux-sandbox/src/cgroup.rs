//! One cgroup per sandbox, on cgroup v1 (one directory per controller) or v2 (one
//! directory in the unified hierarchy).
//!
//! The host creates the directories and writes the limits before the sandbox's first
//! process runs any code of its own, then moves that process in; removal kills whatever
//! is left and retries `rmdir` while exiting tasks drain.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::plan::{CpuLimit, Limits};
use crate::sys;

/// v1 controllers a sandbox joins: the ones its limits are written to. `cpuset` is left
/// out on purpose (a new v1 cpuset group refuses tasks until `cpus`/`mems` are copied in,
/// and the sandbox needs no pinning), and so are `cpuacct` and `freezer`, which nothing
/// reads or writes: each joined v1 hierarchy is a mkdir, a join and an rmdir on every
/// sandbox's start and teardown.
pub const V1_CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];
/// v1 controllers in which a leftover sandbox cgroup is looked for: the joined ones and
/// those earlier omabox versions joined too.
pub const V1_SWEPT: &[&str] = &["memory", "pids", "cpu", "cpuacct", "freezer"];
/// v1 controllers without which limits cannot be enforced.
pub const V1_REQUIRED: &[&str] = &["memory", "pids"];
/// v2 controllers enabled for sandboxes.
pub const V2_CONTROLLERS: &[&str] = &["memory", "pids", "cpu"];

/// Where the cgroup hierarchies are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum CgroupLayout {
    /// Legacy hierarchies: controller name → mount point.
    V1 {
        /// Controller → mount point (co-mounted controllers share one).
        controllers: BTreeMap<String, PathBuf>,
    },
    /// The unified hierarchy with its available controllers.
    V2 {
        /// Mount point (normally `/sys/fs/cgroup`).
        root: PathBuf,
        /// Controllers listed in the root's `cgroup.controllers`.
        controllers: Vec<String>,
    },
}

impl CgroupLayout {
    /// Reads `/proc/self/mountinfo`. v2 is chosen when `/sys/fs/cgroup` itself is cgroup2
    /// with controllers; otherwise v1 controllers are collected (a controller-less v2
    /// mount such as `/sys/fs/cgroup/unified` is ignored). `Ok(None)`: no usable cgroups.
    pub fn detect() -> io::Result<Option<Self>> {
        let mountinfo = sys::read_kernel_text("/proc/self/mountinfo", 16 << 10)?;
        let mut v1 = BTreeMap::new();
        let mut v2_root = None;
        for line in mountinfo.lines() {
            let Some((left, right)) = line.split_once(" - ") else {
                continue;
            };
            let mount_point = left.split(' ').nth(4).unwrap_or("");
            let mut r = right.split(' ');
            let fstype = r.next().unwrap_or("");
            let _source = r.next();
            let super_opts = r.next().unwrap_or("");
            match fstype {
                "cgroup2" if mount_point == "/sys/fs/cgroup" => {
                    v2_root = Some(PathBuf::from(mount_point));
                }
                "cgroup" => {
                    for opt in super_opts.split(',') {
                        if V1_SWEPT.contains(&opt) || opt == "devices" {
                            v1.entry(opt.to_owned())
                                .or_insert_with(|| PathBuf::from(unescape(mount_point)));
                        }
                    }
                }
                _ => {}
            }
        }
        if let Some(root) = v2_root {
            let controllers: Vec<String> =
                std::fs::read_to_string(root.join("cgroup.controllers"))?
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
            if !controllers.is_empty() {
                return Ok(Some(Self::V2 { root, controllers }));
            }
        }
        if v1.is_empty() {
            return Ok(None);
        }
        Ok(Some(Self::V1 { controllers: v1 }))
    }

    /// A v1 layout cut in two: the hierarchy holding `controller` (with whatever is
    /// co-mounted with it), and every other one; `None` for an empty part, and for v2
    /// (one hierarchy: nothing to share out).
    pub fn split_v1(&self, controller: &str) -> (Option<Self>, Option<Self>) {
        let Self::V1 { controllers } = self else {
            return (None, None);
        };
        let mount = controllers.get(controller);
        let (with, rest): (BTreeMap<_, _>, BTreeMap<_, _>) = controllers
            .iter()
            .map(|(c, m)| (c.clone(), m.clone()))
            .partition(|(_, m)| Some(m) == mount);
        let part = |controllers: BTreeMap<String, PathBuf>| {
            (!controllers.is_empty()).then_some(Self::V1 { controllers })
        };
        (part(with), part(rest))
    }

    /// The layout a sandbox with `limits` joins. On v1 the cpu hierarchy (with whatever is
    /// co-mounted with it) is left out when `limits` cannot limit CPU there: no CPU limit,
    /// or a quota of at least every CPU this host can ever have (`possible_cpus`). Such a
    /// cgroup would limit nothing and cost every sandbox a mkdir, two limit writes, a join
    /// and an rmdir; the sandbox's processes stay in the host's own cpu cgroup, whose limits
    /// (if any) bound them as before. Never the memory or pids hierarchy: those carry limits
    /// and are how teardown finds every process of the sandbox. v2 is one directory anyway.
    pub fn for_limits(&self, limits: &Limits, possible_cpus: impl FnOnce() -> u64) -> Self {
        let Self::V1 { controllers } = self else {
            return self.clone();
        };
        let Some(cpu_mount) = controllers.get("cpu") else {
            return self.clone();
        };
        let shared_with_required = V1_REQUIRED
            .iter()
            .any(|c| controllers.get(*c) == Some(cpu_mount));
        let limits_nothing = match limits.cpu {
            None => true,
            Some(CpuLimit::Quota {
                quota_us,
                period_us,
            }) => quota_us >= period_us.saturating_mul(possible_cpus()),
            Some(CpuLimit::Shares { .. }) => false,
        };
        if shared_with_required || !limits_nothing {
            return self.clone();
        }
        Self::V1 {
            controllers: controllers
                .iter()
                .filter(|(_, m)| *m != cpu_mount)
                .map(|(c, m)| (c.clone(), m.clone()))
                .collect(),
        }
    }

    /// Controllers required for limits that this layout lacks.
    pub fn missing_required(&self) -> Vec<&'static str> {
        match self {
            Self::V1 { controllers } => V1_REQUIRED
                .iter()
                .copied()
                .filter(|c| !controllers.contains_key(*c))
                .collect(),
            Self::V2 { controllers, .. } => ["memory", "pids"]
                .into_iter()
                .filter(|c| !controllers.iter().any(|x| x == c))
                .collect(),
        }
    }
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = (b[i] == b'\\' && i + 4 <= b.len())
            .then(|| std::str::from_utf8(&b[i + 1..i + 4]).ok())
            .flatten()
            .and_then(|d| u8::from_str_radix(d, 8).ok());
        if let Some(v) = octal {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A sandbox's cgroup: the directories it owns. Serializable, so a fresh process can
/// remove it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CgroupPaths {
    /// v1: one directory per controller; v2: exactly one directory.
    pub dirs: Vec<PathBuf>,
    /// Which layout the directories belong to.
    pub unified: bool,
}

impl CgroupPaths {
    /// Creates the directories under `<mount>/<parent>/<id>` and writes `limits`.
    /// On error, whatever was created is removed again.
    pub fn create(
        layout: &CgroupLayout,
        parent: &str,
        id: &str,
        limits: &Limits,
    ) -> io::Result<Self> {
        let mut created = Self {
            dirs: Vec::new(),
            unified: matches!(layout, CgroupLayout::V2 { .. }),
        };
        let result = created.create_inner(layout, parent, id, limits);
        if let Err(e) = result {
            let _ = created.remove(Duration::from_millis(500));
            return Err(e);
        }
        Ok(created)
    }

    fn create_inner(
        &mut self,
        layout: &CgroupLayout,
        parent: &str,
        id: &str,
        limits: &Limits,
    ) -> io::Result<()> {
        match layout {
            CgroupLayout::V1 { controllers } => {
                let mut seen = Vec::new();
                for name in V1_CONTROLLERS {
                    let Some(mount) = controllers.get(*name) else {
                        continue;
                    };
                    if seen.contains(mount) {
                        continue; // co-mounted (e.g. cpu,cpuacct): one directory serves both
                    }
                    seen.push(mount.clone());
                    let parent_dir = mount.join(parent);
                    ensure_dir(&parent_dir)?;
                    if limits.memory_bytes.is_some() && controllers.get("memory") == Some(mount) {
                        keep_socket_accounting_on(&parent_dir);
                    }
                    let dir = parent_dir.join(id);
                    std::fs::create_dir(&dir)?;
                    self.dirs.push(dir.clone());
                    // A co-mounted directory gets the settings of every controller in it.
                    for (ctrl, m) in controllers {
                        if m == mount {
                            write_v1_limits(&dir, ctrl, limits)?;
                        }
                    }
                }
            }
            CgroupLayout::V2 { root, controllers } => {
                let parent_dir = root.join(parent);
                ensure_dir(&parent_dir)?;
                let wanted: Vec<String> = V2_CONTROLLERS
                    .iter()
                    .filter(|c| controllers.iter().any(|x| x == *c))
                    .map(|c| format!("+{c}"))
                    .collect();
                // Delegate the controllers down to our parent directory.
                let line = wanted.join(" ");
                if !line.is_empty() {
                    std::fs::write(root.join("cgroup.subtree_control"), &line)?;
                    std::fs::write(parent_dir.join("cgroup.subtree_control"), &line)?;
                }
                let dir = parent_dir.join(id);
                std::fs::create_dir(&dir)?;
                self.dirs.push(dir.clone());
                write_v2_limits(&dir, limits)?;
            }
        }
        Ok(())
    }

    /// cgroup v1 only: each directory's `tasks` file, through which a single-threaded
    /// process can move itself in without the global lock a move of another process's
    /// thread group takes (see `setup::join_cgroups`). `None` on v2 (its `tasks`
    /// equivalent, `cgroup.threads`, moves threads only within a threaded subtree).
    pub(crate) fn self_join_files(&self) -> Option<Vec<PathBuf>> {
        (!self.unified).then(|| self.dirs.iter().map(|d| d.join("tasks")).collect())
    }

    /// Moves `pid` into every directory.
    pub(crate) fn add(&self, pid: i32) -> io::Result<()> {
        let pid = pid.to_string();
        for dir in &self.dirs {
            std::fs::write(dir.join("cgroup.procs"), &pid)?;
        }
        Ok(())
    }

    /// Pids still in the cgroup.
    pub fn tasks(&self) -> Vec<i32> {
        let mut out = Vec::new();
        for dir in &self.dirs {
            if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                out.extend(s.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// Kills every task still inside (v2: `cgroup.kill`; v1: SIGKILL to each listed
    /// pid — the pids read from our own cgroup directory can only be sandbox tasks).
    pub(crate) fn kill_all(&self) {
        if self.unified {
            for dir in &self.dirs {
                let _ = std::fs::write(dir.join("cgroup.kill"), "1");
            }
        }
        for pid in self.tasks() {
            let _ = sys::kill(pid, libc::SIGKILL);
        }
    }

    /// Kills what is left and removes every directory; retries while tasks drain.
    /// Already-removed directories are fine (idempotent).
    pub fn remove(&self, timeout: Duration) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut pause = Duration::from_micros(200);
        loop {
            let mut last_err = None;
            for dir in &self.dirs {
                match std::fs::remove_dir(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => last_err = Some(e),
                }
            }
            let Some(err) = last_err else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(err);
            }
            self.kill_all();
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// One attempt to remove every directory, without waiting or killing: what is not
    /// empty (or gone already) stays as it is.
    pub fn remove_if_empty(&self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Whether any directory still exists.
    pub fn exists(&self) -> bool {
        self.dirs.iter().any(|d| d.exists())
    }

    /// How many processes the kernel's OOM killer has killed in this cgroup so far
    /// (`oom_kill` of v2 `memory.events` / v1 `memory.oom_control`); `None` without a
    /// memory controller or on a kernel that does not count.
    pub fn oom_kills(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            ["memory.events", "memory.oom_control"]
                .iter()
                .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
                .and_then(|text| {
                    text.lines()
                        .find_map(|l| l.strip_prefix("oom_kill "))
                        .and_then(|n| n.trim().parse().ok())
                })
        })
    }

    /// The memory limit in bytes (v2 `memory.max`, v1 `memory.limit_in_bytes`); `None`
    /// when unlimited or unknown.
    pub fn memory_limit(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            ["memory.max", "memory.limit_in_bytes"]
                .iter()
                .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
                // v1 says "unlimited" with a huge page-rounded number.
                .and_then(|text| text.trim().parse::<u64>().ok())
                .filter(|n| *n < 1 << 60)
        })
    }

    /// CPU time the cgroup's processes used so far, in nanoseconds: v2 `cpu.stat`'s
    /// `usage_usec`; v1 `cpuacct.usage` when `cpuacct` is co-mounted with a joined
    /// controller; otherwise (v1 with `cpuacct` mounted apart, which sandboxes do not
    /// join, see [`V1_CONTROLLERS`]) the user and system time of the tasks still inside
    /// and of the children they reaped (`/proc/<pid>/stat`, at most [`MAX_STAT_TASKS`]
    /// of them): what exited unreaped is not counted there. `None` when none is readable.
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        let counted = self.dirs.iter().find_map(|d| {
            if let Ok(text) = std::fs::read_to_string(d.join("cpu.stat"))
                && let Some(usec) = text
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|n| n.trim().parse::<u64>().ok())
            {
                return Some(usec.saturating_mul(1000));
            }
            std::fs::read_to_string(d.join("cpuacct.usage"))
                .ok()
                .and_then(|text| text.trim().parse().ok())
        });
        counted.or_else(|| {
            let ticks = sys::clock_ticks_per_second()?;
            let total: u64 = self
                .tasks()
                .iter()
                .take(MAX_STAT_TASKS)
                .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
                .filter_map(|stat| stat_cpu_ticks(&stat))
                .fold(0, u64::saturating_add);
            Some(total.saturating_mul(1_000_000_000) / ticks)
        })
    }

    /// Page cache charged to the cgroup, in bytes (v1 `memory.stat`'s `total_cache`, else
    /// `cache`; v2 `memory.stat`'s `file`).
    pub fn memory_cache(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            let text = std::fs::read_to_string(d.join("memory.stat")).ok()?;
            let field = |name: &str| {
                text.lines().find_map(|l| {
                    l.strip_prefix(name)
                        .and_then(|rest| rest.strip_prefix(' '))
                        .and_then(|n| n.trim().parse::<u64>().ok())
                })
            };
            field("total_cache")
                .or_else(|| field("cache"))
                .or_else(|| field("file"))
        })
    }

    /// Current memory usage in bytes (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub fn memory_usage(&self) -> Option<u64> {
        self.dirs.iter().find_map(|d| {
            ["memory.usage_in_bytes", "memory.current"]
                .iter()
                .find_map(|f| std::fs::read_to_string(d.join(f)).ok())
                .and_then(|s| s.trim().parse().ok())
        })
    }
}

/// Tasks whose `/proc/<pid>/stat` one [`CgroupPaths::cpu_usage_ns`] reads at most.
pub const MAX_STAT_TASKS: usize = 4096;

/// `utime + stime + cutime + cstime` (fields 14-17) of a `/proc/<pid>/stat` line, in clock
/// ticks. The fields are counted after the last `)`: the command name before it is the
/// process's own choice and may hold spaces and parentheses.
fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let (_, after_name) = stat.rsplit_once(')')?;
    // After the name: field 3 (state) is the first; fields 14..=17 are the 12th..=15th.
    let fields: Vec<&str> = after_name.split_whitespace().skip(11).take(4).collect();
    if fields.len() < 4 {
        return None;
    }
    fields.iter().try_fold(0u64, |sum, field| {
        // cutime and cstime are signed in the kernel's format; negative never happens.
        Some(sum.saturating_add(field.parse::<i64>().ok()?.max(0).unsigned_abs()))
    })
}

fn ensure_dir(p: &Path) -> io::Result<()> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e),
    }
}

fn write_file(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    std::fs::write(dir.join(file), value)
        .map_err(|e| io::Error::new(e.kind(), format!("writing {value} to {file}: {e}")))
}

/// Sets the (unlimited) socket-memory limit of the parent memory cgroup, which turns
/// the kernel's socket accounting on for as long as the parent exists. Each sandbox's
/// own limit (see [`write_v1_limits`]) would otherwise switch that global static key on
/// and, at its removal, off again: code patching on every CPU twice per sandbox. Best
/// effort: a failure costs speed, not a limit.
fn keep_socket_accounting_on(parent_dir: &Path) {
    let _ = write_file(parent_dir, "memory.kmem.tcp.limit_in_bytes", "-1");
}

fn write_v1_limits(dir: &Path, controller: &str, limits: &Limits) -> io::Result<()> {
    match controller {
        "memory" => {
            if let Some(m) = limits.memory_bytes {
                write_file(dir, "memory.limit_in_bytes", &m.to_string())?;
                // memory+swap: only present with swap accounting; the sandbox must not
                // escape its memory limit by swapping.
                if dir.join("memory.memsw.limit_in_bytes").exists() {
                    write_file(dir, "memory.memsw.limit_in_bytes", &m.to_string())?;
                }
                let _ = write_file(dir, "memory.swappiness", "0");
                // Socket buffers: v1 charges them to a memory cgroup only once its
                // `memory.kmem.tcp.limit_in_bytes` is set (the counter takes every
                // protocol's socket memory, UDP's too, apart from `memory.usage`).
                // Unset, they count against nothing but the host-wide `tcp_mem` and
                // `udp_mem` pools: a sandbox holding a few hundred unread loopback
                // connections pinned ~4 MiB each outside its limit, until every socket
                // of the host was under memory pressure. A kernel without the file (it
                // is deprecated) leaves them uncharged; SECURITY.md says so.
                match write_file(dir, "memory.kmem.tcp.limit_in_bytes", &m.to_string()) {
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    r => r?,
                }
            }
        }
        "pids" => {
            if let Some(p) = limits.pids_max {
                write_file(dir, "pids.max", &p.to_string())?;
            }
        }
        "cpu" => match limits.cpu {
            Some(CpuLimit::Quota {
                quota_us,
                period_us,
            }) => {
                write_file(dir, "cpu.cfs_period_us", &period_us.to_string())?;
                write_file(dir, "cpu.cfs_quota_us", &quota_us.to_string())?;
            }
            Some(CpuLimit::Shares { shares }) => {
                write_file(dir, "cpu.shares", &shares.max(2).to_string())?;
            }
            None => {}
        },
        _ => {}
    }
    Ok(())
}

fn write_v2_limits(dir: &Path, limits: &Limits) -> io::Result<()> {
    if let Some(m) = limits.memory_bytes {
        write_file(dir, "memory.max", &m.to_string())?;
        if dir.join("memory.swap.max").exists() {
            write_file(dir, "memory.swap.max", "0")?;
        }
    }
    if let Some(p) = limits.pids_max {
        write_file(dir, "pids.max", &p.to_string())?;
    }
    match limits.cpu {
        Some(CpuLimit::Quota {
            quota_us,
            period_us,
        }) => write_file(dir, "cpu.max", &format!("{quota_us} {period_us}"))?,
        Some(CpuLimit::Shares { shares }) => {
            // v1 shares 2..=262144 (default 1024) → v2 weight 1..=10000 (default 100),
            // the conversion runc and systemd use.
            let s = shares.clamp(2, 262_144);
            let weight = 1 + ((s - 2) * 9999) / 262_142;
            write_file(dir, "cpu.weight", &weight.to_string())?;
        }
        None => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A v1 layout of `(controller, mount)` pairs.
    fn v1(pairs: &[(&str, &str)]) -> CgroupLayout {
        CgroupLayout::V1 {
            controllers: pairs
                .iter()
                .map(|(c, m)| (c.to_string(), PathBuf::from(m)))
                .collect(),
        }
    }

    #[test]
    fn a_v1_layout_splits_into_one_hierarchy_and_the_rest() {
        let layout = v1(&[
            ("memory", "/cg/memory"),
            ("pids", "/cg/pids"),
            ("cpu", "/cg/cpu,cpuacct"),
            ("cpuacct", "/cg/cpu,cpuacct"),
        ]);
        assert_eq!(
            layout.split_v1("memory"),
            (
                Some(v1(&[("memory", "/cg/memory")])),
                Some(v1(&[
                    ("pids", "/cg/pids"),
                    ("cpu", "/cg/cpu,cpuacct"),
                    ("cpuacct", "/cg/cpu,cpuacct"),
                ]))
            )
        );
        // Co-mounted controllers stay together; a missing one leaves its part empty.
        assert_eq!(
            layout.split_v1("cpuacct").0,
            Some(v1(&[
                ("cpu", "/cg/cpu,cpuacct"),
                ("cpuacct", "/cg/cpu,cpuacct")
            ]))
        );
        assert_eq!(layout.split_v1("hugetlb").0, None);
        let v2 = CgroupLayout::V2 {
            root: "/sys/fs/cgroup".into(),
            controllers: vec!["memory".into()],
        };
        assert_eq!(v2.split_v1("memory"), (None, None));
    }

    #[test]
    fn a_cpu_limit_that_limits_nothing_joins_no_v1_cpu_hierarchy() {
        let layout = v1(&[
            ("memory", "/cg/memory"),
            ("pids", "/cg/pids"),
            ("cpu", "/cg/cpu,cpuacct"),
            ("cpuacct", "/cg/cpu,cpuacct"),
            ("freezer", "/cg/freezer"),
        ]);
        let without_cpu = v1(&[
            ("memory", "/cg/memory"),
            ("pids", "/cg/pids"),
            ("freezer", "/cg/freezer"),
        ]);
        let limits = |cpu| Limits {
            cpu,
            ..Limits::default()
        };
        let quota = |cpus: u64| {
            Some(CpuLimit::Quota {
                quota_us: cpus * 100_000,
                period_us: 100_000,
            })
        };
        // Two CPUs' worth of quota on a host that can have at most two: a no-op.
        assert_eq!(layout.for_limits(&limits(quota(2)), || 2), without_cpu);
        assert_eq!(layout.for_limits(&limits(None), || 2), without_cpu);
        // A quota below what the host can have, or a weight, is a limit.
        assert_eq!(layout.for_limits(&limits(quota(2)), || 3), layout);
        assert_eq!(
            layout.for_limits(&limits(Some(CpuLimit::Shares { shares: 512 })), || 1),
            layout
        );
        // Unknown host size: kept.
        assert_eq!(layout.for_limits(&limits(quota(64)), || u64::MAX), layout);
        // Co-mounted with memory (or pids): the hierarchy is kept for their sake.
        let shared = v1(&[("memory", "/cg/m"), ("cpu", "/cg/m"), ("pids", "/cg/pids")]);
        assert_eq!(shared.for_limits(&limits(None), || 1), shared);
        // v2: one directory whatever the limits.
        let v2 = CgroupLayout::V2 {
            root: "/sys/fs/cgroup".into(),
            controllers: vec!["memory".into(), "cpu".into()],
        };
        assert_eq!(v2.for_limits(&limits(None), || 1), v2);
    }

    #[test]
    fn self_join_files_are_the_v1_tasks_files_only() {
        let v1 = CgroupPaths {
            dirs: vec![
                PathBuf::from("/sys/fs/cgroup/memory/p/x"),
                PathBuf::from("/sys/fs/cgroup/pids/p/x"),
            ],
            unified: false,
        };
        assert_eq!(
            v1.self_join_files(),
            Some(vec![
                PathBuf::from("/sys/fs/cgroup/memory/p/x/tasks"),
                PathBuf::from("/sys/fs/cgroup/pids/p/x/tasks"),
            ])
        );
        let v2 = CgroupPaths {
            dirs: vec![PathBuf::from("/sys/fs/cgroup/p/x")],
            unified: true,
        };
        assert_eq!(v2.self_join_files(), None);
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }

    fn fake(files: &[(&str, &str, &str)], unified: bool) -> (tempfile::TempDir, CgroupPaths) {
        let root = tempfile::tempdir().unwrap();
        let mut dirs = Vec::new();
        for (dir, file, text) in files {
            let dir = root.path().join(dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(file), text).unwrap();
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
        (root, CgroupPaths { dirs, unified })
    }

    #[test]
    fn cpu_usage_and_page_cache_are_read_in_both_layouts() {
        // v1: `cpu` (its cpu.stat has no usage) co-mounted with cpuacct; memory apart.
        let (_root, v1) = fake(
            &[
                (
                    "memory",
                    "memory.stat",
                    "cache 4096\nrss 8192\ntotal_cache 12288\n",
                ),
                (
                    "cpu,cpuacct",
                    "cpu.stat",
                    "nr_periods 0\nthrottled_time 0\n",
                ),
                ("cpu,cpuacct", "cpuacct.usage", "123456789\n"),
            ],
            false,
        );
        assert_eq!(v1.cpu_usage_ns(), Some(123_456_789));
        assert_eq!(v1.memory_cache(), Some(12_288));
        let (_root, v2) = fake(
            &[
                ("sbx", "cpu.stat", "usage_usec 2500\nuser_usec 2000\n"),
                ("sbx", "memory.stat", "anon 100\nfile 7000\nfile_mapped 5\n"),
            ],
            true,
        );
        assert_eq!(v2.cpu_usage_ns(), Some(2_500_000));
        assert_eq!(v2.memory_cache(), Some(7000));
    }

    /// v1 without a cpuacct directory: the times of the tasks inside, from /proc (here
    /// this test process, which has used some CPU by now).
    #[test]
    fn v1_cpu_usage_without_cpuacct_is_the_tasks_times() {
        let pid = std::process::id().to_string();
        let (_root, v1) = fake(&[("memory", "cgroup.procs", &pid)], false);
        let spin = std::time::Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0);
        }
        assert!(v1.cpu_usage_ns().is_some_and(|ns| ns > 0));
    }

    #[test]
    fn stat_times_are_read_after_the_command_name() {
        // A name with spaces and a `)` of its own; utime 5, stime 7, cutime 11, cstime 13.
        let stat = "42 (a) b (c) S 1 42 42 0 -1 4194560 100 0 0 0 5 7 11 13 20 0 1 0 99";
        assert_eq!(stat_cpu_ticks(stat), Some(36));
        assert_eq!(stat_cpu_ticks("42 (short) S 1"), None);
    }
}
