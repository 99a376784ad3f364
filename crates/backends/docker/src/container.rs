//! One container's description and start: [`container_body`] (everything the engine is
//! told, so a test can read what a container gets), the agent archive, and [`start`]:
//! create → copy the agent in → attach → start → handshake, the container removed again
//! when any step fails. Must never add a privilege, a capability beyond [`CAPABILITIES`]
//! or a host path beyond the bindings.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, Mount, MountType};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, UploadToContainerOptions,
};
use bytes::Bytes;
use futures::StreamExt as _;
use omabox_agent::client::AgentClient;

use crate::config::{AGENT_PATH, DockerConfig, HOST_LABEL, SANDBOX_LABEL};
use crate::engine::Engine;
use crate::error::DockerError;

/// The capabilities a container keeps (every other one is dropped): what the agent's
/// file operations (`CHOWN`, `DAC_OVERRIDE`, `FOWNER`, `FSETID`), process signals (`KILL`)
/// and `spawn` as an account of the image (`SETGID`, `SETUID`) need. Not kept from
/// docker's default set: `MKNOD`, `NET_RAW`, `NET_BIND_SERVICE`, `SETFCAP`, `SETPCAP`,
/// `SYS_CHROOT`, `AUDIT_WRITE`.
pub const CAPABILITIES: [&str; 7] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
];

/// Where the workspace is in a container.
pub const WORKSPACE: &str = "/workspace";

/// Where the Session outputs are in a container.
pub const OUTPUTS: &str = "/mnt/session/outputs";

/// How much of the container's stderr is kept for an error.
const STDERR_KEPT: usize = 4096;

/// What the engine is told to create for sandbox `id`.
pub fn container_body(config: &DockerConfig, id: &str) -> ContainerCreateBody {
    let mut mounts = Vec::new();
    let mut bind = |source: &std::path::Path, target: &str| {
        mounts.push(Mount {
            target: Some(target.to_owned()),
            source: Some(source.display().to_string()),
            typ: Some(MountType::BIND),
            read_only: Some(false),
            ..Default::default()
        });
    };
    if let Some(workspace) = &config.workspace {
        bind(workspace, WORKSPACE);
    }
    if let Some(outputs) = &config.outputs {
        bind(outputs, OUTPUTS);
    }
    // Docker lets a container's uid 0 bind any port (the sysctl is 0 in its namespace);
    // 1024 is the kernel's default, so without NET_BIND_SERVICE the container cannot take
    // the ports the host binds there for its network (53, 80, 443, the catch-all's).
    let sysctls = HashMap::from([(
        "net.ipv4.ip_unprivileged_port_start".to_owned(),
        "1024".to_owned(),
    )]);
    // Under a config that reaches out, the host's DNS stub answers at 127.0.0.1 inside
    // (the engine writes `/etc/resolv.conf`; with the network disabled it writes none).
    let reaches_out = config.network.reaches_out();
    let dns = reaches_out.then(|| vec!["127.0.0.1".to_owned()]);
    let limits = &config.limits;
    let memory = i64::try_from(limits.memory_bytes).unwrap_or(i64::MAX);
    let host_config = HostConfig {
        privileged: Some(false),
        cap_drop: Some(vec!["ALL".to_owned()]),
        cap_add: Some(CAPABILITIES.iter().map(|c| (*c).to_owned()).collect()),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        network_mode: Some("none".to_owned()),
        dns,
        sysctls: Some(sysctls),
        ipc_mode: Some("private".to_owned()),
        // The agent is PID 1 and reaps; docker's init would sit between it and the engine.
        init: Some(false),
        memory: Some(memory),
        memory_swap: Some(memory),
        nano_cpus: Some(i64::try_from(limits.nano_cpus).unwrap_or(i64::MAX)),
        pids_limit: Some(i64::from(limits.pids)),
        mounts: Some(mounts),
        auto_remove: Some(false),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(config.image.clone()),
        entrypoint: Some(vec![AGENT_PATH.to_owned()]),
        cmd: Some(vec![
            "--stdio".to_owned(),
            "--workdir".to_owned(),
            WORKSPACE.to_owned(),
        ]),
        working_dir: Some(WORKSPACE.to_owned()),
        labels: Some(HashMap::from([
            (SANDBOX_LABEL.to_owned(), id.to_owned()),
            (HOST_LABEL.to_owned(), config.host_id.clone()),
        ])),
        attach_stdin: Some(true),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        open_stdin: Some(true),
        // Stdin closes when the attach stream ends: the agent exits with its host.
        stdin_once: Some(true),
        tty: Some(false),
        network_disabled: Some(!reaches_out),
        host_config: Some(host_config),
        ..Default::default()
    }
}

