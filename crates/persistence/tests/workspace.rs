//! `FilesystemWorkspacePort` against real files in temp directories.

mod common;

use common::*;
use omabox_contract::{
    AbortSignal, AttachWorkspaceInput, RuntimePublicationCandidate, WorkspacePersistencePort,
    WorkspaceStrategy,
};
use omabox_persistence::{
    BlobHash, BlobStore, BlobStoreOptions, EntryKind, FilesystemWorkspacePort, ManifestEntry,
    Progress, ProgressObserver, ProgressPhase, SkipReason, WorkspaceManifest, WorkspaceOptions,
};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const CR: WorkspaceStrategy = WorkspaceStrategy::CheckpointRestore;
const MARGIN: Duration = Duration::from_millis(20);

fn port(data: &Path, grace: Duration) -> FilesystemWorkspacePort {
    let store = BlobStore::with_options(
        data,
        BlobStoreOptions {
            gc_grace: grace,
            fsync: false,
        },
    )
    .unwrap();
    FilesystemWorkspacePort::with_store(data, Arc::new(store)).with_options(WorkspaceOptions {
        racy_margin: MARGIN,
        hash_threads: 2,
        verify_restore: true,
        ..WorkspaceOptions::default()
    })
}

/// Checkpoints `binding` (generation 1) and materializes that checkpoint as generation 2.
async fn checkpoint_into_the_next_generation(
    port: &FilesystemWorkspacePort,
    binding: &omabox_contract::WorkspaceBinding,
) -> omabox_contract::WorkspaceBinding {
    let published = port
        .checkpoint(checkpoint_input(1, CR, binding, ""))
        .await
        .unwrap();
    port.materialize(materialize_input(
        2,
        CR,
        Some(published.to_publication_candidate()),
    ))
    .await
    .unwrap()
}

/// Seeds a new session from `seed` and materializes it (generation 1): its binding and path.
async fn seed_a_new_session(
    port: &FilesystemWorkspacePort,
    seed: &Path,
) -> (omabox_contract::WorkspaceBinding, std::path::PathBuf) {
    port.seed_new_session(scope(), seed);
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let workspace = host_path(&binding);
    (binding, workspace)
}

