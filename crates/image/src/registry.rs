//! Registry pulls: a [`RegistryReference`] resolved to an image manifest (an image index
//! picks linux and this host's architecture), its config and layers fetched with
//! omabox's own distribution client (`distribution.rs`: bearer-token and basic auth,
//! realms and redirects under `net_policy.rs`), every blob hashed and counted while it
//! streams into a temporary OCI image layout in the cache, then unpacked by the same code
//! as a local OCI layout (which verifies every blob a second time) and published by one
//! rename.
//!
//! Must never: cache anything of a pull that failed (a digest or size mismatch, a
//! broken connection, a deadline: the temporary layout is removed and nothing is
//! published); write more bytes of a blob than its descriptor says, or hold more than
//! [`MAX_JSON_BLOB`] of a manifest or config; run longer than [`PULL_TIMEOUT_ENV`] or
//! wait longer than [`STALL_TIMEOUT_ENV`] for progress; talk plain HTTP to a registry
//! that is not on loopback or listed in `OMABOX_INSECURE_REGISTRIES`; put a credential
//! into an error, a log line, the cache or its index.

use std::fs;
use std::io::Write as _;
use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest as _, Sha256};

use crate::credentials::{CredentialSource, DockerConfig, RegistryCredential};
use crate::digest::sha256_hex_of;
use crate::distribution::Session;
use crate::net_policy::{ALLOWED_HOSTS_ENV, AllowedHost, HostPolicy};
use crate::oci::{OciLayout, describe_platforms, fits_this_host, select_platform};
use crate::reference::host_of;
use crate::{
    ImageCache, ImageError, ImageKind, MAX_JSON_BLOB, MAX_LAYERS, RegistryReference, ResolvedImage,
    TempEntry,
};

/// Env key: registries (`host[:port]`, comma-separated) reached over plain HTTP besides
/// loopback ones.
pub const INSECURE_REGISTRIES_ENV: &str = "OMABOX_INSECURE_REGISTRIES";
/// Env key: seconds a whole pull (every request and download, not the unpack) may take.
pub const PULL_TIMEOUT_ENV: &str = "OMABOX_PULL_TIMEOUT";
/// Env key: seconds within which a response must start, and each of its bodies deliver
/// at least 1 KiB (or end).
pub const STALL_TIMEOUT_ENV: &str = "OMABOX_PULL_STALL_TIMEOUT";

const OCI_IMAGE_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_IMAGE_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
const IMAGE_MANIFEST_MEDIA_TYPE: &str = "application/vnd.docker.distribution.manifest.v2+json";
const IMAGE_MANIFEST_LIST_MEDIA_TYPE: &str =
    "application/vnd.docker.distribution.manifest.list.v2+json";

const ACCEPTED: &[&str] = &[
    OCI_IMAGE_MEDIA_TYPE,
    OCI_IMAGE_INDEX_MEDIA_TYPE,
    IMAGE_MANIFEST_MEDIA_TYPE,
    IMAGE_MANIFEST_LIST_MEDIA_TYPE,
];

/// How long a pull may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullTimeouts {
    /// The whole pull: manifests, token, blobs ([`PULL_TIMEOUT_ENV`]; default one hour).
    pub total: Duration,
    /// The stall window ([`STALL_TIMEOUT_ENV`]; default 60 s): a response must start
    /// within it, and its body deliver at least 1 KiB per window or end.
    pub stall: Duration,
}

impl Default for PullTimeouts {
    fn default() -> Self {
        Self {
            total: Duration::from_secs(3600),
            stall: Duration::from_secs(60),
        }
    }
}

/// How registries are reached.
#[derive(Debug, Clone, Default)]
pub struct RegistryConfig {
    /// Registries (`host[:port]`) reached over plain HTTP; loopback hosts always are.
    pub insecure: Vec<String>,
    /// Where credentials come from (none: anonymous).
    pub credentials: Option<Arc<dyn CredentialSource>>,
    /// Hosts registries may send a pull to besides themselves (token realms, blob
    /// redirects), beyond the built-in ones ([`AllowedHost::parse_list`]).
    pub allowed_hosts: Vec<AllowedHost>,
    /// The pull's deadline and stall window.
    pub timeouts: PullTimeouts,
    /// Names answered without DNS, like curl's `--resolve` (still under the address
    /// rule of `net_policy.rs`).
    pub fixed_names: Vec<(String, IpAddr)>,
}

