//! `omabox run`: one managed work item end to end — the contract's fenced transaction around
//! a harness in a sandbox, with `/workspace` restored from and checkpointed to the session's
//! last publication and `/mnt/session/outputs` collected.
//!
//! ```text
//! omabox run [--backend linux|local] [--session ID] [--workspace DIR | --from-revision N] [--profile FILE]
//!            [--supervised] [--inference-gateway URL] [--json] [-- CMD ARGS...]
//! ```
//!
//! Without CMD (and without `--profile`) it runs the bundled demo work item in session
//! `demo`: a shell script that increments `/workspace/counter` and writes
//! `/mnt/session/outputs/report.md`, so every demo run shows the previous run's workspace.
//!
//! # Work items and sessions (a design decision)
//!
//! The fence and the publication belong to a work item (workspace, environment, session,
//! work id). Every `omabox run` of a session uses the same work item, `local/default/<session>/
//! main`: each run is a new *generation* of it, and the fence hands each generation the last
//! publication, whichever generation made it. So a run continues exactly where the last
//! successful run of its session published (the workspace candidate is restored into
//! `/workspace`), a failed or cancelled run publishes nothing, and two runs of one session
//! can never overlap (the second gets `conflict` with the first's fence expiry). A fresh
//! work id per run would instead start every run from nothing.
//!
//! # Ownership
//!
//! The fence owner id is `<hostname>:<pid>:<random>`, unique per process: the SQLite store
//! gives a re-entrant claim only to the process that holds the token, so nothing is gained by
//! reusing owner ids. The lease TTL is 30 s (renewed every 5 s); `OMABOX_LEASE_TTL_MS`
//! (hidden flag `--lease-ttl-ms`) shortens it for tests. A run killed with `kill -9` leaves
//! its fence to expire on that TTL and its sandbox in the lease journal, where `omabox reap`
//! finds it.
//!
//! # Session tokens
//!
//! The fence port is always wrapped in a [`SessionTokenFence`] over the same SQLite store
//! (as the `SessionTokenPort`): claiming the work item issues a token bound to (session, work
//! generation), stored only hashed; releasing it revokes the token; the next generation's
//! claim rotates it. The token reaches the harness only as `HOSTED_INFERENCE_TOKEN`, merged
//! into its env at spawn time ([`crate::harness_env`]) — never in the profile, the plan, the
//! lease, the `--json` document, the timeline or a log line. Its TTL is
//! [`session_token_ttl_ms`]: max(lease TTL × 10, 1 h), fixed at issue; it only bounds a host
//! that died without releasing (a run longer than that loses its token's validity).
//! `--inference-gateway URL` (env `OMABOX_INFERENCE_GATEWAY`) also sets
//! `HOSTED_INFERENCE_URL` (`URL`'s origin + `/v1/oma/inference-proxy/<session>`) and removes
//! the nine provider keys and `OPENAI_BASE_URL` from the harness env (also from the host env
//! the `local` backend's harness inherits). Note: the linux backend's network policy is
//! `none` for now, so a linux sandbox cannot reach a gateway yet; the token is still issued,
//! projected and revoked per the contract.
//!
//! # The profile
//!
//! Default: workspace `durable` (→ `checkpoint_restore`), outputs `durable`
//! (→ `final_collect`), runtime checkpoint `disabled`, harness `ama_worker` running CMD with
//! cwd `/workspace`. `--supervised` runs CMD as an `openma_supervised` supervisor speaking
//! the JSON-Lines protocol instead. `--profile FILE` reads a whole `ManagedRuntimeProfile`
//! (JSON, camelCase as on the wire); when CMD is also given it replaces the profile's entry
//! process command and args (the worker, or the supervisor), keeping its cwd and env.
//!
//! # Output and exit code
//!
//! Human mode prints the transaction's timeline as it happens (see [`crate::timeline`]) with
//! the harness output indented under it, then the result. `--json` prints one document on
//! stdout (`result`, `session`, `workId`, `generation`, `outputs`, `timings`, …) and sends
//! harness output and logs to stderr. Exit code: 0 when `completed`; 1 for `failed`,
//! `lease_lost`, `conflict` or a rejected run; 130 when cancelled by SIGINT/SIGTERM (the
//! run then ends `lease_lost`: the sandbox is terminated, outputs aborted, the fence
//! released; a second signal exits at once and leaves the rest to `omabox reap`).

