//! DefaultSandboxOrchestrator: order and failure handling, with recording fakes.

mod common;

use async_trait::async_trait;
use common::{Caps, FakeSandbox, Log};
use omabox_contract::PortError;
use omabox_sandbox::*;
use std::sync::Arc;

/// A backups service that shares the sandbox's log so the order is visible.
struct FakeBackups {
    log: Log,
    latest: Option<WorkspaceBackupHandle>,
    restore: Result<WorkspaceRestoreResult, PortError>,
    latest_fails: bool,
}

impl FakeBackups {
    fn new(log: Log) -> Self {
        Self {
            log,
            latest: Some(handle("bk_latest")),
            restore: Ok(WorkspaceRestoreResult {
                ok: true,
                error: None,
            }),
            latest_fails: false,
        }
    }
}

fn handle(id: &str) -> WorkspaceBackupHandle {
    WorkspaceBackupHandle {
        id: id.into(),
        dir: Some("/workspace".into()),
        local_bucket: None,
    }
}

#[async_trait]
impl WorkspaceBackupService for FakeBackups {
    async fn snapshot(
        &self,
        owner: &BackupOwner,
        _sandbox: &dyn SandboxPort,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
        self.log
            .push(format!("backups.snapshot {}", owner.session_id));
        Ok(Some(handle("bk_new")))
    }
    async fn restore(
        &self,
        owner: &BackupOwner,
        _sandbox: &dyn SandboxPort,
        handle: &WorkspaceBackupHandle,
    ) -> Result<WorkspaceRestoreResult, PortError> {
        self.log
            .push(format!("backups.restore {} {}", owner.tenant_id, handle.id));
        self.restore.clone()
    }
    async fn latest(
        &self,
        owner: &BackupOwner,
    ) -> Result<Option<WorkspaceBackupHandle>, PortError> {
        self.log
            .push(format!("backups.latest {}", owner.session_id));
        if self.latest_fails {
            return Err(PortError::new("index offline"));
        }
        Ok(self.latest.clone())
    }
}

fn full_input() -> ProvisionInput {
    ProvisionInput {
        session_id: "sess".into(),
        tenant_id: "ten".into(),
        environment_id: Some("env".into()),
        memory_mounts: vec![
            MemoryMountRequest {
                store_name: "notes".into(),
                store_id: "ms_1".into(),
                read_only: true,
            },
            MemoryMountRequest {
                store_name: "scratch".into(),
                store_id: "ms_2".into(),
                read_only: false,
            },
        ],
        mount_outputs: true,
        backup: Some(ProvisionBackup {
            restore_on_warm: true,
            handle: None,
        }),
    }
}

fn orchestrator(backups: FakeBackups) -> DefaultSandboxOrchestrator {
    DefaultSandboxOrchestrator::new(Some(Arc::new(backups)))
}

#[tokio::test]
async fn provision_runs_the_documented_order() {
    let sandbox = FakeSandbox::new(Caps::all());
    let orchestrator = orchestrator(FakeBackups::new(sandbox.log.clone()));
    let report = orchestrator
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(report.warnings.is_empty(), "{:?}", report.warnings);
    assert_eq!(
        sandbox.log.entries(),
        vec![
            "setOutboundContext ten/sess",
            "setBackupContext ten/env/sess",
            "backups.latest sess",
            "backups.restore ten bk_latest",
            "mountMemoryStore notes ms_1 ro=true",
            "mountMemoryStore scratch ms_2 ro=false",
            "mountSessionOutputs ten/sess",
        ]
    );
}

#[tokio::test]
async fn an_explicit_handle_is_restored_without_looking_up_the_latest() {
    let sandbox = FakeSandbox::new(Caps::all());
    let orchestrator = orchestrator(FakeBackups::new(sandbox.log.clone()));
    let mut input = full_input();
    input.backup = Some(ProvisionBackup {
        restore_on_warm: true,
        handle: Some(handle("bk_explicit")),
    });
    orchestrator.provision(&sandbox, &input).await.unwrap();
    let names = sandbox.log.entries();
    assert!(names.contains(&"backups.restore ten bk_explicit".to_owned()));
    assert!(
        !names
            .iter()
            .any(|entry| entry.starts_with("backups.latest"))
    );
}

#[tokio::test]
async fn outbound_failure_is_a_warning_and_provisioning_goes_on() {
    let sandbox = FakeSandbox::new(Caps::all()).failing("setOutboundContext");
    let orchestrator = orchestrator(FakeBackups::new(sandbox.log.clone()));
    let report = orchestrator
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert_eq!(
        report.warnings,
        vec![
            "[sandbox-orchestrator] setOutboundContext failed: setOutboundContext boom — \
             outbound TLS through oma-vault may not work"
        ]
    );
    assert!(
        sandbox
            .log
            .names()
            .contains(&"mountSessionOutputs".to_owned())
    );
}

