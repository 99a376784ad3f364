//! The `runsc` command line: run, checkpoint, restore, delete — one process each.
//!
//! Never: pass a sandbox-controlled string as an argument (ids are ours, paths are under
//! the backend's own directory); keep runsc's output unbounded (stderr goes to a file
//! the caller owns, and only its last bytes go into an error).

use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use crate::GvisorError;

/// Bytes of runsc's log kept in an error.
const LOG_TAIL: u64 = 2048;

/// The container's stdin and stdout: the read end of one pipe and the write end of
/// another. Pipes, not one socket: Debian's runsc 0.0~20221219 restored a process whose
/// stdio was a host socket with that socket reset about one time in ten (the process read
/// EOF and exited, or crashed), and did not in 27 rounds with pipes
/// (`tests/repro/runsc_restore.py --pipes`).
#[derive(Debug, Clone, Copy)]
pub struct Stdio2<'a> {
    /// The container's fd 0 (the read end of the host's request pipe).
    pub stdin: &'a OwnedFd,
    /// The container's fd 1 (the write end of the host's answer pipe).
    pub stdout: &'a OwnedFd,
}

/// How runsc is invoked: the binary, its state root, its platform.
#[derive(Debug, Clone)]
pub struct Runsc {
    /// The `runsc` executable.
    pub binary: PathBuf,
    /// `--root`: where runsc keeps container state (ours alone).
    pub root: PathBuf,
    /// `--platform`: `ptrace` (no `/dev/kvm` needed) or `kvm`.
    pub platform: String,
    /// `--overlay2 root:memory`: the root (an image's, read-only in the cache) gets a
    /// writable overlay in the sandbox's memory, where mount points missing in the image
    /// are made too.
    pub overlay_root: bool,
    /// The parent of a foreground runsc (`omabox-gvisor-init --subreaper`): it reaps what
    /// runsc leaves when it ends first (the init's `subreaper.rs` says why). `None`: runsc
    /// is our child directly.
    pub subreaper: Option<PathBuf>,
}

impl Runsc {
    fn command(&self) -> std::process::Command {
        self.with_options(std::process::Command::new(&self.binary), None)
    }

    /// A foreground container's runsc: under [`Runsc::subreaper`] when set.
    fn foreground(&self, netns: Option<BorrowedFd<'_>>) -> std::process::Command {
        let cmd = match &self.subreaper {
            Some(parent) => {
                let mut cmd = std::process::Command::new(parent);
                cmd.arg("--subreaper").arg(&self.binary);
                cmd
            }
            None => std::process::Command::new(&self.binary),
        };
        self.with_options(cmd, netns)
    }

