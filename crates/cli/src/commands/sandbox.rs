//! `omabox sandbox run`: one command in a fresh sandbox, like `docker run --rm`.
//!
//! ```text
//! omabox sandbox run [--backend B] [--image REF] [--workspace DIR] [--memory BYTES]
//!                    [--pids N] [--cpus N] [--env K=V]...
//!                    [--network none|limited|unrestricted] [--allow-host HOST[:PORT]]...
//!                    [--allow-package-managers] -- CMD ARGS...
//! ```
//!
//! A linux sandbox is made from the linux backend's typed config (`NodeConfig::linux_config`,
//! no env map), its image prepared first (a registry tag resolved and pulled with progress
//! on stderr, a tarball unpacked; held from `image rm` until the start returned): the
//! one-shot path (`one_shot.rs`) without a network, else the factory's port. Any other
//! `--backend` name goes through the `SANDBOX_PROVIDER` map ([`wiring::sandbox_factories`]:
//! local-subprocess only in test mode) with an env map, but `docker`, a container of the
//! engine at `DOCKER_HOST` (`docker.rs`: `--image` needed; a network other than `none` on a
//! local engine only); the command runs as a duplex process. While it runs:
//!
//! - its stdout and stderr are copied byte for byte to ours, as they arrive;
//! - our stdin is copied to its stdin until EOF (a closed or `/dev/null` stdin is EOF at
//!   once; a command that ends first does not wait for our stdin);
//! - SIGINT, SIGTERM and SIGHUP are forwarded as `SIGTERM` (the duplex contract carries
//!   `SIGTERM` and `SIGKILL` only; an ignored `SIGTERM` escalates to `SIGKILL` after two
//!   seconds), a second one as `SIGKILL`.
//!
//! omabox exits with the command's exit code, `128 + n` when signal `n` ended it, `125`
//! when omabox itself failed (the sandbox could not be made, the connection to it broke,
//! teardown failed), `127` when the command could not be started, and `2` for bad
//! arguments. The sandbox is destroyed on every path, signals included, and the default
//! temporary workspace is removed afterwards (a `--workspace` directory is kept).
//!
//! Flags `--image`, `--memory`, `--pids` and `--cpus` are the settings `image`,
//! `linux_memory`, `linux_pids` and `linux_cpus` (`omabox_node::config`), read into the
//! linux backend's typed config like every other setting (`OMABOX_LINUX_IMAGE`,
//! `OMABOX_LINUX_MEMORY`, `OMABOX_LINUX_PIDS`, `OMABOX_LINUX_CPUS` name them in errors), so
//! the same values can come from the environment or the configuration file; a flag wins.
//! So are the network flags, as one Environment `networking` object (`linux_network`,
//! `OMABOX_LINUX_NETWORK`): `--allow-host` and `--allow-package-managers` imply
//! `--network limited`; without any network flag the sandbox has loopback only (`none`,
//! or what `OMABOX_LINUX_NETWORK` says).

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

mod docker;
mod envd_client;
mod exec;
mod gvisor;
mod linux;
mod one_shot;
mod plain_args;
mod remote;
pub use plain_args::parse_sandbox_run;

use linux::{create_linux, prepare_linux};

use omabox_node::temp_workspace::Workspace;