impl RegistryConfig {
    /// From an environment: `OMABOX_INSECURE_REGISTRIES`,
    /// `OMABOX_REGISTRY_ALLOWED_HOSTS`, `OMABOX_PULL_TIMEOUT`,
    /// `OMABOX_PULL_STALL_TIMEOUT`, and docker's `config.json` (`DOCKER_CONFIG`, `HOME`)
    /// as the credential source, its helpers looked up in `PATH`. A malformed value is an
    /// error naming its key.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Self, ImageError> {
        let insecure = get(INSECURE_REGISTRIES_ENV)
            .map(|v| Self::parse_insecure(&v))
            .unwrap_or_default();
        let docker =
            DockerConfig::default_location(get("DOCKER_CONFIG").as_deref(), get("HOME").as_deref())
                .map(|docker| match get("PATH") {
                    Some(path) => docker.with_helper_path(path),
                    None => docker,
                });
        Ok(Self {
            insecure,
            credentials: docker.map(|d| Arc::new(d) as Arc<dyn CredentialSource>),
            allowed_hosts: Self::parse_allowed_hosts(get(ALLOWED_HOSTS_ENV).as_deref())?,
            timeouts: Self::parse_timeouts(
                get(PULL_TIMEOUT_ENV).as_deref(),
                get(STALL_TIMEOUT_ENV).as_deref(),
            )?,
            fixed_names: Vec::new(),
        })
    }

    /// `OMABOX_INSECURE_REGISTRIES`'s value: `host[:port]` entries separated by `,`.
    pub fn parse_insecure(value: &str) -> Vec<String> {
        value
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// `OMABOX_REGISTRY_ALLOWED_HOSTS`'s value (none: only the built-in entries).
    pub fn parse_allowed_hosts(value: Option<&str>) -> Result<Vec<AllowedHost>, ImageError> {
        value
            .map(|v| {
                AllowedHost::parse_list(v).map_err(|reason| ImageError::BadSetting {
                    key: ALLOWED_HOSTS_ENV,
                    value: v.to_owned(),
                    reason,
                })
            })
            .transpose()
            .map(Option::unwrap_or_default)
    }

    /// `OMABOX_PULL_TIMEOUT` and `OMABOX_PULL_STALL_TIMEOUT` (whole seconds > 0; unset:
    /// the defaults).
    pub fn parse_timeouts(
        total: Option<&str>,
        stall: Option<&str>,
    ) -> Result<PullTimeouts, ImageError> {
        let seconds = |key: &'static str, value: Option<&str>, default: Duration| match value
            .map(str::trim)
            .filter(|v| !v.is_empty())
        {
            None => Ok(default),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if n > 0 => Ok(Duration::from_secs(n)),
                _ => Err(ImageError::BadSetting {
                    key,
                    value: v.to_owned(),
                    reason: "must be a whole number of seconds greater than 0".into(),
                }),
            },
        };
        let defaults = PullTimeouts::default();
        Ok(PullTimeouts {
            total: seconds(PULL_TIMEOUT_ENV, total, defaults.total)?,
            stall: seconds(STALL_TIMEOUT_ENV, stall, defaults.stall)?,
        })
    }

    /// The same config with `source` asked for credentials (before what it had).
    pub fn with_credentials(mut self, source: Arc<dyn CredentialSource>) -> Self {
        self.credentials = Some(match self.credentials.take() {
            None => source,
            Some(old) => Arc::new(Chain(source, old)),
        });
        self
    }

    fn allows_http(&self, registry: &str) -> bool {
        let host = host_of(registry);
        host == "localhost"
            || host
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
            || self.insecure.iter().any(|r| r == registry || r == host)
    }
}

#[derive(Debug)]
struct Chain(Arc<dyn CredentialSource>, Arc<dyn CredentialSource>);

impl CredentialSource for Chain {
    fn credential(&self, registry: &str) -> Result<Option<RegistryCredential>, String> {
        match self.0.credential(registry)? {
            Some(c) => Ok(Some(c)),
            None => self.1.credential(registry),
        }
    }
}

