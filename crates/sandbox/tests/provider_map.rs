//! The closed SANDBOX_PROVIDER map.

mod common;

use async_trait::async_trait;
use common::{Caps, FakeSandbox};
use omabox_contract::PortError;
use omabox_sandbox::*;
use std::sync::{Arc, Mutex};

/// A factory that records the env it was handed.
#[derive(Default)]
struct RecordingFactory {
    label: &'static str,
    seen: Mutex<Vec<SandboxFactoryEnv>>,
}

#[async_trait]
impl SandboxFactory for RecordingFactory {
    async fn create(
        &self,
        _ctx: &SandboxFactoryContext,
        env: &SandboxFactoryEnv,
    ) -> Result<Arc<dyn SandboxPort>, PortError> {
        self.seen.lock().unwrap().push(env.clone());
        Ok(Arc::new(FakeSandbox::new(Caps::default())))
    }
}

fn env(pairs: &[(&str, &str)]) -> SandboxFactoryEnv {
    pairs.iter().copied().collect()
}

fn ctx() -> SandboxFactoryContext {
    SandboxFactoryContext {
        session_id: "sess_1".into(),
        workdir: "/tmp/unused".into(),
        memory_root: None,
        outputs_root: None,
    }
}

fn registry_with(
    name: SandboxProviderName,
    label: &'static str,
) -> (SandboxFactoryRegistry, Arc<RecordingFactory>) {
    let factory = Arc::new(RecordingFactory {
        label,
        ..RecordingFactory::default()
    });
    let mut registry = SandboxFactoryRegistry::new();
    registry.register(name, factory.clone());
    (registry, factory)
}

fn resolve_err(pairs: &[(&str, &str)], registry: &SandboxFactoryRegistry) -> SandboxProviderError {
    match resolve_sandbox_provider(&env(pairs), registry) {
        Ok(_) => panic!("{pairs:?} should not resolve"),
        Err(error) => error,
    }
}

#[test]
fn every_openma_name_is_known_but_not_available_in_this_build() {
    let registry = SandboxFactoryRegistry::new();
    for name in [
        "sprites",
        "litebox",
        "boxlite",
        "boxrun",
        "daytona",
        "opensandbox",
        "e2b",
    ] {
        let error = resolve_err(&[("SANDBOX_PROVIDER", name)], &registry);
        assert_eq!(
            error.to_string(),
            format!("SANDBOX_PROVIDER={name} is not available in this build")
        );
    }
}

#[test]
fn linux_is_not_available_until_the_binary_registers_it() {
    let error = resolve_err(
        &[("SANDBOX_PROVIDER", "linux")],
        &SandboxFactoryRegistry::new(),
    );
    assert_eq!(
        error,
        SandboxProviderError::NotAvailable {
            name: SandboxProviderName::Linux
        }
    );
}

#[tokio::test]
async fn a_registered_provider_is_selected_and_sees_the_env_untouched() {
    let (registry, factory) = registry_with(SandboxProviderName::Linux, "linux");
    let pairs = [
        ("SANDBOX_PROVIDER", "linux"),
        ("E2B_API_KEY", "not-for-linux"),
        ("SANDBOX_IMAGE", "img"),
    ];
    let selected = resolve_sandbox_provider(&env(&pairs), &registry).unwrap();
    selected.create(&ctx(), &env(&pairs)).await.unwrap();
    let seen = factory.seen.lock().unwrap();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0], env(&pairs));
    assert_eq!(factory.label, "linux");
}

#[test]
fn a_future_backend_for_an_openma_name_is_selected_once_registered() {
    let (registry, _) = registry_with(SandboxProviderName::E2b, "e2b");
    assert!(resolve_sandbox_provider(&env(&[("SANDBOX_PROVIDER", "e2b")]), &registry).is_ok());
    // Other names stay unavailable; litebox and boxlite are separate entries.
    assert!(matches!(
        resolve_err(&[("SANDBOX_PROVIDER", "daytona")], &registry),
        SandboxProviderError::NotAvailable { .. }
    ));
    assert_eq!(
        registry.available().collect::<Vec<_>>(),
        vec![SandboxProviderName::E2b]
    );
}

