//! `BlobStore::remove_abandoned_temps`: the temp files of puts a crash interrupted go, the
//! temp files of puts still running stay.

use omabox_persistence::{BlobStore, TEMP_GRACE};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

fn temp(data: &Path, name: &str, age: Duration) -> PathBuf {
    let path = data.join("blobs/tmp").join(name);
    std::fs::write(&path, b"half a blob").unwrap();
    std::fs::File::options()
        .write(true)
        .open(&path)
        .unwrap()
        .set_modified(SystemTime::now() - age)
        .unwrap();
    path
}

/// A pid that just exited (no process has it now).
fn dead_pid() -> u32 {
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    pid
}

#[test]
fn without_a_put_in_flight_every_temp_file_is_abandoned() {
    let data = tempfile::tempdir().unwrap();
    let store = BlobStore::new(data.path()).unwrap();
    let mine = temp(
        data.path(),
        &format!("put-{}-0-0", std::process::id()),
        Duration::ZERO,
    );
    let other = temp(data.path(), "put-1-0-0", Duration::ZERO);
    assert_eq!(store.remove_abandoned_temps().unwrap(), 2);
    assert!(!mine.exists() && !other.exists());
    // Real blobs are untouched.
    let put = store.put_bytes(b"kept").unwrap();
    assert_eq!(store.remove_abandoned_temps().unwrap(), 0);
    assert_eq!(store.get(&put.hash).unwrap().as_deref(), Some(&b"kept"[..]));
}

#[test]
fn while_a_put_is_in_flight_only_old_temps_of_dead_writers_go() {
    let data = tempfile::tempdir().unwrap();
    let store = BlobStore::new(data.path()).unwrap();
    // A writer holds the shared lock, as every put does.
    let lock = std::fs::File::open(data.path().join("blobs/.lock"))
        .or_else(|_| {
            std::fs::write(data.path().join("blobs/.lock"), b"")?;
            std::fs::File::open(data.path().join("blobs/.lock"))
        })
        .unwrap();
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockShared).unwrap();
    let old = TEMP_GRACE + Duration::from_secs(5);
    let dead = dead_pid();
    let abandoned = temp(data.path(), &format!("put-{dead}-0-0"), old);
    let young = temp(data.path(), &format!("put-{dead}-1-0"), Duration::ZERO);
    let live = temp(data.path(), &format!("put-{}-0-0", std::process::id()), old);
    assert_eq!(store.remove_abandoned_temps().unwrap(), 1);
    assert!(!abandoned.exists());
    assert!(
        young.exists(),
        "a young temp may belong to a writer we cannot see"
    );
    assert!(live.exists(), "a live writer's temp stays");
    drop(lock);
    assert_eq!(store.remove_abandoned_temps().unwrap(), 2);
}

/// In a blob directory several hosts share, another machine's temp file is judged by its age
/// alone: its pid means nothing here, and a lock free here may be held over there.
#[test]
fn another_machines_young_temp_stays_even_when_no_put_is_in_flight_here() {
    let shared = tempfile::tempdir().unwrap();
    let store = BlobStore::at(shared.path()).unwrap();
    let temp_at = |name: &str, age: Duration| {
        let path = shared.path().join("tmp").join(name);
        std::fs::write(&path, b"half a blob").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_modified(SystemTime::now() - age)
            .unwrap();
        path
    };
    let old = TEMP_GRACE + Duration::from_secs(5);
    // pid 1 is alive here, and means another process over there.
    let elsewhere_young = temp_at("put-1-0-0-h0123456789abcdef0", Duration::ZERO);
    let elsewhere_old = temp_at("put-1-1-0-h0123456789abcdef0", old);
    let mine = temp_at(&format!("put-{}-0-0", dead_pid()), Duration::ZERO);
    assert_eq!(store.remove_abandoned_temps().unwrap(), 2);
    assert!(
        elsewhere_young.exists(),
        "another machine's put in progress was removed"
    );
    assert!(!elsewhere_old.exists() && !mine.exists());
    // A put names its temp file with this machine's id, and leaves none behind.
    let put = store.put_bytes(b"shared").unwrap();
    assert!(
        shared
            .path()
            .join("sha256")
            .join(&put.hash.to_hex()[..2])
            .is_dir(),
        "the store is the directory itself, not a blobs/ below it"
    );
}
