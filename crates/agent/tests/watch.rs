//! Watching a directory (`AgentClient::watch_dir`), against the agent in-process and as a
//! child process: creates, writes, renames, removes and chmods below the directory,
//! recursion into directories made later, a symlinked directory never followed, refusals,
//! and the watch ending when dropped.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use common::Harness;
use omabox_agent::{DirWatch, ErrorKind, WatchEvent};

/// The next event (bounded wait: a hang fails, no speed is asserted).
async fn next(watch: &mut DirWatch) -> WatchEvent {
    tokio::time::timeout(Duration::from_secs(30), watch.next())
        .await
        .expect("an event within 30 s")
        .expect("the watch works")
        .expect("the watch did not end")
}

/// Events until one matches `(op, name)`; all of them.
async fn until(watch: &mut DirWatch, op: &str, name: &str) -> Vec<WatchEvent> {
    let mut seen = Vec::new();
    loop {
        let event = next(watch).await;
        let done = event.op == op && event.name == name;
        seen.push(event);
        if done {
            return seen;
        }
    }
}

async fn changes_below_a_directory_are_reported(h: Harness) {
    std::fs::create_dir(h.local("w")).unwrap();
    let mut watch = h.client.watch_dir(&h.path("w"), false).await.unwrap();
    std::fs::write(h.local("w/a"), "1").unwrap();
    until(&mut watch, "create", "a").await;
    std::fs::write(h.local("w/a"), "22").unwrap();
    until(&mut watch, "write", "a").await;
    std::fs::set_permissions(h.local("w/a"), std::fs::Permissions::from_mode(0o600)).unwrap();
    until(&mut watch, "chmod", "a").await;
    std::fs::rename(h.local("w/a"), h.local("w/b")).unwrap();
    let seen = until(&mut watch, "create", "b").await;
    assert!(
        seen.iter().any(|e| e.op == "rename" && e.name == "a"),
        "{seen:?}"
    );
    std::fs::remove_file(h.local("w/b")).unwrap();
    until(&mut watch, "remove", "b").await;
    // Not recursive: a subdirectory's own changes are not reported, its creation is.
    std::fs::create_dir(h.local("w/sub")).unwrap();
    until(&mut watch, "create", "sub").await;
    std::fs::write(h.local("w/sub/inner"), "x").unwrap();
    std::fs::write(h.local("w/last"), "x").unwrap();
    let seen = until(&mut watch, "create", "last").await;
    assert!(seen.iter().all(|e| !e.name.contains("inner")), "{seen:?}");
}
both_modes!(changes_below_a_directory_are_reported);

async fn a_recursive_watch_follows_new_directories_but_no_symlink(h: Harness) {
    std::fs::create_dir_all(h.local("r/old")).unwrap();
    std::fs::create_dir(h.local("outside")).unwrap();
    std::os::unix::fs::symlink(h.local("outside"), h.local("r/link")).unwrap();
    let mut watch = h.client.watch_dir(&h.path("r"), true).await.unwrap();
    std::fs::write(h.local("r/old/f"), "1").unwrap();
    until(&mut watch, "create", "old/f").await;
    std::fs::create_dir_all(h.local("r/new/deeper")).unwrap();
    std::fs::write(h.local("outside/secret"), "x").unwrap();
    // A directory made after the watch started is watched too.
    let mut seen = Vec::new();
    for _ in 0..50 {
        std::fs::write(h.local("r/new/deeper/g"), "1").unwrap();
        let event = next(&mut watch).await;
        let found = event.name == "new/deeper/g";
        seen.push(event);
        if found {
            break;
        }
    }
    assert!(seen.iter().any(|e| e.name == "new/deeper/g"), "{seen:?}");
    assert!(seen.iter().all(|e| !e.name.contains("secret")), "{seen:?}");
}
both_modes!(a_recursive_watch_follows_new_directories_but_no_symlink);