use crate::data_dir;
use crate::harness_env::{SessionTokenEnv, check_gateway};
use crate::terminal::{ProgressBars, TerminalHarnessOutput};
use crate::timed_ports::{
    TimedFences, TimedHarness, TimedOrphans, TimedOutputs, TimedSandbox, TimedWorkspace,
};
use crate::timeline::{Timeline, TimelineEvent, human_bytes};
use crate::wiring::{self, Backend, DriverInputs, Persistence};
use anyhow::Context as _;
use clap::Args;
use omabox_contract::{
    AbortController, HarnessDriverDeclaration, HarnessIdentity, ManagedRuntimeProfile,
    ManagedRuntimeProviderPlacement, ManagedSandboxPort, OutputRequirement, OutputStrategy,
    OutputsProfile, PortError, RuntimeCheckpointRequirement, RuntimeProcessDeclaration,
    RuntimeResourceScope, SessionOutputEntryCandidate, SupervisorProtocol, WorkspaceProfile,
    WorkspaceRequirement, WorkspaceStrategy,
};
use omabox_host::lease_journal::JournaledSandbox;
use omabox_host::provider_host::admission_profile;
use omabox_host::registry::{ManagedRuntimeProviderRegistry, PrepareProviderInput};
use omabox_host::runtime_host::{
    ManagedRuntimeHost, ManagedRuntimeHostDependencies, ManagedRuntimeRunInput,
    ManagedRuntimeRunResult,
};
use omabox_host::session_tokens::{SessionTokenFence, SessionTokenSlots};
use omabox_persistence::ProgressObserver;
use omabox_sandbox::SandboxFactoryEnv;
use omabox_store::SqliteStore;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;
use tokio::signal::unix::{SignalKind, signal};

/// The tenant workspace id of local runs.
pub const WORKSPACE_ID: &str = "local";
/// The environment id of local runs.
pub const ENVIRONMENT_ID: &str = "default";
/// The work id every run of a session uses (see the module doc).
pub const WORK_ID: &str = "main";
/// The session of the bundled demo.
pub const DEMO_SESSION: &str = "demo";
/// Default fence time to live.
const DEFAULT_LEASE_TTL_MS: u64 = 30_000;
/// Default heartbeat cadence.
const DEFAULT_HEARTBEAT_MS: u64 = 5_000;
/// The floor of the session-token TTL.
const MIN_SESSION_TOKEN_TTL_MS: u64 = 60 * 60 * 1000;
/// Exit code of a run cancelled by a signal.
const EXIT_CANCELLED: u8 = 130;

/// The bundled demo harness: a shell script, run with cwd `/workspace`.
const DEMO_SCRIPT: &str = r##"set -eu
outputs="${OMA_OUTPUTS_DIR:-/mnt/session/outputs}"
previous=$(cat counter 2>/dev/null || echo 0)
run=$((previous + 1))
echo "$run" > counter
echo "run $run at $(date -u +%Y-%m-%dT%H:%M:%SZ)" >> history.log
{
  echo "# omabox demo report"
  echo
  echo "- run: $run (the previous run left counter=$previous in /workspace)"
  echo "- workspace files: $(ls | wc -l)"
  echo "- kernel: $(uname -sr)"
} > "$outputs/report.md"
echo "demo: /workspace/counter is now $run; wrote /mnt/session/outputs/report.md"
"##;

