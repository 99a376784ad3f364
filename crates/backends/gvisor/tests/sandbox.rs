//! The gvisor backend against the real runsc: exec, files, destroy; duplex and background
//! processes, byte files and env vars (the ports shared with the linux and docker
//! backends through `omabox-agent-port`).
//!
//! Pause/resume/fork of a process whose state lives only in memory: on Debian 12's runsc
//! (0.0~20221219) this test failed in about half its debug runs (the restored process
//! crashed, `repro/runsc_restore.py` shows it without omabox); scripts/setup installs
//! Debian 13's (0.0~20240729), on which it passes.
//!
//! Needs root and `runsc` (scripts/setup installs it); without them the tests skip
//! locally and fail under CI=true.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use omabox_backend_gvisor::{
    GvisorConfig, GvisorRuntime, GvisorSandbox, GvisorSandboxPort, SandboxSpec, State,
};
use omabox_sandbox::{
    DuplexKillSignal, ProcessSignal, ProcessStatus, SandboxDuplexProcessSpec, SandboxPort,
    SandboxProcessExit,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn runsc() -> Option<PathBuf> {
    ["/usr/bin/runsc", "/usr/local/bin/runsc", "/usr/sbin/runsc"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The runtime under a fresh directory, or `None` (skipped) where runsc or root is missing.
fn runtime(dir: &Path) -> Option<GvisorRuntime> {
    let missing = match runsc() {
        None => Some("runsc is not installed (scripts/setup installs it)".to_owned()),
        // SAFETY: geteuid has no preconditions.
        Some(_) if unsafe { libc::geteuid() } != 0 => Some("runsc needs root here".to_owned()),
        Some(_) => None,
    };
    if !omabox_test_support::require_capability(missing) {
        return None;
    }
    Some(
        GvisorRuntime::new(GvisorConfig {
            runsc: runsc()?,
            dir: dir.to_path_buf(),
            init: PathBuf::from(env!("CARGO_BIN_EXE_omabox-gvisor-init")),
            platform: "ptrace".into(),
            limits: Default::default(),
            network: Default::default(),
            test_hosts: None,
            image_root: None,
        })
        .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_commands_with_exit_codes_and_files_and_destroy_removes_everything() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rt) = runtime(tmp.path()) else {
        return;
    };
    let sandbox = Arc::new(rt.create().await.unwrap());
    let port = GvisorSandboxPort::new(sandbox.clone());

    assert_eq!(port.exec("echo hello", None).await.unwrap(), "hello");
    let failed = port
        .exec("echo out; echo err >&2; exit 3", None)
        .await
        .unwrap();
    // stdout, a line break, then stderr (the agent client's combined form).
    assert_eq!(failed, "out\n\nerr\n[exit 3]");
    // gVisor's kernel, not the host's, answers.
    let kernel = port
        .exec("dmesg 2>/dev/null | head -1; uname -r", None)
        .await
        .unwrap();
    assert!(!kernel.contains(&host_release()), "{kernel}");

    port.write_file("/workspace/note.txt", "written by the port")
        .await
        .unwrap();
    assert_eq!(
        port.read_file("note.txt").await.unwrap(),
        "written by the port"
    );
    assert_eq!(
        std::fs::read_to_string(sandbox.workspace().join("note.txt")).unwrap(),
        "written by the port"
    );
    // The host's /etc and data directory are not the sandbox's. (`test`, not `ls`: this
    // runsc rejects coreutils' statx flags, see SECURITY.md.)
    let seen = port
        .exec(
            &format!(
                "test -e /etc/shadow && echo shadow; test -e {} && echo data; \
                 test -e /etc/passwd && echo passwd",
                tmp.path().display()
            ),
            None,
        )
        .await
        .unwrap();
    assert_eq!(seen, "passwd");

    let dir = sandbox.dir().to_path_buf();
    port.as_destroy().unwrap().destroy().await.unwrap();
    assert!(!dir.exists());
    assert!(port.exec("true", None).await.is_err());
}

fn host_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_duplex_and_background_processes_byte_files_and_env_vars() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rt) = runtime(tmp.path()) else {
        return;
    };
    let sandbox = Arc::new(rt.create().await.unwrap());
    let port = GvisorSandboxPort::new(sandbox.clone());

    // A duplex `cat` echoes its stdin until EOF and exits 0.
    let duplex = port.as_duplex_process().expect("duplex processes");
    let mut cat = duplex
        .spawn_duplex_process(SandboxDuplexProcessSpec::new("cat"))
        .await
        .unwrap();
    let payload: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    let mut stdin = std::mem::replace(&mut cat.stdin, Box::new(tokio::io::sink()));
    let sent = payload.clone();
    let writer = tokio::spawn(async move {
        stdin.write_all(&sent).await.unwrap();
        stdin.shutdown().await.unwrap();
    });
    let mut echoed = Vec::new();
    cat.stdout.read_to_end(&mut echoed).await.unwrap();
    writer.await.unwrap();
    assert!(echoed == payload, "cat echoed {} other bytes", echoed.len());
    assert_eq!(
        cat.exited().await.unwrap(),
        SandboxProcessExit {
            code: Some(0),
            signal: None,
            out_of_memory: None,
        }
    );
    // A kill reaches the process and its exit names the signal.
    let mut spec = SandboxDuplexProcessSpec::new("sleep");
    spec.args = vec!["100".into()];
    let sleeper = duplex.spawn_duplex_process(spec).await.unwrap();
    sleeper.kill(DuplexKillSignal::Kill).await.unwrap();
    assert_eq!(
        sleeper.exited().await.unwrap().signal.as_deref(),
        Some("SIGKILL")
    );

    // A background process: its logs, its status, its kill.
    let background = port.as_process().expect("background processes");
    let handle = background
        .start_process("echo started; exec sleep 100")
        .await
        .unwrap();
    eventually("the background process's output", || async {
        handle.logs().await.unwrap().stdout.contains("started")
    })
    .await;
    assert_eq!(handle.status().await.unwrap(), ProcessStatus::Running);
    handle.kill(ProcessSignal::Kill).await.unwrap();
    eventually("the background process killed", || async {
        handle.status().await.unwrap() == ProcessStatus::Killed
    })
    .await;

    // Bytes that are not UTF-8 round-trip; env vars reach later commands.
    let bytes = port.as_file_bytes().expect("byte files");
    bytes
        .write_file_bytes("/workspace/blob.bin", &[0, 255, 1, 254])
        .await
        .unwrap();
    assert_eq!(
        bytes.read_file_bytes("/workspace/blob.bin").await.unwrap(),
        vec![0, 255, 1, 254]
    );
    port.as_env_vars()
        .expect("env vars")
        .set_env_vars([("GREETING".to_owned(), "from the host".to_owned())].into())
        .await
        .unwrap();
    assert_eq!(
        port.exec("echo $GREETING", None).await.unwrap(),
        "from the host"
    );
    sandbox.destroy().await.unwrap();
}

/// Waits (up to 20 s) until `check` holds; panics naming `what` otherwise.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "never: {what}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Starts a shell loop holding a counter only in its memory, answering over fifos in
/// the sandbox's tmpfs /tmp.
async fn start_counter(port: &GvisorSandboxPort) {
    let started = port
        .exec(
            "mkfifo /tmp/ask /tmp/answer && \
             (i=0; while :; do read l < /tmp/ask; i=$((i+1)); echo $i > /tmp/answer; done) \
             >/dev/null 2>&1 </dev/null & echo started",
            None,
        )
        .await
        .unwrap();
    assert_eq!(started, "started");
}

async fn ask(port: &GvisorSandboxPort) -> String {
    port.exec("echo x > /tmp/ask; cat /tmp/answer", Some(20_000))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_keeps_its_memory_across_pause_resume_and_in_each_fork() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rt) = runtime(tmp.path()) else {
        return;
    };
    let sandbox = Arc::new(rt.create().await.unwrap());
    let port = GvisorSandboxPort::new(sandbox.clone());
    start_counter(&port).await;
    assert_eq!(ask(&port).await, "1");
    assert_eq!(ask(&port).await, "2");
    port.write_file("shared.txt", "before the fork")
        .await
        .unwrap();

    sandbox.pause().await.unwrap();
    assert_eq!(sandbox.state().await, State::Paused);
    assert!(
        port.exec("true", None).await.is_err(),
        "a paused sandbox runs nothing"
    );
    let image = sandbox.checkpoint_dir();
    assert!(
        std::fs::read_dir(&image).unwrap().next().is_some(),
        "checkpoint written"
    );
    // Nothing of the container runs while paused: no runsc container, no process.
    assert!(!runsc_lists(tmp.path(), sandbox.id()));
    assert!(
        processes_naming(sandbox.id()).is_empty(),
        "a paused sandbox's processes still run: {:?}",
        processes_naming(sandbox.id())
    );

    sandbox.resume().await.unwrap();
    assert_eq!(ask(&port).await, "3", "the counter went on after resume");

    sandbox.pause().await.unwrap();
    let forks: Vec<Arc<GvisorSandbox>> = sandbox
        .fork(&rt, 2)
        .await
        .unwrap()
        .into_iter()
        .map(Arc::new)
        .collect();
    let ports: Vec<GvisorSandboxPort> = forks.iter().cloned().map(GvisorSandboxPort::new).collect();
    assert_eq!(
        std::fs::read_dir(tmp.path().join("bases")).unwrap().count(),
        1,
        "the workspace was frozen into one layer, not copied"
    );
    for p in &ports {
        assert_eq!(ask(p).await, "4", "each fork goes on from the checkpoint");
        assert_eq!(p.read_file("shared.txt").await.unwrap(), "before the fork");
    }
    ports[0].write_file("mine.txt", "fork 0").await.unwrap();
    assert!(
        ports[1].read_file("mine.txt").await.is_err(),
        "forks' files are their own"
    );
    assert_eq!(ask(&ports[1]).await, "5");
    assert_eq!(ask(&ports[0]).await, "5");
    sandbox.resume().await.unwrap();
    assert_eq!(ask(&port).await, "4");
    assert!(port.read_file("mine.txt").await.is_err());
    // The workspace is shared through layers, never written through: a change on either
    // side stays on that side.
    port.write_file("shared.txt", "changed by the source")
        .await
        .unwrap();
    ports[0]
        .write_file("shared.txt", "changed by fork 0")
        .await
        .unwrap();
    assert_eq!(
        ports[1].read_file("shared.txt").await.unwrap(),
        "before the fork"
    );
    assert_eq!(
        port.read_file("shared.txt").await.unwrap(),
        "changed by the source"
    );
    // A fork of the source again (a second layer) and of a fork (its own layers).
    sandbox.pause().await.unwrap();
    let again = sandbox.fork(&rt, 1).await.unwrap().remove(0);
    let again = GvisorSandboxPort::new(Arc::new(again));
    assert_eq!(
        again.read_file("shared.txt").await.unwrap(),
        "changed by the source"
    );
    assert_eq!(ask(&again).await, "5");
    forks[0].pause().await.unwrap();
    let grandchild = forks[0].fork(&rt, 1).await.unwrap().remove(0);
    let grandchild = GvisorSandboxPort::new(Arc::new(grandchild));
    assert_eq!(
        grandchild.read_file("shared.txt").await.unwrap(),
        "changed by fork 0"
    );
    assert_eq!(grandchild.read_file("mine.txt").await.unwrap(), "fork 0");

    let dir = sandbox.dir().to_path_buf();
    sandbox.destroy().await.unwrap();
    assert!(!dir.exists(), "the checkpoint is removed with its sandbox");
    for f in forks.iter().chain([again.sandbox(), grandchild.sandbox()]) {
        let d = f.dir().to_path_buf();
        f.destroy().await.unwrap();
        assert!(!d.exists());
    }
    // No layer and no overlay is left once every sandbox stacking them is gone.
    let bases: Vec<_> = std::fs::read_dir(tmp.path().join("bases"))
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(bases.is_empty(), "layers left: {bases:?}");
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(&tmp.path().display().to_string()),
        "an overlay is still mounted"
    );
}

