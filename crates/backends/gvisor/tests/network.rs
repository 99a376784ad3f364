//! A gvisor sandbox's network under `none`, `limited` and `unrestricted`, attacked from
//! inside: the host's DNS stub and relay, bound in the sandbox's own network namespace
//! (runsc with `--network host` inside it), let out exactly what the config names, to a
//! fake "internet" the test builds in a network namespace of its own (198.18.0.0/15, the
//! linux backend's `internet` module); everything else leads nowhere. The sandbox's root
//! is the host's `/usr`: names are looked up and HTTP is spoken with python3 (glibc's
//! resolver, through the root's `/etc/resolv.conf`).
//!
//! Needs root, runsc and `ip` (scripts/setup); without them the tests skip locally and
//! fail under CI=true.

#[path = "../../linux/tests/internet/mod.rs"]
mod internet;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use internet::{Internet, Server, TestResolver};
use omabox_backend_gvisor::{
    GatewayAccess, GvisorConfig, GvisorError, GvisorNetwork, GvisorRuntime, GvisorSandboxPort,
};
use omabox_contract::networking::NetworkingConfig;
use omabox_sandbox::SandboxPort;

/// `resolve NAME`: the address the stub answers, or `UNRESOLVED`. `get NAME [PORT]`: the
/// name looked up, then `GET /` to the address it answered, printing the body's last
/// line. `http ADDR PORT HOST`: the same request to an address of the caller's choice.
/// `bind PORT`: whether a listener on 127.0.0.1:PORT can be made.
const HELPERS: &str = r#"
resolve() {
  python3 -c 'import socket,sys
try: print(socket.gethostbyname(sys.argv[1]))
except OSError: print("UNRESOLVED")' "$1"
}
get() {
  a=$(resolve "$1")
  [ "$a" != UNRESOLVED ] || { echo UNRESOLVED; return; }
  http "$a" "${2:-80}" "$1"
}
http() {
  python3 -c 'import socket,sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5)
    s.sendall(b"GET / HTTP/1.0\r\nHost: " + sys.argv[3].encode() + b"\r\n\r\n")
    data = b""
    while True:
        chunk = s.recv(4096)
        if not chunk: break
        data += chunk
    print(data.decode(errors="replace").strip().splitlines()[-1] if data.strip() else "EMPTY")
except OSError as e: print("ERROR", e)' "$1" "$2" "$3"
}
bind() {
  python3 -c 'import socket,sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1]))); print("bound")
except OSError as e: print("ERROR", e)' "$1"
}
"#;

fn limited(hosts: &[&str]) -> NetworkingConfig {
    NetworkingConfig::Limited {
        allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        allow_package_managers: false,
        allow_mcp_servers: false,
    }
}

fn missing() -> Option<String> {
    if omabox_backend_gvisor::locate_runsc().is_none() {
        return Some("runsc is not installed (scripts/setup installs it)".into());
    }
    if !omabox_backend_gvisor::runs_as_root() {
        return Some("runsc and the test's network namespaces need root".into());
    }
    None
}

struct Fixture {
    port: GvisorSandboxPort,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn start(network: GvisorNetwork, resolver: Arc<TestResolver>) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let runtime = runtime(dir.path(), network).with_resolver(resolver);
        let sandbox = runtime.create().await.expect("sandbox start");
        Self {
            port: GvisorSandboxPort::new(Arc::new(sandbox)),
            _dir: dir,
        }
    }

    /// Runs `command` (with [`HELPERS`] defined) in the sandbox; its trimmed output.
    async fn sh(&self, command: &str) -> String {
        self.port
            .exec(&format!("{HELPERS}\n{command}"), Some(30_000))
            .await
            .expect("exec")
            .trim()
            .to_owned()
    }

    async fn finish(self) {
        self.port.sandbox().destroy().await.expect("destroy");
    }
}

