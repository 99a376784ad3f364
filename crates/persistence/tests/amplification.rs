//! What a sandbox makes cheaply must stay cheap on the host: sparse files stay sparse and hard
//! links stay links (in the blob store and after a restore), and a checkpoint over its entry or
//! byte limit fails naming the limit while the last publication stays restorable.

mod common;

use common::*;
use omabox_contract::{WorkspacePersistencePort, WorkspaceStrategy};
use omabox_persistence::{
    BlobStore, BlobStoreOptions, CheckpointLimits, EntryKind, FilesystemWorkspacePort,
    ManifestEntry, WorkspaceManifest, WorkspaceOptions,
};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

const CR: WorkspaceStrategy = WorkspaceStrategy::CheckpointRestore;
const MIB: u64 = 1 << 20;

fn port(data: &Path, limits: CheckpointLimits) -> FilesystemWorkspacePort {
    let store = BlobStore::with_options(
        data,
        BlobStoreOptions {
            gc_grace: Duration::from_secs(3600),
            fsync: false,
        },
    )
    .unwrap();
    FilesystemWorkspacePort::with_store(data, Arc::new(store)).with_options(WorkspaceOptions {
        racy_margin: Duration::from_millis(10),
        hash_threads: 2,
        verify_restore: true,
        limits,
    })
}

/// Bytes the files under `dir` occupy on disk (`st_blocks`), each inode once.
fn allocated_bytes(dir: &Path) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                stack.push(path);
            } else if seen.insert(meta.ino()) {
                total += meta.blocks() * 512;
            }
        }
    }
    total
}

/// A file of logical size `size` with `data` written at each offset (the rest holes).
fn sparse_file(path: &Path, size: u64, data: &[(u64, &[u8])]) {
    let file = std::fs::File::create(path).unwrap();
    file.set_len(size).unwrap();
    for (offset, bytes) in data {
        file.write_all_at(bytes, *offset).unwrap();
    }
}

fn sparse_supported(path: &Path) -> bool {
    let probe = path.join(".sparse-probe");
    sparse_file(&probe, 64 * MIB, &[]);
    let ok = std::fs::metadata(&probe).unwrap().blocks() * 512 < MIB;
    std::fs::remove_file(&probe).unwrap();
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and this filesystem does not keep sparse files"
        );
        eprintln!("SKIPPED: this filesystem does not keep sparse files");
    }
    ok
}

#[tokio::test]
async fn sparse_files_stay_sparse_in_the_store_and_after_restore() {
    let data = tempfile::tempdir().unwrap();
    if !sparse_supported(data.path()) {
        return;
    }
    let port = port(data.path(), CheckpointLimits::default());
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    sparse_file(&root.join("empty.img"), 512 * MIB, &[]);
    let head = noise(1, 4096);
    let middle = noise(2, 8192);
    let tail = noise(3, 100);
    sparse_file(
        &root.join("disk.img"),
        256 * MIB,
        &[(0, &head), (128 * MIB, &middle), (256 * MIB - 100, &tail)],
    );
    std::fs::write(root.join("dense.txt"), b"dense").unwrap();

    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    assert_eq!(report.sparse_files, 2, "{report:?}");
    assert!(report.bytes_hashed < MIB, "{report:?}");
    assert!(
        allocated_bytes(&data.path().join("blobs")) < 2 * MIB,
        "the blob store grew by {} bytes",
        allocated_bytes(&data.path().join("blobs"))
    );
    let manifest = port
        .read_manifest(&candidate.to_publication_candidate())
        .await
        .unwrap();
    assert_eq!(manifest.version, 2);
    let entry = |path: &str| {
        manifest
            .entries
            .iter()
            .find(|entry| entry.path == path)
            .unwrap()
            .clone()
    };
    assert_eq!(entry("empty.img").extents, Some(vec![]));
    assert_eq!(entry("empty.img").size, Some(512 * MIB));
    assert_eq!(entry("dense.txt").extents, None);

    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(candidate.to_publication_candidate()),
        ))
        .await
        .unwrap();
    let out = host_path(&restored);
    for name in ["empty.img", "disk.img"] {
        let original = std::fs::metadata(root.join(name)).unwrap();
        let copy = std::fs::metadata(out.join(name)).unwrap();
        assert_eq!(copy.len(), original.len(), "{name}");
        assert!(
            copy.blocks() <= original.blocks(),
            "{name}: {} blocks restored, {} in the sandbox",
            copy.blocks(),
            original.blocks()
        );
    }
    let disk = std::fs::File::open(out.join("disk.img")).unwrap();
    let read = |offset: u64, len: usize| {
        let mut buffer = vec![0u8; len];
        disk.read_exact_at(&mut buffer, offset).unwrap();
        buffer
    };
    assert_eq!(read(0, 4096), head);
    assert_eq!(read(128 * MIB, 8192), middle);
    assert_eq!(read(256 * MIB - 100, 100), tail);
    assert_eq!(read(64 * MIB, 4096), vec![0u8; 4096]);
    assert_eq!(std::fs::read(out.join("dense.txt")).unwrap(), b"dense");

    // A second checkpoint of the restored tree names the same content.
    let (again, _) = port
        .checkpoint_with_report(&checkpoint_input(2, CR, &restored, ""))
        .await
        .unwrap();
    assert_eq!(again.content_hash, candidate.content_hash);
}