use crate::terminal_safe::ControlFilter;
use clap::Args;
use futures::FutureExt;
use omabox_backend_linux::factory::{
    LinuxFactoryError, LinuxSandboxFactory, WORKSPACE_TMPFS_ENV, parse_memory_size, parse_millicpus,
};
use omabox_contract::networking::{NetworkPolicy, NetworkingConfig};
use omabox_contract::signals::shell_exit_code;
use omabox_contract::{ErrorKind, PortError};
use omabox_node::NodeConfig;
use omabox_node::config::{Flags, Key};
use omabox_node::wiring::{self, Backend};
use omabox_sandbox::{
    DuplexKillSignal, LOCAL_SUBPROCESS, SANDBOX_PROVIDER_ENV, SandboxDuplexProcessControl,
    SandboxDuplexProcessSpec, SandboxFactoryContext, SandboxFactoryEnv, SandboxPort,
    SandboxProcessExit, TEST_SANDBOX_PROVIDER_ENV, is_test_mode, resolve_sandbox_provider,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::sync::mpsc;

/// Exit code when omabox itself failed (docker's convention).
const EXIT_OMABOX_FAILED: u8 = 125;
/// Exit code when the command could not be started.
const EXIT_NOT_STARTED: u8 = 127;
/// Exit code of a usage error (clap's).
const EXIT_USAGE: u8 = 2;
/// How long output may still drain after the command's exit was reported.
const DRAIN_WAIT: Duration = Duration::from_secs(5);
/// Printed when linux sandboxes cannot be made here.
const LOCAL_HINT: &str = "omabox: hint: for development without isolation, use `--backend local` \
                          with OMABOX_TEST_MODE=1";
/// Printed when a non-root user could not make a linux sandbox.
const NOT_ROOT_HINT: &str = "omabox: hint: linux sandboxes need root on this machine (or \
                             delegated cgroups and a writable OMABOX_LINUX_RUNTIME_DIR); for \
                             development without isolation, use `--backend local` with \
                             OMABOX_TEST_MODE=1";
/// Copy buffer size for stdio.
const CHUNK: usize = 64 * 1024;

/// `omabox sandbox ...`.
#[derive(Debug, Args)]
pub struct SandboxArgs {
    #[command(subcommand)]
    command: SandboxCommand,
}

#[derive(Debug, clap::Subcommand)]
enum SandboxCommand {
    /// Run a command in a fresh sandbox that is destroyed when it ends.
    Run(RunArgs),
    #[command(flatten)]
    Remote(remote::RemoteCommand),
}

/// Options of `omabox sandbox run`.
#[derive(Debug, Args)]
struct RunArgs {
    /// Sandbox backend: `linux` (namespaces, the default), `docker` (a container of the
    /// engine at DOCKER_HOST; needs --image), `gvisor` (runsc; no --image or --pids yet)
    /// or `local` (no isolation; only with OMABOX_TEST_MODE=1).
    #[arg(long, default_value = "linux", value_name = "B")]
    backend: String,
    /// Root filesystem: a local rootfs directory, rootfs tarball (.tar, .tar.gz) or OCI
    /// image layout directory, or a registry reference (`node:22-slim`,
    /// `host:5000/x@sha256:…`, pulled first); archives and pulled images are unpacked once
    /// into the image cache (OMABOX_LINUX_IMAGE_CACHE). Default: the host's /usr, /bin,
    /// /lib* read-only.
    #[arg(long, value_name = "REF")]
    image: Option<String>,
    /// Host directory mounted at /workspace (the command's working directory).
    /// Default: a fresh temporary directory, removed afterwards.
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Memory limit: bytes, or with a K, M, G or T suffix (512M, 1G).
    #[arg(long, value_name = "BYTES", value_parser = parse_memory_size)]
    memory: Option<u64>,
    /// Maximum number of processes and threads in the sandbox.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(2..))]
    pids: Option<u64>,
    /// CPU quota in CPUs (1, 0.5, 2.25) or `unlimited`. Default: 2, or the host's CPU
    /// count if smaller.
    #[arg(long, value_name = "N", value_parser = parse_cpus)]
    cpus: Option<String>,
    /// What the sandbox may reach besides its loopback: `none` (the default), `limited`
    /// (only the `--allow-host` names and, with `--allow-package-managers`, the package
    /// registries) or `unrestricted` (any host name on any port; never the
    /// host's own addresses, loopback or cloud metadata). Enforced by name on the host.
    #[arg(long, value_name = "POLICY", value_parser = ["none", "limited", "unrestricted"])]
    network: Option<String>,
    /// Let the sandbox reach HOST (on ports 80 and 443, or PORT), by name; `*.SUFFIX`
    /// matches subdomains (repeatable; implies `--network limited`).
    #[arg(long = "allow-host", value_name = "HOST[:PORT]")]
    allow_hosts: Vec<String>,
    /// Let the sandbox reach the registries of pip, npm, apt, cargo, go and gem (implies
    /// `--network limited`).
    #[arg(long)]
    allow_package_managers: bool,
    /// Set an environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// The command and its arguments (put them after `--`). A first word starting with
    /// `-` before any `--` is an option, so a mistyped one (`--memroy`) is refused as
    /// such instead of being run as the command; after the command's first word every
    /// argument is the command's.
    #[arg(
        value_name = "CMD",
        required = true,
        num_args = 1..,
        trailing_var_arg = true
    )]
    command: Vec<String>,
}