#[tokio::test]
async fn backup_context_needs_an_environment_and_the_lifecycle_and_its_failure_is_fatal() {
    let sandbox = FakeSandbox::new(Caps::all());
    let orchestrator = DefaultSandboxOrchestrator::new(None);
    let mut input = full_input();
    input.environment_id = None;
    orchestrator.provision(&sandbox, &input).await.unwrap();
    assert!(!sandbox.log.names().contains(&"setBackupContext".to_owned()));

    let no_lifecycle = FakeSandbox::new(Caps {
        lifecycle: false,
        ..Caps::all()
    });
    orchestrator
        .provision(&no_lifecycle, &full_input())
        .await
        .unwrap();
    assert!(
        !no_lifecycle
            .log
            .names()
            .contains(&"setBackupContext".to_owned())
    );

    let failing = FakeSandbox::new(Caps::all()).failing("setBackupContext");
    let error = orchestrator
        .provision(&failing, &full_input())
        .await
        .unwrap_err();
    assert_eq!(error.message(), "setBackupContext boom");
    assert!(!failing.log.names().contains(&"mountMemoryStore".to_owned()));
}

#[tokio::test]
async fn restore_failures_warn_and_continue_with_an_empty_workspace() {
    // ok: false with an error text.
    let sandbox = FakeSandbox::new(Caps::all());
    let mut backups = FakeBackups::new(sandbox.log.clone());
    backups.restore = Ok(WorkspaceRestoreResult {
        ok: false,
        error: Some("expired".into()),
    });
    let report = orchestrator(backups)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert_eq!(
        report.warnings,
        vec!["[sandbox-orchestrator] restore failed (expired) — proceeding with empty workspace"]
    );
    assert!(
        sandbox
            .log
            .names()
            .contains(&"mountSessionOutputs".to_owned())
    );

    // ok: false without a reason.
    let sandbox = FakeSandbox::new(Caps::all());
    let mut backups = FakeBackups::new(sandbox.log.clone());
    backups.restore = Ok(WorkspaceRestoreResult {
        ok: false,
        error: None,
    });
    let report = orchestrator(backups)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(report.warnings[0].contains("restore failed (unknown)"));

    // The service throws.
    let sandbox = FakeSandbox::new(Caps::all());
    let mut backups = FakeBackups::new(sandbox.log.clone());
    backups.restore = Err(PortError::new("tar exploded"));
    let report = orchestrator(backups)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(report.warnings[0].contains("restore failed (tar exploded)"));

    // The latest lookup throws.
    let sandbox = FakeSandbox::new(Caps::all());
    let mut backups = FakeBackups::new(sandbox.log.clone());
    backups.latest_fails = true;
    let report = orchestrator(backups)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(report.warnings[0].contains("restore failed (index offline)"));
    assert!(!sandbox.log.names().contains(&"backups.restore".to_owned()));
}

#[tokio::test]
async fn no_restore_without_restore_on_warm_a_service_or_a_backup() {
    let sandbox = FakeSandbox::new(Caps::all());
    let mut input = full_input();
    input.backup = Some(ProvisionBackup {
        restore_on_warm: false,
        handle: Some(handle("bk")),
    });
    orchestrator(FakeBackups::new(sandbox.log.clone()))
        .provision(&sandbox, &input)
        .await
        .unwrap();
    assert!(
        !sandbox
            .log
            .names()
            .iter()
            .any(|n| n.starts_with("backups."))
    );

    let sandbox = FakeSandbox::new(Caps::all());
    DefaultSandboxOrchestrator::new(None)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(
        !sandbox
            .log
            .names()
            .iter()
            .any(|n| n.starts_with("backups."))
    );

    let sandbox = FakeSandbox::new(Caps::all());
    let mut backups = FakeBackups::new(sandbox.log.clone());
    backups.latest = None;
    let report = orchestrator(backups)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert!(report.warnings.is_empty());
    assert!(!sandbox.log.names().contains(&"backups.restore".to_owned()));
}

#[tokio::test]
async fn a_memory_mount_failure_is_rethrown_with_the_store_name_and_stops_provisioning() {
    let sandbox = FakeSandbox::new(Caps::all()).failing("mountMemoryStore:notes");
    let error = DefaultSandboxOrchestrator::new(None)
        .provision(&sandbox, &full_input())
        .await
        .unwrap_err();
    assert_eq!(
        error.message(),
        "mountMemoryStore notes failed: disk on fire"
    );
    let names = sandbox.log.entries();
    assert!(
        !names
            .iter()
            .any(|n| n.starts_with("mountMemoryStore scratch"))
    );
    assert!(!names.iter().any(|n| n.starts_with("mountSessionOutputs")));
}

