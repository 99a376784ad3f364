//! `omabox vault`: the local secret store the MCP proxy substitutes credentials from.
//!
//! Values are read from standard input (never from the command line, where `ps` and shell
//! history would see them) and are never printed: `names` lists names only.

use clap::{Args, Subcommand};
use omabox_contract::SecretString;
use omabox_node::{DataDir, NodeConfig};
use std::process::ExitCode;

/// Options of `omabox vault`.
#[derive(Debug, Args)]
pub struct VaultArgs {
    #[command(subcommand)]
    command: VaultCommand,
}

#[derive(Debug, Subcommand)]
enum VaultCommand {
    /// Store a secret read from standard input (one trailing newline is dropped).
    Put {
        /// The secret's name (what `vault_secret` in the serve config refers to).
        name: String,
    },
    /// List the stored names (never values).
    Names {
        /// Print a JSON array.
        #[arg(long)]
        json: bool,
    },
    /// Delete a secret (no error when it is absent).
    Delete {
        /// The secret's name.
        name: String,
    },
}

/// Runs a vault subcommand against the data directory's store, or the PostgreSQL store
/// `database_url` names.
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    args: &VaultArgs,
) -> anyhow::Result<ExitCode> {
    use omabox_node::store_choice::{open, open_existing};
    // Only `put` creates a data directory; the others have nothing to do without one.
    let store = match &args.command {
        VaultCommand::Put { .. } => open(config, data_dir).await?.vault(),
        VaultCommand::Names { json } => {
            let Some(store) = open_existing(config, data_dir).await? else {
                if *json {
                    outln!("[]");
                } else {
                    errln!("omabox vault: {}", data_dir.no_data_yet());
                }
                return Ok(ExitCode::SUCCESS);
            };
            store.vault()
        }
        VaultCommand::Delete { name } => {
            let Some(store) = open_existing(config, data_dir).await? else {
                errln!(
                    "omabox vault: {}; {name} is not stored",
                    data_dir.no_data_yet()
                );
                return Ok(ExitCode::SUCCESS);
            };
            store.vault()
        }
    };
    match &args.command {
        VaultCommand::Put { name } => {
            let value = omabox_node::input_file::read_stdin_text(
                "the secret",
                omabox_node::input_file::SECRET_MAX,
            )?;
            let value = value
                .strip_suffix('\n')
                .map(|rest| rest.strip_suffix('\r').unwrap_or(rest))
                .unwrap_or(&value);
            if value.is_empty() {
                anyhow::bail!(
                    "no secret on standard input: pipe it in, e.g. `printf %s \"$TOKEN\" | omabox vault put {name}`"
                );
            }
            store.put(name, SecretString::new(value)).await?;
            errln!("omabox vault: stored {name}");
        }
        VaultCommand::Names { json } => {
            let names = store.names().await?;
            if *json {
                outln!("{}", serde_json::to_string_pretty(&names)?);
            } else {
                for name in names {
                    outln!("{name}");
                }
            }
        }
        VaultCommand::Delete { name } => {
            store.delete(name).await?;
            errln!("omabox vault: deleted {name}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