/// What a pull reports as it goes (a progress bar, or one line per blob). Every method
/// has a default that does nothing.
pub trait PullProgress: Sync {
    /// The reference resolved to the image manifest `digest`.
    fn resolved(&self, _reference: &str, _digest: &str) {}
    /// A blob download starts.
    fn blob_started(&self, _digest: &str, _size: u64) {}
    /// `done` bytes of the blob arrived so far.
    fn blob_progress(&self, _digest: &str, _done: u64) {}
    /// The blob arrived and matched its digest.
    fn blob_finished(&self, _digest: &str) {}
    /// Unpacking starts.
    fn unpacking(&self, _digest: &str) {}
}

/// A [`PullProgress`] that reports nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoProgress;

impl PullProgress for NoProgress {}

/// The result of resolving a registry reference.
#[derive(Debug, Clone)]
pub struct PulledImage {
    /// The canonical reference (`registry/repository[:tag][@digest]`).
    pub reference: String,
    /// The image manifest's digest (`sha256:<hex>`): the cache entry.
    pub digest: String,
    /// The image index the manifest was picked from, if the reference named one.
    pub index_digest: Option<String>,
    /// The unpacked image (`unpacked`: this call unpacked it).
    pub image: ResolvedImage,
    /// Whether the registry was contacted (a pinned digest in the cache is not).
    pub contacted_registry: bool,
    /// Bytes of blobs downloaded.
    pub downloaded_bytes: u64,
}

/// A pull's temporary layout and the lock that marks it in use (dropped in this order).
struct PullLayout {
    layout: TempEntry,
    _lock: std::fs::File,
}

enum Fetched {
    Cached,
    Downloaded {
        layout: PullLayout,
        manifest: Box<Descriptor>,
        bytes: u64,
    },
}

impl ImageCache {
    /// The image `reference` names, pulled when the cache does not have it: a pinned
    /// digest in the cache is used without contacting the registry; a tag is resolved
    /// at the registry (once per call), and only blobs of a manifest the cache lacks
    /// are fetched. Blocking (runs its own I/O thread).
    pub fn resolve_registry(
        &self,
        reference: &RegistryReference,
        config: &RegistryConfig,
        progress: &dyn PullProgress,
    ) -> Result<PulledImage, ImageError> {
        if let Some(digest) = reference.digest()
            && let Some(hex) = self.cached_digest(digest)?
        {
            let image = self.fill(&hex, ImageKind::Registry, &reference.canonical(), |_| {
                Err(ImageError::NotCached(reference.canonical()))
            })?;
            // Not recorded again: a pin names what an earlier pull recorded.
            let index_digest = (digest != format!("sha256:{hex}")).then(|| digest.to_owned());
            return Ok(PulledImage {
                reference: reference.canonical(),
                digest: format!("sha256:{hex}"),
                index_digest,
                image,
                contacted_registry: false,
                downloaded_bytes: 0,
            });
        }
        self.pull(reference, config, progress)
    }

    /// Resolves `reference` at its registry and fetches and unpacks what the cache
    /// lacks. Blocking (runs its own I/O thread).
    pub fn pull(
        &self,
        reference: &RegistryReference,
        config: &RegistryConfig,
        progress: &dyn PullProgress,
    ) -> Result<PulledImage, ImageError> {
        self.pull_once(reference, config, progress, false)
    }

