//! One behavioural suite, two instantiations: every fence/orphan store must pass the same
//! contract tests (reference §1.1, §1.11).

mod suite;

macro_rules! port_suite {
    ($($case:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::suite::$case(crate::suite::memory()).await;
                }
            )*
        }
        mod sqlite {
            $(
                #[tokio::test]
                async fn $case() {
                    crate::suite::$case(crate::suite::sqlite()).await;
                }
            )*
        }
    };
}

port_suite!(
    generations_increase_per_new_owner,
    reentrant_acquire_by_same_owner_returns_same_fence,
    conflict_carries_the_active_expiry,
    expired_fence_is_taken_over_with_the_previous_publication,
    is_current_only_for_the_active_unexpired_claim,
    renew_extends_and_is_lost_after_expiry_or_takeover,
    publish_is_lost_for_a_stale_or_forged_or_expired_fence,
    identical_republish_is_idempotent_and_changes_get_new_revisions,
    runtime_checkpoint_is_stored_as_given,
    release_by_a_stale_fence_does_not_clear_the_current_one,
    released_fence_can_be_released_after_expiry,
    orphans_upsert_sort_limit_fail_and_resolve,
);
