//! `omabox reap`: one pass of the orphan reconciler over the local store, then one pass of
//! the abandoned-lease reaper: every journaled lease whose fence is no longer held by its
//! generation (its host died: kill -9, power loss) is reaped. Both passes are token-free and
//! safe to repeat, and safe while other runs are going on (held leases are never touched).

use crate::data_dir;
use crate::wiring;
use clap::Args;
use omabox_contract::{RuntimeLeaseJournalPort, RuntimeOrphanPort, RuntimeOrphanRecord};
use omabox_host::lease_journal::{AbandonedLeaseReaper, AbandonedLeaseSummary};
use omabox_host::reconciler::{ManagedRuntimeOrphanReconciler, ReconcileSummary};
use omabox_sandbox::SandboxFactoryEnv;
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
    /// The abandoned-lease pass.
    abandoned: AbandonedLeaseSummary,
}

/// Runs one reconcile pass and reports what is still queued.
pub async fn run(data_dir: &Path, args: &ReapArgs) -> anyhow::Result<ExitCode> {
    let store = SqliteStore::open(data_dir::database_path(data_dir))?;
    let resolver = wiring::sandbox_resolver(
        &SandboxFactoryEnv::from_process_env(),
        Arc::new(store.clone()),
    );
    let orphans: Arc<dyn RuntimeOrphanPort> = Arc::new(store.clone());
    let reconciler =
        ManagedRuntimeOrphanReconciler::with_resolver(Arc::clone(&orphans), Arc::clone(&resolver));
    let summary = reconciler.run_once(args.limit).await?;
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let queued = orphans.list(limit).await?;
    let journal: Arc<dyn RuntimeLeaseJournalPort> = Arc::new(store.clone());
    let abandoned = AbandonedLeaseReaper::new(journal, resolver)
        .with_session_tokens(Arc::new(store))
        .run_once(args.limit)
        .await?;
    if args.json {
        let report = ReapReport {
            summary,
            queued,
            abandoned,
        };
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
        println!(
            "abandoned leases: inspected {}, reaped {}, remaining {}",
            abandoned.inspected, abandoned.reaped, abandoned.remaining
        );
        for failure in &abandoned.errors {
            println!(
                "  {} {}  last error: {}",
                failure.provider, failure.runtime_id, failure.error
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
