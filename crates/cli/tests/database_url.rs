//! `--database-url` / `OMABOX_DATABASE_URL` through the `omabox` binary, against a real
//! PostgreSQL server (`omabox_test_support::postgres`; the capability gate skips with a
//! reason locally and fails under `CI=true`): two "hosts" (two data directories) share one
//! vault in PostgreSQL, no SQLite file is made, the commands not yet on PostgreSQL refuse the
//! setting, and the URL's password shows in no output.

use omabox_test_support::postgres::TestPostgres;
use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn omabox(data_dir: &Path, env_url: Option<&str>, args: &[&str], stdin: &[u8]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_omabox"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .env("OMABOX_TEST_MODE", "1")
        .env_remove("OMABOX_DATA_DIR")
        .env_remove("OMABOX_DATABASE_URL")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(url) = env_url {
        command.env("OMABOX_DATABASE_URL", url);
    }
    let mut child = command.spawn().expect("the omabox binary runs");
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn two_hosts_share_a_vault_in_postgres_and_the_password_shows_nowhere() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("shared").unwrap();
    let password = server.password().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let (host_a, host_b) = (dir.path().join("a"), dir.path().join("b"));

    // Host A stores a secret through the environment variable...
    let put = omabox(
        &host_a,
        Some(&url),
        &["vault", "put", "api-key"],
        b"v4lue\n",
    );
    assert!(put.status.success(), "{}", text(&put));
    assert!(!text(&put).contains(&password), "{}", text(&put));
    // ...host B lists it through the flag.
    let names = omabox(
        &host_b,
        None,
        &["--database-url", &url, "vault", "names", "--json"],
        b"",
    );
    assert!(names.status.success(), "{}", text(&names));
    let listed: Vec<String> = serde_json::from_slice(&names.stdout).unwrap();
    assert_eq!(listed, ["api-key"]);
    for host in [&host_a, &host_b] {
        assert!(
            !host.join("omabox.db").exists(),
            "{} got a SQLite store",
            host.display()
        );
    }

    // `omabox config` says the setting is set, and hides it.
    let config = omabox(&host_a, Some(&url), &["config"], b"");
    assert!(config.status.success(), "{}", text(&config));
    assert!(text(&config).contains("database_url"), "{}", text(&config));
    assert!(!text(&config).contains(&password), "{}", text(&config));

    // A command whose state is not on PostgreSQL yet refuses, instead of using a local file.
    let sessions = omabox(&host_a, Some(&url), &["sessions"], b"");
    assert!(!sessions.status.success());
    assert!(
        text(&sessions).contains("does not use the PostgreSQL store yet"),
        "{}",
        text(&sessions)
    );
    assert!(!text(&sessions).contains(&password), "{}", text(&sessions));
    assert!(!host_a.join("omabox.db").exists());

    // A wrong password: the error names the database, never the password given.
    let wrong = url.replace(&password, "not-the-p4ssword");
    let refused = omabox(&host_b, Some(&wrong), &["vault", "names"], b"");
    assert!(!refused.status.success());
    let output = text(&refused);
    assert!(output.contains("omabox@127.0.0.1:"), "{output}");
    assert!(!output.contains("not-the-p4ssword"), "{output}");
}