/// Options of `omabox run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The sandbox backend. `local` (no isolation) needs OMABOX_TEST_MODE=1.
    #[arg(long, value_enum, default_value_t = Backend::Linux)]
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
    #[arg(
        long,
        env = "OMABOX_INFERENCE_GATEWAY",
        hide_env_values = true,
        value_name = "URL"
    )]
    inference_gateway: Option<String>,
    /// Fence time to live in milliseconds (tests shorten it).
    #[arg(long, hide = true, env = "OMABOX_LEASE_TTL_MS", value_name = "MS",
          value_parser = clap::value_parser!(u64).range(100..))]
    lease_ttl_ms: Option<u64>,
    /// The harness command and its arguments. None: the bundled demo.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The `--json` document.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct RunReport {
    /// The contract's run result, or null when the run was rejected.
    result: Option<ManagedRuntimeRunResult>,
    /// Why the run was rejected (pre-flight admission or cleanup persistence).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<PortError>,
    session: String,
    work_id: String,
    generation: Option<u64>,
    /// The revision this run started from (null: a new session).
    restored_revision: Option<u64>,
    outputs: Vec<SessionOutputEntryCandidate>,
    timings: BTreeMap<String, f64>,
    backend: &'static str,
    owner_id: String,
    runtime_id: Option<String>,
    cancelled: bool,
    events: Vec<TimelineEvent>,
}

/// Everything resolved from the arguments before anything runs.
struct Plan {
    scope: RuntimeResourceScope,
    profile: ManagedRuntimeProfile,
    demo: bool,
    owner_id: String,
    lease_ttl_ms: u64,
    heartbeat_interval_ms: u64,
}

