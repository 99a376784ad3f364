//! `verify_workspace` / `verify_outputs` (what `omabox fsck` runs): intact, missing and corrupt
//! blobs are each reported with the object and the path that needs it.

mod common;

use common::*;
use omabox_contract::{WorkspacePersistencePort, WorkspaceStrategy};
use omabox_persistence::{
    BlobHash, BlobVerifier, FilesystemWorkspacePort, verify_outputs, verify_workspace,
};

#[tokio::test]
async fn verification_reports_missing_and_corrupt_blobs_by_path() {
    let data = tempfile::tempdir().unwrap();
    let port = FilesystemWorkspacePort::new(data.path()).unwrap();
    let binding = port
        .materialize(materialize_input(
            1,
            WorkspaceStrategy::CheckpointRestore,
            None,
        ))
        .await
        .unwrap();
    let root = host_path(&binding);
    std::fs::write(root.join("gone"), b"gone").unwrap();
    std::fs::write(root.join("bent"), b"bent").unwrap();
    std::fs::write(root.join("fine"), b"fine").unwrap();
    let candidate = port
        .checkpoint(checkpoint_input(
            1,
            WorkspaceStrategy::CheckpointRestore,
            &binding,
            "",
        ))
        .await
        .unwrap()
        .to_publication_candidate();
    let store = port.store();
    assert!(
        verify_workspace(&mut BlobVerifier::new(store), &candidate)
            .unwrap()
            .is_empty()
    );

    std::fs::remove_file(store.path_of(&BlobHash::of(b"gone"))).unwrap();
    let bent = store.path_of(&BlobHash::of(b"bent"));
    std::fs::remove_file(&bent).unwrap();
    std::fs::write(&bent, b"BENT").unwrap();
    let damages = verify_workspace(&mut BlobVerifier::new(store), &candidate).unwrap();
    let found: Vec<(Option<&str>, &str)> = damages
        .iter()
        .map(|damage| (damage.path.as_deref(), damage.problem.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            (Some("bent"), "the blob's bytes do not hash to its name"),
            (Some("gone"), "the blob is not in the blob store"),
        ]
    );
    assert_eq!(damages[1].object, format!("blob {}", BlobHash::of(b"gone")));

    // A missing manifest is one damage naming the candidate; an invalid outputs id likewise.
    let manifest = BlobHash::from_content_hash(&candidate.content_hash).unwrap();
    std::fs::remove_file(store.path_of(&manifest)).unwrap();
    let damages = verify_workspace(&mut BlobVerifier::new(store), &candidate).unwrap();
    assert_eq!(damages.len(), 1);
    assert_eq!(damages[0].object, candidate.id);
    let mut outputs = candidate.clone();
    outputs.id = "out_nope".into();
    assert_eq!(
        verify_outputs(&mut BlobVerifier::new(store), &outputs)
            .unwrap()
            .len(),
        1
    );
}
