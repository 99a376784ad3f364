//! The run queue (omabox extension, issue 30): claims in order, one run per session at a
//! time, a host's capacity, expiry and re-claim, exactly-once publication in both orders of
//! a dead host's publish and a re-claim, the capped event timeline, cancels, and a session's
//! runs in pages.

use super::{Subject, TTL, candidate, scope};
use omabox_contract::{
    AcquireRuntimeFenceInput, AcquireRuntimeFenceResult, CancelOutcome, ClaimedRun,
    EnqueueRunInput, MAX_RUN_EVENT_BYTES, MAX_RUN_EVENTS, Nullable, PublishRuntimeResourcesInput,
    PublishRuntimeResourcesResult, RunEnd, RunPage, RunStatus, RuntimeResourceFence,
};
use std::collections::HashSet;
use std::sync::Arc;

/// The session of [`scope`].
const SESSION: &str = "session";

impl Subject {
    async fn enqueue(&self, run_id: &str, session_id: &str) {
        self.runs
            .enqueue(EnqueueRunInput {
                run_id: run_id.into(),
                session_id: session_id.into(),
                spec: format!("{{\"command\":[\"true\"],\"run\":\"{run_id}\"}}"),
            })
            .await
            .unwrap();
    }

    async fn claim(&self, host: &str, capacity: u64) -> Option<ClaimedRun> {
        self.runs.claim(host, capacity, TTL).await.unwrap()
    }

    async fn status_of(&self, run_id: &str) -> RunStatus {
        self.runs.status(run_id).await.unwrap().unwrap().status
    }