/// Runs one work item and reports it.
pub async fn run(data_dir: &Path, args: RunArgs) -> anyhow::Result<ExitCode> {
    let env = SandboxFactoryEnv::from_process_env();
    wiring::check_backend(args.backend, &env)?;
    let plan = plan(&args)?;
    if let Some(gateway) = &args.inference_gateway {
        check_gateway(gateway)?;
    }
    let store = open_store(data_dir).await?;
    if let Some(seed) = &args.workspace {
        check_seed(&store, &plan.scope, seed).await?;
    }

    let timeline = Arc::new(Timeline::new(!args.json));
    let progress: Option<Arc<dyn ProgressObserver>> =
        ProgressBars::for_stderr().map(|bars| Arc::new(bars) as Arc<dyn ProgressObserver>);
    let persistence = Persistence::open(data_dir, progress)?;
    if let Some(seed) = &args.workspace {
        persistence
            .workspace
            .seed_new_session(plan.scope.clone(), seed.clone());
    }
    crate::revision::choose_restore(&store, &persistence, &plan.scope, args.from_revision).await?;
    let harness_output = Arc::new(TerminalHarnessOutput::new(args.json));
    let token_slots = SessionTokenSlots::new();
    let driver = wiring::provider_driver(
        args.backend,
        DriverInputs {
            env,
            workspace: Arc::new(TimedWorkspace::new(
                Arc::clone(&persistence.workspace),
                Arc::clone(&timeline),
            )),
            outputs: Arc::new(TimedOutputs::new(
                Arc::clone(&persistence.outputs) as _,
                Arc::clone(&timeline),
            )),
            harness_output: Some(Arc::clone(&harness_output) as _),
            usage: Some(Arc::new(store.clone()) as _),
            harness_env: Some(Arc::new(SessionTokenEnv::new(
                token_slots.clone(),
                args.inference_gateway.clone(),
            )) as _),
        },
    )
    .await?;

    if !args.json {
        let what = if plan.demo {
            "the bundled demo work item".to_owned()
        } else {
            format!("`{}`", plan.profile.driver.entry_process().command)
        };
        println!(
            "omabox run: {what} · backend {} · session {} · work item {}",
            args.backend.provider(),
            plan.scope.session_id,
            plan.scope.work_id
        );
    }

    // Admission (descriptor, then live ports) — the provider host's first half, done here so
    // the selected ports can be wrapped in the timeline and the lease journal.
    let registry = ManagedRuntimeProviderRegistry::new(vec![driver])?;
    let admitted_at = Instant::now();
    let admitted = registry
        .prepare(PrepareProviderInput {
            provider: args.backend.provider().to_owned(),
            placement: ManagedRuntimeProviderPlacement::InProcess,
            scope: plan.scope.clone(),
            profile: admission_profile(&plan.profile, None),
            provider_config: serde_json::Map::new(),
        })
        .await;
    let selection = match admitted {
        Ok(selection) => {
            timeline.event(
                "admission",
                admitted_at,
                "admitted",
                format!(
                    "{} → workspace {}, outputs {}, lane {}",
                    selection.descriptor.provider,
                    selection.plan.workspace_strategy,
                    selection
                        .plan
                        .output_strategy
                        .map_or_else(|| "none".to_owned(), |s| s.to_string()),
                    selection.plan.driver.driver_type()
                ),
                true,
            );
            selection
        }
        Err(error) => {
            let error = crate::profile_hint::explain_rejection(
                &plan.profile,
                persistence.workspace.strategies(),
                error,
            );
            return report_rejection(&args, &plan, &timeline, error);
        }
    };
    let resources = selection.resources;
    let journaled: Arc<dyn ManagedSandboxPort> = Arc::new(JournaledSandbox::new(
        resources.sandbox,
        Arc::new(store.clone()),
    ));
    let host = ManagedRuntimeHost::new(ManagedRuntimeHostDependencies {
        owner_id: plan.owner_id.clone(),
        lease_ttl_ms: plan.lease_ttl_ms,
        heartbeat_interval_ms: plan.heartbeat_interval_ms,
        session_input_sync_interval_ms: None,
        fences: Arc::new(TimedFences::new(
            Arc::new(
                SessionTokenFence::new(
                    Arc::new(store.clone()),
                    Arc::new(store.clone()),
                    Arc::new(token_slots),
                )
                .with_ttl_ms(session_token_ttl_ms(plan.lease_ttl_ms)),
            ),
            Arc::clone(&timeline),
        )),
        sandbox: Arc::new(TimedSandbox::new(journaled, Arc::clone(&timeline))),
        workspace: resources.workspace,
        outputs: resources.outputs,
        harness_driver: Arc::new(TimedHarness::new(
            resources.harness_driver,
            Arc::clone(&timeline),
        )),
        orphans: Arc::new(TimedOrphans::new(
            Arc::new(store.clone()),
            Arc::clone(&timeline),
        )),
        scheduler: None,
        runtime_checkpoint: resources.runtime_checkpoint,
        credential_egress: resources.credential_egress,
        session_inputs: resources.session_inputs,
    })?;

    let controller = AbortController::new();
    let cancelled = Arc::new(AtomicBool::new(false));
    let signals = tokio::spawn(cancel_on_signals(
        controller.clone(),
        Arc::clone(&cancelled),
    ));
    let mut input = ManagedRuntimeRunInput::new(plan.scope.clone(), plan.profile.clone());
    input.signal = Some(controller.signal());
    let outcome = host.run(input).await;
    signals.abort();
    harness_output.flush();
    let cancelled = cancelled.load(Ordering::SeqCst);

    match outcome {
        Ok(result) => {
            let outputs = published_outputs(&store, &persistence, &plan.scope, &timeline).await;
            report_result(&args, &plan, &timeline, result, outputs, cancelled)
        }
        Err(error) => report_rejection(&args, &plan, &timeline, error),
    }
}

/// The session-token TTL of a run with fence TTL `lease_ttl_ms`: max(lease TTL × 10, 1 h)
/// (module doc, "Session tokens").
pub fn session_token_ttl_ms(lease_ttl_ms: u64) -> u64 {
    lease_ttl_ms
        .saturating_mul(10)
        .max(MIN_SESSION_TOKEN_TTL_MS)
}

