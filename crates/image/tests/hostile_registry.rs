//! Pulls from a registry that lies, on loopback (`omabox_test_support::hostile_http`):
//! token realms and redirects that point at host-only services, a password meant for the
//! registry asked for elsewhere, a manifest too large to hold, error text with terminal
//! escapes, replies that trickle forever. Each asserts what the other services saw (never
//! a connection) and what the error says (the cause, escaped, without the password).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use omabox_image::{
    ImageCache, ImageError, ImageSource, NoProgress, PulledImage, RegistryConfig,
    RegistryCredential, RegistryReference, StaticCredentials,
};
use omabox_test_support::hostile_http::{
    Body, FakeImage, HostileServer, Recorded, Reply, image, serve_image,
};
use omabox_test_support::registry::tar_layer;

const PASSWORD: &str = "Hostile-Pa55word-never-elsewhere";

fn reference(text: &str) -> RegistryReference {
    match ImageSource::parse(text).unwrap() {
        ImageSource::Registry(r) => r,
        other => panic!("{text} is {other:?}"),
    }
}

fn tiny_image() -> FakeImage {
    image(&[tar_layer(&[("marker", 0o644, b"tiny\n")])])
}

/// `user:PASSWORD` for `registry`.
fn credentials(registry: &str) -> RegistryConfig {
    let mut map = BTreeMap::new();
    map.insert(
        registry.to_owned(),
        RegistryCredential::new("user", PASSWORD),
    );
    RegistryConfig::default().with_credentials(Arc::new(StaticCredentials(map)))
}

/// Settings from these env values only.
fn from_env(vars: &[(&str, &str)]) -> RegistryConfig {
    let vars: BTreeMap<String, String> = vars
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    env_config(move |k| vars.get(k).cloned())
}

fn env_config(get: impl Fn(&str) -> Option<String>) -> RegistryConfig {
    RegistryConfig::from_env(get).expect("valid settings")
}

/// Pulls `name` into a fresh cache; a pull that has not ended after two minutes fails
/// the test (a liveness bound, not a speed check).
fn pull(name: &str, config: RegistryConfig) -> Result<PulledImage, ImageError> {
    let name = name.to_owned();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let dir = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(dir.path().join("cache"));
        let result = cache.resolve_registry(&reference(&name), &config, &NoProgress);
        let _ = tx.send(result);
    });
    rx.recv_timeout(Duration::from_secs(120))
        .expect("the pull hung: no deadline ended it")
}

/// Every request any of `servers` saw carried neither the password nor its basic form.
fn assert_password_not_sent(servers: &[&HostileServer]) {
    use base64::Engine as _;
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("user:{PASSWORD}"));
    for server in servers {
        for request in server.requests() {
            let text = format!("{request:?}");
            assert!(
                !text.contains(PASSWORD) && !text.contains(&basic),
                "{} received the password: {text}",
                server.host()
            );
        }
    }
}

