//! Removing an image against sandboxes starting on it: whoever resolved an image holds it
//! (a shared flock) until its sandbox has recorded the roots it reads; `remove`, `remove_named`
//! and `prune` take that lock exclusively, without waiting, and only then ask who reads the
//! image — so a removal never deletes a tree a start is about to mount.

use std::path::Path;
use std::sync::{Arc, Mutex};

use omabox_image::{ImageCache, ImageError};
use omabox_test_support::registry::tar_layer;

fn tarball(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("rootfs.tar");
    std::fs::write(&path, tar_layer(&[("etc/marker", 0o644, b"marker\n")])).unwrap();
    path
}

#[test]
fn an_image_resolved_for_a_start_is_not_removed_until_the_start_lets_go() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ImageCache::new(dir.path().join("cache"));
    let source = tarball(dir.path());
    let resolved = cache.resolve(&source).unwrap();
    let digest = resolved.digest.clone().unwrap();

    // A start resolved it and has not recorded its roots yet: no user is known, but the
    // removal must not go ahead.
    let e = cache.remove(&digest).unwrap_err();
    assert!(matches!(e, ImageError::Busy { .. }), "{e}");
    assert!(e.to_string().contains("starting"), "{e}");
    assert!(resolved.rootfs_dir.join("etc/marker").is_file());
    let e = cache.remove_named(&digest).unwrap_err();
    assert!(matches!(e, ImageError::Busy { .. }), "{e}");
    assert!(cache.prune().unwrap().is_empty());
    assert!(resolved.rootfs_dir.join("etc/marker").is_file());

    // The start let go (its roots are recorded, or it failed): the removal proceeds.
    drop(resolved);
    assert!(cache.remove(&digest).unwrap());
    assert!(cache.list().unwrap().is_empty());
    // What a later start resolves is whole: unpacked again.
    let again = cache.resolve(&source).unwrap();
    assert!(again.unpacked);
    assert!(again.rootfs_dir.join("etc/marker").is_file());
}

#[test]
fn users_are_asked_once_the_removal_holds_the_image() {
    let dir = tempfile::tempdir().unwrap();
    let source = tarball(dir.path());
    let users: Arc<Mutex<Vec<(String, std::path::PathBuf)>>> = Arc::default();
    let seen = Arc::clone(&users);
    let cache = ImageCache::new(dir.path().join("cache"))
        .with_user_source(move || Ok(seen.lock().unwrap().clone()));
    let resolved = cache.resolve(&source).unwrap();
    let digest = resolved.digest.clone().unwrap();
    // The sandbox records its root after the cache value was made, then lets go of the
    // hold: the removal sees the record.
    users
        .lock()
        .unwrap()
        .push(("sandbox-1".into(), resolved.rootfs_dir.clone()));
    drop(resolved);
    let e = cache.remove(&digest).unwrap_err();
    assert!(
        matches!(&e, ImageError::InUse { sandbox, .. } if sandbox == "sandbox-1"),
        "{e}"
    );
    assert!(cache.prune().unwrap().is_empty());
    users.lock().unwrap().clear();
    assert!(cache.remove(&digest).unwrap());

    // A source that cannot tell refuses the removal rather than guess.
    let failing = ImageCache::new(dir.path().join("cache"))
        .with_user_source(|| Err("the runtime dir is unreadable".into()));
    let digest = failing.resolve(&source).unwrap().digest.unwrap();
    let e = failing.remove(&digest).unwrap_err();
    assert!(
        e.to_string().contains("the runtime dir is unreadable"),
        "{e}"
    );
    assert!(!failing.list().unwrap().is_empty());
}
