//! Linux sandbox benchmark: start→ready (after the warm-up, starts are handed to the
//! runtime's zygote spare: no exec, fork or network namespace on the start's path; the
//! whole `omabox sandbox run` takes the one-shot path), exec round trip, destroy, and host memory per
//! idle sandbox, side by side with `bwrap` and `unshare` doing the same work and with
//! the host's own process start (the floor an exec round trip cannot beat), all in the
//! same run and interleaved sample by sample, so load from other work on the machine
//! hits every column alike; the whole process also in blocks of consecutive runs per tool
//! (interleaved single runs hand each tool's leftover kernel work — a PID 1's exit,
//! network namespace cleanup — to the other tool's next run; in blocks each pays its
//! own). Compare the ratios, not the absolute figures, across runs.
//! Prints figures; never asserts on time. To compare two builds of the CLI, use
//! `scripts/ab-sandbox-run` instead: it times several copies of each binary, since one
//! copy of a binary file can run ±50 µs apart from another copy of it on a VM.
//!
//! `cargo bench -p omabox-linux-sandbox --bench linux` (as root). `OMABOX_BENCH_N` sets the number of
//! starts (default 200), `OMABOX_BENCH_IDLE` the number of idle sandboxes (default 100),
//! `OMABOX_BENCH_SPACED` the number of starts spaced 50 ms apart (default 30),
//! `OMABOX_BENCH_CLI` the `omabox` binary whose whole `sandbox run -- echo x` process is
//! timed against bwrap's (default: `omabox` in the same target profile dir).
//!
//! The whole-process command is a bare `echo`, searched in `PATH` as a user types it
//! (each tool's own `PATH` search: ours in the plan's default `PATH`, where `echo` is the
//! fourth entry's): `/bin/echo` would skip the search and hide its cost.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use omabox_agent::client::ExecRequest;
use omabox_linux_sandbox::{LinuxRuntime, RuntimeConfig, SandboxPlan};

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
    fn row(&self, name: &str) {
        println!("{:<36} {:>11} {:>11}", name, ms(self.p50()), ms(self.p99()));
    }
    fn row_vs(&self, name: &str, base: &Samples) {
        println!(
            "{:<36} {:>11} {:>11} {:>9}",
            name,
            ms(self.p50()),
            ms(self.p99()),
            ratio(self.p50(), base.p50())
        );
    }
}

/// Per-segment durations of the start timeline (microseconds), by segment name.
#[derive(Default)]
struct Segments(Vec<(String, Vec<u64>)>);

impl Segments {
    fn add(&mut self, name: &str, us: u64) {
        match self.0.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(us),
            None => self.0.push((name.to_owned(), vec![us])),
        }
    }

    /// Segments between named milestones of one start.
    fn add_timeline(&mut self, tl: &[(String, u64)]) {
        let at = |name: &str| tl.iter().find(|(n, _)| n == name).map(|(_, t)| *t);
        let mut seg = |name: &str, from: Option<u64>, to: Option<u64>| {
            if let (Some(a), Some(b)) = (from, to) {
                self.add(name, b.saturating_sub(a));
            }
        };
        seg(
            "host: admission, state dir",
            at("host start"),
            at("host state dir"),
        );
        seg(
            "host: pipes, argv",
            at("host state dir"),
            at("host fds, argv"),
        );
        seg(
            "host: clone (zygote spare, or exec)",
            at("host fds, argv"),
            at("host clone"),
        );
        seg("child: handed over→main", at("host clone"), at("init main"));
        seg(
            "child: network namespace (0: spare)",
            at("init main"),
            at("init netns"),
        );
        seg(
            "host: cgroup mkdir+limits",
            at("host clone"),
            at("host cgroup create"),
        );
        seg(
            "host: user namespace",
            at("host cgroup create"),
            at("host user namespace"),
        );
        seg(
            "host: plan encode+send",
            at("host user namespace").or(at("host cgroup create")),
            at("host plan sent"),
        );
        seg(
            "host: identity record",
            at("host plan sent"),
            at("host identity written"),
        );
        let released = at("host plan sent").max(at("init netns"));
        seg("child: plan wake-up+decode", released, at("init plan read"));
        seg("child: setup stage", at("init plan read"), at("init ready"));
        seg(
            "host: ready wake-up",
            at("init ready"),
            at("host ready read"),
        );
        seg("total (host view)", at("host start"), at("host done"));
    }

    fn print(&self, title: &str) {
        println!("{title:<36} {:>11} {:>11}", "p50", "p99");
        for (name, v) in &self.0 {
            let mut v = v.clone();
            v.sort_unstable();
            let pct = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
            println!("  {:<34} {:>8} µs {:>8} µs", name, pct(0.5), pct(0.99));
        }
    }
}

