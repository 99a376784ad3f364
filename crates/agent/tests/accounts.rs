//! Running as a named account and file operations with an owner (accounts from a test
//! `passwd`/`group`, agent in-process), and the tree operations (make_dir, rename,
//! remove) in both modes.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::{Harness, start_with_accounts};
use omabox_agent::{ErrorKind, ExecOutput, ExecRequest, FileKind, WriteOptions};

const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                      tester:x:4321:4322:Test:@HOME@:/bin/sh\n\
                      homeless:x:4323:4323::/nonexistent/home:/bin/sh\n";
const GROUP: &str = "root:x:0:\ntesters:x:4322:\n";

fn text(out: &ExecOutput) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Changing identity needs root (CAP_SETUID, CAP_CHOWN).
fn is_root() -> bool {
    omabox_test_support::require_capability(
        // SAFETY: geteuid has no preconditions.
        (unsafe { libc::geteuid() } != 0).then(|| "running as a named user needs root".into()),
    )
}

/// A harness whose `tester` account's home is `<workdir>/home` (traversable by it).
async fn with_tester() -> Harness {
    // The home's path is known once the harness's directory is: the passwd is rewritten.
    let h = start_with_accounts(PASSWD, GROUP).await;
    let home = h.local("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::set_permissions(h.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&home, Some(4321), Some(4322)).unwrap();
    let passwd = PASSWD.replace("@HOME@", &home.to_string_lossy());
    std::fs::write(h.etc.as_ref().unwrap().path().join("passwd"), passwd).unwrap();
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_runs_as_the_named_user() {
    if !is_root() {
        return;
    }
    let h = with_tester().await;
    let home = h.path("home");
    let script = "id -u; id -g; id -G; echo $HOME $USER $LOGNAME; pwd; touch ~/mine";
    let out = h
        .client
        .exec(ExecRequest::shell(script).user("tester"))
        .await
        .unwrap();
    assert!(out.success(), "{}", out.combined());
    assert_eq!(
        text(&out),
        format!("4321\n4322\n4322\n{home} tester tester\n{home}\n")
    );
    assert_eq!(std::fs::metadata(h.local("home/mine")).unwrap().uid(), 4321);
    // The request's own HOME wins; an explicit cwd wins over the home.
    let out = h
        .client
        .exec(
            ExecRequest::shell("echo $HOME; pwd")
                .user("tester")
                .env("HOME", "/elsewhere")
                .cwd("/"),
        )
        .await
        .unwrap();
    assert_eq!(text(&out), "/elsewhere\n/\n");
    // No home directory: the cwd is `/`.
    let out = h
        .client
        .exec(ExecRequest::shell("id -u; pwd").user("homeless"))
        .await
        .unwrap();
    assert_eq!(text(&out), "4323\n/\n");
    // root, as listed.
    let out = h
        .client
        .exec(ExecRequest::shell("id -u; echo $HOME").user("root"))
        .await
        .unwrap();
    assert_eq!(text(&out), "0\n/root\n");
    // Background processes too.
    let bg = h
        .client
        .start_background(ExecRequest::shell("id -u").user("tester"))
        .await
        .unwrap();
    common::eventually("the background process's output", || {
        let bg = bg.clone();
        async move { bg.logs().await.unwrap().stdout == "4321\n" }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_user_is_not_found() {
    let h = start_with_accounts(PASSWD, GROUP).await;
    let e = h
        .client
        .exec(ExecRequest::shell("true").user("nobody-here"))
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
    let omabox_agent::ClientError::Remote(remote) = &e else {
        panic!("not a remote error: {e:?}");
    };
    assert_eq!(remote.message, "user \"nobody-here\" not found");
    let e = h
        .client
        .start_background(ExecRequest::shell("true").user("nobody-here"))
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
    let e = h
        .client
        .make_dir(&h.path("d"), Some("nobody-here"))
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
    assert!(!h.local("d").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_written_and_made_with_an_owner() {
    if !is_root() {
        return;
    }
    let h = with_tester().await;
    let opts = WriteOptions {
        owner: Some("tester".into()),
        ..WriteOptions::default()
    };
    std::fs::create_dir(h.local("pre")).unwrap();
    let path = h.path("pre/new/deeper/f.txt");
    h.client.write_file_bytes(&path, "x", opts).await.unwrap();
    for created in ["pre/new", "pre/new/deeper", "pre/new/deeper/f.txt"] {
        let m = std::fs::metadata(h.local(created)).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 4322), "{created}");
    }
    // A directory the write did not create keeps its owner.
    assert_eq!(std::fs::metadata(h.local("pre")).unwrap().uid(), 0);
    let st = h.client.stat(&path).await.unwrap();
    assert_eq!((st.uid, st.gid), (4321, 4322));
    assert_eq!(st.owner.as_deref(), Some("tester"));
    assert_eq!(st.group.as_deref(), Some("testers"));
    let list = h.client.list_dir(&h.path("pre/new")).await.unwrap();
    assert_eq!(list[0].owner.as_deref(), Some("tester"));
    assert_eq!(list[0].group.as_deref(), Some("testers"));
    assert_eq!(list[0].uid, 4321);

    assert!(
        h.client
            .make_dir(&h.path("made/a/b"), Some("tester"))
            .await
            .unwrap()
    );
    for made in ["made", "made/a", "made/a/b"] {
        let m = std::fs::metadata(h.local(made)).unwrap();
        assert_eq!((m.uid(), m.gid()), (4321, 4322), "{made}");
        assert_eq!(m.permissions().mode() & 0o777, 0o755, "{made}");
    }
    // Unlisted ids have no names.
    std::os::unix::fs::chown(h.local("made"), Some(777), Some(778)).unwrap();
    let st = h.client.stat(&h.path("made")).await.unwrap();
    assert_eq!((st.uid, st.gid, st.owner, st.group), (777, 778, None, None));
}

async fn make_dir_reports_created_or_existing(h: Harness) {
    assert!(h.client.make_dir(&h.path("a/b/c"), None).await.unwrap());
    assert!(h.local("a/b/c").is_dir());
    assert!(!h.client.make_dir(&h.path("a/b/c"), None).await.unwrap());
    assert!(!h.client.make_dir(&h.path("a"), None).await.unwrap());
    std::fs::write(h.local("file"), b"x").unwrap();
    let e = h.client.make_dir(&h.path("file"), None).await.unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::AlreadyExists));
    let e = h
        .client
        .make_dir(&h.path("file/below"), None)
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::AlreadyExists));
    assert_eq!(std::fs::read(h.local("file")).unwrap(), b"x");
}
both_modes!(make_dir_reports_created_or_existing);

async fn rename_moves_and_names_a_missing_parent(h: Harness) {
    std::fs::write(h.local("old"), b"content").unwrap();
    h.client
        .rename(&h.path("old"), &h.path("new"))
        .await
        .unwrap();
    assert!(!h.local("old").exists());
    assert_eq!(std::fs::read(h.local("new")).unwrap(), b"content");
    let e = h
        .client
        .rename(&h.path("new"), &h.path("no/such/parent"))
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
    let e = h
        .client
        .rename(&h.path("gone"), &h.path("x"))
        .await
        .unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
}
both_modes!(rename_moves_and_names_a_missing_parent);

async fn remove_takes_a_tree_but_never_what_its_symlinks_point_at(h: Harness) {
    // Outside the tree: a directory with a file, reached by symlinks inside it.
    std::fs::create_dir(h.local("outside")).unwrap();
    std::fs::write(h.local("outside/keep"), b"keep").unwrap();
    std::fs::create_dir_all(h.local("tree/sub/deeper")).unwrap();
    std::fs::write(h.local("tree/f"), b"1").unwrap();
    std::fs::write(h.local("tree/sub/deeper/g"), b"2").unwrap();
    std::os::unix::fs::symlink(h.local("outside"), h.local("tree/sub/link")).unwrap();
    std::os::unix::fs::symlink(h.local("outside/keep"), h.local("tree/filelink")).unwrap();
    // A read-only directory inside is still emptied.
    std::fs::set_permissions(
        h.local("tree/sub/deeper"),
        std::fs::Permissions::from_mode(0o555),
    )
    .unwrap();
    h.client.remove(&h.path("tree")).await.unwrap();
    assert!(!h.local("tree").exists());
    assert_eq!(std::fs::read(h.local("outside/keep")).unwrap(), b"keep");

    // A symlink to a directory: the link goes, the directory stays.
    std::os::unix::fs::symlink(h.local("outside"), h.local("dirlink")).unwrap();
    h.client.remove(&h.path("dirlink")).await.unwrap();
    assert!(h.local("dirlink").symlink_metadata().is_err());
    assert!(h.local("outside/keep").is_file());
    // A file, then a missing path.
    h.client.remove(&h.path("outside/keep")).await.unwrap();
    assert!(!h.local("outside/keep").exists());
    let e = h.client.remove(&h.path("outside/keep")).await.unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::NotFound));
    let e = h.client.remove("/").await.unwrap_err();
    assert_eq!(e.remote_kind(), Some(ErrorKind::InvalidRequest));
    let st = h.client.stat(&h.path("outside")).await.unwrap();
    assert_eq!(st.kind, FileKind::Dir);
}
both_modes!(remove_takes_a_tree_but_never_what_its_symlinks_point_at);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_belongs_to_the_user_in_it() {
    if !is_root() {
        return;
    }
    let h = with_tester().await;
    let mut process = h
        .client
        .spawn(
            ExecRequest::shell("stat -c '%u:%g' \"$(tty)\"")
                .user("tester")
                .pty(80, 24),
        )
        .await
        .unwrap();
    let mut stdout = process.stdout.take().unwrap();
    let output = stdout.read_to_string_lossy().await.unwrap();
    assert!(process.wait().await.unwrap().code == Some(0), "{output}");
    assert_eq!(output.trim(), "4321:4322", "{output:?}");
}