/// `--cpus`: a CPU count the factory accepts, or `unlimited`.
fn parse_cpus(text: &str) -> Result<String, String> {
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok("unlimited".into());
    }
    parse_millicpus(text).map(|_| text.trim().to_owned())
}

fn parse_env(text: &str) -> Result<(String, String), String> {
    let (key, value) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not K=V"))?;
    if key.is_empty() || key.contains('\0') || value.contains('\0') {
        return Err(format!("{text:?} is not a valid K=V"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// `omabox sandbox run` alone, for [`parse_sandbox_run`].
#[derive(Debug, clap::Parser)]
#[command(name = "omabox sandbox run")]
struct SandboxRunOnly {
    /// The global option, accepted as the full parser accepts it (`sandbox run` reads
    /// registry credentials from its vault).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    #[command(flatten)]
    run: RunArgs,
}

impl SandboxArgs {
    /// The flags that are settings: `--image`, `--memory`, `--pids`, `--cpus` and the network
    /// flags (as one `networking` object; a bad combination is reported by the run).
    pub fn flags(&self, flags: Flags) -> Flags {
        let run = match &self.command {
            SandboxCommand::Run(run) => run,
            SandboxCommand::Remote(remote) => return remote.flags(flags),
        };
        flags
            .with_some(Key::Image, run.image.as_deref().map(image_ref))
            .with_some(Key::LinuxMemory, run.memory.map(|m| m.to_string()))
            .with_some(Key::LinuxPids, run.pids.map(|p| p.to_string()))
            .with_some(Key::LinuxCpus, run.cpus.clone())
            .with_some(Key::LinuxNetwork, networking(run).ok().flatten())
    }
}

/// Runs `omabox sandbox ...`. The linux backend takes the one-shot path (`one_shot.rs`:
/// no async runtime, no agent); any other backend runs the command through its factory
/// and the duplex process port on a current-thread runtime (blocking work still goes to
/// `spawn_blocking` threads), which starts no worker threads. Either sets up logging
/// (`init_tracing`) if `main`'s fast path has not: the one-shot path after its fork.
pub fn run(args: SandboxArgs, config: &NodeConfig) -> anyhow::Result<ExitCode> {
    match args.command {
        SandboxCommand::Run(run) => {
            // The one-shot path has no network: a sandbox that reaches out needs the host's
            // relay and DNS stub, served on an async runtime by the factory's port.
            if Backend::from_name(&run.backend) == Some(Backend::Linux)
                && !reaches_out(&run, config)
            {
                return Ok(one_shot::run(&run, config));
            }
            crate::init_tracing(Some(config));
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            Ok(runtime.block_on(run_command(run, config)))
        }
        SandboxCommand::Remote(remote) => remote::run(remote, config),
    }
}

/// A failure of omabox itself, with the exit code to use.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }

    fn omabox(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_OMABOX_FAILED,
            message: message.into(),
        }
    }
}

fn report(failure: &Failure) -> ExitCode {
    errln!("omabox: error: {}", failure.message);
    if failure.code == EXIT_USAGE {
        errln!("\nFor more information, try '--help'.");
    }
    ExitCode::from(failure.code)
}

async fn run_command(args: RunArgs, config: &NodeConfig) -> ExitCode {
    // Signals are caught from here on: from now on a Ctrl-C can no longer kill omabox
    // before it has destroyed what it made.
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            return report(&Failure::omabox(format!(
                "cannot install signal handlers: {e}"
            )));
        }
    };
    // `None`: a name only the provider map can judge (OpenMA's names, typos).
    let backend = Backend::from_name(&args.backend);
    let made = match backend {
        Some(Backend::Gvisor) => gvisor::create_gvisor(&args, config).await,
        Some(Backend::Docker) => docker::create_docker(&args, config).await,
        // The typed config, its image prepared here (held until the start returned).
        Some(Backend::Linux) => match prepare_linux(&args, config) {
            Ok((linux, workspace)) => create_linux(linux, workspace).await,
            Err(f) => Err(f),
        },
        _ => match prepare(&args, backend, config) {
            Ok((env, workspace)) => create_from_map(&env, workspace).await,
            Err(f) => Err(f),
        },
    };
    let (sandbox, workspace) = match made {
        Ok(made) => made,
        Err(f) => return report(&f),
    };

    let outcome = if signals.pending() {
        // Interrupted while the sandbox was being made: run nothing.
        Ok(128 + libc::SIGINT as u8)
    } else {
        supervise(&*sandbox, &args, &mut signals).await
    };

    // Teardown on every path; further signals are caught and ignored meanwhile.
    let teardown = match sandbox.as_destroy() {
        Some(d) => d.destroy().await.map_err(|e| e.message().to_owned()),
        None => Ok(()),
    };
    drop(sandbox);
    let removed = workspace.finish();
    let code = match outcome {
        Ok(code) => ExitCode::from(code),
        Err(f) => report(&f),
    };
    if let Err(e) = teardown {
        return report(&Failure::omabox(format!(
            "destroying the sandbox failed: {e}"
        )));
    }
    if let Err(e) = removed {
        return report(&Failure::omabox(e));
    }
    code
}

