//! The host cache of ACP agent packages (`omabox run --agent NAME`): each known agent's
//! pinned npm package is installed once, on first use, into
//! `<cache>/<name>-<version>/node_modules`, and mounted read-only into every sandbox that
//! runs it (`OMABOX_LINUX_READONLY_BINDS`).
//!
//! `<cache>` is the `agent_cache` setting (`OMABOX_AGENT_CACHE`, an absolute path) or
//! `<data-dir>/agents` (`NodeConfig::agent_cache`).
//!
//! Install: under an exclusive `flock` on `<cache>/.lock` (two runs never install the same
//! agent twice, and nobody else is installing while leftovers are swept), `npm install
//! --ignore-scripts` (no package script runs on the host) into `<cache>/.partial-<name>`,
//! checked (the agent's entry program exists), then renamed into place. A crash at any
//! point leaves at most a `.partial-*` directory, removed by the next install. npm checks
//! every tarball against the registry's integrity hash. The cache is created `0755` and
//! owned by the user running omabox: what is in it runs inside sandboxes, so no other user
//! may write to it. What the install shows goes through an [`InstallObserver`] (the CLI
//! draws a spinner): nothing here writes to a terminal.

use anyhow::{Context, bail};
use omabox_acp::agents::KnownAgent;
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// npm's stderr kept for an error message.
const MAX_NPM_ERROR_BYTES: usize = 8 * 1024;

/// What an install shows while it runs.
pub trait InstallObserver: Send + Sync {
    /// An install starts: `message` says what (`installing PKG (first use; npm)`).
    fn started(&self, message: &str);
    /// It ended, installed or not.
    fn ended(&self);
    /// A line for the operator (`omabox: installed PKG into DIR in N s`).
    fn line(&self, line: &str);
}

/// The installed package directory of `agent` (the one to mount), installing it first
/// when it is missing; `observer` shows the install.
pub fn ensure_installed(
    cache: &Path,
    agent: &KnownAgent,
    observer: &dyn InstallObserver,
) -> anyhow::Result<PathBuf> {
    let installed = cache.join(agent.cache_name());
    if installed.join(agent.entry_path()).is_file() {
        return Ok(installed);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(cache)
        .with_context(|| format!("cannot create the agent cache {}", cache.display()))?;
    check_owned(cache)?;
    let lock = std::fs::File::create(cache.join(".lock"))
        .with_context(|| format!("cannot open {}", cache.join(".lock").display()))?;
    // Blocking until the other installer is done.
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)
        .map_err(|e| anyhow::anyhow!("cannot lock the agent cache: {e}"))?;
    if installed.join(agent.entry_path()).is_file() {
        return Ok(installed); // another run installed it meanwhile
    }
    sweep_partials(cache);
    if installed.exists() {
        // An entry without its program: damaged (e.g. edited by hand); install it again.
        std::fs::remove_dir_all(&installed)
            .with_context(|| format!("cannot remove the damaged {}", installed.display()))?;
    }
    let partial = cache.join(format!(".partial-{}", agent.cache_name()));
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&partial)
        .with_context(|| format!("cannot create {}", partial.display()))?;
    let started = Instant::now();
    observer.started(&format!("installing {} (first use; npm)", agent.spec()));
    let result = npm_install(&partial, agent);
    observer.ended();
    result?;
    if !partial.join(agent.entry_path()).is_file() {
        let _ = std::fs::remove_dir_all(&partial);
        bail!(
            "npm installed {} but its program {} is missing (unsupported platform?)",
            agent.spec(),
            agent.entry_path()
        );
    }
    std::fs::rename(&partial, &installed)
        .with_context(|| format!("cannot move the install to {}", installed.display()))?;
    observer.line(&format!(
        "omabox: installed {} into {} in {:.1} s",
        agent.spec(),
        installed.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(installed)
}

/// Fails clearly when `agent` needs `node` and the host has none (the preinstalled root
/// filesystem shows the host's `/usr`, so the host's node is the sandbox's).
pub fn check_node(agent: &KnownAgent) -> anyhow::Result<()> {
    if !matches!(agent.entry, omabox_acp::agents::AgentEntry::Node(_)) {
        return Ok(());
    }
    let found = Command::new("node")
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        bail!(
            "--agent {} runs on node, which is not on this host's PATH (Debian: apt install nodejs)",
            agent.name
        );
    }
    Ok(())
}

/// Refuses a cache another user owns (its content runs in sandboxes).
fn check_owned(cache: &Path) -> anyhow::Result<()> {
    let meta = std::fs::metadata(cache)
        .with_context(|| format!("cannot read the agent cache {}", cache.display()))?;
    let me = rustix::process::geteuid().as_raw();
    if meta.uid() != me || meta.mode() & 0o022 != 0 {
        bail!(
            "the agent cache {} must be owned by uid {me} and writable by nobody else",
            cache.display()
        );
    }
    Ok(())
}

/// Removes the `.partial-*` leftovers of crashed installs (the lock is held).
fn sweep_partials(cache: &Path) {
    let Ok(entries) = std::fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(".partial-") {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// `npm install` of the pinned package into `prefix`, scripts off; npm's error on failure.
fn npm_install(prefix: &Path, agent: &KnownAgent) -> anyhow::Result<()> {
    let mut child = Command::new("npm")
        .args([
            "install",
            "--no-audit",
            "--no-fund",
            "--no-update-notifier",
            "--ignore-scripts",
            "--omit=dev",
            "--loglevel=error",
            "--prefix",
        ])
        .arg(prefix)
        .arg(agent.spec())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => anyhow::anyhow!(
                "--agent {} needs npm on the host to install {} (Debian: apt install npm)",
                agent.name,
                agent.spec()
            ),
            _ => anyhow::Error::new(error).context("cannot start npm"),
        })?;
    let mut stderr = Vec::new();
    if let Some(pipe) = child.stderr.take() {
        // Keep the head of npm's complaint; drain the rest so npm never blocks on the pipe.
        let mut pipe = pipe;
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            let room = MAX_NPM_ERROR_BYTES.saturating_sub(stderr.len());
            stderr.extend_from_slice(&buf[..n.min(room)]);
        }
    }
    let status = child.wait().context("npm did not finish")?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(prefix);
        bail!(
            "npm install {} failed ({status}): {}",
            agent.spec(),
            String::from_utf8_lossy(&stderr).trim()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Silent;

    impl InstallObserver for Silent {
        fn started(&self, _: &str) {}
        fn ended(&self) {}
        fn line(&self, _: &str) {}
    }

    #[test]
    fn an_installed_agent_is_found_without_npm() {
        let cache = tempfile::tempdir().unwrap();
        let agent = omabox_acp::agents::known_agent("claude").unwrap();
        let entry = cache
            .path()
            .join(agent.cache_name())
            .join(agent.entry_path());
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        std::fs::write(&entry, "// agent").unwrap();
        let dir = ensure_installed(cache.path(), agent, &Silent).unwrap();
        assert_eq!(dir, cache.path().join(agent.cache_name()));
    }

    #[test]
    fn a_cache_others_can_write_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let cache = tempfile::tempdir().unwrap();
        std::fs::set_permissions(cache.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let agent = omabox_acp::agents::known_agent("codex").unwrap();
        let error = ensure_installed(cache.path(), agent, &Silent).unwrap_err();
        assert!(
            error.to_string().contains("writable by nobody else"),
            "{error}"
        );
    }
}
