//! `omabox catalog`: the conformance catalog this binary knows — OpenMA's twelve rows, then
//! omabox's own backends' rows ([`wiring::catalog`]) — as a table or JSON.

use clap::Args;
use omabox_contract::catalog::ManagedRuntimeProviderConformance;
use omabox_node::wiring;
use serde::Serialize;
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
    let catalog = wiring::catalog();
    if args.json {
        outln!("{}", serde_json::to_string_pretty(catalog.rows())?);
    } else {
        use std::io::Write as _;
        let _ = std::io::stdout().write_all(render_table(catalog.rows()).as_bytes());
    }
    Ok(ExitCode::SUCCESS)
}

/// A fixed-width text table of the key columns, one row per provider, for `omabox catalog`.
pub fn render_table(rows: &[ManagedRuntimeProviderConformance]) -> String {
    fn join<T: Serialize>(values: &[T]) -> String {
        let labels: Vec<String> = values
            .iter()
            .map(|value| match serde_json::to_value(value) {
                Ok(serde_json::Value::String(label)) => label,
                Ok(other) => other.to_string(),
                Err(_) => String::from("?"),
            })
            .collect();
        if labels.is_empty() {
            String::from("-")
        } else {
            labels.join(",")
        }
    }
    fn label<T: Serialize>(value: &T) -> String {
        join(std::slice::from_ref(value))
    }

    let header = [
        "PROVIDER",
        "STATUS",
        "LANES",
        "LEASE",
        "SUSPEND",
        "TERMINATE",
        "ORPHANS",
        "WORKSPACE",
        "WS-DURABILITY",
        "OUTPUTS",
        "OUT-DURABILITY",
        "CHECKPOINTS",
    ];
    let mut table: Vec<Vec<String>> = vec![header.iter().map(|cell| (*cell).to_owned()).collect()];
    for row in rows {
        table.push(vec![
            row.id.clone(),
            label(&row.status),
            join(&row.driver_lanes),
            label(&row.lifecycle.lease),
            label(&row.lifecycle.suspend_resume),
            label(&row.lifecycle.hard_terminate),
            label(&row.lifecycle.orphan_reap),
            join(&row.workspace.strategies),
            label(&row.workspace.durability),
            join(&row.outputs.strategies),
            label(&row.outputs.durability),
            join(&row.runtime_checkpoints),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|column| {
            table
                .iter()
                .map(|cells| cells[column].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for cells in &table {
        let line: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:<width$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_a_header_and_one_aligned_line_per_row() {
        let catalog = wiring::catalog();
        let table = render_table(catalog.rows());
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 17);
        assert!(lines[0].starts_with("PROVIDER"));
        assert!(lines[1].starts_with("node-docker"));
        assert!(lines[1].contains("ama_worker,openma_supervised"));
        assert!(lines[3].starts_with("cloudflare-bridge"));
        assert!(lines[13].starts_with("linux"));
        assert!(lines[14].starts_with("local"));
        assert!(lines[15].starts_with("docker"));
        assert!(lines[16].starts_with("gvisor"));
        let status_column = lines[0].find("STATUS").unwrap();
        for line in &lines[1..] {
            assert_eq!(&line[status_column..status_column + 15], "managed-runtime");
        }
    }
}
