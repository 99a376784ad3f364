//! [`LinuxSandboxConfig`]: the linux backend's typed settings, and the one parser of the
//! factory's env keys into them ([`LinuxSandboxFactory::config_from_env`], the
//! `SANDBOX_PROVIDER` tool-sandbox seam's; the node hands its own settings to the same
//! per-key parsers through [`LinuxSandboxFactory::config_from_lookup`], without a map).
//!
//! A config names its image and environment layer either as still to be prepared
//! ([`SandboxImage::Pending`], [`EnvLayerChoice::Pending`]) or as prepared (a cached tree
//! pinned to its digest and held, a built layer). `create` takes prepared ones only: the
//! preparation steps (`prepare_image`, `prepare_env_layer`) run before, where their
//! progress and failure can be shown.
//!
//! Must never touch the system while parsing (no unpacking, no pull, no probe; one
//! `stat` of an image path and of the host's CA bundle), nor print an env value of a key
//! it does not own.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use omabox_contract::networking::NetworkingConfig;
use omabox_linux_sandbox::RuntimeConfig;
use omabox_linux_sandbox::plan::{
    BindMount, CA_BUNDLE, CA_ENV, CpuLimit, IMAGE_CA_BUNDLE, Limits, RootfsSource, SandboxPlan,
};
use omabox_sandbox::{NODE_ENV, SandboxFactoryContext, SandboxFactoryEnv, TEST_MODE_ENV};

use super::image::{LeaseImage, PendingImage, RegistryPull, image_artifact, setting};
use super::{EnvLayerSetting, LinuxFactoryError, LinuxSandboxFactory, env::*, invalid};
use crate::image::{
    DockerConfig, ImageHold, ImageKind, RegistryConfig, RegistryReference, UnpackLimits,
};
use crate::port::DEFAULT_EXEC_TIMEOUT;

/// The root filesystem a sandbox starts from.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub enum SandboxImage {
    /// The host's `/usr`, `/bin`, `/lib*` read-only, with a generated `/etc`.
    #[default]
    Preinstalled,
    /// A local rootfs directory, used in place.
    Directory(PathBuf),
    /// A tarball, an OCI layout or a registry reference still to be unpacked (pulled):
    /// [`LinuxSandboxFactory::prepare_image`] makes it [`SandboxImage::Prepared`].
    Pending(Box<PendingImage>),
    /// An image in the cache, pinned to its digest and held from removal.
    Prepared(PreparedImage),
}

/// An image unpacked into the cache: its tree, what the lease records, and the hold that
/// keeps `image rm|prune` from removing it (held as long as this value, or a clone, lives:
/// from its resolution until the sandboxes made from it have recorded their roots).
#[derive(Debug, Clone)]
pub struct PreparedImage {
    /// Absolute, symlink-free path of the unpacked rootfs.
    pub rootfs_dir: PathBuf,
    /// The reference and the digest it resolved to, for the lease.
    pub lease: LeaseImage,
    /// The removal hold (`None`: nothing in the cache to hold).
    pub hold: Option<ImageHold>,
}

/// The environment layer over the image: still to be built, or built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvLayerChoice {
    /// To build (or find): [`LinuxSandboxFactory::prepare_env_layer`].
    Pending(EnvLayerSetting),
    /// Built: the layer's directory and the `ENV` its dockerfile set.
    Prepared(PreparedLayer),
}

/// A built environment layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedLayer {
    /// The layer's directory (in the image cache's `env-layers/`).
    pub dir: PathBuf,
    /// Variables its dockerfile's `ENV` set, for every process of the sandbox.
    pub env: BTreeMap<String, String>,
}

/// Where the omabox gateway listens, as the host reaches it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewaySetting {
    /// Its address.
    pub addr: SocketAddr,
    /// The host name the sandbox knows it by (its URL's host), answered with loopback.
    pub name: Option<String>,
}

/// The linux backend's typed settings: everything a sandbox is made from but the
/// factory context's directories.
#[derive(Debug, Clone)]
pub struct LinuxSandboxConfig {
    /// Where state dirs and cgroups go, and the init binary.
    pub runtime: RuntimeConfig,
    /// Memory, CPU and task limits (the rest of the plan's limits keep their defaults).
    pub limits: Limits,
    /// Default exec timeout of the port.
    pub exec_timeout: Duration,
    /// What the sandbox reaches besides its loopback.
    pub network: NetworkingConfig,
    /// The omabox gateway, reached at `127.0.0.1:PORT` inside.
    pub gateway: Option<GatewaySetting>,
    /// Host directories bound read-only: (host, sandbox).
    pub readonly_binds: Vec<(PathBuf, PathBuf)>,
    /// A writable tmpfs at `/mnt/memory`.
    pub memory_mount: bool,
    /// `/workspace` is a tmpfs of the sandbox's own, not the context's workdir.
    pub workspace_tmpfs: bool,
    /// The sandbox has the account `user` (uid 1000) with a tmpfs home at `/home/user`
    /// ([`SandboxPlan::user_home`]). Set by its caller (E2B sandboxes); no setting reads it.
    pub user_home: bool,
    /// The root filesystem.
    pub image: SandboxImage,
    /// The environment layer over the image.
    pub env_layer: Option<EnvLayerChoice>,
    /// Test mode only: `NAME=IP,...` the sandbox's network resolves first.
    pub test_hosts: Option<String>,
}

