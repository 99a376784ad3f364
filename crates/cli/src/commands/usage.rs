//! `omabox usage`: the usage ledger (`sandbox_active_seconds` per sandbox). A sandbox found
//! already dead (its host crashed) has no observed stop: the contract forbids a guessed
//! `sandbox_active_seconds`, so its record is omabox's `sandbox_active_seconds_estimated`
//! (stop = the host's last sign of life; `stopEstimated: true`), shown and totalled apart
//! from the measured kind, never added to it.

use clap::Args;
use omabox_contract::UsageRecord;
use omabox_node::{DataDir, NodeConfig};
use std::process::ExitCode;

/// Options of `omabox usage`.
#[derive(Debug, Args)]
pub struct UsageArgs {
    /// Only this session's records.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// At most this many records (oldest first).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    limit: u64,
    /// Print the records as a JSON array.
    #[arg(long)]
    json: bool,
}

/// Prints the recorded usage (from the PostgreSQL store when `database_url` is set).
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &UsageArgs,
) -> anyhow::Result<ExitCode> {
    let Some(store) = omabox_node::store_choice::open_existing(config, data_dir).await? else {
        if args.json {
            outln!("[]");
        } else {
            outln!("{}", data_dir.no_data_yet());
        }
        return Ok(ExitCode::SUCCESS);
    };
    let store = store.usage();
    let limit = usize::try_from(args.limit).unwrap_or(usize::MAX);
    let records: Vec<UsageRecord> = match &args.session {
        Some(session) => store.usage(session).await?,
        None => store.list(limit).await?,
    };
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&records)?);
        return Ok(ExitCode::SUCCESS);
    }
    if records.is_empty() {
        outln!("no usage recorded");
        return Ok(ExitCode::SUCCESS);
    }
    // Per kind: an estimate is never added to a measured kind's total.
    let mut totals: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
    for record in &records {
        *totals.entry(record.kind.as_str()).or_default() += record.seconds;
    }
    for record in &records {
        outln!(
            "{}  {}  {} {}  session {}  {} s  ({} → {}{})",
            record.kind.as_str(),
            record.provider,
            record.runtime_id,
            record.scope.work_id,
            record.scope.session_id,
            record.seconds,
            record.started_at,
            record.stopped_at,
            if record.stop_estimated {
                ", stop estimated: the host crashed"
            } else {
                ""
            }
        );
    }
    let totals: Vec<String> = totals
        .iter()
        .map(|(kind, seconds)| format!("{kind} {seconds} s"))
        .collect();
    outln!("{} records: {}", records.len(), totals.join(", "));
    Ok(ExitCode::SUCCESS)
}