fn bearer_challenge(realm: &str) -> impl Fn(&Recorded) -> Reply + Send + Sync + 'static {
    let challenge = format!(r#"Bearer realm="{realm}",service="hostile",scope="x""#);
    move |_: &Recorded| {
        Reply::new(401, r#"{"errors":[{"code":"UNAUTHORIZED"}]}"#)
            .header("WWW-Authenticate", &challenge)
    }
}

/// A stand-in for a host-only service (a metadata endpoint, a local admin API): it would
/// answer anything with a token.
fn host_only_service() -> HostileServer {
    HostileServer::start(|_| {
        Reply::ok(
            "application/json",
            r#"{"token":"from-a-host-only-service"}"#,
        )
    })
}

#[test]
fn a_token_realm_on_another_loopback_port_is_never_contacted_nor_given_the_password() {
    let service = host_only_service();
    let registry = HostileServer::start(bearer_challenge(&format!(
        "http://{}/token",
        service.host()
    )));
    let e = pull(
        &format!("{}/x/y:1", registry.host()),
        credentials(&registry.host()),
    )
    .unwrap_err();
    let text = e.to_string();
    assert_eq!(service.connections(), 0, "the realm was contacted: {text}");
    assert_password_not_sent(&[&registry, &service]);
    assert!(text.contains("token realm"), "{text}");
    assert!(text.contains(&service.host()), "{text}");
    assert!(text.contains("OMABOX_REGISTRY_ALLOWED_HOSTS"), "{text}");
}

#[test]
fn token_realms_at_private_link_local_or_loopback_names_are_refused_before_connecting() {
    let service = host_only_service();
    let port = service.addr().port();
    for realm in [
        format!("http://localhost:{port}/token"),
        format!("http://[::1]:{port}/token"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://10.255.255.1/token".to_owned(),
        "https://192.168.255.1/token".to_owned(),
    ] {
        let registry = HostileServer::start(bearer_challenge(&realm));
        let e = pull(
            &format!("{}/x/y:1", registry.host()),
            credentials(&registry.host()),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("token realm"), "{realm}: {text}");
        assert!(text.contains("refused"), "{realm}: {text}");
        assert_password_not_sent(&[&registry]);
    }
    assert_eq!(service.connections(), 0);
}

#[test]
fn a_realm_on_the_registry_itself_gets_the_password_and_nobody_else_does() {
    let image = tiny_image();
    let registry = Arc::new(std::sync::OnceLock::<String>::new());
    let host = registry.clone();
    let server = HostileServer::start(move |request| {
        let origin = host.get().cloned().unwrap_or_default();
        if request.path() == "/token" {
            return Reply::ok("application/json", r#"{"token":"good-token"}"#);
        }
        if request.header("authorization") != Some("Bearer good-token") {
            return Reply::new(401, "").header(
                "WWW-Authenticate",
                &format!(r#"Bearer realm="http://{origin}/token",service="reg""#),
            );
        }
        serve_image(&image, request)
    });
    registry.set(server.host()).unwrap();
    let pulled = pull(
        &format!("{}/x/y:1", server.host()),
        credentials(&server.host()),
    )
    .unwrap();
    assert_eq!(pulled.digest, tiny_image().digest);
    let requests = server.requests();
    // The password went to /token only; the token to everything else.
    for request in &requests {
        let auth = request.header("authorization").unwrap_or_default();
        if request.path() == "/token" {
            assert!(auth.starts_with("Basic "), "{request:?}");
        } else {
            assert!(!auth.starts_with("Basic "), "{request:?}");
        }
    }
}

#[test]
fn blob_redirects_to_host_only_services_are_not_followed() {
    let service = host_only_service();
    for target in [
        format!("http://{}/blob", service.host()),
        format!("http://localhost:{}/blob", service.addr().port()),
        format!("http://[::1]:{}/blob", service.addr().port()),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
    ] {
        let image = tiny_image();
        let location = target.clone();
        let registry = HostileServer::start(move |request| {
            if request.path().contains("/blobs/") {
                return Reply::new(307, "").header("Location", &location);
            }
            serve_image(&image, request)
        });
        let e = pull(
            &format!("{}/x/y:1", registry.host()),
            credentials(&registry.host()),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("redirect"), "{target}: {text}");
        assert!(text.contains("refused"), "{target}: {text}");
    }
    assert_eq!(service.connections(), 0);
}

#[test]
fn a_redirect_within_the_registry_is_followed() {
    let image = tiny_image();
    let server = HostileServer::start(move |request| {
        let path = request.path();
        if let Some(digest) = path.strip_prefix("/moved/") {
            return serve_image(
                &image,
                &Recorded {
                    target: format!("/v2/x/y/blobs/{digest}"),
                    ..request.clone()
                },
            );
        }
        if let Some((_, digest)) = path.split_once("/blobs/") {
            return Reply::new(307, "").header("Location", &format!("/moved/{digest}"));
        }
        serve_image(&image, request)
    });
    let pulled = pull(
        &format!("{}/x/y:1", server.host()),
        RegistryConfig::default(),
    )
    .unwrap();
    assert_eq!(pulled.digest, tiny_image().digest);
    assert!(
        server
            .requests()
            .iter()
            .any(|r| r.path().starts_with("/moved/"))
    );
}

#[test]
fn a_huge_manifest_is_refused_while_it_streams() {
    for announced in [true, false] {
        let server = HostileServer::start(move |request| {
            if request.path() == "/v2/" {
                return Reply::ok("application/json", "{}");
            }
            let reply =
                Reply::ok("application/vnd.oci.image.manifest.v1+json", "").body(Body::Repeat {
                    byte: b' ',
                    len: 192 << 20,
                });
            if announced {
                reply
            } else {
                reply.without_length()
            }
        });
        let e = pull(
            &format!("{}/x/y:1", server.host()),
            RegistryConfig::default(),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("larger than"), "{text}");
        // What the client took before it stopped reading: the cap plus socket buffers,
        // never the whole 192 MiB.
        let sent = server.body_bytes_sent();
        assert!(
            sent < 48 << 20,
            "the client read {sent} bytes of the manifest"
        );
    }
}

#[test]
fn a_registry_error_text_reaches_the_error_escaped_truncated_and_scrubbed() {
    let hostile = format!(
        "\u{1b}]52;c;ZXZpbA==\u{7}\u{1b}[2J\u{1b}[6n gone \u{202e}txt.exe {PASSWORD} {}",
        "A".repeat(100_000)
    );
    let json =
        serde_json::json!({"errors":[{"code":"MANIFEST_UNKNOWN","message": hostile}]}).to_string();
    for body in [json.into_bytes(), hostile.clone().into_bytes()] {
        let server = HostileServer::start(move |request| {
            if request.path() == "/v2/" {
                return Reply::ok("application/json", "{}");
            }
            Reply::new(404, body.clone()).header("Content-Type", "application/json")
        });
        let e = pull(
            &format!("{}/x/y:1", server.host()),
            credentials(&server.host()),
        )
        .unwrap_err();
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(
                !text.chars().any(|c| c.is_control() || c == '\u{202e}'),
                "{text:?}"
            );
            assert!(!text.contains(PASSWORD), "{text}");
            assert!(text.len() < 4096, "{} bytes", text.len());
        }
        assert!(e.to_string().contains("404"), "{e}");
    }
}

#[test]
fn a_registry_that_trickles_fails_at_the_stall_timeout() {
    let server = HostileServer::start(|request| {
        if request.path() == "/v2/" {
            return Reply::ok("application/json", "{}");
        }
        Reply::ok("application/vnd.oci.image.manifest.v1+json", "").body(Body::Trickle {
            bytes: Vec::new(),
            every: Duration::from_millis(200),
            forever: true,
        })
    });
    let e = pull(
        &format!("{}/x/y:1", server.host()),
        from_env(&[("OMABOX_PULL_STALL_TIMEOUT", "1")]),
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("OMABOX_PULL_STALL_TIMEOUT"), "{text}");
}

#[test]
fn a_download_that_never_ends_fails_at_the_overall_deadline() {
    let layer_digest = format!("sha256:{}", "ab".repeat(32));
    let config = br#"{"architecture":"amd64","os":"linux"}"#.to_vec();
    let config_digest = omabox_test_support::hostile_http::digest(&config);
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config_digest}","size":{}}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_digest}","size":1099511627776}}]}}"#,
        config.len()
    );
    let server = HostileServer::start(move |request| {
        let path = request.path();
        if path == "/v2/" {
            Reply::ok("application/json", "{}")
        } else if path.contains("/manifests/") {
            Reply::ok(
                "application/vnd.oci.image.manifest.v1+json",
                manifest.clone(),
            )
        } else if path.ends_with(&config_digest) {
            Reply::ok("application/octet-stream", config.clone())
        } else {
            // Steady progress, far above any stall threshold, never the end.
            Reply::ok("application/octet-stream", "")
                .body(Body::Drip {
                    chunk: 16 << 10,
                    every: Duration::from_millis(50),
                })
                .content_length(1 << 40)
        }
    });
    let e = pull(
        &format!("{}/x/y:1", server.host()),
        from_env(&[
            ("OMABOX_PULL_TIMEOUT", "3"),
            ("OMABOX_PULL_STALL_TIMEOUT", "1"),
        ]),
    )
    .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("OMABOX_PULL_TIMEOUT"), "{text}");
    assert!(server.body_bytes_sent() > 16 << 10, "it never streamed");
}

