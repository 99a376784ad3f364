//! E2B's fork on a gvisor serve: the running sandbox is checkpointed in place (a memory
//! pause), `count` sandboxes are restored from that one checkpoint, and the source is
//! resumed under its id and token with the time it had left. Each fork has a workspace of
//! its own that starts as the source's (overlay layers, `omabox-backend-gvisor`'s
//! `layers.rs`; its memory, `/tmp` and `/home/user` come from the checkpoint), a fresh id
//! and access token, the source's template, metadata, environment and network.
//!
//! Must never: leave the source paused when a fork fails (it is resumed whatever happened);
//! let a fork share a token or a writable directory with its source.

use super::{LogLevel, Running, SandboxHost, internal, new_access_token, new_sandbox_id, stopping};
use omabox_backend_gvisor::GvisorSandboxPort;
use omabox_proxy::e2b::{CreatedSandbox, SandboxServiceError};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::time::Instant;

/// A sandbox checkpointed in place: its paused port and what it is resumed and copied with.
pub(super) struct CheckpointHeld {
    pub(super) port: GvisorSandboxPort,
    /// The time it had left.
    left: Duration,
    pub(super) info: omabox_proxy::e2b::SandboxInfo,
    pub(super) start_with: super::StartWith,
    pub(super) networking: Option<omabox_contract::networking::NetworkingConfig>,
}

impl SandboxHost {
    pub(super) async fn fork_sandbox(
        &self,
        sandbox_id: &str,
        count: usize,
        timeout: Duration,
    ) -> Result<Vec<Result<CreatedSandbox, SandboxServiceError>>, SandboxServiceError> {
        let Some(gvisor) = &self.inner.gvisor else {
            return Err(SandboxServiceError::BadRequest(
                "fork needs a memory snapshot: serve with --backend gvisor".into(),
            ));
        };
        let held = self.checkpoint_in_place(sandbox_id).await?;
        let forked = held.port.sandbox().fork(&gvisor.runtime, count).await;
        let CheckpointHeld {
            info: source_info,
            start_with,
            networking,
            ..
        } = self.resume_in_place(sandbox_id, held).await;
        let forks = forked.map_err(|e| {
            internal(format!(
                "cannot fork sandbox {sandbox_id}: {}",
                super::backend::chain(&e)
            ))
        })?;
        let mut results = Vec::with_capacity(forks.len());
        for fork in forks {
            let port = GvisorSandboxPort::new(Arc::new(fork));
            results.push(
                self.insert_fork(
                    port,
                    &source_info,
                    start_with.clone(),
                    networking.clone(),
                    timeout,
                )
                .await,
            );
        }
        tracing::info!(sandbox = %sandbox_id, count, "sandbox forked");
        self.inner
            .logs
            .open(sandbox_id)
            .info("forked", &format!("sandbox forked into {count}"));
        Ok(results)
    }

    /// Pauses the running gvisor sandbox with its memory, to be resumed by
    /// [`SandboxHost::resume_in_place`] whatever is done with its checkpoint meanwhile.
    pub(super) async fn checkpoint_in_place(
        &self,
        sandbox_id: &str,
    ) -> Result<CheckpointHeld, SandboxServiceError> {
        let entry = self.running_entry(sandbox_id)?;
        // It keeps the time it had left (at least a second to be resumed into).
        let left = entry
            .shown()
            .1
            .saturating_duration_since(Instant::now())
            .max(Duration::from_secs(1));
        drop(entry);
        if !self.pause_sandbox(sandbox_id, true).await? {
            return Err(SandboxServiceError::Unavailable(format!(
                "sandbox {sandbox_id} is being paused: try again once it runs again"
            )));
        }
        let paused = self.inner.paused_map().get(sandbox_id).map(|p| {
            (
                p.in_memory.clone(),
                p.info.clone(),
                p.start_with.clone(),
                p.networking.clone(),
            )
        });
        match paused {
            Some((Some(port), info, start_with, networking)) => Ok(CheckpointHeld {
                port,
                left,
                info,
                start_with,
                networking,
            }),
            _ => Err(stopping()),
        }
    }

    /// Resumes what [`SandboxHost::checkpoint_in_place`] paused (a failure is logged: the
    /// sandbox then stays paused, and a connect tries again).
    pub(super) async fn resume_in_place(
        &self,
        sandbox_id: &str,
        held: CheckpointHeld,
    ) -> CheckpointHeld {
        if let Err(error) = self.resume_sandbox(sandbox_id, held.left).await {
            tracing::error!(sandbox = %sandbox_id, %error, "cannot resume a sandbox checkpointed in place");
        }
        held
    }

    /// Puts one restored fork in the map as a new sandbox (destroyed if it cannot be).
    async fn insert_fork(
        &self,
        port: GvisorSandboxPort,
        source: &omabox_proxy::e2b::SandboxInfo,
        start_with: super::StartWith,
        networking: Option<omabox_contract::networking::NetworkingConfig>,
        timeout: Duration,
    ) -> Result<CreatedSandbox, SandboxServiceError> {
        let reserved = self.reserve();
        let client = match (&reserved, port.sandbox().client().await) {
            (Ok(_), Ok(client)) => client,
            (Err(_), _) | (_, Err(_)) => {
                let _ = port.sandbox().destroy().await;
                return Err(match reserved {
                    Err(error) => error,
                    Ok(_) => internal("a fork lost its agent as it started".into()),
                });
            }
        };
        let running = Running::Gvisor(port);
        if let Some(config) = &networking
            && let Err(error) = self.apply_network(&running, config)
        {
            let _ = running.terminate().await;
            return Err(error);
        }
        let id = new_sandbox_id();
        let started_at = SystemTime::now();
        let mut info = source.clone();
        info.sandbox_id = id.clone();
        info.started_at = started_at;
        info.end_at = started_at + timeout;
        info.paused = false;
        let token = new_access_token();
        self.inner.logs.open(&id).push(
            LogLevel::Info,
            &format!("sandbox forked from {}", source.sandbox_id),
            &[("event", "created".into())],
        );
        self.insert(
            running,
            client,
            info.clone(),
            token.clone(),
            start_with,
            networking,
            timeout,
        )
        .await?;
        drop(reserved);
        Ok(CreatedSandbox {
            info,
            access_token: token,
        })
    }
}
