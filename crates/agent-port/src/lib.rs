//! The tool sandbox's process ports over the omabox agent: a duplex process (streamed
//! stdin with EOF, stdout, stderr, a kill that escalates from `SIGTERM` to `SIGKILL`, its
//! exit) and a background process (kill, logs, status), each made from one agent request.
//! Every backend whose sandbox runs `omabox-agent` (linux, docker, gvisor) serves its
//! `SandboxDuplexProcessPort` and `SandboxProcessPort` with these, so the three behave the
//! same way and the code exists once.
//!
//! What a backend still decides: whether its sandbox is open at all, how an agent failure
//! reads as its own error ([`PortErrorOf`]), and whether its sandbox counts OOM kills
//! ([`OomWatch`]: the linux backend's memory cgroup does; a container's kills are not
//! counted per process).
//!
//! What this must never do: signal anything on the host (every kill is an agent request),
//! or put an environment value in an error (targets are commands and ids).

mod ca_trust;
mod user_account;

pub use ca_trust::{CA_BUNDLE_MAX, CaTrustError, RootBundle, SANDBOX_CA_FILE, trust_ca};
pub use user_account::{USER_HOME, UserAccountError, add_user_account};

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use omabox_agent::client::{
    AgentClient, BackgroundProcess, ClientError, ExecRequest, ProcessKiller,
};
use omabox_agent::message::{BackgroundStatus, ProcessExit};
use omabox_contract::PortError;
use omabox_sandbox::{
    DuplexKillSignal, OutOfMemory, ProcessHandle, ProcessLogs, ProcessSignal, ProcessStatus,
    SandboxDuplexProcess, SandboxDuplexProcessControl, SandboxDuplexProcessSpec,
    SandboxProcessControl, SandboxProcessExit,
};

/// How long a duplex kill waits for the exit before escalating to `SIGKILL` (and after
/// it).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// One agent request that failed: what was attempted, on what (a command, a path or an
/// id, never an environment value), and the agent's answer.
#[derive(Debug, thiserror::Error)]
#[error("{op} {target:?} failed")]
pub struct AgentFailure {
    /// What was attempted (`spawn`, `kill`, ...).
    pub op: &'static str,
    /// Its subject.
    pub target: String,
    /// The agent's answer.
    #[source]
    pub source: ClientError,
}

/// How a backend turns an [`AgentFailure`] into the port's error (through its own error
/// type, so the message reads as that backend's).
pub type PortErrorOf = Arc<dyn Fn(AgentFailure) -> PortError + Send + Sync>;

/// A sandbox's count of OOM kills, read before a process starts and after it ends.
pub trait OomWatch: Send + Sync {
    /// Kills counted so far (`None`: unknown).
    fn oom_kills(&self) -> Option<u64>;
    /// The memory limit in bytes, when known.
    fn memory_limit(&self) -> Option<u64>;
}

/// Whether the process ended by SIGKILL (or a shell's 137 for it).
fn sigkilled(exit: &ProcessExit) -> bool {
    exit.signal.as_deref() == Some("SIGKILL") || exit.code == Some(137)
}

/// The port's exit of a process the agent reported as `exit`; `out_of_memory` is kept only
/// for a SIGKILL (what the OOM killer sends).
pub fn sandbox_exit(exit: &ProcessExit, out_of_memory: Option<OutOfMemory>) -> SandboxProcessExit {
    let killed = sigkilled(exit);
    SandboxProcessExit {
        code: exit.code,
        signal: exit.signal.clone(),
        out_of_memory: out_of_memory.filter(|_| killed),
    }
}

/// How long a SIGKILLed process's OOM count is looked at again before it is taken as not
/// the memory limit's doing. The kernel sends the OOM killer's SIGKILL before it counts the
/// kill (`__oom_kill_process`), so on a loaded machine the victim's exit can reach us first
/// (`run.rs::a_harness_killed_by_the_memory_limit_is_named` failed so, once in CI).
const OOM_COUNT_SETTLE: std::time::Duration = std::time::Duration::from_millis(200);

