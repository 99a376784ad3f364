//! The node's image cache and registry access: one cache (the `image_cache` setting, else
//! the default, `DataDir`'s module), unpacking within the `image_max_*` settings, and
//! registry settings with the vault's credentials first (`registry/<host>`), then docker's
//! `config.json`. `omabox image`, `omabox sandbox run` and the runner use these; drawing a
//! pull's progress is the caller's (`PullProgress`).
//!
//! What this must never do: put a credential into an error or a line it hands out.

use crate::{DataDir, NodeConfig};
use anyhow::Context as _;
use omabox_backend_linux::image::{ImageCache, RegistryConfig, UnpackLimits, UserList};
use omabox_backend_linux::image_use::{RootInUse, roots_in_use as roots_in_use_in};
use std::sync::Arc;

/// The image cache this node uses: the `image_cache` setting (`OMABOX_LINUX_IMAGE_CACHE`),
/// else the default; unpacking within `image_max_bytes` and `image_max_entries`.
pub fn cache(config: &NodeConfig) -> anyhow::Result<ImageCache> {
    let limits = UnpackLimits::from_env(|key| config.factory_value(key).map(str::to_owned))?;
    Ok(ImageCache::new(config.image_cache()?).with_limits(limits))
}

/// Registry settings from the node's (insecure registries, allowed hosts, timeouts, docker's
/// configuration), with the credentials of the vault in `data_dir` first; `warn` gets a
/// line per vault secret that is not `user:password`. Blocking.
pub fn registry_config(
    settings: &NodeConfig,
    data_dir: Option<&DataDir>,
    warn: &(dyn Fn(&str) + Sync),
) -> anyhow::Result<RegistryConfig> {
    let config = RegistryConfig::from_env(|key| settings.factory_value(key).map(str::to_owned))?;
    Ok(match data_dir {
        Some(dir) => config.with_credentials(Arc::new(
            crate::registry_credentials::from_vault_blocking(dir, warn)?,
        )),
        None => config,
    })
}

/// The image roots and layers the sandboxes of the linux runtime dir (`config`'s) read.
pub fn roots_in_use(config: &NodeConfig) -> anyhow::Result<Vec<RootInUse>> {
    let config = crate::leftovers::linux_runtime_config(config).map_err(anyhow::Error::msg)?;
    roots_in_use_in(&config).with_context(|| {
        format!(
            "cannot tell which images the sandboxes in {} use",
            config.runtime_dir.display()
        )
    })
}

/// The cache's user source: (sandbox, root) of every sandbox of the linux runtime dir,
/// read when asked.
pub fn users_now(config: &NodeConfig) -> UserList {
    roots_in_use(config)
        .map(|roots| roots.into_iter().map(|r| (r.sandbox, r.path)).collect())
        .map_err(|e| format!("{e:#}"))
}
