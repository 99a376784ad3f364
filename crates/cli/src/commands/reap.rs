//! `omabox reap`: one pass of the orphan reconciler over the local store.

use crate::data_dir;
use clap::Args;
use omabox_contract::{ManagedSandboxPort, RuntimeOrphanPort, RuntimeOrphanRecord};
use omabox_host::reconciler::{ManagedRuntimeOrphanReconciler, ReconcileSummary};
use omabox_store::SqliteStore;
use serde::Serialize;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

/// Options of `omabox reap`.
#[derive(Debug, Args)]
pub struct ReapArgs {
    /// Reap at most this many orphans in this pass.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Print one JSON document: the pass summary and the orphans still queued.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ReapReport {
    #[serde(flatten)]
    summary: ReconcileSummary,
    queued: Vec<RuntimeOrphanRecord>,
}

/// Runs one reconcile pass and reports what is still queued.
pub async fn run(data_dir: &Path, args: &ReapArgs) -> anyhow::Result<ExitCode> {
    let store = SqliteStore::open(data_dir::database_path(data_dir))?;
    let orphans: Arc<dyn RuntimeOrphanPort> = Arc::new(store);
    let reconciler =
        ManagedRuntimeOrphanReconciler::with_resolver(Arc::clone(&orphans), Arc::new(backend_for));
    let summary = reconciler.run_once(args.limit).await?;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let queued = orphans.list(limit).await?;
    if args.json {
        let report = ReapReport { summary, queued };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "inspected {}, reaped {}, still queued {}",
            summary.inspected, summary.resolved, summary.remaining
        );
        for record in &queued {
            println!(
                "  {} {}  session {}  generation {}  attempts {}  last error: {}",
                record.sandbox.provider,
                record.sandbox.runtime_id,
                record.scope.session_id,
                record.generation,
                record.attempts,
                record.last_error
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The sandbox port that reaps leases of `provider` in this build. No backend is wired in
/// yet, so every orphan stays queued with "No sandbox backend is registered for provider …".
fn backend_for(_provider: &str) -> Option<Arc<dyn ManagedSandboxPort>> {
    None
}
