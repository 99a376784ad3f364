//! `omabox run`: one managed work item end to end — the contract's fenced transaction around
//! a harness in a sandbox, with `/workspace` restored from and checkpointed to the session's
//! last publication and `/mnt/session/outputs` collected.
//!
//! ```text
//! omabox run [--backend linux|local|docker|gvisor] [--session ID] [--workspace DIR | --from-revision N] [--profile FILE]
//!            [--supervised] [--inference-gateway URL] [--environment FILE] [--json]
//!            [--resource file:ID:/path | git:URL[@REF]:/dir | memory:NAME[:ro]]...
//!            [--session-json FILE] [-- CMD ARGS...]
//! omabox run ... --acp-command CMD [--acp-permission allow|deny] --prompt TEXT [-- ARGS...]
//! omabox run ... --agent claude|codex [--inference-config FILE] --prompt TEXT
//! omabox run ... --agent-json FILE --prompt TEXT       # an OpenMA agent definition
//! ```
//!
//! Any ACP run takes `--system-prompt TEXT` (written to `/workspace/AGENTS.md` before the
//! agent starts); `--agent-json` takes the definition's `_oma.acp.agent` process and its
//! `system` ([`omabox_node::oma_agent`]).
//!
//! Agents by name (`--agent`, linux): the agent's pinned npm package is installed once into
//! the host cache ([`omabox_node::agent_cache`]) and mounted read-only at `/opt/omabox/agent`; its
//! inference adapter ([`omabox_acp::agents`]) points its model calls at
//! `HOSTED_INFERENCE_URL` with the session token; its native session files live under
//! `/workspace/.openma/harness-state/<agent>` so the next run resumes them. The sandbox gets
//! 2G of memory unless `OMABOX_LINUX_MEMORY` says otherwise. Without `--inference-gateway`
//! an ACP run serves the hosted inference proxy itself ([`omabox_node::inference_server`]) on the
//! host's loopback; the model key stays in this process.
//!
//! ACP (`--acp-command`): the harness is an ACP agent (CMD with ARGS, cwd `/workspace`, run in
//! the sandbox like any `ama_worker` process) driven for one turn by `omabox_acp`: its
//! messages, tool calls, plan and stop reason stream to stdout in human mode, and as JSON
//! Lines with `--json` (the report is the last line; [`crate::acp_events`]). The next run of the session
//! resumes the agent's ACP session (`/workspace/.openma/harness-state/acp.json`).
//! `OMABOX_ACP_INITIALIZE_TIMEOUT_MS` (hidden flag) bounds `initialize` and the session
//! setup (default 60 s each), `OMABOX_ACP_TURN_TIMEOUT_MS` the prompt's turn (default 30 min).
//!
//! This file is a front end: it parses arguments into a [`RunRequest`] and hands it to the
//! node's [`Runner`] (`omabox_node::runner`: the node's services, the backend's driver, then
//! the host's `WorkItemRunner` — session → work item `local/default/<session>/main`, fence
//! policy, admission, lease journal, session tokens, the transaction). The run's observers
//! are this terminal's: the [`Timeline`] (human timeline or `--json` events), bars, the
//! harness output, the ACP events and [`TerminalNotices`] (lines, spinners, the banner and
//! the signal handlers); [`crate::run_report`] prints the result. Without CMD (and without
//! `--profile`) it runs the bundled demo in session `demo` ([`omabox_node::work_profile`]).
//!
//! Session tokens: claiming the work item issues a token bound to (session, generation),
//! stored only hashed and revoked at release; it reaches the harness only as
//! `HOSTED_INFERENCE_TOKEN`, merged into its env at spawn time ([`omabox_node::harness_env`]) —
//! never in the profile, the plan, the lease, the `--json` document or a log line.
//! `--inference-gateway URL` also sets `HOSTED_INFERENCE_URL` and removes the provider keys
//! from the harness env. `OMABOX_LEASE_TTL_MS` (hidden flag `--lease-ttl-ms`) shortens the
//! fence TTL for tests; a run killed with `kill -9` leaves its fence to expire and its
//! sandbox in the lease journal, where `omabox reap` finds it.
//!
//! Network (linux): `--environment FILE` (an Environment `config` JSON) gives the sandbox its
//! `networking`; without it the operator's `OMABOX_LINUX_NETWORK`, else `limited` with
//! nothing allowed but the gateway. The gateway is reachable from the sandbox under every
//! policy but `none`, and `HOSTED_INFERENCE_URL` is a URL that works from there
//! ([`omabox_node::environment`]). Docker (`--backend docker`, a local engine): the same,
//! but without an environment or operator setting the network is `none` unless the run has
//! a gateway (then `limited` with nothing allowed but it). Gvisor (`--backend gvisor`): as
//! docker, its limits from `OMABOX_LINUX_MEMORY`/`OMABOX_LINUX_CPUS`.
//!
//! Session inputs (`--resource`, `--session-json`; [`omabox_node::session_inputs`]): the session
//! snapshot's resources, materialized by the sandbox crate's generic materializer after
//! attach and before the harness; a failing one fails the run and nothing is published.
//!
//! SIGINT/SIGTERM cancel the run through its signal (full cleanup, exit 130) once its
//! transaction started; a second signal exits at once and leaves the rest to `omabox reap`.

