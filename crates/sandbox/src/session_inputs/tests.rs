use super::git::{GitClone, valid_sha};
use super::memory::{MemoryResource, parse_scan, valid_relative_path, valid_store_id};
use super::*;
use crate::port::SandboxFileBytesPort;
use omabox_contract::{
    DownloadedSessionFile, ResourceOwnership, RuntimePublicationCandidate, RuntimeResourceFence,
    RuntimeResourceScope, RuntimeSessionSnapshot, SecretString, SessionInputAccessPort,
    WorkspaceBinding,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Mutex;

fn resource(value: serde_json::Value) -> RuntimeSessionResourceSnapshot {
    serde_json::from_value(value).unwrap()
}

/// A sandbox that records commands and files; `exec` answers from a script.
#[derive(Default)]
struct FakeSandbox {
    commands: Mutex<Vec<String>>,
    files: Mutex<BTreeMap<String, Vec<u8>>>,
    answer: Mutex<BTreeMap<&'static str, String>>,
}

#[async_trait]
impl SandboxPort for FakeSandbox {
    async fn exec(&self, command: &str, _timeout_ms: Option<u64>) -> Result<String, PortError> {
        self.commands.lock().unwrap().push(command.to_owned());
        let answers = self.answer.lock().unwrap();
        Ok(answers
            .iter()
            .find(|(prefix, _)| command.contains(*prefix))
            .map(|(_, answer)| answer.clone())
            .unwrap_or_default())
    }
    async fn read_file(&self, _path: &str) -> Result<String, PortError> {
        Err(PortError::new("unused"))
    }
    async fn write_file(&self, _path: &str, _content: &str) -> Result<String, PortError> {
        Err(PortError::new("unused"))
    }
    fn as_file_bytes(&self) -> Option<&dyn SandboxFileBytesPort> {
        Some(self)
    }
}

#[async_trait]
impl SandboxFileBytesPort for FakeSandbox {
    async fn read_file_bytes(&self, path: &str) -> Result<Vec<u8>, PortError> {
        self.files
            .lock()
            .unwrap()
            .get(path)
            .cloned()
            .ok_or_else(|| PortError::new(format!("no {path}")))
    }
    async fn write_file_bytes(&self, path: &str, bytes: &[u8]) -> Result<String, PortError> {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_owned(), bytes.to_vec());
        Ok(path.to_owned())
    }
}

struct Sandboxes(Arc<FakeSandbox>);

#[async_trait]
impl LeaseSandboxes for Sandboxes {
    async fn sandbox(
        &self,
        _lease: &ManagedSandboxLease,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        Ok(Arc::clone(&self.0) as _)
    }
}

struct Files;

#[async_trait]
impl SessionInputAccessPort for Files {
    async fn download_file(
        &self,
        file_id: &str,
        _signal: AbortSignal,
    ) -> Result<DownloadedSessionFile, PortError> {
        match file_id {
            "file_1" => Ok(DownloadedSessionFile {
                content: b"\0binary\xff".to_vec(),
                filename: None,
                mime_type: None,
            }),
            _ => Err(PortError::new(format!("no such file: {file_id}"))),
        }
    }
}

#[derive(Default)]
struct Stores(Mutex<BTreeMap<String, Vec<MemoryFile>>>);

#[async_trait]
impl MemoryStoreHost for Stores {
    async fn load(&self, id: &str) -> Result<Vec<MemoryFile>, PortError> {
        Ok(self.0.lock().unwrap().get(id).cloned().unwrap_or_default())
    }
    async fn replace(&self, id: &str, files: Vec<MemoryFile>) -> Result<(), PortError> {
        self.0.lock().unwrap().insert(id.to_owned(), files);
        Ok(())
    }
}

fn context(resources: Vec<RuntimeSessionResourceSnapshot>) -> SessionInputLifecycleContext {
    SessionInputLifecycleContext {
        scope: RuntimeResourceScope::new("w", "e", "s", "k"),
        fence: RuntimeResourceFence {
            workspace_id: "w".into(),
            environment_id: "e".into(),
            session_id: "s".into(),
            work_id: "k".into(),
            owner_id: "o".into(),
            generation: 1,
            token: SecretString::new("t"),
            expires_at: "2099-01-01T00:00:00.000Z".into(),
        },
        session: RuntimeSessionSnapshot {
            id: "s".into(),
            environment_id: "e".into(),
            metadata: BTreeMap::new(),
            resources,
        },
        sandbox: ManagedSandboxLease {
            provider: "fake".into(),
            runtime_id: "r".into(),
            metadata: None,
        },
        resource_ownership: ResourceOwnership {
            memory_store: MemoryStoreOwnership::Worker,
        },
        access: Some(Arc::new(Files)),
        authorize: Arc::new(|| Box::pin(async { Ok(true) })),
        signal: AbortSignal::never(),
    }
}

