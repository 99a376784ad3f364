//! Lifecycle of the linux sandbox: directory rootfs (overlay), start failures that leave
//! nothing behind, liveness, idempotent teardown.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Sandboxed, can_run, runtime, test_plan};
use omabox_agent::client::ExecRequest;
use omabox_linux_sandbox::{RootfsSource, StartError};

/// A tiny rootfs: the host's dash as /bin/sh plus the libraries it links.
fn tiny_rootfs(dir: &Path) {
    let copy = |from: &Path, to: PathBuf| {
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(from, &to).unwrap();
    };
    let sh = std::fs::canonicalize("/bin/sh").unwrap();
    copy(&sh, dir.join("bin/sh"));
    let ldd = std::process::Command::new("ldd").arg(&sh).output().unwrap();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)" or "/lib64/ld-linux… (0x…)"
        let path = line
            .split_whitespace()
            .find(|w| w.starts_with('/'))
            .map(PathBuf::from);
        if let Some(p) = path {
            copy(&p, dir.join(p.strip_prefix("/").unwrap()));
        }
    }
    std::fs::create_dir_all(dir.join("etc")).unwrap();
    std::fs::write(dir.join("etc/image-marker"), "from-image\n").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn directory_rootfs_is_a_writable_overlay_that_leaves_the_image_untouched() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tiny_rootfs(image.path());
    let mut plan = test_plan();
    plan.rootfs = RootfsSource::Directory {
        path: image.path().to_path_buf(),
    };
    let mut sb = Sandboxed::start(plan).await;
    let out = sb
        .ok("read m < /etc/image-marker; echo new > /etc/written; read w < /etc/written; echo $m $w")
        .await;
    assert_eq!(out, "from-image new");
    assert!(
        !image.path().join("etc/written").exists(),
        "write reached the image"
    );
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_mount_target_in_the_image_is_refused_and_nothing_is_left() {
    if !can_run() {
        return;
    }
    let image = tempfile::tempdir().unwrap();
    tiny_rootfs(image.path());
    // An image trying to redirect the workspace bind onto its own /etc (or worse).
    std::os::unix::fs::symlink("/etc", image.path().join("workspace")).unwrap();
    let ws = tempfile::tempdir().unwrap();
    let mut plan = test_plan();
    plan.rootfs = RootfsSource::Directory {
        path: image.path().to_path_buf(),
    };
    plan.workspace = Some(ws.path().to_path_buf());
    let iso = common::Isolated::new();
    let err = iso.runtime().start(&plan).unwrap_err();
    assert!(
        matches!(&err, StartError::Setup(m) if m.contains("symlink")),
        "unexpected error: {err}"
    );
    iso.assert_empty();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_setup_reports_why_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    let mut plan = test_plan();
    plan.workspace = Some(PathBuf::from("/nonexistent/omabox/workspace"));
    let iso = common::Isolated::new();
    let err = iso.runtime().start(&plan).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("/nonexistent/omabox/workspace"), "{msg}");
    iso.assert_empty();
}

#[test]
fn an_init_binary_that_cannot_exec_reports_the_errno_and_leaves_nothing() {
    if !can_run() {
        return;
    }
    // A file that exists but is not executable: the cloned child's execve fails (EACCES)
    // and it reports the errno itself, between clone and exec.
    let iso = common::Isolated::new();
    let bogus = iso.dir.path().join("not-executable");
    std::fs::write(&bogus, "not a program").unwrap();
    let rt = omabox_linux_sandbox::LinuxRuntime::new(omabox_linux_sandbox::RuntimeConfig {
        runtime_dir: iso.dir.path().join("run"),
        cgroup_parent: iso.cgroup_parent.clone(),
        init_binary: Some(bogus.clone()),
        ..Default::default()
    })
    .unwrap();
    let err = rt.start(&test_plan()).unwrap_err();
    assert!(
        matches!(&err, StartError::Exec(e) if e.raw_os_error() == Some(libc::EACCES)),
        "{err:?}"
    );
    std::fs::remove_file(&bogus).unwrap();
    std::fs::remove_dir(iso.dir.path().join("run")).unwrap();
    iso.assert_empty();
}