fn build_tree(root: &Path) {
    std::fs::create_dir_all(root.join("src/nested/deeper")).unwrap();
    std::fs::create_dir_all(root.join("empty/also-empty")).unwrap();
    std::fs::create_dir(root.join("readonly")).unwrap();
    std::fs::write(root.join("src/main.rs"), b"fn main() {}\n").unwrap();
    std::fs::write(root.join("src/nested/deeper/data.bin"), noise(1, 300_000)).unwrap();
    std::fs::write(root.join("src/nested/copy-a"), b"same content").unwrap();
    std::fs::write(root.join("copy-b"), b"same content").unwrap();
    std::fs::write(root.join("empty-file"), b"").unwrap();
    std::fs::write(root.join("script.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    set_mode(&root.join("script.sh"), 0o755);
    std::fs::write(root.join("secret"), b"private").unwrap();
    set_mode(&root.join("secret"), 0o600);
    std::fs::write(root.join("readonly/inside"), b"ro").unwrap();
    set_mode(&root.join("readonly"), 0o555);
    std::os::unix::fs::symlink("src/main.rs", root.join("link-relative")).unwrap();
    std::os::unix::fs::symlink("../does/not/exist", root.join("src/link-dangling")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("link-absolute")).unwrap();
}

fn attach_input(
    generation: u64,
    binding: &omabox_contract::WorkspaceBinding,
) -> AttachWorkspaceInput {
    AttachWorkspaceInput {
        scope: scope(),
        fence: fence(generation),
        strategy: CR,
        binding: binding.clone(),
        sandbox: lease(),
        signal: AbortSignal::never(),
    }
}

#[tokio::test]
async fn checkpoint_then_restore_round_trips_every_entry_kind() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    assert_eq!(binding.mount_path, "/workspace");
    assert!(binding.binding_id.starts_with("wsb_") && binding.binding_id.len() == 36);
    let workspace = host_path(&binding);
    assert!(workspace.starts_with(data.path().join("runtime")));
    assert!(std::fs::read_dir(&workspace).unwrap().next().is_none());
    build_tree(&workspace);
    let expected = describe(&workspace);

    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    let hex = candidate.id.strip_prefix("wcp_").unwrap();
    assert!(BlobHash::from_hex(hex).is_some());
    assert_eq!(candidate.content_hash, format!("sha256:{hex}"));
    assert_eq!(candidate.revision, 1);
    let metadata = candidate.metadata.clone().unwrap();
    assert_eq!(metadata["manifestBlob"].as_str(), Some(hex));
    assert_eq!(report.files, 8);
    assert_eq!(report.symlinks, 3);
    assert_eq!(report.directories, 6);
    // Two files share content, so one blob fewer than files.
    assert_eq!(report.blobs_stored, 7);
    assert!(report.manifest_stored);

    let published = candidate.to_publication_candidate();
    let manifest = port.read_manifest(&published).await.unwrap();
    let secret = manifest
        .entries
        .iter()
        .find(|e| e.path == "secret")
        .unwrap();
    assert_eq!(
        (secret.kind, secret.mode, secret.size),
        (EntryKind::File, Some(0o600), Some(7))
    );
    let dangling = manifest
        .entries
        .iter()
        .find(|e| e.path == "src/link-dangling")
        .unwrap();
    assert_eq!(dangling.target.as_deref(), Some("../does/not/exist"));

    let (restored, restore) = port
        .materialize_with_report(&materialize_input(2, CR, Some(published.clone())))
        .await
        .unwrap();
    let restore = restore.expect("a restore happened");
    assert_eq!(
        (restore.files, restore.directories, restore.symlinks),
        (8, 6, 3)
    );
    assert_ne!(host_path(&restored), workspace);
    assert_eq!(describe(&host_path(&restored)), expected);

    let export = data.path().join("export");
    port.export_candidate(&published, &export).await.unwrap();
    assert_eq!(describe(&export), expected);
    let not_empty = port
        .export_candidate(&published, &export)
        .await
        .unwrap_err();
    assert!(
        not_empty
            .to_string()
            .starts_with("Export destination is not an empty directory")
    );

    // release removes the binding root, read-only directories included.
    let root = host_path(&restored).parent().unwrap().to_path_buf();
    port.release(&scope(), &fence(2), &restored).await.unwrap();
    assert!(!root.exists());
    port.release(&scope(), &fence(2), &restored).await.unwrap();
}

#[tokio::test]
async fn incremental_checkpoint_hashes_and_stores_only_the_changed_file() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let workspace = host_path(&binding);
    std::fs::create_dir(workspace.join("dir")).unwrap();
    for index in 0..20u64 {
        std::fs::write(
            workspace.join(format!("dir/file-{index:02}")),
            noise(index, 4096),
        )
        .unwrap();
    }
    std::thread::sleep(MARGIN * 3);
    let (first, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, "-a"))
        .await
        .unwrap();
    assert_eq!(
        (report.files_hashed, report.blobs_stored, report.cache_hits),
        (20, 20, 0)
    );

    // Same size, new content: only ctime/mtime tell.
    std::thread::sleep(MARGIN * 2);
    std::fs::write(workspace.join("dir/file-07"), noise(99, 4096)).unwrap();
    let blobs_before = blob_count(data.path());
    let (second, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, "-b"))
        .await
        .unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!(report.files_hashed, 1);
    assert_eq!(report.blobs_stored, 1);
    assert_eq!(report.cache_hits, 19);
    // One content blob and one manifest.
    assert_eq!(blob_count(data.path()), blobs_before + 2);

    // A restored binding is pre-cached once attached: an unchanged checkpoint reads nothing.
    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(second.to_publication_candidate()),
        ))
        .await
        .unwrap();
    port.attach(attach_input(2, &restored)).await.unwrap();
    let (third, report) = port
        .checkpoint_with_report(&checkpoint_input(2, CR, &restored, ""))
        .await
        .unwrap();
    assert_eq!(third.id, second.id);
    assert_eq!(third.revision, 2);
    assert_eq!(
        (report.files_hashed, report.cache_hits, report.blobs_stored),
        (0, 20, 0)
    );
    assert!(!report.manifest_stored);

    // Without attach the restore's cache is never trusted.
    let unattached = port
        .materialize(materialize_input(
            3,
            CR,
            Some(second.to_publication_candidate()),
        ))
        .await
        .unwrap();
    let (fourth, report) = port
        .checkpoint_with_report(&checkpoint_input(3, CR, &unattached, ""))
        .await
        .unwrap();
    assert_eq!(fourth.id, second.id);
    assert_eq!(
        (report.files_hashed, report.cache_hits, report.blobs_stored),
        (20, 0, 0)
    );
}

