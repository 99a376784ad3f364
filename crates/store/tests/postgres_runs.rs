//! The PostgreSQL run queue as several hosts see it: claims expire by the database's clock
//! (a host whose clock runs ahead never takes a live claim over), and a queued or ended run
//! wakes the hosts listening on `omabox_runs` at once (`LISTEN`/`NOTIFY`).
//!
//! Each test starts its own server (`omabox_test_support::postgres`), gated by the capability
//! gate: skipped with a reason locally, a failure under `CI=true`.

use omabox_contract::{EnqueueRunInput, RunEnd, RunQueuePort};
use omabox_store::{ClaimClock, Clock as _, ManualClock, PostgresStore, SystemClock};
use omabox_test_support::postgres::TestPostgres;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

const TTL: u64 = 60_000;

fn run(run_id: &str, session_id: &str) -> EnqueueRunInput {
    EnqueueRunInput {
        run_id: run_id.into(),
        session_id: session_id.into(),
        spec: "{}".into(),
    }
}

#[tokio::test]
async fn claims_expire_by_the_databases_clock_not_the_hosts() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("claim_clock").unwrap();
    let a = PostgresStore::connect(&url).await.unwrap();
    // Host B's clock is an hour ahead: by it, every claim of a 60 s ttl has expired.
    let ahead = ManualClock::new(SystemClock.now_ms() + 3_600_000);
    let b = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_clock(ahead.clone())
        .with_claim_clock(ClaimClock::Database);

    a.enqueue(run("run_1", "s1")).await.unwrap();
    let claimed = a.claim("host-a", 4, TTL).await.unwrap().expect("queued");
    assert_eq!(
        b.claim("host-b", 4, TTL).await.unwrap(),
        None,
        "host B took a live claim over by its own clock"
    );
    assert!(a.renew(&claimed.claim, TTL).await.unwrap());

    // The same host judging by its own clock would: what the database's clock prevents.
    let b_by_its_clock = PostgresStore::connect(&url)
        .await
        .unwrap()
        .with_clock(ahead);
    let taken = b_by_its_clock.claim("host-b", 4, TTL).await.unwrap();
    assert_eq!(taken.map(|run| run.claim.attempt), Some(2));
}

/// Waits for `wake` (bounded, so a missing notification fails instead of hanging).
async fn woken(wake: &Notify) -> bool {
    tokio::time::timeout(Duration::from_secs(30), wake.notified())
        .await
        .is_ok()
}

#[tokio::test]
async fn a_queued_or_ended_run_wakes_a_listening_host() {
    let Some(server) = TestPostgres::start_or_skip() else {
        return;
    };
    let url = server.create_database("listen").unwrap();
    let listener_host = PostgresStore::connect(&url).await.unwrap();
    let wake = Arc::new(Notify::new());
    let _listening = listener_host
        .listen_for_runs(Arc::clone(&wake))
        .await
        .unwrap();
    let other_host = PostgresStore::connect(&url).await.unwrap();

    // Another host queues a run: this one is woken.
    other_host.enqueue(run("run_1", "s1")).await.unwrap();
    assert!(woken(&wake).await, "no wake-up for a queued run");

    // Another host ends a run (its session's next run becomes claimable): woken again.
    other_host.enqueue(run("run_2", "s1")).await.unwrap();
    assert!(woken(&wake).await, "no wake-up for the second queued run");
    let claimed = other_host
        .claim("other", 1, TTL)
        .await
        .unwrap()
        .expect("queued");
    other_host
        .finish(&claimed.claim, RunEnd::Completed { revision: None })
        .await
        .unwrap();
    assert!(woken(&wake).await, "no wake-up for an ended run");
    let next = listener_host.claim("listener", 1, TTL).await.unwrap();
    assert_eq!(next.map(|run| run.claim.run_id).as_deref(), Some("run_2"));
}
