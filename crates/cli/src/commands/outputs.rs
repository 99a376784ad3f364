//! `omabox outputs --session ID [--json] [--get PATH --to FILE]`: the Session outputs of the
//! session's last publication (logical path, size, media type, content hash), and optionally
//! one entry's bytes, copied from the blob store after checking its stored size.

use crate::timeline::human_bytes;
use anyhow::Context as _;
use clap::Args;
use omabox_host::work_item::session_scope;
use omabox_node::session::{check_id, publication};
use omabox_node::store_choice::open_existing;
use omabox_node::wiring::Persistence;
use omabox_node::{DataDir, NodeConfig};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Options of `omabox outputs`.
#[derive(Debug, Args)]
pub struct OutputsArgs {
    /// The session.
    #[arg(long, value_name = "ID")]
    session: String,
    /// Print one JSON document: the manifest entries.
    #[arg(long)]
    json: bool,
    /// Copy the entry with this logical path (with --to).
    #[arg(long, value_name = "PATH", requires = "to")]
    get: Option<String>,
    /// Where --get writes the entry (`-` for stdout). Refuses to overwrite a file.
    #[arg(long, value_name = "FILE", requires = "get")]
    to: Option<PathBuf>,
}

/// Lists (or copies) a session's published outputs.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &OutputsArgs,
) -> anyhow::Result<ExitCode> {
    check_id("--session", &args.session)?;
    let Some(store) = open_existing(config, data_dir).await? else {
        if args.json {
            outln!("[]");
        } else {
            outln!("{}", data_dir.no_data_yet());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let scope = session_scope(args.session.clone());
    let publication = publication(&store, &scope).await?.with_context(|| {
        format!(
            "session {} has published nothing (see `omabox sessions`)",
            args.session
        )
    })?;
    let persistence = Persistence::open(data_dir, None, Default::default())?;
    let Some(candidate) = publication.output_candidate else {
        if args.json {
            outln!("[]");
        } else {
            outln!(
                "revision {} of session {} has no outputs",
                publication.revision,
                args.session
            );
        }
        return Ok(ExitCode::SUCCESS);
    };

    if let (Some(path), Some(to)) = (&args.get, &args.to) {
        let (entry, file) = persistence
            .outputs
            .open_entry(&candidate, path)
            .await
            .with_context(|| {
                format!(
                    "cannot read output {path:?} of session {} (revision {})",
                    args.session, publication.revision
                )
            })?;
        copy_entry(file, to)?;
        if to.as_os_str() != "-" {
            errln!(
                "wrote {} ({}) to {}",
                entry.logical_path,
                human_bytes(entry.size),
                to.display()
            );
        }
        return Ok(ExitCode::SUCCESS);
    }

    let manifest = persistence
        .outputs
        .read_manifest(&candidate)
        .await
        .context("cannot read the outputs manifest")?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&manifest.entries)?);
        return Ok(ExitCode::SUCCESS);
    }
    outln!(
        "session {} revision {} (generation {}): {} output(s)",
        args.session,
        publication.revision,
        manifest.generation,
        manifest.entries.len()
    );
    for entry in &manifest.entries {
        outln!(
            "  {:<32} {:>10}  {:<24} {}",
            crate::terminal_safe::one_line(&entry.logical_path),
            human_bytes(entry.size),
            entry.media_type.as_deref().unwrap_or("-"),
            entry.content_hash
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Copies the blob to `to` (`-`: stdout); never overwrites an existing file.
fn copy_entry(mut file: std::fs::File, to: &Path) -> anyhow::Result<()> {
    if to.as_os_str() == "-" {
        let mut stdout = std::io::stdout().lock();
        std::io::copy(&mut file, &mut stdout).context("cannot write to stdout")?;
        stdout.flush().context("cannot write to stdout")?;
        return Ok(());
    }
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(to)
        .with_context(|| format!("cannot create {} (it must not exist yet)", to.display()))?;
    std::io::copy(&mut file, &mut out).with_context(|| format!("cannot write {}", to.display()))?;
    out.sync_all()
        .with_context(|| format!("cannot write {}", to.display()))?;
    Ok(())
}