#[tokio::test]
async fn large_files_are_hashed_before_they_are_copied() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let big = noise(5, 9 << 20);
    let first = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&first).join("big"), &big).unwrap();
    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &first, ""))
        .await
        .unwrap();
    assert_eq!((report.blobs_stored, report.bytes_stored), (1, 9 << 20));
    // The same content elsewhere is recognised without being copied again.
    let second = port
        .materialize(materialize_input(2, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&second).join("big-copy"), &big).unwrap();
    let temp_before = std::fs::read_dir(data.path().join("blobs/tmp"))
        .unwrap()
        .count();
    let (_, report) = port
        .checkpoint_with_report(&checkpoint_input(2, CR, &second, ""))
        .await
        .unwrap();
    assert_eq!((report.files_hashed, report.blobs_stored), (1, 0));
    assert_eq!(
        std::fs::read_dir(data.path().join("blobs/tmp"))
            .unwrap()
            .count(),
        temp_before
    );
    let restored = port
        .materialize(materialize_input(
            3,
            CR,
            Some(candidate.to_publication_candidate()),
        ))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(host_path(&restored).join("big")).unwrap(),
        big
    );
}

#[tokio::test]
async fn an_aborted_checkpoint_fails_with_the_signal_reason() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&binding).join("a"), b"a").unwrap();
    let mut input = checkpoint_input(1, CR, &binding, "");
    input.signal = AbortSignal::aborted_with(omabox_contract::PortError::new("cancelled by user"));
    let error = port.checkpoint(input).await.unwrap_err();
    assert_eq!(error.message(), "cancelled by user");
}

#[tokio::test]
async fn checkpoint_is_idempotent_per_key() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&binding).join("a"), b"one").unwrap();
    let first = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    std::fs::write(host_path(&binding).join("a"), b"two").unwrap();
    let (again, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    assert_eq!(again, first);
    assert!(report.reused_candidate);
    let other = port
        .checkpoint(checkpoint_input(1, CR, &binding, "-2"))
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
}

