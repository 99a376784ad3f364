//! `omabox sandbox run --backend gvisor`: the command in a runsc (gVisor) sandbox
//! (omabox-backend-gvisor) whose root is the host's `/usr` read-only with a generated `/etc`.
//! The workspace (`--workspace`, else a temporary directory) is bound at `/workspace`;
//! `--memory` and `--cpus` are the sandbox's limits (its own cgroup, set by runsc; the
//! memory limit counts gVisor's kernel too, and exceeding it ends the whole sandbox). The
//! network is `--network` (with `--allow-host`, `--allow-package-managers`), else the
//! `linux_network` setting, else `none`: under `limited`/`unrestricted` the host serves the
//! sandbox's DNS stub and egress relay in a network namespace of its own (runsc with
//! `--network host` inside it). What the gvisor backend does not serve yet is refused,
//! never silently dropped: `--image` (served by `omabox run --backend gvisor` only) and `--pids` (a pids cgroup would count gVisor's own
//! threads, not the sandbox's processes).
//! Its sandboxes live under `<data-dir>/gvisor` (root only); runsc is `/usr/bin/runsc`
//! (scripts/setup installs Debian's), the init `omabox-gvisor-init` beside `omabox`.

use std::sync::Arc;

use omabox_backend_gvisor::{GvisorConfig, GvisorLimits, GvisorRuntime, GvisorSandboxPort};
use omabox_node::NodeConfig;
use omabox_node::config::Key;
use omabox_node::temp_workspace::Workspace;
use omabox_sandbox::SandboxPort;

use super::{Failure, RunArgs, choose_workspace, parse_millicpus};

/// The sandbox of this command, started, with its workspace.
pub(super) async fn create_gvisor(
    args: &RunArgs,
    config: &NodeConfig,
) -> Result<(Arc<dyn SandboxPort>, Workspace), Failure> {
    let gvisor = gvisor_config(args, config)?;
    let workspace = choose_workspace(args, None, config)?;
    let made = async {
        let runtime = GvisorRuntime::new(gvisor).map_err(describe)?;
        let sandbox = runtime
            .create_in(Some(workspace.workdir()))
            .await
            .map_err(describe)?;
        Ok::<_, String>(GvisorSandboxPort::new(Arc::new(sandbox)))
    };
    match made.await {
        Ok(port) => Ok((Arc::new(port) as Arc<dyn SandboxPort>, workspace)),
        Err(e) => {
            let _ = workspace.finish();
            Err(Failure::omabox(format!(
                "could not create the sandbox: {e}"
            )))
        }
    }
}

/// The backend's config from the flags and settings; a usage error for what it does not
/// serve, an omabox error for what is missing on this machine.
fn gvisor_config(args: &RunArgs, config: &NodeConfig) -> Result<GvisorConfig, Failure> {
    let network = super::docker::docker_network(args, config)?.config;
    if config.given_nonempty(Key::Image).is_some() {
        return Err(Failure::usage(
            "--image: the gvisor backend serves images to `omabox run` only yet (here its \
             root is the host's /usr); drop it or use the linux backend",
        ));
    }
    if args.pids.is_some() {
        return Err(Failure::usage(
            "--pids: the gvisor backend cannot limit the sandbox's processes yet (a pids cgroup \
             would count gVisor's own threads); drop it or use the linux backend",
        ));
    }
    let millicpus = match args.cpus.as_deref() {
        None | Some("unlimited") => None,
        Some(cpus) => {
            Some(parse_millicpus(cpus).map_err(|e| Failure::usage(format!("--cpus {e}")))?)
        }
    };
    let limits = GvisorLimits {
        memory_bytes: args.memory,
        pids: None,
        millicpus,
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::omabox(
            "the gvisor backend needs root here (runsc makes its sandbox's namespaces)",
        ));
    }
    let runsc = omabox_backend_gvisor::locate_runsc().ok_or_else(|| {
        Failure::omabox(
            "runsc (gVisor) is not installed: `apt-get install runsc`, or scripts/setup",
        )
    })?;
    let init = omabox_backend_gvisor::locate_init().map_err(|tried| {
        Failure::omabox(format!(
            "{} is not installed beside omabox (looked at {tried})",
            omabox_backend_gvisor::INIT_BINARY
        ))
    })?;
    let data_dir = config
        .data_dir()
        .map_err(|e| Failure::omabox(format!("{e:#}")))?;
    Ok(GvisorConfig {
        runsc,
        dir: data_dir.root().join("gvisor"),
        init,
        platform: "ptrace".into(),
        limits,
        network: omabox_backend_gvisor::GvisorNetwork::new(network),
        test_hosts: None,
        image_root: None,
    })
}

/// The error and its causes on one line.
fn describe(error: omabox_backend_gvisor::GvisorError) -> String {
    format!("{:#}", anyhow::Error::new(error))
}