#[test]
fn pull_errors_name_their_cause() {
    // Nothing listens: connection refused, naming the address.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let e = pull(&format!("{closed}/x/y:1"), RegistryConfig::default()).unwrap_err();
    let text = e.to_string();
    assert!(text.contains(&closed.to_string()), "{text}");
    assert!(text.to_lowercase().contains("connection refused"), "{text}");

    // 401 with and without credentials.
    let server = HostileServer::start(|_| {
        Reply::new(
            401,
            r#"{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}"#,
        )
        .header("WWW-Authenticate", r#"Basic realm="hostile""#)
    });
    let name = format!("{}/x/y:1", server.host());
    let text = pull(&name, RegistryConfig::default())
        .unwrap_err()
        .to_string();
    assert!(text.contains("401"), "{text}");
    assert!(text.contains("no credentials"), "{text}");
    let text = pull(&name, credentials(&server.host()))
        .unwrap_err()
        .to_string();
    assert!(text.contains("401"), "{text}");
    assert!(text.contains("refused the credentials"), "{text}");
    assert!(!text.contains(PASSWORD), "{text}");

    // The registry's own error code and message.
    let server = HostileServer::start(|request| {
        if request.path() == "/v2/" {
            return Reply::ok("application/json", "{}");
        }
        Reply::new(
            404,
            r#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"manifest unknown","detail":{"Tag":"1"}}]}"#,
        )
        .header("Content-Type", "application/json")
    });
    let text = pull(
        &format!("{}/x/y:1", server.host()),
        RegistryConfig::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(text.contains("404"), "{text}");
    assert!(text.contains("manifest unknown"), "{text}");
    assert!(text.contains("MANIFEST_UNKNOWN"), "{text}");
}

#[test]
fn an_allowed_blob_host_gets_the_download_but_never_the_credentials() {
    let image = tiny_image();
    let served = image.clone();
    let cdn = HostileServer::start(move |request| {
        let digest = request.path().trim_start_matches("/cdn/");
        match served.blob(digest) {
            Some(blob) => Reply::ok("application/octet-stream", blob.to_vec()),
            None => Reply::new(404, ""),
        }
    });
    let cdn_host = cdn.host();
    let registry = HostileServer::start(move |request| {
        if request.header("authorization").is_none() {
            return Reply::new(401, "").header("WWW-Authenticate", r#"Basic realm="r""#);
        }
        if let Some((_, digest)) = request.path().split_once("/blobs/") {
            return Reply::new(307, "")
                .header("Location", &format!("http://{cdn_host}/cdn/{digest}"));
        }
        serve_image(&image, request)
    });
    let mut config = credentials(&registry.host());
    config.allowed_hosts =
        omabox_image::AllowedHost::parse_list(&format!("{}={}", registry.host(), cdn.host()))
            .unwrap();
    let pulled = pull(&format!("{}/x/y:1", registry.host()), config).unwrap();
    assert_eq!(pulled.digest, tiny_image().digest);
    let fetched = cdn.requests();
    assert_eq!(fetched.len(), 2, "config and layer: {fetched:?}");
    assert!(fetched.iter().all(|r| r.header("authorization").is_none()));
    assert_password_not_sent(&[&cdn]);
}

#[test]
fn a_tls_failure_names_the_certificate_as_the_cause() {
    let dir = tempfile::tempdir().unwrap();
    let (key, cert) = (dir.path().join("key.pem"), dir.path().join("cert.pem"));
    let made = std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=registry.test", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output();
    let missing = match &made {
        Ok(out) if out.status.success() => None,
        _ => Some("openssl is missing (apt-get install openssl)".to_owned()),
    };
    if !omabox_test_support::require_capability(missing) {
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("-cert")
        .arg(&cert)
        .arg("-key")
        .arg(&key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it listens.
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let config = RegistryConfig {
        fixed_names: vec![("registry.test".into(), "127.0.0.1".parse().unwrap())],
        ..RegistryConfig::default()
    };
    let result = pull(&format!("registry.test:{port}/x/y:1"), config);
    let _ = server.kill();
    let _ = server.wait();
    let text = result.unwrap_err().to_string();
    assert!(text.contains(&format!("registry.test:{port}")), "{text}");
    assert!(text.contains("certificate"), "{text}");
}

/// A registry whose tag names `manifest` (any JSON) and serves `blobs`; every request
/// recorded.
fn registry_of(manifest: String, blobs: Vec<(String, Vec<u8>)>) -> HostileServer {
    HostileServer::start(move |request| {
        let path = request.path();
        if path == "/v2/" {
            return Reply::ok("application/json", "{}");
        }
        if let Some((_, reference)) = path.split_once("/manifests/") {
            let by_digest = blobs.iter().find(|(d, _)| d == reference);
            return match by_digest {
                Some((_, bytes)) => Reply::ok("application/json", bytes.clone()),
                None => Reply::ok("application/json", manifest.clone()),
            };
        }
        if let Some((_, digest)) = path.split_once("/blobs/")
            && let Some((_, bytes)) = blobs.iter().find(|(d, _)| d == digest)
        {
            return Reply::ok("application/octet-stream", bytes.clone());
        }
        Reply::new(404, "")
    })
}

fn manifest_of(config: &str, layers: &[String]) -> String {
    format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{config},"layers":[{}]}}"#,
        layers.join(",")
    )
}

fn blob_requests(server: &HostileServer) -> usize {
    server
        .requests()
        .iter()
        .filter(|r| r.path().contains("/blobs/"))
        .count()
}

#[test]
fn manifests_with_too_many_layers_or_foreign_digests_are_refused_before_any_blob() {
    let image = tiny_image();
    let config = format!(
        r#"{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}}"#,
        image.blobs[0].0,
        image.blobs[0].1.len()
    );
    let layer = format!(
        r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{}","size":{}}}"#,
        image.blobs[1].0,
        image.blobs[1].1.len()
    );
    let sha512 = format!(
        r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"sha512:{}","size":10}}"#,
        "ab".repeat(64)
    );
    let huge_config = format!(
        r#"{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":1073741824}}"#,
        image.blobs[0].0
    );
    for (manifest, expected) in [
        (
            manifest_of(&config, &vec![layer.clone(); 513]),
            "513 layers",
        ),
        (
            manifest_of(&config, &[layer.clone(), sha512]),
            "not a sha256 digest",
        ),
        (
            manifest_of(&huge_config, std::slice::from_ref(&layer)),
            "image config is 1073741824 bytes",
        ),
    ] {
        let server = registry_of(manifest, image.blobs.clone());
        let e = pull(
            &format!("{}/x/y:1", server.host()),
            RegistryConfig::default(),
        )
        .unwrap_err();
        assert!(e.to_string().contains(expected), "{e}");
        assert_eq!(blob_requests(&server), 0, "{expected}");
    }
}