#[test]
fn a_missing_init_binary_is_a_clear_error() {
    let err = omabox_linux_sandbox::LinuxRuntime::new(omabox_linux_sandbox::RuntimeConfig {
        init_binary: Some(PathBuf::from("/nonexistent/omabox-sandbox-init")),
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        err.to_string().contains("omabox-sandbox-init not found"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_follows_the_sandbox_and_destroy_is_idempotent() {
    if !can_run() {
        return;
    }
    let mut sb = Sandboxed::start(test_plan()).await;
    let sandbox = sb.sandbox.as_mut().unwrap();
    assert!(sandbox.is_alive());
    assert!(sb.identity.is_alive());
    sandbox.kill().unwrap();
    assert!(!sandbox.is_alive());
    sandbox.destroy().unwrap();
    sandbox.destroy().unwrap();
    let out = sb.identity.destroy(Duration::from_secs(5)).unwrap();
    assert!(!out.killed);
    common::assert_gone(&sb.identity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_agent_stream_ends_the_sandbox() {
    if !can_run() {
        return;
    }
    let rt = runtime();
    let mut sandbox = tokio::task::spawn_blocking(move || rt.start(&test_plan()))
        .await
        .unwrap()
        .unwrap();
    drop(sandbox.take_agent_stream());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while sandbox.is_alive() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!sandbox.is_alive(), "agent kept running without its host");
    let identity = sandbox.identity().clone();
    sandbox.destroy().unwrap();
    common::assert_gone(&identity);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_user_account_has_a_writable_home_of_its_own() {
    if !can_run() {
        return;
    }
    let run = |sb: &Sandboxed, user: &str, script: &str| {
        let req = ExecRequest::shell(script)
            .user(user)
            .timeout(Duration::from_secs(60));
        let client = sb.client.clone();
        async move { client.exec(req).await }
    };
    let mut plan = test_plan();
    plan.user_home = true;
    let mut sb = Sandboxed::start(plan).await;
    let script = "id -u; echo $HOME; pwd; touch /home/user/x";
    let out = run(&sb, "user", script).await.expect("exec as user");
    assert!(out.success(), "{:?}: {}", out.exit, out.combined());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n/home/user\n/home/user\n"
    );
    let out = run(&sb, "root", "id -u; echo $HOME; touch /home/user/y")
        .await
        .expect("exec as root");
    assert!(out.success(), "{:?}: {}", out.exit, out.combined());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0\n/root\n");
    let shell = if Path::new("/bin/bash").is_file() {
        "/bin/bash"
    } else {
        "/bin/sh"
    };
    // The agent's file operations give files to the account.
    let opts = omabox_agent::client::WriteOptions {
        owner: Some("user".into()),
        ..Default::default()
    };
    sb.client
        .write_file_bytes("/home/user/new/w.txt", "w", opts)
        .await
        .expect("write as user");
    assert!(
        sb.client
            .make_dir("/home/user/made", Some("user"))
            .await
            .expect("make_dir")
    );
    let st = sb.client.stat("/home/user/new/w.txt").await.expect("stat");
    assert_eq!((st.uid, st.owner.as_deref()), (1000, Some("user")));
    assert_eq!(
        sb.ok("stat -c '%u %g' /home/user/new /home/user/made")
            .await,
        "1000 1000\n1000 1000"
    );
    sb.client.remove("/home/user/new").await.expect("remove");
    assert_eq!(
        sb.ok("stat -c '%u %g %a' /home/user /home/user/x /home/user/y; grep '^user:' /etc/passwd /etc/group")
            .await,
        format!(
            "1000 1000 755\n1000 1000 644\n0 0 644\n\
             /etc/passwd:user:x:1000:1000:user:/home/user:{shell}\n/etc/group:user:x:1000:"
        )
    );
    sb.destroy();

    // Without the switch there is no such account.
    let mut sb = Sandboxed::start(test_plan()).await;
    let err = run(&sb, "user", "true").await.unwrap_err();
    assert_eq!(err.remote_kind(), Some(omabox_agent::ErrorKind::NotFound));
    sb.destroy();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_root_gets_the_user_account_without_touching_host_files() {
    if !can_run() {
        return;
    }
    let exec = |sb: &Sandboxed, user: &str, script: &str| {
        let req = ExecRequest::shell(script)
            .user(user)
            .timeout(Duration::from_secs(60));
        let client = sb.client.clone();
        async move { client.exec(req).await }
    };
    // Only dash inside: its builtins read /proc and the account files.
    let uid = "while read k v rest; do [ \"$k\" = Uid: ] && echo $v; done < /proc/self/status";
    let image = tempfile::tempdir().unwrap();
    tiny_rootfs(image.path());
    std::fs::write(
        image.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/sh",
    )
    .unwrap();
    let mut plan = test_plan();
    plan.rootfs = RootfsSource::Directory {
        path: image.path().to_path_buf(),
    };
    plan.user_home = true;
    let mut sb = Sandboxed::start(plan.clone()).await;
    let out = exec(
        &sb,
        "user",
        &format!("{uid}; echo $HOME; echo x > ~/x && echo ok"),
    )
    .await
    .expect("exec as user");
    assert!(out.success(), "{:?}: {}", out.exit, out.combined());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "1000\n/home/user\nok\n"
    );
    assert_eq!(
        sb.ok("while read l; do echo \"$l\"; done < /etc/passwd")
            .await,
        "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/home/user:/bin/sh"
    );
    sb.destroy();
    assert_eq!(
        std::fs::read_to_string(image.path().join("etc/passwd")).unwrap(),
        "root:x:0:0:root:/root:/bin/sh",
        "the image itself is untouched"
    );

    // An image whose passwd and group point at host files: resolved inside the image,
    // the host files stay as they were.
    let host = tempfile::tempdir().unwrap();
    let host_passwd = host.path().join("passwd");
    std::fs::write(&host_passwd, "host:x:0:0::/:/bin/sh\n").unwrap();
    std::fs::remove_file(image.path().join("etc/passwd")).unwrap();
    std::os::unix::fs::symlink(&host_passwd, image.path().join("etc/passwd")).unwrap();
    std::os::unix::fs::symlink(&host_passwd, image.path().join("etc/group")).unwrap();
    let mut sb = Sandboxed::start(plan).await;
    let err = exec(&sb, "user", "true").await.unwrap_err();
    assert_eq!(err.remote_kind(), Some(omabox_agent::ErrorKind::NotFound));
    sb.destroy();
    assert_eq!(
        std::fs::read_to_string(&host_passwd).unwrap(),
        "host:x:0:0::/:/bin/sh\n"
    );
}
