//! What runs a serve sandbox: a linux sandbox (the default) or, with
//! `omabox serve --backend gvisor|docker`, a gvisor one or a container of the Docker
//! Engine at `DOCKER_HOST`. All serve the same agent, so E2B's envd, snapshots and file
//! saving go through the [`AgentClient`] alone; this is the rest: ending one, its cgroup
//! (metrics), its environment and its live network.
//!
//! A gvisor sandbox also pauses with its memory (`GvisorSandbox::pause`: its processes go
//! on after the resume, where a linux sandbox keeps only its files).

use crate::NodeConfig;
use anyhow::Context as _;
use omabox_agent::AgentClient;
use omabox_backend_docker::{DockerConfig, DockerLimits, DockerNetwork, DockerSandboxPort, Engine};
use omabox_backend_gvisor::{GvisorNetwork, GvisorRuntime, GvisorSandboxPort};
use omabox_backend_linux::factory::LinuxSandboxConfig;
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_backend_linux::{CgroupPaths, CpuLimit};
use omabox_contract::networking::NetworkingConfig;
use omabox_proxy::e2b::SandboxServiceError;
use omabox_sandbox::SandboxEnvVarsPort as _;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What runs serve's sandboxes (`omabox serve --backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ServeBackend {
    /// Linux namespaces (the default): templates are images, a pause keeps files only.
    #[default]
    Linux,
    /// gVisor (runsc): the base template or an image; a pause keeps processes and memory.
    Gvisor,
    /// Containers of the Docker Engine at `DOCKER_HOST`: templates are the engine's image
    /// references (`base`: the `image` setting); a pause keeps files only.
    Docker,
}

/// serve's docker sandboxes: the engine, and what every container is made from.
pub(super) struct DockerServing {
    pub(super) engine: Engine,
    pub(super) config: DockerConfig,
    pub(super) shape: Shape,
}

/// serve's gvisor sandboxes: the runtime, and what every one of them is given.
pub(super) struct GvisorServing {
    pub(super) runtime: GvisorRuntime,
    pub(super) shape: Shape,
}

/// What a started sandbox shows of its resources.
#[derive(Debug, Clone, Copy)]
pub(super) struct Shape {
    pub(super) cpu_count: u32,
    pub(super) memory_mb: u64,
    /// Whether it reaches the internet unrestricted.
    pub(super) internet: bool,
}

/// One running sandbox of either backend (one per entry, never moved in a hot loop: the
/// size difference does not matter).
#[allow(clippy::large_enum_variant)]
pub(super) enum Running {
    Linux(LinuxSandboxPort),
    Gvisor(GvisorSandboxPort),
    /// The container and its cgroup, found once at the start.
    Docker(DockerSandboxPort, CgroupPaths),
}

impl Running {
    /// Ends the sandbox and removes what it had on the host; the error's text with its
    /// causes.
    pub(super) async fn terminate(&self) -> Result<(), String> {
        match self {
            Self::Linux(port) => port.terminate().await.map_err(|e| chain(&e)),
            Self::Gvisor(port) => port.sandbox().destroy().await.map_err(|e| chain(&e)),
            Self::Docker(port, _) => port.terminate().await.map_err(|e| chain(&e)),
        }
    }

    /// Whether its init still runs: a linux sandbox's PID 1, a gvisor sandbox's agent
    /// connection (it ends with the container).
    pub(super) fn is_alive(&self, client: &AgentClient) -> bool {
        match self {
            Self::Linux(port) => port.is_alive(),
            Self::Gvisor(_) => client.closed_reason().is_none(),
            Self::Docker(port, _) => port.is_alive(),
        }
    }

    /// The sandbox's own cgroup (its processes'; under gvisor, gVisor's kernel's too).
    pub(super) fn cgroup(&self) -> CgroupPaths {
        match self {
            Self::Linux(port) => port.identity().cgroup.clone(),
            Self::Gvisor(port) => gvisor_cgroup(port.sandbox().id()),
            Self::Docker(_, cgroup) => cgroup.clone(),
        }
    }

