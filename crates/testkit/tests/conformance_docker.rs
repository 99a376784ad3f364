//! The conformance suite against the `docker` backend: containers of an engine of each
//! case's own (`omabox_test_support::dockerd`), from a busybox image pushed to a registry on
//! loopback. Needs root, docker.io (installed when missing), docker-registry, a static
//! busybox and the `omabox-agent` binary next to the test binaries (`cargo build -p
//! omabox-agent`); a missing one skips with its reason, and fails under `CI=true`.

use std::sync::Arc;

use omabox_backend_docker::config::locate_agent;
use omabox_backend_docker::managed::DockerManagedProvider;
use omabox_backend_docker::{DockerConfig, Engine};
use omabox_sandbox::managed::ManagedSandboxProvider;
use omabox_test_support::dockerd::TestDockerd;
use omabox_test_support::registry::{TestRegistry, busybox_layer, tar_layer};
use omabox_testkit::conformance::{BackendUnderTest, require_capability};

const BUSYBOX: &str = "/bin/busybox";
const DASH: &str = "/bin/dash";
const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";

fn missing() -> Option<String> {
    TestRegistry::missing()
        .or_else(|| {
            let static_busybox = std::fs::read(BUSYBOX)
                .map(|b| !b.windows(14).any(|w| w == b"/lib64/ld-linu"))
                .unwrap_or(false);
            (!static_busybox).then(|| {
                format!("{BUSYBOX} is not a static busybox (apt-get install busybox-static)")
            })
        })
        .or_else(|| {
            [DASH, LIBC, LOADER]
                .iter()
                .find(|path| !std::path::Path::new(path).exists())
                .map(|path| format!("{path} is missing (the image's /bin/sh is the host's dash)"))
        })
        .or_else(|| {
            locate_agent(None).err().map(|tried| {
                format!("omabox-agent is not built (tried {tried}; cargo build -p omabox-agent)")
            })
        })
        .or_else(TestDockerd::missing)
}

/// What a case's provider keeps alive: the engine and the registry.
struct Rig {
    _dockerd: TestDockerd,
    _registry: TestRegistry,
}

async fn docker_backend() -> Option<BackendUnderTest> {
    if !require_capability(missing()) {
        return None;
    }
    let registry = TestRegistry::start();
    // `sh` is the host's dash over busybox's applets: busybox's own `sh` answers
    // `command -v sh` with the applet's name, not a path, which the suite checks.
    let read = |path: &str| std::fs::read(path).unwrap();
    let (dash, libc, loader) = (read(DASH), read(LIBC), read(LOADER));
    registry.push_image(
        "test/busybox",
        "1",
        &[
            busybox_layer(&read(BUSYBOX)),
            tar_layer(&[
                ("bin/sh", 0o755, &dash),
                (&LIBC[1..], 0o755, &libc),
                (&LOADER[1..], 0o755, &loader),
            ]),
        ],
    );
    let image = format!("{}/test/busybox:1", registry.host());
    let dockerd = TestDockerd::start();
    let engine = Engine::connect(&dockerd.host()).await.unwrap();
    let config = DockerConfig {
        agent_binary: locate_agent(None).unwrap(),
        ..DockerConfig::new(image, omabox_backend_docker::host::current())
    };
    let rig = Arc::new(Rig {
        _dockerd: dockerd,
        _registry: registry,
    });
    Some(BackendUnderTest {
        name: "docker".into(),
        provider: Arc::new(move || {
            let _alive = &rig;
            Ok(
                Arc::new(DockerManagedProvider::new(engine.clone(), config.clone()))
                    as Arc<dyn ManagedSandboxProvider>,
            )
        }),
        workspace_dir: "/workspace".into(),
        outputs_dir: "/mnt/session/outputs".into(),
    })
}

omabox_testkit::conformance_suite!(docker, docker_backend().await);