#[tokio::test]
async fn special_files_and_too_deep_trees_are_skipped_and_reported_not_fatal() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    std::fs::write(root.join("kept"), b"kept").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("sock"),
        rustix::fs::FileType::Socket,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        root.join("null"),
        rustix::fs::FileType::CharacterDevice,
        rustix::fs::Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    std::fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"bad-\xff-name")),
        b"x",
    )
    .unwrap();
    // 1100 nested directories with a file at the bottom (built by fd: the path is long).
    let mut dir = rustix::fs::open(
        &root,
        rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
        rustix::fs::Mode::empty(),
    )
    .unwrap();
    for _ in 0..1100 {
        rustix::fs::mkdirat(&dir, "d", rustix::fs::Mode::from_raw_mode(0o755)).unwrap();
        dir = rustix::fs::openat(
            &dir,
            "d",
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
    }
    let deep_file = rustix::fs::openat(
        &dir,
        "deep-file",
        rustix::fs::OFlags::CREATE | rustix::fs::OFlags::WRONLY,
        rustix::fs::Mode::from_raw_mode(0o644),
    )
    .unwrap();
    drop(deep_file);
    drop(dir);

    let (candidate, report) = port
        .checkpoint_with_report(&checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();
    let mut reasons: Vec<(String, SkipReason)> = report
        .skipped
        .kept
        .iter()
        .map(|entry| (entry.path.clone(), entry.reason))
        .collect();
    reasons.sort_by(|a, b| a.0.cmp(&b.0));
    // Reported paths are shortened to 512 characters.
    let deep = format!("{}…", &vec!["d"; 1024].join("/")[..512]);
    assert_eq!(
        reasons,
        vec![
            ("bad-\u{fffd}-name".to_owned(), SkipReason::NotUtf8),
            (deep, SkipReason::TooDeep),
            ("fifo".to_owned(), SkipReason::Fifo),
            ("null".to_owned(), SkipReason::Device),
            ("sock".to_owned(), SkipReason::Socket),
        ]
    );
    assert_eq!(report.skipped.total, 5);
    assert_eq!(
        serde_json::to_value(&candidate.metadata.as_ref().unwrap()["skippedEntries"]).unwrap(),
        serde_json::json!(5)
    );

    // What was stored restores: the regular file and all 1024 storable directory levels.
    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(candidate.to_publication_candidate()),
        ))
        .await
        .unwrap();
    let restored_root = host_path(&restored);
    assert_eq!(std::fs::read(restored_root.join("kept")).unwrap(), b"kept");
    assert!(!restored_root.join("fifo").exists());
    let manifest = port
        .read_manifest(&candidate.to_publication_candidate())
        .await
        .unwrap();
    assert_eq!(
        manifest
            .entries
            .iter()
            .filter(|entry| entry.path.starts_with('d'))
            .count(),
        1024
    );
    // Both bindings, deep trees included, are released without a trace.
    port.release(&scope(), &fence(1), &binding).await.unwrap();
    port.release(&scope(), &fence(2), &restored).await.unwrap();
    assert!(!root.exists());
    assert!(!restored_root.exists());
}

fn candidate_for(
    port: &FilesystemWorkspacePort,
    manifest_json: &[u8],
) -> RuntimePublicationCandidate {
    let hash = port.store().put_bytes(manifest_json).unwrap().hash;
    RuntimePublicationCandidate {
        id: format!("wcp_{hash}"),
        content_hash: hash.content_hash(),
        metadata: None,
    }
}

