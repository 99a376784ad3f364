//! Credential egress on a real sandbox: an HTTPS origin in the fake internet demands a
//! bearer token; the sandbox reaches it with `curl` and `git clone` without ever holding
//! the token (not in its env, its files, any process's environ or memory), and not at all
//! once the binding is revoked.

mod common;
mod internet;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Isolated, assert_gone, can_run, test_plan};
use internet::https::Origin;
use internet::{Internet, TestResolver};
use omabox_backend_linux::Networking;
use omabox_backend_linux::port::LinuxSandboxPort;
use omabox_contract::SecretString;
use omabox_contract::networking::NetworkingConfig;
use omabox_egress::intercept::{Credentials, InjectionRule, InterceptCa, roots_from_pem};

const SECRET: &str = "omabox-test-secret-3f9a1c";

async fn sh(port: &LinuxSandboxPort, command: &str) -> String {
    port.exec_command(command, Some(Duration::from_secs(60)))
        .await
        .expect("exec")
}

/// Every pid in the sandbox (its cgroup's `cgroup.procs`, any controller).
fn sandbox_pids(port: &LinuxSandboxPort) -> Vec<i32> {
    let mut pids = Vec::new();
    for dir in &port.identity().cgroup.dirs {
        if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
            pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
        }
    }
    pids.sort();
    pids.dedup();
    pids
}

/// Whether `needle` is in any readable mapping of process `pid` (read from the host).
fn in_memory(pid: i32, needle: &[u8]) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return false;
    };
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return false;
    };
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut at = a;
        while at < b {
            let len = ((b - at) as usize).min(4 << 20);
            let mut buf = vec![0u8; len];
            let Ok(n) = mem.read_at(&mut buf, at) else {
                break;
            };
            if buf[..n].windows(needle.len()).any(|w| w == needle) {
                return true;
            }
            at += len as u64;
        }
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_host_is_reached_with_a_secret_the_sandbox_never_holds() {
    if !can_run() {
        return;
    }
    let inet = Internet::new();
    let origin = Origin::start(&inet, SECRET);
    let resolver = TestResolver::new(&[("api.test", IpAddr::V4(inet.far))]);
    let iso = Isolated::new();
    let mut plan = test_plan();
    plan.limits.memory_bytes = Some(512 << 20);
    plan.network = Networking {
        config: NetworkingConfig::Limited {
            allowed_hosts: vec!["api.test".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        },
        ..Networking::default()
    };
    let port = LinuxSandboxPort::start_resolving(&iso.runtime(), &plan, resolver)
        .await
        .expect("sandbox start");

    // Before the binding: the origin's certificate is not trusted, and without the
    // secret it would answer 401 anyway.
    let before = sh(
        &port,
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1; echo rc=$?",
    )
    .await;
    assert!(!before.contains("hello from api"), "{before}");

    let rule = InjectionRule::new(
        "api.test",
        "/",
        "authorization",
        SecretString::new(format!("Bearer {SECRET}")),
    )
    .unwrap();
    let ca = InterceptCa::generate("linux-egress-test").unwrap();
    let credentials = Arc::new(
        Credentials::new(ca, vec![rule], roots_from_pem(origin.ca_pem().as_bytes())).unwrap(),
    );
    port.attach_credentials(Arc::clone(&credentials))
        .await
        .expect("attach");

    assert_eq!(
        sh(&port, "curl -fsS -m 10 https://api.test/hello.txt")
            .await
            .trim(),
        "hello from api"
    );
    let cloned = sh(
        &port,
        "git clone -q https://api.test/repo.git /tmp/clone 2>&1 && cat /tmp/clone/file.txt",
    )
    .await;
    assert_eq!(cloned.trim(), "cloned through the relay", "{cloned}");
    // A process that used the injected path stays alive for the memory scan.
    let started = sh(
        &port,
        "python3 -c \"import urllib.request,time; r=urllib.request.urlopen('https://api.test/hello.txt'); open('/tmp/py','w').write(r.read().decode()); time.sleep(60)\" >/dev/null 2>&1 & \
         for i in $(seq 100); do [ -s /tmp/py ] && break; sleep 0.1; done; cat /tmp/py",
    )
    .await;
    assert_eq!(started.trim(), "hello from api");

    // The secret is nowhere in the sandbox. (The probe names it only in base64, so the
    // command the agent receives does not hold it either.)
    let encoded = "b21hYm94LXRlc3Qtc2VjcmV0LTNmOWExYw==";
    let found = sh(
        &port,
        &format!(
            "S=$(echo {encoded} | base64 -d); env | grep -c \"$S\"; \
             cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c \"$S\"; \
             grep -rls \"$S\" /tmp /etc /workspace /root /dev/shm 2>/dev/null | wc -l"
        ),
    )
    .await;
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        ["0", "0", "0"],
        "{found}"
    );
    let pids = sandbox_pids(&port);
    assert!(pids.len() >= 2, "{pids:?}");
    for pid in pids {
        assert!(
            !in_memory(pid, SECRET.as_bytes()),
            "the secret is in the memory of pid {pid}"
        );
    }

    // Revoked: cut at once.
    credentials.revoke();
    let after = sh(
        &port,
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1; echo rc=$?",
    )
    .await;
    assert!(!after.contains("hello from api"), "{after}");
    let identity = port.identity().clone();
    port.terminate().await.expect("destroy");
    assert_gone(&identity);
    iso.assert_empty();
}