/// Resolves scope, profile, owner and timings from the arguments.
fn plan(args: &RunArgs) -> anyhow::Result<Plan> {
    let demo = args.command.is_empty() && args.profile.is_none();
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
    let profile = match &args.profile {
        Some(path) => profile_from_file(path, &args.command)?,
        None if demo => default_profile(
            RuntimeProcessDeclaration {
                command: "sh".into(),
                args: Some(vec!["-c".into(), DEMO_SCRIPT.into()]),
                cwd: Some("/workspace".into()),
                env: None,
            },
            false,
        ),
        None => default_profile(process_of(&args.command), args.supervised),
    };
    let lease_ttl_ms = args.lease_ttl_ms.unwrap_or(DEFAULT_LEASE_TTL_MS);
    Ok(Plan {
        scope: RuntimeResourceScope::new(WORKSPACE_ID, ENVIRONMENT_ID, session, WORK_ID),
        profile,
        demo,
        owner_id: owner_id(),
        lease_ttl_ms,
        heartbeat_interval_ms: DEFAULT_HEARTBEAT_MS.min((lease_ttl_ms / 3).max(1)),
    })
}

/// A session id: 1–128 characters of `[A-Za-z0-9._-]`.
pub fn check_id(flag: &str, id: &str) -> anyhow::Result<()> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'));
    if !valid {
        anyhow::bail!(
            "{flag} {id:?} is not valid: use 1–128 characters of A–Z, a–z, 0–9, '.', '_' and '-'"
        );
    }
    Ok(())
}

/// CMD ARGS as a process declaration running in `/workspace`.
fn process_of(command: &[String]) -> RuntimeProcessDeclaration {
    RuntimeProcessDeclaration {
        command: command.first().cloned().unwrap_or_default(),
        args: Some(command.iter().skip(1).cloned().collect()),
        cwd: Some("/workspace".into()),
        env: None,
    }
}

/// The default profile around `process` (see the module doc).
fn default_profile(process: RuntimeProcessDeclaration, supervised: bool) -> ManagedRuntimeProfile {
    let driver = if supervised {
        HarnessDriverDeclaration::OpenmaSupervised {
            protocol: SupervisorProtocol::V1,
            supervisor: process,
            harness: HarnessIdentity {
                id: "omabox-run".into(),
                version: env!("CARGO_PKG_VERSION").into(),
            },
            ready_timeout_ms: 30_000,
            heartbeat_timeout_ms: 60_000,
            drain_timeout_ms: 30_000,
        }
    } else {
        HarnessDriverDeclaration::AmaWorker { process }
    };
    ManagedRuntimeProfile {
        workspace: WorkspaceProfile {
            requirement: WorkspaceRequirement::Durable,
            preferred_strategies: Some(vec![WorkspaceStrategy::CheckpointRestore]),
        },
        outputs: OutputsProfile {
            requirement: OutputRequirement::Durable,
            preferred_strategies: Some(vec![OutputStrategy::FinalCollect]),
        },
        runtime_checkpoint: RuntimeCheckpointRequirement::Disabled,
        credential_egress: None,
        driver,
    }
}

/// Reads a profile file; CMD, when given, replaces its entry process's command and args.
fn profile_from_file(path: &Path, command: &[String]) -> anyhow::Result<ManagedRuntimeProfile> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the profile {}", path.display()))?;
    let mut profile: ManagedRuntimeProfile = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not a ManagedRuntimeProfile (JSON with workspace, outputs, runtimeCheckpoint, driver)",
            path.display()
        )
    })?;
    if let Some(program) = command.first() {
        let process = match &mut profile.driver {
            HarnessDriverDeclaration::AmaWorker { process } => process,
            HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } => supervisor,
        };
        process.command = program.clone();
        process.args = Some(command[1..].to_vec());
    }
    Ok(profile)
}

/// `<hostname>:<pid>:<random>`.
fn owner_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// Opens the store off the async workers (see [`data_dir::open_store`]).
pub async fn open_store(data_dir: &Path) -> anyhow::Result<SqliteStore> {
    data_dir::open_store(data_dir).await
}

