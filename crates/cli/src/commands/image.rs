//! `omabox image pull|ls|rm|prune`: the content-addressed image cache every backend that
//! needs a root filesystem shares (`OMABOX_LINUX_IMAGE_CACHE`, default
//! `/var/lib/omabox/images` as root, else `$XDG_CACHE_HOME/omabox/images`).
//!
//! - `pull REF` resolves a registry reference and fetches and unpacks what the cache
//!   lacks: a bar per blob on a terminal, else one line per blob on stderr; the result
//!   (reference, digest) on stdout.
//! - `ls` shows every unpacked image with the names that point to it and its size, then
//!   the environment layers (`env_layer`) with the image each belongs to.
//! - `rm REF|DIGEST...` forgets a name (its image goes when no other name points to it)
//!   or deletes an image and all its names.
//! - `prune` deletes every image no name points to (local tarball and OCI-layout unpacks
//!   included: they are unpacked again from their file when next used), leftovers of
//!   dead pulls, and the environment layers whose image is gone.
//!
//! Registry credentials: docker's `config.json` (`$DOCKER_CONFIG`, `~/.docker`); never
//! printed. Plain HTTP only for loopback registries and `OMABOX_INSECURE_REGISTRIES`.
//! `rm` refuses, and `prune` keeps, an image or layer that a sandbox of the linux
//! runtime dir (`OMABOX_LINUX_RUNTIME_DIR`) reads: running, or left by a crashed host
//! until `omabox reap` (`image_use`), and an image a sandbox is starting on (resolved,
//! its roots not recorded yet: the image cache's hold, checked atomically with the
//! deletion).

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Mutex, PoisonError};
use std::time::Instant;

use anyhow::Context as _;
use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use omabox_backend_linux::env_layer::EnvLayers;
use omabox_backend_linux::image::{
    ImageCache, ImageError, ImageSource, PullProgress, PulledImage, RegistryConfig,
    RegistryReference,
};
use omabox_node::NodeConfig;
use serde_json::json;

const EXIT_USAGE: u8 = 2;

/// Options of `omabox image`.
#[derive(Debug, Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    command: ImageCommand,
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Pull a registry image (`node:22-slim`, `host:5000/x@sha256:…`) into the cache.
    Pull {
        /// The registry reference.
        reference: String,
        /// Print the result as JSON (progress still goes to stderr).
        #[arg(long)]
        json: bool,
    },
    /// List the cached images and the names pointing to them.
    Ls {
        /// Print a JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Remove names (`REF`: the image goes when no other name points to it) or images
    /// (`sha256:…`: with every name pointing to it).
    Rm {
        /// Names or digests.
        #[arg(required = true)]
        what: Vec<String>,
        /// Print a JSON document.
        #[arg(long)]
        json: bool,
    },
    /// Delete every cached image no name points to, and leftovers of dead pulls.
    Prune {
        /// Print a JSON document.
        #[arg(long)]
        json: bool,
    },
}