/// The OOM kill a process that ended with `exit` owes to the memory limit: the count rose
/// since `before`. Only a SIGKILL this port did not send (`wait`) waits, up to
/// [`OOM_COUNT_SETTLE`], for the count.
async fn oom_since(
    oom: &dyn OomWatch,
    before: Option<u64>,
    exit: &ProcessExit,
    wait: bool,
) -> Option<OutOfMemory> {
    let killed = wait && sigkilled(exit);
    let deadline = tokio::time::Instant::now() + OOM_COUNT_SETTLE;
    loop {
        if oom.oom_kills() > before {
            return Some(OutOfMemory {
                limit_bytes: oom.memory_limit(),
            });
        }
        if !killed || before.is_none() || tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Starts `spec` through `client` as a duplex process. `oom`: the sandbox's OOM count, so
/// a process that ends by SIGKILL while it rose says it was the memory limit.
pub async fn spawn_duplex(
    client: &AgentClient,
    spec: SandboxDuplexProcessSpec,
    oom: Option<Arc<dyn OomWatch>>,
    port_error: PortErrorOf,
) -> Result<SandboxDuplexProcess, AgentFailure> {
    let SandboxDuplexProcessSpec {
        command,
        args,
        env,
        cwd,
    } = spec;
    let mut request = ExecRequest::argv(std::iter::once(command.clone()).chain(args)).envs(env);
    if let Some(cwd) = cwd {
        request = request.cwd(cwd);
    }
    // Read before the spawn: a process that outgrows the limit at once can be killed before
    // `spawn` returns, and a count read after that kill would not see it rise.
    let oom_before = oom.as_ref().and_then(|o| o.oom_kills());
    let mut process = match client.spawn(request).await {
        Ok(p) => p,
        Err(source) => {
            return Err(AgentFailure {
                op: "spawn",
                target: command,
                source,
            });
        }
    };
    let (Some(stdin), Some(stdout), Some(stderr)) = (
        process.stdin.take(),
        process.stdout.take(),
        process.stderr.take(),
    ) else {
        return Err(AgentFailure {
            op: "spawn",
            target: command,
            source: ClientError::UnexpectedReply("process without stdio streams".into()),
        });
    };
    let killer = process.killer();
    let kill_errors = Arc::clone(&port_error);
    // Set once this port signals the process: a SIGKILL is then ours, not the OOM killer's,
    // and its exit is not held back for the OOM count (a harness cancelled on every run).
    let signalled = Arc::new(AtomicBool::new(false));
    let ours = Arc::clone(&signalled);
    // Lazy: the process is awaited only when someone polls `exited` (or a kill waits for
    // it). Dropping every part of an unfinished process kills it in the sandbox.
    let exited: ExitFuture = async move {
        match process.wait().await {
            Ok(exit) => {
                let wait = !ours.load(Ordering::Acquire);
                let out_of_memory = match oom {
                    Some(o) => oom_since(o.as_ref(), oom_before, &exit, wait).await,
                    None => None,
                };
                Ok(sandbox_exit(&exit, out_of_memory))
            }
            Err(source) => Err(port_error(AgentFailure {
                op: "wait for",
                target: command,
                source,
            })),
        }
    }
    .boxed()
    .shared();
    let control = Arc::new(DuplexControl {
        killer,
        exited: exited.clone(),
        port_error: kill_errors,
        signalled,
    });
    Ok(SandboxDuplexProcess::new(
        Box::new(stdin),
        Box::new(stdout),
        Box::new(stderr),
        control,
        exited,
    ))
}

/// Starts `command` (through `/bin/sh -c`) as a background process the agent keeps.
pub async fn start_background(
    client: &AgentClient,
    command: &str,
    port_error: PortErrorOf,
) -> Result<ProcessHandle, AgentFailure> {
    let process = client
        .start_background(ExecRequest::shell(command))
        .await
        .map_err(|source| AgentFailure {
            op: "start background process",
            target: command.to_owned(),
            source,
        })?;
    Ok(ProcessHandle::new(
        process.id().to_owned(),
        process.pid(),
        Arc::new(BackgroundControl {
            process,
            port_error,
        }),
    ))
}

type ExitFuture = Shared<BoxFuture<'static, Result<SandboxProcessExit, PortError>>>;

/// Signals a duplex process and waits for it to go.
struct DuplexControl {
    killer: ProcessKiller,
    exited: ExitFuture,
    port_error: PortErrorOf,
    /// Set before this port sends the process a signal.
    signalled: Arc<AtomicBool>,
}

impl DuplexControl {
    async fn exited_within(&self, limit: Duration) -> bool {
        tokio::time::timeout(limit, self.exited.clone())
            .await
            .is_ok()
    }

    fn send(&self, signal: &str) -> Result<(), PortError> {
        self.signalled.store(true, Ordering::Release);
        self.killer.kill(signal).map_err(|source| {
            (self.port_error)(AgentFailure {
                op: "kill",
                target: signal.to_owned(),
                source,
            })
        })
    }
}

#[async_trait]
impl SandboxDuplexProcessControl for DuplexControl {
    /// Sends `signal` to the process group; after a `SIGTERM` that is not obeyed within
    /// two seconds, sends `SIGKILL`. Returns once the process exited or the waits ran out
    /// (an exit is only observed after stdout and stderr were read to their end).
    async fn kill(&self, signal: DuplexKillSignal) -> Result<(), PortError> {
        if self.exited.peek().is_some() {
            return Ok(());
        }
        self.send(signal.as_str())?;
        if self.exited_within(KILL_WAIT).await {
            return Ok(());
        }
        if signal != DuplexKillSignal::Kill {
            self.send("SIGKILL")?;
            self.exited_within(KILL_WAIT).await;
        }
        Ok(())
    }
}

/// A background process kept by the agent.
struct BackgroundControl {
    process: BackgroundProcess,
    port_error: PortErrorOf,
}

impl BackgroundControl {
    fn error(&self, op: &'static str) -> impl FnOnce(ClientError) -> PortError + '_ {
        move |source| {
            (self.port_error)(AgentFailure {
                op,
                target: self.process.id().to_owned(),
                source,
            })
        }
    }
}

#[async_trait]
impl SandboxProcessControl for BackgroundControl {
    async fn kill(&self, signal: ProcessSignal) -> Result<(), PortError> {
        self.process
            .kill(signal.as_str())
            .await
            .map_err(self.error("kill background process"))
    }

    async fn logs(&self) -> Result<ProcessLogs, PortError> {
        let logs = self
            .process
            .logs()
            .await
            .map_err(self.error("read logs of background process"))?;
        Ok(ProcessLogs {
            stdout: logs.stdout,
            stderr: logs.stderr,
        })
    }

    async fn status(&self) -> Result<ProcessStatus, PortError> {
        let status = self
            .process
            .status()
            .await
            .map_err(self.error("read status of background process"))?;
        Ok(match status {
            BackgroundStatus::Running => ProcessStatus::Running,
            BackgroundStatus::Completed => ProcessStatus::Completed,
            BackgroundStatus::Error => ProcessStatus::Error,
            BackgroundStatus::Killed => ProcessStatus::Killed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use omabox_agent::{Agent, AgentConfig, ReapMode};
    use std::path::PathBuf;

    /// Counts one OOM kill once `marker` exists; its first reading takes 300 ms, as a read
    /// on a loaded machine may.
    struct SlowFirstReading {
        marker: PathBuf,
        read_once: AtomicBool,
    }

    impl OomWatch for SlowFirstReading {
        fn oom_kills(&self) -> Option<u64> {
            if !self.read_once.swap(true, Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(300));
            }
            Some(u64::from(self.marker.exists()))
        }
        fn memory_limit(&self) -> Option<u64> {
            Some(32 << 20)
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_process_killed_before_its_spawn_returns_still_counts_as_out_of_memory() {
        let dir = tempfile::tempdir().unwrap();
        let agent = Agent::new(AgentConfig {
            reap: ReapMode::OwnChildren,
            workdir: dir.path().to_path_buf(),
            ..AgentConfig::default()
        })
        .unwrap();
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move { agent.serve(theirs).await });
        let client = AgentClient::connect(ours).await.unwrap();
        let marker = dir.path().join("killed");
        let oom: Arc<dyn OomWatch> = Arc::new(SlowFirstReading {
            marker: marker.clone(),
            read_once: AtomicBool::new(false),
        });
        // The "kill" lands at once: the marker is the OOM count rising, then SIGKILL.
        let mut spec = SandboxDuplexProcessSpec::new("/bin/sh");
        spec.args = vec![
            "-c".into(),
            format!("touch {}; kill -9 $$", marker.display()),
        ];
        let port_error: PortErrorOf = Arc::new(|failure| PortError::new(failure.to_string()));
        let process = spawn_duplex(&client, spec, Some(oom), port_error)
            .await
            .unwrap();
        let exit = process.exited().await.unwrap();
        let out_of_memory = Some(OutOfMemory {
            limit_bytes: Some(32 << 20),
        });
        assert_eq!(
            (exit.signal.as_deref(), exit.out_of_memory),
            (Some("SIGKILL"), out_of_memory)
        );
    }
}
