//! `LocalSubprocessSandbox`: exec, files, env and teardown.

use crate::error::LocalSandboxError;
use crate::group::{GroupRegistry, signal_group, signal_name};
use crate::paths::SandboxPaths;
use crate::process::{spawn_background, spawn_duplex};
use async_trait::async_trait;
use omabox_contract::PortError;
use omabox_sandbox::{
    ProcessHandle, SandboxCommandSecretsPort, SandboxDestroyPort, SandboxDuplexProcess,
    SandboxDuplexProcessPort, SandboxDuplexProcessSpec, SandboxEnvVarsPort, SandboxFileBytesPort,
    SandboxPort, SandboxProcessPort,
};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// Default exec timeout, as in the TypeScript adapter.
pub const DEFAULT_EXEC_TIMEOUT_MS: u64 = 120_000;
/// How long a timed-out command gets between `SIGTERM` and `SIGKILL`.
const TERM_GRACE: Duration = Duration::from_secs(1);
/// How long to wait for pipes to close after `SIGKILL`.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long destroy waits for killed process groups to disappear.
const DESTROY_WAIT: Duration = Duration::from_secs(2);

/// Construction options.
#[derive(Debug, Clone)]
pub struct LocalSubprocessOptions {
    /// Host directory backing `/workspace`. Created when missing; a directory the sandbox
    /// created is removed by destroy, an existing one is left in place.
    pub workdir: PathBuf,
    /// Host directory backing `/mnt/session/outputs`. Created when missing, never removed.
    pub outputs_root: Option<PathBuf>,
    /// Exec timeout when the caller passes none.
    pub default_timeout_ms: u64,
}

impl LocalSubprocessOptions {
    /// Options for `workdir` with no outputs root and the default timeout.
    pub fn new(workdir: impl Into<PathBuf>) -> Self {
        Self {
            workdir: workdir.into(),
            outputs_root: None,
            default_timeout_ms: DEFAULT_EXEC_TIMEOUT_MS,
        }
    }
}

#[derive(Debug, Default)]
struct ExecEnv {
    vars: BTreeMap<String, String>,
    secrets: Vec<(String, BTreeMap<String, String>)>,
}

/// Runs sandbox commands as plain host subprocesses. **No isolation**: tests only.
///
/// Every command runs as `/bin/sh -c <command>` (duplex processes: the executable itself)
/// with the workdir as its current directory, the host environment plus the variables set
/// through [`SandboxEnvVarsPort`], `PWD=<workdir>`, and `OMA_OUTPUTS_DIR=<outputsRoot>` when
/// an outputs root is configured. Commands see host paths; only the file API maps sandbox
/// paths (see the crate doc). Each process leads its own process group; destroy (or drop)
/// `SIGKILL`s every group that is still alive.
#[derive(Debug)]
pub struct LocalSubprocessSandbox {
    paths: SandboxPaths,
    default_timeout: Duration,
    pub(crate) groups: Arc<GroupRegistry>,
    env: Mutex<ExecEnv>,
    owned_workdir: Option<PathBuf>,
}

fn prepare_dir(path: &Path) -> Result<PathBuf, LocalSandboxError> {
    let setup = |source| LocalSandboxError::Setup {
        path: path.to_owned(),
        source,
    };
    std::fs::create_dir_all(path).map_err(setup)?;
    path.canonicalize().map_err(setup)
}

impl LocalSubprocessSandbox {
    /// Prepares the directories. Test-mode enforcement lives in
    /// [`LocalSubprocessFactory`](crate::LocalSubprocessFactory); constructing this type
    /// directly is for test code only.
    pub fn new(options: LocalSubprocessOptions) -> Result<Self, LocalSandboxError> {
        let created = !options.workdir.exists();
        let workdir = prepare_dir(&options.workdir)?;
        let outputs_root = options
            .outputs_root
            .as_deref()
            .map(prepare_dir)
            .transpose()?;
        Ok(Self {
            paths: SandboxPaths::new(workdir.clone(), outputs_root),
            default_timeout: Duration::from_millis(options.default_timeout_ms),
            groups: Arc::new(GroupRegistry::default()),
            env: Mutex::new(ExecEnv::default()),
            owned_workdir: created.then_some(workdir),
        })
    }

    /// The host directory backing `/workspace`.
    pub fn workdir(&self) -> &Path {
        self.paths.workdir()
    }

    /// The host path a sandbox path maps to (the file API's mapping).
    pub fn host_path(&self, sandbox_path: &str) -> Result<PathBuf, LocalSandboxError> {
        self.paths.resolve(sandbox_path)
    }

    fn env(&self) -> MutexGuard<'_, ExecEnv> {
        self.env.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A command with the sandbox's cwd, environment and process group set up.
    /// `secrets_for` is the text matched against registered command prefixes.
    pub(crate) fn command(&self, program: &str, secrets_for: &str) -> Command {
        let mut command = Command::new(program);
        command
            .current_dir(self.paths.workdir())
            .env("PWD", self.paths.workdir())
            .process_group(0)
            .kill_on_drop(true);
        if let Some(outputs) = self.paths.outputs_root() {
            command.env("OMA_OUTPUTS_DIR", outputs);
        }
        let env = self.env();
        command.envs(&env.vars);
        for (prefix, secrets) in &env.secrets {
            if secrets_for.starts_with(prefix.as_str()) {
                command.envs(secrets);
            }
        }
        command
    }

