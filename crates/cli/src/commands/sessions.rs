//! `omabox sessions`: the sessions `omabox run` has published, each with its last
//! publication (revision, the generation that made it, the workspace candidate and the
//! number of outputs), read from the fence store. Read-only.

use clap::Args;
use omabox_node::wiring::Persistence;
use omabox_node::{DataDir, NodeConfig};
use serde::Serialize;
use std::process::ExitCode;

/// Options of `omabox sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// Print one JSON document: an array of sessions.
    #[arg(long)]
    json: bool,
}

/// One published work item.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct SessionRow {
    session: String,
    work_id: String,
    workspace_id: String,
    environment_id: String,
    revision: u64,
    generation: u64,
    workspace_candidate: String,
    /// Null when the outputs manifest cannot be read.
    outputs: Option<usize>,
}

/// Lists the published sessions (from the PostgreSQL store when `database_url` is set; the
/// outputs are counted from this host's blob store, null where it lacks the manifest).
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &SessionsArgs,
) -> anyhow::Result<ExitCode> {
    let Some(store) = omabox_node::store_choice::open_existing(config, data_dir).await? else {
        if args.json {
            outln!("[]");
        } else {
            outln!("{}", data_dir.no_data_yet());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let listed = store.list_publications().await?;
    let persistence = Persistence::open(data_dir, None, Default::default())?;
    let mut rows = Vec::with_capacity(listed.len());
    for (scope, publication) in listed {
        let outputs = match &publication.output_candidate {
            None => Some(0),
            Some(candidate) => persistence
                .outputs
                .read_manifest(candidate)
                .await
                .ok()
                .map(|manifest| manifest.entries.len()),
        };
        rows.push(SessionRow {
            session: scope.session_id,
            work_id: scope.work_id,
            workspace_id: scope.workspace_id,
            environment_id: scope.environment_id,
            revision: publication.revision,
            generation: publication.generation,
            workspace_candidate: publication.workspace_candidate.id,
            outputs,
        });
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        outln!("no published sessions yet; `omabox run` runs the demo");
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "{:<24} {:<8} {:>8} {:>10} {:>7}  WORKSPACE",
        "SESSION",
        "WORK",
        "REVISION",
        "GENERATION",
        "OUTPUTS"
    );
    for row in &rows {
        outln!(
            "{:<24} {:<8} {:>8} {:>10} {:>7}  {}",
            row.session,
            row.work_id,
            row.revision,
            row.generation,
            row.outputs
                .map_or_else(|| "?".to_owned(), |count| count.to_string()),
            row.workspace_candidate
        );
    }
    Ok(ExitCode::SUCCESS)
}
