//! Image artifacts: rootfs tarballs (plain and gzip) and OCI image layouts are unpacked
//! once into the content-addressed cache and boot a sandbox; tampered blobs and
//! malicious archives are refused without writing anything outside the cache.
//!
//! Unpacking tests run as any user; tests that start a sandbox need root and skip loudly
//! (fail under `CI=true`) without it.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{Isolated, Sandboxed, can_run, test_plan};
use omabox_backend_linux::factory::{
    CGROUP_PARENT_ENV, IMAGE_CACHE_ENV, IMAGE_ENV, INIT_ENV, LinuxSandboxFactory, RUNTIME_DIR_ENV,
};
use omabox_backend_linux::{ImageCache, ImageError, ImageKind, RootfsSource};
use omabox_sandbox::{SandboxFactoryContext, SandboxFactoryEnv, SandboxPort};
use sha2::{Digest, Sha256};

/// A tiny rootfs from the host: dash as /bin/sh, cat, the libraries they link, and a
/// marker file.
fn tiny_rootfs(dir: &Path) {
    let copy = |from: &Path, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    for (bin, at) in [("/bin/sh", "bin/sh"), ("/bin/cat", "bin/cat")] {
        let real = std::fs::canonicalize(bin).unwrap();
        copy(&real, dir.join(at));
        let ldd = std::process::Command::new("ldd")
            .arg(&real)
            .output()
            .unwrap();
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
                let p = PathBuf::from(p);
                copy(&p, dir.join(p.strip_prefix("/").unwrap()));
            }
        }
    }
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/image-marker"), "from-image\n").unwrap();
}

/// A tar of `dir` (symlinks stored as symlinks, numeric owners and modes kept).
fn tar_bytes(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.follow_symlinks(false);
    b.mode(tar::HeaderMode::Complete);
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A tar built entry by entry, with raw names the `tar` crate's builder would refuse.
struct RawTar(Vec<u8>);

impl RawTar {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn entry(&mut self, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> &mut Self {
        let mut h = tar::Header::new_ustar();
        let bytes = h.as_mut_bytes();
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        bytes[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(kind);
        h.set_mode(if kind.is_dir() { 0o755 } else { 0o644 });
        h.set_size(data.len() as u64);
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0, pad));
        self
    }

    fn file(&mut self, name: &str, data: &[u8]) -> &mut Self {
        self.entry(name, tar::EntryType::Regular, "", data)
    }

    fn dir(&mut self, name: &str) -> &mut Self {
        self.entry(name, tar::EntryType::Directory, "", b"")
    }

    fn finish(&mut self) -> Vec<u8> {
        let mut out = std::mem::take(&mut self.0);
        out.extend(std::iter::repeat_n(0, 1024));
        out
    }
}

/// An OCI image layout whose host-platform image has two layers: the tiny rootfs plus
/// `etc/deleted`, `opt/old/{a,b}`; then (gzip) a whiteout of `etc/deleted`, an opaque
/// `opt/old` holding only `new`, and `etc/layer2`. The index also lists a manifest for
/// another architecture whose blobs do not exist (it must not be chosen).
struct OciImage {
    dir: tempfile::TempDir,
    manifest_hex: String,
    layer_hexes: Vec<String>,
}

fn blob(dir: &Path, bytes: &[u8]) -> (String, u64) {
    let hex = sha256_hex(bytes);
    std::fs::write(dir.join("blobs/sha256").join(&hex), bytes).unwrap();
    (hex, bytes.len() as u64)
}

fn oci_image() -> OciImage {
    let rootfs = tempfile::tempdir().unwrap();
    tiny_rootfs(rootfs.path());
    std::fs::write(rootfs.path().join("etc/deleted"), "old\n").unwrap();
    std::fs::create_dir_all(rootfs.path().join("opt/old")).unwrap();
    std::fs::write(rootfs.path().join("opt/old/a"), "a\n").unwrap();
    std::fs::write(rootfs.path().join("opt/old/b"), "b\n").unwrap();
    let layer1 = tar_bytes(rootfs.path());
    let layer2 = gzip(
        &RawTar::new()
            .file("etc/.wh.deleted", b"")
            .dir("opt/old/")
            .file("opt/old/.wh..wh..opq", b"")
            .file("opt/old/new", b"new\n")
            .file("etc/layer2", b"second\n")
            .finish(),
    );

    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("blobs/sha256")).unwrap();
    std::fs::write(
        dir.path().join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
    let (l1, l1_size) = blob(dir.path(), &layer1);
    let (l2, l2_size) = blob(dir.path(), &layer2);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{l1}"), format!("sha256:{}", sha256_hex(&layer2))]},
        "config": {}
    });
    let (cfg, cfg_size) = blob(dir.path(), config.to_string().as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": format!("sha256:{cfg}"), "size": cfg_size},
        "layers": [
            {"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": format!("sha256:{l1}"), "size": l1_size},
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": format!("sha256:{l2}"), "size": l2_size},
        ]
    });
    let (m, m_size) = blob(dir.path(), manifest.to_string().as_bytes());
    let host_arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let other_arch = if host_arch == "s390x" {
        "amd64"
    } else {
        "s390x"
    };
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{}", "0".repeat(64)), "size": 10,
             "platform": {"os": "linux", "architecture": other_arch}},
            {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": format!("sha256:{m}"), "size": m_size,
             "platform": {"os": "linux", "architecture": host_arch}},
        ]
    });
    std::fs::write(dir.path().join("index.json"), index.to_string()).unwrap();
    OciImage {
        dir,
        manifest_hex: m,
        layer_hexes: vec![l1, l2],
    }
}

