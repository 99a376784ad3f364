//! Archives built to hurt the host that unpacks them: tar headers too large to hold,
//! entry and byte bombs, whiteouts aimed through symlinks, device nodes and file
//! capabilities, names too long for the filesystem, too many layers. Each asserts what
//! the host kept (memory, files outside the cache) and what the error says.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use omabox_image::{ImageCache, ImageError, UnpackLimits};
use sha2::{Digest as _, Sha256};

/// A tar written entry by entry, with headers the `tar` crate's builder would not write.
struct RawTar(Vec<u8>);

impl RawTar {
    fn new() -> Self {
        Self(Vec::new())
    }

    fn entry(mut self, name: &str, kind: tar::EntryType, link: &str, data: &[u8]) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.as_gnu_mut().unwrap().name[..name.len()].copy_from_slice(name.as_bytes());
        if !link.is_empty() {
            header.set_link_name(link).unwrap();
        }
        header.set_cksum();
        self.0.extend_from_slice(header.as_bytes());
        self.0.extend_from_slice(data);
        self.0.resize(self.0.len().div_ceil(512) * 512, 0);
        self
    }

    fn file(self, name: &str, data: &[u8]) -> Self {
        self.entry(name, tar::EntryType::Regular, "", data)
    }

    fn dir(self, name: &str) -> Self {
        self.entry(name, tar::EntryType::Directory, "", b"")
    }

    fn finish(mut self) -> Vec<u8> {
        self.0.extend_from_slice(&[0; 1024]);
        self.0
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(bytes).unwrap();
    gz.finish().unwrap()
}

/// A cache in a fresh directory, and its parent (where "outside" is checked).
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

    fn write(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let path = self.parent.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// Nothing published, nothing left in `tmp/`.
    fn assert_empty(&self) {
        for sub in ["sha256", "tmp"] {
            let left: Vec<_> = std::fs::read_dir(self.cache.dir().join(sub))
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "left in {sub}: {left:?}");
        }
    }
}

/// The peak resident set of this process so far, in KiB.
fn max_rss_kib() -> i64 {
    // SAFETY: getrusage writes into the struct we pass; no other preconditions.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above, RUSAGE_SELF with a valid pointer.
    assert_eq!(unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) }, 0);
    usage.ru_maxrss
}

/// A gzip stream of one extension header of `kind` claiming `size` bytes (all written,
/// streamed: never held here), then a normal file.
fn extension_bomb(kind: tar::EntryType, size: u64) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_size(size);
    header.set_mode(0o644);
    header.set_mtime(0);
    header.set_uid(0);
    header.set_gid(0);
    header.as_gnu_mut().unwrap().name[..9].copy_from_slice(b"././@Long");
    header.set_cksum();
    gz.write_all(header.as_bytes()).unwrap();
    let chunk = vec![b'a'; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        gz.write_all(&chunk[..n]).unwrap();
        left -= n as u64;
    }
    gz.write_all(&vec![0; (512 - (size % 512) as usize) % 512])
        .unwrap();
    gz.write_all(&RawTar::new().file("after", b"x").finish())
        .unwrap();
    gz.finish().unwrap()
}

#[test]
fn a_tar_header_too_large_to_hold_is_refused_without_being_read_into_memory() {
    for kind in [tar::EntryType::XHeader, tar::EntryType::GNULongName] {
        let c = Cache::new();
        let bomb = c.write("bomb.tar.gz", &extension_bomb(kind, 256 << 20));
        let before = max_rss_kib();
        let e = c.cache.resolve(&bomb).unwrap_err();
        let grew = max_rss_kib() - before;
        assert!(matches!(e, ImageError::Limit(_)), "{kind:?}: {e}");
        assert!(e.to_string().contains("tar header"), "{e}");
        assert!(
            grew < 64 << 10,
            "{kind:?}: unpacking took {grew} KiB more memory"
        );
        c.assert_empty();
    }
}

#[test]
fn entry_and_byte_bombs_stop_at_their_limits_and_leave_nothing() {
    let limits = UnpackLimits {
        max_bytes: 1 << 20,
        max_entries: 10,
    };
    let c = Cache::new();
    let cache = c.cache.clone().with_limits(limits);
    let mut many = RawTar::new();
    for i in 0..20 {
        many = many.file(&format!("f{i}"), b"");
    }
    let e = cache
        .resolve(&c.write("many.tar", &many.finish()))
        .unwrap_err();
    assert!(e.to_string().contains("more than 10 entries"), "{e}");
    assert!(e.is_bad_image());
    c.assert_empty();

    // 64 MiB of zeros, 64 KiB gzipped.
    let zeros = gzip(&RawTar::new().file("zeros", &vec![0; 64 << 20]).finish());
    let e = cache.resolve(&c.write("zeros.tar.gz", &zeros)).unwrap_err();
    assert!(e.to_string().contains("more than 1048576 bytes"), "{e}");
    c.assert_empty();

    // Within the limits: unpacked.
    let fits = RawTar::new().file("ok", &[1; 1000]).finish();
    assert!(cache.resolve(&c.write("fits.tar", &fits)).is_ok());
}

