//! `omabox catalog`: the conformance catalog, as a table or JSON.

use clap::Args;
use omabox_host::catalog::{ConformanceCatalog, render_table};
use std::process::ExitCode;

/// Options of `omabox catalog`.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// Print the rows as a JSON array (the TypeScript catalog's shape).
    #[arg(long)]
    json: bool,
}

/// Prints the catalog.
pub fn run(args: &CatalogArgs) -> anyhow::Result<ExitCode> {
    let catalog = ConformanceCatalog::openma();
    if args.json {
        println!("{}", serde_json::to_string_pretty(catalog.rows())?);
    } else {
        print!("{}", render_table(catalog.rows()));
    }
    Ok(ExitCode::SUCCESS)
}