    async fn fence_for(&self, owner: &str) -> RuntimeResourceFence {
        match self
            .fences
            .acquire(AcquireRuntimeFenceInput {
                scope: scope(),
                owner_id: owner.into(),
                ttl_ms: 10 * TTL,
            })
            .await
            .unwrap()
        {
            AcquireRuntimeFenceResult::Acquired { fence, .. } => fence,
            AcquireRuntimeFenceResult::Conflict { .. } => panic!("{owner}: conflict"),
        }
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

pub async fn runs_are_claimed_in_order_and_end_once(s: Subject) {
    s.enqueue("run_1", "a").await;
    s.enqueue("run_2", "b").await;
    let duplicate = s
        .runs
        .enqueue(EnqueueRunInput {
            run_id: "run_1".into(),
            session_id: "c".into(),
            spec: "{}".into(),
        })
        .await
        .unwrap_err();
    assert!(duplicate.to_string().contains("run_1"), "{duplicate}");
    assert_eq!(s.status_of("run_1").await, RunStatus::Queued);
    assert_eq!(s.runs.status("run_9").await.unwrap(), None);

    let first = s.claim("host-a", 10).await.unwrap();
    assert_eq!(
        (
            first.claim.run_id.as_str(),
            first.session_id.as_str(),
            first.claim.attempt
        ),
        ("run_1", "a", 1)
    );
    assert!(first.spec.contains("\"run\":\"run_1\""), "{}", first.spec);
    assert_eq!(s.status_of("run_1").await, RunStatus::Running);
    let second = s.claim("host-a", 10).await.unwrap();
    assert_eq!(second.claim.run_id, "run_2");
    assert!(s.claim("host-a", 10).await.is_none());

    let end = RunEnd::Completed { revision: Some(4) };
    assert!(s.runs.finish(&first.claim, end.clone()).await.unwrap());
    assert!(
        !s.runs.finish(&first.claim, end).await.unwrap(),
        "ended twice"
    );
    let failed = RunEnd::Failed {
        error: "the command exited 3".into(),
    };
    assert!(s.runs.finish(&second.claim, failed).await.unwrap());
    let one = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!(
        (one.status, one.revision, one.attempts),
        (RunStatus::Completed, Some(4), 1)
    );
    let two = s.runs.status("run_2").await.unwrap().unwrap();
    assert_eq!(two.status, RunStatus::Failed);
    assert_eq!(two.error.as_deref(), Some("the command exited 3"));
    assert!(
        s.claim("host-b", 10).await.is_none(),
        "an ended run is claimed again"
    );
}

pub async fn runs_of_one_session_never_overlap(s: Subject) {
    s.enqueue("s1_first", "s1").await;
    s.enqueue("s1_second", "s1").await;
    s.enqueue("s2_first", "s2").await;
    let first = s.claim("host-a", 10).await.unwrap();
    assert_eq!(first.claim.run_id, "s1_first");
    // s1's second run waits for its first, whichever host asks.
    let other = s.claim("host-b", 10).await.unwrap();
    assert_eq!(other.claim.run_id, "s2_first");
    assert!(s.claim("host-b", 10).await.is_none());
    assert!(s.claim("host-a", 10).await.is_none());
    let done = RunEnd::Completed { revision: None };
    assert!(s.runs.finish(&first.claim, done).await.unwrap());
    let next = s.claim("host-b", 10).await.unwrap();
    assert_eq!(next.claim.run_id, "s1_second");
}

pub async fn a_host_claims_up_to_its_capacity(s: Subject) {
    for index in 0..4 {
        s.enqueue(&format!("run_{index}"), &format!("session_{index}"))
            .await;
    }
    let a1 = s.claim("host-a", 2).await.unwrap();
    let _a2 = s.claim("host-a", 2).await.unwrap();
    assert!(s.claim("host-a", 2).await.is_none(), "beyond capacity");
    assert!(s.claim("host-a", 0).await.is_none());
    let b1 = s.claim("host-b", 1).await.unwrap();
    assert_eq!(b1.claim.run_id, "run_2");
    let done = RunEnd::Completed { revision: None };
    assert!(s.runs.finish(&a1.claim, done).await.unwrap());
    let a3 = s.claim("host-a", 2).await.unwrap();
    assert_eq!(a3.claim.run_id, "run_3");
}

pub async fn an_expired_claim_is_claimed_again_and_the_old_one_refused(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let old = s.claim("host-a", 1).await.unwrap();
    s.clock.advance(TTL - 1);
    assert!(s.runs.renew(&old.claim, TTL).await.unwrap());
    assert!(s.claim("host-b", 1).await.is_none(), "claimed while live");
    s.clock.advance(TTL);
    assert!(
        !s.runs.renew(&old.claim, TTL).await.unwrap(),
        "renewed after expiry"
    );
    // The dead host's capacity is free again too.
    s.enqueue("run_2", "other").await;
    let new = s.claim("host-b", 1).await.unwrap();
    assert_eq!((new.claim.run_id.as_str(), new.claim.attempt), ("run_1", 2));
    assert_eq!(new.spec, old.spec);
    let again = s.claim("host-a", 1).await.unwrap();
    assert_eq!(again.claim.run_id, "run_2");

    let done = RunEnd::Completed { revision: None };
    assert!(!s.runs.finish(&old.claim, done.clone()).await.unwrap());
    assert!(!s.runs.append_event(&old.claim, "late").await.unwrap());
    assert!(s.runs.events("run_1", 0, 10).await.unwrap().is_empty());
    assert!(s.runs.finish(&new.claim, done).await.unwrap());
    let record = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!((record.status, record.attempts), (RunStatus::Completed, 2));
}

pub async fn eight_claimers_never_claim_a_run_twice(s: Subject) {
    const RUNS: usize = 48;
    for index in 0..RUNS {
        s.enqueue(&format!("run_{index:02}"), &format!("session_{index:02}"))
            .await;
    }
    let runs = Arc::clone(&s.runs);
    let mut claimers = tokio::task::JoinSet::new();
    for host in 0..8 {
        let runs = Arc::clone(&runs);
        claimers.spawn(async move {
            let mut claimed = Vec::new();
            while let Some(run) = runs
                .claim(&format!("host-{host}"), 1_000, TTL)
                .await
                .unwrap()
            {
                claimed.push(run.claim.run_id);
            }
            claimed
        });
    }
    let mut all = Vec::new();
    for claimed in claimers.join_all().await {
        all.extend(claimed);
    }
    let unique: HashSet<&String> = all.iter().collect();
    assert_eq!(all.len(), RUNS, "claimed: {all:?}");
    assert_eq!(unique.len(), RUNS, "a run was claimed twice: {all:?}");
}

/// Order 1: the dead host published, then its claim expired. The re-claim finds the
/// revision and completes the run instead of running it again.
pub async fn a_run_published_before_its_host_died_is_not_run_again(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let dead = s.claim("host-a", 1).await.unwrap();
    let fence = s.fence_for("host-a").await;
    let published = s
        .runs
        .publish_for_run(&dead.claim, publish_input(&fence, "w1"))
        .await
        .unwrap();
    assert_eq!(
        published,
        PublishRuntimeResourcesResult::Published { revision: 1 }
    );
    let record = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.revision),
        (RunStatus::Running, Some(1))
    );
    // The host dies before `finish`: its claim (and fence) expire.
    s.clock.advance(20 * TTL);
    assert!(
        s.claim("host-b", 1).await.is_none(),
        "a published run ran again"
    );
    let record = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.revision),
        (RunStatus::Completed, Some(1))
    );
    assert_eq!(
        s.runs.published_runs(SESSION).await.unwrap(),
        [(1, Some("run_1".to_owned()))]
    );
}

