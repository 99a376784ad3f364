//! The PostgreSQL store as several hosts share it: stores with pools of their own race on one
//! fresh database (first-connect migration, then one work item), and what reaches the
//! database and the errors (hashes only; no password, no token, no vault value).
//!
//! Each test starts its own server (`omabox_test_support::postgres`), gated by the capability
//! gate: skipped with a reason locally, a failure under `CI=true`.

use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, IssueSessionTokenInput, Nullable,
    PublishRuntimeResourcesInput, PublishRuntimeResourcesResult, RuntimePublicationCandidate,
    RuntimeResourceFence, RuntimeResourceFencePort, RuntimeResourceScope, SecretString,
    SessionTokenPort, VaultSecretPort,
};
use omabox_store::{
    Clock, ManualClock, POSTGRES_SCHEMA_VERSION, PostgresStore, StoreError, SystemClock,
};
use omabox_test_support::postgres::TestPostgres;
use std::sync::Arc;
use tokio::sync::Barrier;

const HOSTS: usize = 8;
const TTL: u64 = 600_000;

fn scope() -> RuntimeResourceScope {
    RuntimeResourceScope::new("workspace", "environment", "session", "raced-work")
}

fn candidate(id: &str) -> RuntimePublicationCandidate {
    RuntimePublicationCandidate {
        id: id.into(),
        content_hash: format!("sha256:{id}"),
        metadata: None,
    }
}