#[tokio::test]
async fn requested_mounts_the_sandbox_cannot_provide_are_reported() {
    let sandbox = FakeSandbox::new(Caps {
        outputs: Some(None),
        ..Caps::default()
    });
    let report = DefaultSandboxOrchestrator::new(None)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert_eq!(report.warnings.len(), 2, "{:?}", report.warnings);
    assert!(report.warnings[0].contains("2 memory mount(s) requested"));
    assert!(report.warnings[1].contains("Session outputs mount requested"));
    // Null mount capabilities: the mount is never called.
    assert!(sandbox.log.entries().is_empty());
}

#[tokio::test]
async fn an_outputs_mount_failure_is_a_warning() {
    let sandbox = FakeSandbox::new(Caps::all()).failing("mountSessionOutputs");
    let report = DefaultSandboxOrchestrator::new(None)
        .provision(&sandbox, &full_input())
        .await
        .unwrap();
    assert_eq!(
        report.warnings,
        vec!["[sandbox-orchestrator] mountSessionOutputs failed: mountSessionOutputs boom"]
    );
}

#[tokio::test]
async fn capabilities_are_probed_without_provider_names() {
    let log = Log::default();
    let with_backups = orchestrator(FakeBackups::new(log));
    let none = FakeSandbox::new(Caps::default());
    assert_eq!(
        with_backups.capabilities(&none),
        SandboxCapabilities {
            enforce_read_only_memory: false,
            has_session_outputs: false,
            has_vault_outbound: false,
            has_workspace_backup: false,
        }
    );
    assert_eq!(
        with_backups.capabilities(&FakeSandbox::new(Caps::all())),
        SandboxCapabilities {
            enforce_read_only_memory: true,
            has_session_outputs: true,
            has_vault_outbound: true,
            has_workspace_backup: true,
        }
    );
    let bytes_only = FakeSandbox::new(Caps {
        file_bytes: true,
        ..Caps::default()
    });
    assert!(with_backups.capabilities(&bytes_only).has_workspace_backup);
    // No backups service: never.
    assert!(
        !DefaultSandboxOrchestrator::new(None)
            .capabilities(&FakeSandbox::new(Caps::all()))
            .has_workspace_backup
    );
    let null_outputs = FakeSandbox::new(Caps {
        outputs: Some(None),
        ..Caps::default()
    });
    assert!(!with_backups.capabilities(&null_outputs).has_session_outputs);
    assert_eq!(
        serde_json::to_string(&with_backups.capabilities(&none)).unwrap(),
        r#"{"enforceReadOnlyMemory":false,"hasSessionOutputs":false,"hasVaultOutbound":false,"hasWorkspaceBackup":false}"#
    );
}

#[tokio::test]
async fn snapshot_prefers_the_adapter_then_falls_back_to_the_service() {
    let owner = BackupOwner {
        session_id: "sess".into(),
        tenant_id: "ten".into(),
    };
    let sandbox = FakeSandbox::new(Caps::all());
    let result = orchestrator(FakeBackups::new(sandbox.log.clone()))
        .snapshot_workspace_now(&sandbox, &owner)
        .await
        .unwrap();
    assert_eq!(result, None);
    assert_eq!(sandbox.log.names(), vec!["snapshotWorkspaceNow"]);

    let failing = FakeSandbox::new(Caps::all()).failing("snapshotWorkspaceNow");
    let result = orchestrator(FakeBackups::new(failing.log.clone()))
        .snapshot_workspace_now(&failing, &owner)
        .await
        .unwrap();
    assert_eq!(result, Some(handle("bk_new")));
    assert_eq!(
        failing.log.names(),
        vec!["snapshotWorkspaceNow", "backups.snapshot"]
    );

    let plain = FakeSandbox::new(Caps::default());
    assert_eq!(
        DefaultSandboxOrchestrator::new(None)
            .snapshot_workspace_now(&plain, &owner)
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn renew_activity_timeout_delegates_only_when_present() {
    let orchestrator = DefaultSandboxOrchestrator::new(None);
    let with = FakeSandbox::new(Caps::all());
    orchestrator.renew_activity_timeout(&with).await.unwrap();
    assert_eq!(with.log.names(), vec!["renewActivityTimeout"]);
    let without = FakeSandbox::new(Caps::default());
    orchestrator.renew_activity_timeout(&without).await.unwrap();
    assert!(without.log.entries().is_empty());
    let failing = FakeSandbox::new(Caps::all()).failing("renewActivityTimeout");
    assert!(orchestrator.renew_activity_timeout(&failing).await.is_err());
}