use crate::acp_events::AcpEventLog;
use crate::run_report::{self, RunHeader};
use crate::signals::cancel_on_signals;
use crate::terminal::{InstallSpinner, ProgressBars, TerminalHarnessOutput};
use crate::timeline::Timeline;
use clap::Args;
use omabox_acp::agents::{AGENT_MOUNT, KnownAgent, known_agent};
use omabox_acp::{AcpTurnOptions, PermissionPolicy};
use omabox_backend_linux::image::PullProgress;
use omabox_contract::{
    AbortController, HarnessDriverDeclaration, ManagedRuntimeProfile, RuntimeResourceScope,
};
use omabox_host::work_item::session_scope;
use omabox_node::agent_cache::InstallObserver;
use omabox_node::config::{Flags, Key};
use omabox_node::environment::EnvironmentConfig;
use omabox_node::oma_agent::OmaAgent;
use omabox_node::runner::{AcpRequest, RunNotices, RunObservers};
use omabox_node::session::check_id;
use omabox_node::session_inputs::SessionInputs;
use omabox_node::wiring::Backend;
use omabox_node::work_profile;
use omabox_node::{DataDir, NodeConfig, RunRequest, Runner};
use omabox_persistence::ProgressObserver;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The session of the bundled demo.
pub const DEMO_SESSION: &str = "demo";