#[tokio::test]
async fn restore_rejects_bad_ids_tampering_and_traversal() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&binding).join("a"), b"a").unwrap();
    let good = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap()
        .to_publication_candidate();

    let restore = |candidate: RuntimePublicationCandidate| {
        let port = &port;
        async move {
            port.materialize(materialize_input(2, CR, Some(candidate)))
                .await
                .unwrap_err()
                .message()
                .to_owned()
        }
    };
    let mut bad_id = good.clone();
    bad_id.id = "wcp_XYZ".into();
    assert_eq!(restore(bad_id).await, "Invalid workspace checkpoint id");
    let mut ephemeral_id = good.clone();
    ephemeral_id.id = format!("wrc_{}", &good.id[4..]);
    assert_eq!(
        restore(ephemeral_id).await,
        "Invalid workspace checkpoint id"
    );
    let mut wrong_hash = good.clone();
    wrong_hash.content_hash = BlobHash::of(b"other").content_hash();
    assert_eq!(
        restore(wrong_hash).await,
        "Workspace checkpoint content hash mismatch"
    );

    let manifest_hash = BlobHash::from_hex(&good.id[4..]).unwrap();
    let manifest_path = port.store().path_of(&manifest_hash);
    let original = std::fs::read(&manifest_path).unwrap();
    std::fs::write(
        &manifest_path,
        String::from_utf8(original.clone())
            .unwrap()
            .replace("\"a\"", "\"b\""),
    )
    .unwrap();
    // Stored bytes that no longer hash to their name are a damaged manifest, not a bad
    // candidate: nothing of it is trusted, the workspace starts empty and says so.
    let damaged = port
        .materialize(materialize_input(2, CR, Some(good.clone())))
        .await
        .unwrap();
    assert_eq!(std::fs::read_dir(host_path(&damaged)).unwrap().count(), 0);
    let (lost, _) = omabox_persistence::binding_losses(damaged.metadata.as_ref());
    assert!(
        lost[0]
            .problem
            .contains("the checkpoint manifest is damaged"),
        "{lost:?}"
    );
    std::fs::write(&manifest_path, &original).unwrap();

    let outside = data.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let file_hash = BlobHash::of(b"a");
    let file = |path: &str| ManifestEntry {
        path: path.into(),
        kind: EntryKind::File,
        mode: Some(0o644),
        size: Some(1),
        hash: Some(file_hash),
        target: None,
        extents: None,
    };
    let dir = |path: &str| ManifestEntry {
        path: path.into(),
        kind: EntryKind::Directory,
        mode: Some(0o755),
        size: None,
        hash: None,
        target: None,
        extents: None,
    };
    let link = |path: &str, target: &str| ManifestEntry {
        path: path.into(),
        kind: EntryKind::Symlink,
        mode: None,
        size: None,
        hash: None,
        target: Some(target.into()),
        extents: None,
    };
    let attacks: Vec<(Vec<ManifestEntry>, &str)> = vec![
        (vec![file("../x")], "../x"),
        (vec![file("/etc/x")], "/etc/x"),
        (vec![dir("a"), file("a/../../x")], "a/../../x"),
        (vec![file("a//x")], "a//x"),
        (
            vec![link("l", outside.to_str().unwrap()), file("l/pwned")],
            "l/pwned",
        ),
        (
            vec![dir("d"), link("d/l", "../../outside"), dir("d/l/sub")],
            "d/l/sub",
        ),
        (vec![file("f"), file("f")], "f"),
        (vec![file("missing-parent/f")], "missing-parent/f"),
    ];
    for (entries, path) in attacks {
        let manifest = WorkspaceManifest {
            version: 1,
            entries,
        };
        let candidate = candidate_for(&port, &manifest.to_bytes());
        assert_eq!(
            restore(candidate).await,
            format!("Workspace checkpoint entry is unsafe: {path}")
        );
    }
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
    assert!(!data.path().join("x").exists());
    // A failed materialize leaves no half-restored binding behind.
    assert!(!data.path().join("runtime").join("x").exists());

    // Missing content is lost, not restored, and named (path, blob, why); the rest of the
    // tree is restored.
    let missing = WorkspaceManifest {
        version: 1,
        entries: vec![
            ManifestEntry {
                hash: Some(BlobHash::of(b"never stored")),
                ..file("f")
            },
            file("g"),
        ],
    };
    let candidate = candidate_for(&port, &missing.to_bytes());
    let binding = port
        .materialize(materialize_input(2, CR, Some(candidate)))
        .await
        .unwrap();
    assert!(!host_path(&binding).join("f").exists());
    assert_eq!(std::fs::read(host_path(&binding).join("g")).unwrap(), b"a");
    let (lost, count) = omabox_persistence::binding_losses(binding.metadata.as_ref());
    assert_eq!(count, 1);
    assert_eq!(lost[0].path.as_deref(), Some("f"));
    assert_eq!(
        lost[0].object,
        format!("blob {}", BlobHash::of(b"never stored"))
    );
    assert_eq!(lost[0].problem, "the blob is not in the blob store");

    let absent = BlobHash::of(b"no manifest");
    let candidate = RuntimePublicationCandidate {
        id: format!("wcp_{absent}"),
        content_hash: absent.content_hash(),
        metadata: None,
    };
    let binding = port
        .materialize(materialize_input(2, CR, Some(candidate)))
        .await
        .unwrap();
    let (lost, _) = omabox_persistence::binding_losses(binding.metadata.as_ref());
    assert_eq!(lost[0].object, format!("wcp_{absent}"));
}

