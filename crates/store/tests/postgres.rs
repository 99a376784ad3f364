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