    fn pull_once(
        &self,
        reference: &RegistryReference,
        config: &RegistryConfig,
        progress: &dyn PullProgress,
        retried: bool,
    ) -> Result<PulledImage, ImageError> {
        self.prepare()?;
        let (manifest_hex, index_digest, fetched) = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .map_err(|e| ImageError::io(self.dir(), e))?;
                    let total = config.timeouts.total;
                    runtime.block_on(async {
                        tokio::time::timeout(total, self.fetch(reference, config, progress))
                            .await
                            .unwrap_or_else(|_| {
                                Err(registry_error(
                                    reference,
                                    format!(
                                        "the pull did not finish within {} s ({PULL_TIMEOUT_ENV})",
                                        total.as_secs()
                                    ),
                                ))
                            })
                    })
                })
                .join()
                .unwrap_or_else(|_| {
                    Err(registry_error(reference, "the pull thread panicked".into()))
                })
        })?;
        let canonical = reference.canonical();
        let digest = format!("sha256:{manifest_hex}");
        let (image, downloaded_bytes) = match fetched {
            Fetched::Cached => {
                let found = self.fill(&manifest_hex, ImageKind::Registry, &canonical, |_| {
                    Err(ImageError::NotCached(canonical.clone()))
                });
                match found {
                    Ok(image) => (image, 0),
                    // Removed since `fetch` saw it: pull it again, once.
                    Err(ImageError::NotCached(_)) if !retried => {
                        return self.pull_once(reference, config, progress, true);
                    }
                    Err(e) => return Err(e),
                }
            }
            Fetched::Downloaded {
                layout,
                manifest,
                bytes,
            } => {
                progress.unpacking(&digest);
                let oci = OciLayout::open(&layout.layout.path)?;
                let image =
                    self.fill(&manifest_hex, ImageKind::Registry, &canonical, |rootfs| {
                        oci.unpack(&manifest, rootfs, self.limits)
                    })?;
                drop(layout); // the downloaded blobs: the unpacked tree is what is kept
                (image, bytes)
            }
        };
        self.record_ref(&canonical, &digest, index_digest.as_deref())?;
        Ok(PulledImage {
            reference: canonical,
            digest,
            index_digest,
            image,
            contacted_registry: true,
            downloaded_bytes,
        })
    }

    async fn fetch(
        &self,
        reference: &RegistryReference,
        config: &RegistryConfig,
        progress: &dyn PullProgress,
    ) -> Result<(String, Option<String>, Fetched), ImageError> {
        let registry = reference.oci().resolve_registry().to_owned();
        tls_provider();
        let credential = match &config.credentials {
            Some(source) => source
                .credential(&registry)
                .map_err(|reason| registry_error(reference, format!("credentials: {reason}")))?,
            None => None,
        };
        let policy = Arc::new(HostPolicy::new(
            &registry,
            reference.registry(),
            !config.allows_http(&registry),
            &config.allowed_hosts,
            &config.insecure,
            &config.fixed_names,
        ));
        let mut session = Session::new(
            policy,
            &registry,
            reference.repository(),
            credential.clone(),
            config.timeouts,
        )
        .map_err(|reason| registry_error(reference, reason))?;
        let fail = |reason: String| registry_error(reference, reason);

        let tag_or_digest = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_owned();
        let top = session
            .manifest(&tag_or_digest, ACCEPTED, MAX_JSON_BLOB)
            .await
            .map_err(fail)?;
        let top_hex = hex::encode(Sha256::digest(&top));
        if let Some(pinned) = reference.digest()
            && pinned != format!("sha256:{top_hex}")
        {
            return Err(ImageError::DigestMismatch {
                expected: pinned.to_owned(),
                actual: format!("content hashes to sha256:{top_hex}"),
            });
        }
        let (manifest_bytes, manifest_desc, index_digest) = if is_index(&top) {
            let index: ImageIndex = serde_json::from_slice(&top)
                .map_err(|e| fail(format!("invalid image index: {e}")))?;
            let manifests: Vec<Descriptor> = index
                .manifests()
                .iter()
                .filter(|d| is_manifest_type(d.media_type()))
                .cloned()
                .collect();
            // Unlike a local layout's only manifest, a registry's is taken only when its
            // platform fits (or is not said): a foreign image would not run here.
            let fitting = manifests.iter().filter(|d| fits_this_host(d)).cloned();
            let desc = select_platform(fitting.collect()).map_err(|(platform, _)| {
                fail(format!(
                    "no image for {platform} (it has: {})",
                    describe_platforms(&manifests)
                ))
            })?;
            let hex = sha256_hex_of(&desc).map_err(fail)?;
            if desc.size() > MAX_JSON_BLOB {
                return Err(fail(format!(
                    "the index names a manifest of {} bytes, more than a manifest may be",
                    desc.size()
                )));
            }
            let bytes = session
                .manifest(&format!("sha256:{hex}"), ACCEPTED, MAX_JSON_BLOB)
                .await
                .map_err(fail)?;
            crate::oci::check_blob(
                &desc,
                &hex::encode(Sha256::digest(&bytes)),
                bytes.len() as u64,
            )?;
            (bytes, desc, Some(format!("sha256:{top_hex}")))
        } else {
            let media = media_type_of(&top).unwrap_or_else(|| OCI_IMAGE_MEDIA_TYPE.to_owned());
            let desc = Descriptor::new(
                MediaType::from(media.as_str()),
                top.len() as u64,
                format!("sha256:{top_hex}")
                    .parse::<oci_spec::image::Digest>()
                    .map_err(|e| fail(e.to_string()))?,
            );
            (top, desc, None)
        };
        let manifest_hex = sha256_hex_of(&manifest_desc).map_err(fail)?;
        progress.resolved(&reference.canonical(), &format!("sha256:{manifest_hex}"));
        if self.entry_dir(&manifest_hex).join("rootfs").is_dir() {
            return Ok((manifest_hex, index_digest, Fetched::Cached));
        }
        let manifest: ImageManifest = serde_json::from_slice(&manifest_bytes)
            .map_err(|e| fail(format!("invalid image manifest: {e}")))?;
        check_manifest(&manifest).map_err(fail)?;

        // A temporary OCI image layout holding exactly this manifest and its blobs, under
        // a shared lock so `sweep_temps` knows it is in use (`locks.rs`).
        let lock = self.lock_shared(&format!("pull-{manifest_hex}"))?;
        let layout = TempEntry::create(&self.dir().join("tmp"), &format!("pull-{manifest_hex}"))?;
        let blobs = layout.path.join("blobs/sha256");
        fs::create_dir_all(&blobs).map_err(|e| ImageError::write(&blobs, e))?;
        write_file(
            &layout.path.join("oci-layout"),
            br#"{"imageLayoutVersion":"1.0.0"}"#,
        )?;
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": OCI_IMAGE_INDEX_MEDIA_TYPE,
            "manifests": [manifest_desc],
        });
        write_file(
            &layout.path.join("index.json"),
            index.to_string().as_bytes(),
        )?;
        write_file(&blobs.join(&manifest_hex), &manifest_bytes)?;
        let mut bytes = 0;
        for desc in std::iter::once(manifest.config()).chain(manifest.layers()) {
            bytes += fetch_blob(
                &mut session,
                desc,
                &blobs,
                progress,
                reference,
                credential.as_ref(),
            )
            .await?;
        }
        Ok((
            manifest_hex,
            index_digest,
            Fetched::Downloaded {
                layout: PullLayout {
                    layout,
                    _lock: lock,
                },
                manifest: Box::new(manifest_desc),
                bytes,
            },
        ))
    }
}