#[tokio::test]
async fn gc_removes_only_unreferenced_blobs() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::ZERO);
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let workspace = host_path(&binding);
    std::fs::write(workspace.join("stays"), b"stays").unwrap();
    std::fs::write(workspace.join("changes"), b"old").unwrap();
    let old = port
        .checkpoint(checkpoint_input(1, CR, &binding, "-1"))
        .await
        .unwrap();
    std::fs::write(workspace.join("changes"), b"new!").unwrap();
    let new = port
        .checkpoint(checkpoint_input(1, CR, &binding, "-2"))
        .await
        .unwrap();
    std::thread::sleep(Duration::from_millis(20));

    let referenced = port
        .referenced_blobs(&new.to_publication_candidate())
        .await
        .unwrap();
    assert_eq!(referenced.len(), 3);
    let report = port.store().gc(&referenced).unwrap();
    // The old manifest and the old "changes" content.
    assert_eq!(report.removed, 2);
    assert_eq!(report.kept_referenced, 3);
    for hash in &referenced {
        assert!(port.store().exists(hash).unwrap());
    }
    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(new.to_publication_candidate()),
        ))
        .await
        .unwrap();
    assert_eq!(
        std::fs::read(host_path(&restored).join("changes")).unwrap(),
        b"new!"
    );
    // The collected checkpoint's manifest is gone: every path of it is lost, and the
    // binding starts empty saying so in its metadata (never a silent empty workspace).
    let gone = port
        .materialize(materialize_input(
            3,
            CR,
            Some(old.to_publication_candidate()),
        ))
        .await
        .unwrap();
    assert_eq!(std::fs::read_dir(host_path(&gone)).unwrap().count(), 0);
    let (lost, count) = omabox_persistence::binding_losses(gone.metadata.as_ref());
    assert_eq!(count, 1);
    assert_eq!(lost[0].object, old.id);
    assert_eq!(lost[0].path, None);
    assert!(
        lost[0]
            .problem
            .contains("the checkpoint manifest is not in the blob store"),
        "{lost:?}"
    );
}

#[tokio::test]
async fn a_seed_fills_only_a_new_session() {
    let data = tempfile::tempdir().unwrap();
    let seed = tempfile::tempdir().unwrap();
    std::fs::create_dir(seed.path().join("sub")).unwrap();
    std::fs::write(seed.path().join("sub/seeded.txt"), b"from the seed").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", seed.path().join("link")).unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let (binding, workspace) = seed_a_new_session(&port, seed.path()).await;
    assert_eq!(describe(&workspace), describe(seed.path()));
    std::fs::write(workspace.join("sub/seeded.txt"), b"changed by the run").unwrap();
    let next = checkpoint_into_the_next_generation(&port, &binding).await;
    assert_eq!(
        std::fs::read(host_path(&next).join("sub/seeded.txt")).unwrap(),
        b"changed by the run"
    );
}

