use super::*;
use crate::DataDir;
use omabox_sandbox::session_inputs::{MemoryFile, MemoryStoreHost};

fn value(spec: &str) -> serde_json::Value {
    serde_json::to_value(parse_resource(spec).unwrap()).unwrap()
}

#[test]
fn file_specs_name_an_id_and_an_absolute_path() {
    assert_eq!(
        value("file:file_0123:/workspace/in.txt"),
        json!({"type": "file", "file_id": "file_0123", "mount_path": "/workspace/in.txt"})
    );
    for bad in ["file:x", "file::/a", "file:x:rel", "file:x:/a/../b"] {
        assert!(parse_resource(bad).is_err(), "{bad}");
    }
}

#[test]
fn git_specs_take_a_branch_or_a_commit() {
    assert_eq!(
        value("git:https://git.test:8443/o/r.git:/workspace/r"),
        json!({"type": "github_repository", "url": "https://git.test:8443/o/r.git",
               "mount_path": "/workspace/r"})
    );
    assert_eq!(
        value("git:https://git.test/r.git@feature/x:/workspace/r")["checkout"],
        json!({"type": "branch", "name": "feature/x"})
    );
    assert_eq!(
        value("git:https://git.test/r.git@0123abcd:/workspace/r")["checkout"],
        json!({"type": "commit", "sha": "0123abcd"})
    );
    // An `@` before the host is user info, left for the materializer to refuse.
    assert_eq!(
        value("git:https://u@git.test/r.git:/workspace/r")["url"],
        "https://u@git.test/r.git"
    );
    for bad in ["git:https://h/r", "git::/w", "git:https://h/r:rel"] {
        assert!(parse_resource(bad).is_err(), "{bad}");
    }
}

#[test]
fn memory_specs_name_a_store_and_its_access() {
    assert_eq!(
        value("memory:notes"),
        json!({"type": "memory_store", "memory_store_id": "notes",
               "mount_path": "/mnt/memory/notes", "access": "read_write"})
    );
    assert_eq!(value("memory:notes:ro")["access"], "read_only");
    for bad in [
        "memory:",
        "memory:../x",
        "memory:a/b",
        "memory:n:rx",
        "dataset:x",
    ] {
        assert!(parse_resource(bad).is_err(), "{bad}");
    }
}

fn file(path: &str, bytes: &[u8]) -> MemoryFile {
    MemoryFile {
        path: path.into(),
        bytes: bytes.to_vec(),
    }
}