async fn what_a_new_directory_already_holds_is_reported_as_created(h: Harness) {
    std::fs::create_dir(h.local("r")).unwrap();
    // Built outside, then moved in whole: the kernel never reports its entries' creation.
    std::fs::create_dir_all(h.local("staging/tree/nested")).unwrap();
    std::fs::write(h.local("staging/tree/a.txt"), "a").unwrap();
    std::fs::write(h.local("staging/tree/nested/b.txt"), "b").unwrap();
    let mut watch = h.client.watch_dir(&h.path("r"), true).await.unwrap();
    std::fs::rename(h.local("staging/tree"), h.local("r/tree")).unwrap();
    let mut seen = until(&mut watch, "create", "tree").await;
    for name in ["tree/a.txt", "tree/nested", "tree/nested/b.txt"] {
        if !seen.iter().any(|e| e.op == "create" && e.name == name) {
            seen.extend(until(&mut watch, "create", name).await);
        }
    }
    // And the moved-in directories are watched from then on.
    std::fs::write(h.local("r/tree/nested/c.txt"), "c").unwrap();
    until(&mut watch, "create", "tree/nested/c.txt").await;
}
both_modes!(what_a_new_directory_already_holds_is_reported_as_created);

async fn a_watch_of_no_directory_is_refused(h: Harness) {
    std::fs::write(h.local("file"), "x").unwrap();
    let error = h
        .client
        .watch_dir(&h.path("file"), false)
        .await
        .unwrap_err();
    assert_eq!(
        error.remote_kind(),
        Some(ErrorKind::InvalidRequest),
        "{error}"
    );
    let error = h
        .client
        .watch_dir(&h.path("missing"), true)
        .await
        .unwrap_err();
    assert_eq!(error.remote_kind(), Some(ErrorKind::NotFound), "{error}");
    // A dropped watch leaves the connection working.
    std::fs::create_dir(h.local("d")).unwrap();
    drop(h.client.watch_dir(&h.path("d"), false).await.unwrap());
    assert!(h.client.stat(&h.path("d")).await.is_ok());
}
both_modes!(a_watch_of_no_directory_is_refused);

async fn events_carry_their_entry_when_asked(h: Harness) {
    use omabox_agent::FileKind;
    std::fs::create_dir(h.local("e")).unwrap();
    std::fs::create_dir(h.local("plain")).unwrap();
    let mut watch = h
        .client
        .watch_dir_with(&h.path("e"), true, true)
        .await
        .unwrap();
    std::fs::write(h.local("e/file"), "12345").unwrap();
    let seen = until(&mut watch, "create", "file").await;
    let entry = seen.last().unwrap().entry.clone().expect("an entry");
    assert_eq!(entry.path, h.path("e/file"));
    assert_eq!(entry.kind, FileKind::File);
    // Read when the event is read: the write may already be there, or not yet.
    assert!(entry.size == 0 || entry.size == 5, "{entry:?}");
    std::fs::create_dir(h.local("e/sub")).unwrap();
    let seen = until(&mut watch, "create", "sub").await;
    assert_eq!(
        seen.last().unwrap().entry.as_ref().unwrap().kind,
        FileKind::Dir
    );
    std::os::unix::fs::symlink("/nonexistent/target", h.local("e/sub/link")).unwrap();
    let seen = until(&mut watch, "create", "sub/link").await;
    let link = seen
        .last()
        .unwrap()
        .entry
        .clone()
        .expect("a symlink's entry");
    assert_eq!(link.kind, FileKind::Symlink, "not followed: {link:?}");
    assert_eq!(link.link_target.as_deref(), Some("/nonexistent/target"));
    std::fs::remove_file(h.local("e/file")).unwrap();
    let seen = until(&mut watch, "remove", "file").await;
    assert_eq!(
        seen.last().unwrap().entry,
        None,
        "a removed path has no entry"
    );
    // Not asked: no entry.
    let mut plain = h.client.watch_dir(&h.path("plain"), false).await.unwrap();
    std::fs::write(h.local("plain/x"), "1").unwrap();
    let seen = until(&mut plain, "create", "x").await;
    assert!(seen.iter().all(|e| e.entry.is_none()), "{seen:?}");
}
both_modes!(events_carry_their_entry_when_asked);