/// Runs an image subcommand.
pub fn run(args: &ImageArgs, config: &NodeConfig) -> anyhow::Result<ExitCode> {
    let cache = omabox_node::images::cache(config)?;
    match &args.command {
        ImageCommand::Pull { reference, json } => {
            let reference = match parse_reference(reference) {
                Ok(r) => r,
                Err(e) => return Ok(usage(&e)),
            };
            let started = Instant::now();
            let data_dir = config.data_dir()?;
            let registry =
                omabox_node::images::registry_config(config, Some(&data_dir), &|line| {
                    errln!("{line}")
                })?;
            let pulled = pull_with_progress(&cache, &reference, &registry)?;
            let seconds = started.elapsed().as_secs_f64();
            if *json {
                outln!("{}", pulled_json(&pulled, seconds));
            } else {
                outln!(
                    "{} {} ({}, {} downloaded, {seconds:.2}s)",
                    pulled.reference,
                    pulled.digest,
                    if pulled.image.unpacked {
                        "pulled and unpacked"
                    } else {
                        "up to date"
                    },
                    human_bytes(pulled.downloaded_bytes)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Ls { json } => {
            let images = cache.list()?;
            let layers = EnvLayers::in_image_cache(cache.dir()).list()?;
            let refs = cache.refs()?;
            let mut names: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for r in &refs {
                names.entry(&r.digest).or_default().push(&r.name);
            }
            if *json {
                let images: Vec<_> = images
                    .iter()
                    .map(|i| {
                        json!({
                            "digest": i.digest,
                            "kind": i.kind,
                            "source": i.source,
                            "sizeBytes": i.size_bytes,
                            "names": names.get(i.digest.as_str()).cloned().unwrap_or_default(),
                        })
                    })
                    .collect();
                let layers: Vec<_> = layers
                    .iter()
                    .map(|l| json!({"key": l.key, "image": l.image, "sizeBytes": l.size_bytes}))
                    .collect();
                outln!(
                    "{}",
                    json!({ "cache": cache.dir(), "images": images, "envLayers": layers })
                );
                return Ok(ExitCode::SUCCESS);
            }
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:<50} {:<19} {:>10}  SOURCE",
                "NAME", "DIGEST", "SIZE"
            )?;
            for image in &images {
                let short = short_digest(&image.digest);
                let size = human_bytes(image.size_bytes);
                match names.get(image.digest.as_str()) {
                    Some(list) => {
                        for name in list {
                            writeln!(
                                out,
                                "{name:<50} {short:<19} {size:>10}  {}",
                                image.kind.name()
                            )?;
                        }
                    }
                    None => writeln!(
                        out,
                        "{:<50} {short:<19} {size:>10}  {}: {}",
                        "<none>",
                        image.kind.name(),
                        image.source
                    )?,
                }
            }
            for layer in &layers {
                let image = layer
                    .image
                    .as_deref()
                    .map_or_else(|| "?".to_owned(), |p| p.display().to_string());
                writeln!(
                    out,
                    "{:<50} {:<19} {:>10}  over {image}",
                    "<environment layer>",
                    &layer.key[..12],
                    human_bytes(layer.size_bytes)
                )?;
            }
            Ok(ExitCode::SUCCESS)
        }
        ImageCommand::Rm { what, json } => {
            // Asked under each image's removal lock (a start between its resolution and
            // its record holds that lock; see omabox_image's removal.rs).
            let cache = cache.with_user_source({
                let config = config.clone();
                move || omabox_node::images::users_now(&config)
            });
            let mut removals = Vec::new();
            let mut failed = false;
            for item in what {
                match cache.remove_named(item) {
                    Ok(removal) => {
                        if !json {
                            for name in &removal.refs {
                                outln!("untagged {name}");
                            }
                            for digest in &removal.images {
                                outln!("deleted {digest}");
                            }
                        }
                        removals.push(
                            json!({"what": item, "refs": removal.refs, "images": removal.images}),
                        );
                    }
                    Err(
                        e @ (ImageError::NotCached(_)
                        | ImageError::InUse { .. }
                        | ImageError::Busy { .. }),
                    ) => {
                        errln!("omabox image rm: {e}");
                        failed = true;
                    }
                    Err(e) => return Err(e).context(format!("removing {item}")),
                }
            }
            if *json {
                outln!("{}", json!({ "removed": removals }));
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
        ImageCommand::Prune { json } => {
            let cache = cache.with_user_source({
                let config = config.clone();
                move || omabox_node::images::users_now(&config)
            });
            let removed = cache.prune()?;
            let in_use_paths: Vec<PathBuf> = omabox_node::images::roots_in_use(config)?
                .into_iter()
                .map(|r| r.path)
                .collect();
            let layers = EnvLayers::in_image_cache(cache.dir()).prune_orphans(&in_use_paths)?;
            if *json {
                let removed: Vec<_> = removed
                    .iter()
                    .map(|i| json!({"digest": i.digest, "kind": i.kind, "source": i.source, "sizeBytes": i.size_bytes}))
                    .collect();
                outln!(
                    "{}",
                    json!({ "removed": removed, "envLayersRemoved": layers })
                );
            } else {
                for layer in &layers {
                    outln!("deleted environment layer {}", layer.display());
                }
                let total: u64 = removed.iter().map(|i| i.size_bytes).sum();
                for image in &removed {
                    outln!("deleted {} ({})", image.digest, image.source);
                }
                outln!(
                    "{} images deleted, {} freed",
                    removed.len(),
                    human_bytes(total)
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn usage(e: &ImageError) -> ExitCode {
    errln!("omabox: error: {e}");
    ExitCode::from(EXIT_USAGE)
}

/// A registry reference, or why the value is not one (an existing path is a local image,
/// which is not pulled).
pub fn parse_reference(value: &str) -> Result<RegistryReference, ImageError> {
    match ImageSource::parse(value)? {
        ImageSource::Registry(r) => Ok(r),
        ImageSource::Local(path) => Err(ImageError::BadReference {
            value: value.to_owned(),
            reason: format!(
                "{} is a local path; only registry images are pulled",
                path.display()
            ),
        }),
    }
}

/// Resolves `reference` (a pinned digest in the cache without the registry), drawing
/// progress on stderr.
pub fn pull_with_progress(
    cache: &ImageCache,
    reference: &RegistryReference,
    config: &RegistryConfig,
) -> Result<PulledImage, ImageError> {
    let progress = StderrProgress::new();
    let result = cache.resolve_registry(reference, config, &progress);
    progress.clear();
    result
}

fn pulled_json(p: &PulledImage, seconds: f64) -> serde_json::Value {
    json!({
        "reference": p.reference,
        "digest": p.digest,
        "indexDigest": p.index_digest,
        "rootfs": p.image.rootfs_dir,
        "unpacked": p.image.unpacked,
        "contactedRegistry": p.contacted_registry,
        "downloadedBytes": p.downloaded_bytes,
        "seconds": seconds,
    })
}

fn short_digest(digest: &str) -> String {
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    format!("sha256:{}", &hex[..hex.len().min(12)])
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Pull progress on stderr: a bar per blob on a terminal, else one line per blob; its bars
/// are cleared when it is dropped.
pub struct StderrProgress {
    bars: Option<MultiProgress>,
    active: Mutex<Vec<(String, ProgressBar)>>,
}

impl StderrProgress {
    /// Progress drawn on stderr.
    pub fn new() -> Self {
        Self {
            bars: std::io::stderr()
                .is_terminal()
                .then(|| MultiProgress::with_draw_target(ProgressDrawTarget::stderr())),
            active: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn clear(&self) {
        for (_, bar) in self
            .active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            bar.finish_and_clear();
        }
        if let Some(bars) = &self.bars {
            let _ = bars.clear();
        }
    }

    fn bar(&self, digest: &str) -> Option<ProgressBar> {
        self.active
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(d, _)| d == digest)
            .map(|(_, b)| b.clone())
    }
}

impl Default for StderrProgress {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for StderrProgress {
    fn drop(&mut self) {
        self.clear();
    }
}

impl PullProgress for StderrProgress {
    fn resolved(&self, reference: &str, digest: &str) {
        errln!("{reference}: {digest}");
    }

    fn blob_started(&self, digest: &str, size: u64) {
        if let Some(bars) = &self.bars {
            let bar = bars.add(ProgressBar::new(size));
            bar.set_style(
                ProgressStyle::with_template(
                    "{prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
            );
            bar.set_prefix(short_digest(digest));
            self.active
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((digest.to_owned(), bar));
        }
    }

    fn blob_progress(&self, digest: &str, done: u64) {
        if let Some(bar) = self.bar(digest) {
            bar.set_position(done);
        }
    }

    fn blob_finished(&self, digest: &str) {
        match self.bar(digest) {
            Some(bar) => bar.finish(),
            None => errln!("fetched {digest}"),
        }
    }

    fn unpacking(&self, digest: &str) {
        match &self.bars {
            Some(bars) => {
                let spinner = bars.add(ProgressBar::new_spinner());
                spinner.set_message(format!("unpacking {}", short_digest(digest)));
                spinner.enable_steady_tick(std::time::Duration::from_millis(120));
                self.active
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((String::new(), spinner));
            }
            None => errln!("unpacking {digest}"),
        }
    }
}