/// Order 2: the host stalls, its claim expires and another host re-claims the run; the old
/// host's publish (its fence still current) is lost, the new claim's publishes once.
pub async fn a_stale_claims_publish_is_lost_after_a_reclaim(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let stale = s.claim("host-a", 1).await.unwrap();
    let stale_fence = s.fence_for("host-a").await;
    s.clock.advance(TTL);
    let fresh = s.claim("host-b", 1).await.unwrap();
    assert_eq!(fresh.claim.attempt, 2);
    let lost = s
        .runs
        .publish_for_run(&stale.claim, publish_input(&stale_fence, "w-stale"))
        .await
        .unwrap();
    assert_eq!(lost, PublishRuntimeResourcesResult::Lost);
    assert!(s.runs.published_runs(SESSION).await.unwrap().is_empty());
    // A publish through a fence that is not current is lost too, claim or not.
    assert!(s.runs.renew(&fresh.claim, 100 * TTL).await.unwrap());
    s.clock.advance(10 * TTL);
    let lost = s
        .runs
        .publish_for_run(&fresh.claim, publish_input(&stale_fence, "w-stale"))
        .await
        .unwrap();
    assert_eq!(lost, PublishRuntimeResourcesResult::Lost);
    let record = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!(record.revision, None);
}

pub async fn a_live_claim_publishes_exactly_once(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let run = s.claim("host-b", 1).await.unwrap();
    let fence = s.fence_for("host-b").await;
    let published = s
        .runs
        .publish_for_run(&run.claim, publish_input(&fence, "w1"))
        .await
        .unwrap();
    assert_eq!(
        published,
        PublishRuntimeResourcesResult::Published { revision: 1 }
    );
    let done = RunEnd::Completed { revision: None };
    assert!(s.runs.finish(&run.claim, done).await.unwrap());
    let record = s.runs.status("run_1").await.unwrap().unwrap();
    assert_eq!(
        (record.status, record.revision),
        (RunStatus::Completed, Some(1))
    );
    assert_eq!(
        s.runs.published_runs(SESSION).await.unwrap(),
        [(1, Some("run_1".to_owned()))]
    );
}

pub async fn run_events_are_capped_and_replayed_in_order(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let run = s.claim("host-a", 1).await.unwrap();
    for index in 1..=3 {
        assert!(
            s.runs
                .append_event(&run.claim, &format!("e{index}"))
                .await
                .unwrap()
        );
    }
    let texts = |events: Vec<omabox_contract::RunEvent>| {
        events
            .into_iter()
            .map(|e| (e.seq, e.text))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        texts(s.runs.events("run_1", 1, 10).await.unwrap()),
        [(2, "e2".to_owned()), (3, "e3".to_owned())]
    );
    assert_eq!(texts(s.runs.events("run_1", 0, 1).await.unwrap()).len(), 1);
    let long = "é".repeat(MAX_RUN_EVENT_BYTES);
    assert!(s.runs.append_event(&run.claim, &long).await.unwrap());
    let stored = s.runs.events("run_1", 3, 10).await.unwrap();
    assert!(stored[0].text.len() <= MAX_RUN_EVENT_BYTES);
    assert!(stored[0].text.chars().all(|c| c == 'é'));
    for index in 5..=MAX_RUN_EVENTS + 5 {
        s.runs
            .append_event(&run.claim, &format!("e{index}"))
            .await
            .unwrap();
    }
    let all = s.runs.events("run_1", 0, 10_000).await.unwrap();
    assert_eq!(all.len() as u64, MAX_RUN_EVENTS);
    assert_eq!(all.last().unwrap().seq, MAX_RUN_EVENTS);
}

