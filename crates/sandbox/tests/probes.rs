//! Guard semantics (OpenMA packages/sandbox/test/persistence-ports.test.ts) and wire shapes.

mod common;

use common::{Caps, FakeSandbox};
use omabox_sandbox::*;

#[test]
fn a_sandbox_with_no_optional_port_supports_nothing() {
    let sandbox = FakeSandbox::new(Caps::default());
    assert!(!supports_duplex_process(&sandbox));
    assert!(!supports_sandbox_runtime(&sandbox));
    assert!(!supports_workspace_backup(&sandbox));
    assert!(!supports_managed_workspace_lifecycle(&sandbox));
    assert!(!supports_session_output_mount(&sandbox));
}

#[test]
fn workspace_backup_is_not_inferred_from_an_incomplete_primitive() {
    // The Rust port carries create *and* restore, so "create only" cannot be expressed (see
    // the compile_fail doc test on `probe`); bytes access alone is not a backup port either.
    let bytes_only = FakeSandbox::new(Caps {
        file_bytes: true,
        ..Caps::default()
    });
    assert!(!supports_workspace_backup(&bytes_only));
    let complete = FakeSandbox::new(Caps {
        backup: true,
        ..Caps::default()
    });
    assert!(supports_workspace_backup(&complete));
}

#[test]
fn only_the_complete_managed_workspace_lifecycle_is_recognized() {
    let backup_only = FakeSandbox::new(Caps {
        backup: true,
        ..Caps::default()
    });
    assert!(!supports_managed_workspace_lifecycle(&backup_only));
    let lifecycle = FakeSandbox::new(Caps {
        lifecycle: true,
        ..Caps::default()
    });
    assert!(supports_managed_workspace_lifecycle(&lifecycle));
}

#[test]
fn session_output_mount_needs_the_mount_and_non_null_capabilities() {
    let absent = FakeSandbox::new(Caps::default());
    assert!(!supports_session_output_mount(&absent));
    let null_capabilities = FakeSandbox::new(Caps {
        outputs: Some(None),
        ..Caps::default()
    });
    assert!(!supports_session_output_mount(&null_capabilities));
    let durable = FakeSandbox::new(Caps {
        outputs: Some(Some(SessionOutputMountCapabilities {
            durability: SessionOutputMountDurability::Durable,
        })),
        ..Caps::default()
    });
    assert!(supports_session_output_mount(&durable));
}

#[test]
fn session_output_mount_is_independent_from_compute() {
    let outputs_only = FakeSandbox::new(Caps {
        outputs: Caps::all().outputs,
        ..Caps::default()
    });
    assert!(supports_session_output_mount(&outputs_only));
    assert!(!supports_sandbox_runtime(&outputs_only));
    assert!(!supports_duplex_process(&outputs_only));
}

#[test]
fn duplex_and_runtime_probes_follow_their_ports() {
    let sandbox = FakeSandbox::new(Caps {
        duplex: true,
        runtime: true,
        ..Caps::default()
    });
    assert!(supports_duplex_process(&sandbox));
    assert!(supports_sandbox_runtime(&sandbox));
    let dynamic: &dyn SandboxPort = &sandbox;
    assert!(supports_duplex_process(dynamic));
}

#[test]
fn runtime_wire_shapes_match_the_typescript_ones() {
    let handle = SandboxCheckpointHandle {
        provider: "e2b".into(),
        checkpoint_id: "cp_1".into(),
        source_runtime_id: "rt_1".into(),
        kind: SandboxCheckpointKind::Memory,
        scope: SandboxCheckpointScope::Portable,
        metadata: None,
    };
    assert_eq!(
        serde_json::to_string(&handle).unwrap(),
        r#"{"provider":"e2b","checkpointId":"cp_1","sourceRuntimeId":"rt_1","kind":"memory","scope":"portable"}"#
    );
    let caps = SandboxRuntimeCapabilities {
        lease: true,
        suspend: vec![
            SandboxCheckpointKind::Filesystem,
            SandboxCheckpointKind::Memory,
        ],
        checkpoint: vec![SandboxCheckpointKind::Memory],
    };
    assert_eq!(
        serde_json::to_string(&caps).unwrap(),
        r#"{"lease":true,"suspend":["filesystem","memory"],"checkpoint":["memory"]}"#
    );
    assert_eq!(
        serde_json::to_string(&SandboxRuntimeHandle {
            provider: "daytona".into(),
            runtime_id: "r".into()
        })
        .unwrap(),
        r#"{"provider":"daytona","runtimeId":"r"}"#
    );
    for (status, text) in [
        (SandboxRuntimeStatus::Running, "\"running\""),
        (SandboxRuntimeStatus::Suspended, "\"suspended\""),
        (SandboxRuntimeStatus::Stopped, "\"stopped\""),
        (SandboxRuntimeStatus::Unknown, "\"unknown\""),
    ] {
        assert_eq!(serde_json::to_string(&status).unwrap(), text);
        assert_eq!(
            serde_json::from_str::<SandboxRuntimeStatus>(text).unwrap(),
            status
        );
    }
    let exit = SandboxProcessExit {
        code: None,
        signal: Some("SIGKILL".into()),
        out_of_memory: None,
    };
    assert_eq!(
        serde_json::to_string(&exit).unwrap(),
        r#"{"code":null,"signal":"SIGKILL"}"#
    );
    let spec: SandboxDuplexProcessSpec =
        serde_json::from_str(r#"{"command":"acp","env":{"A":"1","B":null}}"#).unwrap();
    assert_eq!(spec.env.get("B"), Some(&None));
    assert_eq!(spec.env.get("A"), Some(&Some("1".to_owned())));
    assert_eq!(
        serde_json::to_string(&ProcessStatus::Killed).unwrap(),
        "\"killed\""
    );
    assert_eq!(
        ProcessSignal::parse("SIGUSR1").unwrap(),
        ProcessSignal::Usr1
    );
    assert!(
        ProcessSignal::parse("SIGFOO")
            .unwrap_err()
            .message()
            .contains("unsupported signal")
    );
}
