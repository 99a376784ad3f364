//! Credential egress in a docker container: a binding's credentials attached to the live
//! container make the host's relay terminate TLS to the bound host with the binding's CA and
//! add the secret there, so `curl` in the container reaches an origin demanding it while the
//! container never holds it. The origin is the linux backend's test HTTPS server in a fake
//! "internet" (`internet::https`); the image holds the host's `curl` with the libraries it
//! links and the host's CA bundle (as an image's own bundle), plus a static busybox.

mod common;
#[path = "../../linux/tests/internet/mod.rs"]
mod internet;

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use internet::https::Origin;
use internet::{Internet, TestResolver};
use omabox_backend_docker::config::locate_agent;
use omabox_backend_docker::{DockerConfig, DockerError, DockerNetwork, DockerSandboxPort, Engine};
use omabox_contract::SecretString;
use omabox_contract::networking::NetworkingConfig;
use omabox_egress::intercept::{Credentials, InjectionRule, InterceptCa, roots_from_pem};
use omabox_test_support::dockerd::TestDockerd;
use omabox_test_support::registry::{TestRegistry, tar_layer};
use omabox_test_support::require_capability;

const SECRET: &str = "omabox-test-secret-docker-7d1e";
const CURL: &str = "/usr/bin/curl";
const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

fn missing() -> Option<String> {
    common::missing().or_else(|| {
        (!std::path::Path::new(CURL).is_file() || !std::path::Path::new(HOST_BUNDLE).is_file())
            .then(|| format!("{CURL} and {HOST_BUNDLE} are needed (apt-get install curl)"))
    })
}

/// The files of an image running the host's curl: it, the libraries it links, the host's
/// CA bundle, busybox.
fn curl_image_files() -> Vec<(String, Vec<u8>)> {
    let mut files = omabox_test_support::registry::host_files(&[CURL, HOST_BUNDLE]);
    let busybox = std::fs::read("/bin/busybox").unwrap();
    files.push(("bin/busybox".into(), busybox.clone()));
    files.push(("bin/sh".into(), busybox));
    files.push(("tmp/.keep".into(), Vec::new()));
    files
}

async fn sh(port: &DockerSandboxPort, command: &str) -> String {
    port.exec_command(command, Some(Duration::from_secs(30)))
        .await
        .expect("exec")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bound_host_is_reached_with_a_secret_the_container_never_holds() {
    if !require_capability(missing()) {
        return;
    }
    let inet = Internet::new();
    let origin = Origin::start(&inet, SECRET);
    let resolver = TestResolver::new(&[("api.test", IpAddr::V4(inet.far))]);
    let registry = TestRegistry::start();
    let files = curl_image_files();
    let entries: Vec<(&str, u32, &[u8])> = files
        .iter()
        .map(|(path, bytes)| (path.as_str(), 0o755, bytes.as_slice()))
        .collect();
    registry.push_image("test/curl", "1", &[tar_layer(&entries)]);
    let dockerd = TestDockerd::start();
    let engine = Engine::connect(&dockerd.host()).await.unwrap();
    let config = DockerConfig {
        agent_binary: locate_agent(None).unwrap(),
        network: DockerNetwork::new(NetworkingConfig::Limited {
            allowed_hosts: vec!["api.test".into()],
            allow_package_managers: false,
            allow_mcp_servers: false,
        }),
        ..DockerConfig::new(format!("{}/test/curl:1", registry.host()), "host-cred")
    };
    let port = DockerSandboxPort::start_resolving(&engine, &config, "sbx-cred", resolver)
        .await
        .expect("container start");

    // Before the binding: the origin's certificate is not trusted (and it would answer
    // 401 without the secret).
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
    let ca = InterceptCa::generate("docker-egress-test").unwrap();
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
    // The container's bundle is its image's plus the binding's CA, named by the CA
    // variables; the secret is nowhere in it (named here only in base64).
    let bundle = sh(
        &port,
        "echo $SSL_CERT_FILE $CURL_CA_BUNDLE; busybox grep -c 'BEGIN CERTIFICATE' $SSL_CERT_FILE",
    )
    .await;
    let image_certs = std::fs::read_to_string(HOST_BUNDLE)
        .unwrap()
        .matches("BEGIN CERTIFICATE")
        .count();
    assert_eq!(
        bundle.split_whitespace().collect::<Vec<_>>(),
        [
            "/tmp/.omabox/ca-certificates.crt",
            "/tmp/.omabox/ca-certificates.crt",
            &(image_certs + 1).to_string(),
        ],
        "{bundle}"
    );
    let encoded = "b21hYm94LXRlc3Qtc2VjcmV0LWRvY2tlci03ZDFl";
    let found = sh(
        &port,
        &format!(
            "S=$(echo {encoded} | busybox base64 -d); busybox env | busybox grep -c \"$S\"; \
             busybox grep -rls \"$S\" /tmp /etc /workspace 2>/dev/null | busybox wc -l"
        ),
    )
    .await;
    assert_eq!(
        found.split_whitespace().collect::<Vec<_>>(),
        ["0", "0"],
        "{found}"
    );

    // Revoked: cut at once.
    credentials.revoke();
    let after = sh(
        &port,
        "curl -fsS -m 10 https://api.test/hello.txt 2>&1; echo rc=$?",
    )
    .await;
    assert!(!after.contains("hello from api"), "{after}");
    port.terminate().await.expect("remove");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_need_a_network() {
    if !require_capability(common::missing()) {
        return;
    }
    let rig = common::rig().await;
    let port =
        DockerSandboxPort::start(&rig.engine, &common::config(&rig, "host-none"), "sbx-none")
            .await
            .unwrap();
    let ca = InterceptCa::generate("docker-egress-none").unwrap();
    let credentials = Arc::new(Credentials::new(ca, Vec::new(), roots_from_pem(b"")).unwrap());
    let error = port.attach_credentials(credentials).await.unwrap_err();
    assert!(matches!(error, DockerError::NoNetwork), "{error:?}");
    port.terminate().await.unwrap();
}