#[test]
fn a_blob_longer_than_its_descriptor_is_cut_off() {
    let image = tiny_image();
    let config = format!(
        r#"{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{}","size":{}}}"#,
        image.blobs[0].0,
        image.blobs[0].1.len()
    );
    let layer_digest = image.blobs[1].0.clone();
    let manifest = manifest_of(
        &config,
        &[format!(
            r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{layer_digest}","size":100}}"#
        )],
    );
    for announced in [true, false] {
        let (manifest, config_blob, layer_digest) = (
            manifest.clone(),
            image.blobs[0].clone(),
            layer_digest.clone(),
        );
        let server = HostileServer::start(move |request| {
            let path = request.path();
            if path.contains("/manifests/") {
                Reply::ok("application/json", manifest.clone())
            } else if path.ends_with(&config_blob.0) {
                Reply::ok("application/octet-stream", config_blob.1.clone())
            } else if path.ends_with(&layer_digest) {
                let reply = Reply::ok("application/octet-stream", "").body(Body::Repeat {
                    byte: 0,
                    len: 192 << 20,
                });
                if announced {
                    reply
                } else {
                    reply.without_length()
                }
            } else {
                Reply::ok("application/json", "{}")
            }
        });
        let e = pull(
            &format!("{}/x/y:1", server.host()),
            RegistryConfig::default(),
        )
        .unwrap_err();
        assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
        assert!(e.to_string().contains("100 bytes"), "{e}");
        assert!(server.body_bytes_sent() < 48 << 20);
    }
}

