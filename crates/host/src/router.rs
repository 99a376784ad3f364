//! The harness driver router: several independent driver lanes behind one
//! [`SandboxHarnessDriverPort`].
//!
//! The router never wraps or translates a lane. Registering the supervised lane beside an
//! `ama_worker` lane leaves the worker's declaration untouched: a community worker is never
//! asked to speak the supervisor protocol.
//!
//! Registration is recomputed on every call (the lanes a driver advertises are live facts, not
//! a construction-time snapshot): every driver is queried in parallel, each advertised lane is
//! registered once, and a lane advertised by two drivers is an error.

use futures::future::try_join_all;
use omabox_contract::{
    HarnessDriverType, ManagedWorkExecutionResult, PortError, RunHarnessInput,
    RuntimeResourceScope, SandboxHarnessDriverCapabilities, SandboxHarnessDriverPort,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `composeSandboxHarnessDrivers`: dispatches each run to the one driver that advertises the
/// declaration's lane.
#[derive(Clone)]
pub struct HarnessDriverRouter {
    drivers: Vec<Arc<dyn SandboxHarnessDriverPort>>,
}

impl std::fmt::Debug for HarnessDriverRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessDriverRouter")
            .field("drivers", &self.drivers.len())
            .finish()
    }
}

/// Composes independent driver lanes into one driver port.
pub fn compose_sandbox_harness_drivers(
    drivers: Vec<Arc<dyn SandboxHarnessDriverPort>>,
) -> HarnessDriverRouter {
    HarnessDriverRouter { drivers }
}

impl HarnessDriverRouter {
    /// The lane → driver table for `scope`, or "Duplicate sandbox harness driver
    /// registration: <type>".
    async fn registrations(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<BTreeMap<HarnessDriverType, Arc<dyn SandboxHarnessDriverPort>>, PortError> {
        let advertised = try_join_all(
            self.drivers
                .iter()
                .map(|driver| driver.driver_capabilities(scope)),
        )
        .await?;
        let mut registered = BTreeMap::new();
        for (driver, capabilities) in self.drivers.iter().zip(advertised) {
            for lane in capabilities.drivers {
                if registered.contains_key(&lane) {
                    return Err(PortError::new(format!(
                        "Duplicate sandbox harness driver registration: {lane}"
                    )));
                }
                registered.insert(lane, Arc::clone(driver));
            }
        }
        Ok(registered)
    }
}

#[async_trait::async_trait]
impl SandboxHarnessDriverPort for HarnessDriverRouter {
    /// The registered lanes in the fixed order `[ama_worker, openma_supervised]`.
    async fn driver_capabilities(
        &self,
        scope: &RuntimeResourceScope,
    ) -> Result<SandboxHarnessDriverCapabilities, PortError> {
        let registered = self.registrations(scope).await?;
        Ok(SandboxHarnessDriverCapabilities {
            drivers: HarnessDriverType::ALL
                .iter()
                .copied()
                .filter(|lane| registered.contains_key(lane))
                .collect(),
        })
    }