    pub(super) async fn set_env_vars(
        &self,
        env_vars: BTreeMap<String, String>,
    ) -> Result<(), String> {
        let set = match self {
            Self::Linux(port) => port.set_env_vars(env_vars).await,
            Self::Gvisor(port) => port.set_env_vars(env_vars).await,
            Self::Docker(port, _) => port.set_env_vars(env_vars).await,
        };
        set.map_err(|e| e.to_string())
    }

    /// Makes `config` the sandbox's live network policy (the gateway stays as started).
    pub(super) fn set_network(
        &self,
        config: &NetworkingConfig,
        gateway: Option<&omabox_backend_linux::factory::GatewaySetting>,
    ) -> Result<(), SandboxServiceError> {
        match self {
            Self::Linux(port) => {
                let networking = omabox_backend_linux::Networking {
                    config: config.clone(),
                    mcp_hosts: Vec::new(),
                    gateway: gateway.map(|g| g.addr),
                    gateway_name: gateway.and_then(|g| g.name.clone()),
                };
                port.set_networking(&networking)
                    .map_err(|error| match error {
                        omabox_backend_linux::port::LinuxPortError::Network(
                            omabox_backend_linux::NetworkError::NotStarted,
                        ) => no_network(),
                        omabox_backend_linux::port::LinuxPortError::Network(
                            omabox_backend_linux::NetworkError::Policy(bad),
                        ) => SandboxServiceError::BadRequest(format!("networking: {bad}")),
                        other => SandboxServiceError::Internal(format!(
                            "cannot change the sandbox's network: {}",
                            chain(&other)
                        )),
                    })
            }
            Self::Gvisor(port) => port
                .set_networking(&GvisorNetwork::new(config.clone()))
                .map_err(|error| match error {
                    omabox_backend_gvisor::GvisorError::NoNetwork => no_network(),
                    omabox_backend_gvisor::GvisorError::Networking(bad) => {
                        SandboxServiceError::BadRequest(format!("networking: {bad}"))
                    }
                    other => SandboxServiceError::Internal(format!(
                        "cannot change the sandbox's network: {}",
                        chain(&other)
                    )),
                }),
            Self::Docker(port, _) => port
                .set_networking(&DockerNetwork::new(config.clone()))
                .map_err(|error| match error {
                    omabox_backend_docker::DockerError::NoNetwork => no_network(),
                    omabox_backend_docker::DockerError::Networking(bad) => {
                        SandboxServiceError::BadRequest(format!("networking: {bad}"))
                    }
                    other => SandboxServiceError::Internal(format!(
                        "cannot change the sandbox's network: {}",
                        omabox_backend_docker::describe(&other)
                    )),
                }),
        }
    }
}

/// The cgroup directories of the process `pid` (a container's first process), from its
/// `/proc/<pid>/cgroup`: one per cgroup v1 controller hierarchy mounted under
/// `/sys/fs/cgroup`, else its v2 directory. Whatever the engine's cgroup driver named
/// them.
pub(super) fn cgroup_of_pid(pid: u32) -> CgroupPaths {
    let root = Path::new("/sys/fs/cgroup");
    let listed = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mut v1 = Vec::new();
    let mut v2 = None;
    for line in listed.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            v2 = Some(root.join(path));
        } else if !controllers.starts_with("name=") {
            let dir = root.join(controllers).join(path);
            if dir.is_dir() {
                v1.push(dir);
            }
        }
    }
    match (v1.is_empty(), v2) {
        (true, Some(dir)) => CgroupPaths {
            dirs: vec![dir],
            unified: true,
        },
        _ => CgroupPaths {
            dirs: v1,
            unified: false,
        },
    }
}

fn no_network() -> SandboxServiceError {
    SandboxServiceError::BadRequest(
        "the sandbox has no network to change (this server's OMABOX_LINUX_NETWORK is none)".into(),
    )
}

/// The cgroup directories runsc made for gvisor sandbox `id` (`/omabox-gvisor/<id>` under
/// each cgroup v1 controller, or the one v2 directory).
fn gvisor_cgroup(id: &str) -> CgroupPaths {
    let parent = omabox_backend_gvisor::CGROUP_PARENT.trim_start_matches('/');
    let root = Path::new("/sys/fs/cgroup");
    let v1: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|controller| controller.path().join(parent).join(id))
        .filter(|dir| dir.is_dir())
        .collect();
    if v1.is_empty() {
        CgroupPaths {
            dirs: vec![root.join(parent).join(id)],
            unified: true,
        }
    } else {
        CgroupPaths {
            dirs: v1,
            unified: false,
        }
    }
}