impl Default for LinuxSandboxConfig {
    fn default() -> Self {
        Self {
            runtime: RuntimeConfig::default(),
            limits: Limits::default(),
            exec_timeout: DEFAULT_EXEC_TIMEOUT,
            network: NetworkingConfig::None,
            gateway: None,
            readonly_binds: Vec::new(),
            memory_mount: false,
            workspace_tmpfs: false,
            user_home: false,
            image: SandboxImage::Preinstalled,
            env_layer: None,
            test_hosts: None,
        }
    }
}

impl LinuxSandboxConfig {
    /// Whether the root is an image (not the host's preinstalled one).
    pub fn has_image(&self) -> bool {
        !matches!(self.image, SandboxImage::Preinstalled)
    }

    /// The image still to be unpacked or pulled, if any.
    pub fn pending_image(&self) -> Option<&PendingImage> {
        match &self.image {
            SandboxImage::Pending(pending) => Some(pending),
            _ => None,
        }
    }

    /// What the lease records of the image (a prepared one).
    pub fn lease_image(&self) -> Option<LeaseImage> {
        match &self.image {
            SandboxImage::Prepared(image) => Some(image.lease.clone()),
            _ => None,
        }
    }

    /// Whether image and layer are prepared (`create` refuses anything else).
    pub fn is_prepared(&self) -> bool {
        !matches!(self.image, SandboxImage::Pending(_))
            && !matches!(self.env_layer, Some(EnvLayerChoice::Pending(_)))
    }

    /// The sandbox this config and `ctx` describe (a pending image counts as an image
    /// for the CA bundle, with the preinstalled root until prepared). Touches nothing but
    /// a `stat` of the host's CA bundle.
    pub fn plan(&self, ctx: &SandboxFactoryContext) -> SandboxPlan {
        let mut plan = SandboxPlan::preinstalled("sandbox");
        plan.limits.memory_bytes = self.limits.memory_bytes;
        plan.limits.cpu = self.limits.cpu;
        plan.limits.pids_max = self.limits.pids_max;
        match &self.image {
            SandboxImage::Preinstalled | SandboxImage::Pending(_) => {}
            SandboxImage::Directory(path) => {
                plan.rootfs = RootfsSource::Directory { path: path.clone() };
            }
            SandboxImage::Prepared(image) => {
                plan.rootfs = RootfsSource::Directory {
                    path: image.rootfs_dir.clone(),
                };
            }
        }
        if !self.has_image() {
            for key in CA_ENV {
                plan.env.insert((*key).to_owned(), CA_BUNDLE.to_owned());
            }
        } else if Path::new(CA_BUNDLE).is_file() {
            // An image's TLS clients trust what the host trusts (a network that inspects
            // TLS has its CA there): the host's bundle, read-only at its own path.
            plan.binds.push(BindMount {
                source: CA_BUNDLE.into(),
                target: IMAGE_CA_BUNDLE.into(),
                writable: false,
            });
            for key in CA_ENV {
                plan.env
                    .insert((*key).to_owned(), IMAGE_CA_BUNDLE.to_owned());
            }
        }
        plan.binds.extend(
            self.readonly_binds
                .iter()
                .map(|(source, target)| BindMount {
                    source: source.clone(),
                    target: target.clone(),
                    writable: false,
                }),
        );
        plan.memory_mount = self.memory_mount;
        plan.user_home = self.user_home;
        plan.network.config = self.network.clone();
        if let Some(gateway) = &self.gateway {
            plan.network.gateway = Some(gateway.addr);
            plan.network.gateway_name = gateway.name.clone();
        }
        if let Some(EnvLayerChoice::Prepared(layer)) = &self.env_layer {
            plan.root_layers.push(layer.dir.clone());
            plan.env.extend(layer.env.clone());
        }
        if self.workspace_tmpfs {
            plan.workspace_tmpfs = true;
        } else {
            plan.workspace = Some(ctx.workdir.clone());
        }
        plan.outputs = ctx.outputs_root.clone();
        plan
    }

