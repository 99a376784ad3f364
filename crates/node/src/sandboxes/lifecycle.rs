//! How a serve sandbox starts, pauses and resumes, and how its network changes: the steps
//! [`SandboxHost`]'s create, pause, resume and network update share.
//!
//! Must never: leave a sandbox running that is in no map; lose a paused sandbox's files
//! while its record says it can be resumed; give a sandbox an open internet the operator's
//! network setting does not.

use super::backend::{Shape, cpu_count};
use super::{
    BASE_TEMPLATE, Entry, LogLevel, MAX_PAUSED, MAX_SANDBOXES, Paused, Running, SandboxHost,
    StartWith, Starting, backend, context, internal, startup_error, stopping, watch_timeout,
};
use omabox_agent::AgentClient;
use omabox_backend_gvisor::{GvisorSandboxPort, SandboxSpec};
use omabox_contract::SecretString;
use omabox_contract::networking::NetworkingConfig;
use omabox_proxy::e2b::{CreatedSandbox, SandboxInfo, SandboxServiceError};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};
use tokio::sync::Notify;
use tokio::time::Instant;

impl SandboxHost {
    /// Counts one start in progress, when there is room for it.
    pub(super) fn reserve(&self) -> Result<Starting<'_>, SandboxServiceError> {
        let inner = &self.inner;
        if inner.closed.load(Ordering::Acquire) {
            return Err(stopping());
        }
        let starting = inner.starting.fetch_add(1, Ordering::AcqRel);
        let guard = Starting(&inner.starting);
        if inner.lock().len() + starting >= MAX_SANDBOXES {
            return Err(SandboxServiceError::Unavailable(format!(
                "this server already runs {MAX_SANDBOXES} sandboxes"
            )));
        }
        Ok(guard)
    }

    /// Starts a sandbox of `template` for `id` with `env_vars` set (killed again if they
    /// cannot be).
    pub(super) async fn start(
        &self,
        id: &str,
        template: &str,
        env_vars: &BTreeMap<String, String>,
    ) -> Result<(Running, AgentClient, Shape), SandboxServiceError> {
        if let Some(docker) = &self.inner.docker {
            if self.inner.builds.knows(template) {
                let shown: String = template.chars().take(64).collect();
                return Err(SandboxServiceError::BadRequest(format!(
                    "template {shown:?} was built for linux sandboxes: this server's docker sandboxes start from \"{BASE_TEMPLATE}\" or an engine's image reference"
                )));
            }
            let image = docker_image(template, &docker.config.image)?;
            let config = omabox_backend_docker::DockerConfig {
                image,
                ..docker.config.clone()
            };
            let port = omabox_backend_docker::DockerSandboxPort::start(&docker.engine, &config, id)
                .await
                .map_err(|e| internal(omabox_backend_docker::describe(&e)))?;
            let cgroup = match docker.engine.container_pid(port.container()).await {
                Ok(Some(pid)) => backend::cgroup_of_pid(pid),
                Ok(None) | Err(_) => omabox_backend_linux::CgroupPaths {
                    dirs: Vec::new(),
                    unified: false,
                },
            };
            let client = port.client().clone();
            let port = Running::Docker(port, cgroup);
            with_env(&port, env_vars).await?;
            return Ok((port, client, docker.shape));
        }
        let (port, client, shape) = match &self.inner.gvisor {
            Some(gvisor) => {
                let image_root = if template == BASE_TEMPLATE {
                    None
                } else {
                    Some(self.gvisor_image_root(template).await?)
                };
                let sandbox = gvisor
                    .runtime
                    .create_with(SandboxSpec {
                        user_home: true,
                        image_root,
                        ..SandboxSpec::default()
                    })
                    .await
                    .map_err(|e| internal(startup_error(&e)))?;
                let (port, client) = connected(sandbox).await?;
                (Running::Gvisor(port), client, gvisor.shape)
            }
            None => {
                let config = self.prepared(template).await?;
                let port = self
                    .inner
                    .factory
                    .create_port_with_config(&context(id), &config)
                    .await
                    .map_err(|e| internal(startup_error(&e)))?;
                let shape = Shape {
                    cpu_count: cpu_count(config.limits.cpu.as_ref()),
                    memory_mb: config.limits.memory_bytes.map_or(0, |bytes| bytes >> 20),
                    internet: config.network == NetworkingConfig::Unrestricted,
                };
                let client = port.client().clone();
                (Running::Linux(port), client, shape)
            }
        };
        with_env(&port, env_vars).await?;
        Ok((port, client, shape))
    }

    /// The unpacked rootfs a gvisor sandbox of image template `template` starts from: the
    /// image prepared (pulled or unpacked, held) as for a linux sandbox. Refused: templates
    /// built through the template API (their steps are a linux environment layer), a node
    /// environment layer, and a directory used in place (runsc would make its mount points
    /// in it).
    async fn gvisor_image_root(
        &self,
        template: &str,
    ) -> Result<std::path::PathBuf, SandboxServiceError> {
        let shown: String = template.chars().take(64).collect();
        let refused = |why: &str| {
            SandboxServiceError::BadRequest(format!(
                "template {shown:?}: this server's gvisor sandboxes start from \"{BASE_TEMPLATE}\" or an image omabox unpacks (a registry reference or a rootfs tarball): {why}"
            ))
        };
        if self.inner.builds.knows(template) {
            return Err(refused("templates built here are linux layers"));
        }
        let config = self.prepared(template).await?;
        if config.env_layer.is_some() {
            return Err(refused("the node's environment layer is a linux one"));
        }
        match &config.image {
            omabox_backend_linux::factory::SandboxImage::Prepared(image) => {
                Ok(image.rootfs_dir.clone())
            }
            omabox_backend_linux::factory::SandboxImage::Directory(_) => Err(refused(
                "a directory is used in place, and runsc would write in it",
            )),
            _ => Err(refused("it names no image")),
        }
    }

    /// Restores a gvisor sandbox from a memory snapshot's `image` (its processes go on) with
    /// `env_vars` set on top of the ones it had.
    pub(super) async fn start_from_image(
        &self,
        image: &omabox_backend_gvisor::GvisorImage,
        env_vars: &BTreeMap<String, String>,
    ) -> Result<(Running, AgentClient, Shape), SandboxServiceError> {
        let Some(gvisor) = &self.inner.gvisor else {
            return Err(internal(
                "a memory snapshot on a server without gvisor".into(),
            ));
        };
        let sandbox = gvisor
            .runtime
            .start_from(image)
            .await
            .map_err(|e| internal(startup_error(&e)))?;
        let (port, client) = connected(sandbox).await?;
        let port = Running::Gvisor(port);
        with_env(&port, env_vars).await?;
        Ok((port, client, gvisor.shape))
    }

    /// Puts a started sandbox in the map with its timer; kills it instead when serve is
    /// stopping.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn insert(
        &self,
        port: Running,
        client: AgentClient,
        info: SandboxInfo,
        token: SecretString,
        start_with: StartWith,
        networking: Option<NetworkingConfig>,
        timeout: Duration,
    ) -> Result<(), SandboxServiceError> {
        let id = info.sandbox_id.clone();
        let entry = Arc::new(Entry {
            envd: super::envd::Envd::new(client.clone(), self.inner.logs.open(&id)),
            port,
            client,
            token,
            shown: Mutex::new((info, Instant::now() + timeout)),
            changed: Notify::new(),
            removed: AtomicBool::new(false),
            killing: AtomicBool::new(false),
            cpu: super::metrics::CpuReadings::default(),
            start_with,
            networking: Mutex::new(networking),
            pausing: AtomicBool::new(false),
        });
        {
            let mut map = self.inner.lock();
            if self.inner.closed.load(Ordering::Acquire) {
                drop(map);
                // shutdown's snapshot did not see this one: it is killed here.
                let _ = entry.port.terminate().await;
                let message = "serve is stopping: the sandbox was killed as it started";
                self.inner.logs.end(&id, LogLevel::Warn, "killed", message);
                return Err(stopping());
            }
            map.insert(id.clone(), Arc::clone(&entry));
        }
        tokio::spawn(watch_timeout(Arc::downgrade(&self.inner), id, entry));
        Ok(())
    }

    /// The running sandbox `sandbox_id`.
    pub(super) fn running_entry(
        &self,
        sandbox_id: &str,
    ) -> Result<Arc<Entry>, SandboxServiceError> {
        let entry = self.entry(sandbox_id)?;
        if !self.running(sandbox_id, &entry) {
            return Err(SandboxServiceError::NotFound(sandbox_id.to_owned()));
        }
        Ok(entry)
    }

    /// Makes `config` the live network policy of `port`'s sandbox.
    pub(super) fn apply_network(
        &self,
        port: &Running,
        config: &NetworkingConfig,
    ) -> Result<(), SandboxServiceError> {
        port.set_network(config, self.inner.unprepared.gateway.as_ref())
    }

    /// Saves the running sandbox's files, kills it and keeps it as paused; with
    /// `keep_memory` (a gvisor sandbox) checkpoints it instead: its processes go on after
    /// the resume. `Ok(false)`: it was paused already. On error the sandbox keeps running
    /// and nothing is kept (a failed checkpoint ends the gvisor sandbox).
    pub(super) async fn pause_sandbox(
        &self,
        sandbox_id: &str,
        keep_memory: bool,
    ) -> Result<bool, SandboxServiceError> {
        let Some(saved) = &self.inner.saved else {
            return Err(SandboxServiceError::BadRequest(
                "pause is not offered by this server".into(),
            ));
        };
        if self.inner.paused_map().contains_key(sandbox_id) {
            return Ok(false);
        }
        let entry = self.running_entry(sandbox_id)?;
        if self.inner.paused_map().len() >= MAX_PAUSED {
            return Err(SandboxServiceError::Unavailable(format!(
                "this server already keeps {MAX_PAUSED} paused sandboxes"
            )));
        }
        // One pause at a time: a second one saving into the same directory would fail and
        // remove the first one's files.
        if entry.pausing.swap(true, Ordering::AcqRel) {
            return Ok(false);
        }
        if let (true, Running::Gvisor(port)) = (keep_memory, &entry.port) {
            return self.pause_in_memory(sandbox_id, &entry, port).await;
        }
        let saving = saved
            .save(sandbox_id, &entry.client)
            .await
            .map_err(|e| internal(format!("cannot pause sandbox {sandbox_id}: {e}")));
        if let Err(error) = saving {
            entry.pausing.store(false, Ordering::Release);
            return Err(error);
        }
        if let Err(error) = super::kill_entry(&self.inner, sandbox_id, &entry).await {
            saved.remove(sandbox_id);
            entry.pausing.store(false, Ordering::Release);
            return Err(error);
        }
        self.keep_paused(sandbox_id, &entry, None);
        tracing::info!(sandbox = %sandbox_id, "sandbox paused");
        let message = "sandbox paused (its files kept, its processes ended)";
        self.inner.logs.open(sandbox_id).info("paused", message);
        Ok(true)
    }

    /// Records the sandbox of `entry` (no longer running) as paused: what a resume needs.
    fn keep_paused(&self, sandbox_id: &str, entry: &Entry, in_memory: Option<GvisorSandboxPort>) {
        let mut info = entry.shown().0.clone();
        info.paused = true;
        let networking = entry
            .networking
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        self.inner.paused_map().insert(
            sandbox_id.to_owned(),
            Paused {
                info,
                token: entry.token.clone(),
                start_with: entry.start_with.clone(),
                networking,
                in_memory,
            },
        );
    }

    /// Checkpoints the running gvisor sandbox (its processes, memory and files kept in its
    /// directory, nothing running) and keeps it as paused.
    async fn pause_in_memory(
        &self,
        sandbox_id: &str,
        entry: &Arc<Entry>,
        port: &GvisorSandboxPort,
    ) -> Result<bool, SandboxServiceError> {
        let paused = port.sandbox().pause().await;
        if let Err(error @ omabox_backend_gvisor::GvisorError::NoDiskRoom { .. }) = paused {
            // Refused before anything stopped: the sandbox runs on.
            entry.pausing.store(false, Ordering::Release);
            return Err(SandboxServiceError::Unavailable(format!(
                "cannot pause sandbox {sandbox_id}: {error}"
            )));
        }
        if let Err(error) = paused {
            // A failed checkpoint leaves the sandbox ended (GvisorSandbox::pause): it goes.
            let _ = super::kill_entry(&self.inner, sandbox_id, entry).await;
            self.inner.logs.end(
                sandbox_id,
                LogLevel::Error,
                "killed",
                "the sandbox could not be paused and was killed",
            );
            return Err(internal(format!(
                "cannot pause sandbox {sandbox_id}: {}",
                backend::chain(&error)
            )));
        }
        super::forget_entry(&self.inner, sandbox_id, entry);
        self.keep_paused(sandbox_id, entry, Some(port.clone()));
        tracing::info!(sandbox = %sandbox_id, "sandbox paused with its memory");
        let message = "sandbox paused (its processes, memory and files kept)";
        self.inner.logs.open(sandbox_id).info("paused", message);
        Ok(true)
    }

    /// Starts the paused sandbox `sandbox_id` again under its id and token, its files
    /// back (a gvisor sandbox paused with its memory: restored, its processes going on), to
    /// live `timeout`. `Ok(None)`: it is not paused. On error it stays paused.
    pub(super) async fn resume_sandbox(
        &self,
        sandbox_id: &str,
        timeout: Duration,
    ) -> Result<Option<CreatedSandbox>, SandboxServiceError> {
        let (Some(saved), Some(paused)) = (
            &self.inner.saved,
            self.inner.paused_map().remove(sandbox_id),
        ) else {
            return Ok(None);
        };
        let result = match &paused.in_memory {
            Some(port) => self.restore(sandbox_id, port, &paused, timeout).await,
            None => self.restart(saved, sandbox_id, &paused, timeout).await,
        };
        match result {
            Ok(info) => {
                saved.remove(sandbox_id);
                tracing::info!(sandbox = %sandbox_id, "sandbox resumed");
                let message = if paused.in_memory.is_some() {
                    "sandbox resumed (its processes going on)"
                } else {
                    "sandbox resumed (its files back)"
                };
                self.inner.logs.open(sandbox_id).info("resumed", message);
                Ok(Some(CreatedSandbox {
                    info,
                    access_token: paused.token,
                }))
            }
            Err(error) => {
                self.inner
                    .paused_map()
                    .insert(sandbox_id.to_owned(), paused);
                Err(error)
            }
        }
    }

    /// Restores a gvisor sandbox paused with its memory.
    async fn restore(
        &self,
        sandbox_id: &str,
        port: &GvisorSandboxPort,
        paused: &Paused,
        timeout: Duration,
    ) -> Result<SandboxInfo, SandboxServiceError> {
        let _starting = self.reserve()?;
        let cannot = |error: &dyn std::error::Error| {
            internal(format!(
                "cannot resume sandbox {sandbox_id}: {}",
                backend::chain(error)
            ))
        };
        port.sandbox().resume().await.map_err(|e| cannot(&e))?;
        let client = match port.sandbox().client().await {
            Ok(client) => client,
            Err(error) => return Err(cannot(&error)),
        };
        let mut info = paused.info.clone();
        info.end_at = SystemTime::now() + timeout;
        self.insert_resumed(Running::Gvisor(port.clone()), client, paused, info, timeout)
            .await
    }

    async fn restart(
        &self,
        saved: &super::saved::SavedFiles,
        sandbox_id: &str,
        paused: &Paused,
        timeout: Duration,
    ) -> Result<SandboxInfo, SandboxServiceError> {
        let _starting = self.reserve()?;
        let (port, client, _) = self
            .start(
                sandbox_id,
                &paused.start_with.template,
                &paused.start_with.env_vars,
            )
            .await?;
        let restored = match &paused.networking {
            Some(config) => self.apply_network(&port, config),
            None => Ok(()),
        };
        let restored = match restored {
            Ok(()) => saved
                .restore(sandbox_id, &client)
                .await
                .map_err(|e| internal(format!("cannot resume sandbox {sandbox_id}: {e}"))),
            Err(error) => Err(error),
        };
        if let Err(error) = restored {
            let _ = port.terminate().await;
            return Err(error);
        }
        let started_at = SystemTime::now();
        let mut info = paused.info.clone();
        info.started_at = started_at;
        info.end_at = started_at + timeout;
        self.insert_resumed(port, client, paused, info, timeout)
            .await
    }

    /// Puts a resumed sandbox in the map as `info` (shown running) under its paused
    /// record's token, start and network.
    async fn insert_resumed(
        &self,
        port: Running,
        client: AgentClient,
        paused: &Paused,
        mut info: SandboxInfo,
        timeout: Duration,
    ) -> Result<SandboxInfo, SandboxServiceError> {
        info.paused = false;
        self.insert(
            port,
            client,
            info.clone(),
            paused.token.clone(),
            paused.start_with.clone(),
            paused.networking.clone(),
            timeout,
        )
        .await?;
        Ok(info)
    }
}