/// The sandbox of a name the `SANDBOX_PROVIDER` map resolves (local-subprocess in test
/// mode; other names are refused by the map), made from `env`.
async fn create_from_map(
    env: &SandboxFactoryEnv,
    workspace: Workspace,
) -> Result<(Arc<dyn SandboxPort>, Workspace), Failure> {
    let ctx = context(&workspace);
    let registry = wiring::sandbox_factories(&LinuxSandboxFactory::new());
    let factory = match resolve_sandbox_provider(env, &registry) {
        Ok(f) => f,
        Err(e) => {
            let _ = workspace.finish();
            return Err(Failure::usage(e.to_string()));
        }
    };
    match factory.create(&ctx, env).await {
        Ok(sandbox) => Ok((sandbox, workspace)),
        Err(e) => {
            let _ = workspace.finish();
            Err(create_failure(&e, false))
        }
    }
}

/// The factory context of this command's sandbox.
fn context(workspace: &Workspace) -> SandboxFactoryContext {
    SandboxFactoryContext {
        session_id: format!("omabox-run-{}", std::process::id()),
        workdir: workspace.workdir(),
        memory_root: None,
        outputs_root: None,
    }
}

/// A failed create, said as the user's input (a bad argument) or omabox's failure (with
/// the root hint for a linux sandbox made without root).
fn create_failure(e: &PortError, linux: bool) -> Failure {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if e.kind() == ErrorKind::InvalidArgument {
        Failure::usage(e.message())
    } else if linux && !root {
        Failure::omabox(format!(
            "could not create the sandbox: {}\n{NOT_ROOT_HINT}",
            e.message()
        ))
    } else {
        Failure::omabox(format!("could not create the sandbox: {}", e.message()))
    }
}

/// Whether the sandbox gets a network beyond its loopback (from the flags, else from the
/// `linux_network` setting). Bad flags count as reaching out: the full path reports them.
fn reaches_out(args: &RunArgs, config: &NodeConfig) -> bool {
    let from_env = || config.given(Key::LinuxNetwork);
    match networking(args) {
        Ok(Some(json)) => json != r#"{"type":"none"}"#,
        Ok(None) => from_env().is_some_and(|v| {
            let v = v.trim();
            !v.is_empty() && v != "none" && v.replace(' ', "") != r#"{"type":"none"}"#
        }),
        Err(_) => true,
    }
}