/// An error and its causes, one line.
pub(super) fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The gvisor runtime of serve's sandboxes (`wiring::gvisor_config`: runsc, the init,
/// `<data-dir>/gvisor`, the memory and CPU settings) with the node's network and gateway.
pub(super) fn gvisor_serving(
    config: &NodeConfig,
    linux: &LinuxSandboxConfig,
) -> anyhow::Result<GvisorServing> {
    let mut gvisor = crate::wiring::gvisor_config(config)?;
    gvisor.network = omabox_backend_gvisor::GvisorNetwork {
        gateway: linux
            .gateway
            .as_ref()
            .map(|g| omabox_backend_gvisor::GatewayAccess {
                upstream: g.addr,
                name: g.name.clone(),
            }),
        ..omabox_backend_gvisor::GvisorNetwork::new(linux.network.clone())
    };
    let limits = gvisor.limits;
    let shape = Shape {
        cpu_count: limits.millicpus.map_or_else(
            || cpu_count(None),
            |milli| {
                u32::try_from(milli.div_ceil(1000))
                    .unwrap_or(u32::MAX)
                    .max(1)
            },
        ),
        memory_mb: limits.memory_bytes.map_or(0, |bytes| bytes >> 20),
        internet: linux.network == NetworkingConfig::Unrestricted,
    };
    let runtime = GvisorRuntime::new(gvisor).context("the gvisor backend")?;
    Ok(GvisorServing { runtime, shape })
}

/// The engine at `DOCKER_HOST` and the containers of serve's sandboxes: the `image` setting
/// as the `base` template (`wiring::docker_config`), E2B's user, no host workspace (the
/// container's own `/workspace`), the node's network and gateway, and its memory, CPU and
/// pids settings as the container's limits.
pub(super) async fn docker_serving(
    config: &NodeConfig,
    linux: &LinuxSandboxConfig,
) -> anyhow::Result<DockerServing> {
    let mut docker = crate::wiring::docker_config(config)?;
    docker.user_home = true;
    docker.network = DockerNetwork {
        gateway: linux
            .gateway
            .as_ref()
            .map(|g| omabox_backend_docker::GatewayAccess {
                upstream: g.addr,
                name: g.name.clone(),
            }),
        ..DockerNetwork::new(linux.network.clone())
    };
    let defaults = DockerLimits::default();
    let limits = &linux.limits;
    docker.limits = DockerLimits {
        memory_bytes: limits.memory_bytes.unwrap_or(defaults.memory_bytes),
        nano_cpus: match &limits.cpu {
            Some(CpuLimit::Quota {
                quota_us,
                period_us,
            }) if *period_us > 0 => quota_us.saturating_mul(1_000_000_000) / period_us,
            // Docker's 0: no CPU limit.
            _ => 0,
        },
        pids: limits.pids_max.map_or(defaults.pids, |pids| {
            u32::try_from(pids).unwrap_or(u32::MAX)
        }),
    };
    let engine = Engine::from_env()
        .await
        .map_err(|e| anyhow::anyhow!(omabox_backend_docker::describe(&e)))
        .context("the docker backend")?;
    let shape = Shape {
        cpu_count: cpu_count(limits.cpu.as_ref()),
        memory_mb: docker.limits.memory_bytes >> 20,
        internet: linux.network == NetworkingConfig::Unrestricted,
    };
    Ok(DockerServing {
        engine,
        config: docker,
        shape,
    })
}

/// CPUs of a limit (at least 1; the machine's without a quota).
pub(super) fn cpu_count(limit: Option<&CpuLimit>) -> u32 {
    let machine = || {
        std::thread::available_parallelism()
            .map(|n| u32::try_from(n.get()).unwrap_or(u32::MAX))
            .unwrap_or(1)
    };
    match limit {
        Some(CpuLimit::Quota {
            quota_us,
            period_us,
        }) if *period_us > 0 => u32::try_from(quota_us.div_ceil(*period_us))
            .unwrap_or(u32::MAX)
            .max(1),
        _ => machine(),
    }
}
