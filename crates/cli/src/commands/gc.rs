//! `omabox gc [--keep N] [--grace SECONDS] [--dry-run] [--json]`: removes the blobs no
//! retained revision needs (see `omabox_node::gc`). `--dry-run` shows what would go (count, bytes,
//! per session) and changes nothing. Without a data directory there is nothing to collect.
//! With `--database-url` it collects the `--blob-dir` the hosts share against the history
//! they all publish into (`omabox_node::gc`'s module doc says how a blob another host has
//! not published yet is kept).

use anyhow::Context;
use clap::Args;
use omabox_node::DataDir;
use omabox_node::NodeConfig;
use omabox_node::config::{Flags, Key};
use omabox_node::gc::{DEFAULT_GRACE, GcOptions, GcSummary, collect_garbage};
use std::process::ExitCode;
use std::time::Duration;

/// Options of `omabox gc`.
#[derive(Debug, Args)]
pub struct GcArgs {
    /// Published revisions kept per session (their workspace and outputs blobs stay; the last
    /// revision always). Default: the `gc_keep` setting ($OMABOX_GC_KEEP), else 5.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    keep: Option<u64>,
    /// Unreferenced blobs younger than this many seconds stay (in-flight checkpoints). A
    /// shorter grace than the default is refused while a run is in progress, and a run that
    /// starts during such a collection waits for it to end.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_GRACE.as_secs())]
    grace: u64,
    /// Show what would be removed (count, bytes, per session); change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

impl GcArgs {
    /// The flags that are settings.
    pub fn flags(&self, flags: Flags) -> Flags {
        flags.with_some(Key::GcKeep, self.keep.map(|keep| keep.to_string()))
    }
}

/// Collects the blob store.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &GcArgs,
) -> anyhow::Result<ExitCode> {
    let keep = config.gc_keep()?;
    let Some(store) = omabox_node::store_choice::open_existing(config, data_dir).await? else {
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&GcSummary::default())?);
        } else {
            outln!("{}", data_dir.no_data_yet());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let options = GcOptions {
        keep,
        grace: Duration::from_secs(args.grace),
        dry_run: args.dry_run,
    };
    let data_dir_owned = data_dir.clone();
    let summary =
        tokio::task::spawn_blocking(move || collect_garbage(&data_dir_owned, &store, options))
            .await
            .context("the gc task failed")??;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    let verb = if summary.dry_run {
        "would remove"
    } else {
        "removed"
    };
    for (session, figures) in &summary.sessions {
        outln!(
            "session {session}: {} revision{} beyond the last {} ({}) — {verb} {} blob{}, {}",
            figures.revisions_forgotten.len(),
            plural(figures.revisions_forgotten.len() as u64),
            summary.keep,
            figures
                .revisions_forgotten
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            figures.blobs,
            plural(figures.blobs),
            bytes(figures.bytes)
        );
    }
    if summary.unreferenced.blobs > 0 {
        outln!(
            "unreferenced (failed runs, abandoned checkpoints): {verb} {} blob{}, {}",
            summary.unreferenced.blobs,
            plural(summary.unreferenced.blobs),
            bytes(summary.unreferenced.bytes)
        );
    }
    outln!(
        "{}: {verb} {} of {} blob{} ({}); kept {} revision{} and {} young blob{}{}",
        if summary.dry_run {
            "omabox gc --dry-run"
        } else {
            "omabox gc"
        },
        summary.blobs_removed,
        summary.blobs_scanned,
        plural(summary.blobs_scanned),
        bytes(summary.bytes_removed),
        summary.revisions_kept,
        plural(summary.revisions_kept),
        summary.blobs_kept_young,
        plural(summary.blobs_kept_young),
        if summary.dry_run {
            "; nothing was changed"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

fn plural(count: u64) -> &'static str {
    if count == 1 { "" } else { "s" }
}

fn bytes(count: u64) -> String {
    match count {
        0..1024 => format!("{count} B"),
        1024..1_048_576 => format!("{:.1} KiB", count as f64 / 1024.0),
        1_048_576..1_073_741_824 => format!("{:.1} MiB", count as f64 / 1_048_576.0),
        _ => format!("{:.2} GiB", count as f64 / 1_073_741_824.0),
    }
}