/// The network flags as an Environment `networking` object (JSON), or `None` when no
/// network flag was given.
fn networking(args: &RunArgs) -> Result<Option<String>, Failure> {
    let limited_flags = !args.allow_hosts.is_empty() || args.allow_package_managers;
    let config = match (args.network.as_deref(), limited_flags) {
        (None, false) => return Ok(None),
        (Some("none"), false) => NetworkingConfig::None,
        (Some("unrestricted"), false) => NetworkingConfig::Unrestricted,
        (Some("limited") | None, _) => NetworkingConfig::Limited {
            allowed_hosts: args.allow_hosts.clone(),
            allow_package_managers: args.allow_package_managers,
            allow_mcp_servers: false,
        },
        (Some(other), true) => {
            return Err(Failure::usage(format!(
                "--allow-host and --allow-package-managers need --network limited, not --network {other}"
            )));
        }
        (Some(other), false) => {
            return Err(Failure::usage(format!("unknown --network {other}")));
        }
    };
    NetworkPolicy::compile(&config, &[])
        .map_err(|e| Failure::usage(format!("--allow-host: {e}")))?;
    serde_json::to_string(&config)
        .map(Some)
        .map_err(|e| Failure::omabox(format!("encoding the network flags: {e}")))
}

/// Validates the arguments against the backend and builds the factory env: the node
/// configuration's (the flags are settings there, `SandboxArgs::flags`), and what this
/// command decides (the provider, the workspace).
fn prepare(
    args: &RunArgs,
    backend: Option<Backend>,
    config: &NodeConfig,
) -> Result<(SandboxFactoryEnv, Workspace), Failure> {
    let env = config.factory_env();
    let mut vars: BTreeMap<String, String> = env
        .keys()
        .filter_map(|k| Some((k.into(), env.get(k)?.into())))
        .collect();
    match backend {
        Some(Backend::Linux) => {
            networking(args)?;
            vars.insert(SANDBOX_PROVIDER_ENV.into(), "linux".into());
        }
        Some(Backend::Local) => {
            for (flag, given) in [
                ("--image", args.image.is_some()),
                ("--memory", args.memory.is_some()),
                ("--pids", args.pids.is_some()),
                ("--cpus", args.cpus.is_some()),
                ("--network", args.network.is_some()),
                ("--allow-host", !args.allow_hosts.is_empty()),
                ("--allow-package-managers", args.allow_package_managers),
            ] {
                if given {
                    return Err(Failure::usage(format!(
                        "{flag} is not supported by the local backend (it has no isolation and no limits)"
                    )));
                }
            }
            vars.insert(TEST_SANDBOX_PROVIDER_ENV.into(), LOCAL_SUBPROCESS.into());
            let env: SandboxFactoryEnv = vars.clone().into_iter().collect();
            if !is_test_mode(&env) {
                return Err(Failure::usage(
                    "the local backend has no isolation and runs only in test mode: set OMABOX_TEST_MODE=1",
                ));
            }
        }
        // Made from their typed configs (`docker.rs`, `gvisor.rs`), never from a factory env.
        Some(backend @ (Backend::Docker | Backend::Gvisor)) => {
            return Err(Failure::omabox(format!(
                "the {} backend has no SANDBOX_PROVIDER factory",
                backend.provider()
            )));
        }
        None => {
            vars.insert(SANDBOX_PROVIDER_ENV.into(), args.backend.clone());
        }
    }
    // `--workspace` or not decides: the environment does not.
    vars.remove(WORKSPACE_TMPFS_ENV);
    let workspace = choose_workspace(args, backend, config)?;
    if matches!(workspace, Workspace::InSandbox) {
        vars.insert(WORKSPACE_TMPFS_ENV.into(), "1".into());
    }
    Ok((vars.into_iter().collect(), workspace))
}

/// The sandbox's `/workspace`: `--workspace`'s directory (checked: it exists, apart from
/// the data dir), else a tmpfs of the linux sandbox's own, else a temporary directory.
fn choose_workspace(
    args: &RunArgs,
    backend: Option<Backend>,
    config: &NodeConfig,
) -> Result<Workspace, Failure> {
    Ok(match &args.workspace {
        Some(dir) => {
            let meta = std::fs::metadata(dir)
                .map_err(|e| Failure::usage(format!("--workspace {}: {e}", dir.display())))?;
            if !meta.is_dir() {
                return Err(Failure::usage(format!(
                    "--workspace {} is not a directory",
                    dir.display()
                )));
            }
            if let Ok(chosen) = config.data_dir_choice() {
                omabox_node::data_dir::check_apart("--workspace", dir, &chosen)
                    .map_err(|e| Failure::usage(e.to_string()))?;
            }
            let dir = std::fs::canonicalize(dir)
                .map_err(|e| Failure::usage(format!("--workspace {}: {e}", dir.display())))?;
            Workspace::Given(dir)
        }
        None if backend == Some(Backend::Linux) => Workspace::InSandbox,
        None => Workspace::temporary_in(&config.tmp_dir())
            .map_err(|e| Failure::omabox(format!("cannot create a temporary workspace: {e}")))?,
    })
}