/// A cache in a fresh directory (its parent is where "outside the cache" is checked).
struct Cache {
    parent: tempfile::TempDir,
    cache: ImageCache,
}

impl Cache {
    fn new() -> Self {
        let parent = tempfile::tempdir().unwrap();
        let cache = ImageCache::new(parent.path().join("images"));
        Self { parent, cache }
    }

    /// No published entry and no leftover temporary unpack; nothing but the cache in
    /// its parent directory.
    fn assert_empty(&self) {
        for sub in ["sha256", "tmp"] {
            let left: Vec<_> = std::fs::read_dir(self.cache.dir().join(sub))
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "left in the cache's {sub}: {left:?}");
        }
        let outside: Vec<_> = std::fs::read_dir(self.parent.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "images")
            .collect();
        assert!(outside.is_empty(), "written outside the cache: {outside:?}");
    }
}

fn write_temp(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

async fn sandbox_on(rootfs: &Path) -> Sandboxed {
    let mut plan = test_plan();
    plan.rootfs = RootfsSource::Directory {
        path: rootfs.to_path_buf(),
    };
    Sandboxed::start(plan).await
}

#[test]
fn tarballs_are_unpacked_once_per_content_with_modes_and_links() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    tiny_rootfs(root.path());
    std::fs::write(root.path().join("bin/suid"), "x").unwrap();
    std::fs::set_permissions(
        root.path().join("bin/suid"),
        std::os::unix::fs::PermissionsExt::from_mode(0o4755),
    )
    .unwrap();
    std::os::unix::fs::symlink("/etc/image-marker", root.path().join("marker-link")).unwrap();
    let plain = tar_bytes(root.path());
    let c = Cache::new();
    for (name, bytes) in [
        ("plain-no-extension", plain.clone()),
        ("r.tgz", gzip(&plain)),
    ] {
        let path = write_temp(src.path(), name, &bytes);
        let first = c.cache.resolve(&path).expect("resolve");
        assert_eq!(first.kind, ImageKind::Tarball);
        assert!(first.unpacked);
        assert_eq!(
            first.digest.as_deref(),
            Some(format!("sha256:{}", sha256_hex(&bytes)).as_str())
        );
        assert_eq!(
            first.rootfs_dir,
            c.cache
                .dir()
                .join("sha256")
                .join(sha256_hex(&bytes))
                .join("rootfs")
        );
        let r = &first.rootfs_dir;
        assert_eq!(
            std::fs::read_to_string(r.join("etc/image-marker")).unwrap(),
            "from-image\n"
        );
        let mode = std::fs::metadata(r.join("bin/suid")).unwrap();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o7777,
            0o4755,
            "setuid is kept"
        );
        assert_eq!(
            std::fs::read_link(r.join("marker-link")).unwrap(),
            Path::new("/etc/image-marker")
        );
        let again = c.cache.resolve(&path).expect("resolve again");
        assert!(!again.unpacked, "the second resolve unpacked again");
        assert_eq!(again.rootfs_dir, first.rootfs_dir);
    }
    let listed = c.cache.list().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.iter().all(|i| i.kind == ImageKind::Tarball));
    assert!(c.cache.remove(&listed[0].digest).unwrap());
    assert_eq!(c.cache.list().unwrap().len(), 1);
}

#[test]
fn concurrent_resolvers_of_one_image_unpack_it_once() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    tiny_rootfs(root.path());
    let path = write_temp(src.path(), "r.tar", &tar_bytes(root.path()));
    let c = Arc::new(Cache::new());
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (c, path) = (c.clone(), path.clone());
            std::thread::spawn(move || c.cache.resolve(&path).expect("resolve"))
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(results.iter().filter(|r| r.unpacked).count(), 1);
    assert!(
        results
            .iter()
            .all(|r| r.rootfs_dir == results[0].rootfs_dir)
    );
    let tmp: Vec<_> = std::fs::read_dir(c.cache.dir().join("tmp"))
        .unwrap()
        .flatten()
        .collect();
    assert!(tmp.is_empty(), "{tmp:?}");
}