    async fn run(&self, input: RunHarnessInput) -> Result<ManagedWorkExecutionResult, PortError> {
        let lane = input.driver.driver_type();
        let selected = self.registrations(&input.scope).await?.remove(&lane);
        match selected {
            Some(driver) => driver.run(input).await,
            None => Err(PortError::new(format!(
                "No sandbox harness driver is registered for {lane}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use HarnessDriverType::{AmaWorker, OpenmaSupervised};
    use omabox_contract::{
        AbortSignal, HarnessDriverDeclaration, HarnessIdentity, ManagedSandboxLease,
        RuntimeProcessDeclaration, RuntimeResourceFence, SecretString, SupervisorProtocol,
    };
    use omabox_test_support::drivers::StaticHarnessDriver;

    fn scope() -> RuntimeResourceScope {
        RuntimeResourceScope::new("w", "e", "s", "k")
    }

    fn input(driver: HarnessDriverDeclaration) -> RunHarnessInput {
        RunHarnessInput {
            scope: scope(),
            fence: RuntimeResourceFence {
                workspace_id: "w".into(),
                environment_id: "e".into(),
                session_id: "s".into(),
                work_id: "k".into(),
                owner_id: "o".into(),
                generation: 1,
                token: SecretString::new("t"),
                expires_at: "2026-09-03T12:00:00.000Z".into(),
            },
            sandbox: ManagedSandboxLease {
                provider: "p".into(),
                runtime_id: "r".into(),
                metadata: None,
            },
            workspace_path: "/workspace".into(),
            output_path: None,
            driver,
            checkpoint: None,
            signal: AbortSignal::never(),
        }
    }

    fn worker() -> HarnessDriverDeclaration {
        HarnessDriverDeclaration::AmaWorker {
            process: RuntimeProcessDeclaration::command("community-worker"),
        }
    }

    fn supervised() -> HarnessDriverDeclaration {
        HarnessDriverDeclaration::OpenmaSupervised {
            protocol: SupervisorProtocol::V1,
            supervisor: RuntimeProcessDeclaration::command("supervisor"),
            harness: HarnessIdentity {
                id: "pi".into(),
                version: "1".into(),
            },
            ready_timeout_ms: 1,
            heartbeat_timeout_ms: 1,
            drain_timeout_ms: 1,
        }
    }

    #[tokio::test]
    async fn advertises_registered_lanes_in_fixed_order_whatever_the_driver_order() {
        let supervised_lane = Arc::new(StaticHarnessDriver::new(&[OpenmaSupervised]));
        let worker_lane = Arc::new(StaticHarnessDriver::new(&[AmaWorker]));
        let router = compose_sandbox_harness_drivers(vec![supervised_lane, worker_lane]);
        assert_eq!(
            router.driver_capabilities(&scope()).await.unwrap().drivers,
            vec![AmaWorker, OpenmaSupervised]
        );
        let empty = compose_sandbox_harness_drivers(vec![]);
        assert!(
            empty
                .driver_capabilities(&scope())
                .await
                .unwrap()
                .drivers
                .is_empty()
        );
    }

    #[tokio::test]
    async fn dispatches_each_lane_to_its_driver_unchanged() {
        let worker_lane = Arc::new(StaticHarnessDriver::new(&[AmaWorker]));
        let supervised_lane = Arc::new(StaticHarnessDriver::with_outcome(
            &[OpenmaSupervised],
            Ok(ManagedWorkExecutionResult::Aborted),
        ));
        let router =
            compose_sandbox_harness_drivers(vec![worker_lane.clone(), supervised_lane.clone()]);
        assert_eq!(
            router.run(input(worker())).await,
            Ok(ManagedWorkExecutionResult::Completed)
        );
        assert_eq!(
            router.run(input(supervised())).await,
            Ok(ManagedWorkExecutionResult::Aborted)
        );
        assert_eq!(worker_lane.runs(), vec![AmaWorker]);
        assert_eq!(supervised_lane.runs(), vec![OpenmaSupervised]);
        // `run` re-queries the lanes: one query per driver per call.
        assert_eq!(worker_lane.capability_queries(), 2);
    }

    #[tokio::test]
    async fn rejects_a_lane_advertised_twice() {
        let router = compose_sandbox_harness_drivers(vec![
            Arc::new(StaticHarnessDriver::new(&[AmaWorker])),
            Arc::new(StaticHarnessDriver::new(&[AmaWorker, OpenmaSupervised])),
        ]);
        let text = "Duplicate sandbox harness driver registration: ama_worker";
        assert_eq!(
            router
                .driver_capabilities(&scope())
                .await
                .unwrap_err()
                .message(),
            text
        );
        assert_eq!(
            router.run(input(supervised())).await.unwrap_err().message(),
            text
        );
    }

    #[tokio::test]
    async fn rejects_a_lane_no_driver_registered() {
        let worker_lane = Arc::new(StaticHarnessDriver::new(&[AmaWorker]));
        let router = compose_sandbox_harness_drivers(vec![worker_lane.clone()]);
        assert_eq!(
            router.run(input(supervised())).await.unwrap_err().message(),
            "No sandbox harness driver is registered for openma_supervised"
        );
        assert!(worker_lane.runs().is_empty());
    }

    #[tokio::test]
    async fn propagates_a_lane_failure_untranslated() {
        let router = compose_sandbox_harness_drivers(vec![Arc::new(
            StaticHarnessDriver::with_outcome(&[AmaWorker], Err(PortError::new("worker crashed"))),
        )]);
        assert_eq!(
            router.run(input(worker())).await.unwrap_err().message(),
            "worker crashed"
        );
    }
}
