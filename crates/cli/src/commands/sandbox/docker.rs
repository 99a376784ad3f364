//! `omabox sandbox run --backend docker`: the command in a container of the Docker Engine
//! at `DOCKER_HOST` (omabox-backend-docker), from `--image` (the `image` setting): a
//! registry reference the engine pulls, or an image the engine has. The workspace
//! (`--workspace`, else a temporary directory) is bound at `/workspace`; `--memory`,
//! `--pids` and `--cpus` are the container's limits; the network is `none` (the only one
//! the docker backend serves yet, so any other is refused, never silently dropped).

use std::sync::Arc;

use omabox_backend_docker::{DockerConfig, DockerLimits, DockerSandboxPort, Engine};
use omabox_node::NodeConfig;
use omabox_node::config::Key;
use omabox_node::temp_workspace::Workspace;
use omabox_sandbox::SandboxPort;

use super::{Failure, RunArgs, choose_workspace, networking, parse_millicpus, reaches_out};

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
            Err(Failure::omabox(format!(
                "could not create the sandbox: {}",
                omabox_backend_docker::describe(&e)
            )))
        }
    }
}

/// The container's config from the flags and settings; a usage error for what the docker
/// backend does not serve.
fn docker_config(args: &RunArgs, config: &NodeConfig) -> Result<DockerConfig, Failure> {
    networking(args)?;
    if reaches_out(args, config) {
        return Err(Failure::usage(
            "the docker backend serves network none only (yet): drop --network, --allow-host and \
             --allow-package-managers, or use the linux backend",
        ));
    }
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
        ..DockerConfig::new(image, omabox_backend_docker::host::current())
    })
}