/// `--image` as the factory wants it: an existing local path made absolute; anything
/// else as given (the factory says why it cannot use it).
fn image_ref(image: &str) -> String {
    let path = Path::new(image);
    if !path.is_absolute()
        && path.exists()
        && let Ok(abs) = std::path::absolute(path)
    {
        return abs.display().to_string();
    }
    image.to_owned()
}

fn linux_failure(error: &LinuxFactoryError) -> Failure {
    let mut message = error.to_string();
    let mut next = std::error::Error::source(error);
    while let Some(e) = next {
        message.push_str(": ");
        message.push_str(&e.to_string());
        next = e.source();
    }
    match error {
        LinuxFactoryError::InvalidEnv { .. } => Failure::usage(message),
        LinuxFactoryError::Image { source, .. } if source.is_bad_image() => Failure::usage(message),
        e if e.is_host_unsupported() => Failure::omabox(format!(
            "cannot create a linux sandbox on this machine: {message}\n{LOCAL_HINT}"
        )),
        _ => Failure::omabox(message),
    }
}

/// SIGINT, SIGTERM and SIGHUP, caught.
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    fn install() -> std::io::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            hup: signal(SignalKind::hangup())?,
        })
    }

    /// Whether a signal arrived already (consumes it).
    fn pending(&mut self) -> bool {
        let mut any = false;
        for s in [&mut self.int, &mut self.term, &mut self.hup] {
            if s.recv().now_or_never().is_some() {
                any = true;
            }
        }
        any
    }

    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

/// Runs the command as a duplex process and relays stdio and signals until it exits.
/// Returns the exit code to use.
async fn supervise(
    sandbox: &dyn SandboxPort,
    args: &RunArgs,
    signals: &mut Signals,
) -> Result<u8, Failure> {
    let duplex = sandbox.as_duplex_process().ok_or_else(|| {
        Failure::omabox(format!(
            "the {} backend cannot stream a process's stdin and output",
            args.backend
        ))
    })?;
    let (command, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Failure::usage("no command given"))?;
    let spec = SandboxDuplexProcessSpec {
        command: command.clone(),
        args: rest.to_vec(),
        env: args
            .env
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect(),
        cwd: None,
    };
    let process = match duplex.spawn_duplex_process(spec).await {
        Ok(p) => p,
        Err(e) => {
            errln!("omabox: cannot run {command:?}: {}", e.message());
            return Ok(EXIT_NOT_STARTED);
        }
    };
    let control = process.control();
    let exited = process.exited();
    let (pipe_tx, mut pipe_rx) = mpsc::unbounded_channel::<()>();
    let stdout = tokio::spawn(relay(
        process.stdout,
        tokio::io::stdout(),
        ControlFilter::for_terminal(1),
        pipe_tx.clone(),
    ));
    let stderr = tokio::spawn(relay(
        process.stderr,
        tokio::io::stderr(),
        ControlFilter::for_terminal(2),
        pipe_tx,
    ));
    let stdin = tokio::spawn(feed_stdin(process.stdin));

    let mut exited = exited;
    let mut kills = 0u32;
    let mut killers = Vec::new();
    let exit = loop {
        tokio::select! {
            result = &mut exited => break result,
            () = signals.next() => {
                kills += 1;
                killers.push(forward_kill(&control, kills));
            }
            Some(()) = pipe_rx.recv() => {
                // Our stdout or stderr is gone (a closed pipe): stop the command, as
                // SIGPIPE would have.
                kills += 1;
                killers.push(forward_kill(&control, kills));
            }
        }
    };
    stdin.abort();
    for relay in [stdout, stderr] {
        let _ = tokio::time::timeout(DRAIN_WAIT, relay).await;
    }
    for killer in killers {
        killer.abort();
    }
    match exit {
        Ok(exit) => {
            if let Some(oom) = exit.out_of_memory {
                errln!("omabox: {oom}");
            }
            Ok(exit_code(&exit))
        }
        Err(e) => Err(Failure::omabox(format!(
            "lost track of the command: {}",
            e.message()
        ))),
    }
}