/// `--workspace DIR` seeds only a new session: DIR must be a directory and the session must
/// have no publication yet.
async fn check_seed(
    store: &SqliteStore,
    scope: &RuntimeResourceScope,
    seed: &Path,
) -> anyhow::Result<()> {
    let metadata = std::fs::metadata(seed)
        .with_context(|| format!("--workspace {}: cannot read it", seed.display()))?;
    if !metadata.is_dir() {
        anyhow::bail!("--workspace {} is not a directory", seed.display());
    }
    if let Some(publication) = publication(store, scope).await? {
        anyhow::bail!(
            "session {} already has a published workspace (revision {}); --workspace seeds \
             only a new session. Run without --workspace to continue from revision {}, or \
             choose a new --session",
            scope.session_id,
            publication.revision,
            publication.revision
        );
    }
    Ok(())
}

/// The last publication of `scope`, read off the async workers.
pub async fn publication(
    store: &SqliteStore,
    scope: &RuntimeResourceScope,
) -> anyhow::Result<Option<omabox_contract::RuntimeResourcePublication>> {
    let store = store.clone();
    let scope = scope.clone();
    tokio::task::spawn_blocking(move || store.publication(&scope))
        .await
        .context("the store task failed")?
        .context("cannot read the session's publication")
}

/// The entries this run published (empty when it published nothing).
async fn published_outputs(
    store: &SqliteStore,
    persistence: &Persistence,
    scope: &RuntimeResourceScope,
    timeline: &Timeline,
) -> Vec<SessionOutputEntryCandidate> {
    let Some(revision) = timeline.facts().published_revision else {
        return Vec::new();
    };
    let Ok(Some(publication)) = publication(store, scope).await else {
        return Vec::new();
    };
    let Some(candidate) = publication
        .output_candidate
        .filter(|_| publication.revision == revision)
    else {
        return Vec::new();
    };
    match persistence.outputs.read_manifest(&candidate).await {
        Ok(manifest) => manifest.entries,
        Err(error) => {
            tracing::warn!(%error, "cannot read the published outputs manifest");
            Vec::new()
        }
    }
}

/// Waits for SIGINT/SIGTERM: the first cancels the run through its signal (full cleanup),
/// the second exits at once.
async fn cancel_on_signals(controller: AbortController, cancelled: Arc<AtomicBool>) {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!("cannot listen for SIGINT/SIGTERM; Ctrl-C will not clean up");
        return;
    };
    let name = tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    };
    cancelled.store(true, Ordering::SeqCst);
    eprintln!(
        "omabox: {name}: cancelling the run (terminating the sandbox, releasing the fence); \
         press Ctrl-C again to exit at once"
    );
    controller.abort(PortError::new(format!("Run cancelled by {name}")));
    tokio::select! {
        _ = interrupt.recv() => {},
        _ = terminate.recv() => {},
    }
    eprintln!(
        "omabox: exiting without cleanup; the fence expires on its TTL and `omabox reap` \
         terminates the sandbox"
    );
    std::process::exit(i32::from(EXIT_CANCELLED));
}

