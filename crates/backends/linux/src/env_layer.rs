//! Environment layers: an environment's apt packages and dockerfile steps (`RUN`, `ENV`,
//! `WORKDIR`: [`omabox_sandbox::dockerfile`]) run once, kept as a read-only overlay layer
//! over its image, so later sandboxes of the environment start with them.
//!
//! ```text
//! key   = sha256("omabox-env-layer-v2" · image rootfs dir (+ its and its dpkg status'
//!                inode and mtime) · apt list · dockerfile)
//! <cache>/env-layers/<key>/        the layer (an overlay upper dir: whiteouts, opaque dirs)
//! <cache>/env-layers/<key>.lock    held while one host builds it
//! <cache>/env-layers/<key>.base    the image dir it belongs to (`prune_orphans`)
//! <cache>/env-layers/.partial-<key>  a build in progress (a crashed build's is removed by
//!                                    the next build, once nobody holds its key's lock)
//! ```
//!
//! A build starts a sandbox on the image whose overlay upper layer is a host directory
//! (`SandboxPlan::root_upper`), runs the installer's apt script
//! ([`EnvironmentPackages::apt_layer_script`], which also writes the layer's marker), then
//! the dockerfile's steps, and destroys it (which waits until no process of it is left).
//! The host then reaches the upper dir only through directory fds that follow nothing
//! (`walk`): it removes the sandbox's own `/etc/{resolv.conf,hostname,hosts}`, then checks
//! the whole tree and makes it the layer's own (`normalize`: owners in the build sandbox's
//! id range shifted down to `0..65536`, as the layer is idmapped like the image when used;
//! only directories, regular files, symlinks and overlay whiteouts; no hard link out of it;
//! extended attributes kept, shifted or removed; at most [`MAX_LAYER_BYTES`],
//! [`MAX_LAYER_ENTRIES`] entries, [`MAX_LAYER_DEPTH`] levels). Then it is renamed into
//! place. A sandbox of the environment gets the layer as `SandboxPlan::root_layers` and the
//! dockerfile's `ENV` in its environment; the installer finds the marker and skips apt.
//!
//! The build runs only the host's own script, yet the packages' maintainer scripts are
//! code from the network: the build is a sandbox like any other (its policy admits the
//! package registries), and its upper layer on disk is bounded only by the walk's limit
//! after the fact (SECURITY.md).

mod normalize;
mod walk;

use std::io;
use std::os::fd::AsFd as _;
use std::os::unix::ffi::OsStringExt as _;
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use omabox_agent::client::{ExecRequest, WriteOptions};
use omabox_sandbox::dockerfile::{COPY_STAGING, Dockerfile};
use omabox_sandbox::packages::EnvironmentPackages;
use sha2::{Digest, Sha256};

use crate::port::LinuxSandboxPort;
use omabox_linux_sandbox::LinuxRuntime;
use omabox_linux_sandbox::plan::{RootfsSource, SandboxPlan};

/// Largest file a `COPY` takes.
const MAX_COPY_BYTES: u64 = 64 << 20;
/// Largest layer kept (bytes of regular files).
pub const MAX_LAYER_BYTES: u64 = 4 << 30;
/// Most entries in a layer.
pub const MAX_LAYER_ENTRIES: u64 = 1 << 20;
/// Deepest directory nesting in a layer (the walk holds one fd per level).
pub const MAX_LAYER_DEPTH: usize = 256;
/// What the walks of a layer take.
const LAYER_LIMITS: walk::Limits = walk::Limits {
    entries: MAX_LAYER_ENTRIES,
    depth: MAX_LAYER_DEPTH,
};
/// How long the apt script may run.
const BUILD_TIMEOUT: Duration = Duration::from_secs(600);
/// How much of a failed build's output the error keeps.
const ERROR_TAIL_CHARS: usize = 300;

/// Why a layer could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EnvLayerError {
    /// The image is not a rootfs directory.
    #[error("environment layer: {0}")]
    Unsupported(String),
    /// The apt script or a dockerfile step failed in the build sandbox.
    #[error("environment layer: build_failed exit={code}: {tail}")]
    Install {
        /// Its exit code (or signal name).
        code: String,
        /// The end of its output, one line without control characters.
        tail: String,
    },
    /// The build sandbox wrote something a layer may not hold, or too much.
    #[error("environment layer: refused: {0}")]
    Refused(String),
    /// The build sandbox could not be run.
    #[error("environment layer: build sandbox: {0}")]
    Sandbox(String),
    /// Host I/O on the cache.
    #[error("environment layer: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: io::Error,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> EnvLayerError {
    let what = what.into();
    move |source| EnvLayerError::Io { what, source }
}