/// First request: SIGTERM (escalating to SIGKILL if ignored); later ones: SIGKILL.
fn forward_kill(
    control: &Arc<dyn SandboxDuplexProcessControl>,
    nth: u32,
) -> tokio::task::JoinHandle<()> {
    let control = Arc::clone(control);
    let signal = if nth == 1 {
        DuplexKillSignal::Term
    } else {
        DuplexKillSignal::Kill
    };
    tokio::spawn(async move {
        if let Err(e) = control.kill(signal).await {
            errln!(
                "omabox: forwarding {} failed: {}",
                signal.as_str(),
                e.message()
            );
        }
    })
}

/// Copies a process stream to one of ours, flushing each chunk as it comes. Tells
/// `broken` when ours stopped accepting bytes, then keeps draining so the process is
/// not stalled.
async fn relay<R, W>(
    mut from: R,
    mut to: W,
    mut filter: Option<ControlFilter>,
    broken: mpsc::UnboundedSender<()>,
) where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; CHUNK];
    let mut filtered = Vec::new();
    let mut open = true;
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if open {
            let bytes = match &mut filter {
                Some(f) => {
                    filtered.clear();
                    f.filter(&buf[..n], &mut filtered);
                    &filtered[..]
                }
                None => &buf[..n],
            };
            let written = async {
                to.write_all(bytes).await?;
                to.flush().await
            };
            if written.await.is_err() {
                open = false;
                let _ = broken.send(());
            }
        }
    }
    if open {
        let _ = to.flush().await;
    }
}

/// Our stdin in chunks of at most [`CHUNK`] bytes until EOF (a read error counts as EOF),
/// read on a plain thread that is never joined: a blocking read of a terminal must not keep
/// omabox from exiting once the command has ended. `None` when the thread cannot start.
pub(super) fn stdin_chunks() -> Option<mpsc::Receiver<Vec<u8>>> {
    let (tx, rx) = mpsc::channel::<Vec<u8>>(4);
    std::thread::Builder::new()
        .name("omabox-stdin".into())
        .spawn(move || {
            let mut stdin = std::io::stdin().lock();
            let mut buf = vec![0u8; CHUNK];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.blocking_send(buf[..n].to_vec()).is_err() {
                            break;
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(_) => break,
                }
            }
        })
        .ok()?;
    Some(rx)
}

/// Copies our stdin to the process until EOF, then closes its stdin.
async fn feed_stdin<W: AsyncWrite + Unpin>(mut to: W) {
    if let Some(mut chunks) = stdin_chunks() {
        while let Some(chunk) = chunks.recv().await {
            if to.write_all(&chunk).await.is_err() {
                // The command closed its stdin; what is left of ours is not wanted.
                return;
            }
        }
    }
    let _ = to.shutdown().await;
}

/// The command's exit as a shell would report it.
fn exit_code(exit: &SandboxProcessExit) -> u8 {
    shell_exit_code(exit.code, exit.signal.as_deref()).unwrap_or(EXIT_OMABOX_FAILED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_map_like_a_shell() {
        let exit = |code, signal: Option<&str>| SandboxProcessExit {
            code,
            signal: signal.map(str::to_owned),
            out_of_memory: None,
        };
        assert_eq!(exit_code(&exit(Some(3), None)), 3);
        assert_eq!(exit_code(&exit(None, Some("SIGKILL"))), 137);
        assert_eq!(exit_code(&exit(None, Some("SIGTERM"))), 143);
        assert_eq!(exit_code(&exit(None, None)), EXIT_OMABOX_FAILED);
    }

    #[test]
    fn env_flags_are_k_equals_v() {
        assert_eq!(parse_env("A=b=c"), Ok(("A".into(), "b=c".into())));
        assert_eq!(parse_env("A="), Ok(("A".into(), String::new())));
        assert!(parse_env("novalue").is_err());
        assert!(parse_env("=x").is_err());
    }
}
