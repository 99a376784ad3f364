//! `omabox workspace export --session ID DIR`: writes the session's last published
//! workspace (the workspace candidate of its publication) into DIR, verified against the
//! checkpoint's content hashes. DIR must not exist or must be empty: an export never mixes
//! with or overwrites other files.

use crate::terminal::ProgressBars;
use crate::timeline::{human_bytes, plural};
use anyhow::Context as _;
use clap::{Args, Subcommand};
use omabox_host::work_item::session_scope;
use omabox_node::session::{check_id, publication};
use omabox_node::store_choice::open_existing;
use omabox_node::wiring::Persistence;
use omabox_node::{DataDir, NodeConfig};
use omabox_persistence::ProgressObserver;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// `omabox workspace ...`.
#[derive(Debug, Args)]
pub struct WorkspaceArgs {
    #[command(subcommand)]
    command: WorkspaceCommand,
}

#[derive(Debug, Subcommand)]
enum WorkspaceCommand {
    /// Write a session's last published workspace into a new or empty directory.
    Export(ExportArgs),
}

/// Options of `omabox workspace export`.
#[derive(Debug, Args)]
struct ExportArgs {
    /// The session.
    #[arg(long, value_name = "ID")]
    session: String,
    /// Where to write it: a directory that does not exist yet, or an empty one.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// Runs `omabox workspace <command>`.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &WorkspaceArgs,
) -> anyhow::Result<ExitCode> {
    match &args.command {
        WorkspaceCommand::Export(export) => run_export(config, data_dir, export).await,
    }
}

async fn run_export(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &ExportArgs,
) -> anyhow::Result<ExitCode> {
    check_id("--session", &args.session)?;
    check_destination(&args.dir)?;
    let store = open_existing(config, data_dir).await?.with_context(|| {
        format!(
            "{}; session {} has no published workspace",
            data_dir.no_data_yet(),
            args.session
        )
    })?;
    let scope = session_scope(args.session.clone());
    let publication = publication(&store, &scope).await?.with_context(|| {
        format!(
            "session {} has no published workspace (see `omabox sessions`)",
            args.session
        )
    })?;
    let progress: Option<Arc<dyn ProgressObserver>> =
        ProgressBars::for_stderr().map(|bars| Arc::new(bars) as Arc<dyn ProgressObserver>);
    let persistence = Persistence::open(data_dir, progress, Default::default())?;
    let report = persistence
        .workspace
        .export_candidate(&publication.workspace_candidate, &args.dir)
        .await
        .with_context(|| {
            format!(
                "cannot export revision {} of session {} into {}",
                publication.revision,
                args.session,
                args.dir.display()
            )
        })?;
    outln!(
        "exported revision {} of session {} into {}: {}, {} ({})",
        publication.revision,
        args.session,
        args.dir.display(),
        plural(report.files, "file"),
        plural(report.directories, "directory").replace("directorys", "directories"),
        human_bytes(report.bytes)
    );
    Ok(ExitCode::SUCCESS)
}

/// DIR must not exist, or be an empty directory.
fn check_destination(dir: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(error).with_context(|| format!("cannot inspect {}", dir.display())),
        Ok(metadata) if !metadata.is_dir() => {
            anyhow::bail!(
                "{} exists and is not a directory; choose a new directory",
                dir.display()
            )
        }
        Ok(_) => {
            let mut entries =
                std::fs::read_dir(dir).with_context(|| format!("cannot read {}", dir.display()))?;
            if entries.next().is_some() {
                anyhow::bail!(
                    "{} is not empty; export into a new or empty directory",
                    dir.display()
                );
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_new_or_empty_directories_are_destinations() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_destination(&dir.path().join("new")).is_ok());
        assert!(check_destination(dir.path()).is_ok());
        std::fs::write(dir.path().join("file"), "x").unwrap();
        let error = check_destination(dir.path()).unwrap_err().to_string();
        assert!(error.contains("is not empty"), "{error}");
        let error = check_destination(&dir.path().join("file"))
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a directory"), "{error}");
    }
}