/// A tar of the agent at [`AGENT_PATH`] and an empty [`WORKSPACE`] (the agent's working
/// directory when no workspace is bound), unpacked at `/` of the container.
pub fn agent_archive(agent: &[u8]) -> Result<Bytes, std::io::Error> {
    let mut builder = tar::Builder::new(Vec::new());
    for dir in [".omabox/", "workspace/"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(0o755);
        header.set_size(0);
        builder.append_data(&mut header, dir, std::io::empty())?;
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0o755);
    header.set_size(agent.len() as u64);
    builder.append_data(&mut header, AGENT_PATH.trim_start_matches('/'), agent)?;
    Ok(Bytes::from(builder.into_inner()?))
}

/// A started container: its id, the connected agent, the engine it lives in.
#[derive(Debug)]
pub struct Started {
    /// The engine's container id.
    pub container: String,
    /// The agent, PID 1 of the container.
    pub client: AgentClient,
}

/// Creates, fills, attaches to and starts the container of sandbox `id` and connects to its
/// agent. The image must be present ([`Engine::ensure_image`]). Nothing is left behind
/// when this fails.
pub async fn start(
    engine: &Engine,
    config: &DockerConfig,
    id: &str,
) -> Result<Started, DockerError> {
    let agent = std::fs::read(&config.agent_binary).map_err(|source| DockerError::AgentBinary {
        path: config.agent_binary.display().to_string(),
        source,
    })?;
    let archive = agent_archive(&agent).map_err(|source| DockerError::AgentBinary {
        path: config.agent_binary.display().to_string(),
        source,
    })?;
    let docker = engine.docker();
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(format!("omabox-{id}")),
                ..Default::default()
            }),
            container_body(config, id),
        )
        .await
        .map_err(|source| DockerError::Engine {
            op: "create the container of image",
            target: config.image.clone(),
            source,
        })?;
    let container = created.id;
    match connect(engine, &container, archive).await {
        Ok(client) => Ok(Started { container, client }),
        Err(e) => {
            // The start's error is the one to report; a failed removal is reaped later
            // (the container carries its host's label).
            let _ = engine.remove_container(&container).await;
            Err(e)
        }
    }
}

async fn connect(
    engine: &Engine,
    container: &str,
    archive: Bytes,
) -> Result<AgentClient, DockerError> {
    let docker = engine.docker();
    let engine_error = |op| {
        let target = container.to_owned();
        move |source| DockerError::Engine { op, target, source }
    };
    docker
        .upload_to_container(
            container,
            Some(UploadToContainerOptions {
                path: "/".to_owned(),
                ..Default::default()
            }),
            bollard::body_full(archive),
        )
        .await
        .map_err(engine_error("copy the agent into"))?;
    // Attached before the start, so not a byte of the agent's output is missed.
    let attached = docker
        .attach_container(
            container,
            Some(AttachContainerOptions {
                stream: true,
                stdin: true,
                stdout: true,
                stderr: true,
                ..Default::default()
            }),
        )
        .await
        .map_err(engine_error("attach to"))?;
    docker
        .start_container(container, None)
        .await
        .map_err(engine_error("start"))?;
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let kept = Arc::clone(&stderr);
    // The agent's protocol is its stdout; its stderr (diagnostics) is kept, capped.
    let stdout = attached.output.filter_map(move |item| {
        futures::future::ready(match item {
            Ok(LogOutput::StdOut { message }) => Some(Ok(message)),
            Ok(LogOutput::StdErr { message }) => {
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                let room = STDERR_KEPT.saturating_sub(kept.len());
                kept.extend_from_slice(&message[..room.min(message.len())]);
                None
            }
            Ok(_) => None,
            Err(e) => Some(Err(std::io::Error::other(e))),
        })
    });
    let io = tokio::io::join(
        tokio_util::io::StreamReader::new(Box::pin(stdout)),
        attached.input,
    );
    AgentClient::connect(io)
        .await
        .map_err(|source| DockerError::Connect {
            id: container.to_owned(),
            stderr: String::from_utf8_lossy(&stderr.lock().unwrap_or_else(|e| e.into_inner()))
                .into_owned(),
            source,
        })
}
