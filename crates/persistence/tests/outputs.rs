//! `FilesystemSessionOutputPort` against real files in temp directories.

mod common;

use common::*;
use omabox_contract::{
    AbortSignal, CollectOutputsInput, FinalizeOutputsInput, OutputAbortReason, OutputDurability,
    OutputStrategy, PrepareOutputsInput, SessionOutputBinding, SessionOutputEntryCandidate,
    SessionOutputPort,
};
use omabox_persistence::{BlobHash, FilesystemSessionOutputPort, OutputLimits};
use std::io::Read;
use std::path::{Path, PathBuf};

const FC: OutputStrategy = OutputStrategy::FinalCollect;

fn port(data: &Path) -> FilesystemSessionOutputPort {
    FilesystemSessionOutputPort::new(data).unwrap()
}

async fn prepare(port: &FilesystemSessionOutputPort) -> (SessionOutputBinding, PathBuf) {
    let binding = port
        .prepare(PrepareOutputsInput {
            scope: scope(),
            fence: fence(1),
            strategy: FC,
            idempotency_key: "work-1:1:outputs-prepare".into(),
            signal: AbortSignal::never(),
        })
        .await
        .unwrap();
    let dir = omabox_persistence::binding_host_path(binding.metadata.as_ref()).unwrap();
    (binding, dir)
}

async fn collect(
    port: &FilesystemSessionOutputPort,
    binding: &SessionOutputBinding,
) -> Result<Vec<SessionOutputEntryCandidate>, omabox_contract::PortError> {
    port.collect(CollectOutputsInput {
        scope: scope(),
        fence: fence(1),
        strategy: FC,
        binding: binding.clone(),
        signal: AbortSignal::never(),
    })
    .await
}

async fn finalize(
    port: &FilesystemSessionOutputPort,
    binding: &SessionOutputBinding,
    entries: Vec<SessionOutputEntryCandidate>,
) -> Result<omabox_contract::SessionOutputManifestCandidate, omabox_contract::PortError> {
    port.finalize(FinalizeOutputsInput {
        scope: scope(),
        fence: fence(1),
        strategy: FC,
        binding: binding.clone(),
        entries,
        idempotency_key: "work-1:1:outputs-finalize".into(),
        signal: AbortSignal::never(),
    })
    .await
}

#[tokio::test]
async fn collect_finalize_and_read_back() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path());
    let caps = port.capabilities(&scope()).await.unwrap();
    assert_eq!(caps.strategies.len(), 1);
    assert_eq!(caps.strategies[0].strategy, FC);
    assert_eq!(caps.strategies[0].durability, OutputDurability::Durable);

    let (binding, dir) = prepare(&port).await;
    assert_eq!(binding.mount_path, "/mnt/session/outputs");
    assert!(binding.binding_id.starts_with("outb_"));
    assert!(dir.starts_with(data.path().join("runtime-outputs")));
    std::fs::create_dir_all(dir.join("charts/png")).unwrap();
    std::fs::create_dir(dir.join("empty")).unwrap();
    std::fs::write(dir.join("report.md"), b"# Report\n").unwrap();
    std::fs::write(dir.join("charts/png/a.PNG"), noise(3, 5000)).unwrap();
    std::fs::write(dir.join("charts/data.csv"), b"a,b\n1,2\n").unwrap();
    std::fs::write(dir.join("blob"), b"").unwrap();

    let entries = collect(&port, &binding).await.unwrap();
    let paths: Vec<_> = entries.iter().map(|e| e.logical_path.as_str()).collect();
    assert_eq!(
        paths,
        ["blob", "charts/data.csv", "charts/png/a.PNG", "report.md"]
    );
    let media: Vec<_> = entries
        .iter()
        .map(|e| e.media_type.as_deref().unwrap())
        .collect();
    assert_eq!(
        media,
        [
            "application/octet-stream",
            "text/csv",
            "image/png",
            "text/markdown"
        ]
    );
    assert_eq!(
        entries[3].content_hash,
        BlobHash::of(b"# Report\n").content_hash()
    );
    assert_eq!(entries[3].size, 9);

    let candidate = finalize(&port, &binding, entries.clone()).await.unwrap();
    let hex = candidate.id.strip_prefix("out_").unwrap();
    assert_eq!(candidate.content_hash, format!("sha256:{hex}"));
    assert_eq!(candidate.entries, 4);
    assert_eq!(
        candidate.metadata.as_ref().unwrap()["manifestBlob"].as_str(),
        Some(hex)
    );
    // Finalize is deterministic: same entries, same manifest.
    assert_eq!(
        finalize(&port, &binding, entries.clone()).await.unwrap(),
        candidate
    );

    let published = candidate.to_publication_candidate();
    let manifest = port.read_manifest(&published).await.unwrap();
    assert_eq!((manifest.version, manifest.generation), (1, 1));
    assert_eq!(manifest.session_id, "session-1");
    assert_eq!(manifest.work_id, "work-1");
    assert_eq!(manifest.entries, entries);
    let (entry, mut file) = port
        .open_entry(&published, "charts/png/a.PNG")
        .await
        .unwrap();
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).unwrap();
    assert_eq!(bytes, noise(3, 5000));
    assert_eq!(entry.size, 5000);
    assert!(port.open_entry(&published, "nope").await.is_err());
    assert_eq!(port.referenced_blobs(&published).await.unwrap().len(), 5);

    let root = dir.parent().unwrap().to_path_buf();
    port.release(&scope(), &fence(1), &binding).await.unwrap();
    assert!(!root.exists());
    // Published bytes outlive the binding.
    assert!(port.open_entry(&published, "report.md").await.is_ok());
}