#[test]
fn oci_layers_apply_in_order_with_whiteouts_and_opaque_dirs() {
    let image = oci_image();
    let c = Cache::new();
    let resolved = c.cache.resolve(image.dir.path()).expect("resolve");
    assert_eq!(resolved.kind, ImageKind::OciLayout);
    assert_eq!(
        resolved.digest.as_deref(),
        Some(format!("sha256:{}", image.manifest_hex).as_str())
    );
    let r = &resolved.rootfs_dir;
    assert!(r.join("etc/image-marker").is_file());
    assert!(!r.join("etc/deleted").exists(), "whiteout not applied");
    assert!(
        !r.join("etc/.wh.deleted").exists(),
        "whiteout left as a file"
    );
    assert!(
        !r.join("opt/old/a").exists(),
        "opaque dir kept a lower entry"
    );
    assert!(!r.join("opt/old/.wh..wh..opq").exists());
    assert_eq!(
        std::fs::read_to_string(r.join("opt/old/new")).unwrap(),
        "new\n"
    );
    assert_eq!(
        std::fs::read_to_string(r.join("etc/layer2")).unwrap(),
        "second\n"
    );
    assert!(!c.cache.resolve(image.dir.path()).unwrap().unpacked);
}

#[test]
fn a_tampered_oci_blob_is_rejected_and_nothing_is_cached() {
    // A layer replaced by another valid layer, and one with a flipped byte.
    for flip in [false, true] {
        let image = oci_image();
        let blob = image
            .dir
            .path()
            .join("blobs/sha256")
            .join(&image.layer_hexes[1]);
        let mut bytes = std::fs::read(&blob).unwrap();
        if flip {
            let mid = bytes.len() / 2;
            bytes[mid] ^= 0xff;
        } else {
            bytes = gzip(&RawTar::new().file("etc/evil", b"evil\n").finish());
        }
        std::fs::write(&blob, bytes).unwrap();
        let c = Cache::new();
        let e = c.cache.resolve(image.dir.path()).unwrap_err();
        assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
        assert!(e.to_string().contains("tampered"), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("sha256:{}", image.layer_hexes[1])),
            "{e}"
        );
        assert!(e.is_bad_image());
        c.assert_empty();
    }
    // A tampered manifest is refused before it is parsed.
    let image = oci_image();
    let manifest = image
        .dir
        .path()
        .join("blobs/sha256")
        .join(&image.manifest_hex);
    let text = std::fs::read_to_string(&manifest).unwrap();
    std::fs::write(&manifest, text.replace("\"layers\"", "\"layers\" ")).unwrap();
    let c = Cache::new();
    let e = c.cache.resolve(image.dir.path()).unwrap_err();
    assert!(matches!(e, ImageError::DigestMismatch { .. }), "{e}");
    c.assert_empty();
}