#[tokio::test]
async fn memory_stores_are_replaced_whole_and_never_follow_symlinks() {
    let data = tempfile::tempdir().unwrap();
    let stores = DirMemoryStores::new(&DataDir::at(data.path()));
    assert!(stores.load("notes").await.unwrap().is_empty());
    stores
        .replace("notes", vec![file("a.md", b"one"), file("d/b.md", b"two")])
        .await
        .unwrap();
    // Staged until the run's publication.
    assert!(stores.load("notes").await.unwrap().is_empty());
    stores.stage().finish(true).unwrap();
    assert_eq!(
        stores.load("notes").await.unwrap(),
        [file("a.md", b"one"), file("d/b.md", b"two")]
    );
    stores
        .replace("notes", vec![file("c.md", b"three")])
        .await
        .unwrap();
    stores.stage().finish(true).unwrap();
    assert_eq!(
        stores.load("notes").await.unwrap(),
        [file("c.md", b"three")]
    );
    // Nothing but the store is left beside it.
    let names: Vec<_> = std::fs::read_dir(data.path().join("memory"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|name| name != memory_stage::PENDING_DIR)
        .collect();
    assert_eq!(names, ["notes"]);
    assert_eq!(
        std::fs::read_dir(data.path().join("memory").join(memory_stage::PENDING_DIR))
            .unwrap()
            .count(),
        0,
        "a finished stage is removed"
    );
    // A symlink in the store is not followed.
    let secret = data.path().join("secret");
    std::fs::write(&secret, "host secret").unwrap();
    std::os::unix::fs::symlink(&secret, data.path().join("memory/notes/link")).unwrap();
    assert_eq!(
        stores.load("notes").await.unwrap(),
        [file("c.md", b"three")]
    );
    assert!(
        stores
            .replace("notes", vec![file("../escape", b"x")])
            .await
            .is_err()
    );
    assert!(!data.path().join("memory/escape").exists());
    assert!(stores.load("../x").await.is_err());
    // A store that is a symlink is refused, not followed.
    std::os::unix::fs::symlink(data.path(), data.path().join("memory/linked")).unwrap();
    assert!(stores.load("linked").await.is_err());
    assert!(stores.replace("linked", Vec::new()).await.is_err());
}

#[tokio::test]
async fn added_files_are_read_back_by_id() {
    let data = tempfile::tempdir().unwrap();
    let source = data.path().join("in.bin");
    std::fs::write(&source, b"\0bytes\xff").unwrap();
    let added = add_file(&DataDir::at(data.path()), &source).unwrap();
    assert!(added.id.starts_with("file_"));
    let access = PromotedFileAccess::new(PromotedStore::open(data.path()).unwrap());
    let got = access
        .download_file(&added.id, AbortSignal::never())
        .await
        .unwrap();
    assert_eq!(got.content, b"\0bytes\xff");
    let missing = access
        .download_file(
            "file_00000000000000000000000000000000",
            AbortSignal::never(),
        )
        .await
        .unwrap_err();
    assert_eq!(
        missing.message(),
        "no such file in omabox's file store: file_00000000000000000000000000000000"
    );
}

#[test]
fn session_json_holds_contract_shaped_resources_and_metadata() {
    let parsed = SessionInputs::parse(
        r#"{"id": "ignored", "metadata": {"k": "v"}, "resources": [
            {"type": "github_repository", "url": "https://h/r", "mount_path": "/workspace/r",
             "checkout": {"type": "commit", "sha": "abcdef0"}}]}"#,
    )
    .unwrap();
    assert_eq!(parsed.metadata["k"], "v");
    assert_eq!(parsed.resources[0].resource_type, "github_repository");
    assert_eq!(
        parsed.resources[0].fields["checkout"],
        json!({"type": "commit", "sha": "abcdef0"})
    );
    assert!(SessionInputs::parse(r#"{"resources": [{"url": "x"}]}"#).is_err());
}

fn scope(session: &str) -> omabox_contract::RuntimeResourceScope {
    omabox_contract::RuntimeResourceScope::new("local", "default", session, "main")
}

/// A run that died with a stage: the stage's stores and its lock released, its files left.
async fn dead_run(data: &std::path::Path, session: &str, generation: u64, store: &str, text: &str) {
    let stores = DirMemoryStores::new(&DataDir::at(data));
    stores.stage().set_claim(scope(session), generation);
    stores
        .replace(store, vec![file("m.md", text.as_bytes())])
        .await
        .unwrap();
    // Dropped without finish: like a kill -9, the lock goes with the process.
}

#[tokio::test]
async fn a_dead_runs_stage_is_committed_only_if_its_generation_published() {
    let data = tempfile::tempdir().unwrap();
    let committed = DirMemoryStores::new(&DataDir::at(data.path()));
    committed
        .replace("kept", vec![file("m.md", b"old")])
        .await
        .unwrap();
    committed.stage().finish(true).unwrap();
    dead_run(data.path(), "published", 3, "rolled", "new").await;
    dead_run(data.path(), "unpublished", 5, "kept", "never").await;
    // A live run's stage: locked, untouched.
    let live = DirMemoryStores::new(&DataDir::at(data.path()));
    live.stage().set_claim(scope("live"), 1);
    live.replace("live", vec![file("m.md", b"live")])
        .await
        .unwrap();

    let report = memory_stage::recover(&DataDir::at(data.path()), &|claim| {
        Ok(claim.scope.session_id == "published" && claim.generation == 3)
    });
    assert_eq!(report.committed, ["rolled"], "{report:?}");
    assert_eq!((report.discarded, report.live), (1, 1), "{report:?}");
    assert!(report.errors.is_empty(), "{report:?}");
    let load = |id: &'static str| {
        let data = data.path().to_path_buf();
        async move {
            DirMemoryStores::new(&DataDir::at(&data))
                .load(id)
                .await
                .unwrap()
        }
    };
    assert_eq!(load("rolled").await, [file("m.md", b"new")]);
    assert_eq!(load("kept").await, [file("m.md", b"old")]);
    assert!(load("live").await.is_empty());
    let pending = data.path().join("memory").join(memory_stage::PENDING_DIR);
    assert_eq!(
        std::fs::read_dir(&pending).unwrap().count(),
        1,
        "only the live stage"
    );
    live.stage().finish(true).unwrap();
    assert_eq!(load("live").await, [file("m.md", b"live")]);
}

#[tokio::test]
async fn a_recovered_stage_never_overwrites_a_store_changed_after_it() {
    let data = tempfile::tempdir().unwrap();
    dead_run(data.path(), "first", 1, "shared", "from the first run").await;
    // A later run committed the store after the first one died.
    let later = DirMemoryStores::new(&DataDir::at(data.path()));
    later
        .replace("shared", vec![file("m.md", b"from a later run")])
        .await
        .unwrap();
    later.stage().finish(true).unwrap();
    let report = memory_stage::recover(&DataDir::at(data.path()), &|_| Ok(true));
    assert_eq!(report.superseded, ["shared"], "{report:?}");
    assert_eq!(
        DirMemoryStores::new(&DataDir::at(data.path()))
            .load("shared")
            .await
            .unwrap(),
        [file("m.md", b"from a later run")]
    );
}