#[tokio::test]
async fn hard_links_are_stored_once_and_restored_as_links() {
    let data = tempfile::tempdir().unwrap();
    if !sparse_supported(data.path()) {
        return;
    }
    let port = port(data.path(), CheckpointLimits::default());
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    // The issue's case: a 64 MiB sparse file with 4 KiB of data, linked 100 times.
    std::fs::create_dir(root.join("links")).unwrap();
    sparse_file(&root.join("big"), 64 * MIB, &[(0, &noise(7, 4096))]);
    for index in 0..100 {
        std::fs::hard_link(root.join("big"), root.join(format!("links/{index:03}"))).unwrap();
    }
    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    assert_eq!(report.hardlinks, 100, "{report:?}");
    assert_eq!(report.files, 1, "{report:?}");
    assert_eq!(report.bytes_hashed, 4096, "{report:?}");
    assert!(allocated_bytes(&data.path().join("blobs")) < MIB);
    let manifest = port
        .read_manifest(&candidate.to_publication_candidate())
        .await
        .unwrap();
    let links: Vec<&ManifestEntry> = manifest
        .entries
        .iter()
        .filter(|entry| entry.kind == EntryKind::Hardlink)
        .collect();
    assert_eq!(links.len(), 100);
    assert!(
        links
            .iter()
            .all(|entry| entry.target.as_deref() == Some("big"))
    );

    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(candidate.to_publication_candidate()),
        ))
        .await
        .unwrap();
    let out = host_path(&restored);
    let inode = std::fs::metadata(out.join("big")).unwrap().ino();
    for index in 0..100 {
        let meta = std::fs::metadata(out.join(format!("links/{index:03}"))).unwrap();
        assert_eq!(meta.ino(), inode, "links/{index:03} is not a link");
        assert_eq!(meta.len(), 64 * MIB);
    }
    assert_eq!(std::fs::metadata(out.join("big")).unwrap().nlink(), 101);

    // Read in memory through a link: the logical bytes, holes as zeros, under a cap.
    let published = candidate.to_publication_candidate();
    let bytes = port
        .read_file(&published, "links/042", 64 * MIB)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(bytes.len() as u64, 64 * MIB);
    assert_eq!(&bytes[..4096], &noise(7, 4096)[..]);
    assert!(bytes[4096..].iter().all(|byte| *byte == 0));
    let error = port.read_file(&published, "big", MIB).await.unwrap_err();
    assert!(
        error.to_string().contains("more than the 1048576"),
        "{error}"
    );
    assert!(
        port.read_file(&published, "nope", MIB)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        port.read_file(&published, "links", MIB)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        allocated_bytes(&out) < MIB,
        "restored {} bytes",
        allocated_bytes(&out)
    );
}

