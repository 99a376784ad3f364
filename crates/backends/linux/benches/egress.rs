//! Network egress through the whole enforced path, timed the way a user's program sees it:
//! the same Python client run inside a `limited` sandbox (name lookup by the host's stub,
//! connection through the host's relay) and on the host directly, against the same
//! servers in a fake "internet" namespace (198.18.0.0/15, see `tests/internet`), in one
//! run. The sandbox's client connects by name, so each of its connects includes a lookup
//! through the stub; the host's connects to the address. Prints figures; asserts nothing.
//!
//! `cargo bench -p omabox-backend-linux --bench egress` (as root, after `cargo build --release
//! --bins`: the sandbox's init is omabox-linux-sandbox's binary). `OMABOX_BENCH_CONNECTS`
//! sets the connects per side (default 300), `OMABOX_BENCH_MIB` the bulk transfer size
//! (default 512).

#[path = "../tests/internet/mod.rs"]
mod internet;

use std::net::IpAddr;
use std::time::Duration;

use internet::{Internet, TestResolver};
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_backend_linux::{LinuxRuntime, Networking, RuntimeConfig, SandboxPlan};
use omabox_contract::networking::NetworkingConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The client: `connect` times connect + one round trip per connection (ms, sorted);
/// `bulk` reads N MiB from one connection (MiB/s). One JSON line out.
const CLIENT: &str = r#"
import json, socket, sys, time
host, port, n, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
lat = []
for _ in range(n):
    t = time.perf_counter()
    s = socket.create_connection((host, port))
    s.sendall(b"c")
    s.recv(1)
    lat.append((time.perf_counter() - t) * 1000)
    s.close()
lat.sort()
s = socket.create_connection((host, port))
s.sendall(b"b" + mib.to_bytes(4, "big"))
t = time.perf_counter()
got = 0
buf = bytearray(1 << 20)
while True:
    k = s.recv_into(buf)
    if not k:
        break
    got += k
secs = time.perf_counter() - t
print(json.dumps({"p50": lat[len(lat) // 2], "p99": lat[int(len(lat) * 0.99)], "mibps": got / secs / (1 << 20)}))
"#;

/// omabox-linux-sandbox's `omabox-sandbox-init`, in this benchmark's target profile dir
/// (`env!("CARGO_BIN_EXE_…")` names this crate's own binaries only).
fn init_binary() -> std::path::PathBuf {
    let exe = std::env::current_exe().expect("the benchmark's path");
    let profile_dir = exe.parent().and_then(std::path::Path::parent);
    let init = profile_dir
        .expect("target/<profile>/deps/")
        .join(omabox_backend_linux::INIT_BINARY);
    assert!(
        init.is_file(),
        "{} is missing: cargo build --release -p omabox-linux-sandbox --bins",
        init.display()
    );
    init
}

fn env_n(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Answers `c` with one byte; answers `b<u32 MiB>` with that many MiB, then closes.
fn serve(listener: std::net::TcpListener) {
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                let mut op = [0u8; 1];
                if s.read_exact(&mut op).await.is_err() {
                    return;
                }
                if op[0] == b'c' {
                    let _ = s.write_all(b"k").await;
                    return;
                }
                let mut n = [0u8; 4];
                if s.read_exact(&mut n).await.is_err() {
                    return;
                }
                let chunk = vec![7u8; 1 << 20];
                for _ in 0..u32::from_be_bytes(n) {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
}

fn parse(line: &str) -> (f64, f64, f64) {
    let v: serde_json::Value =
        serde_json::from_str(line.trim()).unwrap_or_else(|e| panic!("client output {line:?}: {e}"));
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    (f("p50"), f("p99"), f("mibps"))
}

fn main() {
    if !nix_is_root() {
        eprintln!("egress bench: needs root; skipped");
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run());
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

async fn run() {
    let (connects, mib) = (
        env_n("OMABOX_BENCH_CONNECTS", 300),
        env_n("OMABOX_BENCH_MIB", 512),
    );
    let inet = Internet::new();
    serve(inet.listener(80));
    let resolver = TestResolver::new(&[("bench.test", IpAddr::V4(inet.far))]);
    let runtime = LinuxRuntime::new(RuntimeConfig {
        runtime_dir: "/run/omabox-bench".into(),
        cgroup_parent: "omabox-bench".into(),
        init_binary: Some(init_binary()),
        ..RuntimeConfig::default()
    })
    .expect("linux runtime");
    let mut plan = SandboxPlan::preinstalled("bench");
    plan.network = Networking {
        config: NetworkingConfig::Limited {
            allowed_hosts: vec!["bench.test".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        ..Networking::default()
    };
    let port = LinuxSandboxPort::start_resolving(&runtime, &plan, resolver)
        .await
        .expect("sandbox start");
    let script = "/tmp/client.py";
    port.exec_command(
        &format!("cat > {script} <<'EOF'\n{CLIENT}\nEOF"),
        Some(Duration::from_secs(10)),
    )
    .await
    .expect("write client");
    let host_script =
        std::env::temp_dir().join(format!("omabox-egress-bench-{}.py", std::process::id()));
    std::fs::write(&host_script, CLIENT).unwrap();

    println!(
        "egress through the enforced path vs host direct: {connects} connects + {mib} MiB each, interleaved"
    );
    let (mut through, mut direct) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let out = port
            .exec_command(
                &format!(
                    "python3 {script} bench.test 80 {} {}",
                    connects / 3,
                    mib / 3
                ),
                Some(Duration::from_secs(300)),
            )
            .await
            .expect("client in the sandbox");
        through.push(parse(&out));
        let out = tokio::process::Command::new("python3")
            .arg(&host_script)
            .args([
                &inet.far.to_string(),
                "80",
                &(connects / 3).to_string(),
                &(mib / 3).to_string(),
            ])
            .output()
            .await
            .expect("client on the host");
        direct.push(parse(&String::from_utf8_lossy(&out.stdout)));
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let col = |rows: &[(f64, f64, f64)], i: usize| -> f64 {
        let mut v: Vec<f64> = rows
            .iter()
            .map(|r| match i {
                0 => r.0,
                1 => r.1,
                _ => r.2,
            })
            .collect();
        median(&mut v)
    };
    println!(
        "{:<34} {:>12} {:>12} {:>12}",
        "", "connect p50", "connect p99", "MiB/s"
    );
    for (name, rows) in [
        ("sandbox -> relay -> server", &through),
        ("host -> server (direct)", &direct),
    ] {
        println!(
            "{:<34} {:>9.3} ms {:>9.3} ms {:>12.0}",
            name,
            col(rows, 0),
            col(rows, 1),
            col(rows, 2)
        );
    }
    println!(
        "added connect time p50: {:.3} ms (goal <= 1 ms); throughput: {:.0}% of direct (goal >= 50%)",
        col(&through, 0) - col(&direct, 0),
        100.0 * col(&through, 2) / col(&direct, 2)
    );
    let _ = std::fs::remove_file(&host_script);
    port.terminate().await.expect("destroy");
}