/// Options of `omabox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The sandbox backend. `local` (no isolation) needs OMABOX_TEST_MODE=1.
    #[arg(long, value_parser = super::backend_parser(), default_value = "linux")]
    backend: Backend,
    /// The session to run in: a later run of the same session starts from its last
    /// published workspace. Default: `demo` for the demo, else a new `sess_<random>`.
    #[arg(long, value_name = "ID")]
    session: Option<String>,
    /// Seed a NEW session's /workspace from this directory (copied; never modified).
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
    /// Continue the session from its published revision N instead of its last one (for a
    /// session whose last revision is damaged; see `omabox fsck`). The run publishes a new
    /// revision on top.
    #[arg(long, value_name = "N", conflicts_with = "workspace")]
    from_revision: Option<u64>,
    /// A ManagedRuntimeProfile JSON file; CMD, when given, replaces its entry process.
    #[arg(long, value_name = "FILE", conflicts_with = "supervised")]
    profile: Option<PathBuf>,
    /// Run CMD as an openma_supervised supervisor (JSON-Lines protocol on stdio).
    #[arg(long)]
    supervised: bool,
    /// Print one JSON document on stdout (harness output and logs go to stderr).
    #[arg(long)]
    json: bool,
    /// The OpenMA gateway origin the harness reaches the hosted inference proxy at: sets
    /// HOSTED_INFERENCE_URL and removes the model provider keys from the harness env.
    /// [env: OMABOX_INFERENCE_GATEWAY]
    #[arg(long, value_name = "URL")]
    inference_gateway: Option<String>,
    /// An Environment `config` JSON file (or an Environment object holding one): its
    /// `networking` decides what the sandbox may reach (linux). Default: `limited` with
    /// nothing allowed but the inference gateway.
    #[arg(long, value_name = "FILE")]
    environment: Option<PathBuf>,
    /// Inject a vault secret into the sandbox's HTTPS requests to HOST (under PREFIX):
    /// `HOST[/PREFIX]=SECRET[:bearer|basic|token]` (repeatable; linux, or docker on a local
    /// engine; PREFIX matches whole path segments). The host must be allowed by the
    /// networking, else the run is refused before it starts. The sandbox never holds the
    /// secret; the work item then requires enforced credential egress.
    #[arg(long = "credential", value_name = "HOST[/PREFIX]=SECRET",
          value_parser = omabox_backend_linux::credential_egress::EgressCredential::parse)]
    credentials: Vec<omabox_backend_linux::credential_egress::EgressCredential>,
    /// A Session resource, materialized in order after the sandbox is attached and before
    /// the harness (repeatable): `file:ID:/abs/path` (ID from `omabox files add`),
    /// `git:URL[@REF]:/workspace/dir` (cloned in the sandbox through its networking; REF a
    /// branch, or a commit in hex; a --credential for the host is injected on the host),
    /// `memory:NAME[:ro]` (<data-dir>/memory/NAME at /mnt/memory/NAME, written back at the
    /// end of the run unless `ro`; linux). A failing resource fails the run.
    #[arg(long = "resource", value_name = "SPEC",
          value_parser = omabox_node::session_inputs::parse_resource)]
    resources: Vec<omabox_contract::RuntimeSessionResourceSnapshot>,
    /// Session resources (and metadata) in the contract's JSON shapes:
    /// `{"resources": [{"type": "file", "file_id": …, "mount_path": …}, {"type":
    /// "github_repository", "url": …, "mount_path": …, "checkout": {"type": "branch", "name":
    /// …}}, {"type": "memory_store", "memory_store_id": …, "access": "read_only"}],
    /// "metadata": {…}}`; materialized before the --resource ones.
    #[arg(long, value_name = "FILE")]
    session_json: Option<PathBuf>,
    /// Fence time to live in milliseconds (tests shorten it).
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..))]
    lease_ttl_ms: Option<u64>,
    /// Run an ACP agent as the harness for one turn: CMD is the agent's command (in the
    /// sandbox), the arguments after `--` are its arguments. Needs --prompt.
    #[arg(long, value_name = "CMD", conflicts_with_all = ["supervised", "profile"])]
    acp_command: Option<String>,
    /// Run a known ACP agent for one turn: `claude` (Claude Code through
    /// @zed-industries/claude-code-acp) or `codex` (@zed-industries/codex-acp). Its npm
    /// package is installed once into a host cache (OMABOX_AGENT_CACHE, default
    /// <data-dir>/agents) and mounted read-only; its model calls go to the hosted inference
    /// proxy. Needs --prompt.
    #[arg(long, value_name = "NAME", value_parser = ["claude", "codex"],
          conflicts_with_all = ["supervised", "profile", "acp_command"])]
    agent: Option<String>,
    /// Run the ACP agent an OpenMA agent definition (JSON) declares: its
    /// `_oma.acp.agent` {command, args, env, cwd} (harness `acp-sandbox`), its `system` as
    /// /workspace/AGENTS.md. Needs --prompt.
    #[arg(long, value_name = "FILE",
          conflicts_with_all = ["supervised", "profile", "acp_command", "agent"])]
    agent_json: Option<PathBuf>,
    /// The ACP agent's system prompt, written to /workspace/AGENTS.md before it starts.
    #[arg(long, value_name = "TEXT")]
    system_prompt: Option<String>,
    /// Where the in-process inference proxy sends the agent's model calls (without
    /// --inference-gateway): an `omabox serve` configuration file (its `models` section).
    /// Default: ANTHROPIC_API_KEY/ANTHROPIC_BASE_URL (claude), OPENAI_API_KEY/OPENAI_BASE_URL
    /// (codex) of this process's environment.
    #[arg(long, value_name = "FILE", conflicts_with = "inference_gateway")]
    inference_config: Option<PathBuf>,
    /// The user's prompt for the ACP agent's turn (with --acp-command or --agent).
    #[arg(long, value_name = "TEXT")]
    prompt: Option<String>,
    /// How the ACP agent's permission requests are answered: `allow` (the sandbox is the
    /// boundary; default) or `deny`.
    #[arg(long, value_enum, value_name = "POLICY")]
    acp_permission: Option<AcpPermission>,
    /// How long the ACP agent may take to answer `initialize`, in milliseconds.
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..))]
    acp_initialize_timeout_ms: Option<u64>,
    /// How long the ACP agent's turn may take, in milliseconds (then it is cancelled and the
    /// run fails).
    #[arg(long, hide = true, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..))]
    acp_turn_timeout_ms: Option<u64>,
    /// The harness command and its arguments (with --acp-command: the agent's arguments).
    /// None: the bundled demo.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// `--acp-permission`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum AcpPermission {
    /// Select the agent's first allow option.
    Allow,
    /// Select the agent's first reject option.
    Deny,
}