fn report_result(
    args: &RunArgs,
    plan: &Plan,
    timeline: &Timeline,
    result: ManagedRuntimeRunResult,
    outputs: Vec<SessionOutputEntryCandidate>,
    cancelled: bool,
) -> anyhow::Result<ExitCode> {
    let code = match (&result, cancelled) {
        (ManagedRuntimeRunResult::Completed { .. }, _) => ExitCode::SUCCESS,
        (_, true) => ExitCode::from(EXIT_CANCELLED),
        _ => ExitCode::FAILURE,
    };
    if args.json {
        print_json(args, plan, timeline, Some(result), None, outputs, cancelled)?;
        return Ok(code);
    }
    let total = timeline.elapsed().as_millis();
    let session = &plan.scope.session_id;
    match &result {
        ManagedRuntimeRunResult::Completed { revision } => {
            println!("completed: revision {revision} published in {total} ms");
            if !outputs.is_empty() {
                println!("outputs:");
                for entry in &outputs {
                    println!(
                        "  {:<32} {:>10}  {:<24} {}",
                        entry.logical_path,
                        human_bytes(entry.size),
                        entry.media_type.as_deref().unwrap_or("-"),
                        entry.content_hash
                    );
                }
            }
            println!(
                "next: `omabox run --session {session} ...` continues from revision {revision}; \
                 `omabox outputs --session {session}`; `omabox workspace export --session {session} DIR`"
            );
        }
        ManagedRuntimeRunResult::Conflict { expires_at } => {
            println!(
                "conflict: session {session} is being run by another omabox process; its fence \
                 expires at {} (if that process died, run again after that)",
                expires_at.as_deref().unwrap_or("an unknown time")
            );
        }
        ManagedRuntimeRunResult::LeaseLost => {
            let why = if cancelled {
                "the run was cancelled"
            } else {
                "the run lost ownership (fence, sandbox or heartbeat)"
            };
            println!("lease_lost: {why}; this run published nothing (took {total} ms)");
        }
        ManagedRuntimeRunResult::Failed { error } => {
            println!(
                "failed: {}; this run published nothing, its outputs were discarded (took {total} ms)",
                error.message()
            );
        }
    }
    Ok(code)
}

fn report_rejection(
    args: &RunArgs,
    plan: &Plan,
    timeline: &Timeline,
    error: PortError,
) -> anyhow::Result<ExitCode> {
    if args.json {
        print_json(args, plan, timeline, None, Some(error), Vec::new(), false)?;
        return Ok(ExitCode::FAILURE);
    }
    Err(anyhow::anyhow!("the run was rejected: {}", error.message()))
}

fn print_json(
    args: &RunArgs,
    plan: &Plan,
    timeline: &Timeline,
    result: Option<ManagedRuntimeRunResult>,
    error: Option<PortError>,
    outputs: Vec<SessionOutputEntryCandidate>,
    cancelled: bool,
) -> anyhow::Result<()> {
    let facts = timeline.facts();
    let report = RunReport {
        result,
        error,
        session: plan.scope.session_id.clone(),
        work_id: plan.scope.work_id.clone(),
        generation: facts.generation,
        restored_revision: facts
            .restored_revision
            .map(|last| args.from_revision.unwrap_or(last)),
        outputs,
        timings: timeline.timings(),
        backend: args.backend.provider(),
        owner_id: plan.owner_id.clone(),
        runtime_id: facts.runtime_id,
        cancelled,
        events: timeline.events(),
    };
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn session_ids_are_checked() {
        assert!(check_id("--session", "s1").is_ok());
        assert!(check_id("--session", "sess_0123.a-b").is_ok());
        for bad in ["", "a/b", "..a b", "é"] {
            assert!(check_id("--session", bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_profile_file_keeps_its_lane_and_takes_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        let profile = default_profile(process_of(&["old".into()]), true);
        std::fs::write(&path, serde_json::to_string(&profile).unwrap()).unwrap();
        let read = profile_from_file(&path, &["new".into(), "a".into()]).unwrap();
        let HarnessDriverDeclaration::OpenmaSupervised { supervisor, .. } = &read.driver else {
            panic!("the supervised lane is kept");
        };
        assert_eq!(supervisor.command, "new");
        assert_eq!(supervisor.args.as_deref(), Some(&["a".to_owned()][..]));
        assert_eq!(supervisor.cwd.as_deref(), Some("/workspace"));
        let unchanged = profile_from_file(&path, &[]).unwrap();
        assert_eq!(unchanged, profile);
    }

    #[test]
    fn owner_ids_are_unique_per_call() {
        let (a, b) = (owner_id(), owner_id());
        assert_ne!(a, b);
        assert!(a.contains(&format!(":{}:", std::process::id())));
    }
}
