//! Port of `provider-conformance.test.ts` (reference §8.4): the conformance catalog, one Rust
//! test per TypeScript case, named after it.

use omabox_contract::HarnessDriverType::{AmaWorker, OpenmaSupervised};
use omabox_contract::{HarnessDriverType, WorkspaceStrategy};
use omabox_host::catalog::{
    CatalogDurability, CatalogHardTerminate, CatalogLease, CatalogLifecycle, CatalogOrphanReap,
    CatalogOutputStrategy, CatalogSuspendResume, ConformanceStatus,
    MANAGED_RUNTIME_PROVIDER_CONFORMANCE, ManagedRuntimeProviderConformance,
    get_managed_runtime_provider_conformance, require_managed_runtime_provider,
};

fn get(id: &str) -> &'static ManagedRuntimeProviderConformance {
    get_managed_runtime_provider_conformance(id).expect("known provider")
}

fn host_fenced(suspend_resume: CatalogSuspendResume) -> CatalogLifecycle {
    CatalogLifecycle {
        lease: CatalogLease::HostFenced,
        suspend_resume,
        hard_terminate: CatalogHardTerminate::Supported,
        orphan_reap: CatalogOrphanReap::HostManaged,
    }
}

#[test]
fn keeps_the_shipped_managed_runtime_host_presets_distinct_from_legacy_sandbox_port_adapters() {
    let both: &[HarnessDriverType] = &[AmaWorker, OpenmaSupervised];
    let worker: &[HarnessDriverType] = &[AmaWorker];
    let expected: [(&str, &[HarnessDriverType]); 12] = [
        ("node-docker", both),
        ("cloudflare", both),
        ("cloudflare-bridge", worker),
        ("e2b", both),
        ("daytona", both),
        ("litebox", both),
        ("boxrun", both),
        ("blaxel", both),
        ("sprites", both),
        ("vercel", worker),
        ("modal", both),
        ("superserve", both),
    ];
    let actual: Vec<(&str, ConformanceStatus, &[HarnessDriverType])> =
        MANAGED_RUNTIME_PROVIDER_CONFORMANCE
            .iter()
            .map(|row| (row.id.as_str(), row.status, row.driver_lanes.as_slice()))
            .collect();
    let expected: Vec<(&str, ConformanceStatus, &[HarnessDriverType])> = expected
        .iter()
        .map(|(id, lanes)| (*id, ConformanceStatus::ManagedRuntime, *lanes))
        .collect();
    assert_eq!(actual, expected);
}

#[test]
fn does_not_infer_managed_runtime_conformance_from_generic_sandbox_capabilities() {
    use CatalogDurability::{BestEffort, Durable};
    use WorkspaceStrategy::{CheckpointRestore, RetainedRuntime};

    let daytona = get("daytona");
    assert_eq!(daytona.status, ConformanceStatus::ManagedRuntime);
    assert!(daytona.managed_runtime);
    assert_eq!(
        daytona.lifecycle,
        host_fenced(CatalogSuspendResume::Supported)
    );
    assert_eq!(
        daytona.workspace.strategies,
        vec![RetainedRuntime, CheckpointRestore]
    );
    assert_eq!(daytona.workspace.durability, Durable);

    let boxrun = get("boxrun");
    assert_eq!(boxrun.status, ConformanceStatus::ManagedRuntime);
    assert!(boxrun.managed_runtime);
    assert_eq!(boxrun.workspace.strategies, vec![RetainedRuntime]);
    assert_eq!(boxrun.workspace.durability, BestEffort);
    assert_eq!(
        boxrun.outputs.strategies,
        vec![CatalogOutputStrategy::FinalCollect]
    );
    assert_eq!(boxrun.outputs.durability, Durable);

    let blaxel = get("blaxel");
    assert_eq!(blaxel.status, ConformanceStatus::ManagedRuntime);
    assert!(blaxel.managed_runtime);
    assert_eq!(blaxel.workspace.strategies, vec![RetainedRuntime]);
    assert_eq!(blaxel.workspace.durability, BestEffort);
    assert_eq!(
        blaxel.lifecycle,
        host_fenced(CatalogSuspendResume::Supported)
    );

    for id in ["sprites", "vercel", "modal", "superserve"] {
        let row = get(id);
        assert_eq!(row.status, ConformanceStatus::ManagedRuntime, "{id}");
        assert!(row.managed_runtime, "{id}");
        assert_eq!(row.workspace.strategies, vec![RetainedRuntime], "{id}");
        assert_eq!(row.workspace.durability, Durable, "{id}");
        assert_eq!(
            row.lifecycle,
            host_fenced(CatalogSuspendResume::Supported),
            "{id}"
        );
        assert!(row.runtime_checkpoints.is_empty(), "{id}");
    }
}

#[test]
fn fails_closed_for_an_unknown_provider() {
    let error = get_managed_runtime_provider_conformance("unknown").expect_err("unknown");
    assert!(error.message().contains("Unknown managed runtime provider"));
    assert_eq!(error.message(), "Unknown managed runtime provider: unknown");
    assert!(require_managed_runtime_provider("unknown").is_err());
}

#[test]
fn admits_only_providers_with_a_complete_managed_runtime_composition() {
    for id in [
        "e2b",
        "daytona",
        "litebox",
        "boxrun",
        "blaxel",
        "sprites",
        "vercel",
        "modal",
        "superserve",
    ] {
        let row = require_managed_runtime_provider(id).expect("managed runtime");
        assert_eq!(row.id, id);
        assert!(row.managed_runtime, "{id}");
    }
}

/// Not a TypeScript case: the columns every OpenMA row shares (reference §4), checked on all
/// twelve so a later edit of one row cannot silently change a shared guarantee.
#[test]
fn every_openma_row_shares_the_managed_runtime_columns() {
    for row in MANAGED_RUNTIME_PROVIDER_CONFORMANCE.iter() {
        assert!(row.managed_runtime, "{}", row.id);
        assert_eq!(row.lifecycle.lease, CatalogLease::HostFenced, "{}", row.id);
        assert_eq!(
            row.lifecycle.hard_terminate,
            CatalogHardTerminate::Supported,
            "{}",
            row.id
        );
        assert_eq!(
            row.lifecycle.orphan_reap,
            CatalogOrphanReap::HostManaged,
            "{}",
            row.id
        );
        assert_eq!(
            row.outputs.strategies,
            vec![CatalogOutputStrategy::FinalCollect],
            "{}",
            row.id
        );
        assert_eq!(
            row.outputs.durability,
            CatalogDurability::Durable,
            "{}",
            row.id
        );
        assert!(row.runtime_checkpoints.is_empty(), "{}", row.id);
        assert!(!row.sandbox_port_facts.available.is_empty(), "{}", row.id);
        let has_reason = !matches!(row.id.as_str(), "node-docker" | "cloudflare" | "e2b");
        assert_eq!(row.reason.is_some(), has_reason, "{}", row.id);
    }
    let unsupported: Vec<&str> = MANAGED_RUNTIME_PROVIDER_CONFORMANCE
        .iter()
        .filter(|row| row.lifecycle.suspend_resume == CatalogSuspendResume::Unsupported)
        .map(|row| row.id.as_str())
        .collect();
    assert_eq!(
        unsupported,
        ["node-docker", "cloudflare", "cloudflare-bridge"]
    );
}