/// Whether runsc still knows container `id` under the runtime's state root.
fn runsc_lists(dir: &Path, id: &str) -> bool {
    let out = std::process::Command::new(runsc().unwrap())
        .arg("--root")
        .arg(dir.join("runsc"))
        .args(["list", "-quiet"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l == id)
}

/// The pids of host processes whose command line names `id` (runsc's sandbox and gofer
/// processes carry their container's id).
fn processes_naming(id: &str) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != std::process::id())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| String::from_utf8_lossy(&c).contains(id))
                .unwrap_or(false)
        })
        .collect()
}

/// A pause needs room for the sandbox's memory plus a reserve: on a file system without it
/// (a 64 MiB tmpfs, below `CHECKPOINT_DISK_RESERVE` alone) the pause is refused with the
/// figures, and the sandbox runs on, its processes and memory intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_without_room_on_disk_is_refused_and_the_sandbox_runs_on() {
    let tmp = tempfile::tempdir().unwrap();
    if runtime(tmp.path()).is_none() {
        return;
    }
    let small = tmp.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let mounted = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(mounted.success(), "mount a 64 MiB tmpfs");
    let dir = small.clone();
    let outcome = async move {
        let rt = runtime(&dir).unwrap();
        let sandbox = Arc::new(rt.create().await.unwrap());
        let port = GvisorSandboxPort::new(sandbox.clone());
        start_counter(&port).await;
        assert_eq!(ask(&port).await, "1");
        let refused = sandbox.pause().await.expect_err("no room for a checkpoint");
        let message = refused.to_string();
        assert!(
            message.contains("not enough disk space") && message.contains("MiB free"),
            "{message}"
        );
        assert_eq!(sandbox.state().await, State::Running);
        assert_eq!(ask(&port).await, "2", "the sandbox runs on with its memory");
        assert!(!sandbox.checkpoint_dir().exists(), "no checkpoint started");
        sandbox.destroy().await.unwrap();
    };
    // Unmounted whatever happened, so the temporary directory can go.
    let result = tokio::spawn(outcome).await;
    let _ = std::process::Command::new("umount").arg(&small).status();
    if let Err(panic) = result {
        std::panic::resume_unwind(panic.into_panic());
    }
}

