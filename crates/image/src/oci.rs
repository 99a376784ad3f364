//! OCI image layouts: index → manifest for this platform → layers, every blob checked
//! against its descriptor before it is used. Must never parse an unverified JSON blob or
//! read one without a size limit, nor name a blob path from anything but a checked
//! sha256 hex digest.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::image::{Arch, Descriptor, ImageIndex, ImageManifest, MediaType, Os};
use sha2::{Digest as _, Sha256};

use super::digest::{HashingReader, sha256_hex_of};
use super::limits::UnpackLimits;
use super::unpack::{Unpacker, tar_stream};
use super::{ImageError, MAX_INDEX_DEPTH, MAX_JSON_BLOB, MAX_LAYERS};

/// The manifest for this host (linux and the host's architecture), or the only one.
/// `Err((platform looked for, what there is))`.
pub(super) fn select_platform(
    mut manifests: Vec<Descriptor>,
) -> Result<Descriptor, (String, String)> {
    if manifests.len() == 1 {
        return Ok(manifests.remove(0));
    }
    let arch = Arch::default();
    let matching = manifests.iter().find(|d| {
        d.platform()
            .as_ref()
            .is_some_and(|p| *p.os() == Os::Linux && *p.architecture() == arch)
    });
    match matching {
        Some(d) => Ok(d.clone()),
        None => Err((format!("linux/{arch}"), describe_platforms(&manifests))),
    }
}

/// Whether a descriptor may be this host's image: linux on this architecture, or no
/// platform said.
pub(super) fn fits_this_host(desc: &Descriptor) -> bool {
    desc.platform()
        .as_ref()
        .is_none_or(|p| *p.os() == Os::Linux && *p.architecture() == Arch::default())
}

