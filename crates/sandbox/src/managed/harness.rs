//! The two harness lanes over a runtime's duplex processes.
//!
//! - [`DirectAmaWorkerDriver`]: `ama_worker` (reference §1.15 "Direct harness"). Spawns the
//!   declared process with only its declared fields (command, args, env, cwd), closes its
//!   stdin (the worker gets no input), drains stdout and stderr (forwarding them to an
//!   optional [`HarnessOutputSink`]), and maps the exit: 0 → `completed`, otherwise
//!   "AMA worker exited with code <code>" plus " (<signal>)" when a signal ended it (and
//!   "; killed: out of memory (limit N MiB)" when the sandbox's memory limit did). On abort
//!   it sends SIGTERM (errors ignored) and resolves `aborted`.
//! - [`SandboxSupervisorTransport`]: the supervisor as a duplex process wrapped in a
//!   [`JsonLinesSupervisorChannel`]; the host's supervised driver (through the registry's
//!   projection) speaks the protocol over it. An abort during spawn kills the child (SIGTERM,
//!   errors ignored) and fails with the abort reason.
//!
//! Both lanes consult an optional [`HarnessEnvSource`] at spawn time: its variables are
//! merged over the declared env of the process (`None` deletes). It is how a claim's session
//! token reaches the harness (`HOSTED_INFERENCE_TOKEN`) without ever entering the driver
//! declaration, the profile, the plan, the lease or any `Debug` output: the merged value
//! exists only in the [`SandboxDuplexProcessSpec`] handed straight to the spawn (never logged).

use super::runtime::ProviderManagedRuntime;
use crate::process::{
    DuplexKillSignal, SandboxByteReader, SandboxDuplexProcess, SandboxDuplexProcessSpec,
};
use crate::supervisor_channel::{JsonLinesSupervisorChannel, SupervisorKill};
use async_trait::async_trait;
use futures::FutureExt;
use omabox_contract::SecretString;
use omabox_contract::{
    HarnessDriverDeclaration, HarnessDriverType, HarnessSupervisorChannel,
    HarnessSupervisorTransportPort, ManagedWorkExecutionResult, OpenSupervisorInput, PortError,
    RunHarnessInput, RuntimeProcessDeclaration, RuntimeResourceScope,
    SandboxHarnessDriverCapabilities, SandboxHarnessDriverPort,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long stdout/stderr may stay open after the worker exited (a background grandchild
/// holding the pipe must not hang the run).
const DRAIN_GRACE: Duration = Duration::from_secs(2);

/// Which stream a chunk of harness output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HarnessStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

/// Receives harness output as it arrives (e.g. the CLI streaming it to a terminal).
/// Called from a background task; must not block.
pub trait HarnessOutputSink: Send + Sync {
    /// One chunk of bytes from `stream`.
    fn output(&self, stream: HarnessStream, bytes: &[u8]);
}

/// Reads `reader` to its end, forwarding every chunk to `sink` (harness lanes built outside
/// this crate, like the ACP harness, drain the agent's stderr with it).
pub async fn drain(
    mut reader: SandboxByteReader,
    stream: HarnessStream,
    sink: Option<Arc<dyn HarnessOutputSink>>,
) {
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                if let Some(sink) = &sink {
                    sink.output(stream, &buffer[..read]);
                }
            }
        }
    }
}

/// Variables a harness process gets at spawn time on top of its declared env (module doc).
///
/// `generation` is the claim's work generation when the lane knows it (`ama_worker`: the
/// fence of `RunHarnessInput`) and `None` when it does not (`openma_supervised`: the
/// transport's `OpenSupervisorInput` carries only the scope) — then the source answers for
/// the scope's current claim. That is exact, not a guess: a scope has one live claim at a
/// time (the fence), and a newer generation's token revokes the older ones.
///
/// Implementations must not log the values.
pub trait HarnessEnvSource: Send + Sync {
    /// `Some(value)` sets a variable, `None` removes it (also from an inherited host env).
    fn env_for(
        &self,
        scope: &RuntimeResourceScope,
        generation: Option<u64>,
    ) -> BTreeMap<String, Option<SecretString>>;
}

/// The duplex spec of a declared process: only its declared fields, with `extra` merged over
/// its env.
pub(crate) fn spec_of(
    process: &RuntimeProcessDeclaration,
    extra: BTreeMap<String, Option<SecretString>>,
) -> SandboxDuplexProcessSpec {
    let mut env: BTreeMap<String, Option<String>> = process
        .env
        .iter()
        .flatten()
        .map(|(key, value)| (key.clone(), Some(value.clone())))
        .collect();
    env.extend(
        extra
            .into_iter()
            .map(|(key, value)| (key, value.map(|value| value.expose().to_owned()))),
    );
    SandboxDuplexProcessSpec {
        command: process.command.clone(),
        args: process.args.clone().unwrap_or_default(),
        env,
        cwd: process.cwd.clone(),
    }
}

