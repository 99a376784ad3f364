//! The data directory's integrity, driven through the `omabox` binary: an existing database
//! that is not a healthy omabox store is refused (never recreated), read-only commands never
//! create a data directory, and a read-only data directory is named as such.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn omabox(data_dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .output()
        .expect("the omabox binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Every command that opens the store refuses `db` with a message naming it and containing
/// `expected`, and leaves the file exactly as it was.
fn refused_by_every_command(data_dir: &Path, expected: &str) {
    let db = data_dir.join("omabox.db");
    let before = std::fs::read(&db).unwrap();
    for args in [
        &["sessions"][..],
        &["sessions", "--json"],
        &["usage"],
        &["outputs", "--session", "s"],
        &["vault", "names"],
        &["run", "--backend", "local", "--", "true"],
    ] {
        let output = omabox(data_dir, args);
        let text = stderr(&output);
        assert!(
            !output.status.success(),
            "{args:?} succeeded: {}",
            stdout(&output)
        );
        assert!(text.contains(&db.display().to_string()), "{args:?}: {text}");
        assert!(text.contains(expected), "{args:?}: {text}");
        assert!(!text.contains("panicked"), "{args:?}: {text}");
        assert_eq!(
            std::fs::read(&db).unwrap(),
            before,
            "{args:?} modified the file"
        );
    }
}

fn data_dir_with_db(bytes: &[u8]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("omabox.db"), bytes).unwrap();
    (dir, data)
}

