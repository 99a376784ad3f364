//! The provider host (reference §3.2): admission per run, then the ordinary host transaction
//! over the selected ports. Not a port of a TypeScript test file (none is in the reference's
//! catalogue); these cases pin the behaviour §3.2 describes.

use omabox_contract::{
    CredentialEgressCapabilities, ErrorKind, ManagedRuntimeProviderPlacement,
    ManagedRuntimeProviderResources, PortError,
};
use omabox_host::provider_host::{
    ManagedRuntimeProviderHost, ManagedRuntimeProviderHostOptions, admission_profile,
};
use omabox_host::runtime_host::ManagedRuntimeRunResult;
use omabox_testkit::drivers::{FakeProviderDriver, provider_descriptor};
use omabox_testkit::fakes::{Fixture, resource, session};
use std::sync::Arc;

/// A driver whose `create` hands out the fixture's fakes.
fn driver_over(fixture: &Fixture, egress: CredentialEgressCapabilities) -> Arc<FakeProviderDriver> {
    let mut descriptor = provider_descriptor("fixture-provider");
    descriptor.credential_egress = egress;
    let resources = ManagedRuntimeProviderResources {
        sandbox: fixture.sandbox.clone(),
        workspace: fixture.workspace.clone(),
        outputs: fixture.outputs.clone(),
        harness_driver: fixture.harness.clone(),
        supervisor_transport: None,
        runtime_checkpoint: None,
        credential_egress: None,
        session_inputs: None,
    };
    Arc::new(FakeProviderDriver::returning(descriptor, resources))
}

fn provider_host(fixture: &Fixture, driver: Arc<FakeProviderDriver>) -> ManagedRuntimeProviderHost {
    let mut provider_config = serde_json::Map::new();
    provider_config.insert("image".into(), serde_json::json!("debian:stable"));
    ManagedRuntimeProviderHost::new(ManagedRuntimeProviderHostOptions {
        owner_id: fixture.owner_id.clone(),
        lease_ttl_ms: fixture.lease_ttl_ms,
        heartbeat_interval_ms: fixture.heartbeat_interval_ms,
        fences: fixture.fences.clone(),
        orphans: fixture.orphans.clone(),
        scheduler: fixture.scheduler.clone().map(|scheduler| scheduler as _),
        driver,
        placement: ManagedRuntimeProviderPlacement::InProcess,
        provider_config,
    })
    .expect("provider host")
}

#[tokio::test]
async fn runs_the_selected_provider_ports_through_the_ordinary_host_transaction() {
    let fixture = Fixture::fault_matrix();
    let driver = driver_over(&fixture, CredentialEgressCapabilities::unsupported());
    let host = provider_host(&fixture, driver.clone());

    let result = host.run(fixture.input()).await.expect("run");
    assert_eq!(result, ManagedRuntimeRunResult::Completed { revision: 1 });

    let creates = driver.creates();
    assert_eq!(creates.len(), 1, "resources are created for every run");
    assert_eq!(creates[0].environment_id, fixture.scope().environment_id);
    assert_eq!(creates[0].profile, fixture.profile);
    assert_eq!(creates[0].provider_config["image"], "debian:stable");
    assert!(fixture.log.contains("fence.acquire"));
    assert!(fixture.log.contains("harness.run"));

    host.run(fixture.input()).await.expect("second run");
    assert_eq!(driver.creates().len(), 2);
}

#[tokio::test]
async fn requires_enforced_egress_before_the_fence_when_the_session_mounts_a_repository() {
    let fixture = Fixture::fault_matrix();
    let driver = driver_over(&fixture, CredentialEgressCapabilities::unsupported());
    let host = provider_host(&fixture, driver.clone());
    let mut input = fixture.input();
    input.session = Some(session(
        &fixture.scope(),
        &[],
        vec![resource(
            "github_repository",
            &[
                ("url", "https://github.com/o/r"),
                ("mount_path", "/workspace/r"),
            ],
        )],
    ));

    let error = host.run(input).await.expect_err("admission rejects");
    assert_eq!(
        error.message(),
        "The selected composition cannot enforce credential egress"
    );
    assert_eq!(error.kind(), ErrorKind::Capability);
    assert!(driver.creates().is_empty(), "rejected before allocation");
    assert!(
        fixture.log.entries().is_empty(),
        "no port was touched: {:?}",
        fixture.log.entries()
    );
}

#[test]
fn admission_profile_only_changes_egress_for_a_repository_session() {
    let fixture = Fixture::fault_matrix();
    let scope = fixture.scope();
    assert_eq!(admission_profile(&fixture.profile, None), fixture.profile);
    let files = session(&scope, &[], vec![resource("file", &[("file_id", "f")])]);
    assert_eq!(
        admission_profile(&fixture.profile, Some(&files)),
        fixture.profile
    );

    let repository = session(&scope, &[], vec![resource("github_repository", &[])]);
    let admitted = admission_profile(&fixture.profile, Some(&repository));
    assert_eq!(
        admitted.credential_egress_requirement(),
        omabox_contract::CredentialEgressRequirement::Required
    );
    assert_eq!(
        omabox_contract::ManagedRuntimeProfile {
            credential_egress: None,
            ..admitted
        },
        fixture.profile
    );
}

#[test]
fn rejects_a_driver_with_an_empty_provider_id_at_construction() {
    let fixture = Fixture::fault_matrix();
    let driver = Arc::new(FakeProviderDriver::new(provider_descriptor(""), |_| {
        Err(PortError::new("unused"))
    }));
    let error = ManagedRuntimeProviderHost::new(ManagedRuntimeProviderHostOptions {
        owner_id: fixture.owner_id.clone(),
        lease_ttl_ms: fixture.lease_ttl_ms,
        heartbeat_interval_ms: fixture.heartbeat_interval_ms,
        fences: fixture.fences.clone(),
        orphans: fixture.orphans.clone(),
        scheduler: None,
        driver,
        placement: ManagedRuntimeProviderPlacement::InProcess,
        provider_config: serde_json::Map::new(),
    })
    .expect_err("empty id");
    assert_eq!(
        error.message(),
        "Managed Runtime provider id must not be empty"
    );
}
