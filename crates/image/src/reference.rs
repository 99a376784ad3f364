//! What an image value names: an existing local path (a rootfs directory, tarball or OCI
//! image layout) or a registry reference (`node:22-slim`, `registry:5000/x@sha256:…`).
//! Must never guess: a value that is a path but does not exist is an error, not a
//! registry reference, and a registry reference is validated whole before anything
//! contacts a registry.

use std::path::{Path, PathBuf};

use oci_spec::distribution::Reference;

use crate::ImageError;
use crate::digest::is_sha256_hex;

/// An image value, classified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An existing local file or directory (absolute).
    Local(PathBuf),
    /// A registry reference.
    Registry(RegistryReference),
}

impl ImageSource {
    /// Classifies `value`: an existing path stays local; a value that looks like a path
    /// (absolute, or starting with `.`) must exist; anything else is parsed as a registry
    /// reference (docker's rules: `debian` is `docker.io/library/debian:latest`).
    pub fn parse(value: &str) -> Result<Self, ImageError> {
        let value = value.trim();
        let path = Path::new(value);
        if value.is_empty() {
            return Err(bad(value, "it is empty"));
        }
        if path.exists() {
            return Ok(Self::Local(
                std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()),
            ));
        }
        if path.is_absolute() || value.starts_with('.') || value.starts_with('~') {
            return Err(bad(value, "no such file or directory"));
        }
        RegistryReference::parse(value).map(Self::Registry)
    }
}

/// A parsed registry reference: registry, repository, tag and/or digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryReference {
    inner: Reference,
}

impl RegistryReference {
    /// Parses `name[:tag]`, `host[:port]/name[:tag]` or `…@sha256:<64 hex>`; a missing
    /// tag is `latest` (unless pinned by digest).
    pub fn parse(value: &str) -> Result<Self, ImageError> {
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(bad(value, "it contains whitespace or control characters"));
        }
        let inner = Reference::try_from(value).map_err(|e| bad(value, &e.to_string()))?;
        if let Some(digest) = inner.digest() {
            let ok = digest.strip_prefix("sha256:").is_some_and(is_sha256_hex);
            if !ok {
                return Err(bad(
                    value,
                    "the digest must be sha256:<64 lowercase hex digits>",
                ));
            }
        }
        Ok(Self { inner })
    }

    /// `host[:port]` as written (docker.io for Docker Hub).
    pub fn registry(&self) -> &str {
        self.inner.registry()
    }

    /// The repository (`library/debian`).
    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    /// The tag, if any.
    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The pinned digest (`sha256:<hex>`), if any.
    pub fn digest(&self) -> Option<&str> {
        self.inner.digest()
    }

    /// The canonical name: `registry/repository[:tag][@digest]`, the key of the
    /// cache's reference index.
    pub fn canonical(&self) -> String {
        self.inner.whole()
    }

    /// The host of the registry without its port (for loopback checks).
    pub fn host(&self) -> &str {
        host_of(self.inner.resolve_registry())
    }

    pub(crate) fn oci(&self) -> &Reference {
        &self.inner
    }
}

impl std::fmt::Display for RegistryReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.canonical())
    }
}

/// `host` of `host[:port]` (an IPv6 literal keeps its brackets off).
pub(crate) fn host_of(registry: &str) -> &str {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    registry.split(':').next().unwrap_or(registry)
}

fn bad(value: &str, reason: &str) -> ImageError {
    ImageError::BadReference {
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_names_default_like_docker() {
        let r = RegistryReference::parse("node:22-slim").unwrap();
        assert_eq!(r.canonical(), "docker.io/library/node:22-slim");
        let r = RegistryReference::parse("127.0.0.1:5000/x/y").unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "x/y");
        assert_eq!(r.tag(), Some("latest"));
        assert_eq!(r.host(), "127.0.0.1");
        let pinned = format!("registry:5000/x@sha256:{}", "a".repeat(64));
        let r = RegistryReference::parse(&pinned).unwrap();
        assert_eq!(r.digest().unwrap(), format!("sha256:{}", "a".repeat(64)));
    }

    #[test]
    fn bad_references_name_the_value() {
        for value in [
            "UPPER/Case",
            "a b",
            "x@sha256:abc",
            "x@md5:00",
            "::",
            "/no/such/path",
            "./nope",
        ] {
            let e = ImageSource::parse(value).unwrap_err();
            assert!(matches!(e, ImageError::BadReference { .. }), "{value}: {e}");
            assert!(e.to_string().contains(value), "{e}");
        }
    }
}
