//! [`LinuxSandboxFactory`]: makes linux sandboxes from a typed [`LinuxSandboxConfig`], and is
//! the `linux` entry of the `SANDBOX_PROVIDER` map.
//!
//! A sandbox is made in three steps: [`LinuxSandboxFactory::prepare_image`] (a registry tag
//! resolved to its digest, the image pulled or unpacked into the cache, pinned and held from
//! `image rm|prune`), [`LinuxSandboxFactory::prepare_env_layer`] (the environment layer built
//! or found), then [`LinuxSandboxFactory::create_port_with_config`], which takes a prepared
//! config only: a create never pulls, resolves a tag or builds a layer. omabox's node builds
//! the config from its settings and prepares it before a run claims anything; the managed
//! provider ([`crate::managed`]) and `omabox sandbox run` take it prepared.
//!
//! The config and a factory context become a [`SandboxPlan`] ([`LinuxSandboxConfig::plan`])
//! and a started [`LinuxSandboxPort`]:
//!
//! | context          | sandbox                                        |
//! |------------------|------------------------------------------------|
//! | `workdir`        | writable bind at `/workspace` (created if missing); the working dir |
//! | `outputsRoot`    | writable bind at `/mnt/session/outputs` (created if missing) |
//! | `memoryRoot`     | ignored: linux sandboxes have no memory mounts yet |
//!
//! # Environment keys (the `SANDBOX_PROVIDER` seam)
//!
//! A tool sandbox factory is handed a context and an env map (`SandboxFactory::create`):
//! the seam parses the map once per create ([`LinuxSandboxFactory::config_from_env`], the one
//! parser) and runs both preparation steps itself, since it has no earlier step. It reads
//! only these keys (never the process environment), each optional:
//!
//! | key | meaning | default |
//! |-----|---------|---------|
//! | `OMABOX_LINUX_IMAGE` | absolute path of a local rootfs directory, rootfs tarball (`.tar`, `.tar.gz`) or OCI image layout directory, or a registry reference (`node:22-slim`, `registry:5000/x@sha256:…`); the read-only lower layer of an overlay root (see [`crate::image`]) | the preinstalled rootfs (read-only host `/usr`, `/bin`, `/lib*`, generated `/etc`) |
//! | `SANDBOX_IMAGE` | OpenMA's name, read when `OMABOX_LINUX_IMAGE` is unset | |
//! | `OMABOX_LINUX_IMAGE_CACHE` | absolute path of the cache tarballs, OCI layouts and registry images are unpacked into | the factory's ([`LinuxSandboxFactory::with_image_cache`]; omabox's node gives its `image_cache` setting); without one, an image that needs a cache is refused |
//! | `OMABOX_INSECURE_REGISTRIES` | `host[:port][,…]`: registries pulled from over plain HTTP (loopback ones always are) | none |
//! | `OMABOX_REGISTRY_ALLOWED_HOSTS` | `REGISTRY=HOST[,…]` (`host`, `host:port`, `*.suffix`; `*` for any registry): hosts a registry may send a pull to besides itself, as token realm or blob redirect (see [`crate::image`]'s `net_policy`) | the built-in entries of Docker Hub, ghcr.io, quay.io, gcr.io, mcr.microsoft.com |
//! | `OMABOX_PULL_TIMEOUT` | seconds a registry pull (requests and downloads) may take in all | 3600 |
//! | `OMABOX_IMAGE_MAX_BYTES` | bytes of file data one image may unpack to (every layer counted), with a `K`/`M`/`G`/`T` suffix (binary) | 64G |
//! | `OMABOX_IMAGE_MAX_ENTRIES` | entries one image may have (every layer counted) | 4000000 |
//! | `OMABOX_PULL_STALL_TIMEOUT` | seconds within which a registry response must start, and deliver at least 1 KiB or end | 60 |
//! | `DOCKER_CONFIG`, `HOME` | where docker's `config.json` is (`$DOCKER_CONFIG/config.json`, else `$HOME/.docker/config.json`): registry credentials (`auths.<host>.auth`) | |
//! | `OMABOX_LINUX_MEMORY` | memory limit: bytes, or with a `K`/`M`/`G`/`T` suffix (binary: `512M` = 512 MiB), or `unlimited` | 512M |
//! | `OMABOX_LINUX_CPUS` | CPU quota in CPUs (`1`, `0.5`, `1.25`: at least 0.01), or `unlimited` | 2, or the host's CPU count if smaller |
//! | `OMABOX_LINUX_PIDS` | maximum tasks (processes + threads, the agent included), or `unlimited` | 512 |
//! | `OMABOX_LINUX_EXEC_TIMEOUT_MS` | default exec timeout in ms | 120000 |
//! | `OMABOX_LINUX_READONLY_BINDS` | `HOST_DIR:SANDBOX_DIR[,…]`: host directories mounted read-only (nosuid, nodev, idmapped) in the sandbox, e.g. an agent's package cache | none |
//! | `OMABOX_LINUX_ENV_LAYER` | `{"apt":[…],"dockerfile":"…","files":{ID:{"path","sha256"}}}`: apt packages and dockerfile steps (`RUN`, `ENV`, `WORKDIR`, `COPY` of the listed files) run once per image and content into an environment layer over the image ([`crate::env_layer`]; needs an image, and a network that admits what the build reaches); built by `prepare_env_layer` | none |
//! | `OMABOX_LINUX_MEMORY_MOUNT` | `1`: a writable tmpfs at `/mnt/memory` (size and mode as `/tmp`), where Session memory stores are copied in | none |
//! | `OMABOX_LINUX_WORKSPACE_TMPFS` | `1`: `/workspace` is a tmpfs of the sandbox's own (half the memory limit, charged to it, gone with the sandbox) and the context's workdir is not used — `omabox sandbox run` without `--workspace` | none |
//! | `OMABOX_LINUX_NETWORK` | what the sandbox reaches besides its loopback: `none`, `limited` (nothing but the gateway), `unrestricted`, or an Environment `networking` JSON object (`{"type":"limited","allowed_hosts":["pypi.org"],"allow_package_managers":true}`); see [`crate::network`] | `none` |
//! | `OMABOX_LINUX_GATEWAY` | `IP:PORT` (or `NAME=IP:PORT`, NAME being the host name of the gateway's URL, which then resolves to `127.0.0.1` inside) where the omabox gateway (hosted inference and MCP proxies) listens, as the host reaches it; the sandbox reaches it at `127.0.0.1:PORT` under every networking config but `none` | no gateway |
//! | `OMABOX_LINUX_TEST_HOSTS` | test mode only (`OMABOX_TEST_MODE=1`; refused otherwise): `NAME=IP,...` answered before the host's resolver, for tests whose upstream servers live in namespaces they made | none |
//! | `OMABOX_LINUX_RUNTIME_DIR` | absolute parent of the sandboxes' state dirs | `/run/omabox` |
//! | `OMABOX_LINUX_CGROUP_PARENT` | cgroup directory (below each hierarchy root) holding the sandboxes' cgroups | `omabox` |
//! | `OMABOX_LINUX_INIT` | path of the `omabox-sandbox-init` binary | next to the running executable, then `PATH` |
//! | `PATH` | read only to find `omabox-sandbox-init` (its absolute directories) when `OMABOX_LINUX_INIT` is unset and the binary is not next to the running executable | none searched |
//!
//! A directory image is used in place. A tarball, an OCI layout or a registry image is
//! unpacked once into the content-addressed image cache (layout, pull and unpacking
//! defences in [`crate::image`]) by `prepare_image`, never by the parser. A registry
//! reference is resolved when the config is prepared (a tag once per seam create, once per
//! run for omabox's own: every acquire of the run gets the same pinned image; a pinned
//! `@sha256:` in the cache needs no registry), and the digest goes into the lease
//! ([`LinuxSandboxConfig::lease_image`]). Whatever the artifact,
//! the sandbox's PID 1 (`omabox-sandbox-init`) comes from the host, so an image needs no
//! omabox binary; it must hold the harness the readiness probe runs.
//!
//! # What it must never do
//!
//! - Read a key that is not in the table above, or print an env value of another key.
//! - Read the process environment: every value comes in the config.
//! - Pull, resolve a tag or build a layer inside a create of a prepared config.
//! - Leave a sandbox behind when `create` fails.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::{SandboxFactory, SandboxFactoryContext, SandboxFactoryEnv, SandboxPort};

