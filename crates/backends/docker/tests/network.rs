//! A docker container's network under `limited` and `unrestricted`, attacked from inside:
//! the host's DNS stub and relay, bound in the container's own namespace (network mode
//! `none`), let out exactly what the config names, to a fake "internet" the test builds in a
//! network namespace of its own (198.18.0.0/15, the linux backend's `internet` module);
//! everything else leads nowhere. The image is a static busybox: names are looked up with
//! `nslookup` (its own resolver, through the container's `/etc/resolv.conf`) and HTTP is
//! spoken with `nc`.

mod common;
#[path = "../../linux/tests/internet/mod.rs"]
mod internet;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{Rig, config, missing, rig};
use internet::{Internet, Server, TestResolver};
use omabox_backend_docker::{DockerError, DockerNetwork, DockerSandboxPort, Engine, GatewayAccess};
use omabox_contract::networking::NetworkingConfig;
use omabox_test_support::require_capability;

/// `resolve NAME`: the address the stub answers. `get NAME [PORT]`: the name looked up, then `GET /` to the address it
/// answered (the relay sees the original destination), printing the body's last line;
/// `UNRESOLVED` when the stub answers no address. `http ADDR PORT HOST`: the same request
/// to an address of the caller's choice.
const HELPERS: &str = r#"
resolve() {
  busybox nslookup -type=a "$1" 2>/dev/null | busybox awk '/^Name:/{n=1} n && /^Address/{print $2; exit}'
}
get() {
  a=$(resolve "$1")
  [ -n "$a" ] || { echo UNRESOLVED; return; }
  http "$a" "${2:-80}" "$1"
}
http() {
  printf 'GET / HTTP/1.0\r\nHost: %s\r\n\r\n' "$3" | busybox nc -w 5 "$1" "$2" 2>/dev/null | busybox tail -n 1
}
"#;

fn limited(hosts: &[&str]) -> NetworkingConfig {
    NetworkingConfig::Limited {
        allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
        allow_package_managers: false,
        allow_mcp_servers: false,
    }
}

struct Fixture {
    port: DockerSandboxPort,
    _rig: Rig,
}

impl Fixture {
    async fn start(network: DockerNetwork, resolver: Arc<TestResolver>) -> Self {
        let rig = rig().await;
        let config = omabox_backend_docker::DockerConfig {
            network,
            ..config(&rig, "host-net")
        };
        let port = DockerSandboxPort::start_resolving(&rig.engine, &config, "sbx-net", resolver)
            .await
            .expect("container start");
        Self { port, _rig: rig }
    }

    /// Runs `command` (with [`HELPERS`] defined) in the container; its trimmed output.
    async fn sh(&self, command: &str) -> String {
        self.port
            .exec_command(
                &format!("{HELPERS}\n{command}"),
                Some(Duration::from_secs(30)),
            )
            .await
            .expect("exec")
            .trim()
            .to_owned()
    }

    async fn finish(self) {
        self.port.terminate().await.expect("remove the container");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_name_is_reached_and_a_refused_one_is_not_even_resolved() {
    if !require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("allowed.test", far), ("denied.test", far)]);
    let fx = Fixture::start(
        DockerNetwork::new(limited(&["allowed.test"])),
        Arc::clone(&resolver),
    )
    .await;

    // The engine wrote the stub's address; the container cannot take the host's ports.
    assert_eq!(fx.sh("cat /etc/resolv.conf").await, "nameserver 127.0.0.1");
    assert_eq!(
        fx.sh("cat /proc/sys/net/ipv4/ip_unprivileged_port_start")
            .await,
        "1024"
    );
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
    assert!(!direct.contains("saw host"), "{direct}");
    assert_eq!(web.accepts(), 1);
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hosts_own_addresses_and_services_are_refused_and_its_ports_are_not_taken() {
    if !require_capability(missing()) {
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
    let fx = Fixture::start(DockerNetwork::new(NetworkingConfig::Unrestricted), resolver).await;

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
    // No port below 1024 of its own, no address, no route, no raw socket.
    let bind = fx
        .sh("busybox nc -l -p 81 2>&1 & sleep 0.5; kill $! 2>/dev/null; echo done")
        .await;
    assert!(bind.contains("Permission denied"), "{bind}");
    let addr = fx
        .sh("busybox ip addr add 10.9.9.9/24 dev lo 2>&1; echo rc=$?")
        .await;
    assert!(
        addr.ends_with("rc=2") || addr.contains("not permitted"),
        "{addr}"
    );
    let route = fx
        .sh("busybox ip route add default dev lo 2>&1; echo rc=$?")
        .await;
    assert!(route.contains("not permitted"), "{route}");
    let caps = fx.sh("grep CapEff /proc/1/status").await;
    assert_eq!(caps, "CapEff:\t00000000000000fb", "no NET_* capability");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_is_reached_at_its_port_on_loopback_and_by_its_name() {
    if !require_capability(missing()) {
        return;
    }
    let gateway = Server::http(
        std::net::TcpListener::bind("127.0.0.1:0").unwrap(),
        "gateway",
    );
    let network = DockerNetwork {
        gateway: Some(GatewayAccess {
            upstream: gateway.addr,
            name: Some("gateway.test".into()),
        }),
        ..DockerNetwork::new(limited(&[]))
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
async fn a_policy_change_takes_effect_in_the_live_container() {
    if !require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let web = inet.http(80, "web");
    let far = IpAddr::V4(inet.far);
    let resolver = TestResolver::new(&[("a.test", far), ("b.test", far)]);
    let fx = Fixture::start(DockerNetwork::new(limited(&["a.test"])), resolver).await;
    assert_eq!(fx.sh("get a.test").await, "web saw host a.test");
    assert_eq!(fx.sh("get b.test").await, "UNRESOLVED");

    fx.port
        .set_networking(&DockerNetwork::new(limited(&["b.test"])))
        .unwrap();
    assert_eq!(fx.sh("get b.test").await, "web saw host b.test");
    let a = fx.sh("get a.test").await;
    assert!(!a.contains("saw host"), "{a}");
    assert_eq!(web.accepts(), 2);
    // A bad entry changes nothing and says why.
    let bad = fx
        .port
        .set_networking(&DockerNetwork::new(limited(&["bad host"])))
        .unwrap_err();
    assert!(matches!(bad, DockerError::Networking(_)), "{bad:?}");
    assert_eq!(fx.sh("get b.test").await, "web saw host b.test");
    fx.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_engine_refuses_a_network_before_creating_anything() {
    // Nothing listens there: the refusal comes before any request.
    let engine = Engine::connect_pinned("tcp://127.0.0.1:9").unwrap();
    let config = omabox_backend_docker::DockerConfig {
        network: DockerNetwork::new(NetworkingConfig::Unrestricted),
        ..omabox_backend_docker::DockerConfig::new("busybox", "host-remote")
    };
    let error = DockerSandboxPort::start(&engine, &config, "sbx-remote")
        .await
        .unwrap_err();
    assert!(
        matches!(error, DockerError::RemoteNetwork { .. }),
        "{error:?}"
    );
    assert!(
        error.to_string().contains("needs a local Docker Engine"),
        "{error}"
    );
}