/// The spawn-time variables of `source` (none without a source).
fn extra_env(
    source: Option<&Arc<dyn HarnessEnvSource>>,
    scope: &RuntimeResourceScope,
    generation: Option<u64>,
) -> BTreeMap<String, Option<SecretString>> {
    source.map_or_else(BTreeMap::new, |source| source.env_for(scope, generation))
}

/// The duplex spec of a declared harness process with `source`'s spawn-time variables merged
/// over its env (see [`HarnessEnvSource`]): for harness lanes built outside this crate. The
/// spec holds secret values; hand it straight to the spawn and never log it.
pub fn harness_process_spec(
    process: &RuntimeProcessDeclaration,
    source: Option<&Arc<dyn HarnessEnvSource>>,
    scope: &RuntimeResourceScope,
    generation: Option<u64>,
) -> SandboxDuplexProcessSpec {
    spec_of(process, extra_env(source, scope, generation))
}

/// `ama_worker` over a runtime's duplex processes.
#[derive(Clone)]
pub struct DirectAmaWorkerDriver {
    runtime: Arc<ProviderManagedRuntime>,
    output: Option<Arc<dyn HarnessOutputSink>>,
    harness_env: Option<Arc<dyn HarnessEnvSource>>,
}

impl std::fmt::Debug for DirectAmaWorkerDriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirectAmaWorkerDriver")
            .field("provider", &self.runtime.provider_name())
            .field("output", &self.output.is_some())
            .field("harness_env", &self.harness_env.is_some())
            .finish()
    }
}

impl DirectAmaWorkerDriver {
    /// A driver over `runtime`'s sandboxes, forwarding output to `output` when given.
    pub fn new(
        runtime: Arc<ProviderManagedRuntime>,
        output: Option<Arc<dyn HarnessOutputSink>>,
    ) -> Self {
        Self {
            runtime,
            output,
            harness_env: None,
        }
    }

    /// Merges `source`'s variables over the declared env at every spawn.
    pub fn with_harness_env(mut self, source: Arc<dyn HarnessEnvSource>) -> Self {
        self.harness_env = Some(source);
        self
    }

    async fn wait(
        &self,
        process: SandboxDuplexProcess,
        input: &RunHarnessInput,
    ) -> Result<ManagedWorkExecutionResult, PortError> {
        let exited = process.exited();
        let control = process.control();
        let SandboxDuplexProcess {
            mut stdin,
            stdout,
            stderr,
            ..
        } = process;
        let stdout = tokio::spawn(drain(stdout, HarnessStream::Stdout, self.output.clone()));
        let stderr = tokio::spawn(drain(stderr, HarnessStream::Stderr, self.output.clone()));
        let _ = stdin.shutdown().await;
        drop(stdin);
        let exit = tokio::select! {
            biased;
            _ = input.signal.aborted() => None,
            exit = exited => Some(exit),
        };
        let Some(exit) = exit else {
            let _ = control.kill(DuplexKillSignal::Term).await;
            stdout.abort();
            stderr.abort();
            return Ok(ManagedWorkExecutionResult::Aborted);
        };
        let drained = async {
            let _ = stdout.await;
            let _ = stderr.await;
        };
        let _ = tokio::time::timeout(DRAIN_GRACE, drained).await;
        let exit = exit?;
        if exit.code == Some(0) {
            return Ok(ManagedWorkExecutionResult::Completed);
        }
        let code = exit
            .code
            .map_or_else(|| "null".to_owned(), |code| code.to_string());
        let signal = exit
            .signal
            .map(|signal| format!(" ({signal})"))
            .unwrap_or_default();
        // The contract's text, then why the kernel sent that SIGKILL when the backend knows.
        let memory = exit
            .out_of_memory
            .map(|oom| format!("; {oom}"))
            .unwrap_or_default();
        Err(PortError::new(format!(
            "AMA worker exited with code {code}{signal}{memory}"
        )))
    }
}