#[tokio::test]
async fn finalize_detects_changes_after_collection() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path());
    let (binding, dir) = prepare(&port).await;
    std::fs::write(dir.join("a.txt"), b"first").unwrap();
    std::fs::write(dir.join("b.txt"), b"second").unwrap();
    let entries = collect(&port, &binding).await.unwrap();
    std::fs::write(dir.join("a.txt"), b"FIRST").unwrap();
    let error = finalize(&port, &binding, entries.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Session output changed during collection: a.txt"
    );
    std::fs::write(dir.join("a.txt"), b"first").unwrap();
    std::fs::remove_file(dir.join("b.txt")).unwrap();
    let error = finalize(&port, &binding, entries.clone())
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Session output changed during collection: b.txt"
    );

    let mut unsafe_entries = entries.clone();
    unsafe_entries[0].logical_path = "../a.txt".into();
    let error = finalize(&port, &binding, unsafe_entries).await.unwrap_err();
    assert_eq!(
        error.message(),
        "Provider output has an unsafe logical path: /mnt/session/outputs/../a.txt"
    );
}

#[tokio::test]
async fn collect_skips_symlinks_and_special_files_and_keeps_the_rest() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path());
    let (binding, dir) = prepare(&port).await;
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.join("sub/link")).unwrap();
    std::fs::write(dir.join("sub/report.txt"), b"kept").unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        dir.join("fifo"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    let entries = collect(&port, &binding).await.unwrap();
    let paths: Vec<&str> = entries
        .iter()
        .map(|entry| entry.logical_path.as_str())
        .collect();
    assert_eq!(paths, ["sub/report.txt"]);
}

#[tokio::test]
async fn collect_enforces_file_and_byte_limits() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path()).with_limits(OutputLimits {
        max_files: 2,
        max_bytes: 10,
    });
    let (binding, dir) = prepare(&port).await;
    std::fs::write(dir.join("a"), b"12345").unwrap();
    std::fs::write(dir.join("b"), b"12345").unwrap();
    assert_eq!(collect(&port, &binding).await.unwrap().len(), 2);
    std::fs::write(dir.join("c"), b"").unwrap();
    let error = collect(&port, &binding).await.unwrap_err();
    assert_eq!(error.message(), "Provider output file limit exceeded (2)");
    std::fs::remove_file(dir.join("c")).unwrap();
    std::fs::write(dir.join("b"), b"123456").unwrap();
    let error = collect(&port, &binding).await.unwrap_err();
    assert_eq!(error.message(), "Provider output byte limit exceeded (10)");
}

#[tokio::test]
async fn abort_discards_and_other_strategies_are_refused() {
    let data = tempfile::tempdir().unwrap();
    let port = port(data.path());
    for strategy in [OutputStrategy::DurableMount, OutputStrategy::WatchAndUpload] {
        let error = port
            .prepare(PrepareOutputsInput {
                scope: scope(),
                fence: fence(1),
                strategy,
                idempotency_key: "k".into(),
                signal: AbortSignal::never(),
            })
            .await
            .unwrap_err();
        assert_eq!(
            error.message(),
            format!("Filesystem outputs do not support {strategy}")
        );
    }
    let (binding, dir) = prepare(&port).await;
    std::fs::write(dir.join("a"), b"a").unwrap();
    port.abort(&scope(), &fence(1), &binding, OutputAbortReason::Failed)
        .await
        .unwrap();
    assert!(!dir.exists());

    let mut bad = omabox_contract::RuntimePublicationCandidate {
        id: "out_nope".into(),
        content_hash: "sha256:nope".into(),
        metadata: None,
    };
    assert_eq!(
        port.read_manifest(&bad).await.unwrap_err().to_string(),
        "Invalid Session output manifest id"
    );
    let hash = BlobHash::of(b"x");
    bad.id = format!("out_{hash}");
    assert_eq!(
        port.read_manifest(&bad).await.unwrap_err().to_string(),
        "Session output manifest content hash mismatch"
    );
}

/// A warm session's next turn reuses the binding (its directory stays mounted): `empty`
/// removes what the last turn wrote — nested dirs, read-only ones, symlinks (not their
/// targets) — and keeps the directory, so the next collection sees only the new turn's files.
#[tokio::test]
async fn empty_clears_the_outputs_and_keeps_the_mounted_directory() {
    let data = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("keep"), "not the sandbox's").unwrap();
    let port = port(data.path());
    let (binding, dir) = prepare(&port).await;
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    std::fs::write(dir.join("a/b/report.txt"), "turn one").unwrap();
    std::fs::write(dir.join("top.txt"), "turn one").unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("escape")).unwrap();
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir.join("a/b"), std::fs::Permissions::from_mode(0o555)).unwrap();
    let inode =
        |path: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
    let before = inode(&dir);

    port.empty(&scope(), &fence(1), &binding).await.unwrap();

    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    assert_eq!(inode(&dir), before, "the directory itself was replaced");
    assert!(outside.path().join("keep").exists());
    std::fs::write(dir.join("second.txt"), "turn two").unwrap();
    let entries = collect(&port, &binding).await.unwrap();
    let paths: Vec<_> = entries.iter().map(|e| e.logical_path.clone()).collect();
    assert_eq!(paths, ["second.txt"]);
}
