//! The image part of the factory's settings: the artifact or registry reference the env
//! names, checked (never unpacked) by the config parser, and resolved into the image cache by
//! `prepare_image`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{IMAGE_ENV, LinuxFactoryError, invalid};
use crate::image::{
    AllowedHost, CredentialSource, DockerConfig, ImageCache, ImageError, ImageKind, NoProgress,
    PullProgress, PullTimeouts, RegistryConfig, RegistryReference, ResolvedImage,
    StaticCredentials, UnpackLimits,
};

/// An image artifact named by the env, checked but not unpacked yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingImage {
    /// The env value (for messages).
    pub reference: String,
    /// Its absolute path (empty for a registry image).
    pub path: PathBuf,
    /// A tarball, an OCI layout or a registry image.
    pub kind: ImageKind,
    /// The cache it is unpacked into.
    pub cache_dir: PathBuf,
    /// `OMABOX_IMAGE_MAX_BYTES`, `OMABOX_IMAGE_MAX_ENTRIES`.
    pub limits: UnpackLimits,
    /// For a registry image: where to pull it from, and how.
    pub registry: Option<RegistryPull>,
}

/// A registry image still to be resolved: the reference and how to reach its registry
/// (plain data: the credentials stay in docker's file until the pull reads them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryPull {
    /// The parsed reference.
    pub reference: RegistryReference,
    /// `OMABOX_INSECURE_REGISTRIES`.
    pub insecure: Vec<String>,
    /// Docker's `config.json`, if `DOCKER_CONFIG` or `HOME` says where.
    pub docker_config: Option<PathBuf>,
    /// Where the file's credential helpers are looked up (`PATH`).
    pub helper_path: Option<std::ffi::OsString>,
    /// Credentials the factory was given ([`LinuxSandboxFactory::with_registry_credentials`]),
    /// asked before docker's file.
    pub given: StaticCredentials,
    /// `OMABOX_REGISTRY_ALLOWED_HOSTS`.
    pub allowed_hosts: Vec<AllowedHost>,
    /// `OMABOX_PULL_TIMEOUT`, `OMABOX_PULL_STALL_TIMEOUT`.
    pub timeouts: PullTimeouts,
}

impl RegistryPull {
    pub(super) fn config(&self) -> RegistryConfig {
        RegistryConfig {
            insecure: self.insecure.clone(),
            credentials: self.docker_config.as_ref().map(|path| {
                let docker = DockerConfig::at(path);
                let docker = match &self.helper_path {
                    Some(search) => docker.with_helper_path(search.clone()),
                    None => docker,
                };
                Arc::new(docker) as Arc<dyn CredentialSource>
            }),
            allowed_hosts: self.allowed_hosts.clone(),
            timeouts: self.timeouts,
            fixed_names: Vec::new(),
        }
        .with_credentials(Arc::new(self.given.clone()))
    }
}

/// What image a sandbox was made from, as its lease records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseImage {
    /// The reference as configured (canonical for a registry image).
    pub reference: String,
    /// `sha256:<hex>` of the tarball or image manifest it resolved to (a tag's digest at
    /// this acquire).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

impl PendingImage {
    /// Unpacks the image into its cache unless it is there already (a registry image is
    /// resolved at its registry first, unless pinned and cached). Blocking.
    pub fn resolve(&self) -> Result<ResolvedImage, LinuxFactoryError> {
        self.resolve_with(&NoProgress)
    }

    /// [`resolve`](Self::resolve), telling `progress` about a registry pull.
    pub fn resolve_with(
        &self,
        progress: &dyn PullProgress,
    ) -> Result<ResolvedImage, LinuxFactoryError> {
        let cache = ImageCache::new(&self.cache_dir).with_limits(self.limits);
        let resolved = match &self.registry {
            Some(pull) => cache
                .resolve_registry(&pull.reference, &pull.config(), progress)
                .map(|pulled| pulled.image),
            None => cache.resolve(&self.path),
        };
        resolved.map_err(|source| LinuxFactoryError::Image {
            image: self.reference.clone(),
            source,
        })
    }

    /// The lease's record of this image once resolved.
    pub fn lease_image(&self, resolved: &ResolvedImage) -> LeaseImage {
        LeaseImage {
            reference: match &self.registry {
                Some(pull) => pull.reference.canonical(),
                None => self.reference.clone(),
            },
            digest: resolved.digest.clone(),
        }
    }
}

/// A registry setting the image crate refused.
pub(super) fn setting(e: ImageError) -> LinuxFactoryError {
    match e {
        ImageError::BadSetting { key, value, reason } => invalid(key, &value, &reason),
        other => invalid(IMAGE_ENV, "", &other.to_string()),
    }
}

/// What an image reference names: its kind and absolute, symlink-free path. Looks at
/// the file's type and first bytes only; nothing is unpacked here.
pub(super) fn image_artifact(
    key: &'static str,
    image: &str,
) -> Result<(ImageKind, PathBuf), LinuxFactoryError> {
    let path = Path::new(image);
    if !path.is_absolute() {
        if image.starts_with('.') {
            return Err(invalid(
                key,
                image,
                "a local image must be an absolute path (of a rootfs directory, rootfs tarball or OCI image layout)",
            ));
        }
        // Anything else is a registry reference; parsed (not pulled) here.
        RegistryReference::parse(image).map_err(|e| invalid(key, image, &e.to_string()))?;
        return Ok((ImageKind::Registry, PathBuf::new()));
    }
    let kind = ImageKind::detect(path).map_err(|e| match e {
        ImageError::Read { source, .. } => {
            invalid(key, image, &format!("cannot use it as an image: {source}"))
        }
        e => invalid(key, image, &e.to_string()),
    })?;
    let abs = std::fs::canonicalize(path)
        .map_err(|e| invalid(key, image, &format!("cannot resolve it: {e}")))?;
    Ok((kind, abs))
}