#[tokio::test]
async fn a_seed_is_copied_with_a_checkpoints_rules_stores_nothing_and_its_first_checkpoint_captures_it()
 {
    use std::os::unix::fs::MetadataExt;
    let data = tempfile::tempdir().unwrap();
    let seed = tempfile::tempdir().unwrap();
    build_tree(seed.path());
    // Bigger than a copy buffer, a sparse file, two names of one inode, and what a
    // checkpoint skips (a FIFO).
    std::fs::write(seed.path().join("big.bin"), noise(9, 5 << 20)).unwrap();
    let sparse = std::fs::File::create(seed.path().join("sparse.img")).unwrap();
    sparse.set_len(64 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 32 << 20).unwrap();
    drop(sparse);
    std::fs::write(seed.path().join("linked-a"), b"one inode").unwrap();
    std::fs::hard_link(
        seed.path().join("linked-a"),
        seed.path().join("src/linked-b"),
    )
    .unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        seed.path().join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let (binding, workspace) = seed_a_new_session(&port, seed.path()).await;
    std::fs::remove_file(seed.path().join("pipe")).unwrap();
    let expected = describe(seed.path());
    assert_eq!(describe(&workspace), expected);
    let meta = |path: &str| std::fs::symlink_metadata(workspace.join(path)).unwrap();
    assert_eq!(meta("linked-a").ino(), meta("src/linked-b").ino());
    assert!(
        meta("sparse.img").blocks() * 512 < 1 << 20,
        "the hole was written"
    );
    assert_eq!(
        blob_count(data.path()),
        0,
        "a seed hashes and stores nothing"
    );

    let next = checkpoint_into_the_next_generation(&port, &binding).await;
    assert_eq!(describe(&host_path(&next)), expected);
}

#[tokio::test]
async fn ephemeral_materializes_empty_and_checkpoints_a_marker() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600));
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    std::fs::write(host_path(&binding).join("a"), b"a").unwrap();
    let published = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .unwrap();

    let ephemeral = WorkspaceStrategy::Ephemeral;
    let binding = port
        .materialize(materialize_input(
            2,
            ephemeral,
            Some(published.to_publication_candidate()),
        ))
        .await
        .unwrap();
    assert!(
        std::fs::read_dir(host_path(&binding))
            .unwrap()
            .next()
            .is_none()
    );
    std::fs::write(host_path(&binding).join("dropped"), b"x").unwrap();
    let blobs = blob_count(data.path());
    let marker = port
        .checkpoint(checkpoint_input(2, ephemeral, &binding, ""))
        .await
        .unwrap();
    assert_eq!(blob_count(data.path()), blobs);
    let hex = marker.id.strip_prefix("wrc_").unwrap();
    assert_eq!(marker.content_hash, format!("sha256:{hex}"));
    assert_eq!(marker.revision, 2);
    let json = marker.metadata.unwrap()["openma.workspace.ephemeral.v1"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        json,
        r#"{"generation":2,"provider":"local","runtimeId":"rt-1"}"#
    );
    assert_eq!(BlobHash::of(json.as_bytes()).to_hex(), hex);
}

#[tokio::test]
async fn unsupported_strategies_and_foreign_bindings_are_rejected() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path(), Duration::from_secs(3600))
        .with_strategies(&[CR])
        .unwrap();
    let caps = port.capabilities(&scope()).await.unwrap();
    assert_eq!(caps.strategies, vec![CR]);
    for strategy in [
        WorkspaceStrategy::Ephemeral,
        WorkspaceStrategy::RetainedRuntime,
        WorkspaceStrategy::DurableMount,
    ] {
        let error = port
            .materialize(materialize_input(1, strategy, None))
            .await
            .unwrap_err();
        assert_eq!(
            error.message(),
            format!("Filesystem workspace does not support {strategy}")
        );
    }
    let error = FilesystemWorkspacePort::new(data.path())
        .unwrap()
        .with_strategies(&[WorkspaceStrategy::RetainedRuntime])
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "Filesystem workspace does not support retained_runtime"
    );

    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    port.attach(attach_input(1, &binding)).await.unwrap();
    let mut forged = binding.clone();
    forged.binding_id = "wsb_../../../../etc".into();
    assert!(
        port.checkpoint(checkpoint_input(1, CR, &forged, ""))
            .await
            .is_err()
    );
    let mut moved = binding.clone();
    moved
        .metadata
        .as_mut()
        .unwrap()
        .insert("hostPath".into(), "/etc".into());
    let error = port
        .checkpoint(checkpoint_input(1, CR, &moved, ""))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .starts_with("Unknown binding for this work item")
    );
    // Another generation's fence does not own this binding.
    let error = port
        .checkpoint(checkpoint_input(7, CR, &binding, ""))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .starts_with("Unknown binding for this work item")
    );
}

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Progress>>);

