//! The linux sandboxes of one run: the backend's typed settings (`NodeConfig::linux_config`,
//! the node's settings) with what the run adds, then prepared — the image resolved, pulled
//! and pinned, the environment layer built — before the run claims anything, so a bad image
//! or a failing build is reported while no fence or lease exists, and an acquire only
//! starts a sandbox.
//!
//! | what the run has                         | setting of `LinuxSandboxConfig`           |
//! |------------------------------------------|-------------------------------------------|
//! | `--environment`'s networking, else the operator's setting, else `limited` | `network` |
//! | an inference gateway (given or served)   | `gateway`                                 |
//! | `packages.apt` / `dockerfile`            | `env_layer` (built here)                  |
//! | `--agent`                                | `readonly_binds` (+ the package), `limits.memory_bytes` 2 GiB unless set |
//! | a memory resource                        | `memory_mount`                            |
//! | an image (`image` setting)               | `image` (resolved, pulled and held here)  |

use super::RunNotices;
use crate::config::Key;
use crate::environment::{self, EnvironmentConfig};
use crate::{DataDir, NodeConfig};
use anyhow::Context as _;
use omabox_acp::agents::AGENT_MOUNT;
use omabox_backend_linux::factory::{
    EnvLayerChoice, EnvLayerSetting, LinuxSandboxConfig, LinuxSandboxFactory,
};
use omabox_contract::networking::NetworkPolicy;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The sandbox memory limit of an `--agent` run unless `linux_memory` says otherwise.
const AGENT_MEMORY: u64 = 2 << 30;

/// Whether the settings name an image (a root filesystem other than the host's).
pub(super) fn has_image(config: &NodeConfig) -> bool {
    config.given(Key::Image).is_some()
}

/// What one run's linux sandboxes are made from.
pub(super) struct RunSandboxes<'a> {
    pub(super) environment: Option<&'a EnvironmentConfig>,
    pub(super) gateway: Option<&'a str>,
    pub(super) agent_dir: Option<&'a Path>,
    pub(super) memory_mount: bool,
}

/// The typed config of one run (module doc), unprepared; and the URL the harness in the
/// sandbox reaches the gateway at.
pub(super) async fn compose(
    config: &NodeConfig,
    data_dir: &DataDir,
    factory: &LinuxSandboxFactory,
    run: RunSandboxes<'_>,
) -> anyhow::Result<(LinuxSandboxConfig, Option<String>)> {
    let mut linux = config.linux_config(factory)?;
    let route = match run.gateway {
        Some(url) => Some(environment::gateway_route(url).await?),
        None => None,
    };
    if let Some(network) =
        environment::linux_network(run.environment, config.given(Key::LinuxNetwork))
    {
        NetworkPolicy::compile(&network, &[]).context("--environment networking")?;
        linux.network = network;
    }
    if let Some(route) = &route {
        linux.gateway = Some(route.gateway.clone());
    }
    // apt packages and a dockerfile become the image's environment layer, built once per
    // image and content; its sandboxes start from it (the installer skips apt).
    let layer = match run.environment {
        Some(environment) => environment.env_layer(data_dir)?,
        None => None,
    };
    if let Some(spec) = layer {
        if !linux.has_image() {
            anyhow::bail!(
                "--environment packages.apt and dockerfile need an image root filesystem (OMABOX_LINUX_IMAGE or SANDBOX_IMAGE): the default root shows the host's /usr read-only"
            );
        }
        let image_cache = match linux.pending_image() {
            Some(pending) => pending.cache_dir.clone(),
            None => image_cache(config)?,
        };
        linux.env_layer = Some(EnvLayerChoice::Pending(EnvLayerSetting {
            spec,
            image_cache,
        }));
    }
    if let Some(dir) = run.agent_dir {
        linux
            .readonly_binds
            .push((dir.to_path_buf(), PathBuf::from(AGENT_MOUNT)));
        // A coding agent (node + its tools) outgrows the 512M default.
        if config.given_nonempty(Key::LinuxMemory).is_none() {
            linux.limits.memory_bytes = Some(AGENT_MEMORY);
        }
    }
    if run.memory_mount {
        linux.memory_mount = true;
    }
    Ok((linux, route.map(|r| r.sandbox_url)))
}

/// The image cache the node's settings name (or its default).
fn image_cache(config: &NodeConfig) -> anyhow::Result<PathBuf> {
    Ok(config.image_cache()?)
}

/// The preparation steps, before anything is claimed: the image resolved (a registry tag
/// to its digest), pulled or unpacked into the cache with progress, pinned and held; then
/// the environment layer built or found.
pub(super) async fn prepare(
    factory: &LinuxSandboxFactory,
    mut linux: LinuxSandboxConfig,
    notices: &Arc<dyn RunNotices>,
) -> anyhow::Result<LinuxSandboxConfig> {
    if linux.pending_image().is_some() {
        let (factory, progress) = (factory.clone(), notices.pull());
        linux = tokio::task::spawn_blocking(move || {
            factory.prepare_image(&mut linux, &*progress)?;
            Ok::<_, anyhow::Error>(linux)
        })
        .await
        .context("the image task failed")??;
    }
    factory.prepare_env_layer(&mut linux).await?;
    Ok(linux)
}
