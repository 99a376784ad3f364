//! What runs a serve sandbox: a linux sandbox (the default) or, with
//! `omabox serve --backend gvisor`, a gvisor one. Both serve the same agent, so E2B's
//! envd, snapshots and file saving go through the [`AgentClient`] alone; this is the rest:
//! ending one, its cgroup (metrics), its environment and its live network.
//!
//! A gvisor sandbox also pauses with its memory (`GvisorSandbox::pause`: its processes go
//! on after the resume, where a linux sandbox keeps only its files).

use crate::NodeConfig;
use anyhow::Context as _;
use omabox_agent::AgentClient;
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
    /// gVisor (runsc): the base template only; a pause keeps processes and memory.
    Gvisor,
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
}

impl Running {
    /// Ends the sandbox and removes what it had on the host; the error's text with its
    /// causes.
    pub(super) async fn terminate(&self) -> Result<(), String> {
        match self {
            Self::Linux(port) => port.terminate().await.map_err(|e| chain(&e)),
            Self::Gvisor(port) => port.sandbox().destroy().await.map_err(|e| chain(&e)),
        }
    }

    /// Whether its init still runs: a linux sandbox's PID 1, a gvisor sandbox's agent
    /// connection (it ends with the container).
    pub(super) fn is_alive(&self, client: &AgentClient) -> bool {
        match self {
            Self::Linux(port) => port.is_alive(),
            Self::Gvisor(_) => client.closed_reason().is_none(),
        }
    }

    /// The sandbox's own cgroup (its processes'; under gvisor, gVisor's kernel's too).
    pub(super) fn cgroup(&self) -> CgroupPaths {
        match self {
            Self::Linux(port) => port.identity().cgroup.clone(),
            Self::Gvisor(port) => gvisor_cgroup(port.sandbox().id()),
        }
    }

    pub(super) async fn set_env_vars(
        &self,
        env_vars: BTreeMap<String, String>,
    ) -> Result<(), String> {
        let set = match self {
            Self::Linux(port) => port.set_env_vars(env_vars).await,
            Self::Gvisor(port) => port.set_env_vars(env_vars).await,
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
        }
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
