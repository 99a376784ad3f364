//! `omabox files add PATH`: puts a file into omabox's file store (the store `omabox serve`
//! promotes session files into) and prints its id, for `omabox run --resource
//! file:ID:/path`. With `--blob-dir` the file store is next to the shared blobs
//! (`DataDir::files_home`), so any host that claims the run finds the file; with
//! `--database-url` no SQLite file is made.

use clap::{Args, Subcommand};
use omabox_node::{DataDir, NodeConfig};
use std::path::PathBuf;
use std::process::ExitCode;

/// Options of `omabox files`.
#[derive(Debug, Args)]
pub struct FilesArgs {
    #[command(subcommand)]
    command: FilesCommand,
}

#[derive(Debug, Subcommand)]
enum FilesCommand {
    /// Copy PATH into the file store and print its id (`file_<32 hex>`).
    Add {
        /// The file to add.
        path: PathBuf,
        /// Print `{"id", "size", "mediaType"}`.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a files subcommand.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &FilesArgs,
) -> anyhow::Result<ExitCode> {
    match &args.command {
        FilesCommand::Add { path, json } => {
            // Creates the data directory as every writer does (or checks the shared store).
            drop(omabox_node::store_choice::open(config, data_dir).await?);
            let (data_dir, path) = (data_dir.clone(), path.clone());
            let file = tokio::task::spawn_blocking(move || {
                omabox_node::session_inputs::add_file(&data_dir, &path)
            })
            .await??;
            if *json {
                outln!("{}", serde_json::to_string(&file)?);
            } else {
                outln!("{}", file.id);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