impl RunArgs {
    /// The flags that are settings.
    pub fn flags(&self, flags: Flags) -> Flags {
        let text = |n: Option<u64>| n.map(|n| n.to_string());
        flags
            .with_some(Key::InferenceGateway, self.inference_gateway.clone())
            .with_some(Key::LeaseTtlMs, text(self.lease_ttl_ms))
            .with_some(
                Key::AcpInitializeTimeoutMs,
                text(self.acp_initialize_timeout_ms),
            )
            .with_some(Key::AcpTurnTimeoutMs, text(self.acp_turn_timeout_ms))
    }

    /// The settings' values in place of the flags' (flag, environment or file).
    fn apply(&mut self, config: &NodeConfig) -> anyhow::Result<()> {
        self.inference_gateway = config
            .checked_secret(Key::InferenceGateway)?
            .map(|url| url.expose().to_owned());
        self.lease_ttl_ms = config.number(Key::LeaseTtlMs)?;
        self.acp_initialize_timeout_ms = config.number(Key::AcpInitializeTimeoutMs)?;
        self.acp_turn_timeout_ms = config.number(Key::AcpTurnTimeoutMs)?;
        if self.inference_config.is_some() && self.inference_gateway.is_some() {
            anyhow::bail!(
                "--inference-config is for the proxy this run serves itself; with an inference \
                 gateway ({}) the gateway's configuration applies",
                config.source(Key::InferenceGateway)
            );
        }
        Ok(())
    }

    /// The known agent of `--agent`.
    fn known_agent(&self) -> Option<&'static KnownAgent> {
        self.agent.as_deref().and_then(known_agent)
    }

    /// Whether the harness is an ACP agent.
    fn is_acp(&self) -> bool {
        self.acp_command.is_some() || self.agent.is_some() || self.agent_json.is_some()
    }

    /// The ACP harness of `--acp-command`, `--agent` or `--agent-json` (its `system`, if
    /// any, under `--system-prompt`), with its event log.
    fn acp(&self, system: Option<String>) -> Option<(AcpTurnOptions, Arc<AcpEventLog>)> {
        if !self.is_acp() {
            return None;
        }
        let mut turn = AcpTurnOptions::new(self.prompt.clone().unwrap_or_default());
        turn.system_prompt = self.system_prompt.clone().or(system);
        turn.permission = match self.acp_permission.unwrap_or(AcpPermission::Allow) {
            AcpPermission::Allow => PermissionPolicy::Allow,
            AcpPermission::Deny => PermissionPolicy::Deny,
        };
        if let Some(ms) = self.acp_initialize_timeout_ms {
            turn.initialize_timeout = Duration::from_millis(ms);
        }
        if let Some(ms) = self.acp_turn_timeout_ms {
            turn.turn_timeout = Duration::from_millis(ms);
        }
        Some((turn, Arc::new(AcpEventLog::new(!self.json))))
    }
}