#[test]
fn malicious_tarballs_are_refused_and_write_nothing_outside_the_cache() {
    let src = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let out = outside.path().display().to_string();
    let abs_target = format!("{out}/absolute");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "dotdot",
            RawTar::new()
                .file("etc/ok", b"ok")
                .file("../escape", b"x")
                .finish(),
            "`..`",
        ),
        (
            "deep-dotdot",
            RawTar::new().file("a/../../../escape", b"x").finish(),
            "`..`",
        ),
        (
            "absolute",
            RawTar::new().file(&abs_target, b"x").finish(),
            "absolute path",
        ),
        (
            "through-symlink",
            RawTar::new()
                .entry("link", tar::EntryType::Symlink, &out, b"")
                .file("link/pwned", b"x")
                .finish(),
            "symlink",
        ),
        (
            "through-relative-symlink",
            RawTar::new()
                .dir("d/")
                .entry("d/up", tar::EntryType::Symlink, "../../../..", b"")
                .file("d/up/pwned", b"x")
                .finish(),
            "symlink",
        ),
        (
            "hardlink-out",
            RawTar::new()
                .entry("hl", tar::EntryType::Link, "../../../etc/passwd", b"")
                .finish(),
            "`..`",
        ),
        (
            "hardlink-absolute",
            RawTar::new()
                .entry("hl", tar::EntryType::Link, "/etc/passwd", b"")
                .finish(),
            "absolute path",
        ),
        (
            "hardlink-through-symlink",
            RawTar::new()
                .entry("link", tar::EntryType::Symlink, "/etc", b"")
                .entry("hl", tar::EntryType::Link, "link/passwd", b"")
                .finish(),
            "symlink",
        ),
    ];
    for (name, bytes, reason) in cases {
        let path = write_temp(src.path(), name, &bytes);
        let c = Cache::new();
        let e = c.cache.resolve(&path).unwrap_err();
        assert!(
            matches!(e, ImageError::UnsafeEntry { .. }) && e.to_string().contains(reason),
            "{name}: {e}: {:?}",
            std::error::Error::source(&e)
        );
        assert!(e.is_bad_image());
        c.assert_empty();
        let leaked: Vec<_> = std::fs::read_dir(outside.path())
            .unwrap()
            .flatten()
            .collect();
        assert!(leaked.is_empty(), "{name}: wrote outside: {leaked:?}");
    }
    assert!(!Path::new(&abs_target).exists());

    // A symlink replaced by a later file entry of the same name is replaced, not
    // written through.
    let victim = outside.path().join("victim");
    std::fs::write(&victim, "host").unwrap();
    let bytes = RawTar::new()
        .entry("x", tar::EntryType::Symlink, victim.to_str().unwrap(), b"")
        .file("x", b"image")
        .finish();
    let c = Cache::new();
    let r = c
        .cache
        .resolve(&write_temp(src.path(), "replace", &bytes))
        .unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "host");
    assert_eq!(
        std::fs::read_to_string(r.rootfs_dir.join("x")).unwrap(),
        "image"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_boot_from_a_tarball_a_gzip_tarball_and_an_oci_layout() {
    if !can_run() {
        return;
    }
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    tiny_rootfs(root.path());
    let plain = tar_bytes(root.path());
    let c = Cache::new();
    for (name, bytes) in [("r.tar", plain.clone()), ("r.tar.gz", gzip(&plain))] {
        let path = write_temp(src.path(), name, &bytes);
        let resolved = c.cache.resolve(&path).unwrap();
        let mut sb = sandbox_on(&resolved.rootfs_dir).await;
        assert_eq!(
            sb.ok("read m < /etc/image-marker; echo $m; echo w > /etc/w")
                .await,
            "from-image"
        );
        sb.destroy();
        assert!(
            !resolved.rootfs_dir.join("etc/w").exists(),
            "write reached the cache"
        );
    }
    let image = oci_image();
    let resolved = c.cache.resolve(image.dir.path()).unwrap();
    let mut sb = sandbox_on(&resolved.rootfs_dir).await;
    let out = sb
        .ok(
            "test ! -e /etc/deleted && test ! -e /opt/old/a && test ! -e /opt/old/b \
             && read n < /opt/old/new && read l < /etc/layer2 && echo $n $l",
        )
        .await;
    assert_eq!(out, "new second");
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_factory_unpacks_the_image_env_into_its_cache() {
    if !can_run() {
        return;
    }
    let iso = Isolated::new();
    let image = oci_image();
    let cache = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let ctx = SandboxFactoryContext {
        session_id: "image".into(),
        workdir: work.path().join("ws"),
        memory_root: None,
        outputs_root: None,
    };
    let env_with_cache = |cache_dir: PathBuf| -> SandboxFactoryEnv {
        [
            (RUNTIME_DIR_ENV, iso.dir.path().display().to_string()),
            (CGROUP_PARENT_ENV, iso.cgroup_parent.clone()),
            (INIT_ENV, common::init_binary().display().to_string()),
            (IMAGE_ENV, image.dir.path().display().to_string()),
            (IMAGE_CACHE_ENV, cache_dir.display().to_string()),
        ]
        .into_iter()
        .collect()
    };
    let env = env_with_cache(cache.path().join("c"));
    let port = LinuxSandboxFactory::new()
        .create_port(&ctx, &env)
        .await
        .expect("create");
    let sandbox: Arc<dyn SandboxPort> = Arc::new(port);
    assert_eq!(
        sandbox.exec("cat /etc/layer2", None).await.unwrap(),
        "second"
    );
    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    assert!(
        cache
            .path()
            .join("c/sha256")
            .join(&image.manifest_hex)
            .join("rootfs/etc/layer2")
            .is_file()
    );
    iso.assert_empty();

    // A tampered image fails create clearly and leaves nothing.
    let blob = image
        .dir
        .path()
        .join("blobs/sha256")
        .join(&image.layer_hexes[0]);
    let mut bytes = std::fs::read(&blob).unwrap();
    bytes[600] ^= 1;
    std::fs::write(&blob, bytes).unwrap();
    let env = env_with_cache(cache.path().join("fresh"));
    let e = omabox_sandbox::SandboxFactory::create(&LinuxSandboxFactory::new(), &ctx, &env)
        .await
        .err()
        .expect("refused");
    assert!(e.message().contains("tampered"), "{e}");
    iso.assert_empty();
}
