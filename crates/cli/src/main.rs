//! `omabox`: the one binary. Wiring of stores, backends and the host lives only here.

// Output goes through `outln!`/`errln!`: `println!` panics on a closed stdout.
#![deny(clippy::print_stdout, clippy::print_stderr)]

/// `println!` that never panics: a closed stdout (a pipe whose reader left, a terminal that
/// closed) loses the line instead of aborting the command half-way (`omabox run` must still
/// clean up, and report what it can).
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// [`outln!`] for stderr.
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod acp_events;
mod allocator;
mod commands;
mod entry;
mod run_report;
mod signals;
mod terminal;
mod terminal_safe;
mod timeline;

use clap::{Parser, Subcommand};
use omabox_node::NodeConfig;
use omabox_node::config::{Flags, Key};
use std::path::PathBuf;
use std::process::ExitCode;

/// Hardened either way: musl's for the one-shot `sandbox run`, secure mimalloc for the rest
/// (`allocator.rs` says why and what each costs).
#[global_allocator]
static ALLOCATOR: allocator::HostAllocator = allocator::HostAllocator;

/// A sandbox execution backend for AI agents, implementing the OpenMA contract.
#[derive(Debug, Parser)]
#[command(name = "omabox", version, about, long_about = None)]
struct Cli {
    /// Where omabox keeps its state (SQLite database) [env: OMABOX_DATA_DIR]. Default:
    /// $XDG_DATA_HOME/omabox, else ~/.local/share/omabox.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,

    /// The PostgreSQL store several hosts share, postgres://USER:PASSWORD@HOST:PORT/DB [env:
    /// OMABOX_DATABASE_URL, preferred: a flag shows in `ps`]. Default: the SQLite store in
    /// the data dir. Every command that keeps state uses it.
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,

    /// The content-addressed blob store's directory, which several hosts may share [env:
    /// OMABOX_BLOB_DIR], with `files add`'s file store next to it. Default: <data-dir>/blobs.
    /// `gc` and `reap` collect it only with --database-url (the history every host shares).
    #[arg(long, global = true, value_name = "DIR")]
    blob_dir: Option<PathBuf>,

    /// The node configuration file (TOML; `omabox config` lists its keys) [env:
    /// OMABOX_CONFIG]. Default: <data-dir>/omabox.toml when it exists.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a work item in a sandbox under the full contract transaction (no CMD: the demo).
    Run(commands::run::RunArgs),
    /// List the sessions `omabox run` published, with their last revision.
    Sessions(commands::sessions::SessionsArgs),
    /// Work with a session's published workspace (`omabox workspace export`).
    Workspace(commands::workspace::WorkspaceArgs),
    /// List (or copy) the outputs of a session's last publication.
    Outputs(commands::outputs::OutputsArgs),
    /// Benchmarks (`omabox bench run`: the demo's wall time, per step).
    Bench(commands::bench::BenchArgs),
    /// omabox's file store: `omabox files add PATH` prints the id `--resource file:ID:/path`
    /// takes.
    Files(commands::files::FilesArgs),
    /// Manage the local vault the MCP proxy takes credentials from (values via stdin).
    Vault(commands::vault::VaultArgs),
    /// Show the usage ledger (sandbox_active_seconds per sandbox; a crashed host's sandbox
    /// has omabox's sandbox_active_seconds_estimated instead).
    Usage(commands::usage::UsageArgs),
    /// Print the managed-runtime provider conformance catalog.
    Catalog(commands::catalog::CatalogArgs),
    /// Verify every published revision (manifests and blobs, hashes re-computed); exit 1 if
    /// anything is damaged. Continue a damaged session with `omabox run --from-revision N`.
    Fsck(commands::fsck::FsckArgs),
    /// Remove blobs no retained revision needs (last N per session, default 5); --dry-run
    /// shows what would go.
    Gc(commands::gc::GcArgs),
    /// Clean up after crashed runs: retry failed terminations (the orphan queue), reap the
    /// sandboxes of dead hosts (lease journal and linux runtime dir, also those killed while
    /// starting, and their id-range slots), remove binding dirs of dead generations and
    /// abandoned temp blobs, then collect the blob store like `omabox gc` (its defaults).
    ///
    /// In order: re-tries failed terminations (the orphan queue); reaps every journaled lease
    /// whose fence is no longer held (a sandbox found already dead is recorded up to its host's
    /// last heartbeat as sandbox_active_seconds_estimated, never as the contract's
    /// sandbox_active_seconds); removes linux sandboxes under the runtime dir
    /// (OMABOX_LINUX_RUNTIME_DIR, default /run/omabox) whose owner process is dead and that no
    /// lease names, including those killed while starting (init, cgroups, state dir); removes
    /// the /workspace and outputs binding dirs under <data-dir>/runtime*/ of generations that
    /// no longer hold their fence; removes the temporary workspaces ($TMPDIR/omabox-run-*) of
    /// killed `omabox sandbox run`s; removes temp blobs of interrupted puts; writes back (if the
    /// run published) or discards (if not) the memory-store write-backs of dead runs; removes
    /// what killed promotions left in the file store. Every orphan and abandoned lease is tried
    /// (--limit caps it); `remaining` counts what is still queued. Never touches a held lease,
    /// a sandbox whose owner is alive, a live run's stage or a live generation's bindings;
    /// token-free and safe to repeat. `omabox run` does all but the orphan pass before it
    /// starts.
    Reap(commands::reap::ReapArgs),
    /// Manage the image cache: pull registry images, list, remove, prune.
    Image(commands::image::ImageArgs),
    /// Sandboxes: a one-shot `run -- CMD ARGS...`, or `create|ls|rm|timeout|pause|resume|fork|exec` in a
    /// running `omabox serve`.
    Sandbox(commands::sandbox::SandboxArgs),
    /// Serve the HTTP API: hosted inference proxy, MCP proxy, file promotion.
    Serve(commands::serve::ServeArgs),
    /// Print every setting with its value and where it came from (flag, env, file, default).
    Config(commands::config::ConfigArgs),
}