fn input(context: SessionInputLifecycleContext) -> MaterializeSessionInputsInput {
    MaterializeSessionInputsInput {
        context,
        workspace: WorkspaceBinding {
            binding_id: "b".into(),
            mount_path: "/workspace".into(),
            metadata: None,
        },
        active_workspace_checkpoint: None,
        idempotency_key: "k:1:session-inputs-materialize".into(),
    }
}

fn materializer(sandbox: &Arc<FakeSandbox>) -> SandboxSessionInputs {
    SandboxSessionInputs::new("fake", Arc::new(Sandboxes(Arc::clone(sandbox))))
}

#[test]
fn quoting_escapes_single_quotes() {
    assert_eq!(shell_quote("a'b"), r#"'a'"'"'b'"#);
    assert_eq!(shell_quote("$(x)"), "'$(x)'");
}

#[test]
fn mount_paths_are_absolute_without_parents() {
    assert!(valid_mount_path("/workspace/a"));
    for bad in ["relative", "/a/../b", "/a/..", "/a\0"] {
        assert!(!valid_mount_path(bad), "{bad:?}");
    }
}

#[test]
fn commit_shas_follow_the_reference() {
    assert!(valid_sha("abcdef1"));
    assert!(valid_sha("ABCDEF1234"));
    for bad in ["", "xyz", "abc123", &"a".repeat(65)] {
        assert!(!valid_sha(bad), "{bad:?}");
    }
}

#[test]
fn git_commands_quote_and_detach() {
    let clone = GitClone::parse(&resource(json!({
        "type": "github_repository", "url": "https://git.test/o/r.git",
        "mount_path": "/workspace/it's", "checkout": {"type": "branch", "name": "dev"}
    })))
    .unwrap();
    assert_eq!(
        clone.clone_command(),
        r#"GIT_TERMINAL_PROMPT=0 git clone --branch 'dev' -- 'https://git.test/o/r.git' '/workspace/it'"'"'s'"#
    );
    assert_eq!(clone.checkout_command(), None);
    let commit = GitClone::parse(&resource(json!({
        "type": "github_repository", "url": "http://git.test/r",
        "mount_path": "/workspace/r", "checkout": {"type": "commit", "sha": "ABCDEF0"}
    })))
    .unwrap();
    assert!(!commit.clone_command().contains("--branch"));
    assert_eq!(
        commit.checkout_command().unwrap(),
        "GIT_TERMINAL_PROMPT=0 git -C '/workspace/r' checkout --detach 'ABCDEF0'"
    );
    let error = |value| {
        GitClone::parse(&resource(value))
            .unwrap_err()
            .message()
            .to_owned()
    };
    assert_eq!(
        error(json!({"type": "github_repository", "url": "not a url", "mount_path": "/w"})),
        "Session github_repository resource has an invalid URL"
    );
    assert_eq!(
        error(json!({"type": "github_repository", "url": "ssh://h/r", "mount_path": "/w"})),
        "Session github_repository resource URL must use HTTP(S)"
    );
    assert!(
        error(json!({"type": "github_repository", "url": "https://u:p@h/r", "mount_path": "/w"}))
            .contains("must not carry credentials")
    );
    assert_eq!(
        error(
            json!({"type": "github_repository", "url": "https://h/r", "mount_path": "/w",
                     "checkout": {"type": "commit", "sha": "abc123"}})
        ),
        "Session github_repository commit checkout is invalid"
    );
}

#[test]
fn labels_name_the_resource_without_credentials() {
    let repo = resource(json!({"type": "github_repository",
        "url": "https://user:pw@git.test:8443/o/r.git?token=x#f", "mount_path": "/w"}));
    assert_eq!(
        label(&repo),
        "github_repository https://git.test:8443/o/r.git"
    );
    let file = resource(json!({"type": "file", "file_id": "f", "mount_path": "/w/\u{1b}x"}));
    assert_eq!(label(&file), "file /w/x");
}

#[tokio::test]
async fn files_are_written_as_bytes_and_failures_name_the_resource() {
    let sandbox = Arc::new(FakeSandbox::default());
    let inputs = materializer(&sandbox);
    let ok =
        resource(json!({"type": "file", "file_id": "file_1", "mount_path": "/workspace/in.bin"}));
    inputs
        .materialize(input(context(vec![ok.clone()])))
        .await
        .unwrap();
    assert_eq!(
        sandbox.files.lock().unwrap()["/workspace/in.bin"],
        b"\0binary\xff".to_vec()
    );
    let missing =
        resource(json!({"type": "file", "file_id": "file_2", "mount_path": "/workspace/x"}));
    let error = inputs
        .materialize(input(context(vec![ok.clone(), missing])))
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Session resource file /workspace/x: no such file: file_2"
    );
    let relative = resource(json!({"type": "file", "file_id": "file_1", "mount_path": "a/../b"}));
    let error = inputs
        .materialize(input(context(vec![relative])))
        .await
        .unwrap_err();
    assert!(
        error
            .message()
            .ends_with("Session resource mount_path must be absolute and may not traverse parents"),
        "{error}"
    );
    let mut no_access = context(vec![ok]);
    no_access.access = None;
    let error = inputs.materialize(input(no_access)).await.unwrap_err();
    assert!(
        error
            .message()
            .ends_with("Session file materialization requires per-claim SessionInputAccessPort")
    );
    let unknown = resource(json!({"type": "dataset"}));
    let error = inputs
        .materialize(input(context(vec![unknown])))
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Session resource dataset: Unsupported Session resource type: dataset"
    );
}

