//! `LinuxSandboxFactory` through the provider map's interface: context binds, env keys,
//! and nothing left behind.

mod common;

use std::sync::Arc;

use common::{Isolated, can_run};
use omabox_backend_linux::factory::{
    CGROUP_PARENT_ENV, INIT_ENV, LinuxSandboxFactory, MEMORY_ENV, PIDS_ENV, RUNTIME_DIR_ENV,
};
use omabox_sandbox::{SandboxFactory, SandboxFactoryContext, SandboxFactoryEnv, SandboxPort};

fn env(iso: &Isolated, extra: &[(&str, &str)]) -> SandboxFactoryEnv {
    let mut pairs = vec![
        (
            RUNTIME_DIR_ENV.to_owned(),
            iso.dir.path().display().to_string(),
        ),
        (CGROUP_PARENT_ENV.to_owned(), iso.cgroup_parent.clone()),
        (
            INIT_ENV.to_owned(),
            common::init_binary().display().to_string(),
        ),
    ];
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    pairs.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_context_becomes_workspace_and_outputs_binds_and_limits_apply() {
    if !can_run() {
        return;
    }
    let iso = Isolated::new();
    let root = tempfile::tempdir().unwrap();
    let ctx = SandboxFactoryContext {
        session_id: "session-1".into(),
        workdir: root.path().join("ws"),
        memory_root: None,
        outputs_root: Some(root.path().join("out")),
    };
    let env = env(&iso, &[(MEMORY_ENV, "96M"), (PIDS_ENV, "40")]);
    let port = LinuxSandboxFactory::new()
        .create_port(&ctx, &env)
        .await
        .expect("create");
    // The limits reached the sandbox's cgroup (v1 or v2 file names).
    let mut seen = Vec::new();
    for dir in &port.identity().cgroup.dirs {
        for file in ["memory.limit_in_bytes", "memory.max", "pids.max"] {
            if let Ok(v) = std::fs::read_to_string(dir.join(file)) {
                seen.push((file, v.trim().to_owned()));
            }
        }
    }
    assert!(
        seen.iter().any(|(_, v)| v == &(96u64 << 20).to_string()),
        "{seen:?}"
    );
    assert!(seen.contains(&("pids.max", "40".to_owned())), "{seen:?}");
    let sandbox: Arc<dyn SandboxPort> = Arc::new(port);
    assert_eq!(sandbox.exec("pwd", None).await.unwrap(), "/workspace");
    sandbox
        .write_file("/workspace/a.txt", "in ws")
        .await
        .unwrap();
    sandbox
        .write_file("/mnt/session/outputs/b.txt", "in out")
        .await
        .unwrap();
    assert_eq!(
        std::fs::read_to_string(root.path().join("ws/a.txt")).unwrap(),
        "in ws"
    );
    assert_eq!(
        std::fs::read_to_string(root.path().join("out/b.txt")).unwrap(),
        "in out"
    );
    assert!(
        sandbox
            .as_session_output_mount()
            .unwrap()
            .session_output_mount_capabilities()
            .is_some()
    );
    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    iso.assert_empty();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_env_value_fails_create_before_anything_starts() {
    let iso = Isolated::new();
    let root = tempfile::tempdir().unwrap();
    let ctx = SandboxFactoryContext {
        session_id: "s".into(),
        workdir: root.path().join("ws"),
        memory_root: None,
        outputs_root: None,
    };
    let err = LinuxSandboxFactory::new()
        .create(&ctx, &env(&iso, &[(MEMORY_ENV, "a lot")]))
        .await
        .err()
        .expect("refused");
    assert!(err.message().starts_with("OMABOX_LINUX_MEMORY="), "{err}");
    iso.assert_empty();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_resumes_its_own_live_sandbox_only() {
    use omabox_backend_linux::factory::LinuxSandboxProvider;
    use omabox_sandbox::SandboxProviderPort;
    if !can_run() {
        return;
    }
    let iso = Isolated::new();
    let root = tempfile::tempdir().unwrap();
    let ctx = SandboxFactoryContext {
        session_id: "s".into(),
        workdir: root.path().join("ws"),
        memory_root: None,
        outputs_root: None,
    };
    let env = env(&iso, &[]);
    let provider = LinuxSandboxProvider::default();
    let sandbox = provider.create(&ctx, &env).await.expect("create");
    let handle = sandbox.as_runtime().expect("runtime port").runtime_handle();
    assert_eq!(handle.provider, "linux");
    let resumed = provider.resume(&handle, &ctx, &env).await.expect("resume");
    resumed.write_file("/workspace/x", "same").await.unwrap();
    assert_eq!(sandbox.read_file("/workspace/x").await.unwrap(), "same");
    drop(resumed);
    sandbox.as_destroy().unwrap().destroy().await.unwrap();
    let err = provider
        .resume(&handle, &ctx, &env)
        .await
        .err()
        .expect("gone");
    assert!(err.message().contains("not running"), "{err}");
    iso.assert_empty();
}