/// `os/arch, …` of `manifests`, for messages.
pub(super) fn describe_platforms(manifests: &[Descriptor]) -> String {
    if manifests.is_empty() {
        return "no image manifests".into();
    }
    manifests
        .iter()
        .map(|d| match d.platform() {
            Some(p) => format!("{}/{}", p.os(), p.architecture()),
            None => "unknown platform".into(),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------
// OCI image layout

pub(super) struct OciLayout {
    dir: PathBuf,
}

impl OciLayout {
    pub(super) fn open(dir: &Path) -> Result<Self, ImageError> {
        let layout = Self {
            dir: dir.to_path_buf(),
        };
        let marker = dir.join("oci-layout");
        let text = read_limited(&marker, MAX_JSON_BLOB)?;
        let version = serde_json::from_slice::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("imageLayoutVersion")?.as_str().map(str::to_owned))
            .ok_or_else(|| layout.invalid("oci-layout has no imageLayoutVersion".into()))?;
        if !version.starts_with("1.") {
            return Err(layout.invalid(format!(
                "image layout version {version} is not supported (1.x is)"
            )));
        }
        Ok(layout)
    }

    pub(super) fn invalid(&self, reason: String) -> ImageError {
        ImageError::InvalidLayout {
            path: self.dir.clone(),
            reason,
        }
    }

    /// The manifest for this host (linux and the host's architecture), or the only
    /// manifest there is. Nested indexes are followed.
    pub(super) fn select_manifest(&self) -> Result<Descriptor, ImageError> {
        let index_path = self.dir.join("index.json");
        let text = read_limited(&index_path, MAX_JSON_BLOB)?;
        let index: ImageIndex =
            serde_json::from_slice(&text).map_err(|e| self.invalid(format!("index.json: {e}")))?;
        let mut manifests = Vec::new();
        self.collect_manifests(&index, 0, &mut manifests)?;
        select_platform(manifests).map_err(|(platform, available)| ImageError::NoManifest {
            path: self.dir.clone(),
            platform,
            available,
        })
    }

    pub(super) fn collect_manifests(
        &self,
        index: &ImageIndex,
        depth: usize,
        out: &mut Vec<Descriptor>,
    ) -> Result<(), ImageError> {
        for desc in index.manifests() {
            match desc.media_type() {
                MediaType::ImageManifest => out.push(desc.clone()),
                MediaType::Other(m)
                    if m == "application/vnd.docker.distribution.manifest.v2+json" =>
                {
                    out.push(desc.clone());
                }
                MediaType::ImageIndex => {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(self.invalid("image indexes nest too deeply".into()));
                    }
                    let nested: ImageIndex = self.read_json(desc)?;
                    self.collect_manifests(&nested, depth + 1, out)?;
                }
                MediaType::Other(m)
                    if m == "application/vnd.docker.distribution.manifest.list.v2+json" =>
                {
                    if depth >= MAX_INDEX_DEPTH {
                        return Err(self.invalid("image indexes nest too deeply".into()));
                    }
                    let nested: ImageIndex = self.read_json(desc)?;
                    self.collect_manifests(&nested, depth + 1, out)?;
                }
                // Artifacts, signatures, attestations: not images.
                _ => {}
            }
        }
        Ok(())
    }

    pub(super) fn blob_path(&self, desc: &Descriptor) -> Result<PathBuf, ImageError> {
        let hex = sha256_hex_of(desc).map_err(|r| self.invalid(r))?;
        Ok(self.dir.join("blobs/sha256").join(hex))
    }

    /// Reads a small JSON blob, checks its size and digest, then parses it.
    pub(super) fn read_json<T: serde::de::DeserializeOwned>(
        &self,
        desc: &Descriptor,
    ) -> Result<T, ImageError> {
        let path = self.blob_path(desc)?;
        if desc.size() > MAX_JSON_BLOB {
            return Err(self.invalid(format!(
                "blob {} is {} bytes, more than a manifest may be",
                desc.digest(),
                desc.size()
            )));
        }
        let bytes = read_limited(&path, MAX_JSON_BLOB)?;
        let actual = hex::encode(Sha256::digest(&bytes));
        check_blob(desc, &actual, bytes.len() as u64)?;
        serde_json::from_slice(&bytes)
            .map_err(|e| self.invalid(format!("blob {}: {e}", desc.digest())))
    }

    pub(super) fn unpack(
        &self,
        manifest_desc: &Descriptor,
        rootfs: &Path,
        limits: UnpackLimits,
    ) -> Result<(), ImageError> {
        let manifest: ImageManifest = self.read_json(manifest_desc)?;
        if manifest.layers().len() > MAX_LAYERS {
            return Err(ImageError::Limit(format!(
                "the image has {} layers, more than {MAX_LAYERS}",
                manifest.layers().len()
            )));
        }
        let mut unpacker = Unpacker::new(rootfs, limits);
        for (i, layer) in manifest.layers().iter().enumerate() {
            let context = format!("layer {} ({})", i + 1, layer.digest());
            match layer.media_type() {
                MediaType::ImageLayerZstd | MediaType::ImageLayerNonDistributableZstd => {
                    return Err(ImageError::Unsupported(format!(
                        "{context} is zstd-compressed; only plain and gzip-compressed layers are supported"
                    )));
                }
                _ => {}
            }
            let path = self.blob_path(layer)?;
            let file = File::open(&path).map_err(|e| ImageError::io(&path, e))?;
            let mut hashing = HashingReader::new(file);
            let applied = tar_stream(&mut hashing, &|| context.clone())
                .and_then(|stream| unpacker.apply(stream, true, &context));
            // A blob that does not match its digest is reported as such, even when its
            // bytes also failed to unpack: tampering is the cause worth naming.
            let (actual, len) = hashing.finish().map_err(|e| ImageError::io(&path, e))?;
            check_blob(layer, &actual, len)?;
            applied?;
            crate::fault::point("image-unpack-layer");
        }
        unpacker.finish()
    }
}

pub(super) fn check_blob(desc: &Descriptor, actual_hex: &str, len: u64) -> Result<(), ImageError> {
    let expected = desc.digest().to_string();
    if desc.digest().digest() != actual_hex {
        return Err(ImageError::DigestMismatch {
            expected,
            actual: format!("content hashes to sha256:{actual_hex}"),
        });
    }
    if desc.size() != len {
        return Err(ImageError::DigestMismatch {
            expected,
            actual: format!("{len} bytes, not {}", desc.size()),
        });
    }
    Ok(())
}

pub(super) fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, ImageError> {
    let file = File::open(path).map_err(|e| ImageError::io(path, e))?;
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| ImageError::io(path, e))?;
    if bytes.len() as u64 > limit {
        return Err(ImageError::Unsupported(format!(
            "{} is larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}