    pub(crate) fn paths(&self) -> &SandboxPaths {
        &self.paths
    }

    async fn run_exec(
        &self,
        command: &str,
        timeout: Duration,
    ) -> Result<String, LocalSandboxError> {
        self.groups.check_open()?;
        let mut child = self
            .command("/bin/sh", command)
            .arg("-c")
            .arg(command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| LocalSandboxError::Spawn {
                command: command.to_owned(),
                source,
            })?;
        let pgid = child
            .id()
            .and_then(|id| i32::try_from(id).ok())
            .unwrap_or(0);
        self.groups.register(pgid)?;
        let mut cleanup = KillGroupOnDrop(Some(pgid));

        let stdout = child.stdout.take();
        let stderr = child.stderr.take();
        let work = async { tokio::join!(read_all(stdout), read_all(stderr), child.wait()) };
        tokio::pin!(work);
        let (stdout, stderr, status) = tokio::select! {
            result = &mut work => result,
            () = tokio::time::sleep(timeout) => {
                signal_group(pgid, libc::SIGTERM);
                match tokio::time::timeout(TERM_GRACE, &mut work).await {
                    Ok(result) => result,
                    Err(_) => {
                        signal_group(pgid, libc::SIGKILL);
                        tokio::time::timeout(KILL_GRACE, &mut work).await.map_err(|_| {
                            LocalSandboxError::Unkillable { command: command.to_owned() }
                        })?
                    }
                }
            }
        };
        cleanup.0 = None;
        self.groups.leader_exited(pgid);
        let status = status.map_err(|source| LocalSandboxError::Io {
            operation: "wait for",
            path: command.to_owned(),
            source,
        })?;
        Ok(format_exec_output(&stdout, &stderr, status))
    }

    async fn destroy_now(&self) -> Result<(), LocalSandboxError> {
        let groups = self.groups.close_and_kill_all();
        let deadline = tokio::time::Instant::now() + DESTROY_WAIT;
        for pgid in groups {
            while crate::group::group_exists(pgid) && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        if let Some(workdir) = &self.owned_workdir {
            remove_dir(workdir).await?;
        }
        Ok(())
    }
}

async fn remove_dir(path: &Path) -> Result<(), LocalSandboxError> {
    let mut attempts = 0;
    loop {
        match tokio::fs::remove_dir_all(path).await {
            Ok(()) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            // A process killed a moment ago may still have been writing: retry briefly.
            Err(_) if attempts < 5 => {
                attempts += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(source) => {
                return Err(LocalSandboxError::Io {
                    operation: "remove workdir",
                    path: path.display().to_string(),
                    source,
                });
            }
        }
    }
}

impl Drop for LocalSubprocessSandbox {
    fn drop(&mut self) {
        self.groups.close_and_kill_all();
        if let Some(workdir) = &self.owned_workdir {
            let _ = std::fs::remove_dir_all(workdir);
        }
    }
}

/// `SIGKILL`s a process group if the future running it is dropped early.
struct KillGroupOnDrop(Option<i32>);

impl Drop for KillGroupOnDrop {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            signal_group(pgid, libc::SIGKILL);
        }
    }
}

/// The most of each exec output stream kept in memory; the rest is read and dropped, so the
/// process never blocks on a full pipe.
const MAX_EXEC_STREAM: u64 = 8 * 1024 * 1024;

async fn read_all<R: tokio::io::AsyncRead + Unpin>(reader: Option<R>) -> Vec<u8> {
    let mut buffer = Vec::new();
    if let Some(mut reader) = reader {
        let mut kept = (&mut reader).take(MAX_EXEC_STREAM);
        let _ = kept.read_to_end(&mut buffer).await;
        let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
    }
    buffer
}

/// The exec output convention of the local adapter: stdout, `"\n" + stderr` when non-empty,
/// trailing whitespace trimmed, then `"\n[exit exit=<n>]"` or `"\n[exit signal=<SIG>]"`
/// unless the exit status is 0.
pub fn format_exec_output(stdout: &[u8], stderr: &[u8], status: ExitStatus) -> String {
    let mut combined = String::from_utf8_lossy(stdout).into_owned();
    if !stderr.is_empty() {
        combined.push('\n');
        combined.push_str(&String::from_utf8_lossy(stderr));
    }
    let mut output = combined.trim_end().to_owned();
    if status.code() != Some(0) {
        let exit = match (status.signal(), status.code()) {
            (Some(signal), _) => format!("signal={}", signal_name(signal)),
            (None, Some(code)) => format!("exit={code}"),
            (None, None) => "exit=null".to_owned(),
        };
        output.push_str(&format!("\n[exit {exit}]"));
    }
    output
}

