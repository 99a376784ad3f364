//! `omabox sandbox run --backend docker`: the command in a container of the Docker Engine
//! at `DOCKER_HOST` (omabox-backend-docker), from `--image` (the `image` setting): a
//! registry reference the engine pulls, or an image the engine has. The workspace
//! (`--workspace`, else a temporary directory) is bound at `/workspace`; `--memory`,
//! `--pids` and `--cpus` are the container's limits; the network is `--network` (with
//! `--allow-host`, `--allow-package-managers`), else the `linux_network` setting, else
//! `none`: under `limited`/`unrestricted` the host serves the container's DNS stub and
//! egress relay in its namespace (a local engine only; a remote one refuses it).

use std::sync::Arc;

use omabox_backend_docker::{
    DockerConfig, DockerError, DockerLimits, DockerNetwork, DockerSandboxPort, Engine,
};
use omabox_contract::networking::NetworkingConfig;
use omabox_node::NodeConfig;
use omabox_node::config::Key;
use omabox_node::temp_workspace::Workspace;
use omabox_sandbox::SandboxPort;

use super::{Failure, RunArgs, choose_workspace, networking, parse_millicpus};

/// The container of this command, started, with its workspace.
pub(super) async fn create_docker(
    args: &RunArgs,
    config: &NodeConfig,
) -> Result<(Arc<dyn SandboxPort>, Workspace), Failure> {
    let docker = docker_config(args, config)?;
    let workspace = choose_workspace(args, None, config)?;
    let docker = DockerConfig {
        workspace: Some(workspace.workdir()),
        ..docker
    };
    let engine = match Engine::from_env().await {
        Ok(engine) => engine,
        Err(e) => {
            let _ = workspace.finish();
            return Err(Failure::omabox(omabox_backend_docker::describe(&e)));
        }
    };
    let id = format!(
        "run-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    match DockerSandboxPort::start(&engine, &docker, &id).await {
        Ok(port) => Ok((Arc::new(port) as Arc<dyn SandboxPort>, workspace)),
        Err(e) => {
            let _ = workspace.finish();
            let said = omabox_backend_docker::describe(&e);
            Err(match e {
                DockerError::RemoteNetwork { .. } | DockerError::Networking(_) => {
                    Failure::usage(said)
                }
                _ => Failure::omabox(format!("could not create the sandbox: {said}")),
            })
        }
    }
}

/// The container's config from the flags and settings; a usage error for what the docker
/// backend does not serve.
fn docker_config(args: &RunArgs, config: &NodeConfig) -> Result<DockerConfig, Failure> {
    let network = docker_network(args, config)?;
    let Some(image) = config.given_nonempty(Key::Image) else {
        return Err(Failure::usage(
            "the docker backend needs an image: --image REF (a registry reference, or an image \
             the engine has)",
        ));
    };
    if std::path::Path::new(image).is_absolute() {
        return Err(Failure::usage(format!(
            "--image {image}: the docker backend takes an engine's image reference, not a path"
        )));
    }
    let mut limits = DockerLimits::default();
    if let Some(memory) = args.memory {
        limits.memory_bytes = memory;
    }
    if let Some(pids) = args.pids {
        limits.pids = u32::try_from(pids).unwrap_or(u32::MAX);
    }
    match args.cpus.as_deref() {
        // Docker's 0: no CPU limit.
        Some("unlimited") => limits.nano_cpus = 0,
        Some(cpus) => {
            let milli = parse_millicpus(cpus).map_err(|e| Failure::usage(format!("--cpus {e}")))?;
            limits.nano_cpus = milli.saturating_mul(1_000_000);
        }
        None => {}
    }
    Ok(DockerConfig {
        limits,
        network,
        ..DockerConfig::new(image, omabox_backend_docker::host::current())
    })
}

/// The network flags, else the `linux_network` setting, else `none` (the gvisor backend's
/// too).
pub(super) fn docker_network(
    args: &RunArgs,
    config: &NodeConfig,
) -> Result<DockerNetwork, Failure> {
    let network = match networking(args)? {
        Some(json) => serde_json::from_str::<NetworkingConfig>(&json)
            .map_err(|e| Failure::omabox(format!("decoding the network flags: {e}")))?,
        None => match config.given_nonempty(Key::LinuxNetwork) {
            Some(text) => omabox_backend_linux::factory::parse_networking(text)
                .map_err(|e| Failure::usage(format!("linux_network: {e}")))?,
            None => NetworkingConfig::None,
        },
    };
    Ok(DockerNetwork::new(network))
}