#[test]
fn empty_unset_unknown_and_subprocess_fail() {
    let (registry, _) = registry_with(SandboxProviderName::Linux, "linux");
    assert_eq!(resolve_err(&[], &registry), SandboxProviderError::Unset);
    let unset = resolve_err(&[("SANDBOX_PROVIDER", "")], &registry);
    assert_eq!(unset, SandboxProviderError::Unset);
    assert!(unset.to_string().starts_with("SANDBOX_PROVIDER is not set"));
    assert!(unset.to_string().contains("linux, sprites"));

    let unknown = resolve_err(&[("SANDBOX_PROVIDER", "docker")], &registry);
    assert_eq!(
        unknown.to_string(),
        "SANDBOX_PROVIDER=\"docker\" is not a known sandbox provider; known providers: linux, \
         sprites, litebox, boxlite, boxrun, daytona, opensandbox, e2b"
    );
    // Exact match only: no trimming or case folding.
    assert!(matches!(
        resolve_err(&[("SANDBOX_PROVIDER", "Linux")], &registry),
        SandboxProviderError::Unknown { .. }
    ));

    let subprocess = resolve_err(&[("SANDBOX_PROVIDER", "subprocess")], &registry);
    assert_eq!(subprocess, SandboxProviderError::SubprocessNotAllowed);
    assert!(subprocess.to_string().contains("no isolation boundary"));
    // local-subprocess is not a SANDBOX_PROVIDER value either.
    assert!(matches!(
        resolve_err(&[("SANDBOX_PROVIDER", "local-subprocess")], &registry),
        SandboxProviderError::Unknown { .. }
    ));
    let port: PortError = subprocess.into();
    assert_eq!(port.kind(), omabox_contract::ErrorKind::InvalidArgument);
}

fn registry_with_local() -> (SandboxFactoryRegistry, Arc<RecordingFactory>) {
    let (mut registry, _) = registry_with(SandboxProviderName::Linux, "linux");
    let local = Arc::new(RecordingFactory {
        label: "local",
        ..RecordingFactory::default()
    });
    registry.register_local_subprocess(local.clone());
    (registry, local)
}

#[tokio::test]
async fn local_subprocess_is_selected_only_in_test_mode() {
    let (registry, local) = registry_with_local();
    for test_flag in [("OMABOX_TEST_MODE", "1"), ("NODE_ENV", "test")] {
        let pairs = [
            ("OPENMA_TEST_SANDBOX_PROVIDER", "local-subprocess"),
            ("SANDBOX_PROVIDER", "linux"),
            test_flag,
        ];
        let factory = resolve_sandbox_provider(&env(&pairs), &registry).unwrap();
        factory.create(&ctx(), &env(&pairs)).await.unwrap();
    }
    assert_eq!(local.seen.lock().unwrap().len(), 2);

    for not_test in [
        vec![],
        vec![("OMABOX_TEST_MODE", "0")],
        vec![("OMABOX_TEST_MODE", "true")],
        vec![("NODE_ENV", "production")],
        vec![("NODE_ENV", "TEST")],
    ] {
        let mut pairs = vec![("OPENMA_TEST_SANDBOX_PROVIDER", "local-subprocess")];
        pairs.extend(not_test.iter().copied());
        let error = resolve_err(&pairs, &registry);
        assert_eq!(
            error,
            SandboxProviderError::TestProviderOutsideTestMode {
                value: "local-subprocess".into()
            },
            "{pairs:?}"
        );
        assert!(error.to_string().contains("only in test mode"));
    }
}

#[test]
fn test_provider_errors_are_clear() {
    let (registry, _) = registry_with_local();
    assert_eq!(
        resolve_err(
            &[
                ("OPENMA_TEST_SANDBOX_PROVIDER", "subprocess"),
                ("OMABOX_TEST_MODE", "1")
            ],
            &registry
        ),
        SandboxProviderError::UnknownTestProvider {
            value: "subprocess".into()
        }
    );
    let (without_local, _) = registry_with(SandboxProviderName::Linux, "linux");
    let error = resolve_err(
        &[
            ("OPENMA_TEST_SANDBOX_PROVIDER", "local-subprocess"),
            ("NODE_ENV", "test"),
        ],
        &without_local,
    );
    assert_eq!(
        error.to_string(),
        "OPENMA_TEST_SANDBOX_PROVIDER=local-subprocess is not available in this build"
    );
    // An empty test variable is the same as unset.
    assert!(
        resolve_sandbox_provider(
            &env(&[
                ("OPENMA_TEST_SANDBOX_PROVIDER", ""),
                ("SANDBOX_PROVIDER", "linux")
            ]),
            &registry
        )
        .is_ok()
    );
}

#[test]
fn test_mode_rule() {
    assert!(is_test_mode(&env(&[("OMABOX_TEST_MODE", "1")])));
    assert!(is_test_mode(&env(&[("NODE_ENV", "test")])));
    assert!(!is_test_mode(&env(&[])));
    assert!(!is_test_mode(&env(&[("OMABOX_TEST_MODE", "yes")])));
}

#[test]
fn the_env_debug_output_never_shows_values() {
    let env = env(&[("E2B_API_KEY", "sk-secret")]);
    let debug = format!("{env:?}");
    assert!(debug.contains("E2B_API_KEY"));
    assert!(!debug.contains("sk-secret"));
    assert_eq!(env.get("E2B_API_KEY"), Some("sk-secret"));
    assert_eq!(env.get("MISSING"), None);
}