#[async_trait]
impl SandboxHarnessDriverPort for DirectAmaWorkerDriver {
    async fn driver_capabilities(
        &self,
        _scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        let drivers = if self.runtime.provider().capabilities().duplex_process {
            vec![HarnessDriverType::AmaWorker]
        } else {
            Vec::new()
        };
        Ok(SandboxHarnessDriverCapabilities { drivers })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        let HarnessDriverDeclaration::AmaWorker { process } = &input.driver else {
            return Err(PortError::new(format!(
                "Provider direct driver cannot run {}",
                input.driver.driver_type()
            )));
        };
        input.signal.throw_if_aborted()?;
        let sandbox = self.runtime.sandbox(&input.sandbox).await?;
        let duplex = sandbox.as_duplex_process().ok_or_else(|| {
            PortError::new(
                "Provider advertised ama_worker but its runtime has no duplex process Port",
            )
        })?;
        let extra = extra_env(
            self.harness_env.as_ref(),
            &input.scope,
            Some(input.fence.generation),
        );
        let spawned = duplex.spawn_duplex_process(spec_of(process, extra)).await?;
        self.wait(spawned, &input).await
    }
}

/// `openma_supervised` transport: the supervisor as a duplex process, JSON Lines over stdio.
#[derive(Clone)]
pub struct SandboxSupervisorTransport {
    runtime: Arc<ProviderManagedRuntime>,
    output: Option<Arc<dyn HarnessOutputSink>>,
    harness_env: Option<Arc<dyn HarnessEnvSource>>,
}

impl std::fmt::Debug for SandboxSupervisorTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxSupervisorTransport")
            .field("provider", &self.runtime.provider_name())
            .field("output", &self.output.is_some())
            .field("harness_env", &self.harness_env.is_some())
            .finish()
    }
}

impl SandboxSupervisorTransport {
    /// A transport over `runtime`'s sandboxes; the supervisor's stderr goes to `output` when
    /// given (and is discarded otherwise, as the protocol says).
    pub fn new(
        runtime: Arc<ProviderManagedRuntime>,
        output: Option<Arc<dyn HarnessOutputSink>>,
    ) -> Self {
        Self {
            runtime,
            output,
            harness_env: None,
        }
    }

    /// Merges `source`'s variables over the declared env at every spawn.
    pub fn with_harness_env(mut self, source: Arc<dyn HarnessEnvSource>) -> Self {
        self.harness_env = Some(source);
        self
    }
}

#[async_trait]
impl HarnessSupervisorTransportPort for SandboxSupervisorTransport {
    async fn open(
        &self,
        input: OpenSupervisorInput,
    ) -> Result<Box<dyn HarnessSupervisorChannel>, PortError> {
        input.signal.throw_if_aborted()?;
        let sandbox = self.runtime.sandbox(&input.sandbox).await?;
        let duplex = sandbox.as_duplex_process().ok_or_else(|| {
            PortError::new(
                "Provider advertised openma_supervised but its runtime has no duplex process Port",
            )
        })?;
        let extra = extra_env(self.harness_env.as_ref(), &input.scope, None);
        let process = duplex
            .spawn_duplex_process(spec_of(&input.process, extra))
            .await?;
        if let Some(reason) = input.signal.reason() {
            let _ = process.kill(DuplexKillSignal::Term).await;
            return Err(reason);
        }
        let control = process.control();
        let exited = process.exited();
        let exit_report = process.exited();
        let SandboxDuplexProcess {
            stdin,
            stdout,
            stderr,
            ..
        } = process;
        tokio::spawn(drain(stderr, HarnessStream::Stderr, self.output.clone()));
        let kill: SupervisorKill = Box::new(move || {
            async move {
                let result = control.kill(DuplexKillSignal::Term).await;
                // Keep the exit future alive until the process is gone.
                drop(exited);
                result
            }
            .boxed()
        });
        Ok(Box::new(
            JsonLinesSupervisorChannel::new(stdin, stdout, kill, input.signal)
                .with_exit(exit_report),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spawn_time_env_is_merged_over_the_declared_env() {
        let process = RuntimeProcessDeclaration {
            command: "sh".into(),
            args: None,
            cwd: None,
            env: Some(BTreeMap::from([
                ("KEEP".to_owned(), "1".to_owned()),
                ("OPENAI_API_KEY".to_owned(), "declared".to_owned()),
                ("TOKEN".to_owned(), "declared".to_owned()),
            ])),
        };
        let extra = BTreeMap::from([
            ("OPENAI_API_KEY".to_owned(), None),
            ("TOKEN".to_owned(), Some(SecretString::new("omst_x"))),
        ]);
        let spec = spec_of(&process, extra);
        assert_eq!(
            spec.env,
            BTreeMap::from([
                ("KEEP".to_owned(), Some("1".to_owned())),
                ("OPENAI_API_KEY".to_owned(), None),
                ("TOKEN".to_owned(), Some("omst_x".to_owned())),
            ])
        );
        assert!(spec_of(&process, BTreeMap::new()).env["TOKEN"].is_some());
    }
}
