//! `omabox sandbox run --backend linux`: the sandbox's typed config, read from the node's
//! settings (no env map) with its image prepared here, and the sandbox made from it on the
//! async path (a network needs the factory's port; the one-shot path is `one_shot.rs`).

use std::sync::Arc;

use omabox_backend_linux::factory::{LinuxSandboxConfig, LinuxSandboxFactory, SandboxImage};
use omabox_contract::PortError;
use omabox_node::NodeConfig;
use omabox_node::temp_workspace::Workspace;
use omabox_node::wiring::Backend;
use omabox_sandbox::SandboxPort;

use super::{
    Failure, RunArgs, choose_workspace, context, create_failure, linux_failure, networking,
};

/// The one-shot path's typed config (no env map): the node's settings (the flags are
/// settings there, `SandboxArgs::flags`), the workspace this command chose, and the image
/// prepared here — a registry tag resolved and pulled with progress on stderr, a tarball
/// unpacked — and held from removal while the config lives.
pub(super) fn prepare_linux(
    args: &RunArgs,
    config: &NodeConfig,
) -> Result<(LinuxSandboxConfig, Workspace), Failure> {
    networking(args)?;
    let factory = LinuxSandboxFactory::new();
    let mut linux = config
        .linux_config(&factory)
        .map_err(|e| linux_failure(&e))?;
    if let SandboxImage::Pending(pending) = &mut linux.image
        && let Some(pull) = &mut pending.registry
    {
        let data_dir = config
            .data_dir()
            .map_err(|e| Failure::omabox(e.to_string()))?;
        pull.given = omabox_node::registry_credentials::from_vault_blocking(&data_dir, &|line| {
            errln!("{line}")
        })
        .map_err(|e| Failure::omabox(format!("registry credentials: {e}")))?;
    }
    let progress = crate::commands::image::StderrProgress::new();
    let prepared = factory.prepare_image(&mut linux, &progress);
    progress.clear();
    prepared.map_err(|e| linux_failure(&e))?;
    let workspace = choose_workspace(args, Some(Backend::Linux), config)?;
    linux.workspace_tmpfs = matches!(workspace, Workspace::InSandbox);
    Ok((linux, workspace))
}

/// A linux sandbox (with a network: the one-shot path has none) from its prepared config.
pub(super) async fn create_linux(
    linux: LinuxSandboxConfig,
    workspace: Workspace,
) -> Result<(Arc<dyn SandboxPort>, Workspace), Failure> {
    let ctx = context(&workspace);
    let factory = LinuxSandboxFactory::new();
    let made = match factory.check_host_config(&ctx, &linux) {
        Ok(()) => factory
            .create_port_with_config(&ctx, &linux)
            .await
            .map_err(|e| create_failure(&PortError::from(e), true)),
        Err(e) => Err(linux_failure(&e)),
    };
    // Started (its roots recorded) or failed: the image may be removed from here on.
    drop(linux);
    match made {
        Ok(port) => Ok((Arc::new(port) as Arc<dyn SandboxPort>, workspace)),
        Err(f) => {
            let _ = workspace.finish();
            Err(f)
        }
    }
}
