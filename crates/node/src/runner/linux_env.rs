//! What one run adds to the linux factory's env map (`NodeConfig::factory_env`, the node's
//! settings): the sandbox's networking and the gateway's route, the environment layer, the
//! agent's package mount and memory, the memory-store mount; and the registry image pulled
//! into the cache first, with progress, so a long download is not a silent acquire.
//!
//! | what the run has                         | factory key                               |
//! |------------------------------------------|-------------------------------------------|
//! | `--environment`'s networking, else the operator's setting, else `limited` | `OMABOX_LINUX_NETWORK` |
//! | an inference gateway (given or served)   | `OMABOX_LINUX_GATEWAY`                    |
//! | `packages.apt` / `dockerfile`            | `OMABOX_LINUX_ENV_LAYER`                  |
//! | `--agent`                                | `OMABOX_LINUX_READONLY_BINDS` (+ the package), `OMABOX_LINUX_MEMORY` `2G` unless set |
//! | a memory resource                        | `OMABOX_LINUX_MEMORY_MOUNT=1`             |

use super::RunNotices;
use crate::environment::{self, EnvironmentConfig};
use crate::{DataDir, NodeConfig};
use anyhow::Context as _;
use omabox_acp::agents::AGENT_MOUNT;
use omabox_backend_linux::factory::{
    ENV_LAYER_ENV, IMAGE_ENV, MEMORY_ENV, NETWORK_ENV, READONLY_BINDS_ENV, SANDBOX_IMAGE_ENV,
};
use omabox_backend_linux::image::{ImageCache, ImageSource};
use omabox_sandbox::SandboxFactoryEnv;
use std::path::Path;
use std::sync::Arc;

/// The sandbox memory limit of an `--agent` run unless `OMABOX_LINUX_MEMORY` says otherwise.
const AGENT_MEMORY: &str = "2G";

/// Whether `env` names an image (a root filesystem other than the host's).
pub(super) fn has_image(env: &SandboxFactoryEnv) -> bool {
    env.get(IMAGE_ENV).is_some() || env.get(SANDBOX_IMAGE_ENV).is_some()
}

/// The linux keys of one run (module doc) over `env`; returns the map and the URL the
/// harness in the sandbox reaches the gateway at.
pub(super) async fn compose(
    config: &NodeConfig,
    data_dir: &DataDir,
    mut env: SandboxFactoryEnv,
    environment: Option<&EnvironmentConfig>,
    gateway: Option<&str>,
    agent_dir: Option<&Path>,
    notices: &Arc<dyn RunNotices>,
) -> anyhow::Result<(SandboxFactoryEnv, Option<String>)> {
    let route = match gateway {
        Some(url) => Some(environment::gateway_route(url).await?),
        None => None,
    };
    let keys = environment::linux_factory_keys(environment, env.get(NETWORK_ENV), route.as_ref())?;
    for (key, value) in keys {
        env = env.with_var(key, value);
    }
    // A registry image not cached yet is pulled here, with progress; the factory then
    // resolves the tag again at acquire (one manifest request).
    prefetch_registry_image(config, &env, data_dir, notices).await?;
    // apt packages and a dockerfile become the image's environment layer, built once per
    // image and content; its sandboxes start from it (the installer skips apt).
    let layer = match environment {
        Some(environment) => environment.env_layer(data_dir)?,
        None => None,
    };
    if let Some(layer) = layer {
        if !has_image(&env) {
            anyhow::bail!(
                "--environment packages.apt and dockerfile need an image root filesystem (OMABOX_LINUX_IMAGE or SANDBOX_IMAGE): the default root shows the host's /usr read-only"
            );
        }
        env = env.with_var(ENV_LAYER_ENV, layer);
    }
    if let Some(dir) = agent_dir {
        let bind = format!("{}:{AGENT_MOUNT}", dir.display());
        let binds = match env.get(READONLY_BINDS_ENV) {
            Some(existing) if !existing.trim().is_empty() => format!("{existing},{bind}"),
            _ => bind,
        };
        env = env.with_var(READONLY_BINDS_ENV, binds);
        // A coding agent (node + its tools) outgrows the 512M default.
        if env.get(MEMORY_ENV).is_none_or(|m| m.trim().is_empty()) {
            env = env.with_var(MEMORY_ENV, AGENT_MEMORY);
        }
    }
    let sandbox_url = route.map(|r| r.sandbox_url);
    Ok((env, sandbox_url))
}

/// Pulls the run's registry image (`OMABOX_LINUX_IMAGE`, else `SANDBOX_IMAGE`) into the image
/// cache with progress. Local images and bad references are the factory's to judge.
async fn prefetch_registry_image(
    config: &NodeConfig,
    env: &SandboxFactoryEnv,
    data_dir: &DataDir,
    notices: &Arc<dyn RunNotices>,
) -> anyhow::Result<()> {
    let nonempty = |key| env.get(key).filter(|v| !v.trim().is_empty());
    let Some(value) = nonempty(IMAGE_ENV).or_else(|| nonempty(SANDBOX_IMAGE_ENV)) else {
        return Ok(());
    };
    let Ok(ImageSource::Registry(reference)) = ImageSource::parse(value) else {
        return Ok(());
    };
    let cache = ImageCache::new(config.image_cache()?).with_limits(
        omabox_backend_linux::image::UnpackLimits::from_env(|k| env.get(k).map(str::to_owned))?,
    );
    let (registry_env, data_dir, warn_to) = (env.clone(), data_dir.clone(), Arc::clone(notices));
    let registry = tokio::task::spawn_blocking(move || {
        crate::images::registry_config(&registry_env, Some(&data_dir), &|line| warn_to.line(line))
    })
    .await??;
    let value = value.to_owned();
    let progress = notices.pull();
    tokio::task::spawn_blocking(move || {
        cache
            .resolve_registry(&reference, &registry, &*progress)
            .with_context(|| format!("cannot use image {value:?}"))
    })
    .await??;
    Ok(())
}