/// What a layer holds: apt packages, dockerfile steps, or both.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LayerSpec {
    /// The apt list (the other package lists are ignored).
    pub packages: EnvironmentPackages,
    /// `config.dockerfile`'s text, parsed when the spec is made.
    pub dockerfile: Option<(String, Dockerfile)>,
    /// The files its `COPY` steps take, by file-store id.
    pub files: BTreeMap<String, CopyFile>,
}

/// A file a dockerfile's `COPY` takes: where the host has it, and its hash (part of the
/// layer's key; checked again when it is staged).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct CopyFile {
    /// The host file (omabox's file store keeps each id's bytes in a file of its own).
    pub path: PathBuf,
    /// Its SHA-256, lowercase hex.
    pub sha256: String,
}

impl LayerSpec {
    /// The spec of `apt`, `dockerfile` and the `files` it copies (`None`: nothing to
    /// build). Checks all three: every id a `COPY` names must be in `files`.
    pub fn new(
        apt: Vec<String>,
        dockerfile: Option<&str>,
        files: BTreeMap<String, CopyFile>,
    ) -> Result<Option<Self>, String> {
        let packages = EnvironmentPackages {
            apt: (!apt.is_empty()).then_some(apt),
            ..Default::default()
        };
        packages.validate().map_err(|e| e.to_string())?;
        let dockerfile = match dockerfile.filter(|d| !d.trim().is_empty()) {
            Some(text) => Some((
                text.to_owned(),
                Dockerfile::parse(text).map_err(|e| e.to_string())?,
            )),
            None => None,
        };
        let copied = dockerfile
            .as_ref()
            .map(|(_, d)| d.copied_files())
            .unwrap_or_default();
        if let Some(missing) = copied.iter().find(|id| !files.contains_key(*id)) {
            return Err(format!(
                "COPY {missing}: no such file in omabox's file store"
            ));
        }
        let files = files
            .into_iter()
            .filter(|(id, _)| copied.contains(id))
            .collect();
        Ok(
            (packages.apt.is_some() || dockerfile.is_some()).then_some(Self {
                packages,
                dockerfile,
                files,
            }),
        )
    }

    /// The variables the dockerfile's `ENV` steps set (for the layer's sandboxes).
    pub fn env(&self) -> std::collections::BTreeMap<String, String> {
        self.dockerfile
            .as_ref()
            .map(|(_, d)| d.env())
            .unwrap_or_default()
    }

    /// The build script: apt (and its marker), then the dockerfile, then apt's caches.
    fn script(&self) -> String {
        let mut parts = vec!["set -e".to_owned()];
        parts.extend(self.packages.apt_layer_script());
        if let Some((_, dockerfile)) = &self.dockerfile {
            parts.push(dockerfile.script());
        }
        parts.push(
            "if command -v apt-get >/dev/null; then apt-get clean; rm -rf /var/lib/apt/lists/*; fi"
                .into(),
        );
        parts.join("\n")
    }
}

/// A layer that is ready.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLayer {
    /// The layer directory (a `SandboxPlan::root_layers` entry).
    pub dir: PathBuf,
    /// Built by this call (else found in the cache).
    pub built: bool,
    /// Bytes of regular files in it (counted when built; 0 when found).
    pub bytes: u64,
}

/// The environment layers under one image cache.
#[derive(Debug, Clone)]
pub struct EnvLayers {
    dir: PathBuf,
}

impl EnvLayers {
    /// The layers kept in `<image cache>/env-layers`.
    pub fn in_image_cache(image_cache: &Path) -> Self {
        Self {
            dir: image_cache.join("env-layers"),
        }
    }

