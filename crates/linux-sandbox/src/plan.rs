//! The sandbox plan: plain data saying what the sandbox looks like.
//!
//! The host decides policy (which directories, how much memory, which network) and writes
//! it down here; this crate only turns the plan into system calls. A plan is serialized
//! to JSON and handed to the setup stage inside the new namespaces, so every field is
//! serde data and nothing here holds an fd or a handle.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

use omabox_contract::networking::{NetworkPolicy, NetworkingConfig, NetworkingError};
use serde::{Deserialize, Serialize};

/// Everything the sandbox is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SandboxPlan {
    /// Where `/` comes from.
    pub rootfs: RootfsSource,
    /// Host directory bound writable at `/workspace` (also the agent's working dir).
    pub workspace: Option<PathBuf>,
    /// Host directory bound writable at `/mnt/session/outputs`.
    pub outputs: Option<PathBuf>,
    /// Further binds (read-only unless said otherwise).
    #[serde(default)]
    pub binds: Vec<BindMount>,
    /// Resource limits.
    #[serde(default)]
    pub limits: Limits,
    /// What the sandbox may reach besides its own loopback.
    #[serde(default)]
    pub network: Networking,
    /// Environment of the agent and so of every process it starts. Nothing of the host's
    /// environment is inherited.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Hostname inside the sandbox's UTS namespace.
    pub hostname: String,
    /// Hardening switches. Every default is the strict one.
    #[serde(default)]
    pub hardening: Hardening,
    /// With a [`RootfsSource::Directory`] root: further read-only layers over it, topmost
    /// first (the backend's environment layers), each idmapped like the rootfs.
    #[serde(default)]
    pub root_layers: Vec<PathBuf>,
    /// With a [`RootfsSource::Directory`] root: an empty host directory that holds the
    /// overlay's upper layer (`upper/`, `work/`) instead of the scratch tmpfs, so the host
    /// can keep what the sandbox wrote to `/` (an environment layer's build). Not bounded
    /// by the memory limit: only for sandboxes that run the host's own scripts.
    #[serde(default)]
    pub root_upper: Option<PathBuf>,
    /// A writable tmpfs at `/mnt/memory` (sized like `/tmp`), for Session memory stores.
    #[serde(default)]
    pub memory_mount: bool,
    /// No host directory at `/workspace`: a tmpfs of the sandbox's own (what a throwaway
    /// run needs), half the memory limit and charged to it, gone with the sandbox.
    /// Nothing of it is on the host: no directory to create, idmap, remove or leave behind.
    /// Excludes [`SandboxPlan::workspace`].
    #[serde(default)]
    pub workspace_tmpfs: bool,
    /// The account `user` (uid/gid 1000, home `/home/user`) E2B-style clients run as: the
    /// generated `/etc/passwd` and `/etc/group` list it, and `/home/user` is a tmpfs of its
    /// own owned by it (sized like the workspace tmpfs, charged to the memory limit).
    #[serde(default)]
    pub user_home: bool,
}

impl SandboxPlan {
    /// A plan with the preinstalled rootfs, no binds, default limits and no network.
    pub fn preinstalled(hostname: impl Into<String>) -> Self {
        Self {
            rootfs: RootfsSource::Preinstalled,
            workspace: None,
            outputs: None,
            binds: Vec::new(),
            limits: Limits::default(),
            network: Networking::default(),
            env: default_env(),
            hostname: hostname.into(),
            hardening: Hardening::default(),
            root_layers: Vec::new(),
            root_upper: None,
            memory_mount: false,
            workspace_tmpfs: false,
            user_home: false,
        }
    }

    /// Whether the sandbox's mounts hold a host directory the caller named (workspace,
    /// outputs, binds, a rootfs directory or its layers): as long as any process of the
    /// sandbox's mount namespace lives, that directory's filesystem stays in use (the
    /// host's own mount of it can go, but its superblock and device stay busy: no fsck,
    /// loop detach or eject). The preinstalled rootfs holds only the host's system
    /// directories.
    pub fn holds_host_dirs(&self) -> bool {
        !matches!(self.rootfs, RootfsSource::Preinstalled)
            || self.workspace.is_some()
            || self.outputs.is_some()
            || !self.binds.is_empty()
            || !self.root_layers.is_empty()
            || self.root_upper.is_some()
    }