/// The work item the arguments ask for, resolved before anything runs.
struct Request {
    scope: RuntimeResourceScope,
    profile: ManagedRuntimeProfile,
    demo: bool,
    /// `--agent-json`'s system prompt.
    system: Option<String>,
    /// `--agent-json`'s ACP registry id, and the agent omabox knows by it.
    registry: Option<(String, Option<&'static KnownAgent>)>,
}

/// Runs one work item and reports it: the arguments become a [`RunRequest`] for the node's
/// [`Runner`], whose observers are this terminal's (timeline, bars, harness output, ACP
/// events, lines; the banner and the signal handlers when the transaction starts).
pub async fn run(
    config: &NodeConfig,
    data_dir: &DataDir,
    mut args: RunArgs,
) -> anyhow::Result<ExitCode> {
    args.apply(config)?;
    let runner = Runner::new(config.clone(), data_dir.clone());
    runner.check_backend(args.backend)?;
    let request = request(&args)?;
    // Read before anything is created or installed: a bad file is refused at once.
    let environment = args
        .environment
        .as_deref()
        .map(EnvironmentConfig::load)
        .transpose()?;
    let session_inputs = SessionInputs::load(args.session_json.as_deref(), &args.resources)?;
    let agent = args.known_agent();
    if let Some((id, known)) = &request.registry
        && !args.json
    {
        errln!("{}", registry_note(id, *known));
    }
    let acp = args.acp(request.system.clone());
    let run_request = RunRequest {
        backend: args.backend,
        scope: request.scope.clone(),
        profile: request.profile.clone(),
        workspace_seed: args.workspace.clone(),
        from_revision: args.from_revision,
        environment,
        credentials: args.credentials.clone(),
        session_inputs,
        acp: acp.as_ref().map(|(turn, _)| AcpRequest {
            turn: turn.clone(),
            install: agent,
            // `--agent`'s adapter, or the one an agent definition's registry id names.
            adapter: agent.or(request.registry.as_ref().and_then(|(_, known)| *known)),
            inference_config: args.inference_config.clone(),
        }),
        inference_gateway: args.inference_gateway.clone(),
        queued: None,
    };

    let bars = ProgressBars::for_stderr().map(|bars| Arc::new(bars) as Arc<dyn ProgressObserver>);
    let timeline = Arc::new(Timeline::new(!args.json, bars));
    let harness_output = Arc::new(TerminalHarnessOutput::new(args.json));
    let acp_events = acp.map(|(_, log)| log);
    let controller = AbortController::new();
    let notices = Arc::new(TerminalNotices {
        banner: (!args.json).then(|| banner(&args, &request)),
        install: InstallSpinner::new(args.json),
        timeline: Arc::clone(&timeline),
        controller: controller.clone(),
        cancelled: Arc::new(AtomicBool::new(false)),
        signals: Mutex::new(None),
    });
    let observers = RunObservers {
        steps: Arc::clone(&timeline) as _,
        progress: Some(Arc::clone(&timeline) as _),
        harness_output: Arc::clone(&harness_output) as _,
        acp_events: acp_events.clone().map(|log| log as _),
        notices: Arc::clone(&notices) as _,
    };
    let outcome = runner
        .run(run_request, observers, controller.signal())
        .await;
    if let Some(signals) = notices
        .signals
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take()
    {
        signals.abort();
    }
    let outcome = outcome?;
    harness_output.flush();
    if let Some(log) = &acp_events {
        log.finish();
    }
    let cancelled = notices.cancelled.load(Ordering::SeqCst);
    let header = RunHeader {
        scope: request.scope.clone(),
        backend: args.backend.provider(),
        owner_id: outcome.owner_id.clone(),
        json: args.json,
        from_revision: args.from_revision,
        acp_events,
        agent_registry_id: request.registry.as_ref().map(|(id, _)| id.clone()),
    };
    match outcome.result {
        Ok(ref result) => {
            let outputs = outcome
                .published_outputs(timeline.facts().published_revision)
                .await;
            run_report::result(&header, &timeline, result.clone(), outputs, cancelled)
        }
        Err(ref error) => run_report::rejection(&header, &timeline, error.clone()),
    }
}

/// What the runner tells `omabox run`'s terminal besides the timeline.
struct TerminalNotices {
    /// Printed when the transaction starts (human mode).
    banner: Option<String>,
    install: InstallSpinner,
    timeline: Arc<Timeline>,
    controller: AbortController,
    cancelled: Arc<AtomicBool>,
    /// The signal listener, from the transaction's start until the run returned.
    signals: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl RunNotices for TerminalNotices {
    fn line(&self, line: &str) {
        errln!("{line}");
    }

    fn install(&self) -> &dyn InstallObserver {
        &self.install
    }

    fn pull(&self) -> Box<dyn PullProgress + Send + Sync> {
        Box::new(super::image::StderrProgress::new())
    }

    fn prepared(&self) {
        self.timeline.restart();
    }

    fn starting(&self, _owner_id: &str) {
        if let Some(banner) = &self.banner {
            outln!("{banner}");
        }
        // SIGINT/SIGTERM/SIGHUP cancel the run through its signal from here on (full
        // cleanup, exit 130); before, they end the process as usual.
        let signals = tokio::spawn(cancel_on_signals(
            self.controller.clone(),
            Arc::clone(&self.cancelled),
        ));
        *self.signals.lock().unwrap_or_else(PoisonError::into_inner) = Some(signals);
    }
}

/// Resolves the work item (scope and profile) from the arguments.
fn request(args: &RunArgs) -> anyhow::Result<Request> {
    if args.agent.is_some() && args.prompt.is_none() {
        anyhow::bail!("--agent needs --prompt TEXT: omabox run --agent NAME --prompt \"…\"");
    }
    if args.agent_json.is_some() && args.prompt.is_none() {
        anyhow::bail!(
            "--agent-json needs --prompt TEXT: omabox run --agent-json FILE --prompt \"…\""
        );
    }
    if args.system_prompt.is_some() && !args.is_acp() {
        anyhow::bail!(
            "--system-prompt is for an ACP agent (--agent, --acp-command or --agent-json)"
        );
    }
    if args.prompt.as_deref().is_some_and(|p| p.trim().is_empty()) {
        // OpenMA's harness refuses it too ("empty turn"), but only once the run is going.
        anyhow::bail!("--prompt is empty: the agent's turn needs text");
    }
    if args.acp_permission.is_some() && !args.is_acp() {
        anyhow::bail!(
            "--acp-permission is for an ACP agent's permission requests (--agent, \
             --acp-command or --agent-json)"
        );
    }
    if args.inference_config.is_some() && !args.is_acp() {
        anyhow::bail!(
            "--inference-config is for an ACP agent's model calls (--agent, --acp-command or \
             --agent-json)"
        );
    }
    let oma_agent = args.agent_json.as_deref().map(OmaAgent::load).transpose()?;
    if oma_agent.is_some() && !args.command.is_empty() {
        anyhow::bail!("--agent-json takes no command after `--` (the definition names it)");
    }
    if args.agent.is_some() && args.backend != Backend::Linux {
        anyhow::bail!(
            "--agent needs the linux backend (the agent's package is mounted into the sandbox)"
        );
    }
    if args.agent.is_some() && !args.command.is_empty() {
        anyhow::bail!("--agent takes no command after `--` (use --acp-command CMD -- ARGS...)");
    }
    match (&args.acp_command, &args.prompt) {
        (Some(_), None) => anyhow::bail!(
            "--acp-command needs --prompt TEXT: omabox run --acp-command CMD --prompt \"…\" [-- ARGS...]"
        ),
        (None, Some(_)) if args.agent.is_none() && oma_agent.is_none() => anyhow::bail!(
            "--prompt is for an ACP agent: omabox run --acp-command CMD --prompt \"…\" [-- ARGS...]"
        ),
        _ => {}
    }
    let acp_command: Option<Vec<String>> = match (args.known_agent(), &args.acp_command) {
        // Its package is mounted at AGENT_MOUNT (--agent is linux only).
        (Some(agent), _) => Some(agent.command(AGENT_MOUNT)),
        (None, Some(command)) => Some(
            std::iter::once(command.clone())
                .chain(args.command.iter().cloned())
                .collect(),
        ),
        (None, None) => oma_agent.as_ref().map(|agent| {
            std::iter::once(agent.process.command.clone())
                .chain(agent.process.args.clone().unwrap_or_default())
                .collect()
        }),
    };
    if acp_command.as_ref().is_some_and(|c| c[0].trim().is_empty()) {
        anyhow::bail!("--acp-command needs a command");
    }
    let demo = args.command.is_empty() && args.profile.is_none() && acp_command.is_none();
    if demo && args.supervised {
        anyhow::bail!(
            "--supervised needs a supervisor command: omabox run --supervised -- CMD ARGS..."
        );
    }
    let session = match &args.session {
        Some(session) => {
            check_id("--session", session)?;
            session.clone()
        }
        None if demo => DEMO_SESSION.to_owned(),
        None => format!("sess_{:016x}", rand::random::<u64>()),
    };
    let mut profile = match &args.profile {
        Some(path) => work_profile::from_file(path, &args.command)?,
        None if demo => work_profile::demo(),
        None => match &acp_command {
            Some(command) => work_profile::for_command(command, false),
            None => work_profile::for_command(&args.command, args.supervised),
        },
    };
    if let Some(agent) = args.known_agent() {
        work_profile::set_agent_env(&mut profile, agent);
    }
    if let (Some(agent), HarnessDriverDeclaration::AmaWorker { process }) =
        (&oma_agent, &mut profile.driver)
    {
        process.clone_from(&agent.process);
    }
    if !args.credentials.is_empty() {
        if !matches!(
            args.backend,
            Backend::Linux | Backend::Docker | Backend::Gvisor
        ) {
            anyhow::bail!(
                "--credential needs the linux, docker or gvisor backend (their enforced egress path)"
            );
        }
        work_profile::require_credential_egress(&mut profile);
    }
    Ok(Request {
        scope: session_scope(session),
        profile,
        demo,
        registry: oma_agent
            .as_ref()
            .and_then(|agent| Some((agent.registry_id.clone()?, agent.known))),
        system: oma_agent.and_then(|agent| agent.system),
    })
}

/// What a registry id in an agent definition does to the run (module doc of
/// [`omabox_node::oma_agent`]).
fn registry_note(id: &str, known: Option<&'static KnownAgent>) -> String {
    match known {
        None => format!(
            "omabox run: ACP registry id {id:?} (not an agent omabox knows): the definition's \
             command runs as given"
        ),
        Some(agent) => {
            let adapter = match agent.adapter {
                omabox_acp::agents::InferenceAdapter::ClaudeCode => {
                    "its model calls go to the hosted inference proxy (ANTHROPIC_BASE_URL)"
                }
                omabox_acp::agents::InferenceAdapter::Codex => {
                    "the proxy serves OpenAI; codex's model provider is its command line's, so \
                     its calls reach the proxy only if the definition's args configure it"
                }
            };
            format!(
                "omabox run: ACP registry id {id:?} is {name} (`--agent {name}`): the \
                 definition's command runs as given (omabox installs nothing for it; `--agent \
                 {name}` would), with {name}'s state under {state}/{name}; {adapter}",
                name = agent.name,
                state = omabox_acp::agents::HARNESS_STATE_DIR,
            )
        }
    }
}

/// The line `omabox run` starts with (human mode).
fn banner(args: &RunArgs, request: &Request) -> String {
    let what = if request.demo {
        "the bundled demo work item".to_owned()
    } else {
        let process = match &request.profile.driver {
            HarnessDriverDeclaration::AmaWorker { process } => process,
            HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } => supervisor,
        };
        format!("`{}`", process.command)
    };
    format!(
        "omabox run: {what} · backend {} · session {} · work item {}",
        args.backend.provider(),
        request.scope.session_id,
        request.scope.work_id
    )
}