fn io_error(
    operation: &'static str,
    path: &str,
) -> impl FnOnce(std::io::Error) -> LocalSandboxError {
    let path = path.to_owned();
    move |source| LocalSandboxError::Io {
        operation,
        path,
        source,
    }
}

impl LocalSubprocessSandbox {
    async fn write_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, LocalSandboxError> {
        self.groups.check_open()?;
        let host = self.paths.resolve(path)?;
        if let Some(parent) = host.parent() {
            tokio::fs::create_dir_all(parent)
                .await
                .map_err(io_error("create parent directories of", path))?;
        }
        tokio::fs::write(&host, bytes)
            .await
            .map_err(io_error("write", path))?;
        Ok(host.to_string_lossy().into_owned())
    }

    async fn read_bytes(&self, path: &str) -> Result<Vec<u8>, LocalSandboxError> {
        self.groups.check_open()?;
        let host = self.paths.resolve(path)?;
        tokio::fs::read(&host).await.map_err(io_error("read", path))
    }
}

#[async_trait]
impl SandboxPort for LocalSubprocessSandbox {
    async fn exec(&self, command: &str, timeout_ms: Option<u64>) -> Result<String, PortError> {
        let timeout = timeout_ms
            .map(Duration::from_millis)
            .unwrap_or(self.default_timeout);
        Ok(self.run_exec(command, timeout).await?)
    }

    async fn read_file(&self, path: &str) -> Result<String, PortError> {
        let bytes = self.read_bytes(path).await?;
        String::from_utf8(bytes).map_err(|_| {
            PortError::new(format!(
                "read {path:?} failed: the file is not valid UTF-8 (use readFileBytes)"
            ))
        })
    }

    async fn write_file(&self, path: &str, content: &str) -> Result<String, PortError> {
        Ok(self.write_bytes(path, content.as_bytes()).await?)
    }

    fn as_duplex_process(&self) -> Option<&dyn SandboxDuplexProcessPort> {
        Some(self)
    }

    fn as_process(&self) -> Option<&dyn SandboxProcessPort> {
        Some(self)
    }

    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        Some(self)
    }

    fn as_env_vars(&self) -> Option<&dyn SandboxEnvVarsPort> {
        Some(self)
    }

    fn as_command_secrets(&self) -> Option<&dyn SandboxCommandSecretsPort> {
        Some(self)
    }

    fn as_destroy(&self) -> Option<&dyn SandboxDestroyPort> {
        Some(self)
    }
}

#[async_trait]
impl SandboxFileBytesPort for LocalSubprocessSandbox {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        Ok(self.read_bytes(path).await?)
    }

    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError> {
        Ok(self.write_bytes(path, bytes).await?)
    }
}

#[async_trait]
impl SandboxEnvVarsPort for LocalSubprocessSandbox {
    async fn set_env_vars(&self, vars: BTreeMap<String, String>) -> Result<(), PortError> {
        for key in vars.keys() {
            if key.is_empty() || key.contains('=') || key.contains('\0') {
                return Err(PortError::invalid_argument(format!(
                    "invalid environment variable name {key:?}"
                )));
            }
        }
        let translated: Vec<(String, String)> = vars
            .into_iter()
            .map(|(key, value)| {
                let value = self.paths.translate_env_value(&value);
                (key, value)
            })
            .collect();
        if translated.iter().any(|(_, value)| value.contains('\0')) {
            return Err(PortError::invalid_argument(
                "environment variable values must not contain NUL",
            ));
        }
        self.env().vars.extend(translated);
        Ok(())
    }
}

impl SandboxCommandSecretsPort for LocalSubprocessSandbox {
    fn register_command_secrets(&self, command_prefix: &str, secrets: BTreeMap<String, String>) {
        self.env()
            .secrets
            .push((command_prefix.to_owned(), secrets));
    }
}

#[async_trait]
impl SandboxDestroyPort for LocalSubprocessSandbox {
    async fn destroy(&self) -> Result<(), PortError> {
        Ok(self.destroy_now().await?)
    }
}

#[async_trait]
impl SandboxDuplexProcessPort for LocalSubprocessSandbox {
    async fn spawn_duplex_process(
        &self,
        spec: SandboxDuplexProcessSpec,
    ) -> Result<SandboxDuplexProcess, PortError> {
        Ok(spawn_duplex(self, spec)?)
    }
}

#[async_trait]
impl SandboxProcessPort for LocalSubprocessSandbox {
    async fn start_process(&self, command: &str) -> Result<ProcessHandle, PortError> {
        Ok(spawn_background(self, command)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn exec_output_is_capped_and_the_rest_drained() {
        let mut source = tokio::io::repeat(b'x').take(3 * MAX_EXEC_STREAM);
        let kept = read_all(Some(&mut source)).await;
        assert_eq!(kept.len() as u64, MAX_EXEC_STREAM);
        let mut rest = Vec::new();
        source.read_to_end(&mut rest).await.unwrap();
        assert!(
            rest.is_empty(),
            "everything past the cap was read and dropped"
        );
    }
}
