//! `omabox reap`: one pass of the orphan reconciler over the local store, then one pass of
//! the abandoned-lease reaper: every journaled lease whose fence is no longer held by its
//! generation (its host died: kill -9, power loss) is reaped; then the leftover sweep
//! ([`omabox_node::leftovers`]): linux sandboxes under the runtime dir whose owner process is gone
//! (also those killed during their start, which no journal knows), binding directories of
//! generations that no longer hold their fence, temporary workspaces of killed `omabox sandbox
//! run`s (in `$TMPDIR`, whose lock their owner no longer holds), temp blobs of interrupted
//! puts, memory-store stages of dead runs (committed if the run published, else discarded)
//! and what killed promotions left in the file store, and the containers of dead hosts in
//! the Docker Engine at `DOCKER_HOST` ([`leftovers::sweep_docker`]); last, the
//! blob collection of `omabox gc` with its default retention ([`omabox_node::gc`]: with
//! `--database-url` against the history every host publishes into, in the `--blob-dir` they
//! share; skipped, and said, when only one of the two is shared). Every pass
//! is token-free and safe to repeat, and safe while other runs are going on (held leases,
//! live owners' sandboxes and workspaces and live generations' bindings are never touched).

use anyhow::Context as _;
use clap::Args;
use omabox_contract::{RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeOrphanRecord};
use omabox_host::lease_journal::{AbandonedLeaseReaper, AbandonedLeaseSummary};
use omabox_host::reconciler::{ManagedRuntimeOrphanReconciler, ReconcileSummary};
use omabox_node::DataDir;
use omabox_node::NodeConfig;
use omabox_node::gc::{DEFAULT_GRACE, GcOptions, GcSummary, UnsharedCollection, collect_garbage};
use omabox_node::leftovers::{self, LeftoverReport};
use omabox_node::store_choice::ChosenStore;
use omabox_node::wiring;
use serde::Serialize;
use std::process::ExitCode;
use std::sync::Arc;

/// Orphans and abandoned leases listed per pass; passes repeat until nothing reapable is
/// left.
const PAGE: u64 = 100;
/// Queued orphans listed one by one in the human report (the JSON has them all).
const SHOWN_QUEUED: usize = 20;

/// Options of `omabox reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Reap at most this many orphans and at most this many abandoned leases (default: every
    /// one there is; what is left is reported as remaining).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    limit: Option<u64>,
    /// Print one JSON document: the orphan pass summary, the orphans still queued, the
    /// abandoned-lease pass (`abandoned`), the leftover sweep (`leftovers`) and the blob
    /// collection (`gc`).
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReapReport {
    #[serde(flatten)]
    summary: ReconcileSummary,
    queued: Vec<RuntimeOrphanRecord>,
    /// The abandoned-lease pass.
    abandoned: AbandonedLeaseSummary,
    /// The leftover sweep: sandboxes, binding dirs, temp blobs.
    leftovers: LeftoverReport,
    /// The blob collection with the default retention (`omabox gc`).
    gc: GcSummary,
}