    /// Checks what can be checked without touching the system: the network config
    /// compiles, paths are absolute and normal, the hostname is valid.
    pub fn validate(&self) -> Result<(), PlanError> {
        self.network.policy()?;
        if self.hostname.is_empty()
            || self.hostname.len() > 64
            || !self
                .hostname
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(PlanError::Hostname(self.hostname.clone()));
        }
        if let RootfsSource::Directory { path } = &self.rootfs {
            host_path("rootfs", path)?;
        }
        for layer in &self.root_layers {
            host_path("root layer", layer)?;
        }
        if let Some(upper) = &self.root_upper {
            host_path("root upper", upper)?;
        }
        if let Some(w) = &self.workspace {
            host_path("workspace", w)?;
            if self.workspace_tmpfs {
                return Err(PlanError::TwoWorkspaces);
            }
        }
        if let Some(o) = &self.outputs {
            host_path("outputs", o)?;
        }
        for b in &self.binds {
            host_path("bind source", &b.source)?;
            sandbox_path(&b.target)?;
        }
        for (k, v) in &self.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(PlanError::Env(k.clone()));
            }
        }
        if self.limits.nofile == 0 {
            return Err(PlanError::Limit("nofile must be at least 1"));
        }
        Ok(())
    }
}

/// `PATH`, `HOME`, `LANG`, `TERM`: what a shell expects and nothing from the host.
pub fn default_env() -> BTreeMap<String, String> {
    [
        (
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        ),
        ("HOME", "/root"),
        ("LANG", "C.UTF-8"),
        ("TERM", "dumb"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// The system CA bundle of the preinstalled rootfs (the host's `/etc/ssl/certs`, bound
/// read-only).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// Where an image root sees the host's [`CA_BUNDLE`] (read-only): the factory binds it
/// there and points [`CA_ENV`] at it.
pub const IMAGE_CA_BUNDLE: &str = "/etc/omabox/host-ca-certificates.crt";

/// Variables that make common TLS clients use [`CA_BUNDLE`] instead of a bundle of their
/// own (pip's and requests' certifi, node's built-in list, git, curl, OpenSSL). The
/// factory sets them for the preinstalled rootfs, where that bundle is the host's, and for
/// an image root to [`IMAGE_CA_BUNDLE`].
pub const CA_ENV: &[&str] = &[
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CURL_CA_BUNDLE",
];

/// Where the root filesystem comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum RootfsSource {
    /// Read-only binds of the host's `/usr`, `/bin`, `/sbin`, `/lib*` (where present),
    /// with a generated `/etc` holding no host secret. The root itself is read-only.
    Preinstalled,
    /// A local rootfs directory used as the read-only lower layer of an overlay whose
    /// upper layer is a size-limited tmpfs: the sandbox can write anywhere in `/`
    /// without touching the directory.
    Directory {
        /// Absolute host path of the unpacked rootfs.
        path: PathBuf,
    },
}

/// One bind mount of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BindMount {
    /// Absolute host path (file or directory).
    pub source: PathBuf,
    /// Absolute path inside the sandbox.
    pub target: PathBuf,
    /// Writable; read-only by default.
    #[serde(default)]
    pub writable: bool,
}

/// Resource limits. `None` leaves a resource unlimited (by this sandbox's cgroup).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    /// Memory (and, where the kernel accounts it, memory+swap) in bytes.
    pub memory_bytes: Option<u64>,
    /// Maximum number of tasks (processes and threads), the agent included.
    pub pids_max: Option<u64>,
    /// CPU bandwidth.
    pub cpu: Option<CpuLimit>,
    /// Size of the `/tmp` tmpfs in bytes.
    pub tmp_bytes: u64,
    /// Size of the tmpfs holding writes to `/` (overlay upper layer) and `/dev/shm`.
    pub scratch_bytes: u64,
    /// `RLIMIT_NOFILE` (soft and hard) of the agent and everything it starts.
    pub nofile: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            memory_bytes: Some(512 << 20),
            pids_max: Some(512),
            cpu: Some(CpuLimit::default_quota()),
            tmp_bytes: 256 << 20,
            scratch_bytes: 64 << 20,
            nofile: 4096,
        }
    }
}

/// CPU bandwidth limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum CpuLimit {
    /// At most `quota_us` of CPU time per `period_us` (quota/period = CPUs).
    #[serde(rename_all = "camelCase")]
    Quota {
        /// Microseconds of CPU per period.
        quota_us: u64,
        /// Period length in microseconds.
        period_us: u64,
    },
    /// Relative weight against sibling sandboxes (cgroup v1 `cpu.shares` scale: 1024 =
    /// default).
    Shares {
        /// Weight.
        shares: u64,
    },
}