    /// `cmd` (runsc, or its subreaper with runsc's path) with runsc's global options; with `netns`, run inside that network namespace with
    /// `--network host`: gVisor's sockets are then host sockets of that namespace, which has
    /// loopback only and the host's DNS stub, relay and gateway bound in it
    /// (`omabox_sandbox_net`). Without, `--network none`: gVisor's own stack, loopback only.
    fn with_options(
        &self,
        mut cmd: std::process::Command,
        netns: Option<BorrowedFd<'_>>,
    ) -> std::process::Command {
        cmd.arg("--root")
            .arg(&self.root)
            .arg("--platform")
            .arg(&self.platform)
            .arg("--network")
            .arg(if netns.is_some() { "host" } else { "none" });
        if self.overlay_root {
            cmd.arg("--overlay2").arg("root:memory");
        }
        if let Some(netns) = netns {
            let fd = netns.as_raw_fd();
            // SAFETY: the closure runs in the forked child before exec and makes one
            // async-signal-safe system call (setns) on an fd the parent keeps open for the
            // whole spawn; it allocates nothing.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd
    }

    /// `runsc run` of container `id` in the foreground, with `stdio` as its stdin and stdout.
    ///
    /// The returned child is runsc waiting for the container. Not `--detach`: a detached
    /// sandbox process is an orphan, reaped only by PID 1, and a PID 1 that does not reap
    /// (this project's machines, many containers) left it a zombie for which every
    /// `runsc delete` waited a second and then left its cgroups behind. In the foreground
    /// runsc reaps its sandbox and removes the container when it ends (a kill, the init's
    /// exit, a checkpoint); the caller waits for the child.
    /// With `netns`, runsc and its sandbox run in that network namespace
    /// ([`Runsc::with_options`]).
    pub fn run(
        &self,
        id: &str,
        bundle: &Path,
        stdio: Stdio2<'_>,
        log: &Path,
        netns: Option<BorrowedFd<'_>>,
    ) -> Result<Child, GvisorError> {
        let mut cmd = self.foreground(netns);
        cmd.arg("run").arg("--bundle").arg(bundle).arg(id);
        self.spawn(cmd, stdio, log)
    }

    /// `runsc restore` of the image in `image_dir` as container `id`, in the foreground as
    /// [`Runsc::run`].
    pub fn restore(
        &self,
        id: &str,
        bundle: &Path,
        image_dir: &Path,
        stdio: Stdio2<'_>,
        log: &Path,
        netns: Option<BorrowedFd<'_>>,
    ) -> Result<Child, GvisorError> {
        let mut cmd = self.foreground(netns);
        cmd.arg("restore")
            .arg("--bundle")
            .arg(bundle)
            .arg("--image-path")
            .arg(image_dir)
            .arg(id);
        self.spawn(cmd, stdio, log)
    }

    /// `runsc kill <id> KILL`: the container's processes die, and a foreground runsc ends.
    pub fn kill(&self, id: &str, log: &Path) -> Result<(), GvisorError> {
        let mut cmd = self.command();
        cmd.arg("kill").arg(id).arg("KILL");
        self.finish("kill", cmd, log)
    }

    fn spawn(
        &self,
        mut cmd: std::process::Command,
        stdio: Stdio2<'_>,
        log: &Path,
    ) -> Result<Child, GvisorError> {
        let spawn_err = |e| GvisorError::Spawn {
            binary: self.binary.clone(),
            source: e,
        };
        let stdin = stdio.stdin.try_clone().map_err(spawn_err)?;
        let stdout = stdio.stdout.try_clone().map_err(spawn_err)?;
        let err_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(spawn_err)?;
        cmd.stdin(Stdio::from(stdin))
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(err_log))
            .spawn()
            .map_err(spawn_err)
    }

    /// `runsc checkpoint` into `image_dir`; the container stops.
    pub fn checkpoint(&self, id: &str, image_dir: &Path, log: &Path) -> Result<(), GvisorError> {
        let mut cmd = self.command();
        cmd.arg("checkpoint")
            .arg("--compression=none")
            .arg("--image-path")
            .arg(image_dir)
            .arg(id);
        self.finish("checkpoint", cmd, log)
    }

    /// `runsc delete --force`: kills and forgets the container (absent = done).
    pub fn delete(&self, id: &str, log: &Path) -> Result<(), GvisorError> {
        let mut cmd = self.command();
        cmd.arg("delete").arg("--force").arg(id);
        self.finish("delete", cmd, log)
    }

    fn finish(
        &self,
        op: &'static str,
        mut cmd: std::process::Command,
        log: &Path,
    ) -> Result<(), GvisorError> {
        let spawn_err = |e| GvisorError::Spawn {
            binary: self.binary.clone(),
            source: e,
        };
        cmd.stdin(Stdio::null()).stdout(Stdio::null());
        // stderr goes to a file, never a pipe we would wait on for EOF.
        let err_log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(spawn_err)?;
        cmd.stderr(Stdio::from(err_log));
        let status = cmd.status().map_err(spawn_err)?;
        if status.success() {
            Ok(())
        } else {
            Err(GvisorError::Runsc {
                op,
                status: status.to_string(),
                log_tail: tail(log),
            })
        }
    }
}

/// The last bytes of runsc's log, lossily decoded (runsc's own text, not the sandbox's).
pub(crate) fn tail(log: &Path) -> String {
    use std::io::Seek;
    let Ok(mut f) = std::fs::File::open(log) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(LOG_TAIL)));
    let mut buf = Vec::new();
    let _ = f.take(LOG_TAIL).read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}
