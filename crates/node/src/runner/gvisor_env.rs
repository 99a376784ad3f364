//! The gvisor sandboxes of one run: [`crate::wiring::gvisor_config`] (runsc, init, limits,
//! `<data-dir>/gvisor`) with the run's network, checked before the run claims anything.
//! The network is chosen as for docker (`docker_env`'s table: the environment's
//! networking, else `linux_network`, else `limited` with nothing allowed when there is a
//! gateway, else `none`), and served as `omabox_backend_gvisor`'s network module says (the
//! sandbox's own namespace, the host's DNS stub and relay bound in it).
//!
//! In test mode, `linux_test_hosts` names answered before the host's resolver.

use omabox_backend_gvisor::{GatewayAccess, GvisorConfig, GvisorNetwork};
use omabox_contract::networking::NetworkingConfig;

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