fn main() -> ExitCode {
    // `omabox sandbox run` parses its own arguments only (see `parse_sandbox_run`).
    if let Some((args, flags)) = commands::sandbox::parse_sandbox_run() {
        let config = NodeConfig::load(&flags);
        return match config {
            // Logging is set up by `sandbox::run`: the one-shot path forks the sandbox's
            // PID 1 first, so that work overlaps PID 1's making of its namespaces.
            Ok(config) => finish(commands::sandbox::run(args, &config)),
            // omabox failed before anything was made: docker's 125, as `sandbox run` uses.
            Err(error) => {
                errln!("omabox: error: {error}");
                ExitCode::from(125)
            }
        };
    }
    let cli = Cli::parse();
    let config = NodeConfig::load(&cli.flags());
    init_tracing(config.as_ref().ok());
    finish(
        config
            .map_err(anyhow::Error::from)
            .and_then(|config| run(cli, &config)),
    )
}

fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(error) => {
            errln!("omabox: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

impl Cli {
    /// The global flags that are settings (`omabox_node::config`).
    fn flags(&self) -> Flags {
        let flags = Flags::new()
            .with_some(Key::DataDir, self.data_dir.clone())
            .with_some(Key::Config, self.config.clone())
            .with_some(Key::DatabaseUrl, self.database_url.clone())
            .with_some(Key::BlobDir, self.blob_dir.clone());
        match &self.command {
            Command::Run(args) => args.flags(flags),
            Command::Serve(args) => args.flags(flags),
            Command::Gc(args) => args.flags(flags),
            Command::Sandbox(args) => args.flags(flags),
            _ => flags,
        }
    }
}

fn run(cli: Cli, config: &NodeConfig) -> anyhow::Result<ExitCode> {
    if cli.command.only_reports() {
        die_quietly_on_a_closed_stdout();
    }
    match cli.command {
        Command::Run(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::run::run(config, &data_dir, args))
        }
        Command::Sessions(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::sessions::run(config, &data_dir, &args))
        }
        Command::Workspace(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::workspace::run(config, &data_dir, &args))
        }
        Command::Outputs(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::outputs::run(config, &data_dir, &args))
        }
        Command::Files(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::files::run(config, &data_dir, &args))
        }
        Command::Vault(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::vault::run(config, &data_dir, &args))
        }
        Command::Usage(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::usage::run(config, &data_dir, &args))
        }
        Command::Bench(args) => commands::bench::run(&args),
        Command::Catalog(args) => commands::catalog::run(&args),
        Command::Fsck(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::fsck::run(config, &data_dir, &args))
        }
        Command::Gc(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::gc::run(config, &data_dir, &args))
        }
        Command::Reap(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::reap::run(config, &data_dir, &args))
        }
        Command::Serve(args) => {
            let data_dir = config.data_dir()?;
            runtime()?.block_on(commands::serve::run(config, &data_dir, &args))
        }
        // One sandbox, one command, then exit: its own (for linux, runtime-free) path.
        Command::Sandbox(args) => commands::sandbox::run(args, config),
        Command::Image(args) => commands::image::run(&args, config),
        Command::Config(args) => commands::config::run(config, &args),
    }
}

impl Command {
    /// Whether the command's writes are done (or it writes nothing) by the time it prints:
    /// it may end the moment its stdout's reader leaves (`omabox sessions | head -1`).
    fn only_reports(&self) -> bool {
        matches!(
            self,
            Command::Sessions(_)
                | Command::Outputs(_)
                | Command::Usage(_)
                | Command::Catalog(_)
                | Command::Fsck(_)
                | Command::Vault(_)
                | Command::Files(_)
                | Command::Workspace(_)
                | Command::Bench(_)
                | Command::Config(_)
        )
    }
}

/// A reporting command ends like `cat` when its stdout's reader leaves: killed by SIGPIPE,
/// quietly. (Rust ignores SIGPIPE, so its writes would fail and `println!` would panic.)
/// Never for a command that changes state as it goes (`run`, `serve`, `gc`, …): those keep
/// SIGPIPE ignored and lose their output instead.
fn die_quietly_on_a_closed_stdout() {
    // SAFETY: signal(2) with SIG_DFL before any thread is started; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

/// Logs go to stderr, filtered by the `log` setting (`OMABOX_LOG`; default: warnings only,
/// except the host's "transaction failed" warning, which `omabox run` reports as its result),
/// so `--json` output on stdout stays clean. Without a configuration (it failed to load):
/// the default. Once per process: a later call changes nothing.
pub(crate) fn init_tracing(config: Option<&NodeConfig>) {
    if tracing::dispatcher::has_been_set() {
        return;
    }
    let filter = config
        .and_then(|config| config.given(Key::Log))
        .and_then(|filter| tracing_subscriber::EnvFilter::try_new(filter).ok())
        .unwrap_or_else(|| {
            tracing_subscriber::EnvFilter::new(Key::Log.default_value().unwrap_or("warn"))
        });
    // Colour only for a terminal: a log piped to a file or a collector gets plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .try_init();
}