    /// The resolver of the sandbox's network: the test hosts first, if any.
    pub(super) fn resolver(&self) -> Result<Arc<dyn omabox_egress::Resolver>, LinuxFactoryError> {
        Ok(match &self.test_hosts {
            Some(hosts) => Arc::new(
                omabox_egress::FixedNames::parse(hosts, Arc::new(omabox_egress::SystemResolver))
                    .map_err(|reason| invalid(TEST_HOSTS_ENV, hosts, &reason))?,
            ),
            None => Arc::new(omabox_egress::SystemResolver),
        })
    }
}

impl LinuxSandboxFactory {
    /// Parses the factory's env keys (the module doc's table) into a config: the
    /// `SANDBOX_PROVIDER` seam's one parser. Pure but for the `stat`s the module doc names.
    pub fn config_from_env(
        &self,
        env: &SandboxFactoryEnv,
    ) -> Result<LinuxSandboxConfig, LinuxFactoryError> {
        self.config_from_lookup(&|key| env.get(key))
    }

    /// [`config_from_env`](Self::config_from_env) over any source that answers a key's
    /// value (the node's settings, each under the variable it came from).
    pub fn config_from_lookup<'v>(
        &self,
        lookup: &dyn Fn(&str) -> Option<&'v str>,
    ) -> Result<LinuxSandboxConfig, LinuxFactoryError> {
        let nonempty = |key: &str| lookup(key).map(str::trim).filter(|v| !v.is_empty());
        let mut config = LinuxSandboxConfig {
            runtime: self.defaults.clone(),
            ..LinuxSandboxConfig::default()
        };
        if let Some(dir) = nonempty(RUNTIME_DIR_ENV) {
            if !Path::new(dir).is_absolute() {
                return Err(invalid(RUNTIME_DIR_ENV, dir, "must be an absolute path"));
            }
            config.runtime.runtime_dir = PathBuf::from(dir);
        }
        if let Some(parent) = nonempty(CGROUP_PARENT_ENV) {
            let ok = parent
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
                && !parent.starts_with('.');
            if !ok {
                return Err(invalid(
                    CGROUP_PARENT_ENV,
                    parent,
                    "must be one directory name of letters, digits, '-', '_' or '.'",
                ));
            }
            config.runtime.cgroup_parent = parent.to_owned();
        }
        if let Some(init) = nonempty(INIT_ENV) {
            config.runtime.init_binary = Some(PathBuf::from(init));
        }
        if let Some(path) = nonempty(PATH_ENV) {
            config.runtime.init_search_path = std::env::split_paths(path)
                .filter(|dir| dir.is_absolute())
                .collect();
        }
        let image_cache = || match nonempty(IMAGE_CACHE_ENV) {
            Some(dir) if Path::new(dir).is_absolute() => Ok(PathBuf::from(dir)),
            Some(dir) => Err(invalid(IMAGE_CACHE_ENV, dir, "must be an absolute path")),
            None => self.image_cache.clone().ok_or_else(|| {
                invalid(
                    IMAGE_CACHE_ENV,
                    "",
                    "is needed for this image: name the image cache directory",
                )
            }),
        };
        if let Some((key, image)) = nonempty(IMAGE_ENV)
            .map(|v| (IMAGE_ENV, v))
            .or_else(|| nonempty(SANDBOX_IMAGE_ENV).map(|v| (SANDBOX_IMAGE_ENV, v)))
        {
            config.image = match image_artifact(key, image)? {
                (ImageKind::Directory, path) => SandboxImage::Directory(path),
                (kind, path) => {
                    let registry = match kind {
                        ImageKind::Registry => Some(RegistryPull {
                            reference: RegistryReference::parse(image)
                                .map_err(|e| invalid(key, image, &e.to_string()))?,
                            insecure: nonempty(INSECURE_REGISTRIES_ENV)
                                .map(RegistryConfig::parse_insecure)
                                .unwrap_or_default(),
                            docker_config: DockerConfig::default_location(
                                nonempty(DOCKER_CONFIG_ENV),
                                nonempty(HOME_ENV),
                            )
                            .map(|d| d.path().to_path_buf()),
                            helper_path: nonempty(PATH_ENV).map(Into::into),
                            given: self.registry_credentials.clone(),
                            allowed_hosts: RegistryConfig::parse_allowed_hosts(nonempty(
                                ALLOWED_HOSTS_ENV,
                            ))
                            .map_err(setting)?,
                            timeouts: RegistryConfig::parse_timeouts(
                                nonempty(PULL_TIMEOUT_ENV),
                                nonempty(STALL_TIMEOUT_ENV),
                            )
                            .map_err(setting)?,
                        }),
                        _ => None,
                    };
                    let limits =
                        UnpackLimits::parse(nonempty(MAX_BYTES_ENV), nonempty(MAX_ENTRIES_ENV))
                            .map_err(setting)?;
                    SandboxImage::Pending(Box::new(PendingImage {
                        reference: image.to_owned(),
                        path,
                        kind,
                        cache_dir: image_cache()?,
                        limits,
                        registry,
                    }))
                }
            };
        }
        if let Some(memory) = nonempty(MEMORY_ENV) {
            config.limits.memory_bytes = if memory.eq_ignore_ascii_case("unlimited") {
                None
            } else {
                Some(parse_memory_size(memory).map_err(|r| invalid(MEMORY_ENV, memory, &r))?)
            };
        }
        if let Some(cpus) = nonempty(CPUS_ENV) {
            config.limits.cpu = if cpus.eq_ignore_ascii_case("unlimited") {
                None
            } else {
                Some(CpuLimit::millicpus(
                    parse_millicpus(cpus).map_err(|r| invalid(CPUS_ENV, cpus, &r))?,
                ))
            };
        }
        if let Some(pids) = nonempty(PIDS_ENV) {
            config.limits.pids_max = if pids.eq_ignore_ascii_case("unlimited") {
                None
            } else {
                match pids.parse::<u64>() {
                    // The agent itself is one task; fewer than 2 cannot run a command.
                    Ok(n) if n >= 2 => Some(n),
                    _ => {
                        return Err(invalid(
                            PIDS_ENV,
                            pids,
                            "must be an integer of at least 2, or `unlimited`",
                        ));
                    }
                }
            };
        }
        if let Some(ms) = nonempty(EXEC_TIMEOUT_ENV) {
            config.exec_timeout = match ms.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(invalid(
                        EXEC_TIMEOUT_ENV,
                        ms,
                        "must be a positive integer (milliseconds)",
                    ));
                }
            };
        }
        if let Some(binds) = nonempty(READONLY_BINDS_ENV) {
            config.readonly_binds = parse_readonly_binds(binds)
                .map_err(|reason| invalid(READONLY_BINDS_ENV, binds, &reason))?
                .into_iter()
                .map(|(source, target)| (source.into(), target.into()))
                .collect();
        }
        config.memory_mount = flag(MEMORY_MOUNT_ENV, nonempty(MEMORY_MOUNT_ENV))?;
        if let Some(network) = nonempty(NETWORK_ENV) {
            config.network = parse_networking(network)
                .map_err(|reason| invalid(NETWORK_ENV, network, &reason))?;
        }
        if let Some(gateway) = nonempty(GATEWAY_ENV) {
            let (addr, name) =
                parse_gateway(gateway).map_err(|reason| invalid(GATEWAY_ENV, gateway, &reason))?;
            config.gateway = Some(GatewaySetting { addr, name });
        }
        let test_mode = lookup(TEST_MODE_ENV) == Some("1") || lookup(NODE_ENV) == Some("test");
        config.test_hosts = match nonempty(TEST_HOSTS_ENV) {
            None => None,
            Some(_) if !test_mode => {
                return Err(invalid(
                    TEST_HOSTS_ENV,
                    "<set>",
                    "is honoured only in test mode (OMABOX_TEST_MODE=1)",
                ));
            }
            Some(hosts) => {
                omabox_egress::FixedNames::parse(hosts, Arc::new(omabox_egress::SystemResolver))
                    .map_err(|reason| invalid(TEST_HOSTS_ENV, hosts, &reason))?;
                Some(hosts.to_owned())
            }
        };
        if let Some(text) = nonempty(ENV_LAYER_ENV)
            && let Some(spec) =
                parse_env_layer(text).map_err(|reason| invalid(ENV_LAYER_ENV, text, &reason))?
        {
            let image_cache = match &config.image {
                SandboxImage::Pending(pending) => pending.cache_dir.clone(),
                SandboxImage::Directory(_) | SandboxImage::Prepared(_) => image_cache()?,
                SandboxImage::Preinstalled => {
                    return Err(invalid(
                        ENV_LAYER_ENV,
                        text,
                        "needs an image (OMABOX_LINUX_IMAGE or SANDBOX_IMAGE): the default root shows the host's /usr read-only",
                    ));
                }
            };
            config.env_layer = Some(EnvLayerChoice::Pending(EnvLayerSetting {
                spec,
                image_cache,
            }));
        }
        config.workspace_tmpfs = flag(WORKSPACE_TMPFS_ENV, nonempty(WORKSPACE_TMPFS_ENV))?;
        Ok(config)
    }
}

/// A `0`/`1` key.
fn flag(key: &'static str, value: Option<&str>) -> Result<bool, LinuxFactoryError> {
    match value {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(invalid(key, other, "must be 0 or 1")),
    }
}