use crate::env_layer::{EnvLayerError, EnvLayers, LayerSpec};
use crate::image::{ImageError, NoProgress, PullProgress, StaticCredentials};
use crate::port::{LinuxPortError, LinuxSandboxPort};
use omabox_linux_sandbox::plan::SandboxPlan;
use omabox_linux_sandbox::{LinuxRuntime, RuntimeConfig, StartError};

mod config;
mod env;
mod image;
mod provider;

pub use config::{
    EnvLayerChoice, GatewaySetting, LinuxSandboxConfig, PreparedImage, PreparedLayer, SandboxImage,
};
pub use env::*;
pub use image::{LeaseImage, PendingImage, RegistryPull};
pub use provider::LinuxSandboxProvider;

/// Why the factory could not make a sandbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinuxFactoryError {
    /// One of the factory's env keys has a value it cannot use.
    #[error("{key}={value:?} is invalid: {reason}")]
    InvalidEnv {
        /// The key.
        key: &'static str,
        /// Its value (only the factory's own, non-secret keys are ever reported).
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// The environment layer could not be built.
    #[error(transparent)]
    EnvLayer(EnvLayerError),
    /// The image artifact could not be resolved (unpacked into the cache).
    #[error("cannot use image {image:?}")]
    Image {
        /// The image reference.
        image: String,
        /// Why.
        #[source]
        source: ImageError,
    },
    /// A host directory of the context could not be prepared.
    #[error("could not prepare {what} directory {path:?}")]
    Prepare {
        /// `workspace` or `outputs`.
        what: &'static str,
        /// The host path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// This machine cannot run linux sandboxes (or the runtime could not be set up).
    #[error("the linux sandbox runtime is not usable")]
    Runtime(#[source] StartError),
    /// Starting the sandbox failed.
    #[error(transparent)]
    Start(#[from] LinuxPortError),
    /// A create was handed a config whose image or layer was not prepared first (a
    /// caller's bug: a create never pulls, resolves a tag or builds a layer).
    #[error("{0} was not prepared before the sandbox's create")]
    Unprepared(&'static str),
}

impl LinuxFactoryError {
    /// Whether the error says this machine cannot run linux sandboxes at all (missing
    /// root, namespaces, cgroups, the init binary), as opposed to a bad request.
    pub fn is_host_unsupported(&self) -> bool {
        matches!(
            self,
            Self::Runtime(
                StartError::Missing(_) | StartError::Probe(_) | StartError::InitBinaryMissing(_)
            ) | Self::Start(LinuxPortError::Start(
                StartError::Missing(_) | StartError::Probe(_) | StartError::InitBinaryMissing(_)
            ))
        )
    }
}

impl From<LinuxFactoryError> for PortError {
    fn from(error: LinuxFactoryError) -> Self {
        match error {
            LinuxFactoryError::Start(e) => e.into(),
            e @ LinuxFactoryError::InvalidEnv { .. } => PortError::invalid_argument(e.to_string()),
            LinuxFactoryError::Image { ref source, .. } if source.is_bad_image() => {
                PortError::invalid_argument(message_chain(&error))
            }
            e => PortError::new(message_chain(&e)),
        }
    }
}

/// The error's message followed by its sources' messages.
fn message_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut next = error.source();
    while let Some(s) = next {
        message.push_str(": ");
        message.push_str(&s.to_string());
        next = s.source();
    }
    message
}

/// An environment layer to put over the image ([`crate::env_layer`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLayerSetting {
    /// What it holds.
    pub spec: LayerSpec,
    /// The image cache it is kept in (`env-layers/` below it).
    pub image_cache: PathBuf,
}

/// Creates linux sandboxes for the provider map.
#[derive(Debug, Clone, Default)]
pub struct LinuxSandboxFactory {
    defaults: RuntimeConfig,
    image_cache: Option<PathBuf>,
    registry_credentials: StaticCredentials,
    /// The runtime [`check_host`](Self::check_host) probed, for the next
    /// [`create_port`](Self::create_port) with the same settings to take (once), so a
    /// check followed by a create (`omabox sandbox run`) probes the machine once. Shared
    /// by the factory's clones (the provider map holds one).
    checked: Arc<Mutex<Option<LinuxRuntime>>>,
}

impl LinuxSandboxFactory {
    /// A factory with the default runtime settings (`/run/omabox`, cgroup `omabox`) and
    /// no image cache (an image that needs one then needs `OMABOX_LINUX_IMAGE_CACHE`).
    pub fn new() -> Self {
        Self::default()
    }

    /// A factory whose runtime settings default to `config` (env keys still override).
    pub fn with_runtime_config(config: RuntimeConfig) -> Self {
        Self {
            defaults: config,
            ..Self::default()
        }
    }

    /// The same factory with `dir` as the default image cache (the env key still
    /// overrides it).
    pub fn with_image_cache(mut self, dir: impl Into<PathBuf>) -> Self {
        self.image_cache = Some(dir.into());
        self
    }

    /// The same factory pulling registry images with `credentials` first (then docker's
    /// `config.json`).
    pub fn with_registry_credentials(mut self, credentials: StaticCredentials) -> Self {
        self.registry_credentials = credentials;
        self
    }

    /// Preparation step 1: unpacks a pending image into its cache (a registry reference
    /// resolved to its digest and pulled unless cached, `progress` told), making it
    /// [`SandboxImage::Prepared`]: pinned, and held from `image rm|prune` as long as the
    /// config (or a clone) lives. Blocking. Nothing to do for another image.
    pub fn prepare_image(
        &self,
        config: &mut LinuxSandboxConfig,
        progress: &dyn PullProgress,
    ) -> Result<(), LinuxFactoryError> {
        let SandboxImage::Pending(pending) = &config.image else {
            return Ok(());
        };
        let resolved = pending.resolve_with(progress)?;
        let lease = pending.lease_image(&resolved);
        config.image = SandboxImage::Prepared(PreparedImage {
            rootfs_dir: resolved.rootfs_dir,
            lease,
            hold: resolved.hold,
        });
        Ok(())
    }

    /// Preparation step 2 (after [`prepare_image`](Self::prepare_image)): builds the
    /// pending environment layer over the image, or finds it built (once per image and
    /// content), making it [`EnvLayerChoice::Prepared`]. The build runs in a sandbox of
    /// its own, with the config's network. Nothing to do without one.
    pub async fn prepare_env_layer(
        &self,
        config: &mut LinuxSandboxConfig,
    ) -> Result<(), LinuxFactoryError> {
        let Some(EnvLayerChoice::Pending(layer)) = &config.env_layer else {
            return Ok(());
        };
        if matches!(config.image, SandboxImage::Pending(_)) {
            return Err(LinuxFactoryError::Unprepared("the image"));
        }
        let runtime_config = config.runtime.clone();
        let checked = self.take_checked(&runtime_config);
        let runtime = tokio::task::spawn_blocking(move || match checked {
            Some(runtime) => Ok(runtime),
            None => LinuxRuntime::new(runtime_config).map_err(LinuxFactoryError::Runtime),
        })
        .await
        .map_err(|e| LinuxPortError::Task(e.to_string()))??;
        let ctx = SandboxFactoryContext {
            session_id: "env-layer".into(),
            workdir: PathBuf::new(),
            memory_root: None,
            outputs_root: None,
        };
        let mut plan = config.plan(&ctx);
        plan.workspace = None;
        let made = EnvLayers::in_image_cache(&layer.image_cache)
            .ensure(&runtime, &plan, &layer.spec, config.resolver()?)
            .await
            .map_err(LinuxFactoryError::EnvLayer)?;
        tracing::info!(
            layer = %made.dir.display(),
            built = made.built,
            bytes = made.bytes,
            "environment layer"
        );
        let env = layer.spec.env().into_iter().collect();
        config.env_layer = Some(EnvLayerChoice::Prepared(PreparedLayer {
            dir: made.dir,
            env,
        }));
        Ok(())
    }

    /// The tool-sandbox seam's config: `env` parsed ([`config_from_env`](Self::config_from_env)),
    /// then its image and layer prepared (that seam has no earlier step to do it in).
    pub async fn prepared_config(
        &self,
        env: &SandboxFactoryEnv,
    ) -> Result<LinuxSandboxConfig, LinuxFactoryError> {
        let mut config = self.config_from_env(env)?;
        if config.pending_image().is_some() {
            let (factory, mut pending) = (self.clone(), config);
            config = tokio::task::spawn_blocking(move || {
                factory.prepare_image(&mut pending, &NoProgress)?;
                Ok::<_, LinuxFactoryError>(pending)
            })
            .await
            .map_err(|e| LinuxPortError::Task(e.to_string()))??;
        }
        self.prepare_env_layer(&mut config).await?;
        Ok(config)
    }

    /// Probes this machine and checks that the plan `ctx` and `env` describe can run
    /// here, without starting anything. The error says what is missing and how to fix it.
    pub fn check_host(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<(), LinuxFactoryError> {
        self.check_host_config(ctx, &self.config_from_env(env)?)
    }

    /// [`check_host`](Self::check_host) of a typed config.
    pub fn check_host_config(
        &self,
        ctx: &SandboxFactoryContext,
        config: &LinuxSandboxConfig,
    ) -> Result<(), LinuxFactoryError> {
        let runtime =
            LinuxRuntime::new(config.runtime.clone()).map_err(LinuxFactoryError::Runtime)?;
        runtime
            .capabilities()
            .check(&config.plan(ctx))
            .map_err(|e| LinuxFactoryError::Runtime(StartError::Missing(e)))?;
        *self.checked.lock().unwrap_or_else(PoisonError::into_inner) = Some(runtime);
        Ok(())
    }

    /// The runtime `check_host` just probed with `config`, if any (taken: used once).
    fn take_checked(&self, config: &RuntimeConfig) -> Option<LinuxRuntime> {
        self.checked
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .filter(|runtime| runtime.config() == config)
    }

    /// The tool-sandbox seam: parses `env`, prepares image and layer, creates the sandbox
    /// and returns the concrete port (the provider map gets it as a `dyn SandboxPort`).
    /// Nothing is left behind on error.
    pub async fn create_port(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<LinuxSandboxPort, LinuxFactoryError> {
        let config = self.prepared_config(env).await?;
        // `config` (and with it the image's hold) lives until the start returned.
        self.create_port_with_config(ctx, &config).await
    }

    /// Creates the sandbox of a prepared `config` ([`LinuxSandboxConfig::is_prepared`];
    /// anything else is refused: a create never pulls, resolves a tag or builds a
    /// layer). Keep `config` (its image hold) until this returned.
    pub async fn create_port_with_config(
        &self,
        ctx: &SandboxFactoryContext,
        config: &LinuxSandboxConfig,
    ) -> Result<LinuxSandboxPort, LinuxFactoryError> {
        if matches!(config.image, SandboxImage::Pending(_)) {
            return Err(LinuxFactoryError::Unprepared("the image"));
        }
        if matches!(config.env_layer, Some(EnvLayerChoice::Pending(_))) {
            return Err(LinuxFactoryError::Unprepared("the environment layer"));
        }
        let mut plan = config.plan(ctx);
        let mut dirs = Vec::new();
        if let Some(w) = plan.workspace.take() {
            dirs.push(("workspace", w));
        }
        if let Some(o) = plan.outputs.take() {
            dirs.push(("outputs", o));
        }
        let runtime_config = config.runtime.clone();
        let checked = self.take_checked(&runtime_config);
        let (runtime, prepared) = tokio::task::spawn_blocking(move || {
            let mut prepared = Vec::new();
            for (what, dir) in dirs {
                prepared.push((what, prepare_dir(what, &dir)?));
            }
            let runtime = match checked {
                Some(runtime) => runtime,
                None => LinuxRuntime::new(runtime_config).map_err(LinuxFactoryError::Runtime)?,
            };
            Ok::<_, LinuxFactoryError>((runtime, prepared))
        })
        .await
        .map_err(|e| LinuxPortError::Task(e.to_string()))??;
        for (what, dir) in prepared {
            match what {
                "workspace" => plan.workspace = Some(dir),
                _ => plan.outputs = Some(dir),
            }
        }
        let port = LinuxSandboxPort::start_resolving(&runtime, &plan, config.resolver()?).await?;
        Ok(port.with_default_timeout(config.exec_timeout))
    }

    /// Everything [`LinuxRuntime::start_one_shot`] needs, blocking: the probed runtime
    /// (one-shot only: no setup-stage binary needed), the plan of a prepared `config`
    /// checked against it, and the context directories created. For a single-threaded
    /// caller that runs one command (`omabox sandbox run`). Keep `config` (its image
    /// hold) until the start has returned.
    pub fn prepare_one_shot(
        &self,
        ctx: &SandboxFactoryContext,
        config: &LinuxSandboxConfig,
    ) -> Result<(LinuxRuntime, SandboxPlan), LinuxFactoryError> {
        if !config.is_prepared() {
            return Err(LinuxFactoryError::Unprepared("the image"));
        }
        let mut plan = config.plan(ctx);
        let runtime = LinuxRuntime::new_one_shot(config.runtime.clone())
            .map_err(LinuxFactoryError::Runtime)?;
        runtime
            .capabilities()
            .check(&plan)
            .map_err(|e| LinuxFactoryError::Runtime(StartError::Missing(e)))?;
        if let Some(w) = plan.workspace.take() {
            plan.workspace = Some(prepare_dir("workspace", &w)?);
        }
        if let Some(o) = plan.outputs.take() {
            plan.outputs = Some(prepare_dir("outputs", &o)?);
        }
        Ok((runtime, plan))
    }
}

fn invalid(key: &'static str, value: &str, reason: &str) -> LinuxFactoryError {
    LinuxFactoryError::InvalidEnv {
        key,
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// Creates a context directory if missing and returns its absolute, symlink-free path.
fn prepare_dir(what: &'static str, dir: &Path) -> Result<PathBuf, LinuxFactoryError> {
    let err = |source| LinuxFactoryError::Prepare {
        what,
        path: dir.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(err)?;
    std::fs::canonicalize(dir).map_err(err)
}

#[async_trait]
impl SandboxFactory for LinuxSandboxFactory {
    async fn create(
        &self,
        ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        Ok(Arc::new(self.create_port(ctx, env).await?))
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::image::ImageKind;
    use omabox_linux_sandbox::plan::{CpuLimit, RootfsSource};
    use std::time::Duration;

    pub(super) fn ctx() -> SandboxFactoryContext {
        SandboxFactoryContext {
            session_id: "s".into(),
            workdir: "/srv/ws".into(),
            memory_root: None,
            outputs_root: Some("/srv/out".into()),
        }
    }

    pub(super) fn env(pairs: &[(&str, &str)]) -> SandboxFactoryEnv {
        pairs.iter().copied().collect()
    }

    /// The parsed config of `env` and its plan for `ctx`.
    #[derive(Debug)]
    #[allow(dead_code)]
    struct Settings {
        config: LinuxSandboxConfig,
        plan: SandboxPlan,
        runtime: RuntimeConfig,
        exec_timeout: std::time::Duration,
        image: Option<PendingImage>,
    }

    impl LinuxSandboxFactory {
        fn settings(
            &self,
            ctx: &SandboxFactoryContext,
            env: &SandboxFactoryEnv,
        ) -> Result<Settings, LinuxFactoryError> {
            let config = self.config_from_env(env)?;
            Ok(Settings {
                plan: config.plan(ctx),
                runtime: config.runtime.clone(),
                exec_timeout: config.exec_timeout,
                image: config.pending_image().cloned(),
                config,
            })
        }
    }

    #[test]
    fn a_checked_runtime_is_taken_once_and_only_with_the_same_settings() {
        let f = LinuxSandboxFactory::new();
        let clone = f.clone();
        let config = RuntimeConfig {
            init_binary: Some("/bin/true".into()),
            ..RuntimeConfig::default()
        };
        let runtime = LinuxRuntime::new(config.clone()).unwrap();
        *f.checked.lock().unwrap() = Some(runtime.clone());
        let other = RuntimeConfig {
            cgroup_parent: "other".into(),
            ..config.clone()
        };
        assert!(
            clone.take_checked(&other).is_none(),
            "other settings probe anew"
        );
        *f.checked.lock().unwrap() = Some(runtime);
        assert!(clone.take_checked(&config).is_some(), "shared by clones");
        assert!(f.take_checked(&config).is_none(), "used once");
    }

    #[test]
    fn the_user_home_switch_reaches_the_plan() {
        let config = LinuxSandboxConfig::default();
        assert!(!config.plan(&ctx()).user_home);
        let config = LinuxSandboxConfig {
            user_home: true,
            ..LinuxSandboxConfig::default()
        };
        assert!(config.plan(&ctx()).user_home);
    }

    #[test]
    fn a_tmpfs_workspace_replaces_the_contexts_workdir() {
        let f = LinuxSandboxFactory::new();
        let s = f
            .settings(&ctx(), &env(&[(WORKSPACE_TMPFS_ENV, "1")]))
            .unwrap();
        assert_eq!((s.plan.workspace, s.plan.workspace_tmpfs), (None, true));
        let s = f
            .settings(&ctx(), &env(&[(WORKSPACE_TMPFS_ENV, "0")]))
            .unwrap();
        assert_eq!(
            (s.plan.workspace, s.plan.workspace_tmpfs),
            (Some("/srv/ws".into()), false)
        );
        assert!(
            f.settings(&ctx(), &env(&[(WORKSPACE_TMPFS_ENV, "yes")]))
                .is_err()
        );
        let mut plan = SandboxPlan::preinstalled("h");
        plan.workspace = Some("/srv/ws".into());
        plan.workspace_tmpfs = true;
        assert!(matches!(
            plan.validate(),
            Err(omabox_linux_sandbox::PlanError::TwoWorkspaces)
        ));
    }

    #[test]
    fn context_and_env_become_the_plan() {
        let f = LinuxSandboxFactory::new();
        let s = f
            .settings(
                &ctx(),
                &env(&[
                    (MEMORY_ENV, "1G"),
                    (PIDS_ENV, "100"),
                    (CPUS_ENV, "1.5"),
                    (RUNTIME_DIR_ENV, "/run/x"),
                    (CGROUP_PARENT_ENV, "omabox-x"),
                    (EXEC_TIMEOUT_ENV, "5000"),
                    ("E2B_API_KEY", "not read"),
                ]),
            )
            .unwrap();
        assert_eq!(s.plan.workspace, Some("/srv/ws".into()));
        assert_eq!(s.plan.outputs, Some("/srv/out".into()));
        assert_eq!(s.plan.rootfs, RootfsSource::Preinstalled);
        assert_eq!(s.plan.limits.memory_bytes, Some(1 << 30));
        assert_eq!(s.plan.limits.pids_max, Some(100));
        assert_eq!(
            s.plan.limits.cpu,
            Some(CpuLimit::Quota {
                quota_us: 150_000,
                period_us: 100_000
            })
        );
        assert_eq!(s.runtime.runtime_dir, PathBuf::from("/run/x"));
        assert_eq!(s.runtime.cgroup_parent, "omabox-x");
        assert_eq!(s.exec_timeout, Duration::from_secs(5));
        let s = f
            .settings(&ctx(), &env(&[(MEMORY_ENV, "unlimited")]))
            .unwrap();
        assert_eq!(s.plan.limits.memory_bytes, None);
        // A CPU quota by default; `unlimited` removes it.
        let s = f.settings(&ctx(), &env(&[])).unwrap();
        assert_eq!(s.plan.limits.cpu, Some(CpuLimit::default_quota()));
        let s = f
            .settings(&ctx(), &env(&[(CPUS_ENV, "unlimited")]))
            .unwrap();
        assert_eq!(s.plan.limits.cpu, None);
    }

    #[test]
    fn bad_values_name_the_key() {
        let f = LinuxSandboxFactory::new();
        for (key, value) in [
            (MEMORY_ENV, "huge"),
            (PIDS_ENV, "1"),
            (CPUS_ENV, "0"),
            (RUNTIME_DIR_ENV, "relative"),
            (CGROUP_PARENT_ENV, "../escape"),
            (EXEC_TIMEOUT_ENV, "-1"),
            (READONLY_BINDS_ENV, "relative:/opt/x"),
            (READONLY_BINDS_ENV, "/opt/x"),
            (READONLY_BINDS_ENV, "/a:/opt/../etc"),
        ] {
            let e = f.settings(&ctx(), &env(&[(key, value)])).unwrap_err();
            assert!(e.to_string().starts_with(key), "{e}");
        }
    }

    #[test]
    fn image_references_are_classified_without_unpacking() {
        let f = LinuxSandboxFactory::new().with_image_cache("/nonexistent/cache");
        let dir = tempfile::tempdir().unwrap();
        let s = f
            .settings(
                &ctx(),
                &env(&[(SANDBOX_IMAGE_ENV, dir.path().to_str().unwrap())]),
            )
            .unwrap();
        assert!(matches!(s.plan.rootfs, RootfsSource::Directory { .. }));
        assert!(s.image.is_none());

        // Named like a tarball but not one: refused by its bytes, not its name.
        let fake = dir.path().join("rootfs.tar");
        std::fs::write(&fake, b"hello").unwrap();
        let e = f
            .settings(&ctx(), &env(&[(IMAGE_ENV, fake.to_str().unwrap())]))
            .unwrap_err();
        assert!(e.to_string().contains("not a rootfs directory"), "{e}");

        // A real tar without the extension: pending, nothing unpacked, the cache untouched.
        let tarball = dir.path().join("rootfs");
        let mut b = tar::Builder::new(std::fs::File::create(&tarball).unwrap());
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, "etc/x", std::io::empty()).unwrap();
        b.finish().unwrap();
        drop(b);
        let s = f
            .settings(&ctx(), &env(&[(IMAGE_ENV, tarball.to_str().unwrap())]))
            .unwrap();
        let pending = s.image.as_ref().expect("pending image");
        assert_eq!(pending.kind, ImageKind::Tarball);
        assert_eq!(pending.cache_dir, Path::new("/nonexistent/cache"));
        assert_eq!(s.plan.rootfs, RootfsSource::Preinstalled);
        let s = f
            .settings(
                &ctx(),
                &env(&[
                    (IMAGE_ENV, tarball.to_str().unwrap()),
                    (IMAGE_CACHE_ENV, "/elsewhere"),
                ]),
            )
            .unwrap();
        assert_eq!(s.image.unwrap().cache_dir, Path::new("/elsewhere"));
        let e = f
            .settings(
                &ctx(),
                &env(&[
                    (IMAGE_ENV, tarball.to_str().unwrap()),
                    (IMAGE_CACHE_ENV, "relative"),
                ]),
            )
            .unwrap_err();
        assert!(e.to_string().starts_with(IMAGE_CACHE_ENV), "{e}");

        let oci = tempfile::tempdir().unwrap();
        std::fs::write(oci.path().join("oci-layout"), b"{}").unwrap();
        let s = f
            .settings(&ctx(), &env(&[(IMAGE_ENV, oci.path().to_str().unwrap())]))
            .unwrap();
        assert_eq!(s.image.unwrap().kind, ImageKind::OciLayout);

        // A registry reference: pending, parsed, nothing contacted.
        let s = f
            .settings(
                &ctx(),
                &env(&[
                    (IMAGE_ENV, "debian:12"),
                    (INSECURE_REGISTRIES_ENV, "reg.internal:5000"),
                    (DOCKER_CONFIG_ENV, "/etc/dockercfg"),
                ]),
            )
            .unwrap();
        let pending = s.image.unwrap();
        assert_eq!(pending.kind, ImageKind::Registry);
        let pull = pending.registry.unwrap();
        assert_eq!(pull.reference.canonical(), "docker.io/library/debian:12");
        assert_eq!(pull.insecure, vec!["reg.internal:5000".to_owned()]);
        assert_eq!(
            pull.docker_config.unwrap(),
            Path::new("/etc/dockercfg/config.json")
        );
        // Credentials the factory was given (the vault's) are asked before docker's file.
        let given = StaticCredentials(
            [(
                "docker.io".to_owned(),
                crate::image::RegistryCredential::new("u", "p"),
            )]
            .into(),
        );
        let s = f
            .clone()
            .with_registry_credentials(given.clone())
            .settings(&ctx(), &env(&[(IMAGE_ENV, "debian:12")]))
            .unwrap();
        let pull = s.image.unwrap().registry.unwrap();
        assert_eq!(pull.given, given);
        let found = pull.config().credentials.unwrap().credential("docker.io");
        assert_eq!(found.unwrap().unwrap().username, "u");
        let e = f
            .settings(&ctx(), &env(&[(IMAGE_ENV, "Bad Ref:1")]))
            .unwrap_err();
        assert!(e.to_string().starts_with(IMAGE_ENV), "{e}");
        assert!(e.to_string().contains("Bad Ref:1"), "{e}");

        let e = f
            .settings(&ctx(), &env(&[(IMAGE_ENV, "/no/such/rootfs")]))
            .unwrap_err();
        assert!(e.to_string().starts_with(IMAGE_ENV), "{e}");
    }

    /// The config's values come from the env handed in, never from the process: the init
    /// binary's search path is the map's `PATH` (absolute entries), and an image that needs
    /// a cache without one named (key or factory) is refused, not put in a cache derived
    /// from this process's `HOME` or `XDG_CACHE_HOME`.
    #[test]
    fn runtime_and_cache_come_from_the_env_given_not_the_process() {
        let f = LinuxSandboxFactory::new();
        let config = f
            .config_from_env(&env(&[(PATH_ENV, "/opt/omabox/bin:relative:/usr/bin")]))
            .unwrap();
        assert_eq!(
            config.runtime.init_search_path,
            [PathBuf::from("/opt/omabox/bin"), PathBuf::from("/usr/bin")]
        );
        let config = f.config_from_env(&env(&[])).unwrap();
        assert!(config.runtime.init_search_path.is_empty());

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oci-layout"), b"{}").unwrap();
        let image = dir.path().to_str().unwrap();
        let e = f.config_from_env(&env(&[(IMAGE_ENV, image)])).unwrap_err();
        assert!(e.to_string().starts_with(IMAGE_CACHE_ENV), "{e}");
        let config = f
            .clone()
            .with_image_cache("/srv/cache")
            .config_from_env(&env(&[(IMAGE_ENV, image)]))
            .unwrap();
        assert_eq!(
            config.pending_image().unwrap().cache_dir,
            Path::new("/srv/cache")
        );
    }

    /// A create takes prepared configs only: a pending image or layer is refused before
    /// anything is made (a create never pulls, resolves a tag or builds a layer).
    #[tokio::test]
    async fn create_refuses_an_unprepared_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("oci-layout"), b"{}").unwrap();
        let f = LinuxSandboxFactory::new().with_image_cache(dir.path().join("cache"));
        let config = f
            .config_from_env(&env(&[(IMAGE_ENV, dir.path().to_str().unwrap())]))
            .unwrap();
        assert!(!config.is_prepared());
        let e = f
            .create_port_with_config(&ctx(), &config)
            .await
            .unwrap_err();
        assert!(
            matches!(e, LinuxFactoryError::Unprepared("the image")),
            "{e}"
        );
        assert!(!dir.path().join("cache").exists(), "nothing unpacked");
        let e = f.prepare_one_shot(&ctx(), &config).unwrap_err();
        assert!(matches!(e, LinuxFactoryError::Unprepared(_)), "{e}");
    }
}