/// An OCI image layout of `layers` (tar bytes, bottom first) in `dir`.
fn oci_layout(dir: &Path, layers: &[Vec<u8>]) -> PathBuf {
    let root = dir.join("layout");
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let (config, config_size) = put(br#"{"architecture":"amd64","os":"linux"}"#);
    let descs: Vec<String> = layers
        .iter()
        .map(|l| {
            let (digest, size) = put(l);
            format!(
                r#"{{"mediaType":"application/vnd.oci.image.layer.v1.tar","digest":"{digest}","size":{size}}}"#
            )
        })
        .collect();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"{config}","size":{config_size}}},"layers":[{}]}}"#,
        descs.join(",")
    );
    let (digest, size) = put(manifest.as_bytes());
    std::fs::write(root.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        root.join("index.json"),
        format!(
            r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"{digest}","size":{size}}}]}}"#
        ),
    )
    .unwrap();
    root
}

#[test]
fn whiteouts_never_delete_through_a_symlink() {
    let c = Cache::new();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim"), "host").unwrap();
    std::fs::write(outside.path().join("other"), "host").unwrap();
    let out = outside.path().display().to_string();
    let lower = RawTar::new()
        .entry("lnk", tar::EntryType::Symlink, &out, b"")
        .dir("d/")
        .entry("d/up", tar::EntryType::Symlink, "../..", b"")
        .finish();
    for upper in [
        RawTar::new().file("lnk/.wh.victim", b"").finish(),
        RawTar::new().file("lnk/.wh..wh..opq", b"").finish(),
        RawTar::new().file("d/up/.wh.victim", b"").finish(),
    ] {
        let layout = oci_layout(c.parent.path(), &[lower.clone(), upper]);
        let result = c.cache.resolve(&layout);
        assert_eq!(
            std::fs::read_to_string(outside.path().join("victim")).unwrap(),
            "host"
        );
        assert!(outside.path().join("other").is_file());
        if let Ok(r) = result {
            // The symlink itself is the image's, kept as written.
            assert!(r.rootfs_dir.join("lnk").is_symlink());
        }
        std::fs::remove_dir_all(&layout).unwrap();
    }
}

#[test]
fn device_nodes_and_file_capabilities_are_not_made() {
    let c = Cache::new();
    let mut pax = Vec::new();
    let record = |key: &str, value: &[u8]| {
        let body_len = key.len() + value.len() + 3;
        let mut len = body_len + body_len.to_string().len();
        if (len).to_string().len() != body_len.to_string().len() {
            len += 1;
        }
        let mut r = format!("{len} {key}=").into_bytes();
        r.extend_from_slice(value);
        r.push(b'\n');
        r
    };
    pax.extend(record(
        "SCHILY.xattr.security.capability",
        &[
            1, 0, 0, 2, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0,
        ],
    ));
    pax.extend(record("SCHILY.xattr.user.evil", b"yes"));
    let bytes = RawTar::new()
        .entry("mem", tar::EntryType::Char, "", b"")
        .entry("sda", tar::EntryType::Block, "", b"")
        .entry("pax", tar::EntryType::XHeader, "", &pax)
        .file("capable", b"#!/bin/sh\n")
        .finish();
    let r = c.cache.resolve(&c.write("devices.tar", &bytes)).unwrap();
    assert!(!r.rootfs_dir.join("mem").exists());
    assert!(!r.rootfs_dir.join("sda").exists());
    let file = std::ffi::CString::new(
        r.rootfs_dir
            .join("capable")
            .as_os_str()
            .as_encoded_bytes()
            .to_vec(),
    )
    .unwrap();
    // SAFETY: a valid path and an empty buffer (size 0 asks for the length).
    let listed = unsafe { libc::llistxattr(file.as_ptr(), std::ptr::null_mut(), 0) };
    assert_eq!(listed, 0, "extended attributes were restored");
}

#[test]
fn names_too_long_for_the_filesystem_are_the_images_fault() {
    let c = Cache::new();
    let long_component = "x".repeat(300);
    let deep: String = std::iter::repeat_n("d".repeat(200), 30)
        .collect::<Vec<_>>()
        .join("/");
    for name in [long_component, deep] {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        builder.append_data(&mut header, &name, &b"x"[..]).unwrap();
        let bytes = builder.into_inner().unwrap();
        let e = c.cache.resolve(&c.write("long.tar", &bytes)).unwrap_err();
        assert!(
            matches!(e, ImageError::UnsafeEntry { .. }) && e.to_string().contains("too long"),
            "{e}"
        );
        assert!(e.is_bad_image());
        assert!(
            e.to_string().len() < 10_000,
            "{} bytes",
            e.to_string().len()
        );
        c.assert_empty();
    }
}

#[test]
fn an_oci_layout_with_too_many_layers_is_refused() {
    let c = Cache::new();
    let layer = RawTar::new().file("x", b"x").finish();
    let layers = vec![layer; 513];
    let layout = oci_layout(c.parent.path(), &layers);
    let e = c.cache.resolve(&layout).unwrap_err();
    assert!(e.to_string().contains("more than 512"), "{e}");
    c.assert_empty();
}
