//! Linux sandbox benchmark: start→ready, exec round trip, destroy, and host memory per
//! idle sandbox, side by side with `bwrap` and `unshare` doing the same work in the same
//! run. Prints figures; never asserts on time.
//!
//! `cargo bench -p omabox-backend-linux` (as root). `OMABOX_BENCH_N` sets the number of
//! starts (default 200), `OMABOX_BENCH_IDLE` the number of idle sandboxes (default 100).

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use omabox_agent::client::ExecRequest;
use omabox_backend_linux::{LinuxRuntime, RuntimeConfig, SandboxPlan};

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Samples(Vec<Duration>);

impl Samples {
    fn push(&mut self, d: Duration) {
        self.0.push(d);
    }
    fn pct(&self, p: f64) -> Duration {
        let mut v = self.0.clone();
        v.sort();
        if v.is_empty() {
            return Duration::ZERO;
        }
        v[((v.len() as f64 - 1.0) * p).round() as usize]
    }
    fn p50(&self) -> Duration {
        self.pct(0.5)
    }
    fn p99(&self) -> Duration {
        self.pct(0.99)
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "-".into();
    }
    format!("{:.2}x", a.as_secs_f64() / b.as_secs_f64())
}

/// Sum of `key` (kB) from smaps_rollup of `pid` and all its descendants.
fn tree_kb(pid: u32, key: &str) -> u64 {
    let mut total = 0;
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/smaps_rollup")) {
            for line in s.lines() {
                if let Some(rest) = line.strip_prefix(key) {
                    total += rest
                        .trim_start_matches(':')
                        .split_whitespace()
                        .next()
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for t in tasks.flatten() {
                if let Ok(c) = std::fs::read_to_string(t.path().join("children")) {
                    stack.extend(c.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
                }
            }
        }
    }
    total
}

/// RSS of this (host) process alone.
fn self_rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Rss:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

fn bwrap_args() -> Vec<String> {
    let mut a: Vec<String> = [
        "--unshare-all",
        "--die-with-parent",
        "--ro-bind",
        "/usr",
        "/usr",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
        "--hostname",
        "sandbox",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for d in ["bin", "sbin", "lib", "lib64"] {
        let p = PathBuf::from("/").join(d);
        if let Ok(t) = std::fs::read_link(&p) {
            a.extend([
                "--symlink".into(),
                t.display().to_string(),
                p.display().to_string(),
            ]);
        } else if p.is_dir() {
            a.extend([
                "--ro-bind".into(),
                p.display().to_string(),
                p.display().to_string(),
            ]);
        }
    }
    a.push("--".into());
    a
}

fn unshare_args() -> Vec<String> {
    [
        "--mount",
        "--pid",
        "--net",
        "--ipc",
        "--uts",
        "--cgroup",
        "--fork",
        "--mount-proc",
        "--",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

/// Spawns `tool args… /bin/echo x`; returns (time to the first byte = ready, total time
/// to exit = ready + run + teardown).
fn run_tool(tool: &str, args: &[String]) -> Option<(Duration, Duration)> {
    let t0 = Instant::now();
    let mut child = Command::new(tool)
        .args(args)
        .args(["/bin/echo", "x"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut out = child.stdout.take()?;
    let mut b = [0u8; 1];
    out.read_exact(&mut b).ok()?;
    let ready = t0.elapsed();
    let status = child.wait().ok()?;
    let total = t0.elapsed();
    status.success().then_some((ready, total))
}

fn tool_available(tool: &str, args: &[String]) -> bool {
    run_tool(tool, args).is_some()
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: the linux sandbox benchmark needs root");
        return;
    }
    let n = env_n("OMABOX_BENCH_N", 200);
    let idle = env_n("OMABOX_BENCH_IDLE", 100);
    let init = PathBuf::from(env!("CARGO_BIN_EXE_omabox-sandbox-init"));
    let rt = LinuxRuntime::new(RuntimeConfig {
        runtime_dir: PathBuf::from("/run/omabox-bench"),
        cgroup_parent: "omabox-bench".into(),
        init_binary: Some(init),
        ..RuntimeConfig::default()
    })
    .expect("linux runtime");
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let plan = SandboxPlan::preinstalled("bench");

    println!("omabox linux sandbox benchmark: {n} starts, {idle} idle sandboxes");
    println!("landlock/seccomp: {:?}", rt.capabilities().landlock_abi);

    // Warm up (page cache, cgroup parents).
    for _ in 0..5 {
        drop(rt.start(&plan).unwrap());
    }

    // 1. start→ready, start→handshake, exec `true`, destroy (ours).
    let mut ready = Samples::default();
    let mut handshake = Samples::default();
    let mut destroy = Samples::default();
    let mut full = Samples::default();
    for _ in 0..n {
        let t0 = Instant::now();
        let mut sb = rt.start(&plan).unwrap();
        ready.push(t0.elapsed());
        let client = tokio.block_on(sb.connect_agent()).unwrap();
        handshake.push(t0.elapsed());
        let out = tokio
            .block_on(client.exec(ExecRequest::argv(["/bin/echo", "x"])))
            .unwrap();
        assert!(out.success());
        let t1 = Instant::now();
        drop(client);
        sb.destroy().unwrap();
        destroy.push(t1.elapsed());
        full.push(t0.elapsed());
    }

    // 2. exec round trip in one live sandbox.
    let mut sb = rt.start(&plan).unwrap();
    let client = tokio.block_on(sb.connect_agent()).unwrap();
    let mut exec_rt = Samples::default();
    let mut ping_rt = Samples::default();
    for _ in 0..n {
        let t0 = Instant::now();
        let out = tokio
            .block_on(client.exec(ExecRequest::argv(["/bin/true"])))
            .unwrap();
        exec_rt.push(t0.elapsed());
        assert!(out.success());
        let t0 = Instant::now();
        tokio.block_on(client.ping()).unwrap();
        ping_rt.push(t0.elapsed());
    }
    drop(client);
    sb.destroy().unwrap();

    // 3. bwrap and unshare doing start → run echo → teardown.
    let bw = bwrap_args();
    let us = unshare_args();
    let have_bwrap = tool_available("bwrap", &bw);
    let have_unshare = tool_available("unshare", &us);
    let (mut bw_ready, mut bw_total, mut us_ready, mut us_total) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    for _ in 0..n {
        if have_bwrap && let Some((r, t)) = run_tool("bwrap", &bw) {
            bw_ready.push(r);
            bw_total.push(t);
        }
        if have_unshare && let Some((r, t)) = run_tool("unshare", &us) {
            us_ready.push(r);
            us_total.push(t);
        }
    }

    // 4. Host memory per idle sandbox, N alive.
    let before = self_rss_kb();
    let mut alive = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..idle {
        let mut sb = rt.start(&plan).unwrap();
        clients.push(tokio.block_on(sb.connect_agent()).unwrap());
        alive.push(sb);
    }
    std::thread::sleep(Duration::from_millis(200));
    let (mut rss, mut pss, mut cg) = (0u64, 0u64, 0u64);
    for sb in &alive {
        rss += tree_kb(sb.pid() as u32, "Rss");
        pss += tree_kb(sb.pid() as u32, "Pss");
        cg += sb.identity().cgroup.memory_usage().unwrap_or(0);
    }
    let host_side_kb = self_rss_kb().saturating_sub(before);
    drop(clients);
    let t0 = Instant::now();
    for mut sb in alive {
        sb.destroy().unwrap();
    }
    let bulk_destroy = t0.elapsed();
    let (mut bw_pss, mut bw_n) = (0u64, 0usize);
    if have_bwrap {
        let mut kids = Vec::new();
        for _ in 0..idle {
            if let Ok(c) = Command::new("bwrap")
                .args(&bw)
                .args(["/bin/sleep", "600"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
            {
                kids.push(c);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
        for k in &kids {
            bw_pss += tree_kb(k.id(), "Pss");
        }
        bw_n = kids.len();
        for mut k in kids {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    let per = |kb: u64, n: usize| format!("{:.2} MiB", kb as f64 / 1024.0 / n.max(1) as f64);
    println!();
    println!("{:<34} {:>12} {:>12}", "omabox linux", "p50", "p99");
    println!(
        "{:<34} {:>12} {:>12}",
        "start→ready",
        ms(ready.p50()),
        ms(ready.p99())
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "start→agent handshake",
        ms(handshake.p50()),
        ms(handshake.p99())
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "exec /bin/true round trip",
        ms(exec_rt.p50()),
        ms(exec_rt.p99())
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "protocol ping round trip",
        ms(ping_rt.p50()),
        ms(ping_rt.p99())
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "destroy",
        ms(destroy.p50()),
        ms(destroy.p99())
    );
    println!(
        "{:<34} {:>12} {:>12}",
        "start+handshake+echo+destroy",
        ms(full.p50()),
        ms(full.p99())
    );
    println!();
    println!(
        "{:<34} {:>12} {:>12} {:>16}",
        "same work, other tools", "p50", "p99", "omabox/tool p50"
    );
    if have_bwrap {
        println!(
            "{:<34} {:>12} {:>12} {:>16}",
            "bwrap start→echo output (ready)",
            ms(bw_ready.p50()),
            ms(bw_ready.p99()),
            ratio(ready.p50(), bw_ready.p50())
        );
        println!(
            "{:<34} {:>12} {:>12} {:>16}",
            "bwrap start→echo→exit (full)",
            ms(bw_total.p50()),
            ms(bw_total.p99()),
            ratio(full.p50(), bw_total.p50())
        );
    } else {
        println!("bwrap: not installed (apt-get install -y bubblewrap)");
    }
    if have_unshare {
        println!(
            "{:<34} {:>12} {:>12} {:>16}",
            "unshare start→echo output (ready)",
            ms(us_ready.p50()),
            ms(us_ready.p99()),
            ratio(ready.p50(), us_ready.p50())
        );
        println!(
            "{:<34} {:>12} {:>12} {:>16}",
            "unshare start→echo→exit (full)",
            ms(us_total.p50()),
            ms(us_total.p99()),
            ratio(full.p50(), us_total.p50())
        );
    } else {
        println!("unshare: not usable here");
    }
    println!();
    println!("idle sandboxes alive: {idle}");
    println!("  agent RSS per sandbox:            {}", per(rss, idle));
    println!("  agent PSS per sandbox:            {}", per(pss, idle));
    println!(
        "  cgroup memory per sandbox:        {}",
        per(cg / 1024, idle)
    );
    println!(
        "  host process growth per sandbox:  {}",
        per(host_side_kb, idle)
    );
    println!(
        "  destroy all {idle}:                  {}",
        ms(bulk_destroy)
    );
    if bw_n > 0 {
        println!(
            "  bwrap+sleep PSS per sandbox:      {} (omabox/bwrap {:.2}x)",
            per(bw_pss, bw_n),
            (pss as f64 / idle.max(1) as f64) / (bw_pss as f64 / bw_n as f64)
        );
    }
}