    /// The key of `spec` over the image at `rootfs`: its path (a cached image's holds its
    /// digest) and, for a directory changed in place, the inode and modification time of
    /// the directory and of its dpkg status file (which every package change rewrites).
    pub fn key(rootfs: &Path, spec: &LayerSpec) -> String {
        let mut hash = Sha256::new();
        hash.update(b"omabox-env-layer-v2\0");
        hash.update(rootfs.as_os_str().as_encoded_bytes());
        if let Ok(meta) = std::fs::symlink_metadata(rootfs) {
            hash.update(format!(
                "\0{}:{}.{}",
                meta.ino(),
                meta.mtime(),
                meta.mtime_nsec()
            ));
        }
        // Inside the image, nothing is followed: its links are the image's.
        let status = std::fs::File::open(rootfs)
            .and_then(|root| walk::open_beneath(root.as_fd(), Path::new("var/lib/dpkg")))
            .and_then(|dpkg| {
                rustix::fs::statat(&dpkg, "status", rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .map_err(io::Error::from)
            });
        #[allow(clippy::unnecessary_cast)]
        if let Ok(stat) = status {
            hash.update(format!(
                "\0{}:{}.{}",
                stat.st_ino as u64, stat.st_mtime as i64, stat.st_mtime_nsec as i64
            ));
        }
        for name in spec.packages.apt.iter().flatten() {
            hash.update(b"\0apt\0");
            hash.update(name.as_bytes());
        }
        if let Some((text, _)) = &spec.dockerfile {
            hash.update(b"\0dockerfile\0");
            hash.update(text.as_bytes());
        }
        for (id, file) in &spec.files {
            hash.update(format!("\0file\0{id}\0{}", file.sha256));
        }
        hex(&hash.finalize())
    }

    /// Returns the layer of `spec` over `plan`'s image, building it first when the cache
    /// has none. `plan` is the sandbox's own (its image, limits and network, which must
    /// admit what the build reaches); the build uses it without workspace, outputs or binds.
    pub async fn ensure(
        &self,
        runtime: &LinuxRuntime,
        plan: &SandboxPlan,
        spec: &LayerSpec,
        resolver: Arc<dyn omabox_egress::Resolver>,
    ) -> Result<EnvLayer, EnvLayerError> {
        let RootfsSource::Directory { path: rootfs } = &plan.rootfs else {
            return Err(EnvLayerError::Unsupported(
                "apt packages and a dockerfile need an image root filesystem".into(),
            ));
        };
        let script = spec.script();
        let key = Self::key(rootfs, spec);
        let layer = self.dir.join(&key);
        if layer.is_dir() {
            return Ok(EnvLayer {
                dir: layer,
                built: false,
                bytes: 0,
            });
        }
        // Owner-only, like the image cache: a layer may hold files `COPY` took from the
        // file store.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(io_err("create the layer cache"))?;
        let lock_path = self.dir.join(format!("{key}.lock"));
        let lock = tokio::task::spawn_blocking(move || lock_exclusive(&lock_path))
            .await
            .map_err(|e| EnvLayerError::Sandbox(e.to_string()))??;
        // Another host may have built it while this one waited.
        if layer.is_dir() {
            return Ok(EnvLayer {
                dir: layer,
                built: false,
                bytes: 0,
            });
        }
        self.sweep_partials();
        tracing::info!(
            apt = ?spec.packages.apt.as_deref().unwrap_or_default(),
            dockerfile_steps = spec.dockerfile.as_ref().map_or(0, |(_, d)| d.steps.len()),
            "building the environment layer (once per image and content)"
        );
        let partial = self.dir.join(format!(".partial-{key}"));
        remove_tree(&partial)?;
        std::fs::create_dir(&partial).map_err(io_err("create the build dir"))?;
        let result = build(runtime, plan, &script, &spec.files, &partial, resolver).await;
        let bytes = match result {
            Ok(bytes) => bytes,
            Err(error) => {
                remove_tree(&partial)?;
                return Err(error);
            }
        };
        // The base it belongs to, for `prune_orphans` (written before the layer appears).
        std::fs::write(
            self.dir.join(format!("{key}.base")),
            rootfs.as_os_str().as_encoded_bytes(),
        )
        .map_err(io_err("record the layer's image"))?;
        std::fs::rename(partial.join("upper"), &layer).map_err(io_err("keep the layer"))?;
        remove_tree(&partial)?;
        drop(lock);
        Ok(EnvLayer {
            dir: layer,
            built: true,
            bytes,
        })
    }
}

/// One kept layer, for `omabox image ls`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvLayerInfo {
    /// Its key (the directory's name).
    pub key: String,
    /// The image dir it belongs to (`None`: no record).
    pub image: Option<PathBuf>,
    /// Bytes of its regular files (hard links once).
    pub size_bytes: u64,
}