fn publish_input(fence: &RuntimeResourceFence, workspace: &str) -> PublishRuntimeResourcesInput {
    PublishRuntimeResourcesInput {
        fence: fence.clone(),
        workspace_candidate: candidate(workspace),
        output_candidate: None,
        runtime_checkpoint: Nullable::Absent,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hosts_racing_on_one_database_get_exactly_one_generation() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("raced").unwrap();

    // 1. Every "host" connects to the fresh database at once (so the first migration races
    //    too), then they all acquire the same work item at one moment.
    let barrier = Arc::new(Barrier::new(HOSTS));
    let hosts: Vec<_> = (0..HOSTS)
        .map(|index| {
            let url = url.clone();
            let barrier = Arc::clone(&barrier);
            tokio::spawn(async move {
                let owner = format!("owner-{index}");
                let store = PostgresStore::connect_with_pool_size(&url, 2)
                    .await
                    .unwrap();
                barrier.wait().await;
                let outcome = store
                    .acquire(AcquireRuntimeFenceInput {
                        scope: scope(),
                        owner_id: owner.clone(),
                        ttl_ms: TTL,
                    })
                    .await
                    .unwrap();
                if let AcquireRuntimeFenceResult::Acquired { fence, .. } = &outcome {
                    let published = store
                        .publish(publish_input(fence, &format!("ws-{owner}")))
                        .await
                        .unwrap();
                    assert_eq!(
                        published,
                        PublishRuntimeResourcesResult::Published { revision: 1 }
                    );
                }
                outcome
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for host in hosts {
        outcomes.push(host.await.unwrap());
    }
    let winners: Vec<&RuntimeResourceFence> = outcomes
        .iter()
        .filter_map(|outcome| match outcome {
            AcquireRuntimeFenceResult::Acquired { fence, .. } => Some(fence),
            AcquireRuntimeFenceResult::Conflict { .. } => None,
        })
        .collect();
    assert_eq!(winners.len(), 1, "exactly one host acquires: {outcomes:?}");
    let winner = winners[0].clone();
    assert_eq!(winner.generation, 1);
    for outcome in &outcomes {
        if let AcquireRuntimeFenceResult::Conflict { expires_at } = outcome {
            assert_eq!(expires_at.as_deref(), Some(winner.expires_at.as_str()));
        }
    }

    // 2. The winner's fence expires; another host takes over and sees the publication.
    let taker_store = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_clock(ManualClock::new(SystemClock.now_ms() + TTL + 1_000));
    let AcquireRuntimeFenceResult::Acquired {
        fence: taker,
        publication,
    } = taker_store
        .acquire(AcquireRuntimeFenceInput {
            scope: scope(),
            owner_id: "taker".into(),
            ttl_ms: TTL,
        })
        .await
        .unwrap()
    else {
        panic!("the expired fence should be taken over");
    };
    assert_eq!(taker.generation, 2);
    let publication = publication.unwrap();
    assert_eq!((publication.generation, publication.revision), (1, 1));
    assert_eq!(
        publication.workspace_candidate.id,
        format!("ws-{}", winner.owner_id)
    );

    // 3. A third host publishes with the stale generation-1 fence while the taker publishes:
    //    the stale one is lost, the taker's is revision 2.
    let stale_store = PostgresStore::connect(&url).await.unwrap();
    let (stale, fresh) = tokio::join!(
        stale_store.publish(publish_input(&winner, "ws-stale")),
        taker_store.publish(publish_input(&taker, "ws-taker")),
    );
    assert_eq!(stale.unwrap(), PublishRuntimeResourcesResult::Lost);
    assert_eq!(
        fresh.unwrap(),
        PublishRuntimeResourcesResult::Published { revision: 2 }
    );
    assert_eq!(
        stale_store.schema_version().await.unwrap(),
        POSTGRES_SCHEMA_VERSION
    );
}

/// Everything the database holds, as text.
async fn dump(url: &str) -> String {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    let mut text = String::new();
    for table in ["runtime_fence", "runtime_publication", "session_token"] {
        for row in client
            .query(&format!("SELECT t::text FROM {table} t"), &[])
            .await
            .unwrap()
        {
            text.push_str(&row.get::<_, String>(0));
            text.push('\n');
        }
    }
    text
}

#[tokio::test]
async fn the_database_holds_only_hashes_of_fence_and_session_tokens() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("hashes").unwrap();
    let store = PostgresStore::connect(&url).await.unwrap();
    let AcquireRuntimeFenceResult::Acquired { fence, .. } = store
        .acquire(AcquireRuntimeFenceInput {
            scope: scope(),
            owner_id: "owner".into(),
            ttl_ms: TTL,
        })
        .await
        .unwrap()
    else {
        panic!("a fresh work item is acquired");
    };
    store.publish(publish_input(&fence, "ws")).await.unwrap();
    let session_token = store
        .issue(IssueSessionTokenInput {
            scope: scope(),
            generation: fence.generation,
            ttl_ms: TTL,
        })
        .await
        .unwrap();
    let dump = dump(&url).await;
    assert!(
        dump.contains("raced-work"),
        "the dump reads the rows: {dump}"
    );
    for token in [fence.token.expose(), session_token.expose()] {
        assert!(
            !dump.contains(token),
            "a token reached the database: {dump}"
        );
        // Not hex-encoded either (bytea's text form is hex).
        let hex: String = token.bytes().map(|byte| format!("{byte:02x}")).collect();
        assert!(!dump.contains(&hex), "a token reached the database: {dump}");
    }
}

#[tokio::test]
async fn connection_errors_name_the_database_but_never_the_password() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let password = server.password().to_owned();
    // A wrong password, and a port nothing listens on.
    let wrong = server
        .url("postgres")
        .replace(&password, "wrong-p4ssw0rd-value");
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        format!("postgres://omabox:{password}@127.0.0.1:{port}/postgres")
    };
    for (url, secret) in [
        (&wrong, "wrong-p4ssw0rd-value"),
        (&closed, password.as_str()),
    ] {
        let error = PostgresStore::connect(url).await.unwrap_err();
        assert!(
            matches!(error, StoreError::Connect { .. }),
            "a connection failure: {error:?}"
        );
        let text = format!("{error} {error:?}");
        assert!(
            text.contains("omabox@127.0.0.1:"),
            "names the target: {text}"
        );
        assert!(!text.contains(secret), "the password leaked: {text}");
    }
    let error = PostgresStore::connect(&format!(
        "postgres://omabox:{password}@127.0.0.1:notaport/postgres"
    ))
    .await
    .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(matches!(error, StoreError::DatabaseUrl(_)), "{text}");
    assert!(!text.contains(&password), "the password leaked: {text}");
}

#[tokio::test]
async fn a_database_migrated_by_a_newer_omabox_is_refused() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("newer").unwrap();
    drop(PostgresStore::connect(&url).await.unwrap());
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .execute(
            "INSERT INTO omabox_schema_migration (version, description) VALUES (99, 'future')",
            &[],
        )
        .await
        .unwrap();
    let error = PostgresStore::connect(&url).await.unwrap_err();
    assert!(
        matches!(
            error,
            StoreError::DatabaseSchemaTooNew {
                found: 99,
                supported: POSTGRES_SCHEMA_VERSION,
                ..
            }
        ),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_failing_vault_write_never_carries_the_value() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("vault").unwrap();
    let store = PostgresStore::connect(&url).await.unwrap();
    // A constraint the value breaks: PostgreSQL's DETAIL would quote the key, the value.
    let (client, connection) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(connection);
    client
        .batch_execute("CREATE UNIQUE INDEX vault_values_differ ON vault_secret (value)")
        .await
        .unwrap();
    let value = "vault-value-that-must-never-show";
    store
        .put("first", SecretString::new(value.to_owned()))
        .await
        .unwrap();
    let error = store
        .put("api-key", SecretString::new(value.to_owned()))
        .await
        .unwrap_err();
    let text = format!("{error} {error:?}");
    assert!(text.contains("vault put"), "{text}");
    assert!(!text.contains(value), "the value leaked: {text}");
    let hex: String = value.bytes().map(|byte| format!("{byte:02x}")).collect();
    assert!(!text.contains(&hex), "the value leaked: {text}");
}

/// The same fence history on SQLite and on PostgreSQL reads back the same through the
/// read-side queries (`sessions`, `gc`, `reap`).
#[tokio::test]
async fn the_read_side_queries_answer_as_sqlites_do() {
    use omabox_contract::{LeaseJournalEntry, ManagedSandboxLease, TerminationReason};
    use omabox_store::SqliteStore;
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    // A collation where "a" sorts before "B": the store must still order byte-wise.
    let url = server.create_database_icu("reads", "en-US").unwrap();
    let clock = ManualClock::new(1_796_222_352_000);
    let postgres = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_clock(clock.clone());
    let dir = tempfile::tempdir().unwrap();
    let sqlite = SqliteStore::open(dir.path().join("omabox.db"))
        .unwrap()
        .with_clock(clock.clone());
    let stores: [&dyn Fences; 2] = [&sqlite, &postgres];
    // Byte order puts "B" before "a".
    let scope = |session: &str| RuntimeResourceScope::new("w", "e", session, "main");
    let claim = |session: &str| AcquireRuntimeFenceInput {
        scope: scope(session),
        owner_id: "owner".into(),
        ttl_ms: 60_000,
    };
    for store in stores {
        // "a" only acquires; "B" publishes three generations; "c" publishes and is released.
        store.acquire(claim("a")).await.unwrap();
        let mut stale = None;
        for round in 1..=3 {
            let AcquireRuntimeFenceResult::Acquired { fence, .. } =
                store.acquire(claim("B")).await.unwrap()
            else {
                panic!("acquired");
            };
            store
                .publish(publish_input(&fence, &format!("wcp_{round}")))
                .await
                .unwrap();
            store
                .release(&fence, TerminationReason::Completed)
                .await
                .unwrap();
            stale = Some(fence);
        }
        let AcquireRuntimeFenceResult::Acquired { fence, .. } =
            store.acquire(claim("B")).await.unwrap()
        else {
            panic!("acquired");
        };
        assert_eq!(
            store
                .publish(publish_input(&stale.unwrap(), "wcp_lost"))
                .await
                .unwrap(),
            PublishRuntimeResourcesResult::Lost
        );
        store
            .record(LeaseJournalEntry {
                scope: scope("B"),
                generation: fence.generation,
                owner_id: "owner".into(),
                lease: serde_json::from_value::<ManagedSandboxLease>(serde_json::json!({
                    "provider": "linux", "runtimeId": "rt-1"
                }))
                .unwrap(),
                acquired_at: "2026-12-02T14:39:12.000Z".into(),
            })
            .await
            .unwrap();
    }

    let history = postgres.publications_of(&scope("B")).await.unwrap();
    let summary: Vec<(u64, u64, &str)> = history
        .iter()
        .map(|p| (p.revision, p.generation, p.workspace_candidate.id.as_str()))
        .collect();
    assert_eq!(summary, [(3, 3, "wcp_3"), (2, 2, "wcp_2"), (1, 1, "wcp_1")]);
    assert_eq!(history, sqlite.publications_of(&scope("B")).unwrap());
    assert_eq!(
        postgres.list_publications().await.unwrap(),
        sqlite.list_publications().unwrap()
    );
    assert_eq!(
        postgres.publication_history().await.unwrap(),
        sqlite.publication_history().unwrap()
    );
    for session in ["a", "B", "never"] {
        assert_eq!(
            postgres.publication(&scope(session)).await.unwrap(),
            sqlite.publication(&scope(session)).unwrap(),
            "{session}"
        );
    }
    assert_eq!(postgres.active_fence_count().await.unwrap(), 2);
    assert_eq!(sqlite.active_fence_count().unwrap(), 2);
    let claims = postgres.work_item_claims().await.unwrap();
    assert_eq!(claims, sqlite.work_item_claims().unwrap());
    assert_eq!(claims[0].scope, scope("B"), "byte order: {claims:?}");
    assert_eq!(
        postgres.journaled_runtime_ids("linux").await.unwrap(),
        sqlite.journaled_runtime_ids("linux").unwrap()
    );
    clock.advance(60_000);
    assert_eq!(postgres.active_fence_count().await.unwrap(), 0);
    assert!(
        postgres
            .work_item_claims()
            .await
            .unwrap()
            .iter()
            .all(|c| !c.held)
    );

    // Forgetting never removes the newest revision.
    let forget = [(scope("B"), 1), (scope("B"), 3)];
    assert_eq!(postgres.forget_revisions(&forget).await.unwrap(), 1);
    assert_eq!(sqlite.forget_revisions(&forget).unwrap(), 1);
    assert_eq!(
        postgres.publications_of(&scope("B")).await.unwrap(),
        sqlite.publications_of(&scope("B")).unwrap()
    );
}

/// The ports the read-side scenario drives, on either store.
trait Fences: RuntimeResourceFencePort + omabox_contract::RuntimeLeaseJournalPort {}
impl<T: RuntimeResourceFencePort + omabox_contract::RuntimeLeaseJournalPort> Fences for T {}

/// A server that accepts connections and never answers (a hung or half-dead database) is an
/// error naming it once the connection wait is over, not a call that hangs.
#[tokio::test]
async fn a_server_that_never_answers_is_an_error_not_a_hang() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let url = format!("postgres://omabox:silent-pw@127.0.0.1:{port}/omabox");
    let error = PostgresStore::connect_with(&url, 1, std::time::Duration::from_millis(200))
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(matches!(error, StoreError::Connect { .. }), "{error:?}");
    assert!(
        text.contains(&format!("omabox@127.0.0.1:{port}/omabox")),
        "{text}"
    );
    assert!(text.contains("no connection within"), "{text}");
    assert!(!text.contains("silent-pw"), "{text}");
    silent.abort();
}