#[tokio::test]
async fn a_checkpoint_over_a_limit_fails_naming_it_and_the_last_publication_stays() {
    let data = tempfile::tempdir().unwrap();
    let limits = CheckpointLimits {
        max_entries: 10,
        max_bytes: 10_000,
    };
    let port = port(data.path(), limits);
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    std::fs::write(root.join("kept"), b"kept").unwrap();
    let good = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    // A tree without sparse files or hard links is still written as version 1 (readable by
    // an older omabox).
    let manifest = port
        .read_manifest(&good.to_publication_candidate())
        .await
        .unwrap();
    assert_eq!(manifest.version, 1);

    for index in 0..20 {
        std::fs::write(root.join(format!("f{index}")), b"x").unwrap();
    }
    let error = port
        .checkpoint(checkpoint_input(1, CR, &binding, "-entries"))
        .await
        .unwrap_err();
    assert!(
        error.message().contains("exceeds its limit of 10 entries"),
        "{error}"
    );
    assert!(
        error.message().contains("last publication stays"),
        "{error}"
    );
    for index in 0..20 {
        std::fs::remove_file(root.join(format!("f{index}"))).unwrap();
    }

    std::fs::write(root.join("big"), noise(9, 20_000)).unwrap();
    let error = port
        .checkpoint(checkpoint_input(1, CR, &binding, "-bytes"))
        .await
        .unwrap_err();
    assert!(
        error.message().contains("exceeds its limit of 10000 bytes"),
        "{error}"
    );
    assert!(error.message().contains("at least 20000 bytes"), "{error}");

    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(good.to_publication_candidate()),
        ))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(host_path(&restored).join("kept")).unwrap(),
        b"kept"
    );
}

#[test]
fn version_1_manifests_are_read_and_cannot_carry_version_2_fields() {
    let hash = omabox_persistence::BlobHash::of(b"x");
    let v1 = br#"{"version":1,"entries":[{"path":"f","type":"file","mode":420,"size":1,"hash":"HASH"}]}"#;
    let v1 = String::from_utf8_lossy(v1).replace("HASH", &hash.to_hex());
    let manifest = WorkspaceManifest::parse(v1.as_bytes()).unwrap();
    assert_eq!(manifest.version, 1);

    let file = ManifestEntry {
        path: "f".into(),
        kind: EntryKind::File,
        mode: Some(0o644),
        size: Some(100),
        hash: Some(hash),
        target: None,
        extents: Some(vec![[10, 1]]),
    };
    let link = ManifestEntry {
        path: "l".into(),
        kind: EntryKind::Hardlink,
        mode: None,
        size: None,
        hash: None,
        target: Some("f".into()),
        extents: None,
    };
    let v2 = WorkspaceManifest {
        version: 2,
        entries: vec![file.clone(), link.clone()],
    };
    assert_eq!(WorkspaceManifest::parse(&v2.to_bytes()).unwrap(), v2);
    for version in [1, 3] {
        let bad = WorkspaceManifest {
            version,
            ..v2.clone()
        };
        assert!(bad.validate().is_err(), "version {version}");
    }
    // Extents out of order, overlapping, or outside the file; a link to a later or missing entry.
    for extents in [
        vec![[50, 10], [0, 10]],
        vec![[0, 10], [5, 10]],
        vec![[95, 10]],
        vec![[0, 0]],
    ] {
        let bad = WorkspaceManifest {
            version: 2,
            entries: vec![ManifestEntry {
                extents: Some(extents.clone()),
                ..file.clone()
            }],
        };
        assert!(bad.validate().is_err(), "{extents:?}");
    }
    let forward = WorkspaceManifest {
        version: 2,
        entries: vec![link.clone(), file.clone()],
    };
    assert!(forward.validate().is_err());
    let to_itself = WorkspaceManifest {
        version: 2,
        entries: vec![ManifestEntry {
            target: Some("l".into()),
            ..link
        }],
    };
    assert!(to_itself.validate().is_err());
}

/// A file with more data regions than a manifest lists is stored dense; the byte limit is
/// checked before it is read, so its logical size never reaches the blob store.
#[tokio::test]
async fn a_fragmented_sparse_file_over_the_byte_limit_is_refused_before_it_is_copied() {
    let data = tempfile::tempdir().unwrap();
    if !sparse_supported(data.path()) {
        return;
    }
    let port = port(
        data.path(),
        CheckpointLimits {
            max_entries: 100,
            max_bytes: 20 * MIB,
        },
    );
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    let extents = omabox_persistence::MAX_EXTENTS as u64 + 1;
    let block = vec![7u8; 4096];
    let regions: Vec<(u64, &[u8])> = (0..extents).map(|i| (i * 8192, &block[..])).collect();
    sparse_file(&root.join("fragmented"), extents * 8192, &regions);
    let allocated = std::fs::metadata(root.join("fragmented")).unwrap().blocks() * 512;
    assert!(allocated < 20 * MIB, "{allocated}");

    let error = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .contains("exceeds its limit of 20971520 bytes"),
        "{error}"
    );
    assert!(allocated_bytes(&data.path().join("blobs")) < MIB);
}