impl EnvLayers {
    /// The kept layers, by key. Walks each (no link followed) to size it.
    pub fn list(&self) -> Result<Vec<EnvLayerInfo>, EnvLayerError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list the layers")(e)),
        };
        let mut layers = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("list the layers"))?;
            let Some(key) = entry
                .file_name()
                .to_str()
                .filter(|n| n.len() == 64 && !n.contains('.'))
                .map(str::to_owned)
            else {
                continue;
            };
            let image = read_record(&self.dir.join(format!("{key}.base")));
            // A layer the walk cannot size (made by an older omabox beyond today's limits)
            // is listed as empty rather than failing the list.
            let size_bytes = walk::open_dir(&entry.path())
                .map_err(io_err("open the layer"))
                .and_then(|layer| walk::size(layer.as_fd(), LAYER_LIMITS))
                .unwrap_or(0);
            layers.push(EnvLayerInfo {
                key,
                image,
                size_bytes,
            });
        }
        layers.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(layers)
    }

    /// Deletes the layers whose image is gone from disk (`omabox image rm|prune` removed
    /// it, or a directory image was deleted), with their lock and record; returns them.
    /// A layer without a record (made by an older omabox) counts as orphaned. A layer a
    /// sandbox reads (`in_use`, from [`crate::image_use::roots_in_use`]) is kept.
    pub fn prune_orphans(&self, in_use: &[PathBuf]) -> Result<Vec<PathBuf>, EnvLayerError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("list the layers")(e)),
        };
        let mut removed = Vec::new();
        for entry in entries {
            let entry = entry.map_err(io_err("list the layers"))?;
            let name = entry.file_name();
            let Some(key) = name.to_str().filter(|n| n.len() == 64 && !n.contains('.')) else {
                continue;
            };
            let record = self.dir.join(format!("{key}.base"));
            let base = read_record(&record);
            let used = || {
                let path = std::fs::canonicalize(entry.path()).unwrap_or(entry.path());
                in_use
                    .iter()
                    .any(|u| std::fs::canonicalize(u).unwrap_or_else(|_| u.clone()) == path)
            };
            if base.is_some_and(|base| base.is_dir()) || used() {
                continue;
            }
            remove_tree(&entry.path())?;
            for stale in [record, self.dir.join(format!("{key}.lock"))] {
                let _ = std::fs::remove_file(stale);
            }
            removed.push(entry.path());
        }
        Ok(removed)
    }

    /// Removes the build dirs of crashed builds: those whose key's lock nobody holds.
    /// Best effort (a failure leaves the dir for the next sweep). Every build runs it, and
    /// so does `omabox reap`.
    pub fn sweep_partials(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(key) = name.to_str().and_then(|n| n.strip_prefix(".partial-")) else {
                continue;
            };
            let Ok(lock) = std::fs::File::open(self.dir.join(format!("{key}.lock"))) else {
                continue;
            };
            // SAFETY: flock on an fd we own; released when `lock` drops.
            let free = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&lock),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            } == 0;
            if free {
                let _ = remove_tree(&entry.path());
            }
        }
    }
}

/// Runs `script` in a sandbox of `plan` whose upper layer is `partial/upper`, then makes
/// that dir a layer (see the module doc). Returns its size.
async fn build(
    runtime: &LinuxRuntime,
    plan: &SandboxPlan,
    script: &str,
    files: &BTreeMap<String, CopyFile>,
    partial: &Path,
    resolver: Arc<dyn omabox_egress::Resolver>,
) -> Result<u64, EnvLayerError> {
    let mut build_plan = plan.clone();
    build_plan.workspace = None;
    build_plan.outputs = None;
    build_plan.binds.clear();
    build_plan.root_layers.clear();
    build_plan.root_upper = Some(partial.to_path_buf());
    let port = LinuxSandboxPort::start_resolving(runtime, &build_plan, resolver)
        .await
        .map_err(|e| EnvLayerError::Sandbox(e.to_string()))?;
    let base = port.identity().id_base;
    let output = match stage_files(&port, files).await {
        Ok(()) => port
            .client()
            .exec(ExecRequest::shell(script).timeout(BUILD_TIMEOUT))
            .await
            .map_err(|e| EnvLayerError::Sandbox(e.to_string())),
        Err(e) => Err(e),
    };
    // A kill here leaves the build sandbox and the build dir: `omabox reap` removes both.
    omabox_sandbox::fault::point("env-layer-built");
    let terminated = port.terminate().await;
    let output = output?;
    terminated.map_err(|e| EnvLayerError::Sandbox(e.to_string()))?;
    if !output.success() {
        let code = match (&output.exit.code, &output.exit.signal) {
            (Some(code), _) => code.to_string(),
            (None, Some(signal)) => signal.chars().filter(|c| !c.is_control()).collect(),
            (None, None) => "unknown".into(),
        };
        return Err(EnvLayerError::Install {
            code,
            tail: tail(&output.combined()),
        });
    }
    let base = base.ok_or_else(|| {
        EnvLayerError::Unsupported("a layer needs the sandbox's own user namespace (root)".into())
    })?;
    // The build dir is the host's; `upper` below it is the overlay's upper dir, which the
    // sandbox could fill but never replace. Everything inside is reached through fds.
    let upper = walk::open_dir(partial)
        .and_then(|partial| walk::open_child(partial.as_fd(), "upper"))
        .map_err(io_err("open the layer"))?;
    remove_setup_files(upper.as_fd())?;
    normalize::normalize(upper.as_fd(), base, LAYER_LIMITS, MAX_LAYER_BYTES)
}