/// What a manifest must be before any of its blobs is fetched: a config no larger than
/// a JSON blob may be, at most [`MAX_LAYERS`] layers, sha256 digests only.
fn check_manifest(manifest: &ImageManifest) -> Result<(), String> {
    if manifest.config().size() > MAX_JSON_BLOB {
        return Err(format!(
            "the image config is {} bytes, more than {} MiB: refused",
            manifest.config().size(),
            MAX_JSON_BLOB >> 20
        ));
    }
    if manifest.layers().len() > MAX_LAYERS {
        return Err(format!(
            "the image has {} layers, more than {MAX_LAYERS}: refused",
            manifest.layers().len()
        ));
    }
    for desc in std::iter::once(manifest.config()).chain(manifest.layers()) {
        sha256_hex_of(desc)?;
    }
    Ok(())
}

/// Streams one blob into `<dir>/<hex>`, hashing and counting; refuses more bytes than
/// the descriptor's size and a digest mismatch. Returns the bytes written.
async fn fetch_blob(
    session: &mut Session,
    desc: &Descriptor,
    dir: &Path,
    progress: &dyn PullProgress,
    reference: &RegistryReference,
    credential: Option<&RegistryCredential>,
) -> Result<u64, ImageError> {
    let hex = sha256_hex_of(desc).map_err(|r| registry_error(reference, r))?;
    let path = dir.join(&hex);
    if path.exists() {
        return Ok(0); // the same blob twice in one manifest
    }
    let digest = desc.digest().to_string();
    let size = desc.size();
    progress.blob_started(&digest, size);
    let (mut response, mut window) = session
        .blob(&digest)
        .await
        .map_err(|e| registry_error(reference, e))?;
    if response.content_length().is_some_and(|len| len > size) {
        return Err(ImageError::DigestMismatch {
            expected: digest,
            actual: format!(
                "the registry announces {} bytes, more than its {size} bytes",
                response.content_length().unwrap_or_default()
            ),
        });
    }
    let part = dir.join(format!("{hex}.part"));
    let mut file = std::io::BufWriter::with_capacity(
        256 << 10,
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&part)
            .map_err(|e| ImageError::write(&part, e))?,
    );
    let mut hasher = Sha256::new();
    let mut len: u64 = 0;
    let mut stream_error = None;
    loop {
        let chunk = match session.chunk(&mut response, &mut window).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(e) => {
                stream_error = Some(e);
                break;
            }
        };
        len += chunk.len() as u64;
        if len > size {
            return Err(ImageError::DigestMismatch {
                expected: digest,
                actual: format!("more than its {size} bytes"),
            });
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .map_err(|e| ImageError::write(&part, e))?;
        progress.blob_progress(&digest, len);
    }
    let actual = hex::encode(hasher.finalize());
    // A complete blob that hashes wrong was tampered with; a short one after a broken
    // connection is a transfer error.
    if stream_error.is_none() || len >= size {
        crate::oci::check_blob(desc, &actual, len)?;
    }
    if let Some(e) = stream_error {
        return Err(registry_error(
            reference,
            format!(
                "blob {digest}: {}",
                crate::distribution::scrub(&e, credential)
            ),
        ));
    }
    file.flush().map_err(|e| ImageError::write(&part, e))?;
    drop(file);
    fs::rename(&part, &path).map_err(|e| ImageError::write(&path, e))?;
    progress.blob_finished(&digest);
    Ok(len)
}