#[tokio::test]
async fn repositories_clone_unless_a_checkpoint_is_active() {
    let sandbox = Arc::new(FakeSandbox::default());
    let inputs = materializer(&sandbox);
    let repo = resource(
        json!({"type": "github_repository", "url": "https://git.test/r.git",
        "mount_path": "/workspace/r", "checkout": {"type": "commit", "sha": "0123456789"}}),
    );
    inputs
        .materialize(input(context(vec![repo.clone()])))
        .await
        .unwrap();
    let commands = sandbox.commands.lock().unwrap().clone();
    assert_eq!(commands.len(), 2, "{commands:?}");
    assert!(commands[0].starts_with("GIT_TERMINAL_PROMPT=0 git clone -- "));
    let mut resumed = input(context(vec![repo.clone()]));
    resumed.active_workspace_checkpoint = Some(RuntimePublicationCandidate {
        id: "c".into(),
        content_hash: "sha256:x".into(),
        metadata: None,
    });
    inputs.materialize(resumed).await.unwrap();
    assert_eq!(sandbox.commands.lock().unwrap().len(), 2);
    sandbox.answer.lock().unwrap().insert(
        "git clone",
        "fatal: repository not found\n[exit 128]".into(),
    );
    let error = inputs
        .materialize(input(context(vec![repo])))
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "Session resource github_repository https://git.test/r.git: git clone failed: fatal: \
         repository not found [exit 128]"
    );
}

#[test]
fn memory_resources_and_paths_are_checked() {
    let store = MemoryResource::parse(&resource(
        json!({"type": "memory_store", "memory_store_id": "notes", "access": "read_only"}),
    ))
    .unwrap();
    assert_eq!(store.mount, "/mnt/memory/notes");
    assert!(store.read_only);
    assert!(valid_store_id("a.b_c-1"));
    for bad in ["", ".hidden", "a/b", "..", &"x".repeat(65)] {
        assert!(!valid_store_id(bad), "{bad:?}");
    }
    assert!(valid_relative_path("a/b.md"));
    for bad in ["", "/a", "a//b", "a/./b", "../a", "a\nb", "a\u{fffd}"] {
        assert!(!valid_relative_path(bad), "{bad:?}");
    }
}

#[test]
fn scans_are_capped_and_only_regular_files_are_taken() {
    let limits = MemoryStoreLimits {
        max_entries: 3,
        max_bytes: 10,
    };
    let files = parse_scan("d 0 dir\0f 4 dir/a.md\0o 0 link\0", &limits).unwrap();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].path, "dir/a.md");
    assert!(parse_scan("f 1 a\0f 1 b\0f 1 c\0f 1 d\0", &limits).is_err());
    assert!(parse_scan("f 11 a\0", &limits).is_err());
    assert_eq!(
        parse_scan("f 1 ../x\0", &limits).unwrap_err().message(),
        "unsafe path"
    );
    assert!(parse_scan("garbage\0", &limits).is_err());
}

