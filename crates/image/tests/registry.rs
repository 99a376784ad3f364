//! Registry pulls against a real `docker-registry` on loopback: by tag, by digest, a
//! moved tag, a tampered blob, basic auth from a docker `config.json`, and the
//! reference index's remove and prune, an image index, concurrent pulls.

use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use omabox_image::{
    AllowedHost, DockerConfig, ImageCache, ImageError, ImageSource, NoProgress, RegistryConfig,
    RegistryReference,
};
use omabox_test_support::registry::{TestRegistry, tar_layer};
use omabox_test_support::require_capability;

fn registry_or_skip() -> Option<TestRegistry> {
    require_capability(TestRegistry::missing()).then(TestRegistry::start)
}

fn cache(dir: &Path) -> ImageCache {
    ImageCache::new(dir.join("cache"))
}

fn reference(text: &str) -> RegistryReference {
    match ImageSource::parse(text).unwrap() {
        ImageSource::Registry(r) => r,
        other => panic!("{text} is {other:?}"),
    }
}

fn marker_layer(text: &str) -> Vec<u8> {
    tar_layer(&[
        ("marker", 0o644, text.as_bytes()),
        ("etc/os-release", 0o644, b"ID=test\n"),
    ])
}

/// Every non-directory below `dir`, recursively.
fn files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let meta = entry.path().symlink_metadata().unwrap();
            if meta.is_dir() {
                todo.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out
}