pub async fn a_queued_run_is_cancelled_and_a_running_one_ends_cancelled_by_its_host(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    s.enqueue("run_2", SESSION).await;
    s.enqueue("run_3", SESSION).await;
    // The session's first run is running; the third is still queued.
    let running = s.claim("host-a", 4).await.unwrap();
    assert_eq!(
        s.runs.cancel("run_3").await.unwrap(),
        CancelOutcome::Cancelled
    );
    assert_eq!(s.status_of("run_3").await, RunStatus::Cancelled);
    assert!(!s.runs.cancel_requested(&running.claim).await.unwrap());

    // A running run is only marked: its claim stays live until its host ends it.
    assert_eq!(
        s.runs.cancel("run_1").await.unwrap(),
        CancelOutcome::Requested
    );
    assert_eq!(
        s.runs.cancel("run_1").await.unwrap(),
        CancelOutcome::Requested,
        "idempotent while it runs"
    );
    assert_eq!(s.status_of("run_1").await, RunStatus::Running);
    assert!(s.runs.renew(&running.claim, TTL).await.unwrap());
    assert!(s.runs.cancel_requested(&running.claim).await.unwrap());
    assert!(
        s.runs
            .finish(&running.claim, RunEnd::Cancelled)
            .await
            .unwrap()
    );
    assert_eq!(s.status_of("run_1").await, RunStatus::Cancelled);

    // Ended runs are left as they are; the session goes on with its next run (never the
    // cancelled third).
    assert_eq!(
        s.runs.cancel("run_1").await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Cancelled)
    );
    assert_eq!(
        s.runs.cancel("nope").await.unwrap(),
        CancelOutcome::NotFound
    );
    let next = s.claim("host-a", 4).await.unwrap();
    assert_eq!(next.claim.run_id, "run_2");
    assert!(
        s.runs
            .finish(&next.claim, RunEnd::Completed { revision: None })
            .await
            .unwrap()
    );
    assert_eq!(
        s.runs.cancel("run_2").await.unwrap(),
        CancelOutcome::AlreadyEnded(RunStatus::Completed)
    );
    assert!(s.claim("host-a", 4).await.is_none(), "a cancelled run ran");
}

pub async fn a_cancelled_run_whose_host_died_is_never_run_again(s: Subject) {
    s.enqueue("run_1", SESSION).await;
    let dead = s.claim("host-a", 1).await.unwrap();
    assert_eq!(
        s.runs.cancel("run_1").await.unwrap(),
        CancelOutcome::Requested
    );
    s.clock.advance(2 * TTL);
    assert!(
        s.claim("host-b", 1).await.is_none(),
        "a cancelled run ran again"
    );
    assert_eq!(s.status_of("run_1").await, RunStatus::Cancelled);
    assert!(!s.runs.finish(&dead.claim, RunEnd::Cancelled).await.unwrap());
}

pub async fn a_sessions_runs_are_listed_newest_first_in_pages(s: Subject) {
    for index in 1..=5 {
        s.enqueue(&format!("run_{index}"), SESSION).await;
        s.enqueue(&format!("other_{index}"), "other").await;
    }
    let first = s.runs.session_runs(SESSION, None, 2).await.unwrap();
    let ids = |page: &RunPage| -> Vec<String> {
        page.runs.iter().map(|run| run.run_id.clone()).collect()
    };
    assert_eq!(ids(&first), ["run_5", "run_4"]);
    let second = s.runs.session_runs(SESSION, first.next, 2).await.unwrap();
    assert_eq!(ids(&second), ["run_3", "run_2"]);
    let last = s.runs.session_runs(SESSION, second.next, 2).await.unwrap();
    assert_eq!(ids(&last), ["run_1"]);
    assert_eq!(last.next, None);
    let all = s.runs.session_runs(SESSION, None, 10_000).await.unwrap();
    assert_eq!(all.runs.len(), 5);
    assert_eq!(all.next, None);
    assert!(all.runs.iter().all(|run| run.status == RunStatus::Queued));
    let none = s.runs.session_runs("nobody", None, 10).await.unwrap();
    assert_eq!(none, RunPage::default());
}
