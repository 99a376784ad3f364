//! `omabox fsck [--session ID] [--json]`: verifies every published revision of every session
//! (or of one): its workspace manifest and every blob it names, its outputs manifest and every
//! output blob, each hash re-computed. Says per session and revision what is damaged; exits 1
//! when anything is. Read-only: it never repairs, removes or creates anything (without a data
//! directory it says there is no data yet).
//!
//! A damaged session continues from an intact revision with `omabox run --from-revision N`.
//!
//! Safe beside `omabox gc`: a revision a collection forgets while it is checked is not
//! reported damaged (see `forget_collected`).

use crate::terminal_safe::one_line;
use anyhow::Context;
use clap::Args;
use omabox_node::DataDir;
use omabox_node::NodeConfig;
use omabox_node::session::check_id;
use omabox_node::store_choice::ChosenStore;
use omabox_node::wiring::Persistence;
use omabox_persistence::{BlobVerifier, Damage, verify_outputs, verify_workspace};
use serde::Serialize;
use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;

/// Options of `omabox fsck`.
#[derive(Debug, Args)]
pub struct FsckArgs {
    /// Verify only this session.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Print one JSON document.
    #[arg(long)]
    json: bool,
}

/// One verified revision.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RevisionRow {
    session: String,
    work_id: String,
    revision: u64,
    generation: u64,
    /// True for the session's last (active) publication.
    active: bool,
    intact: bool,
    damages: Vec<Damage>,
}

/// The `--json` document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct FsckReport {
    revisions: Vec<RevisionRow>,
    damaged_revisions: usize,
    blobs_read: u64,
    bytes_read: u64,
}

/// Verifies the published revisions.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &FsckArgs,
) -> anyhow::Result<ExitCode> {
    if let Some(session) = &args.session {
        check_id("--session", session)?;
    }
    let Some(store) = omabox_node::store_choice::open_existing(config, data_dir).await? else {
        if args.json {
            outln!(
                "{}",
                serde_json::to_string_pretty(&FsckReport {
                    revisions: Vec::new(),
                    damaged_revisions: 0,
                    blobs_read: 0,
                    bytes_read: 0,
                })?
            );
        } else {
            outln!("{}", data_dir.no_data_yet());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let history = store
        .publication_history()
        .await
        .context("cannot read the publication history")?;
    omabox_node::pause_point::pause("fsck-history-read");
    let blobs = Arc::clone(
        Persistence::open(data_dir, None, Default::default())?
            .workspace
            .store(),
    );
    let session = args.session.clone();
    let report = tokio::task::spawn_blocking(move || -> anyhow::Result<FsckReport> {
        let mut verifier = BlobVerifier::new(&blobs);
        let mut revisions = Vec::new();
        let mut last_scope = None;
        for (scope, publication) in history {
            if session.as_ref().is_some_and(|s| *s != scope.session_id) {
                continue;
            }
            // The history is newest first per work item: the first row of a scope is active.
            let active = last_scope.as_ref() != Some(&scope);
            last_scope = Some(scope.clone());
            let mut damages = verify_workspace(&mut verifier, &publication.workspace_candidate)?;
            if let Some(outputs) = &publication.output_candidate {
                damages.extend(verify_outputs(&mut verifier, outputs)?);
            }
            revisions.push(RevisionRow {
                session: scope.session_id,
                work_id: scope.work_id,
                revision: publication.revision,
                generation: publication.generation,
                active,
                intact: damages.is_empty(),
                damages,
            });
        }
        Ok(FsckReport {
            damaged_revisions: revisions.iter().filter(|row| !row.intact).count(),
            revisions,
            blobs_read: verifier.blobs_read,
            bytes_read: verifier.bytes_read,
        })
    })
    .await
    .context("the verification task failed")??;
    let report = forget_collected(report, &store).await?;

    let code = if report.damaged_revisions == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(code);
    }
    print_human(&report, args.session.as_deref());
    Ok(code)
}

/// Drops the damaged rows whose revision left the history while they were verified: a
/// concurrent `omabox gc` forgot it (in the database) before it removed its blobs, so a
/// revision still in the history afterwards whose blob was missing is really damaged, and one
/// no longer there is simply no published revision any more.
async fn forget_collected(
    mut report: FsckReport,
    store: &ChosenStore,
) -> anyhow::Result<FsckReport> {
    if report.damaged_revisions == 0 {
        return Ok(report);
    }
    let now = store
        .publication_history()
        .await
        .context("cannot read the publication history")?;
    let published: HashSet<(String, String, u64)> = now
        .into_iter()
        .map(|(scope, publication)| (scope.session_id, scope.work_id, publication.revision))
        .collect();
    report.revisions.retain(|row| {
        row.intact || published.contains(&(row.session.clone(), row.work_id.clone(), row.revision))
    });
    report.damaged_revisions = report.revisions.iter().filter(|row| !row.intact).count();
    Ok(report)
}

fn print_human(report: &FsckReport, session: Option<&str>) {
    if report.revisions.is_empty() {
        match session {
            Some(session) => outln!("session {session} has no published revision"),
            None => outln!("no published revisions yet"),
        }
        return;
    }
    for row in &report.revisions {
        let active = if row.active { " (last)" } else { "" };
        if row.intact {
            outln!(
                "session {} revision {}{active}: intact",
                row.session,
                row.revision
            );
            continue;
        }
        outln!(
            "session {} revision {}{active}: DAMAGED ({} problem{})",
            row.session,
            row.revision,
            row.damages.len(),
            if row.damages.len() == 1 { "" } else { "s" }
        );
        for damage in &row.damages {
            match &damage.path {
                Some(path) => outln!(
                    "    {} (needed by {}): {}",
                    damage.object,
                    one_line(path),
                    one_line(&damage.problem)
                ),
                None => outln!("    {}: {}", damage.object, one_line(&damage.problem)),
            }
        }
    }
    let sessions: std::collections::BTreeSet<&str> = report
        .revisions
        .iter()
        .map(|row| row.session.as_str())
        .collect();
    outln!(
        "{} revision{} of {} session{} verified ({} blob{}, {} bytes read): {}",
        report.revisions.len(),
        if report.revisions.len() == 1 { "" } else { "s" },
        sessions.len(),
        if sessions.len() == 1 { "" } else { "s" },
        report.blobs_read,
        if report.blobs_read == 1 { "" } else { "s" },
        report.bytes_read,
        if report.damaged_revisions == 0 {
            "all intact".to_owned()
        } else {
            format!(
                "{} damaged; continue a damaged session from an intact revision with `omabox run --session ID --from-revision N`",
                report.damaged_revisions
            )
        }
    );
}