/// Writes docker's `config.json` at `path` with `user:password` for `host`.
fn docker_login(path: &Path, host: &str, user: &str, password: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    std::fs::write(
        path,
        format!(r#"{{"auths":{{"{host}":{{"auth":"{auth}"}}}}}}"#),
    )
    .unwrap();
}

fn open() -> RegistryConfig {
    RegistryConfig::default()
}

#[test]
fn a_tag_is_pulled_verified_unpacked_once_and_recorded() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let pushed = registry.push_image("test/app", "1", &[marker_layer("one\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/app:1", registry.host()));

    let pulled = cache.resolve_registry(&r, &open(), &NoProgress).unwrap();
    assert_eq!(pulled.digest, pushed.digest);
    assert!(pulled.contacted_registry && pulled.image.unpacked);
    assert!(pulled.downloaded_bytes > 0);
    let rootfs = &pulled.image.rootfs_dir;
    assert_eq!(
        std::fs::read_to_string(rootfs.join("marker")).unwrap(),
        "one\n"
    );

    let refs = cache.refs().unwrap();
    assert_eq!(refs.len(), 1);
    assert_eq!(refs[0].name, format!("{}/test/app:1", registry.host()));
    assert_eq!(refs[0].digest, pushed.digest);
    let listed = cache.list().unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].source, r.canonical());
    assert!(listed[0].size_bytes >= 4);

    // The tag is resolved again (the registry is asked), nothing is downloaded again.
    let again = cache.resolve_registry(&r, &open(), &NoProgress).unwrap();
    assert!(again.contacted_registry);
    assert!(!again.image.unpacked);
    assert_eq!(again.downloaded_bytes, 0);
    assert_eq!(again.image.rootfs_dir, pulled.image.rootfs_dir);
    // No temporary layout is left.
    assert_eq!(
        std::fs::read_dir(dir.path().join("cache/tmp"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_pinned_digest_pulls_once_then_needs_no_registry() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let pushed = registry.push_image("test/pinned", "1", &[marker_layer("pinned\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let pinned = reference(&format!(
        "{}/test/pinned@{}",
        registry.host(),
        pushed.digest
    ));
    let first = cache
        .resolve_registry(&pinned, &open(), &NoProgress)
        .unwrap();
    assert!(first.contacted_registry);
    assert_eq!(first.digest, pushed.digest);
    drop(registry); // the registry is gone: a cached pin must not need it
    let second = cache
        .resolve_registry(&pinned, &open(), &NoProgress)
        .unwrap();
    assert!(!second.contacted_registry);
    assert_eq!(second.image.rootfs_dir, first.image.rootfs_dir);
}

#[test]
fn an_image_index_resolves_to_this_hosts_linux_manifest() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let ours = registry.push_image("test/multi", "amd", &[marker_layer("ours\n")]);
    let other = registry.push_image("test/multi", "other", &[marker_layer("other\n")]);
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    };
    let foreign = if arch == "s390x" { "ppc64le" } else { "s390x" };
    let index = registry.push_index(
        "test/multi",
        "1",
        &[(&other, "linux", foreign), (&ours, "linux", arch)],
    );
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/multi:1", registry.host()));
    let pulled = cache.resolve_registry(&r, &open(), &NoProgress).unwrap();
    assert_eq!(pulled.digest, ours.digest);
    assert_eq!(pulled.index_digest.as_deref(), Some(index.as_str()));
    assert_eq!(
        std::fs::read_to_string(pulled.image.rootfs_dir.join("marker")).unwrap(),
        "ours\n"
    );
    // Pinned by the index's digest: found in the cache without the registry.
    drop(registry);
    let host = r.registry().to_owned();
    let pinned = reference(&format!("{host}/test/multi@{index}"));
    let again = cache
        .resolve_registry(&pinned, &open(), &NoProgress)
        .unwrap();
    assert!(!again.contacted_registry);
    assert_eq!(again.digest, ours.digest);
}

#[test]
fn an_index_without_this_platform_is_refused_naming_what_it_has() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let other = registry.push_image("test/foreign", "x", &[marker_layer("x\n")]);
    registry.push_index("test/foreign", "1", &[(&other, "windows", "amd64")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/foreign:1", registry.host()));
    let e = cache
        .resolve_registry(&r, &open(), &NoProgress)
        .unwrap_err();
    assert!(e.to_string().contains("windows/amd64"), "{e}");
    assert!(e.to_string().contains("test/foreign"), "{e}");
    assert!(cache.list().unwrap().is_empty());
}

#[test]
fn a_wrong_pinned_digest_is_refused() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    registry.push_image("test/pin", "1", &[marker_layer("x\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let other = format!("sha256:{}", "0".repeat(64));
    let pinned = reference(&format!("{}/test/pin@{other}", registry.host()));
    let e = cache
        .resolve_registry(&pinned, &open(), &NoProgress)
        .unwrap_err();
    assert!(e.to_string().contains("test/pin"), "{e}");
    assert!(cache.list().unwrap().is_empty());
}

#[test]
fn a_moved_tag_resolves_to_its_new_digest() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let first = registry.push_image("test/moving", "stable", &[marker_layer("v1\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/moving:stable", registry.host()));
    let a = cache.resolve_registry(&r, &open(), &NoProgress).unwrap();
    assert_eq!(a.digest, first.digest);
    let second = registry.push_image("test/moving", "stable", &[marker_layer("v2\n")]);
    assert_ne!(first.digest, second.digest);
    let b = cache.resolve_registry(&r, &open(), &NoProgress).unwrap();
    assert_eq!(b.digest, second.digest);
    assert_eq!(
        std::fs::read_to_string(b.image.rootfs_dir.join("marker")).unwrap(),
        "v2\n"
    );
    assert_eq!(cache.refs().unwrap()[0].digest, second.digest);
}

#[test]
fn a_tampered_blob_is_refused_and_nothing_is_cached() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let pushed = registry.push_image("test/tampered", "1", &[marker_layer("honest\n")]);
    let data = registry.blob_data_path(&pushed.layers[0]);
    let mut bytes = std::fs::read(&data).unwrap();
    let at = bytes.windows(6).position(|w| w == b"honest").unwrap();
    bytes[at..at + 6].copy_from_slice(b"evil!!");
    std::fs::write(&data, &bytes).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/tampered:1", registry.host()));
    let e = cache
        .resolve_registry(&r, &open(), &NoProgress)
        .unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
    assert!(e.to_string().contains(&pushed.layers[0]), "{e}");
    assert!(e.is_bad_image());
    let cached = files(&dir.path().join("cache"));
    assert!(
        cached
            .iter()
            .all(|p| p.parent().unwrap().ends_with("locks")),
        "only lock files may remain: {cached:?}"
    );
    assert!(cache.list().unwrap().is_empty());
    assert!(cache.refs().unwrap().is_empty());
}

#[test]
fn bearer_token_auth_gets_a_token_with_docker_config_credentials() {
    if !require_capability(TestRegistry::missing()) {
        return;
    }
    let password = "T0ken-pw-never-shown";
    let registry = TestRegistry::start_with_token_auth("dave", password);
    let pushed = registry.push_image("tokened/app", "1", &[marker_layer("tokened\n")]);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("docker/config.json");
    let write_config = |pw: &str| docker_login(&config_path, &registry.host(), "dave", pw);
    // The issuer is another loopback port: allowed as the registry's token realm.
    let config = RegistryConfig {
        credentials: Some(Arc::new(DockerConfig::at(&config_path))),
        allowed_hosts: AllowedHost::parse_list(&format!("{}=127.0.0.1", registry.host())).unwrap(),
        ..RegistryConfig::default()
    };
    let cache = cache(dir.path());
    let r = reference(&format!("{}/tokened/app:1", registry.host()));

    // Anonymous: the issuer gives no token, the registry refuses.
    let e = cache
        .resolve_registry(&r, &open(), &NoProgress)
        .unwrap_err();
    assert!(matches!(e, ImageError::Registry { .. }), "{e}");

    // A wrong password: refused by the issuer, and not in the error.
    write_config("Wr0ng-token-pw");
    let e = cache
        .resolve_registry(&r, &config, &NoProgress)
        .unwrap_err();
    assert!(!format!("{e} {e:?}").contains("Wr0ng-token-pw"), "{e}");

    // The right one: token from the issuer, then the pull, verified.
    write_config(password);
    let pulled = cache.resolve_registry(&r, &config, &NoProgress).unwrap();
    assert_eq!(pulled.digest, pushed.digest);
    assert_eq!(
        std::fs::read_to_string(pulled.image.rootfs_dir.join("marker")).unwrap(),
        "tokened\n"
    );
}

#[test]
fn basic_auth_uses_docker_config_credentials_and_never_shows_the_password() {
    if !require_capability(TestRegistry::missing()) {
        return;
    }
    let password = "Pa55-w0rd-never-shown";
    let registry = TestRegistry::start_with_auth("alice", password);
    let pushed = registry.push_image("private/app", "1", &[marker_layer("private\n")]);
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("docker/config.json");
    let write_config = |pw: &str| docker_login(&config_path, &registry.host(), "alice", pw);
    let config = RegistryConfig {
        credentials: Some(Arc::new(DockerConfig::at(&config_path))),
        ..RegistryConfig::default()
    };
    let cache = cache(dir.path());
    let r = reference(&format!("{}/private/app:1", registry.host()));

    // Anonymous: refused.
    let e = cache
        .resolve_registry(&r, &open(), &NoProgress)
        .unwrap_err();
    assert!(matches!(e, ImageError::Registry { .. }), "{e}");

    // A wrong password: a clear error that does not carry it.
    let wrong = "Wr0ng-pw-also-secret";
    write_config(wrong);
    let e = cache
        .resolve_registry(&r, &config, &NoProgress)
        .unwrap_err();
    let text = format!("{e} {e:?}");
    assert!(matches!(e, ImageError::Registry { .. }), "{text}");
    assert!(!text.contains(wrong) && !text.contains(password), "{text}");
    assert!(cache.list().unwrap().is_empty());

    write_config(password);
    let pulled = cache.resolve_registry(&r, &config, &NoProgress).unwrap();
    assert_eq!(pulled.digest, pushed.digest);
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("alice:{password}"));
    for file in files(&dir.path().join("cache")) {
        if file.symlink_metadata().unwrap().is_file() {
            let content = std::fs::read(&file).unwrap();
            for needle in [password.as_bytes(), basic.as_bytes()] {
                assert!(
                    !content.windows(needle.len()).any(|w| w == needle),
                    "{} holds the credential",
                    file.display()
                );
            }
        }
    }
}

#[test]
fn remove_by_name_or_digest_and_prune() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let a = registry.push_image("test/a", "1", &[marker_layer("a\n")]);
    registry.push_image("test/a", "2", &[marker_layer("a\n")]);
    let b = registry.push_image("test/b", "1", &[marker_layer("b\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let host = registry.host();
    let resolve = |name: &str| {
        cache
            .resolve_registry(&reference(&format!("{host}/{name}")), &open(), &NoProgress)
            .unwrap()
    };
    for name in ["test/a:1", "test/a:2", "test/b:1"] {
        resolve(name);
    }
    assert_eq!(cache.list().unwrap().len(), 2);
    assert_eq!(cache.refs().unwrap().len(), 3);

    // a:1 goes, its image stays (a:2 names it).
    let removal = cache.remove_named(&format!("{host}/test/a:1")).unwrap();
    assert_eq!(removal.refs.len(), 1);
    assert!(removal.images.is_empty());
    // a:2 goes, and its image with it.
    let removal = cache.remove_named(&format!("{host}/test/a:2")).unwrap();
    assert_eq!(removal.images, vec![a.digest.clone()]);
    assert!(matches!(
        cache.remove_named(&format!("{host}/test/a:2")),
        Err(ImageError::NotCached(_))
    ));
    // By digest: the image and every name pointing to it.
    let removal = cache.remove_named(&b.digest).unwrap();
    assert_eq!(removal.images, vec![b.digest.clone()]);
    assert_eq!(removal.refs, vec![format!("{host}/test/b:1")]);
    assert!(cache.list().unwrap().is_empty());

    // Prune: an image no name points to goes; a named one stays.
    resolve("test/b:1");
    let local = dir.path().join("rootfs.tar");
    std::fs::write(&local, tar_layer(&[("local", 0o644, b"l")])).unwrap();
    cache.resolve(&local).unwrap();
    assert_eq!(cache.list().unwrap().len(), 2);
    let pruned = cache.prune().unwrap();
    assert_eq!(pruned.len(), 1);
    assert_eq!(pruned[0].source, local.display().to_string());
    assert_eq!(cache.list().unwrap()[0].digest, b.digest);
}

#[test]
fn concurrent_pulls_of_one_image_unpack_it_once() {
    let Some(registry) = registry_or_skip() else {
        return;
    };
    let pushed = registry.push_image("test/race", "1", &[marker_layer("race\n")]);
    let dir = tempfile::tempdir().unwrap();
    let cache = cache(dir.path());
    let r = reference(&format!("{}/test/race:1", registry.host()));
    let results: Vec<_> = std::thread::scope(|scope| {
        let pulls: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| cache.resolve_registry(&r, &open(), &NoProgress)))
            .collect();
        pulls.into_iter().map(|p| p.join().unwrap()).collect()
    });
    let unpacked = results
        .iter()
        .map(|r| r.as_ref().unwrap())
        .filter(|p| p.image.unpacked)
        .count();
    assert_eq!(unpacked, 1, "{results:?}");
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().unwrap().digest == pushed.digest)
    );
    assert_eq!(cache.list().unwrap().len(), 1);
    assert_eq!(cache.refs().unwrap().len(), 1);
    assert_eq!(
        std::fs::read_dir(dir.path().join("cache/tmp"))
            .unwrap()
            .count(),
        0
    );
}