impl CpuLimit {
    /// CFS period of the quotas made here (the kernel's default).
    pub const PERIOD_US: u64 = 100_000;
    /// CPUs a sandbox gets when nothing says otherwise: two, or every CPU of a smaller
    /// host (so no single sandbox can take a larger host whole).
    pub const DEFAULT_CPUS: u64 = 2;

    /// A quota of `millicpus / 1000` CPUs.
    pub fn millicpus(millicpus: u64) -> Self {
        Self::Quota {
            quota_us: (millicpus.saturating_mul(Self::PERIOD_US) / 1000).max(1000),
            period_us: Self::PERIOD_US,
        }
    }

    /// The default: [`Self::DEFAULT_CPUS`], at most as many CPUs as this process may run
    /// on (its affinity mask: a quota of omabox's own cgroup still bounds the sandbox's,
    /// which is nested in it; `available_parallelism` would read three cgroup files and
    /// the mount table to find that quota, on every start).
    pub fn default_quota() -> Self {
        let host = crate::sys::affinity()
            // SAFETY: CPU_COUNT reads a valid cpu_set_t.
            .map(|mask| unsafe { libc::CPU_COUNT(&mask) } as u64)
            .filter(|&n| n > 0)
            .unwrap_or(1);
        Self::millicpus(Self::DEFAULT_CPUS.min(host) * 1000)
    }
}

/// A sandbox's network: the Environment's `networking` config and the omabox gateway.
///
/// The namespace the setup stage builds is the same for every config (loopback only, no
/// route out, `/etc/resolv.conf` naming `127.0.0.1`); what differs is what the host binds
/// inside it afterwards (the backend's `SandboxNetwork`): nothing under `none`, else the DNS
/// stub on `127.0.0.1:53`, one relay listener per port the policy admits, and the
/// gateway's port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Networking {
    /// The Environment's `networking` object (`none` when absent).
    pub config: NetworkingConfig,
    /// Host entries (`HOST[:PORT]`) of the session's MCP servers, opened by
    /// `allow_mcp_servers`.
    #[serde(default)]
    pub mcp_hosts: Vec<String>,
    /// Where the omabox gateway (hosted inference and MCP proxies) listens, as the host
    /// connects to it. The sandbox reaches it at `127.0.0.1` on the same port under every
    /// config but `none`.
    #[serde(default)]
    pub gateway: Option<SocketAddr>,
    /// The host name the sandbox knows the gateway by (the host of its URL, when that is a
    /// name): the DNS stub answers it with `127.0.0.1`, so a URL naming it (TLS included)
    /// works unchanged inside.
    #[serde(default)]
    pub gateway_name: Option<String>,
}

impl Default for Networking {
    fn default() -> Self {
        Self {
            config: NetworkingConfig::None,
            mcp_hosts: Vec::new(),
            gateway: None,
            gateway_name: None,
        }
    }
}

impl Networking {
    /// The name rules this config compiles to.
    pub fn policy(&self) -> Result<NetworkPolicy, PlanError> {
        let mcp: Vec<&str> = self.mcp_hosts.iter().map(String::as_str).collect();
        NetworkPolicy::compile(&self.config, &mcp).map_err(PlanError::Network)
    }

    /// Whether the host binds anything in the sandbox's namespace.
    pub fn reaches_out(&self) -> bool {
        self.config != NetworkingConfig::None
    }

    /// The address the sandbox dials for the gateway (`127.0.0.1:<gateway port>`).
    pub fn gateway_in_sandbox(&self) -> Option<SocketAddr> {
        self.gateway
            .map(|g| SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, g.port())))
    }
}

/// Hardening switches, all on by default. Turning one off is for diagnosis only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hardening {
    /// Install the seccomp deny filter.
    pub seccomp: bool,
    /// Apply Landlock where the kernel has it.
    pub landlock: bool,
    /// Fail the start when Landlock is missing instead of going on without it.
    pub require_landlock: bool,
}

impl Default for Hardening {
    fn default() -> Self {
        Self {
            seccomp: true,
            landlock: true,
            require_landlock: false,
        }
    }
}