/// Removes what the sandbox's setup wrote over the image's `/etc` (every sandbox writes its
/// own): names in the layer's `/etc`, if that is a directory of the layer (a link there is
/// the layer's, and is kept as it is).
fn remove_setup_files(upper: std::os::fd::BorrowedFd<'_>) -> Result<(), EnvLayerError> {
    let etc = match walk::open_child(upper, "etc") {
        Ok(etc) => etc,
        Err(e) if walk::is_not_a_dir(&e) => return Ok(()),
        Err(e) => return Err(io_err("open the layer's /etc")(e)),
    };
    for name in ["resolv.conf", "hostname", "hosts"] {
        match rustix::fs::unlinkat(&etc, name, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(io_err(format!("remove /etc/{name}"))(e.into())),
        }
    }
    Ok(())
}

/// A `.base` record of the cache (a path): `None` when there is none, it is a link, or it
/// is longer than a path may be.
fn read_record(path: &Path) -> Option<PathBuf> {
    use std::io::Read as _;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let mut bytes = Vec::new();
    file.take(libc::PATH_MAX as u64 + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() <= libc::PATH_MAX as usize)
        .then(|| PathBuf::from(std::ffi::OsString::from_vec(bytes)))
}

/// Puts each file `COPY` takes at [`COPY_STAGING`]`/<id>` in the build sandbox (its `/tmp`,
/// not part of the layer), after checking its size and hash.
async fn stage_files(
    port: &LinuxSandboxPort,
    files: &BTreeMap<String, CopyFile>,
) -> Result<(), EnvLayerError> {
    for (id, file) in files {
        let path = file.path.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            use std::io::Read as _;
            let mut bytes = Vec::new();
            std::fs::File::open(&path)?
                .take(MAX_COPY_BYTES + 1)
                .read_to_end(&mut bytes)?;
            Ok::<_, io::Error>(bytes)
        })
        .await
        .map_err(|e| EnvLayerError::Sandbox(e.to_string()))?
        .map_err(io_err(format!("read the file {id}")))?;
        if bytes.len() as u64 > MAX_COPY_BYTES {
            return Err(EnvLayerError::Refused(format!(
                "COPY {id}: larger than {} MiB",
                MAX_COPY_BYTES >> 20
            )));
        }
        if hex(&Sha256::digest(&bytes)) != file.sha256 {
            return Err(EnvLayerError::Refused(format!(
                "COPY {id}: the file changed since the build was asked for"
            )));
        }
        port.client()
            .write_file_bytes(
                &format!("{COPY_STAGING}/{id}"),
                bytes,
                WriteOptions::default(),
            )
            .await
            .map_err(|e| EnvLayerError::Sandbox(format!("stage COPY {id}: {e}")))?;
    }
    Ok(())
}

/// The end of a build's output: one line, no control characters.
fn tail(output: &str) -> String {
    let chars: Vec<char> = output.trim().chars().collect();
    chars[chars.len().saturating_sub(ERROR_TAIL_CHARS)..]
        .iter()
        .map(|c| if c.is_control() { ' ' } else { *c })
        .collect()
}

/// Removes the tree at `path` (a path of the cache: the host's; what is below it may be a
/// build's) however deep, following nothing ([`walk::remove_tree`]).
fn remove_tree(path: &Path) -> Result<(), EnvLayerError> {
    walk::remove_tree(path).map_err(io_err(format!("remove {}", path.display())))
}