fn runtime(dir: &Path, network: GvisorNetwork) -> GvisorRuntime {
    GvisorRuntime::new(GvisorConfig {
        runsc: omabox_backend_gvisor::locate_runsc().unwrap(),
        dir: dir.to_path_buf(),
        init: PathBuf::from(env!("CARGO_BIN_EXE_omabox-gvisor-init")),
        platform: "ptrace".into(),
        limits: Default::default(),
        network,
        test_hosts: None,
        image_root: None,
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_name_is_reached_and_a_refused_one_is_not_even_resolved() {
    if !omabox_test_support::require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("allowed.test", far), ("denied.test", far)]);
    let fx = Fixture::start(
        GvisorNetwork::new(limited(&["allowed.test"])),
        Arc::clone(&resolver),
    )
    .await;

    assert_eq!(fx.sh("get allowed.test").await, "web saw host allowed.test");
    assert_eq!(web.accepts(), 1);
    assert_eq!(fx.sh("get denied.test").await, "UNRESOLVED");
    // The denied name asked for over a listened port: refused by name.
    let forged = fx.sh("http 127.0.0.1 80 denied.test").await;
    assert!(!forged.contains("saw host"), "{forged}");
    assert_eq!(web.accepts(), 1, "no denied request reached the server");
    assert!(
        !resolver.asked().iter().any(|n| n == "denied.test"),
        "{:?}",
        resolver.asked()
    );
    // The allowed host's address itself: no route.
    let direct = fx.sh(&format!("http {} 80 allowed.test", inet.far)).await;
    assert!(direct.starts_with("ERROR"), "{direct}");
    assert_eq!(web.accepts(), 1);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_own_addresses_and_services_are_refused_and_its_ports_are_not_taken() {
    if !omabox_test_support::require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    // A service of the host on its own address of the link, and one on its loopback.
    let on_host = Server::http(
        std::net::TcpListener::bind((inet.host, 80)).unwrap(),
        "host",
    );
    let host_loopback = Server::http(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "host-loopback",
    );
    let resolver = TestResolver::new(&[
        ("far.test", IpAddr::V4(inet.far)),
        ("host.test", IpAddr::V4(inet.host)),
        ("loopback.test", "127.0.0.1".parse().unwrap()),
    ]);
    let fx = Fixture::start(GvisorNetwork::new(NetworkingConfig::Unrestricted), resolver).await;

    assert_eq!(fx.sh("get far.test").await, "web saw host far.test");
    for refused in ["host.test", "loopback.test"] {
        let got = fx.sh(&format!("get {refused}")).await;
        assert!(!got.contains("saw host"), "{refused}: {got}");
    }
    let got = fx
        .sh(&format!(
            "http 127.0.0.1 {} x.test",
            host_loopback.addr.port()
        ))
        .await;
    assert!(!got.contains("saw host"), "{got}");
    assert_eq!((on_host.accepts(), host_loopback.accepts()), (0, 0));
    assert_eq!(web.accepts(), 1);
    // The host's listeners are bound before anything runs in the namespace, and gVisor's
    // kernel runs in a user namespace of its own: no port below 1024 is the sandbox's
    // (without that namespace runsc's Sentry held NET_BIND_SERVICE over the namespace and
    // bound 81), and a high one is.
    for port in ["53", "80", "443", "81"] {
        let got = fx.sh(&format!("bind {port}")).await;
        assert!(got.contains("Permission denied"), "{port}: {got}");
    }
    assert_eq!(fx.sh("bind 8081").await, "bound");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_reached_at_its_port_on_loopback_and_by_its_name() {
    if !omabox_test_support::require_capability(missing()) {
        return;
    }
    let gateway = Server::http(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "gateway",
    );
    let network = GvisorNetwork {
        gateway: Some(GatewayAccess {
            upstream: gateway.addr,
            name: Some("gateway.test".into()),
        }),
        ..GvisorNetwork::new(limited(&[]))
    };
    let fx = Fixture::start(network, TestResolver::new(&[])).await;
    let port = gateway.addr.port();
    assert_eq!(
        fx.sh(&format!("http 127.0.0.1 {port} gateway.test")).await,
        "gateway saw host gateway.test"
    );
    assert_eq!(fx.sh("resolve gateway.test").await, "127.0.0.1");
    assert_eq!(gateway.accepts(), 1);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_change_takes_effect_and_none_has_no_way_out() {
    if !omabox_test_support::require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("a.test", far), ("b.test", far)]);
    let fx = Fixture::start(
        GvisorNetwork::new(limited(&["a.test"])),
        Arc::clone(&resolver),
    )
    .await;
    assert_eq!(fx.sh("get a.test").await, "web saw host a.test");
    assert_eq!(fx.sh("get b.test").await, "UNRESOLVED");
    fx.port
        .set_networking(&GvisorNetwork::new(limited(&["b.test"])))
        .unwrap();
    assert_eq!(fx.sh("get b.test").await, "web saw host b.test");
    let a = fx.sh("get a.test").await;
    assert!(!a.contains("saw host"), "{a}");
    assert_eq!(web.accepts(), 2);
    let bad = fx
        .port
        .set_networking(&GvisorNetwork::new(limited(&["bad host"])))
        .unwrap_err();
    assert!(matches!(bad, GvisorError::Networking(_)), "{bad:?}");
    fx.finish().await;

    // Under none: gVisor's own stack, loopback only; nothing resolves, nothing is reached.
    let fx = Fixture::start(GvisorNetwork::default(), resolver).await;
    assert_eq!(fx.sh("get a.test").await, "UNRESOLVED");
    let direct = fx.sh(&format!("http {} 80 a.test", inet.far)).await;
    assert!(direct.starts_with("ERROR"), "{direct}");
    assert_eq!(web.accepts(), 2);
    let none = fx
        .port
        .set_networking(&GvisorNetwork::new(limited(&["a.test"])))
        .unwrap_err();
    assert!(matches!(none, GvisorError::NoNetwork), "{none:?}");
    fx.finish().await;
}