/// Runs one reconcile pass and reports what is still queued.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &ReapArgs,
) -> anyhow::Result<ExitCode> {
    let store = omabox_node::store_choice::open(config, data_dir).await?;
    let env = config.factory_env();
    let resolver = wiring::sandbox_resolver(&env, store.usage());
    let orphans: Arc<dyn RuntimeOrphanPort> = store.orphans();
    let reconciler =
        ManagedRuntimeOrphanReconciler::with_resolver(Arc::clone(&orphans), Arc::clone(&resolver));
    let summary = reconciler.run_all(PAGE, args.limit).await?;
    let queued = orphans.list(usize::MAX).await?;
    let journal: Arc<dyn RuntimeLeaseJournalPort> = store.journal();
    let abandoned = AbandonedLeaseReaper::new(journal, resolver)
        .with_session_tokens(store.tokens())
        .run_all(PAGE, args.limit)
        .await?;
    omabox_sandbox::fault::point("reap-leases-done");
    let mut leftovers = leftovers::sweep(config, data_dir, &store).await;
    leftovers::sweep_docker(&mut leftovers).await;
    // A blob store and a history not shared alike (a shared blob dir with this host's own
    // SQLite history, or the shared PostgreSQL history with this data dir's own blobs) are
    // not collected (the collection says so; the reap goes on).
    let gc = match collect_with_default_retention(config, data_dir, &store).await {
        Ok(gc) => gc,
        Err(error) if error.is::<UnsharedCollection>() => {
            if !args.json {
                outln!("blobs: not collected: {error}");
            }
            GcSummary::default()
        }
        Err(error) => return Err(error),
    };
    if args.json {
        let report = ReapReport {
            summary,
            queued,
            abandoned,
            leftovers,
            gc,
        };
        outln!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        outln!(
            "inspected {}, reaped {}, still queued {}",
            summary.inspected,
            summary.resolved,
            summary.remaining
        );
        for record in queued.iter().take(SHOWN_QUEUED) {
            outln!(
                "  {} {}  session {}  generation {}  attempts {}  last error: {}",
                record.sandbox.provider,
                record.sandbox.runtime_id,
                record.scope.session_id,
                record.generation,
                record.attempts,
                record.last_error
            );
        }
        if queued.len() > SHOWN_QUEUED {
            outln!(
                "  … and {} more (omabox reap --json lists them all)",
                queued.len() - SHOWN_QUEUED
            );
        }
        outln!(
            "abandoned leases: inspected {}, reaped {}, remaining {}",
            abandoned.inspected,
            abandoned.reaped,
            abandoned.remaining
        );
        for failure in &abandoned.errors {
            outln!(
                "  {} {}  last error: {}",
                failure.provider,
                failure.runtime_id,
                failure.error
            );
        }
        print_leftovers(&leftovers);
        outln!(
            "blobs: removed {} ({} bytes), kept {} revision(s) ({} per session); older revisions forgotten: {}",
            gc.blobs_removed,
            gc.bytes_removed,
            gc.revisions_kept,
            gc.keep,
            gc.revisions_forgotten
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// The last pass of a reap: `omabox gc` with its defaults (`OMABOX_GC_KEEP` revisions per
/// session, the default grace period), so blobs of forgotten revisions and failed runs go.
async fn collect_with_default_retention(
    config: &NodeConfig,
    data_dir: &DataDir,
    store: &ChosenStore,
) -> anyhow::Result<GcSummary> {
    let options = GcOptions {
        keep: config.gc_keep()?,
        grace: DEFAULT_GRACE,
        dry_run: false,
    };
    let (data_dir, store) = (data_dir.clone(), store.clone());
    tokio::task::spawn_blocking(move || collect_garbage(&data_dir, &store, options))
        .await
        .context("the gc task failed")?
}

fn print_leftovers(report: &LeftoverReport) {
    let sandboxes = &report.sandboxes;
    outln!(
        "sandboxes in the runtime dir: inspected {}, removed {}, owner alive {}, leased {}, kept {}",
        sandboxes.inspected,
        sandboxes.removed.len(),
        sandboxes.live,
        sandboxes.journaled,
        sandboxes.kept.len()
    );
    for id in &sandboxes.removed {
        outln!("  removed sandbox {id}");
    }
    for kept in &sandboxes.kept {
        outln!("  kept sandbox {}: {}", kept.id, kept.reason);
    }
    outln!(
        "binding dirs: removed {}, live {}",
        report.bindings_removed.len(),
        report.bindings_live
    );
    for relative in &report.bindings_removed {
        outln!("  removed {relative}");
    }
    outln!("temp blobs removed: {}", report.temp_blobs_removed);
    outln!(
        "image cache temps of killed pulls removed: {}",
        report.image_temps_removed.len()
    );
    for path in &report.image_temps_removed {
        outln!("  removed {path}");
    }
    outln!(
        "file store leftovers of killed promotions removed: {}",
        report.promoted_removed
    );
    outln!(
        "paused sandboxes of dead serves removed: {}",
        report.paused_sandboxes_removed.len()
    );
    for path in &report.paused_sandboxes_removed {
        outln!("  removed {path}");
    }
    if !report.docker_containers_removed.is_empty() {
        outln!(
            "docker containers of dead hosts removed: {}",
            report.docker_containers_removed.len()
        );
        for id in &report.docker_containers_removed {
            outln!("  removed container of sandbox {id}");
        }
    }
    if !report.gvisor_sandboxes_removed.is_empty() {
        outln!(
            "gvisor sandboxes of dead omabox processes removed: {}",
            report.gvisor_sandboxes_removed.len()
        );
        for id in &report.gvisor_sandboxes_removed {
            outln!("  removed {id}");
        }
    }
    let memory = &report.memory_stages;
    outln!(
        "memory-store write-backs of dead runs: committed {} (published), discarded {} (never published), superseded {}, live {}",
        memory.committed.len(),
        memory.discarded,
        memory.superseded.len(),
        memory.live
    );
    for error in &memory.errors {
        outln!("  error: {error}");
    }
    outln!(
        "temporary workspaces removed: {}",
        report.temp_workspaces_removed.len()
    );
    for path in &report.temp_workspaces_removed {
        outln!("  removed {path}");
    }
    for error in &report.errors {
        outln!("  error: {error}");
    }
}
