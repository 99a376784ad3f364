//! Environment-worker installation modes: how a deployment serves work for an environment.

use crate::capabilities::wire_enum;

wire_enum! {
    /// The `mode` of an installation.
    EnvironmentWorkerInstallationMode {
        /// The host claims work, then acquires compute.
        RuntimeHost = "runtime_host",
        /// The provider receives dispatched work.
        ProviderDispatch = "provider_dispatch",
        /// The provider activates compute, which then polls its session.
        ProviderActivation = "provider_activation",
        /// Bring-your-own worker: only the Work API is served.
        ExternalWorker = "external_worker",
    }
}

wire_enum! {
    /// The resulting worker strategy.
    EnvironmentWorkerInstallationStrategy {
        /// Claim a work item, then acquire compute.
        ClaimThenAcquire = "claim_then_acquire",
        /// Poll unacknowledged work, then dispatch it.
        PollUnackedThenDispatch = "poll_unacked_then_dispatch",
        /// Acquire compute, then poll the session.
        AcquireThenSessionPoll = "acquire_then_session_poll",
        /// No OpenMA sandbox at all.
        ExternalWorker = "external_worker",
    }
}

impl EnvironmentWorkerInstallationMode {
    /// The strategy an installation in this mode uses.
    pub fn strategy(self) -> EnvironmentWorkerInstallationStrategy {
        match self {
            Self::RuntimeHost => EnvironmentWorkerInstallationStrategy::ClaimThenAcquire,
            Self::ProviderDispatch => {
                EnvironmentWorkerInstallationStrategy::PollUnackedThenDispatch
            }
            Self::ProviderActivation => {
                EnvironmentWorkerInstallationStrategy::AcquireThenSessionPoll
            }
            Self::ExternalWorker => EnvironmentWorkerInstallationStrategy::ExternalWorker,
        }
    }

    /// Whether this mode creates an environment worker (`external_worker` creates none).
    pub fn creates_worker(self) -> bool {
        self != Self::ExternalWorker
    }
}