fn lock_exclusive(path: &Path) -> Result<std::fs::File, EnvLayerError> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(io_err("open the layer lock"))?;
    // SAFETY: flock on an fd this function owns; released when the file is dropped.
    if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&file), libc::LOCK_EX) } != 0 {
        return Err(io_err("lock the layer")(io::Error::last_os_error()));
    }
    Ok(file)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(apt: &[&str], dockerfile: Option<&str>) -> LayerSpec {
        LayerSpec::new(
            apt.iter().map(|s| s.to_string()).collect(),
            dockerfile,
            BTreeMap::new(),
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn the_key_depends_on_the_image_the_apt_list_and_the_dockerfile() {
        let a = EnvLayers::key(Path::new("/img/a"), &spec(&["jq", "hello"], None));
        assert_eq!(a.len(), 64);
        for other in [
            EnvLayers::key(Path::new("/img/b"), &spec(&["jq", "hello"], None)),
            EnvLayers::key(Path::new("/img/a"), &spec(&["jq"], None)),
            EnvLayers::key(Path::new("/img/a"), &spec(&["jqhello"], None)),
            EnvLayers::key(
                Path::new("/img/a"),
                &spec(&["jq", "hello"], Some("RUN true")),
            ),
        ] {
            assert_ne!(a, other);
        }
        assert_eq!(
            a,
            EnvLayers::key(Path::new("/img/a"), &spec(&["jq", "hello"], None))
        );
    }

    #[test]
    fn a_spec_needs_something_and_checks_both_parts() {
        assert_eq!(
            LayerSpec::new(Vec::new(), Some("  "), BTreeMap::new()),
            Ok(None)
        );
        assert!(LayerSpec::new(vec!["-o".into()], None, BTreeMap::new()).is_err());
        let e = LayerSpec::new(Vec::new(), Some("COPY file_a /a"), BTreeMap::new()).unwrap_err();
        assert!(e.contains("COPY file_a: no such file"), "{e}");
        let file = |sha: &str| CopyFile {
            path: "/f".into(),
            sha256: sha.into(),
        };
        let with = |sha| {
            let files = [
                ("file_a".to_owned(), file(sha)),
                ("unused".to_owned(), file("0")),
            ];
            LayerSpec::new(Vec::new(), Some("COPY file_a /a"), files.into())
                .unwrap()
                .unwrap()
        };
        assert_eq!(with("1").files.keys().collect::<Vec<_>>(), vec!["file_a"]);
        assert_ne!(
            EnvLayers::key(Path::new("/i"), &with("1")),
            EnvLayers::key(Path::new("/i"), &with("2"))
        );
        let e = LayerSpec::new(Vec::new(), Some("FROM x"), BTreeMap::new()).unwrap_err();
        assert!(e.contains("line 1: FROM is not allowed"), "{e}");
        let s = spec(&["jq"], Some("ENV A=1\nRUN echo $A > /a"));
        assert_eq!(s.env()["A"], "1");
        let script = s.script();
        let (apt, run) = (
            script.find("apt-get install").unwrap(),
            script.find("echo $A").unwrap(),
        );
        assert!(
            apt < run && script.find("apt-get clean").unwrap() > run,
            "{script}"
        );
    }

    #[test]
    fn layers_of_images_that_are_gone_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let layers = EnvLayers::in_image_cache(dir.path());
        let image = dir.path().join("image");
        std::fs::create_dir_all(&image).unwrap();
        let (kept, gone, old) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        for key in [&kept, &gone, &old] {
            std::fs::create_dir_all(layers.dir.join(key).join("usr")).unwrap();
            std::fs::write(layers.dir.join(format!("{key}.lock")), "").unwrap();
        }
        std::fs::write(
            layers.dir.join(format!("{kept}.base")),
            image.to_str().unwrap(),
        )
        .unwrap();
        std::fs::write(layers.dir.join(format!("{gone}.base")), "/no/such/image").unwrap();
        std::fs::write(layers.dir.join(&kept).join("usr/f"), b"12345").unwrap();
        let listed = layers.list().unwrap();
        assert_eq!(listed.len(), 3);
        assert_eq!(
            (listed[0].image.as_deref(), listed[0].size_bytes),
            (Some(image.as_path()), 5)
        );
        // A sandbox still reads the old one: kept until it is gone.
        let removed = layers.prune_orphans(&[layers.dir.join(&old)]).unwrap();
        assert_eq!(removed, vec![layers.dir.join(&gone)]);
        let mut removed = layers.prune_orphans(&[]).unwrap();
        removed.sort();
        assert_eq!(removed, vec![layers.dir.join(&old)]);
        let mut left: Vec<_> = std::fs::read_dir(&layers.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![kept.clone(), format!("{kept}.base"), format!("{kept}.lock")]
        );
    }
}
