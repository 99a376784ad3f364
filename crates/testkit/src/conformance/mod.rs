//! The backend conformance suite: one set of contract tests every managed backend runs.
//!
//! A backend test file instantiates the suite with [`conformance_suite!`](crate::conformance_suite):
//!
//! ```ignore
//! omabox_testkit::conformance_suite!(local, local_backend());
//! ```
//!
//! where the expression yields `Option<BackendUnderTest>` (`None` = this machine cannot run
//! the backend; see [`require_capability`]). Every case builds the backend through the
//! generic [`ProviderManagedRuntimeDriver`] over omabox's filesystem persistence ports in a
//! fresh temporary data directory, and wraps the provider in a [`TrackingProvider`] so each
//! case can check that nothing it created is left running.
//!
//! The cases (see `tests/README.md` for the index) cover the contract's acceptance checklist
//! sections "Lifecycle" and "Processes and files", the harness lanes, the boundary tests,
//! and a full host run through the managed runtime host with the in-memory fence store.

pub mod cases;
mod process_checkpoints;
mod subject;

pub use subject::{Acquired, BackendUnderTest, ProviderFactory, Subject, TrackingProvider};

use omabox_sandbox::managed::ProviderManagedRuntimeDriver;

/// Skips a backend that this machine cannot run, loudly; fails under `CI=true` (the one
/// capability gate, [`omabox_test_support::require_capability`]).
pub use omabox_test_support::require_capability;

/// Instantiates the conformance suite for one backend: `conformance_suite!(name, expr)`
/// where `expr: Option<BackendUnderTest>` is evaluated once per case.
#[macro_export]
macro_rules! conformance_suite {
    ($backend:ident, $factory:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;

            async fn subject() -> ::std::option::Option<$crate::conformance::Subject> {
                let backend: ::std::option::Option<$crate::conformance::BackendUnderTest> =
                    $factory;
                match backend {
                    ::std::option::Option::Some(backend) => ::std::option::Option::Some(
                        $crate::conformance::Subject::new(backend).await,
                    ),
                    ::std::option::Option::None => ::std::option::Option::None,
                }
            }

            $crate::conformance_suite!(@cases
                acquire_returns_a_json_safe_lease_without_the_fence_token,
                acquire_publishes_only_after_the_readiness_marker,
                a_missing_harness_binary_fails_acquire_and_leaves_nothing_behind,
                heartbeat_is_alive_then_lost_once_the_runtime_was_deleted,
                terminate_is_idempotent_for_completed_failed_and_lease_lost,
                reap_works_from_a_serialized_lease_with_a_fresh_driver_twice,
                inspect_reports_running_then_stopped,
                suspend_is_refused_and_not_advertised,
                exec_returns_combined_output_including_a_non_zero_exit,
                read_and_write_file_honour_the_workspace,
                read_file_bytes_round_trips_binary_content,
                duplex_process_streams_stdin_stdout_stderr_and_exits,
                duplex_process_can_be_killed,
                outputs_written_in_the_sandbox_are_collected_through_the_outputs_port,
                ama_worker_runs_the_declared_process_and_maps_its_exit,
                ama_worker_abort_kills_the_process_and_resolves_aborted,
                a_foreign_provider_lease_is_rejected,
                a_foreign_workspace_candidate_is_rejected_on_restore,
                the_descriptor_is_honest_and_other_placements_are_rejected,
                a_full_host_run_completes_and_persists_workspace_and_outputs,
                a_supervised_host_run_completes_over_a_duplex_process,
                process_checkpoints_carry_running_processes_into_the_next_run
            );
        }
    };
    (@cases $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                if let ::std::option::Option::Some(subject) = subject().await {
                    $crate::conformance::cases::$case(&subject).await;
                    subject.assert_nothing_left().await;
                }
            }
        )+
    };
}

/// Builds a driver exactly as a backend's `create_managed_runtime_provider_driver` would,
/// for tests that check descriptors against catalog rows.
pub async fn driver_for(subject: &Subject) -> ProviderManagedRuntimeDriver {
    subject.fresh_driver().await
}
