//! Shared test harness: an agent in-process (over `tokio::io::duplex`) or as a child
//! process (over a socketpair), and polling helpers that wait for a condition with a
//! generous deadline instead of asserting on time.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use omabox_agent::{Agent, AgentClient, AgentConfig, AgentProcess, ReapMode};

pub const AGENT_BIN: &str = env!("CARGO_BIN_EXE_omabox-agent");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    InProcess,
    Child,
}

pub struct Harness {
    pub client: AgentClient,
    pub dir: tempfile::TempDir,
    pub agent_pid: u32,
    pub mode: Mode,
    pub child: Option<AgentProcess>,
    pub agent: Option<Agent>,
    pub serve: Option<tokio::task::JoinHandle<Result<(), omabox_agent::AgentError>>>,
    /// The account files' directory of [`start_with_accounts`].
    pub etc: Option<tempfile::TempDir>,
}

impl Harness {
    pub fn path(&self, rel: &str) -> String {
        self.dir.path().join(rel).to_string_lossy().into_owned()
    }

    pub fn local(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

pub async fn start(mode: Mode) -> Harness {
    start_with_etc(mode, None).await
}

/// An agent whose accounts come from `<dir>/etc/passwd` and `<dir>/etc/group` (in-process
/// only: the agent binary always reads `/etc`), the files written from `passwd`/`group`.
pub async fn start_with_accounts(passwd: &str, group: &str) -> Harness {
    let etc = tempfile::tempdir().expect("tempdir");
    std::fs::write(etc.path().join("passwd"), passwd).expect("passwd");
    std::fs::write(etc.path().join("group"), group).expect("group");
    let mut h = start_with_etc(Mode::InProcess, Some(etc.path().to_path_buf())).await;
    h.etc = Some(etc);
    h
}

async fn start_with_etc(mode: Mode, etc_dir: Option<PathBuf>) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    match mode {
        Mode::InProcess => {
            let mut config = AgentConfig {
                reap: ReapMode::OwnChildren,
                workdir: dir.path().to_path_buf(),
                ..AgentConfig::default()
            };
            if let Some(etc) = etc_dir {
                config.etc_dir = etc;
            }
            let agent = Agent::new(config).expect("agent");
            let (a, b) = tokio::io::duplex(256 * 1024);
            let serving = agent.clone();
            let serve = tokio::spawn(async move { serving.serve(a).await });
            let client = AgentClient::connect(b).await.expect("connect");
            Harness {
                client,
                dir,
                agent_pid: std::process::id(),
                mode,
                child: None,
                agent: Some(agent),
                serve: Some(serve),
                etc: None,
            }
        }
        Mode::Child => {
            let workdir = dir.path().to_string_lossy().into_owned();
            let child = AgentProcess::spawn(Path::new(AGENT_BIN), &["--workdir", &workdir])
                .await
                .expect("spawn agent");
            let agent_pid = child.child.id().expect("agent pid");
            Harness {
                client: child.client.clone(),
                dir,
                agent_pid,
                mode,
                child: Some(child),
                agent: None,
                serve: None,
                etc: None,
            }
        }
    }
}

/// Polls `cond` until it holds; panics with `what` after a generous deadline. The
/// deadline only bounds a hang; nothing asserts how fast the condition became true.
pub async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if cond().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a pid exists (zombies count as existing).
pub fn pid_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// `(state, ppid)` of a pid from /proc.
pub fn proc_state(pid: u32) -> Option<(char, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut it = rest.split_whitespace();
    let state = it.next()?.chars().next()?;
    let ppid = it.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Zombie children of `parent`.
pub fn zombies_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/proc") {
        for e in rd.flatten() {
            if let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok())
                && let Some((state, ppid)) = proc_state(pid)
                && ppid == parent
                && state == 'Z'
            {
                out.push(pid);
            }
        }
    }
    out
}

/// Instantiates an async test body `fn(Harness)` for both modes.
#[macro_export]
macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn in_process() {
                super::$name($crate::common::start($crate::common::Mode::InProcess).await).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn child_process() {
                super::$name($crate::common::start($crate::common::Mode::Child).await).await;
            }
        }
    };
}