/// A started gvisor sandbox as a port, with its agent's client; the sandbox is destroyed
/// when its agent does not answer.
async fn connected(
    sandbox: omabox_backend_gvisor::GvisorSandbox,
) -> Result<(GvisorSandboxPort, AgentClient), SandboxServiceError> {
    let port = GvisorSandboxPort::new(std::sync::Arc::new(sandbox));
    match port.sandbox().client().await {
        Ok(client) => Ok((port, client)),
        Err(e) => {
            let _ = port.sandbox().destroy().await;
            Err(internal(startup_error(&e)))
        }
    }
}

/// Sets `env_vars` (when any) on a started sandbox, which is terminated when that fails.
async fn with_env(
    port: &Running,
    env_vars: &BTreeMap<String, String>,
) -> Result<(), SandboxServiceError> {
    if !env_vars.is_empty()
        && let Err(error) = port.set_env_vars(env_vars.clone()).await
    {
        let _ = port.terminate().await;
        return Err(internal(format!(
            "cannot set the sandbox's environment variables: {error}"
        )));
    }
    Ok(())
}

/// The engine image a docker sandbox of `template` starts from: `base` is the `image`
/// setting; another template must name an image with its tag or registry (a bare name is
/// not taken for a Docker Hub image, as on linux), and templates built through the
/// template API are refused (their layers are the linux backend's).
fn docker_image(template: &str, base: &str) -> Result<String, SandboxServiceError> {
    if template == BASE_TEMPLATE {
        return Ok(base.to_owned());
    }
    let shown: String = template.chars().take(64).collect();
    // The linux rule for image references (`prepare::image_reference`), without paths.
    if super::prepare::image_reference(template).is_ok() && !template.starts_with('/') {
        Ok(template.to_owned())
    } else {
        Err(SandboxServiceError::BadRequest(format!(
            "template {shown:?}: this server's docker sandboxes start from \"{BASE_TEMPLATE}\" or an engine's image reference (NAME:TAG, REGISTRY/REPO:TAG)"
        )))
    }
}