impl ProgressObserver for Recorder {
    fn update(&self, progress: Progress) {
        self.0.lock().unwrap().push(progress);
    }
}

#[tokio::test]
async fn progress_reaches_its_totals() {
    let data = tempfile::tempdir().unwrap();
    let recorder = Arc::new(Recorder::default());
    let port = port(data.path(), Duration::from_secs(3600)).with_progress(recorder.clone());
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    for index in 0..5 {
        std::fs::write(
            host_path(&binding).join(format!("f{index}")),
            noise(index, 1000),
        )
        .unwrap();
    }
    checkpoint_into_the_next_generation(&port, &binding).await;
    let updates = recorder.0.lock().unwrap().clone();
    for phase in [ProgressPhase::Checkpoint, ProgressPhase::Restore] {
        let last = updates
            .iter()
            .filter(|p| p.phase == phase)
            .max_by_key(|p| p.files_done)
            .unwrap();
        assert_eq!((last.files_done, last.files_total), (5, 5));
        assert_eq!((last.bytes_done, last.bytes_total), (5000, 5000));
    }
}

/// Deletes paths of a binding when a checkpoint starts reading files: its first progress
/// update comes after the walk and before any file is opened.
#[derive(Debug, Default)]
struct DeleteWhenReadingStarts {
    binding: Mutex<Option<std::path::PathBuf>>,
}

impl ProgressObserver for DeleteWhenReadingStarts {
    fn update(&self, progress: Progress) {
        if progress.phase != ProgressPhase::Checkpoint || progress.files_done != 0 {
            return;
        }
        if let Some(root) = self.binding.lock().unwrap().take() {
            std::fs::remove_file(root.join("gone.txt")).unwrap();
            std::fs::remove_dir_all(root.join("sub")).unwrap();
        }
    }
}

#[tokio::test]
async fn a_file_deleted_after_the_walk_saw_it_is_left_out_not_a_failure() {
    // An agent's leftover process (claude's shell snapshots, say) deleting its files while
    // the final checkpoint runs must not fail the run.
    let data = tempfile::tempdir().unwrap();
    let deleter = Arc::new(DeleteWhenReadingStarts::default());
    let port = port(data.path(), Duration::from_secs(3600)).with_progress(deleter.clone());
    let binding = port
        .materialize(materialize_input(1, CR, None))
        .await
        .unwrap();
    let root = host_path(&binding);
    std::fs::write(root.join("keep.txt"), "kept").unwrap();
    std::fs::write(root.join("gone.txt"), "deleted mid-checkpoint").unwrap();
    std::fs::create_dir(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/inner.txt"), "its directory deleted too").unwrap();
    *deleter.binding.lock().unwrap() = Some(root.clone());

    let candidate = port
        .checkpoint(checkpoint_input(1, CR, &binding, ""))
        .await
        .expect("a vanished file is not a changed one");
    assert!(
        deleter.binding.lock().unwrap().is_none(),
        "the deletion ran"
    );

    let restored = port
        .materialize(materialize_input(
            2,
            CR,
            Some(candidate.to_publication_candidate()),
        ))
        .await
        .unwrap();
    let restored = host_path(&restored);
    assert_eq!(std::fs::read(restored.join("keep.txt")).unwrap(), b"kept");
    assert!(!restored.join("gone.txt").exists());
    assert!(!restored.join("sub/inner.txt").exists());
}