#[tokio::test]
async fn memory_stores_round_trip_when_owned() {
    let sandbox = Arc::new(FakeSandbox::default());
    let stores = Arc::new(Stores::default());
    stores.0.lock().unwrap().insert(
        "notes".into(),
        vec![MemoryFile {
            path: "a.md".into(),
            bytes: b"one".to_vec(),
        }],
    );
    let rw = resource(json!({"type": "memory_store", "memory_store_id": "notes",
        "access": "read_write"}));
    // Worker-owned under the host's rule: nothing happens.
    let follow = materializer(&sandbox)
        .with_memory_stores(Arc::clone(&stores) as _, MemoryStorePolicy::FollowHost);
    follow
        .materialize(input(context(vec![rw.clone()])))
        .await
        .unwrap();
    assert!(sandbox.files.lock().unwrap().is_empty());

    let owned = materializer(&sandbox).with_memory_stores(
        Arc::clone(&stores) as _,
        MemoryStorePolicy::AlwaysMaterializer,
    );
    owned
        .materialize(input(context(vec![rw.clone()])))
        .await
        .unwrap();
    assert_eq!(
        sandbox.files.lock().unwrap()["/mnt/memory/notes/a.md"],
        b"one"
    );
    sandbox
        .files
        .lock()
        .unwrap()
        .insert("/mnt/memory/notes/b.md".into(), b"two".to_vec());
    sandbox
        .answer
        .lock()
        .unwrap()
        .insert("find .", "f 3 a.md\0f 3 b.md\0".into());
    owned
        .synchronize(context(vec![rw]), "k".into())
        .await
        .unwrap();
    let paths: Vec<String> = stores.0.lock().unwrap()["notes"]
        .iter()
        .map(|f| f.path.clone())
        .collect();
    assert_eq!(paths, ["a.md", "b.md"]);

    // Read-only: protected in the sandbox, never read back.
    let ro = resource(json!({"type": "memory_store", "memory_store_id": "notes",
        "access": "read_only"}));
    owned
        .materialize(input(context(vec![ro.clone()])))
        .await
        .unwrap();
    assert!(
        sandbox
            .commands
            .lock()
            .unwrap()
            .iter()
            .any(|c| c == "chmod -R a-w '/mnt/memory/notes'")
    );
    stores.0.lock().unwrap().clear();
    owned
        .synchronize(context(vec![ro]), "k".into())
        .await
        .unwrap();
    assert!(stores.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn memory_without_a_host_store_fails_as_the_reference_does() {
    let sandbox = Arc::new(FakeSandbox::default());
    let mut ctx = context(vec![resource(
        json!({"type": "memory_store", "memory_store_id": "m", "access": "read_write"}),
    )]);
    ctx.resource_ownership.memory_store = MemoryStoreOwnership::Materializer;
    let error = materializer(&sandbox)
        .materialize(input(ctx))
        .await
        .unwrap_err();
    assert!(
        error.message().ends_with(
            "fake generic Session input materializer does not implement memory_store synchronization"
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_lost_fence_writes_nothing_back() {
    let sandbox = Arc::new(FakeSandbox::default());
    sandbox
        .files
        .lock()
        .unwrap()
        .insert("/mnt/memory/notes/a.md".into(), b"x".to_vec());
    sandbox
        .answer
        .lock()
        .unwrap()
        .insert("find .", "f 1 a.md\0".into());
    let stores = Arc::new(Stores::default());
    let owned = materializer(&sandbox).with_memory_stores(
        Arc::clone(&stores) as _,
        MemoryStorePolicy::AlwaysMaterializer,
    );
    let mut ctx = context(vec![resource(
        json!({"type": "memory_store", "memory_store_id": "notes"}),
    )]);
    ctx.authorize = Arc::new(|| Box::pin(async { Ok(false) }));
    let error = owned.synchronize(ctx, "k".into()).await.unwrap_err();
    assert_eq!(
        error.message(),
        "Session resource memory_store notes: Runtime resource fence lost during Session input synchronization"
    );
    assert!(stores.0.lock().unwrap().is_empty());
}

#[test]
fn validate_judges_a_resource_as_materializing_would_without_a_sandbox() {
    for (value, expected) in [
        (
            json!({"type": "file", "file_id": "f", "mount_path": "../x"}),
            "Session resource file ../x: Session resource mount_path must be absolute",
        ),
        (
            json!({"type": "file", "mount_path": "/workspace/x"}),
            "Session resource file /workspace/x: Session file resource requires file_id",
        ),
        (
            json!({"type": "memory_store", "memory_store_id": ".."}),
            "requires a memory_store_id",
        ),
        (
            json!({"type": "github_repository", "url": "https://u:p@h/r", "mount_path": "/w"}),
            "must not carry credentials",
        ),
        (
            json!({"type": "dataset"}),
            "Unsupported Session resource type: dataset",
        ),
    ] {
        let error = validate(&resource(value.clone())).unwrap_err();
        assert!(
            error.message().contains(expected),
            "{value}: {}",
            error.message()
        );
    }
    for good in [
        json!({"type": "file", "file_id": "f", "mount_path": "/workspace/x"}),
        json!({"type": "memory_store", "memory_store_id": "notes"}),
        json!({"type": "github_repository", "url": "https://h/r", "mount_path": "/w"}),
    ] {
        assert!(validate(&resource(good.clone())).is_ok(), "{good}");
    }
}