#[test]
fn an_empty_database_file_is_refused_not_recreated() {
    let (_dir, data) = data_dir_with_db(b"");
    refused_by_every_command(&data, "empty (0 bytes)");
    let output = omabox(&data, &["sessions"]);
    assert!(
        stderr(&output).contains("move it aside"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn a_garbage_database_file_is_refused() {
    let (_dir, data) = data_dir_with_db(&[0x42; 10_000]);
    refused_by_every_command(&data, "not a SQLite database");
}

#[test]
fn another_applications_sqlite_database_is_refused() {
    let (_dir, data) = data_dir_with_db(b"");
    let db = data.join("omabox.db");
    std::fs::remove_file(&db).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE bookmarks (url TEXT); INSERT INTO bookmarks VALUES ('x');")
        .unwrap();
    drop(conn);
    refused_by_every_command(&data, "is not an omabox store database");
}

#[test]
fn a_database_from_a_newer_omabox_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let created = omabox(&data, &["vault", "put", "k"]);
    assert!(!created.status.success(), "an empty stdin is refused");
    let db = data.join("omabox.db");
    assert!(db.is_file(), "vault put creates the store");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let version: u32 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .unwrap();
    conn.pragma_update(None, "user_version", version + 1)
        .unwrap();
    drop(conn);
    refused_by_every_command(&data, "upgrade omabox");
}

#[test]
fn a_database_failing_its_integrity_check_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let db = data.join("omabox.db");
    // A real store (made by the binary), then grown and damaged in its middle pages.
    let _ = omabox(&data, &["vault", "put", "k"]);
    {
        let conn = rusqlite::Connection::open(&db).unwrap();
        conn.execute_batch(
            "WITH RECURSIVE c(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM c WHERE n < 2000)
             INSERT INTO vault_secret SELECT printf('name-%d', n), zeroblob(200), 0, 0 FROM c;
             PRAGMA wal_checkpoint(TRUNCATE);",
        )
        .unwrap();
    }
    let mut bytes = std::fs::read(&db).unwrap();
    assert!(bytes.len() > 16 * 4096, "{}", bytes.len());
    bytes[8 * 4096..12 * 4096].fill(0xa5);
    std::fs::write(&db, &bytes).unwrap();
    refused_by_every_command(&data, "is damaged");
}

#[test]
fn read_only_commands_on_a_missing_data_dir_say_so_and_create_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("never-used");
    for (args, expected) in [
        (&["sessions"][..], "no data yet"),
        (&["sessions", "--json"], "[]"),
        (&["usage"], "no data yet"),
        (&["usage", "--json"], "[]"),
        (&["outputs", "--session", "s"], "no data yet"),
        (&["outputs", "--session", "s", "--json"], "[]"),
        (&["vault", "names", "--json"], "[]"),
    ] {
        let output = omabox(&data, args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        assert!(
            stdout(&output).contains(expected),
            "{args:?}: {}",
            stdout(&output)
        );
        assert!(!data.exists(), "{args:?} created the data directory");
    }
    let export = omabox(
        &data,
        &[
            "workspace",
            "export",
            "--session",
            "s",
            dir.path().join("out").to_str().unwrap(),
        ],
    );
    assert!(!export.status.success());
    assert!(
        stderr(&export).contains("no data yet"),
        "{}",
        stderr(&export)
    );
    assert!(!data.exists(), "export created the data directory");

    // A command that writes creates it.
    let mut put = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(&data)
        .args(["vault", "put", "k"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    put.stdin.take().unwrap().write_all(b"value").unwrap();
    assert!(put.wait().unwrap().success());
    assert!(data.join("omabox.db").is_file());
}

#[test]
fn a_read_only_data_dir_is_named_as_such() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    // `chattr +i`: even root cannot create files in the directory.
    let set = Command::new("chattr").arg("+i").arg(&data).status();
    if !set.is_ok_and(|status| status.success()) {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and chattr +i does not work here"
        );
        eprintln!("SKIPPED: chattr +i does not work here");
        return;
    }
    let output = omabox(&data, &["run", "--backend", "local", "--", "true"]);
    let _ = Command::new("chattr").arg("-i").arg(&data).status();
    let text = stderr(&output);
    assert!(!output.status.success());
    assert!(text.contains("is not writable"), "{text}");
    assert!(text.contains(&data.display().to_string()), "{text}");
    assert!(!text.contains("cannot create the store database"), "{text}");
}

/// A small tmpfs mounted on a fresh temporary directory, unmounted when dropped. `None`
/// (printed reason; a failure under `CI=true`) where this process cannot mount.
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status();
        let mounted = status.is_ok_and(|status| status.success());
        if !omabox_test_support::require_capability(
            (!mounted).then(|| "cannot mount a tmpfs here (needs root)".to_owned()),
        ) {
            return None;
        }
        Some(Self { dir })
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Fills the filesystem: one file takes every block left.
    fn fill(&self) {
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", self.path().join("filler").display()))
            .stderr(std::process::Stdio::null())
            .status();
    }

    fn remount(&self, option: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{option}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(status.success(), "remount {option}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

fn vault_put(data_dir: &Path, value: &[u8]) -> Output {
    use std::io::Write as _;
    let mut child = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(data_dir)
        .args(["vault", "put", "k"])
        .env_remove("OMABOX_DATA_DIR")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let _ = child.stdin.take().unwrap().write_all(value);
    child.wait_with_output().unwrap()
}

/// `omabox run` (local) and `vault put` on `data`, each refused with `expected` naming `named`.
fn writers_refused(data: &Path, named: &Path, expected: &str) {
    for output in [
        omabox(data, &["run", "--backend", "local", "--", "true"]),
        vault_put(data, b"value"),
    ] {
        let text = stderr(&output);
        assert!(!output.status.success(), "{text}");
        assert!(text.contains(expected), "{text}");
        assert!(text.contains(&named.display().to_string()), "{text}");
        assert!(!text.contains("xShmMap"), "{text}");
        assert!(
            !text.contains("fence claim"),
            "refused before a fence: {text}"
        );
    }
}

#[test]
fn a_full_filesystem_is_named_as_such() {
    let Some(fs) = Tmpfs::mount("2m") else {
        return;
    };
    // An existing store on a filesystem that then filled up.
    let data = fs.path().join("data");
    let first = omabox(&data, &["run", "--backend", "local", "--", "true"]);
    assert!(first.status.success(), "{}", stderr(&first));
    fs.fill();
    writers_refused(&data, &data, "no space left on device");
    // Reading commands too (SQLite's WAL index cannot grow).
    let output = omabox(&data, &["sessions"]);
    assert!(
        output.status.success() || stderr(&output).contains("no space left on device"),
        "{}",
        stderr(&output)
    );
    // A new data directory on the full filesystem.
    let _ = std::fs::remove_dir_all(&data);
    fs.fill();
    let fresh = fs.path().join("fresh");
    writers_refused(&fresh, &fresh, "no space left on device");
}

#[test]
fn a_data_dir_on_a_read_only_filesystem_is_named_as_such() {
    let Some(fs) = Tmpfs::mount("8m") else {
        return;
    };
    let data = fs.path().join("data");
    let first = omabox(&data, &["run", "--backend", "local", "--", "true"]);
    assert!(first.status.success(), "{}", stderr(&first));
    fs.remount("ro");
    writers_refused(&data, &data, "is not writable");
    // Reading still works.
    let sessions = omabox(&data, &["sessions"]);
    assert!(sessions.status.success(), "{}", stderr(&sessions));
    // A new data directory there cannot be created.
    let fresh = fs.path().join("fresh");
    writers_refused(&fresh, &fresh, "is not writable");
    fs.remount("rw");
}

/// `true` as root; otherwise a printed skip (a failure under `CI=true`).
fn root() -> bool {
    omabox_test_support::require_capability(
        // SAFETY: geteuid has no preconditions.
        (unsafe { libc::geteuid() } != 0).then(|| "needs root (chown)".to_owned()),
    )
}

fn chown(path: &Path, uid: u32) {
    std::os::unix::fs::chown(path, Some(uid), None).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
fn a_data_dir_another_user_owns_or_can_change_is_refused() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    let refused = |expected: &str| {
        for args in [
            &["run", "--backend", "local", "--", "true"][..],
            &["sessions"],
        ] {
            let output = omabox(&data, args);
            let text = stderr(&output);
            assert!(!output.status.success(), "{args:?}: {text}");
            assert!(text.contains(expected), "{args:?}: {text}");
            assert!(
                text.contains(&data.display().to_string()),
                "{args:?}: {text}"
            );
        }
        assert!(!data.join("omabox.db").exists(), "nothing was created");
    };
    // Another user's directory.
    chown(&data, 65534);
    refused("belongs to uid 65534, not to this user (uid 0)");
    chown(&data, 0);
    // Writable by others.
    chmod(&data, 0o777);
    refused("is writable by other users (mode 777)");
    chmod(&data, 0o700);
    // Inside a directory others can rename entries of (no sticky bit).
    chmod(dir.path(), 0o777);
    refused("which other users can change");
    chmod(dir.path(), 0o1777);
    let output = omabox(&data, &["run", "--backend", "local", "--", "true"]);
    assert!(
        output.status.success(),
        "sticky is fine: {}",
        stderr(&output)
    );
    chmod(dir.path(), 0o700);

    // A user running omabox on root's data directory is told whose it is.
    use std::os::unix::process::CommandExt as _;
    chmod(dir.path(), 0o755);
    let output = Command::new(env!("CARGO_BIN_EXE_omabox"))
        .arg("--data-dir")
        .arg(&data)
        .arg("sessions")
        .env_remove("OMABOX_DATA_DIR")
        .uid(65534)
        .gid(65534)
        .output();
    // The binary must be where uid 65534 can run it (it is, under /work or a tempdir).
    let output = output.expect("uid 65534 can run the omabox binary");
    let text = stderr(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains("belongs to uid 0, not to this user (uid 65534)"),
        "{text}"
    );
}

#[test]
fn a_symlinked_data_dir_is_resolved_once_and_checked_where_it_points() {
    if !root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    std::fs::create_dir(&real).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let output = omabox(&link, &["run", "--backend", "local", "--", "true"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        real.join("omabox.db").is_file(),
        "the store is where the link points"
    );

    // A link to another user's directory is refused, naming both.
    let foreign = dir.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    chown(&foreign, 65534);
    let to_foreign = dir.path().join("to-foreign");
    std::os::unix::fs::symlink(&foreign, &to_foreign).unwrap();
    let output = omabox(&to_foreign, &["run", "--backend", "local", "--", "true"]);
    let text = stderr(&output);
    assert!(!output.status.success(), "{text}");
    assert!(text.contains("belongs to uid 65534"), "{text}");
    assert!(text.contains(&to_foreign.display().to_string()), "{text}");
    assert!(text.contains(&foreign.display().to_string()), "{text}");
    assert!(!foreign.join("omabox.db").exists());

    // A dangling link is named as such (nothing created at its target).
    let dangling = dir.path().join("dangling");
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
    let output = omabox(&dangling, &["run", "--backend", "local", "--", "true"]);
    assert!(
        stderr(&output).contains("symbolic link to a directory that does not exist"),
        "{}",
        stderr(&output)
    );
    assert!(!dir.path().join("nowhere").exists());
}

/// A user's own data directory without write permission (mode 0500) is named as not
/// writable, for a store that exists and for one that does not yet.
#[test]
fn a_users_data_dir_without_write_permission_is_named_as_such() {
    if !root() {
        return;
    }
    use std::os::unix::process::CommandExt as _;
    let dir = tempfile::tempdir().unwrap();
    chmod(dir.path(), 0o755);
    let data = dir.path().join("data");
    std::fs::create_dir(&data).unwrap();
    chown(&data, 65534);
    let as_nobody = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_omabox"))
            .arg("--data-dir")
            .arg(&data)
            .args(args)
            .env("OMABOX_TEST_MODE", "1")
            .env_remove("OMABOX_DATA_DIR")
            .env("HOME", "/nonexistent")
            .current_dir("/")
            .uid(65534)
            .gid(65534)
            .output()
            .expect("uid 65534 can run the omabox binary")
    };
    let first = as_nobody(&["run", "--backend", "local", "--", "true"]);
    assert!(first.status.success(), "{}", stderr(&first));
    chmod(&data, 0o500);
    let output = as_nobody(&["run", "--backend", "local", "--", "true"]);
    let text = stderr(&output);
    assert!(!output.status.success(), "{text}");
    assert!(
        text.contains(&format!(
            "the data directory {} is not writable",
            data.display()
        )),
        "{text}"
    );
    assert!(!text.contains("fence claim"), "{text}");
    chmod(&data, 0o700);
}
