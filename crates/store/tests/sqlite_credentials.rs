//! SQLite-only properties of session tokens and the vault: what reaches the disk (tokens
//! never, in the database or its WAL), the file's mode, persistence across handles, and that
//! no error or log line carries a token or a vault value.

use omabox_contract::{
    IssueSessionTokenInput, RuntimeResourceScope, SecretString, SessionTokenPort, VaultSecretPort,
};
use omabox_store::{ManualClock, SqliteStore};
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

const T0: u64 = 1_796_222_352_000;

fn scope(work: &str) -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", work)
}

async fn issue(store: &SqliteStore, work: &str, generation: u64) -> SecretString {
    store
        .issue(IssueSessionTokenInput {
            scope: scope(work),
            generation,
            ttl_ms: 60_000,
        })
        .await
        .unwrap()
}

/// Every byte of every file in `dir` (the database, its -wal and -shm).
fn all_bytes(dir: &Path) -> Vec<(String, Vec<u8>)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.display().to_string(), std::fs::read(&path).unwrap())
        })
        .collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}

fn assert_absent(dir: &Path, secret: &str) {
    let files = all_bytes(dir);
    assert!(
        files.iter().any(|(name, _)| name.ends_with("-wal")),
        "WAL checked"
    );
    for (name, bytes) in files {
        assert!(
            !contains(&bytes, secret.as_bytes()),
            "{secret} found in {name}"
        );
    }
}

/// Captures everything `tracing` writes on this thread while the guard lives.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn install(&self) -> tracing::subscriber::DefaultGuard {
        let sink = self.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::set_default(subscriber)
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn session_tokens_never_reach_the_database_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let store = SqliteStore::open(&path)
        .unwrap()
        .with_clock(ManualClock::new(T0));
    let mut tokens = Vec::new();
    for (work, generation) in [("a", 1), ("a", 1), ("a", 2), ("b", 7)] {
        let token = issue(&store, work, generation).await;
        assert!(store.verify(token.expose()).await.unwrap().is_some());
        tokens.push(token);
    }
    store.revoke(&scope("b"), 7).await.unwrap();
    // While the handle is open the rows sit in the WAL; then checkpointed into the file.
    for token in &tokens {
        assert_absent(dir.path(), token.expose());
        // Nor the random part alone.
        assert_absent(dir.path(), &token.expose()["omst_".len()..]);
    }
    let reopened = SqliteStore::open(&path)
        .unwrap()
        .with_clock(ManualClock::new(T0));
    let claims = reopened.verify(tokens[2].expose()).await.unwrap().unwrap();
    assert_eq!(
        (claims.scope, claims.generation),
        (scope("a"), 2),
        "durable"
    );
    drop(store);
    drop(reopened);
    for token in &tokens {
        for (name, bytes) in all_bytes(dir.path()) {
            assert!(
                !contains(&bytes, token.expose().as_bytes()),
                "token in {name}"
            );
        }
    }
}

#[tokio::test]
async fn store_errors_and_logs_never_carry_a_token_or_a_vault_value() {
    let captured = Captured::default();
    let _guard = captured.install();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let store = SqliteStore::open(&path).unwrap();
    let token = issue(&store, "a", 1).await;
    let value = "vault-value-2b9e41";
    store
        .put("mcp/github", SecretString::new(value))
        .await
        .unwrap();
    let formatted = format!("{store:?}");

    // Break both tables under the store, then use them.
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute_batch("DROP TABLE session_token; DROP TABLE vault_secret")
        .unwrap();
    drop(raw);
    let mut errors = vec![
        store.verify(token.expose()).await.unwrap_err(),
        store
            .put("mcp/github", SecretString::new(value))
            .await
            .unwrap_err(),
        store.get("mcp/github").await.unwrap_err(),
        store.names().await.unwrap_err(),
        store.revoke(&scope("a"), 1).await.unwrap_err(),
    ];
    errors.push(
        store
            .issue(IssueSessionTokenInput {
                scope: scope("a"),
                generation: 2,
                ttl_ms: 1,
            })
            .await
            .unwrap_err(),
    );
    let logs = captured.text();
    assert!(logs.contains("store operation failed"), "{logs}");
    for error in &errors {
        let text = format!("{error} {error:?}");
        assert!(text.contains("failed"), "{text}");
        assert!(!text.contains(token.expose()), "{text}");
        assert!(!text.contains(value), "{text}");
    }
    assert!(!logs.contains(token.expose()), "{logs}");
    assert!(!logs.contains(value), "{logs}");
    assert!(!formatted.contains(value), "{formatted}");
}

#[tokio::test]
async fn a_non_utf8_vault_value_is_an_error_naming_only_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let store = SqliteStore::open(&path).unwrap();
    let raw = rusqlite::Connection::open(&path).unwrap();
    raw.execute(
        "INSERT INTO vault_secret VALUES ('bad', X'FF7A71392D76616C7565', 0, 0)",
        [],
    )
    .unwrap();
    let error = store.get("bad").await.unwrap_err().to_string();
    assert!(error.contains("\"bad\" is not UTF-8"), "{error}");
    // The bytes after 0xFF are "zq9-value".
    assert!(!error.contains("zq9-value"), "{error}");
    assert_eq!(store.names().await.unwrap(), ["bad"]);
}

#[tokio::test]
async fn vault_values_persist_across_handles() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("omabox.db");
    let first = SqliteStore::open(&path).unwrap();
    first.put("k", SecretString::new("v1")).await.unwrap();
    let second = SqliteStore::open(&path).unwrap();
    assert_eq!(second.get("k").await.unwrap().unwrap().expose(), "v1");
    second.put("k", SecretString::new("v2")).await.unwrap();
    assert_eq!(first.get("k").await.unwrap().unwrap().expose(), "v2");
    second.delete("k").await.unwrap();
    assert_eq!(first.get("k").await.unwrap(), None);
}

#[cfg(unix)]
#[tokio::test]
async fn the_database_and_its_wal_and_shm_are_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state").join("omabox.db");
    let store = SqliteStore::open(&path).unwrap();
    store.put("k", SecretString::new("v")).await.unwrap();
    for suffix in ["", "-wal", "-shm"] {
        let file = dir.path().join("state").join(format!("omabox.db{suffix}"));
        assert_eq!(mode(&file), 0o600, "{}", file.display());
    }
    drop(store);

    // A database an older omabox left world-readable is narrowed on open.
    let old = dir.path().join("old.db");
    drop(SqliteStore::open(&old).unwrap());
    std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
    let store = SqliteStore::open(&old).unwrap();
    store.put("k", SecretString::new("v")).await.unwrap();
    assert_eq!(mode(&old), 0o600);
    assert_eq!(mode(&dir.path().join("old.db-wal")), 0o600);
}
