//! `omabox config [--json | --markdown]`: every setting with the value in effect and where it
//! came from (`flag`, `env:NAME`, `file:PATH`, `default`), from the node configuration
//! (`omabox_node::config`). Secrets show `(set, hidden)`; test hooks and internal settings
//! show only when set. A bad value is listed on stderr (its name, value and source) and the
//! command exits 1. `--markdown` prints the configuration reference (`docs/configuration.md`).
//!
//! Values are text the user (or their environment) gave: escaped for the terminal
//! ([`crate::terminal_safe::one_line`]) in the human table.

use crate::terminal_safe::one_line;
use clap::Args;
use omabox_node::NodeConfig;
use omabox_node::config::report::{Row, markdown, rows};
use std::process::ExitCode;

/// Options of `omabox config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Print a JSON array of {key, value, source, env, flag, secret, doc}.
    #[arg(long, conflicts_with = "markdown")]
    json: bool,
    /// Print the configuration reference (Markdown), generated from the settings' table.
    #[arg(long)]
    markdown: bool,
}

/// Prints the configuration.
pub fn run(config: &NodeConfig, args: &ConfigArgs) -> anyhow::Result<ExitCode> {
    if args.markdown {
        outln!("{}", markdown().trim_end());
        return Ok(ExitCode::SUCCESS);
    }
    let rows = rows(config);
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
    }
    let problems = config.problems();
    for problem in &problems {
        errln!("omabox: error: {}", one_line(&problem.to_string()));
    }
    Ok(if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn print_table(rows: &[Row]) {
    let shown: Vec<(String, String, &str)> = rows
        .iter()
        .map(|row| {
            let value = match (&row.value, &row.default) {
                (Some(value), _) => one_line(value).into_owned(),
                (None, Some(default)) => format!("({default})"),
                (None, None) => "-".to_owned(),
            };
            (row.key.to_owned(), value, row.source.as_str())
        })
        .collect();
    let key_width = shown.iter().map(|(k, _, _)| k.len()).max().unwrap_or(0);
    let value_width = shown
        .iter()
        .map(|(_, v, _)| v.chars().count())
        .max()
        .unwrap_or(0)
        .min(60);
    for (key, value, source) in &shown {
        outln!(
            "{key:<key_width$}  {value:<value_width$}  {}",
            one_line(source)
        );
    }
}
