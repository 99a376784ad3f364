//! The gvisor sandboxes of one run: [`crate::wiring::gvisor_config`] (runsc, init, limits,
//! `<data-dir>/gvisor`) with the run's network, checked before the run claims anything.
//! The network is chosen as for docker (`docker_env`'s table: the environment's
//! networking, else `linux_network`, else `limited` with nothing allowed when there is a
//! gateway, else `none`), and served as `omabox_backend_gvisor`'s network module says (the
//! sandbox's own namespace, the host's DNS stub and relay bound in it).
//!
//! In test mode, `linux_test_hosts` names answered before the host's resolver.
//!
//! An image (the `image` setting) is resolved, pulled or unpacked and held exactly as for a
//! linux run (`linux_env::prepare`, before anything is claimed); its unpacked rootfs is every
//! sandbox's root, under a writable overlay in the sandbox's memory (runsc makes the binds'
//! empty mount points in the cache's copy: omabox's own tree). The prepared linux config
//! holds the image for the run's life. A rootfs directory used in place is refused.

use std::sync::Arc;

use anyhow::Context as _;
use omabox_backend_gvisor::{GatewayAccess, GvisorConfig, GvisorNetwork};
use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory, SandboxImage};
use omabox_contract::networking::NetworkingConfig;

use super::RunNotices;

use crate::NodeConfig;
use crate::config::Key;
use crate::environment::{self, EnvironmentConfig};

/// The sandboxes' config of one run; and the URL the harness in the sandbox reaches the
/// gateway at.
pub(super) async fn compose(
    config: &NodeConfig,
    environment: Option<&EnvironmentConfig>,
    gateway: Option<&str>,
) -> anyhow::Result<(GvisorConfig, Option<String>)> {
    let mut gvisor = crate::wiring::gvisor_config(config)?;
    if let Some(hosts) = config.given_nonempty(Key::LinuxTestHosts) {
        if !config.is_test_mode() {
            anyhow::bail!(
                "linux_test_hosts (OMABOX_LINUX_TEST_HOSTS) needs test mode (OMABOX_TEST_MODE=1)"
            );
        }
        gvisor.test_hosts = Some(hosts.to_owned());
    }
    let route = match gateway {
        Some(url) => Some(environment::gateway_route(url).await?),
        None => None,
    };
    let network = super::docker_env::network_of(
        environment,
        config.given(Key::LinuxNetwork),
        route.is_some(),
    )?;
    if network == NetworkingConfig::None {
        // No network: the gateway cannot be reached, so the harness keeps the URL given.
        return Ok((gvisor, None));
    }
    gvisor.network = GvisorNetwork {
        gateway: route.as_ref().map(|r| GatewayAccess {
            upstream: r.gateway.addr,
            name: r.gateway.name.clone(),
        }),
        ..GvisorNetwork::new(network)
    };
    Ok((gvisor, route.map(|r| r.sandbox_url)))
}

/// With an `image` setting: the image prepared as for linux (resolved, pulled, held) and its
/// rootfs set as `gvisor`'s root; the returned config holds the image until it is dropped.
pub(super) async fn with_image(
    config: &NodeConfig,
    factory: &LinuxSandboxFactory,
    notices: &Arc<dyn RunNotices>,
    gvisor: &mut GvisorConfig,
) -> anyhow::Result<LinuxSandboxConfig> {
    let linux = config.linux_config(factory).context("the image setting")?;
    let linux = super::linux_env::prepare(factory, linux, notices).await?;
    gvisor.image_root = match &linux.image {
        SandboxImage::Prepared(image) => Some(image.rootfs_dir.clone()),
        // runsc makes the bind mounts' mount points (`/workspace`, `/.omabox/init`, ...)
        // in the root it is given: in the cache's unpacked copy that is omabox's own
        // tree, in a directory used in place it would be the user's.
        SandboxImage::Directory(dir) => anyhow::bail!(
            "image {}: the gvisor backend takes an image omabox unpacks (a rootfs tarball, \
             an OCI layout or a registry reference), not a directory used in place (runsc \
             would make its mount points in it)",
            dir.display()
        ),
        SandboxImage::Preinstalled => None,
        _ => anyhow::bail!("the image was not prepared for the gvisor backend"),
    };
    Ok(linux)
}