/// How many copies of the `omabox` binary the whole-process figure runs from.
const CLI_COPIES: usize = 3;

/// Runs per block of the consecutive whole-process figure.
const BLOCK: usize = 20;

fn ms(d: Duration) -> String {
    format!("{:.3} ms", d.as_secs_f64() * 1e3)
}

fn ratio(a: Duration, b: Duration) -> String {
    if b.is_zero() {
        return "-".into();
    }
    format!("{:.3}x", a.as_secs_f64() / b.as_secs_f64())
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

/// Spawns `tool args… echo x`; returns (time to the first byte = ready, total time
/// to exit = ready + run + teardown).
fn run_tool(tool: &str, args: &[String]) -> Option<(Duration, Duration)> {
    let t0 = Instant::now();
    let mut child = Command::new(tool)
        .args(args)
        .args(["echo", "x"])
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

/// The `omabox` binary whose whole `sandbox run` process is timed: `OMABOX_BENCH_CLI`,
/// else an `omabox` in this benchmark's target profile dir (after
/// `cargo build --release -p omabox`).
fn cli_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("OMABOX_BENCH_CLI") {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    let candidate = exe.parent()?.parent()?.join("omabox");
    candidate.is_file().then_some(candidate)
}

/// Spawns `omabox sandbox run --backend linux -- echo x` (the benchmark's runtime
/// dir, cgroup parent and init); returns (first output byte, exit) like [`run_tool`].
fn run_cli(cli: &PathBuf, init: &PathBuf) -> Option<(Duration, Duration)> {
    let t0 = Instant::now();
    let mut child = Command::new(cli)
        .args(["sandbox", "run", "--backend", "linux", "--", "echo", "x"])
        .env("OMABOX_LINUX_RUNTIME_DIR", "/run/omabox-bench")
        .env("OMABOX_LINUX_CGROUP_PARENT", "omabox-bench")
        .env("OMABOX_LINUX_INIT", init)
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

/// The floor for an exec round trip: the host starting `/bin/true` with piped
/// stdout/stderr, reading both to eof and reaping it (what the agent does per exec).
fn host_true() -> Duration {
    let t0 = Instant::now();
    let out = Command::new("/bin/true")
        .stdin(Stdio::null())
        .output()
        .expect("host /bin/true");
    let d = t0.elapsed();
    assert!(out.status.success());
    d
}

fn main() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("SKIPPED: the linux sandbox benchmark needs root");
        return;
    }
    let n = env_n("OMABOX_BENCH_N", 200);
    let idle = env_n("OMABOX_BENCH_IDLE", 100);
    let spaced = env_n("OMABOX_BENCH_SPACED", 30);
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    println!("omabox linux sandbox benchmark: {n} starts, {idle} idle sandboxes");
    println!(
        "landlock ABI {:?}, cgroup {:?}, load average at start: {}",
        rt.capabilities().landlock_abi,
        rt.capabilities().cgroup.as_ref().map(|c| match c {
            omabox_linux_sandbox::CgroupLayout::V1 { .. } => "v1",
            omabox_linux_sandbox::CgroupLayout::V2 { .. } => "v2",
        }),
        load.trim()
    );

    // Warm up (page cache, cgroup parents).
    for _ in 0..5 {
        drop(rt.start(&plan).unwrap());
    }
    let bw = bwrap_args();
    let us = unshare_args();
    let have_bwrap = tool_available("bwrap", &bw);
    let have_unshare = tool_available("unshare", &us);

    // 1. Back-to-back starts: ours (start→ready, handshake, echo, destroy), then bwrap
    //    and unshare doing start → echo → exit, interleaved.
    let mut ready = Samples::default();
    let mut handshake = Samples::default();
    let mut destroy = Samples::default();
    let mut full = Samples::default();
    let (mut bw_ready, mut bw_total, mut us_ready, mut us_total) = (
        Samples::default(),
        Samples::default(),
        Samples::default(),
        Samples::default(),
    );
    let mut segments = Segments::default();
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
        segments.add_timeline(sb.start_timeline());
        if let Some(r) = sb.report() {
            for (step, us) in &r.step_micros {
                segments.add(&format!("  setup: {step}"), *us);
            }
        }
        if have_bwrap && let Some((r, t)) = run_tool("bwrap", &bw) {
            bw_ready.push(r);
            bw_total.push(t);
        }
        if have_unshare && let Some((r, t)) = run_tool("unshare", &us) {
            us_ready.push(r);
            us_total.push(t);
        }
    }

    // 1b. Whole processes: `omabox sandbox run -- echo x` against bwrap doing the
    //     same, interleaved (what a user waits for).
    //     The binary runs from CLI_COPIES fresh copies of its file, in turn: on a VM one
    //     copy of a binary can run ±50 µs apart from another copy of the same file (where
    //     its pages landed), as much as the gap measured here.
    let cli = cli_binary();
    let (mut cli_ready, mut cli_total, mut bw2_total) =
        (Samples::default(), Samples::default(), Samples::default());
    let mut per_copy: Vec<Samples> = Vec::new();
    let copies_dir = tempfile::tempdir().expect("temp dir for the binary's copies");
    if let Some(cli) = &cli {
        let init = PathBuf::from(env!("CARGO_BIN_EXE_omabox-sandbox-init"));
        let copies: Vec<PathBuf> = (0..CLI_COPIES)
            .map(|i| {
                let copy = copies_dir.path().join(format!("omabox-{i}"));
                std::fs::copy(cli, &copy).expect("copy the omabox binary");
                copy
            })
            .collect();
        per_copy.resize_with(copies.len(), Samples::default);
        for copy in &copies {
            for _ in 0..3 {
                let _ = run_cli(copy, &init);
            }
        }
        for i in 0..n {
            let k = i % copies.len();
            if let Some((r, t)) = run_cli(&copies[k], &init) {
                cli_ready.push(r);
                cli_total.push(t);
                per_copy[k].push(t);
            }
            if have_bwrap && let Some((_, t)) = run_tool("bwrap", &bw) {
                bw2_total.push(t);
            }
        }
    }

    // 1c. The same whole processes, BLOCK in a row per tool, the tools' blocks in turn:
    //     each run then also pays for the work the kernel still does after the previous
    //     run of the same tool returned (a PID 1's exit, network namespace cleanup, cgroup
    //     teardown), where in 1b that work lands on the other tool's next run. This is
    //     what a loop of `sandbox run` (an agent's many commands) waits for; 1b is one
    //     command started on a machine just busy with something else.
    let (mut cli_blocks, mut bw_blocks) = (Samples::default(), Samples::default());
    if let Some(cli) = &cli
        && have_bwrap
    {
        let init = PathBuf::from(env!("CARGO_BIN_EXE_omabox-sandbox-init"));
        for round in 0..(n / BLOCK).max(1) {
            let copy = copies_dir
                .path()
                .join(format!("omabox-{}", round % CLI_COPIES));
            let copy = if copy.is_file() { copy } else { cli.clone() };
            let t0 = Instant::now();
            let ok = (0..BLOCK).all(|_| run_cli(&copy, &init).is_some());
            if ok {
                cli_blocks.push(t0.elapsed() / BLOCK as u32);
            }
            let t0 = Instant::now();
            if (0..BLOCK).all(|_| run_tool("bwrap", &bw).is_some()) {
                bw_blocks.push(t0.elapsed() / BLOCK as u32);
            }
        }
    }

    // 2. Starts spaced 50 ms apart (an idle host starting one sandbox now and then):
    //    nothing of a previous start is still warm in the kernel.
    let mut ready_spaced = Samples::default();
    for _ in 0..spaced {
        std::thread::sleep(Duration::from_millis(50));
        let t0 = Instant::now();
        let sb = rt.start(&plan).unwrap();
        ready_spaced.push(t0.elapsed());
        drop(sb);
    }

    // 3. Exec round trip in one live sandbox, interleaved with a protocol ping and with
    //    the host itself starting the same program (the floor).
    let mut sb = rt.start(&plan).unwrap();
    let client = tokio.block_on(sb.connect_agent()).unwrap();
    let mut exec_rt = Samples::default();
    let mut ping_rt = Samples::default();
    let mut floor = Samples::default();
    for _ in 0..20 {
        tokio
            .block_on(client.exec(ExecRequest::argv(["/bin/true"])))
            .unwrap();
    }
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
        floor.push(host_true());
    }
    drop(client);
    sb.destroy().unwrap();

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
    println!("{:<36} {:>11} {:>11}", "omabox linux", "p50", "p99");
    ready.row("start→ready");
    ready_spaced.row(&format!("start→ready, spaced 50 ms (n={spaced})"));
    handshake.row("start→agent handshake");
    destroy.row("destroy");
    full.row("start+handshake+echo+destroy");
    println!();
    println!(
        "{:<36} {:>11} {:>11} {:>9}",
        "exec round trip vs host floor", "p50", "p99", "/floor"
    );
    exec_rt.row_vs("exec /bin/true in sandbox", &floor);
    floor.row_vs("host spawns /bin/true (floor)", &floor);
    ping_rt.row("protocol ping round trip");
    println!(
        "  exec overhead over the floor: p50 {:.3} ms",
        (exec_rt.p50().as_secs_f64() - floor.p50().as_secs_f64()) * 1e3
    );
    println!();
    println!(
        "{:<36} {:>11} {:>11} {:>9}",
        "same work, other tools", "p50", "p99", "omabox/x"
    );
    if have_bwrap {
        println!(
            "{:<36} {:>11} {:>11} {:>9}",
            "bwrap start→echo output (ready)",
            ms(bw_ready.p50()),
            ms(bw_ready.p99()),
            ratio(ready.p50(), bw_ready.p50())
        );
        println!(
            "{:<36} {:>11} {:>11} {:>9}",
            "bwrap start→echo→exit (full)",
            ms(bw_total.p50()),
            ms(bw_total.p99()),
            ratio(full.p50(), bw_total.p50())
        );
    } else {
        println!("bwrap: not installed (apt-get install -y bubblewrap)");
    }
    match &cli {
        Some(cli) if !cli_total.0.is_empty() => {
            println!(
                "{:<36} {:>11} {:>11} {:>9}",
                "omabox sandbox run (whole process)",
                ms(cli_total.p50()),
                ms(cli_total.p99()),
                if have_bwrap {
                    ratio(cli_total.p50(), bw2_total.p50())
                } else {
                    "-".into()
                }
            );
            println!(
                "  ({}, {} copies: p50 {}; first output byte p50 {}; ratio against bwrap's whole process)",
                cli.display(),
                per_copy.len(),
                per_copy
                    .iter()
                    .map(|s| ms(s.p50()))
                    .collect::<Vec<_>>()
                    .join(" / "),
                ms(cli_ready.p50())
            );
            if !cli_blocks.0.is_empty() && !bw_blocks.0.is_empty() {
                println!(
                    "{:<36} {:>11} {:>11} {:>9}",
                    format!("  {BLOCK} in a row, per run (omabox)"),
                    ms(cli_blocks.p50()),
                    ms(cli_blocks.p99()),
                    ratio(cli_blocks.p50(), bw_blocks.p50())
                );
                println!(
                    "{:<36} {:>11} {:>11}",
                    format!("  {BLOCK} in a row, per run (bwrap)"),
                    ms(bw_blocks.p50()),
                    ms(bw_blocks.p99())
                );
                println!(
                    "  (blocks of {BLOCK} consecutive runs per tool, in turn: each run also pays the kernel's \
                     leftover work of the previous run of its own tool; p50/p99 over {} blocks)",
                    cli_blocks.0.len()
                );
            }
        }
        Some(cli) => println!("{}: `sandbox run` failed", cli.display()),
        None => println!(
            "omabox sandbox run: no omabox binary (cargo build --release -p omabox, or set OMABOX_BENCH_CLI)"
        ),
    }
    if have_unshare {
        println!(
            "{:<36} {:>11} {:>11} {:>9}",
            "unshare start→echo output (ready)",
            ms(us_ready.p50()),
            ms(us_ready.p99()),
            ratio(ready.p50(), us_ready.p50())
        );
        println!(
            "{:<36} {:>11} {:>11} {:>9}",
            "unshare start→echo→exit (full)",
            ms(us_total.p50()),
            ms(us_total.p99()),
            ratio(full.p50(), us_total.p50())
        );
    } else {
        println!("unshare: not usable here");
    }
    println!();
    segments.print("where start→ready goes");
    println!();
    println!("idle sandboxes alive: {idle}");
    println!("  sandbox RSS per sandbox:          {}", per(rss, idle));
    println!("  sandbox PSS per sandbox:          {}", per(pss, idle));
    println!(
        "  cgroup memory charge per sandbox: {}",
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
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at end: {}", load.trim());
}

/// The `omabox` binary's allocator (`crates/cli/src/main.rs`), so the figures are its.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
