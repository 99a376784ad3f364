//! Reaping: the containers of hosts that are gone. Every container carries its host's id
//! ([`HOST_LABEL`]); [`reap_dead_hosts`] removes those whose host the caller says is dead.
//! Must never remove a container without omabox's label, nor one of a live host.

use crate::config::{HOST_LABEL, SANDBOX_LABEL};
use crate::engine::Engine;
use crate::error::DockerError;

/// One removed container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reaped {
    /// The engine's container id.
    pub container: String,
    /// Its sandbox id (`omabox.sandbox`).
    pub sandbox: String,
    /// Its dead host's id (`omabox.host`).
    pub host: String,
}

/// Removes every container labelled by a host for which `host_alive` is `false`. Stops at
/// the first engine error (what was removed before stays removed; a rerun goes on).
pub async fn reap_dead_hosts(
    engine: &Engine,
    host_alive: impl Fn(&str) -> bool,
) -> Result<Vec<Reaped>, DockerError> {
    let mut reaped = Vec::new();
    for container in engine.containers_labelled(HOST_LABEL).await? {
        let Some(host) = container.labels.get(HOST_LABEL) else {
            continue;
        };
        if host_alive(host) {
            continue;
        }
        engine.remove_container(&container.id).await?;
        reaped.push(Reaped {
            sandbox: container
                .labels
                .get(SANDBOX_LABEL)
                .cloned()
                .unwrap_or_default(),
            host: host.clone(),
            container: container.id,
        });
    }
    Ok(reaped)
}
