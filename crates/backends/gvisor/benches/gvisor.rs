//! gvisor sandbox timings: start + `true` + destroy, pause, resume, pause again (of the
//! resumed sandbox) and fork ×3, each with
//! an empty and a 1 GiB workspace. Prints figures (median of the rounds that worked, and
//! how many failed: this runsc crashes some restored processes); asserts nothing.
//!
//! `cargo bench -p omabox-backend-gvisor --bench gvisor` as root with runsc installed.
//! `OMABOX_BENCH_ROUNDS` sets the rounds per figure (default 5);
//! `OMABOX_BENCH_GVISOR_PLATFORM` runsc's platform (default `ptrace`, as omabox runs it).

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use omabox_backend_gvisor::{GvisorConfig, GvisorRuntime, GvisorSandbox, GvisorSandboxPort};
use omabox_sandbox::SandboxPort;

fn main() {
    let rounds: usize = std::env::var("OMABOX_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(run(rounds));
}

/// Whether a cgroup hierarchy is mounted with `favordynmods`: cgroup migrations (runsc
/// joins and leaves the sandbox's cgroups at every start and restore) then skip an RCU grace
/// period each (see docs/operations.md, "Tuning a host for gVisor").
fn favordynmods() -> bool {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(" cgroup"))
        .any(|line| {
            line.split(' ')
                .nth(3)
                .is_some_and(|opts| opts.split(',').any(|o| o == "favordynmods"))
        })
}

async fn run(rounds: usize) {
    println!(
        "host: cgroup favordynmods {}",
        if favordynmods() { "on" } else { "off" }
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let runtime = GvisorRuntime::new(GvisorConfig {
        runsc: PathBuf::from("/usr/bin/runsc"),
        dir: tmp.path().to_path_buf(),
        init: PathBuf::from(env!("CARGO_BIN_EXE_omabox-gvisor-init")),
        platform: std::env::var("OMABOX_BENCH_GVISOR_PLATFORM").unwrap_or_else(|_| "ptrace".into()),
        limits: Default::default(),
        network: Default::default(),
        test_hosts: None,
        image_root: None,
    })
    .expect("gvisor runtime");

    let mut start = Figure::default();
    for _ in 0..rounds {
        let t = Instant::now();
        let ok = async {
            let sandbox = std::sync::Arc::new(runtime.create().await.ok()?);
            let port = GvisorSandboxPort::new(sandbox.clone());
            port.exec("true", None).await.ok()?;
            sandbox.destroy().await.ok()
        }
        .await;
        start.add(ok.map(|()| t.elapsed()));
    }
    println!("gvisor create + exec true + destroy: {start}");

    for (label, bytes) in [("empty workspace", 0u64), ("1 GiB workspace", 1 << 30)] {
        let mut pause = Figure::default();
        let mut resume = Figure::default();
        let mut pause_again = Figure::default();
        let mut fork = Figure::default();
        for _ in 0..rounds {
            let Ok(sandbox) = runtime.create().await else {
                pause.add(None);
                continue;
            };
            fill(&sandbox, bytes);
            let port = GvisorSandboxPort::new(std::sync::Arc::new(sandbox));
            let sandbox = port.sandbox().clone();
            let _ = port
                .exec("(while :; do sleep 1000; done) >/dev/null 2>&1 &", None)
                .await;
            pause.add(timed(sandbox.pause()).await);
            resume.add(timed(sandbox.resume()).await);
            let paused = timed(sandbox.pause()).await;
            pause_again.add(paused);
            if paused.is_some() {
                let t = Instant::now();
                match sandbox.fork(&runtime, 3).await {
                    Ok(forks) => {
                        fork.add(Some(t.elapsed()));
                        for f in forks {
                            let _ = f.destroy().await;
                        }
                    }
                    Err(_) => fork.add(None),
                }
            } else {
                fork.add(None);
            }
            let _ = sandbox.destroy().await;
        }
        println!("gvisor pause ({label}): {pause}");
        println!("gvisor resume ({label}): {resume}");
        println!("gvisor pause of a resumed sandbox ({label}): {pause_again}");
        println!("gvisor fork x3 ({label}): {fork}");
    }
}

async fn timed<E>(f: impl std::future::Future<Output = Result<(), E>>) -> Option<Duration> {
    let t = Instant::now();
    f.await.ok().map(|()| t.elapsed())
}

/// Writes `bytes` of non-zero data into the sandbox's workspace from the host.
fn fill(sandbox: &GvisorSandbox, bytes: u64) {
    if bytes == 0 {
        return;
    }
    let mut f = std::fs::File::create(sandbox.workspace().join("data")).expect("data file");
    let chunk = vec![0x5a_u8; 1 << 20];
    for _ in 0..bytes / chunk.len() as u64 {
        f.write_all(&chunk).expect("write");
    }
    f.sync_all().expect("sync");
}

#[derive(Default)]
struct Figure {
    times: Vec<Duration>,
    failed: usize,
}

impl Figure {
    fn add(&mut self, t: Option<Duration>) {
        match t {
            Some(t) => self.times.push(t),
            None => self.failed += 1,
        }
    }
}

impl std::fmt::Display for Figure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut t = self.times.clone();
        t.sort();
        match t.get(t.len() / 2) {
            Some(median) => write!(
                f,
                "median {:.1} ms (min {:.1}, max {:.1}) over {} rounds, {} failed",
                median.as_secs_f64() * 1e3,
                t[0].as_secs_f64() * 1e3,
                t[t.len() - 1].as_secs_f64() * 1e3,
                t.len(),
                self.failed
            ),
            None => write!(f, "no round worked ({} failed)", self.failed),
        }
    }
}
