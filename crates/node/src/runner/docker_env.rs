//! The docker containers of one run: [`crate::wiring::docker_config`] (image, agent, this
//! host) with the run's network, checked before the run claims anything.
//!
//! | what the run has | the container's network |
//! |---|---|
//! | `--environment`'s networking | that config |
//! | else the operator's `linux_network` (`OMABOX_LINUX_NETWORK`) | that config |
//! | else an inference gateway (given or served) | `limited` with nothing allowed: the gateway only |
//! | else | `none` (loopback only) |
//!
//! In test mode, `linux_test_hosts` names answered before the host's resolver.
//!
//! A gateway is reached at `127.0.0.1:<its port>` (and by its URL's host name) under every
//! config but `none`; the harness is given the URL it reaches it at. Every config but
//! `none` needs a local engine (`omabox-backend-docker`'s `network` module).

use anyhow::Context as _;
use omabox_backend_docker::{DockerConfig, DockerNetwork, GatewayAccess};
use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};

use crate::NodeConfig;
use crate::config::Key;
use crate::environment::{self, EnvironmentConfig};

/// The container config of one run; and the URL the harness in the container reaches the
/// gateway at.
pub(super) async fn compose(
    config: &NodeConfig,
    environment: Option<&EnvironmentConfig>,
    gateway: Option<&str>,
) -> anyhow::Result<(DockerConfig, Option<String>)> {
    let mut docker = crate::wiring::docker_config(config)?;
    if let Some(hosts) = config.given_nonempty(Key::LinuxTestHosts) {
        if !config.is_test_mode() {
            anyhow::bail!(
                "linux_test_hosts (OMABOX_LINUX_TEST_HOSTS) needs test mode (OMABOX_TEST_MODE=1)"
            );
        }
        docker.test_hosts = Some(hosts.to_owned());
    }
    let route = match gateway {
        Some(url) => Some(environment::gateway_route(url).await?),
        None => None,
    };
    let network = network_of(
        environment,
        config.given(Key::LinuxNetwork),
        route.is_some(),
    )?;
    if network != NetworkingConfig::None {
        docker.network = DockerNetwork {
            gateway: route.as_ref().map(|r| GatewayAccess {
                upstream: r.gateway.addr,
                name: r.gateway.name.clone(),
            }),
            ..DockerNetwork::new(network)
        };
        Ok((docker, route.map(|r| r.sandbox_url)))
    } else {
        // No network: the gateway cannot be reached, so the harness keeps the URL given.
        Ok((docker, None))
    }
}

/// The networking of a docker run (module doc); a gvisor run's too (`gvisor_env`).
pub(super) fn network_of(
    environment: Option<&EnvironmentConfig>,
    operator: Option<&str>,
    has_gateway: bool,
) -> anyhow::Result<NetworkingConfig> {
    let network = match (environment.and_then(|e| e.networking.as_ref()), operator) {
        (Some(config), _) => config.clone(),
        (None, Some(text)) => omabox_backend_linux::factory::parse_networking(text)
            .map_err(|e| anyhow::anyhow!("linux_network (OMABOX_LINUX_NETWORK): {e}"))?,
        (None, None) if has_gateway => NetworkingConfig::Limited {
            allowed_hosts: Vec::new(),
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        (None, None) => NetworkingConfig::None,
    };
    NetworkPolicy::compile(&network, &[]).context("--environment networking")?;
    Ok(network)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn environment(networking: NetworkingConfig) -> EnvironmentConfig {
        EnvironmentConfig {
            networking: Some(networking),
            ..EnvironmentConfig::default()
        }
    }

    #[test]
    fn the_environment_then_the_operator_then_the_gateway_decide_the_network() {
        let env = environment(NetworkingConfig::Unrestricted);
        assert_eq!(
            network_of(Some(&env), Some("none"), false).unwrap(),
            NetworkingConfig::Unrestricted
        );
        assert_eq!(
            network_of(None, Some("unrestricted"), false).unwrap(),
            NetworkingConfig::Unrestricted
        );
        assert!(matches!(
            network_of(None, None, true).unwrap(),
            NetworkingConfig::Limited { allowed_hosts, .. } if allowed_hosts.is_empty()
        ));
        assert_eq!(
            network_of(None, None, false).unwrap(),
            NetworkingConfig::None
        );
        assert!(network_of(None, Some("sideways"), false).is_err());
        let bad = environment(NetworkingConfig::Limited {
            allowed_hosts: vec!["bad host".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        });
        assert!(network_of(Some(&bad), None, false).is_err());
    }
}