/// Makes ring rustls's process-wide default crypto provider, unless one is installed
/// already: reqwest builds its TLS client from that default (see Cargo.toml for why not
/// aws-lc).
fn tls_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Err: another thread installed one meanwhile, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), ImageError> {
    fs::write(path, bytes).map_err(|e| ImageError::write(path, e))
}

fn media_type_of(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Versioned {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
    }
    let v: Versioned = serde_json::from_slice(bytes).ok()?;
    v.media_type.or_else(|| {
        v.manifests
            .is_some()
            .then(|| OCI_IMAGE_INDEX_MEDIA_TYPE.to_owned())
    })
}

fn is_index(bytes: &[u8]) -> bool {
    matches!(
        media_type_of(bytes).as_deref(),
        Some(OCI_IMAGE_INDEX_MEDIA_TYPE | IMAGE_MANIFEST_LIST_MEDIA_TYPE)
    )
}

fn is_manifest_type(media: &MediaType) -> bool {
    match media {
        MediaType::ImageManifest => true,
        MediaType::Other(m) => m == IMAGE_MANIFEST_MEDIA_TYPE,
        _ => false,
    }
}

fn registry_error(reference: &RegistryReference, reason: String) -> ImageError {
    ImageError::Registry {
        reference: reference.canonical(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_settings_come_from_the_env_or_name_the_bad_key() {
        let config = RegistryConfig::from_env(|key| match key {
            PULL_TIMEOUT_ENV => Some("120".into()),
            STALL_TIMEOUT_ENV => Some(" 5 ".into()),
            ALLOWED_HOSTS_ENV => Some("registry.gitlab.com=gitlab.com".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!(config.timeouts.total, Duration::from_secs(120));
        assert_eq!(config.timeouts.stall, Duration::from_secs(5));
        assert_eq!(config.allowed_hosts.len(), 1);
        let defaults = RegistryConfig::from_env(|_| None).unwrap();
        assert_eq!(defaults.timeouts, PullTimeouts::default());
        for (key, value) in [
            (PULL_TIMEOUT_ENV, "0"),
            (STALL_TIMEOUT_ENV, "soon"),
            (ALLOWED_HOSTS_ENV, "gitlab.com"),
        ] {
            let e = RegistryConfig::from_env(|k| (k == key).then(|| value.to_owned()))
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains(value), "{e}");
        }
    }
}