/// A plan this build cannot carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// A networking config that does not compile (a bad host entry).
    #[error("networking: {0}")]
    Network(#[from] NetworkingError),
    /// A host path that is relative or holds `..`.
    #[error("{what} path {path:?} must be absolute and free of `..`")]
    HostPath {
        /// Which field.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// A sandbox path that is relative, holds `..`, or is one the sandbox builds itself.
    #[error("bind target {0:?} must be absolute, free of `..`, and not /, /proc, /dev or /tmp")]
    SandboxPath(PathBuf),
    /// Not a valid hostname.
    #[error("hostname {0:?} is not a valid hostname")]
    Hostname(String),
    /// An environment variable name or value that cannot be passed to execve.
    #[error("environment variable {0:?} has an invalid name or value")]
    Env(String),
    /// A limit out of range.
    #[error("invalid limit: {0}")]
    Limit(&'static str),
    /// Both a host workspace and a tmpfs one.
    #[error("a workspace directory and a tmpfs workspace exclude each other")]
    TwoWorkspaces,
}

fn host_path(what: &'static str, p: &Path) -> Result<(), PlanError> {
    if !is_normal_absolute(p) {
        return Err(PlanError::HostPath {
            what,
            path: p.to_path_buf(),
        });
    }
    Ok(())
}

fn sandbox_path(p: &Path) -> Result<(), PlanError> {
    let reserved = ["/", "/proc", "/dev", "/tmp"];
    if !is_normal_absolute(p) || reserved.iter().any(|r| p == Path::new(r)) {
        return Err(PlanError::SandboxPath(p.to_path_buf()));
    }
    Ok(())
}

fn is_normal_absolute(p: &Path) -> bool {
    p.is_absolute()
        && p.components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_plan_of_host_system_dirs_and_tmpfs_holds_no_named_host_dir() {
        let mut plan = SandboxPlan::preinstalled("box");
        plan.workspace_tmpfs = true;
        plan.memory_mount = true;
        assert!(!plan.holds_host_dirs());
        let with = |change: &dyn Fn(&mut SandboxPlan)| {
            let mut p = SandboxPlan::preinstalled("box");
            change(&mut p);
            p.holds_host_dirs()
        };
        assert!(with(&|p| p.workspace = Some("/w".into())));
        assert!(with(&|p| p.outputs = Some("/o".into())));
        assert!(with(&|p| p.binds.push(BindMount {
            source: "/data".into(),
            target: "/data".into(),
            writable: false,
        })));
        assert!(with(&|p| p.rootfs = RootfsSource::Directory {
            path: "/images/root".into()
        }));
        assert!(with(&|p| p.root_layers.push("/layers/env".into())));
        assert!(with(&|p| p.root_upper = Some("/layers/upper".into())));
    }

    #[test]
    fn a_bad_host_entry_is_refused_naming_the_entry() {
        let mut plan = SandboxPlan::preinstalled("box");
        plan.network.config = NetworkingConfig::Limited {
            allowed_hosts: vec!["10.0.0.1".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        };
        let text = plan.validate().unwrap_err().to_string();
        assert!(text.starts_with("networking: "), "{text}");
        assert!(text.contains("10.0.0.1"), "{text}");
    }

    #[test]
    fn the_plan_json_carries_the_environment_networking_object() {
        let mut plan = SandboxPlan::preinstalled("box");
        plan.network.config = NetworkingConfig::Unrestricted;
        plan.network.gateway = Some("10.1.2.3:8787".parse().unwrap());
        let json = serde_json::to_value(&plan).unwrap();
        assert_eq!(json["network"]["config"]["type"], "unrestricted");
        let back: SandboxPlan = serde_json::from_value(json).unwrap();
        assert_eq!(back, plan);
        assert_eq!(
            plan.network.gateway_in_sandbox(),
            Some("127.0.0.1:8787".parse().unwrap())
        );
        // A plan without the field is loopback only.
        let mut json = serde_json::to_value(SandboxPlan::preinstalled("box")).unwrap();
        json.as_object_mut().unwrap().remove("network");
        let back: SandboxPlan = serde_json::from_value(json).unwrap();
        assert!(!back.network.reaches_out());
    }

    #[test]
    fn relative_and_dotdot_paths_are_refused() {
        let mut plan = SandboxPlan::preinstalled("box");
        plan.workspace = Some("/a/../etc".into());
        assert!(matches!(plan.validate(), Err(PlanError::HostPath { .. })));
        let mut plan = SandboxPlan::preinstalled("box");
        plan.binds.push(BindMount {
            source: "/usr".into(),
            target: "/proc".into(),
            writable: false,
        });
        assert!(matches!(plan.validate(), Err(PlanError::SandboxPath(_))));
    }

    #[test]
    fn plan_round_trips_through_json() {
        let mut plan = SandboxPlan::preinstalled("box");
        plan.rootfs = RootfsSource::Directory {
            path: "/images/x".into(),
        };
        plan.limits.cpu = Some(CpuLimit::Quota {
            quota_us: 50_000,
            period_us: 100_000,
        });
        let json = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<SandboxPlan>(&json).unwrap(), plan);
    }
}