/// A runtime checkpoint restores only for the session it was taken for and with its mounts;
/// the right session gets the processes back, its memory intact, in a new sandbox binding
/// the directory it names; a restore does not consume it (the managed port removes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_checkpoint_restores_only_for_its_session_and_mounts() {
    let tmp = tempfile::tempdir().unwrap();
    let Some(rt) = runtime(tmp.path()) else {
        return;
    };
    let first = tmp.path().join("first");
    std::fs::create_dir(&first).unwrap();
    let sandbox = Arc::new(
        rt.create_with(SandboxSpec {
            workspace: Some(first.clone()),
            ..SandboxSpec::default()
        })
        .await
        .unwrap(),
    );
    let port = GvisorSandboxPort::new(sandbox.clone());
    start_counter(&port).await;
    assert_eq!(ask(&port).await, "1");
    let id = sandbox.capture("session-a").await.unwrap();
    assert!(omabox_backend_gvisor::is_checkpoint_id(&id), "{id}");
    sandbox.destroy().await.unwrap();

    let second = tmp.path().join("second");
    std::fs::create_dir(&second).unwrap();
    std::fs::write(second.join("seen.txt"), "the restoring run's").unwrap();
    let spec = SandboxSpec {
        workspace: Some(second.clone()),
        ..SandboxSpec::default()
    };
    let other = rt.restore_checkpoint(&id, spec.clone(), "session-b").await;
    let refused = other
        .expect_err("another session's restore is refused")
        .to_string();
    assert!(refused.contains("another session"), "{refused}");
    assert!(
        !refused.contains("session-a"),
        "names no session: {refused}"
    );
    let with_outputs = SandboxSpec {
        outputs: Some(tmp.path().to_path_buf()),
        ..spec.clone()
    };
    let refused = rt
        .restore_checkpoint(&id, with_outputs, "session-a")
        .await
        .expect_err("other mounts are refused")
        .to_string();
    assert!(refused.contains("mounts"), "{refused}");
    let not_ours = rt
        .restore_checkpoint("../../etc", spec.clone(), "session-a")
        .await
        .expect_err("not an id")
        .to_string();
    assert!(
        not_ours.contains("not a gvisor runtime checkpoint id"),
        "{not_ours}"
    );

    let restored = Arc::new(rt.restore_checkpoint(&id, spec, "session-a").await.unwrap());
    let port = GvisorSandboxPort::new(restored.clone());
    assert_eq!(ask(&port).await, "2", "the counter goes on from its memory");
    assert_eq!(
        port.read_file("/workspace/seen.txt").await.unwrap(),
        "the restoring run's",
        "the workspace is the restoring side's"
    );
    restored.destroy().await.unwrap();
    rt.remove_checkpoint(&id).unwrap();
    rt.remove_checkpoint(&id).unwrap();
    assert_eq!(
        std::fs::read_dir(tmp.path().join("checkpoints"))
            .unwrap()
            .count(),
        0
    );
}