#[test]
fn an_index_naming_an_index_as_its_manifest_and_endless_redirects_end_clearly() {
    // Index A lists index B under a manifest media type; B (fetched by its digest, and
    // matching it) is not an image manifest.
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let inner = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#.to_vec();
    let inner_digest = omabox_test_support::hostile_http::digest(&inner);
    let outer = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{inner_digest}","size":{},"platform":{{"os":"linux","architecture":"{arch}"}}}}]}}"#,
        inner.len()
    );
    let server = registry_of(outer, vec![(inner_digest, inner)]);
    let e = pull(
        &format!("{}/x/y:1", server.host()),
        RegistryConfig::default(),
    )
    .unwrap_err();
    assert!(e.to_string().contains("invalid image manifest"), "{e}");
    assert_eq!(server.requests().len(), 2, "{:?}", server.requests());

    // A blob that redirects to itself for ever.
    let image = tiny_image();
    let server = HostileServer::start(move |request| {
        if request.path().contains("/blobs/") {
            return Reply::new(302, "").header("Location", request.path());
        }
        serve_image(&image, request)
    });
    let e = pull(
        &format!("{}/x/y:1", server.host()),
        RegistryConfig::default(),
    )
    .unwrap_err();
    assert!(
        e.to_string().contains("redirected more than 5 times"),
        "{e}"
    );
    assert!(blob_requests(&server) <= 6);
}
